// Package template builds and caches the root filesystems sandboxes boot from.
//
// A template lives in <dir>/<name>/: rootfs/ is the directory gVisor boots
// from (read-only; each sandbox gets an overlay on top) and template.json
// describes it. template.json is written last, so a directory without it is
// not a template. Builds and imports happen in <dir>/.tmp-<name>-<random>/
// and are renamed into place, so a failed build leaves nothing behind.
package template

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"
	"sbx.dev/sbx/api"
)

const (
	metaFile  = "template.json"
	rootfsDir = "rootfs"

	// Prefixes of the store's scratch directories. A .tmp- directory is a
	// build in progress, a .rm- directory a template being removed, and an
	// .old- directory a template being replaced by a forced build: if its
	// name is missing, the crash came between the two renames and it is
	// put back.
	tmpPrefix = ".tmp-"
	rmPrefix  = ".rm-"
	oldPrefix = ".old-"
)

// Store is a directory of templates. Its methods are safe for concurrent use.
type Store struct {
	dir string

	mu    sync.Mutex
	locks map[string]chan struct{} // one per name: builds, imports and removals of a name take turns
}

// Open returns the store in dir, creating dir if needed, and removes what
// interrupted builds and removals left behind.
func Open(dir string) (*Store, error) {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return nil, fmt.Errorf("open templates %s: %w", dir, err)
	}
	if err := os.MkdirAll(abs, 0o755); err != nil {
		return nil, fmt.Errorf("open templates %s: %w", abs, err)
	}
	s := &Store{dir: abs, locks: make(map[string]chan struct{})}
	if err := s.recover(); err != nil {
		return nil, fmt.Errorf("open templates %s: %w", abs, err)
	}
	return s, nil
}

// recover cleans up after builds, replacements and removals that a crash interrupted.
func (s *Store) recover() error {
	entries, err := os.ReadDir(s.dir)
	if err != nil {
		return err
	}
	for _, e := range entries {
		n := e.Name()
		p := filepath.Join(s.dir, n)
		switch {
		case ValidName(n) == nil:
			// A template made by an older sbx gets what this one expects.
			if _, err := os.Stat(filepath.Join(p, "template.json")); err == nil {
				if err := addSkeleton(filepath.Join(p, "rootfs")); err != nil {
					return fmt.Errorf("update template %s: %w", n, err)
				}
			}
		case strings.HasPrefix(n, tmpPrefix), strings.HasPrefix(n, rmPrefix):
			if err := removeTree(p); err != nil {
				return fmt.Errorf("remove leftover %s: %w", n, err)
			}
		case strings.HasPrefix(n, oldPrefix):
			rest := strings.TrimPrefix(n, oldPrefix)
			i := strings.LastIndex(rest, "-")
			if i <= 0 || ValidName(rest[:i]) != nil {
				if err := removeTree(p); err != nil {
					return fmt.Errorf("remove leftover %s: %w", n, err)
				}
				continue
			}
			cur := filepath.Join(s.dir, rest[:i])
			if _, err := os.Lstat(cur); errors.Is(err, fs.ErrNotExist) {
				if err := os.Rename(p, cur); err != nil {
					return fmt.Errorf("restore %s: %w", n, err)
				}
				continue
			}
			if err := removeTree(p); err != nil {
				return fmt.Errorf("remove leftover %s: %w", n, err)
			}
		}
	}
	return nil
}

var nameRE = regexp.MustCompile(`^[a-z0-9][a-z0-9._-]{0,62}$`)

// ValidName returns an api.ErrInvalid error unless name is a valid template
// name: a lowercase letter or digit, then up to 62 of [a-z0-9._-].
func ValidName(name string) error {
	if !nameRE.MatchString(name) {
		return api.Errorf(api.ErrInvalid, "invalid template name %q: use a lowercase letter or digit, then up to 62 of a-z, 0-9, '.', '_' and '-'", name)
	}
	return nil
}

// List returns the complete templates, sorted by name.
func (s *Store) List() ([]api.Template, error) {
	entries, err := os.ReadDir(s.dir)
	if err != nil {
		return nil, fmt.Errorf("list templates: %w", err)
	}
	out := []api.Template{}
	for _, e := range entries { // ReadDir sorts by name
		if !e.IsDir() || ValidName(e.Name()) != nil {
			continue
		}
		t, err := s.Get(e.Name())
		if errors.Is(err, api.ErrNotFound) {
			continue
		}
		if err != nil {
			return nil, err
		}
		out = append(out, t)
	}
	return out, nil
}

// Get returns the complete template name: api.ErrInvalid for a bad name,
// api.ErrNotFound if there is no such complete template.
func (s *Store) Get(name string) (api.Template, error) {
	if err := ValidName(name); err != nil {
		return api.Template{}, err
	}
	b, err := os.ReadFile(filepath.Join(s.dir, name, metaFile))
	if errors.Is(err, fs.ErrNotExist) {
		return api.Template{}, notFound(name)
	}
	if err != nil {
		return api.Template{}, fmt.Errorf("template %s: %w", name, err)
	}
	var t api.Template
	if err := json.Unmarshal(b, &t); err != nil {
		return api.Template{}, fmt.Errorf("template %s: read %s: %w", name, metaFile, err)
	}
	t.Name = name
	return t, nil
}

// Rootfs returns the absolute path of the rootfs directory of the complete
// template name; the errors are Get's.
func (s *Store) Rootfs(name string) (string, error) {
	if _, err := s.Get(name); err != nil {
		return "", err
	}
	return filepath.Join(s.dir, name, rootfsDir), nil
}

// Remove deletes template name, complete or not: api.ErrNotFound if there
// is none. It waits for a build or import of the same name to finish.
// Sandboxes running from it keep their open files.
func (s *Store) Remove(name string) error {
	if err := ValidName(name); err != nil {
		return err
	}
	unlock, err := s.lock(context.Background(), name)
	if err != nil {
		return err
	}
	defer unlock()
	p := filepath.Join(s.dir, name)
	if _, err := os.Lstat(p); errors.Is(err, fs.ErrNotExist) {
		return notFound(name)
	}
	// rename first, so the template disappears at once and whole
	gone := filepath.Join(s.dir, rmPrefix+name+"-"+randomSuffix())
	if err := os.Rename(p, gone); err != nil {
		return fmt.Errorf("remove template %s: %w", name, err)
	}
	if err := removeTree(gone); err != nil {
		return fmt.Errorf("remove template %s: %w", name, err)
	}
	return nil
}

func notFound(name string) error {
	return api.Errorf(api.ErrNotFound, "template %s not found; run `sbx template build %s`", name, name)
}

// lock takes the per-name lock, or gives up when ctx ends.
func (s *Store) lock(ctx context.Context, name string) (unlock func(), err error) {
	s.mu.Lock()
	ch, ok := s.locks[name]
	if !ok {
		ch = make(chan struct{}, 1)
		s.locks[name] = ch
	}
	s.mu.Unlock()
	select {
	case ch <- struct{}{}:
		return func() { <-ch }, nil
	case <-ctx.Done():
		return nil, fmt.Errorf("template %s: wait for another build: %w", name, ctx.Err())
	}
}

// create makes template name in a temporary directory with fill, which
// populates the rootfs path it is given, and renames it into place,
// replacing an existing template of that name. The caller holds the lock.
func (s *Store) create(ctx context.Context, name, source string, progress func(string), fill func(ctx context.Context, rootfs string) error) (t api.Template, err error) {
	tmp, err := os.MkdirTemp(s.dir, tmpPrefix+name+"-")
	if err != nil {
		return api.Template{}, err
	}
	defer func() {
		if err != nil {
			if rerr := removeTree(tmp); rerr != nil {
				err = errors.Join(err, fmt.Errorf("clean up %s: %w", tmp, rerr))
			}
		}
	}()
	if err := os.Chmod(tmp, 0o755); err != nil {
		return api.Template{}, err
	}
	rootfs := filepath.Join(tmp, rootfsDir)
	if err := fill(ctx, rootfs); err != nil {
		return api.Template{}, err
	}
	if err := ctx.Err(); err != nil {
		return api.Template{}, err
	}
	progress("preparing mount points")
	if err := addSkeleton(rootfs); err != nil {
		return api.Template{}, fmt.Errorf("add mount points: %w", err)
	}
	size, err := diskUsage(rootfs)
	if err != nil {
		return api.Template{}, fmt.Errorf("measure rootfs: %w", err)
	}
	t = api.Template{Name: name, Size: size, CreatedAt: time.Now().UTC().Truncate(time.Second), Source: source}
	// the rootfs must be on disk before the marker says it is complete
	if err := syncFS(tmp); err != nil {
		return api.Template{}, err
	}
	if err := writeMeta(filepath.Join(tmp, metaFile), t); err != nil {
		return api.Template{}, err
	}
	if err := s.install(name, tmp); err != nil {
		return api.Template{}, err
	}
	return t, nil
}

// install renames the complete template in tmp to name, moving an existing
// one aside first and deleting it last.
func (s *Store) install(name, tmp string) error {
	dst := filepath.Join(s.dir, name)
	var old string
	if _, err := os.Lstat(dst); err == nil {
		old = filepath.Join(s.dir, oldPrefix+name+"-"+randomSuffix())
		if err := os.Rename(dst, old); err != nil {
			return fmt.Errorf("move old template aside: %w", err)
		}
	}
	if err := os.Rename(tmp, dst); err != nil {
		if old != "" {
			if rerr := os.Rename(old, dst); rerr != nil {
				err = errors.Join(err, fmt.Errorf("restore old template: %w", rerr))
			}
		}
		return fmt.Errorf("install template: %w", err)
	}
	if err := syncDir(s.dir); err != nil {
		return err
	}
	if old != "" {
		if err := removeTree(old); err != nil {
			return fmt.Errorf("remove old template: %w", err)
		}
	}
	return nil
}

func writeMeta(path string, t api.Template) error {
	b, err := json.MarshalIndent(t, "", "  ")
	if err != nil {
		return err
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o644)
	if err != nil {
		return err
	}
	if _, err := f.Write(append(b, '\n')); err != nil {
		f.Close()
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return fmt.Errorf("sync %s: %w", path, err)
	}
	if err := f.Close(); err != nil {
		return err
	}
	return syncDir(filepath.Dir(path))
}

func syncDir(dir string) error {
	f, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer f.Close()
	if err := f.Sync(); err != nil {
		return fmt.Errorf("sync %s: %w", dir, err)
	}
	return nil
}

// syncFS flushes the whole filesystem holding dir: cheaper than an fsync
// per file of a rootfs with tens of thousands of them.
func syncFS(dir string) error {
	f, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer f.Close()
	if err := unix.Syncfs(int(f.Fd())); err != nil {
		return fmt.Errorf("syncfs %s: %w", dir, err)
	}
	return nil
}

func randomSuffix() string {
	b := make([]byte, 6)
	rand.Read(b)
	return hex.EncodeToString(b)
}

func orNop(progress func(string)) func(string) {
	if progress == nil {
		return func(string) {}
	}
	return progress
}
