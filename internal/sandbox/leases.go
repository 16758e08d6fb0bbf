package sandbox

import "sync"

// leaseTable counts what keeps a sandbox active for as long as it is open:
// a PTY, a preview connection, a file transfer. The reaper never reaps a
// sandbox that holds a lease.
type leaseTable struct {
	mu sync.Mutex
	n  map[string]int
}

// take adds a lease on id and returns its release, which may be called
// more than once.
func (t *leaseTable) take(id string) (release func()) {
	t.mu.Lock()
	if t.n == nil {
		t.n = map[string]int{}
	}
	t.n[id]++
	t.mu.Unlock()
	var once sync.Once
	return func() {
		once.Do(func() {
			t.mu.Lock()
			if t.n[id]--; t.n[id] <= 0 {
				delete(t.n, id)
			}
			t.mu.Unlock()
		})
	}
}

// held reports whether id holds a lease.
func (t *leaseTable) held(id string) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.n[id] > 0
}
