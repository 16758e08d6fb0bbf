package follow

import (
	"errors"
	"fmt"
	"path/filepath"
	"sync"
	"sync/atomic"

	"github.com/fsnotify/fsnotify"
)

// Files tells followers when the files of a directory change (one is made,
// written, truncated or removed), through one inotify instance (fsnotify)
// for all of them: each directory followed has one watch, however many
// follow it, dropped when the last of them stops. Files written by another
// process (runsc, an exec's shim) are seen as those sbxd writes. The zero
// value is ready.
type Files struct {
	// opMu serialises the watches' setup and removal (inotify calls), so
	// that mu is never held across them.
	opMu sync.Mutex
	w    *fsnotify.Watcher

	mu     sync.Mutex
	dirs   map[string]*dirWatch
	closed bool
}

type dirWatch struct {
	n      int // followers
	b      Broadcast
	closed atomic.Bool // by Close: each follower is woken once more
}

// Watch starts telling of the changes in dir. It returns the Source of
// them and stop, which the follower calls once it is done (it frees the
// watch with the last follower). A dir that cannot be watched is an error.
func (f *Files) Watch(dir string) (Source, func(), error) {
	dir = filepath.Clean(dir)
	f.opMu.Lock()
	defer f.opMu.Unlock()
	f.mu.Lock()
	if f.closed {
		f.mu.Unlock()
		return nil, nil, errors.New("follow: watch " + dir + ": closed")
	}
	d := f.dirs[dir]
	f.mu.Unlock()
	if d != nil {
		// watched already, but maybe a directory since removed and made
		// again: its watch died with the old one. Adding it again is
		// idempotent for the same directory and watches a new one.
		if err := f.w.Add(dir); err != nil {
			return nil, nil, fmt.Errorf("follow: watch %s: %w", dir, err)
		}
		f.mu.Lock()
		d.n++
		f.mu.Unlock()
	}
	if d == nil {
		if f.w == nil {
			w, err := fsnotify.NewWatcher()
			if err != nil {
				return nil, nil, fmt.Errorf("follow: watch %s: %w", dir, err)
			}
			f.w = w
			go f.run(w)
		}
		if err := f.w.Add(dir); err != nil {
			return nil, nil, fmt.Errorf("follow: watch %s: %w", dir, err)
		}
		d = &dirWatch{n: 1}
		f.mu.Lock()
		if f.dirs == nil {
			f.dirs = map[string]*dirWatch{}
		}
		f.dirs[dir] = d
		f.mu.Unlock()
	}
	var once sync.Once
	stop := func() { once.Do(func() { f.unwatch(dir, d) }) }
	return d.source(), stop, nil
}

// source is one follower's Source of d. A follower that takes its channel
// only after Close woke the others is woken too, once: the channel first,
// then closed, as Close sets closed before it notifies.
func (d *dirWatch) source() Source {
	var told atomic.Bool
	return func() <-chan struct{} {
		ch := d.b.Wait()
		if d.closed.Load() && told.CompareAndSwap(false, true) {
			return closedChan
		}
		return ch
	}
}

var closedChan = func() chan struct{} { c := make(chan struct{}); close(c); return c }()

func (f *Files) unwatch(dir string, d *dirWatch) {
	f.opMu.Lock()
	defer f.opMu.Unlock()
	f.mu.Lock()
	d.n--
	last := d.n == 0 && f.dirs[dir] == d
	if last {
		delete(f.dirs, dir)
	}
	f.mu.Unlock()
	if last && f.w != nil {
		_ = f.w.Remove(dir) // gone with its dir, maybe
	}
}

// run hands the watcher's events to the followers of their directory;
// when events were lost (the queue overflowed), every follower is woken.
func (f *Files) run(w *fsnotify.Watcher) {
	for {
		select {
		case ev, ok := <-w.Events:
			if !ok {
				return
			}
			f.mu.Lock()
			d := f.dirs[filepath.Dir(ev.Name)]
			var self *dirWatch // a followed directory removed or moved itself
			if ev.Has(fsnotify.Remove) || ev.Has(fsnotify.Rename) {
				self = f.dirs[ev.Name]
			}
			f.mu.Unlock()
			d.wake()
			self.wake()
		case _, ok := <-w.Errors:
			if !ok {
				return
			}
			f.mu.Lock()
			all := make([]*dirWatch, 0, len(f.dirs))
			for _, d := range f.dirs {
				all = append(all, d)
			}
			f.mu.Unlock()
			for _, d := range all {
				d.wake()
			}
		}
	}
}

func (d *dirWatch) wake() {
	if d != nil {
		d.b.Notify()
	}
}

// Close stops every watch; a Watch after it fails.
func (f *Files) Close() error {
	f.opMu.Lock()
	defer f.opMu.Unlock()
	f.mu.Lock()
	f.closed = true
	all := f.dirs
	f.dirs = nil
	f.mu.Unlock()
	for _, d := range all {
		d.closed.Store(true)
		d.wake() // their followers look once more, then wait on ctx
	}
	if f.w == nil {
		return nil
	}
	return f.w.Close()
}
