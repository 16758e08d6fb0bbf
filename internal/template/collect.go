package template

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// layerGrace is how long an unused layer is kept: a client uploads an
// image's layers first and makes the version from them next, and Collect
// must not take them in between.
var layerGrace = time.Hour

// A lease is an operation in progress. It holds tmp/ID.lease locked for as
// long as it lives, and names in it the versions and layers it makes or
// reads, which Collect then leaves alone; tmp/ID/ is its work directory. A
// lease whose file is not locked belongs to a process that died: its work is
// thrown away.
type lease struct {
	s    *Store
	id   string
	f    *os.File
	refs []string
	work string
}

// Prefixes of the references a lease holds.
const (
	refVersion = "version "
	refLayer   = "layer "
)

// newLease starts an operation holding refs, with an empty work directory.
func (s *Store) newLease(refs ...string) (*lease, error) {
	l := &lease{s: s, id: randomSuffix() + randomSuffix()}
	l.work = filepath.Join(s.dir, tmpDir, l.id)
	err := s.critical(func() error {
		f, err := os.OpenFile(l.work+leaseSuffix, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
		if err != nil {
			return err
		}
		// locked before anyone can look: every look is under critical
		if err := flock(f, unix.LOCK_EX|unix.LOCK_NB); err != nil {
			f.Close()
			os.Remove(l.work + leaseSuffix)
			return err
		}
		l.f = f
		if err := os.Mkdir(l.work, 0o755); err != nil {
			return err
		}
		return l.holdLocked(refs...)
	})
	if err != nil {
		if l.f != nil {
			l.release()
		}
		return nil, fmt.Errorf("templates: start an operation: %w", err)
	}
	return l, nil
}

// hold adds refs to the lease.
func (l *lease) hold(refs ...string) error {
	return l.s.critical(func() error { return l.holdLocked(refs...) })
}

// holdLocked is hold for a caller in critical. Versions are given as bare
// digests; layers with refLayer before them.
func (l *lease) holdLocked(refs ...string) error {
	for _, r := range refs {
		if !strings.HasPrefix(r, refLayer) {
			r = refVersion + r
		}
		l.refs = append(l.refs, r)
	}
	data := []byte(strings.Join(l.refs, "\n") + "\n")
	if err := l.f.Truncate(0); err != nil {
		return err
	}
	if _, err := l.f.WriteAt(data, 0); err != nil {
		return err
	}
	return nil
}

// release throws away the work directory (what was kept was renamed out of
// it) and ends the lease.
func (l *lease) release() error {
	err := removeTree(l.work)
	if rerr := os.Remove(l.work + leaseSuffix); rerr != nil && !errors.Is(rerr, fs.ErrNotExist) {
		err = errors.Join(err, rerr)
	}
	l.f.Close()
	return err
}

// Collect removes the versions that no name points at, that no build or
// import in progress (in any process) holds, and that inUse says nothing
// uses; then the layers no remaining version links to. It returns the
// versions removed. inUse is called without any store lock held; a version
// a name points at again by the time Collect removes it is kept. It also
// clears what interrupted operations left behind.
func (s *Store) Collect(inUse func(version string) bool) (removed []string, err error) {
	if inUse == nil {
		inUse = func(string) bool { return false }
	}
	return s.sweep(inUse)
}

// sweep clears the work of dead operations and, with inUse, collects.
func (s *Store) sweep(inUse func(string) bool) (removed []string, err error) {
	trash, err := s.newLease()
	if err != nil {
		return nil, err
	}
	defer func() {
		if rerr := trash.release(); rerr != nil {
			err = errors.Join(err, fmt.Errorf("templates: delete collected files: %w", rerr))
		}
	}()
	var candidates []string
	err = s.critical(func() error {
		live, err := s.clearDead(trash)
		if err != nil || inUse == nil {
			return err
		}
		refd, err := s.pointedAt()
		if err != nil {
			return err
		}
		vs, err := s.versions()
		if err != nil {
			return err
		}
		for _, v := range vs {
			if !refd[v] && !live[refVersion+v] {
				candidates = append(candidates, v)
			}
		}
		return nil
	})
	if err != nil || inUse == nil {
		return nil, err
	}
	var unused []string
	for _, v := range candidates {
		if !inUse(v) {
			unused = append(unused, v)
		}
	}
	err = s.critical(func() error {
		// again: a name may point at it now, or an import may hold it
		live, err := s.clearDead(trash)
		if err != nil {
			return err
		}
		refd, err := s.pointedAt()
		if err != nil {
			return err
		}
		for _, v := range unused {
			if refd[v] || live[refVersion+v] {
				continue
			}
			if err := os.Rename(s.versionPath(v), filepath.Join(trash.work, digestDir(v))); err != nil {
				if errors.Is(err, fs.ErrNotExist) {
					continue
				}
				return fmt.Errorf("collect version %s: %w", v, err)
			}
			removed = append(removed, v)
		}
		return s.collectLayers(trash, live)
	})
	sort.Strings(removed)
	return removed, err
}

// collectLayers moves into trash the layers no version links to, no live
// operation holds, and that are older than layerGrace. In critical.
func (s *Store) collectLayers(trash *lease, live map[string]bool) error {
	used := map[string]bool{}
	vs, err := s.versions()
	if err != nil {
		return err
	}
	for _, v := range vs {
		m, err := s.readMeta(v)
		if err != nil {
			// keep every layer rather than guess what a broken version uses
			return fmt.Errorf("collect layers: %w", err)
		}
		for _, d := range m.Layers {
			used[d] = true
		}
	}
	entries, err := os.ReadDir(filepath.Join(s.dir, layersDir))
	if err != nil {
		return err
	}
	for _, e := range entries {
		d := dirDigest(e.Name())
		if d == "" || used[d] || live[refLayer+d] {
			continue
		}
		if fi, err := e.Info(); err != nil || time.Since(fi.ModTime()) < layerGrace {
			continue
		}
		if err := os.Rename(filepath.Join(s.dir, layersDir, e.Name()), filepath.Join(trash.work, "layer-"+e.Name())); err != nil {
			return fmt.Errorf("collect layer %s: %w", d, err)
		}
	}
	return nil
}

// clearDead moves the work of operations whose process died into trash and
// returns what the live ones hold. In critical.
func (s *Store) clearDead(trash *lease) (live map[string]bool, err error) {
	dir := filepath.Join(s.dir, tmpDir)
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	live = map[string]bool{}
	alive := map[string]bool{}
	for _, e := range entries {
		id, ok := strings.CutSuffix(e.Name(), leaseSuffix)
		if !ok {
			continue
		}
		refs, held, err := readLease(filepath.Join(dir, e.Name()))
		if err != nil {
			return nil, err
		}
		if !held {
			if err := os.Remove(filepath.Join(dir, e.Name())); err != nil && !errors.Is(err, fs.ErrNotExist) {
				return nil, err
			}
			continue
		}
		alive[id] = true
		for _, r := range refs {
			live[r] = true
		}
	}
	for _, e := range entries {
		if strings.HasSuffix(e.Name(), leaseSuffix) || alive[e.Name()] {
			continue
		}
		if err := os.Rename(filepath.Join(dir, e.Name()), filepath.Join(trash.work, "dead-"+e.Name())); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return nil, fmt.Errorf("clear %s: %w", e.Name(), err)
		}
	}
	return live, nil
}

// readLease returns a lease file's references and whether its owner holds it.
func readLease(path string) (refs []string, held bool, err error) {
	f, err := os.Open(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, false, nil
	}
	if err != nil {
		return nil, false, err
	}
	defer f.Close()
	switch err := flock(f, unix.LOCK_EX|unix.LOCK_NB); {
	case err == nil:
		return nil, false, nil // nobody holds it: its owner died
	case !errors.Is(err, unix.EWOULDBLOCK):
		return nil, false, fmt.Errorf("lock %s: %w", path, err)
	}
	// from the file opened, not its path: its owner may end the lease (and
	// remove the file) at any instant, since release is not in critical
	b, err := io.ReadAll(f)
	if err != nil {
		return nil, false, err
	}
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		if line := sc.Text(); line != "" {
			refs = append(refs, line)
		}
	}
	return refs, true, nil
}

// pointedAt returns the versions some name points at. In critical.
func (s *Store) pointedAt() (map[string]bool, error) {
	entries, err := os.ReadDir(filepath.Join(s.dir, namesDir))
	if err != nil {
		return nil, err
	}
	out := map[string]bool{}
	for _, e := range entries {
		if ValidName(e.Name()) != nil {
			continue
		}
		if v, err := os.Readlink(s.namePath(e.Name())); err == nil {
			out[v] = true
		}
	}
	return out, nil
}

// versions returns the versions in the store.
func (s *Store) versions() ([]string, error) {
	entries, err := os.ReadDir(filepath.Join(s.dir, versionsDir))
	if err != nil {
		return nil, err
	}
	var out []string
	for _, e := range entries {
		if d := dirDigest(e.Name()); d != "" {
			out = append(out, d)
		}
	}
	return out, nil
}
