package template

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// Attacks on critical, the flock alone (session 28c).

// TestAttack28cCriticalTwoStores: two Stores on one directory (two sbxd
// processes, or sbxd and a CLI) exclude each other in critical, as the
// goroutines of one do.
func TestAttack28cCriticalTwoStores(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "templates")
	a, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	b, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	var in, most atomic.Int32
	var wg sync.WaitGroup
	for i := 0; i < 8; i++ {
		s := a
		if i%2 == 1 {
			s = b
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := 0; j < 15; j++ {
				if err := s.critical(func() error {
					n := in.Add(1)
					if n > most.Load() {
						most.Store(n)
					}
					time.Sleep(100 * time.Microsecond)
					in.Add(-1)
					return nil
				}); err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	if most.Load() != 1 {
		t.Errorf("%d callers of two stores were in critical at once, want 1", most.Load())
	}
}

// TestAttack28cImportsBesideCollect: imports of their own names, from two
// Stores of one directory, while the other collects with nothing in use:
// a version a name points at is never collected, and every name resolves
// to a version whose files are there.
func TestAttack28cImportsBesideCollect(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "templates")
	a, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	b, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	stop := make(chan struct{})
	collected := make(chan error, 1)
	go func() {
		var err error
		for err == nil {
			select {
			case <-stop:
				collected <- nil
				return
			default:
			}
			_, err = b.Collect(func(string) bool { return false })
		}
		collected <- err
	}()
	var wg sync.WaitGroup
	for g := 0; g < 3; g++ {
		wg.Add(1)
		go func(g int) {
			defer wg.Done()
			s := a
			if g == 1 {
				s = b
			}
			for i := 0; i < 4; i++ {
				name := fmt.Sprintf("t%d-%d", g, i)
				tm, err := s.Import(ctx, name, tarOf(t, false, []entry{{hdr: file("f", 0o644), body: name}}), true, nil)
				if err != nil {
					t.Errorf("import %s: %v", name, err)
					continue
				}
				got, err := s.Resolve(name)
				if err != nil || got.Version != tm.Version {
					t.Errorf("resolve %s just after its import: %+v, %v", name, got, err)
					continue
				}
				root, err := s.VersionRootfs(got.Version)
				if err != nil {
					t.Errorf("rootfs of %s: %v", name, err)
					continue
				}
				if body, err := os.ReadFile(filepath.Join(root, "f")); err != nil || string(body) != name {
					t.Errorf("%s's file: %q, %v (collected under it?)", name, body, err)
				}
			}
		}(g)
	}
	wg.Wait()
	close(stop)
	if err := <-collected; err != nil {
		t.Fatal(err)
	}
	for g := 0; g < 3; g++ {
		for i := 0; i < 4; i++ {
			name := fmt.Sprintf("t%d-%d", g, i)
			if _, err := a.Resolve(name); err != nil {
				t.Errorf("after the collects: %v", err)
			}
		}
	}
}

// TestAttack28cCriticalWaitersThreads: each caller waiting for critical
// waits in flock(2), a blocking system call, with its own open file: a
// burst of waiters costs an OS thread and a descriptor each (a mutex
// parked them on one). Bounded here to show it is not unbounded beyond
// the waiters themselves; the numbers are logged for the report.
func TestAttack28cCriticalWaitersThreads(t *testing.T) {
	s, _ := openStore(t)
	threads := func() int {
		b, _ := os.ReadFile("/proc/self/status")
		for _, l := range strings.Split(string(b), "\n") {
			if v, ok := strings.CutPrefix(l, "Threads:"); ok {
				n, _ := strconv.Atoi(strings.TrimSpace(v))
				return n
			}
		}
		return 0
	}
	before := threads()
	hold, held := make(chan struct{}), make(chan struct{})
	go s.critical(func() error { close(held); <-hold; return nil })
	<-held
	const waiters = 64
	var wg sync.WaitGroup
	for i := 0; i < waiters; i++ {
		wg.Add(1)
		go func() { defer wg.Done(); _ = s.critical(func() error { return nil }) }()
	}
	time.Sleep(300 * time.Millisecond)
	during := threads()
	close(hold)
	wg.Wait()
	t.Logf("threads: %d before, %d with %d callers waiting for critical", before, during, waiters)
	if during-before > waiters+16 {
		t.Errorf("%d threads for %d waiters", during-before, waiters)
	}
}
