package follow

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"
)

func isClosed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

func TestBroadcast(t *testing.T) {
	var b Broadcast
	a, c := b.Wait(), b.Wait()
	if isClosed(a) {
		t.Fatal("closed before any Notify")
	}
	b.Notify()
	if !isClosed(a) || !isClosed(c) {
		t.Error("a Notify left a waiter waiting")
	}
	if isClosed(b.Wait()) {
		t.Error("a Wait after the Notify is closed already")
	}
	b.Notify() // no waiter: nothing to close, nothing blocks
	var none *Broadcast
	none.Notify()
	if none.Wait() != nil {
		t.Error("a nil Broadcast handed out a channel")
	}
}

// TestFollow: a change during a read wakes the next wait (the gap between
// the catch-up read and the wait loses nothing), a read may ask to be
// called again at a time, and ctx ends the wait.
func TestFollow(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	t.Run("a change during the read", func(t *testing.T) {
		var b Broadcast
		reads := 0
		err := Follow(ctx, func() (bool, time.Time, error) {
			reads++
			if reads == 1 {
				b.Notify() // written after the read looked, before the wait
			}
			return reads == 2, time.Time{}, nil
		}, b.Wait)
		if err != nil || reads != 2 {
			t.Errorf("got %v after %d reads, want nil after 2", err, reads)
		}
	})
	t.Run("again", func(t *testing.T) {
		reads := 0
		start := time.Now()
		err := Follow(ctx, func() (bool, time.Time, error) {
			reads++
			return reads == 2, time.Now().Add(20 * time.Millisecond), nil
		})
		if err != nil || reads != 2 || time.Since(start) < 20*time.Millisecond {
			t.Errorf("got %v after %d reads in %s, want nil after 2 in 20ms or more", err, reads, time.Since(start))
		}
	})
	t.Run("ctx", func(t *testing.T) {
		short, stop := context.WithTimeout(ctx, 20*time.Millisecond)
		defer stop()
		var b Broadcast
		err := Follow(short, func() (bool, time.Time, error) { return false, time.Time{}, nil }, b.Wait)
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("got %v, want %v", err, context.DeadlineExceeded)
		}
	})
	t.Run("a failed read", func(t *testing.T) {
		boom := errors.New("boom")
		if err := Follow(ctx, func() (bool, time.Time, error) { return false, time.Time{}, boom }); err != boom {
			t.Errorf("got %v, want %v", err, boom)
		}
	})
}

// TestFiles: a file written in a watched dir wakes its followers, who share
// one watch, freed with the last of them.
func TestFiles(t *testing.T) {
	dir := t.TempDir()
	var f Files
	defer f.Close()
	src1, stop1, err := f.Watch(dir)
	if err != nil {
		t.Fatal(err)
	}
	src2, stop2, err := f.Watch(dir + "/")
	if err != nil {
		t.Fatal(err)
	}
	a, b := src1(), src2()
	if err := os.WriteFile(filepath.Join(dir, "log"), []byte("x\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, ch := range []<-chan struct{}{a, b} {
		select {
		case <-ch:
		case <-time.After(10 * time.Second):
			t.Fatal("a write did not wake a follower")
		}
	}
	if n := len(f.dirs); n != 1 {
		t.Errorf("%d watches for one dir, want 1", n)
	}
	stop1()
	stop1() // twice is once
	if n := len(f.dirs); n != 1 {
		t.Errorf("%d watches with one follower left, want 1", n)
	}
	stop2()
	if n := len(f.dirs); n != 0 {
		t.Errorf("%d watches with no follower, want 0", n)
	}
	if _, _, err := f.Watch(filepath.Join(dir, "none")); err == nil {
		t.Error("watched a dir that does not exist")
	}
	if n := len(f.dirs); n != 0 {
		t.Errorf("a failed watch left %d", n)
	}
}
