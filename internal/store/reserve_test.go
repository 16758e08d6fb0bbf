package store

import (
	"os"
	"path/filepath"
	"sync"
	"testing"
)

// TestReserve: the reserve is made, given up once, and made again; with
// releases and replenishes racing, it is held exactly when its file is
// there, and each release that says it gave space up did.
func TestReserve(t *testing.T) {
	st, err := Open(filepath.Join(t.TempDir(), "state.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	path := filepath.Join(t.TempDir(), "reserve")
	if err := st.KeepReserve(path, 1<<20); err != nil {
		t.Fatal(err)
	}
	held := func() bool {
		_, err := os.Stat(path)
		return err == nil
	}
	if !st.ReserveHeld() || !held() {
		t.Fatalf("after KeepReserve: held %v, file %v", st.ReserveHeld(), held())
	}
	if !st.res.release() || st.res.release() {
		t.Fatal("a reserve is given up once")
	}
	if st.ReserveHeld() || held() {
		t.Fatalf("after release: held %v, file %v", st.ReserveHeld(), held())
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	released := 0
	for i := 0; i < 50; i++ {
		wg.Add(2)
		go func() { defer wg.Done(); _ = st.Replenish() }()
		go func() {
			defer wg.Done()
			if st.res.release() {
				mu.Lock()
				released++
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	if st.ReserveHeld() != held() {
		t.Errorf("after racing: held %v, but the file is there: %v", st.ReserveHeld(), held())
	}
	if err := st.Replenish(); err != nil {
		t.Fatal(err)
	}
	if !st.ReserveHeld() || !held() {
		t.Errorf("after a last replenish: held %v, file %v", st.ReserveHeld(), held())
	}
	t.Logf("%d releases gave space up", released)
}
