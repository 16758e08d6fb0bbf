package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
)

// A data dir that fills up (a sandbox's image, an exec's output, another
// program) must not keep sbxd from recording what happens: an exec that
// ended, a state change. So the store keeps a reserve, a file of some
// megabytes on the same filesystem, and gives it up the first time a
// write fails for lack of space; the write is then tried again. The
// reserve comes back once there is room for it (Replenish).

// reserve is the space kept back for the database. Its state changes
// under mu, which is held only for that: the file's I/O (fallocate, sync,
// removal) runs with the state busy and no lock held, and a release that
// meets it busy waits for busy to end (done), then looks again: a write
// failing for space while a replenish takes the last room must still get
// the reserve.
type reserve struct {
	path string
	size int64

	mu    sync.Mutex
	state int32         // reserveAbsent, reserveHeld or reserveBusy
	done  chan struct{} // closed when the busy state ends
}

const (
	reserveAbsent int32 = iota
	reserveHeld
	reserveBusy // being made or given up
)

// begin moves the reserve from state from to busy; if it is busy, it
// returns the channel closed when that ends.
func (r *reserve) begin(from int32) (ok bool, busy <-chan struct{}) {
	r.mu.Lock()
	defer r.mu.Unlock()
	switch r.state {
	case from:
		r.state, r.done = reserveBusy, make(chan struct{})
		return true, nil
	case reserveBusy:
		return false, r.done
	}
	return false, nil
}

// end leaves the busy state for to.
func (r *reserve) end(to int32) {
	r.mu.Lock()
	r.state = to
	close(r.done)
	r.mu.Unlock()
}

func (r *reserve) load() int32 {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.state
}

// KeepReserve makes (or keeps) a reserve of size bytes at path, for the
// store's writes to fall back on when the disk is full.
func (s *Store) KeepReserve(path string, size int64) error {
	s.res = &reserve{path: path, size: size}
	return s.res.replenish()
}

// Replenish makes the reserve again if it was given up and there is room.
func (s *Store) Replenish() error {
	if s.res == nil {
		return nil
	}
	return s.res.replenish()
}

// ReserveHeld reports whether the reserve is in place.
func (s *Store) ReserveHeld() bool {
	return s.res != nil && s.res.load() == reserveHeld
}

func (r *reserve) replenish() error {
	if ok, _ := r.begin(reserveAbsent); !ok {
		return nil // held, or another is making or releasing it
	}
	if err := r.make(); err != nil {
		r.end(reserveAbsent)
		return err
	}
	r.end(reserveHeld)
	return nil
}

func (r *reserve) make() error {
	// only when there is plenty of room: taking it back must not be what
	// fills the disk again
	var fs syscall.Statfs_t
	if err := syscall.Statfs(filepath.Dir(r.path), &fs); err == nil && int64(fs.Bavail)*fs.Bsize < 4*r.size {
		return fmt.Errorf("reserve: %d bytes free, less than 4x the reserve of %d", int64(fs.Bavail)*fs.Bsize, r.size)
	}
	f, err := os.OpenFile(r.path, os.O_CREATE|os.O_WRONLY, 0o600)
	if err != nil {
		return err
	}
	defer f.Close()
	// allocated for real: a sparse file would give nothing back
	if err := syscall.Fallocate(int(f.Fd()), 0, 0, r.size); err != nil {
		_ = os.Remove(r.path)
		return err
	}
	if err := f.Sync(); err != nil {
		_ = os.Remove(r.path)
		return err
	}
	return nil
}

// release gives the reserve up; it reports whether there was one.
func (r *reserve) release() bool {
	for {
		ok, busy := r.begin(reserveHeld)
		if ok {
			gone := os.Remove(r.path) == nil
			r.end(reserveAbsent)
			return gone
		}
		if busy == nil {
			return false // none held
		}
		<-busy // being made (or given up by another): look again after
	}
}

// IsFull reports whether err says the disk (or the database) is full.
func IsFull(err error) bool {
	if err == nil {
		return false
	}
	if errors.Is(err, syscall.ENOSPC) {
		return true
	}
	s := err.Error()
	return strings.Contains(s, "database or disk is full") || strings.Contains(s, "SQLITE_FULL") || strings.Contains(s, "no space left on device")
}

// fullRetry is the database with its writes tried again once, after the
// reserve is given up, when they fail for lack of space.
type fullRetry struct {
	db  *sql.DB
	res func() *reserve
}

func (f fullRetry) ExecContext(ctx context.Context, q string, args ...any) (sql.Result, error) {
	r, err := f.db.ExecContext(ctx, q, args...)
	if IsFull(err) {
		if res := f.res(); res != nil && res.release() {
			return f.db.ExecContext(ctx, q, args...)
		}
	}
	return r, err
}

func (f fullRetry) QueryContext(ctx context.Context, q string, args ...any) (*sql.Rows, error) {
	return f.db.QueryContext(ctx, q, args...)
}

func (f fullRetry) QueryRowContext(ctx context.Context, q string, args ...any) *sql.Row {
	return f.db.QueryRowContext(ctx, q, args...)
}
