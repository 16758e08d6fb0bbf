package runsc

import (
	"net"
	"path/filepath"
	"runtime"
	"sync"
	"testing"
	"time"
)

// settleGoroutines waits for the goroutine count to fall to at most n.
func settleGoroutines(t *testing.T, n int) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); ; {
		got := runtime.NumGoroutine()
		if got <= n {
			return
		}
		if time.Now().After(deadline) {
			buf := make([]byte, 1<<20)
			t.Fatalf("%d goroutines, want at most %d:\n%s", got, n, buf[:runtime.Stack(buf, true)])
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestAttack31ConcurrentOpen: two execs of one sandbox after an sbxd
// restart both find no channel and both open it (StartExec). Each opening
// must replace the other whole: the channel kept is the one listening on
// the socket, and closing it frees every listener and goroutine.
func TestAttack31ConcurrentOpen(t *testing.T) {
	base := runtime.NumGoroutine()
	d := &Driver{ExecChannel: true}
	dir := filepath.Join(t.TempDir(), "chan")
	for round := 0; round < 30; round++ {
		var wg sync.WaitGroup
		for i := 0; i < 4; i++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				_ = d.OpenChannel("sb_1", dir)
			}()
		}
		wg.Wait()
		c, err := net.Dial("unix", filepath.Join(dir, ChannelSocketName))
		if err != nil {
			t.Fatalf("round %d: %v", round, err)
		}
		ch := d.channel("sb_1")
		for deadline := time.Now().Add(2 * time.Second); ; {
			ch.mu.Lock()
			n := len(ch.idle)
			ch.mu.Unlock()
			if n == 1 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("round %d: init's connection did not reach the channel kept (%d idle): another opening's listener has the socket", round, n)
			}
			time.Sleep(5 * time.Millisecond)
		}
		c.Close()
	}
	d.CloseChannel("sb_1")
	settleGoroutines(t, base)
}
