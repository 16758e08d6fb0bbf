package sandbox

import (
	"errors"
	"fmt"
	"path/filepath"
	"sync"

	"github.com/fsnotify/fsnotify"

	"sbx.dev/sbx/internal/wire/freezewire"
)

// The freeze slots' watches, a part of the freeze owner (freezeOwner in
// freeze.go, which arms, settles and records the slots). A running sandbox
// has one slot armed at a time; the slotWatcher tells the freeze owner
// when the console shim has written a verdict into one, through the one
// callback it is given (start), and runs the settles of one sandbox one at
// a time (kick). It has its own lock, held only over its maps: the watches
// are added and removed with it released.

// slotWatcher watches the slots of running sandboxes (inotify) for the
// verdict the console shim writes, so that a freeze is recorded at once.
type slotWatcher struct {
	mu     sync.Mutex
	w      *fsnotify.Watcher
	bySlot map[string]string    // sandbox/slot -> its directory
	byDir  map[string][2]string // a slot's directory -> sandbox, slot
	// awaiting are the slots awaitSlot watches; settling the sandboxes a
	// settle runs or is due for (true: due again once it ends), so that a
	// flood of verdicts costs one settle at a time.
	awaiting map[string]bool
	settling map[string]bool
}

func (w *slotWatcher) startAwait(key string) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.awaiting[key] {
		return false
	}
	if w.awaiting == nil {
		w.awaiting = map[string]bool{}
	}
	w.awaiting[key] = true
	return true
}

func (w *slotWatcher) endAwait(key string) {
	w.mu.Lock()
	delete(w.awaiting, key)
	w.mu.Unlock()
}

// kick runs settle(id) in the background, once at a time per sandbox: a
// kick while one runs makes it run once more after.
func (w *slotWatcher) kick(id string, settle func(id string)) {
	w.mu.Lock()
	if w.settling == nil {
		w.settling = map[string]bool{}
	}
	if _, running := w.settling[id]; running {
		w.settling[id] = true
		w.mu.Unlock()
		return
	}
	w.settling[id] = false
	w.mu.Unlock()
	go func() {
		for {
			settle(id)
			w.mu.Lock()
			if !w.settling[id] {
				delete(w.settling, id)
				w.mu.Unlock()
				return
			}
			w.settling[id] = false
			w.mu.Unlock()
		}
	}()
}

// start starts watching slots (fsnotify); fn is called with a sandbox's
// id when a verdict arrives in one of its slots, and with every watched
// sandbox's when the kernel dropped events (its queue overflowed).
func (w *slotWatcher) start(fn func(id string)) error {
	fw, err := fsnotify.NewWatcher()
	if err != nil {
		return fmt.Errorf("watch freezes: %w", err)
	}
	w.mu.Lock()
	w.w = fw
	w.bySlot = map[string]string{}
	w.byDir = map[string][2]string{}
	w.mu.Unlock()
	go func() {
		for {
			select {
			case ev, ok := <-fw.Events:
				if !ok {
					return
				}
				// the shim renames a verdict into place (Create); a write in
				// place is a Write
				if filepath.Base(ev.Name) != freezewire.VerdictFile || !ev.Has(fsnotify.Create) && !ev.Has(fsnotify.Write) {
					continue
				}
				w.mu.Lock()
				who, ok := w.byDir[filepath.Dir(ev.Name)]
				w.mu.Unlock()
				if ok {
					fn(who[0])
				}
			case err, ok := <-fw.Errors:
				if !ok {
					return
				}
				if errors.Is(err, fsnotify.ErrEventOverflow) {
					w.mu.Lock()
					var ids []string
					for _, who := range w.byDir {
						ids = append(ids, who[0])
					}
					w.mu.Unlock()
					for _, id := range ids {
						fn(id)
					}
				}
			}
		}
	}()
	return nil
}

// watch watches sandbox id's slot.
func (w *slotWatcher) watch(id, slot, dir string) error {
	dir = filepath.Clean(dir)
	// known before it is watched: its first event finds whose it is. The
	// watch itself is added with the lock released (fsnotify's own is
	// enough).
	w.mu.Lock()
	fw := w.w
	if fw != nil {
		w.bySlot[id+"/"+slot] = dir
		w.byDir[dir] = [2]string{id, slot}
	}
	w.mu.Unlock()
	if fw == nil {
		return nil
	}
	if err := fw.Add(dir); err != nil {
		w.mu.Lock()
		if w.bySlot[id+"/"+slot] == dir {
			delete(w.bySlot, id+"/"+slot)
			delete(w.byDir, dir)
		}
		w.mu.Unlock()
		return fmt.Errorf("watch the freeze slot %s: %w", dir, err)
	}
	return nil
}

// unwatch stops watching a slot (one gone is forgotten by the kernel).
func (w *slotWatcher) unwatch(id, slot string) {
	w.mu.Lock()
	dir, ok := w.bySlot[id+"/"+slot]
	if !ok {
		w.mu.Unlock()
		return
	}
	delete(w.bySlot, id+"/"+slot)
	delete(w.byDir, dir)
	fw := w.w
	w.mu.Unlock()
	if fw != nil {
		_ = fw.Remove(dir)
	}
}
