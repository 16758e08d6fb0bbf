package follow

import (
	"context"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"
)

// Attacks on the follower (session 28c).

// wokeWithin reports whether ch closes within d.
func wokeWithin(ch <-chan struct{}, d time.Duration) bool {
	select {
	case <-ch:
		return true
	case <-time.After(d):
		return false
	}
}

// TestAttack28cFilesDirRemoved: the removal of a followed directory itself
// wakes its followers: a follower of an exec's output whose sandbox is
// deleted must look again. fsnotify names the event by the directory's own
// path, and run looks up filepath.Dir of it, the parent (files.go, run).
func TestAttack28cFilesDirRemoved(t *testing.T) {
	var f Files
	defer f.Close()
	dir := filepath.Join(t.TempDir(), "execs", "ex_1")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	src, stop, err := f.Watch(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	ch := src()
	if err := os.Remove(dir); err != nil { // empty: no event for a file in it
		t.Fatal(err)
	}
	if !wokeWithin(ch, 2*time.Second) {
		t.Error("the removal of a followed directory woke none of its followers")
	}
}

// TestAttack28cFilesDirRecreated: a directory removed and made again under
// a watch: the watch is gone with the first inode, but Files keeps its
// entry while followers remain, and a new Watch of the same path only
// counts one more follower; writes into the new directory wake nobody.
func TestAttack28cFilesDirRecreated(t *testing.T) {
	var f Files
	defer f.Close()
	dir := filepath.Join(t.TempDir(), "d")
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	_, stop1, err := f.Watch(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer stop1()
	if err := os.Remove(dir); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	time.Sleep(50 * time.Millisecond) // let the watcher take the removal's events
	src2, stop2, err := f.Watch(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer stop2()
	ch := src2()
	if err := os.WriteFile(filepath.Join(dir, "stdout"), []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	if !wokeWithin(ch, 2*time.Second) {
		t.Error("a write into a directory made again under the same path woke a new follower of it: no watch is on the new directory")
	}
}

// TestAttack28cFilesManyFollowersStop: many followers of one directory,
// stopping and starting concurrently, with writes going on: every follower
// that is watching when a write lands is woken, and the last to stop frees
// the watch (a new Watch then works and is woken).
func TestAttack28cFilesManyFollowersStop(t *testing.T) {
	var f Files
	defer f.Close()
	dir := t.TempDir()
	var wg sync.WaitGroup
	errs := make(chan string, 64)
	for g := 0; g < 16; g++ {
		wg.Add(1)
		go func(g int) {
			defer wg.Done()
			for i := 0; i < 20; i++ {
				src, stop, err := f.Watch(dir)
				if err != nil {
					errs <- err.Error()
					return
				}
				ch := src()
				if err := os.WriteFile(filepath.Join(dir, "f"), []byte{byte(g), byte(i)}, 0o600); err != nil {
					errs <- err.Error()
				}
				if !wokeWithin(ch, 2*time.Second) {
					errs <- "a follower missed a write made after it subscribed"
				}
				stop()
				stop() // a stop is once
			}
		}(g)
	}
	wg.Wait()
	close(errs)
	for e := range errs {
		t.Error(e)
	}
	f.mu.Lock()
	left := len(f.dirs)
	f.mu.Unlock()
	if left != 0 {
		t.Errorf("%d watches left after every follower stopped", left)
	}
	src, stop, err := f.Watch(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	ch := src()
	os.WriteFile(filepath.Join(dir, "g"), nil, 0o600)
	if !wokeWithin(ch, 2*time.Second) {
		t.Error("after every follower stopped, a new follower is not woken")
	}
}

// TestAttack28cFilesCloseRacesWatch: Close racing Watches and stops: no
// panic, no race, a Watch after Close fails, and a follower waiting when
// Close comes is woken once.
func TestAttack28cFilesCloseRacesWatch(t *testing.T) {
	for round := 0; round < 20; round++ {
		var f Files
		dir := t.TempDir()
		var wg sync.WaitGroup
		woke := make(chan bool, 8)
		for g := 0; g < 8; g++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				src, stop, err := f.Watch(dir)
				if err != nil {
					return // closed first
				}
				defer stop()
				woke <- wokeWithin(src(), 2*time.Second)
			}()
		}
		time.Sleep(time.Duration(round) * 100 * time.Microsecond)
		if err := f.Close(); err != nil {
			t.Fatal(err)
		}
		wg.Wait()
		close(woke)
		for w := range woke {
			if !w {
				t.Fatal("a follower watching when Close came was never woken")
			}
		}
		if _, _, err := f.Watch(dir); err == nil {
			t.Fatal("a Watch after Close worked")
		}
		_ = f.Close() // twice: no panic
	}
}

// TestAttack28cBroadcastStorm: notifiers and followers at full speed: a
// follower that reads a counter then waits always sees a change that
// lands between its read and its wait (Follow takes the channel first).
func TestAttack28cBroadcastStorm(t *testing.T) {
	var b Broadcast
	var mu sync.Mutex
	n := 0
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	const target = 2000
	go func() {
		for i := 0; i < target; i++ {
			mu.Lock()
			n++
			mu.Unlock()
			b.Notify()
		}
	}()
	var wg sync.WaitGroup
	for g := 0; g < 8; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			err := Follow(ctx, func() (bool, time.Time, error) {
				mu.Lock()
				defer mu.Unlock()
				return n == target, time.Time{}, nil
			}, b.Wait)
			if err != nil {
				t.Errorf("a follower missed the last change: %v", err)
			}
		}()
	}
	wg.Wait()
}
