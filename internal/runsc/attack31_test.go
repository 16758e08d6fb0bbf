package runsc

import (
	"net"
	"os"
	"path/filepath"
	"runtime"
	"sync"
	"testing"
	"time"

	"sbx.dev/sbx/internal/wire/agentwire"
	"sbx.dev/sbx/internal/wire/frame"
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

// TestAttack31PidFlood: a copy has one command and start sends its pid
// once; root inside can send pid frames without end, each of which was a
// synced write of the pid file and an event, in sbxd's own process. Only
// the first is kept.
func TestAttack31PidFlood(t *testing.T) {
	d, dir := channelDriver(t)
	fakeInit(t, dir, func(req agentwire.ChannelRequest, fw *frame.Writer) {
		for i := 1; i <= 2000; i++ {
			if fw.WriteCode(frame.Pid, i) != nil {
				return
			}
		}
		fw.WriteCode(frame.Exit, 0)
	})
	waitIdle(t, d, 1)
	execDir := t.TempDir()
	sh, err := d.StartExec("sb_1", ShimExec{Dir: execDir, Args: []string{AgentPath, "start"}, Channel: dir, Stall: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	var pids []int
	for ev := range sh.Events {
		if ev.Pid != 0 {
			pids = append(pids, ev.Pid)
		}
	}
	if len(pids) != 1 || pids[0] != 1 {
		t.Errorf("%d pid events (the first %v); want one, the first pid", len(pids), pids[:min(len(pids), 3)])
	}
	if b, err := os.ReadFile(filepath.Join(execDir, PidFile)); err != nil || string(b) != "1\n" {
		t.Errorf("the pid file: %q, %v; want the first pid", b, err)
	}
}
