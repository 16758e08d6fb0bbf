package sandbox

import "sync"

// keyedLocks serializes the lifecycle changes of one sandbox: a create,
// capture, stop, resume, delete or exec start of a sandbox waits for the
// one under way. Reads never take it.
type keyedLocks struct {
	mu sync.Mutex
	m  map[string]*keyedLock
}

type keyedLock struct {
	sync.Mutex
	refs int // holders and waiters; the entry goes when none are left
}

// lock takes id's lock and returns its release.
func (k *keyedLocks) lock(id string) (unlock func()) {
	k.mu.Lock()
	if k.m == nil {
		k.m = map[string]*keyedLock{}
	}
	l, ok := k.m[id]
	if !ok {
		l = &keyedLock{}
		k.m[id] = l
	}
	l.refs++
	k.mu.Unlock()
	l.Lock()
	var once sync.Once
	return func() {
		once.Do(func() {
			l.Unlock()
			k.mu.Lock()
			if l.refs--; l.refs == 0 {
				delete(k.m, id)
			}
			k.mu.Unlock()
		})
	}
}

// tryLock takes id's lock if it is free.
func (k *keyedLocks) tryLock(id string) (unlock func(), ok bool) {
	k.mu.Lock()
	if k.m == nil {
		k.m = map[string]*keyedLock{}
	}
	l, exists := k.m[id]
	if !exists {
		l = &keyedLock{}
		k.m[id] = l
	}
	if !l.TryLock() {
		if !exists {
			delete(k.m, id)
		}
		k.mu.Unlock()
		return nil, false
	}
	l.refs++
	k.mu.Unlock()
	var once sync.Once
	return func() {
		once.Do(func() {
			l.Unlock()
			k.mu.Lock()
			if l.refs--; l.refs == 0 {
				delete(k.m, id)
			}
			k.mu.Unlock()
		})
	}, true
}
