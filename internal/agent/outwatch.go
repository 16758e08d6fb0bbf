package agent

import (
	"os"
	"time"

	"golang.org/x/sys/unix"
)

// A copier (attach, start) follows an exec's output files as they grow.
// It looked every 10 ms for as long as the command ran: a sandbox with
// one command running and quiet spent a fifth of a core on its copier
// (measured: 215 ms of CPU a second against 19 idle). It now sleeps
// until the files change: an inotify watch on the exec's directory wakes
// it at a write to stdout or stderr and at the exit file's rename
// (gVisor's VFS reports both), and it looks anyway when the watch has
// been quiet for a while, so a change the watch misses (none known; a
// watch a restore dropped) is late, never lost.

const (
	// attachIdleWatched bounds a copier's sleep while its watch is quiet.
	attachIdleWatched = 500 * time.Millisecond
	// attachIdleBlind bounds it where there is no watch (a kernel
	// without inotify): looks back off from attachPoll to this.
	attachIdleBlind = 100 * time.Millisecond
	// aliveCheckEvery is how often a copier checks that the command's
	// process is still there (it may be gone with no exit recorded).
	aliveCheckEvery = time.Second
)

// outputWatch wakes a copier when an exec's directory changes.
type outputWatch struct {
	f       *os.File        // the inotify descriptor; nil when there is none
	changed chan struct{}   // a change since the last look
	pause   time.Duration   // the next quiet sleep
	abort   <-chan struct{} // closed: wait returns at once (nil: never)
}

// watchOutput watches dir; with no inotify it degrades to timed looks.
func watchOutput(dir string) *outputWatch {
	w := &outputWatch{changed: make(chan struct{}, 1), pause: attachPoll}
	fd, err := unix.InotifyInit1(unix.IN_NONBLOCK | unix.IN_CLOEXEC)
	if err != nil {
		return w
	}
	const mask = unix.IN_MODIFY | unix.IN_CREATE | unix.IN_MOVED_TO | unix.IN_CLOSE_WRITE | unix.IN_ATTRIB
	if _, err := unix.InotifyAddWatch(fd, dir, mask); err != nil {
		unix.Close(fd)
		return w
	}
	w.f = os.NewFile(uintptr(fd), "inotify:"+dir) // non-blocking: Close ends a Read
	go func(f *os.File) {
		buf := make([]byte, 4096)
		for {
			if _, err := f.Read(buf); err != nil {
				return // closed, or no poller for it: timed looks go on
			}
			select {
			case w.changed <- struct{}{}:
			default:
			}
		}
	}(w.f)
	return w
}

// wait returns after a change, after the quiet sleep, or when ended
// delivers (ok then). copied says the last look found output: the next
// sleep is short again, as more may follow at once.
func (w *outputWatch) wait(copied bool, ended <-chan int) (code int, ok bool) {
	limit := attachIdleBlind
	if w.f != nil {
		limit = attachIdleWatched
	}
	if copied {
		w.pause = attachPoll
	}
	t := time.NewTimer(w.pause)
	defer t.Stop()
	w.pause = min(2*w.pause, limit)
	select {
	case code = <-ended:
		return code, true
	case <-w.changed:
		w.pause = attachPoll
	case <-w.abort:
	case <-t.C:
	}
	return 0, false
}

func (w *outputWatch) close() {
	if w.f != nil {
		w.f.Close()
	}
}
