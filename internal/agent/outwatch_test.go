package agent

import (
	"os"
	"path/filepath"
	"testing"
	"time"
)

// TestOutputWatch: a copier sleeps longer and longer while its exec's
// directory is quiet (up to attachIdleWatched), is woken by a write to an
// output file and by the exit file's rename, and then looks again soon.
// It polled every 10 ms before: a fifth of a core for every sandbox with
// a quiet command running (TestQuietExecIdle in internal/e2e).
func TestOutputWatch(t *testing.T) {
	dir := t.TempDir()
	out, err := os.Create(filepath.Join(dir, "stdout"))
	if err != nil {
		t.Fatal(err)
	}
	defer out.Close()
	w := watchOutput(dir)
	defer w.close()
	if w.f == nil {
		t.Fatal("no inotify watch on a Linux host")
	}
	// quiet: each sleep doubles, up to the bound
	var pauses []time.Duration
	for range 8 {
		pauses = append(pauses, w.pause)
		w.wait(false, nil)
	}
	for i := 1; i < len(pauses); i++ {
		if want := min(2*pauses[i-1], attachIdleWatched); pauses[i] != want {
			t.Fatalf("quiet sleeps %v: want each twice the last, up to %v", pauses, attachIdleWatched)
		}
	}
	if w.pause != attachIdleWatched {
		t.Fatalf("after a long quiet the sleep is %v, want %v", w.pause, attachIdleWatched)
	}
	woken := func(what string, change func()) {
		t.Helper()
		change()
		select {
		case <-w.changed:
			select { // for wait (the watch may have sent another meanwhile)
			case w.changed <- struct{}{}:
			default:
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("%s: the watch did not report it", what)
		}
		w.pause = attachIdleWatched
		w.wait(false, nil)
		if w.pause != attachPoll {
			t.Errorf("%s: the next sleep is %v, want %v", what, w.pause, attachPoll)
		}
	}
	woken("a write to stdout", func() { out.WriteString("x") })
	woken("the exit file's rename", func() {
		os.WriteFile(filepath.Join(dir, "exit.tmp"), []byte("0\n"), 0o600)
		os.Rename(filepath.Join(dir, "exit.tmp"), filepath.Join(dir, "exit"))
	})
	// output found: the next sleep is short whatever the watch said. A
	// watch of its own, with no inotify behind it: the rename above makes
	// several events, and a late one would cut this sleep short too.
	q := &outputWatch{changed: make(chan struct{}, 1), pause: attachIdleBlind}
	q.wait(true, nil)
	if q.pause != 2*attachPoll {
		t.Errorf("after output the sleeps restart at %v, then %v; got %v", attachPoll, 2*attachPoll, q.pause)
	}
	// the end, delivered, ends the wait with its code
	ended := make(chan int, 1)
	ended <- 7
	if code, ok := q.wait(false, ended); !ok || code != 7 {
		t.Errorf("wait with the end delivered: %d %v, want 7 true", code, ok)
	}
}
