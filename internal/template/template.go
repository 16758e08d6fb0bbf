// Package template builds, imports and keeps the versioned root filesystems
// sandboxes boot from.
//
// The store's layout:
//
//	names/NAME                    a symlink whose target is the version NAME points at ("sha256:<hex>")
//	versions/sha256-<hex>/        one version: rootfs/ (what gVisor boots, read-only) and template.json
//	layers/sha256-<hex>/          an image layer, unpacked, by its diff ID; versions hard-link its files
//	tmp/ID.lease, tmp/ID/         an operation in progress: its lease (a file it holds locked) and its work
//	.lock                         taken briefly by whatever reads or changes names, versions, layers and leases
//
// A version never changes once it is in versions/: new content is a new
// version, made in tmp/ and renamed into place, and a name is repointed by
// renaming a new symlink over the old one, so a crash leaves the old pointer
// or the new one. A version's files are removed only by Collect, when no name
// points at it, no operation holds it, and the caller says nothing uses it.
// Several processes may share one store (the tests' template cache): the
// lock and the leases are file locks, so they hold across processes.
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

	"golang.org/x/sys/unix"
	"sbx.dev/sbx/api"
)

const (
	metaFile  = "template.json"
	rootfsDir = "rootfs"

	namesDir    = "names"
	versionsDir = "versions"
	layersDir   = "layers"
	tmpDir      = "tmp"
	lockFile    = ".lock"
	leaseSuffix = ".lease"
)

// Store is a directory of versioned templates. Its methods are safe for
// concurrent use, also by several processes sharing the directory.
type Store struct {
	dir string // absolute, without symlinks

	mu    sync.Mutex
	locks map[string]chan struct{} // one per name: builds and imports of a name take turns

	limits ImportLimits // guarded by mu
}

// Open returns the store in dir, creating it if needed, migrates a store of
// the old layout (<dir>/<name>/rootfs and template.json) in place, and
// removes what interrupted operations left behind. The directory is made
// 0700: templates hold setuid binaries that a host user must not reach.
func Open(dir string) (*Store, error) {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return nil, fmt.Errorf("open templates %s: %w", dir, err)
	}
	if err := os.MkdirAll(abs, 0o700); err != nil {
		return nil, fmt.Errorf("open templates %s: %w", abs, err)
	}
	// a rootfs path is named in checkpoints, so it must not depend on a
	// symlink that may go (the tests' data dirs link to a shared cache)
	if abs, err = filepath.EvalSymlinks(abs); err != nil {
		return nil, fmt.Errorf("open templates %s: %w", dir, err)
	}
	if err := os.Chmod(abs, 0o700); err != nil {
		return nil, fmt.Errorf("open templates %s: %w", abs, err)
	}
	s := &Store{dir: abs, locks: make(map[string]chan struct{}), limits: DefaultImportLimits}
	// migrate also makes the directories of the layout
	if err := s.migrate(); err != nil {
		return nil, fmt.Errorf("open templates %s: migrate the old layout: %w", abs, err)
	}
	if _, err := s.sweep(nil); err != nil {
		return nil, fmt.Errorf("open templates %s: %w", abs, err)
	}
	return s, nil
}

// Dir returns the store's directory, absolute and without symlinks.
func (s *Store) Dir() string { return s.dir }

var nameRE = regexp.MustCompile(`^[a-z0-9][a-z0-9._-]{0,62}$`)

// ValidName returns an api.ErrInvalid error unless name is a valid template
// name: a lowercase letter or digit, then up to 62 of [a-z0-9._-].
func ValidName(name string) error {
	if !nameRE.MatchString(name) {
		return api.Errorf(api.ErrInvalid, "invalid template name %q: use a lowercase letter or digit, then up to 62 of a-z, 0-9, '.', '_' and '-'", name)
	}
	return nil
}

var digestRE = regexp.MustCompile(`^sha256:[0-9a-f]{64}$`)

// ValidVersion returns an api.ErrInvalid error unless v is a version:
// "sha256:" and 64 lowercase hex digits.
func ValidVersion(v string) error {
	if !digestRE.MatchString(v) {
		return api.Errorf(api.ErrInvalid, "invalid template version %q: want sha256: and 64 hex digits", v)
	}
	return nil
}

// digestDir turns "sha256:<hex>" into the directory name "sha256-<hex>":
// a colon in a rootfs path is asking for trouble with mount options.
func digestDir(d string) string { return strings.Replace(d, ":", "-", 1) }

// dirDigest undoes digestDir, or returns "" for a name that is not one.
func dirDigest(n string) string {
	d := strings.Replace(n, "-", ":", 1)
	if !digestRE.MatchString(d) {
		return ""
	}
	return d
}

func (s *Store) namePath(name string) string { return filepath.Join(s.dir, namesDir, name) }
func (s *Store) versionPath(v string) string {
	return filepath.Join(s.dir, versionsDir, digestDir(v))
}
func (s *Store) layerPath(d string) string { return filepath.Join(s.dir, layersDir, digestDir(d)) }

// meta is a version's template.json: the api.Template of the version (its
// Name is the name it was made as) and the layers its rootfs links to.
type meta struct {
	api.Template
	Layers []string `json:"layers,omitempty"`
}

// List returns the templates the names point at, sorted by name. A name
// whose version is missing (which only a hand-edited store has) is left out.
func (s *Store) List() ([]api.Template, error) {
	entries, err := os.ReadDir(filepath.Join(s.dir, namesDir))
	if err != nil {
		return nil, fmt.Errorf("list templates: %w", err)
	}
	out := []api.Template{}
	for _, e := range entries { // ReadDir sorts by name
		if ValidName(e.Name()) != nil {
			continue
		}
		t, err := s.Resolve(e.Name())
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

// Resolve returns the version name points at now, as an api.Template named
// name: api.ErrInvalid for a bad name, api.ErrNotFound if there is no such
// name.
func (s *Store) Resolve(name string) (api.Template, error) {
	if err := ValidName(name); err != nil {
		return api.Template{}, err
	}
	v, err := s.pointer(name)
	if err != nil {
		return api.Template{}, err
	}
	t, err := s.Version(v)
	if errors.Is(err, api.ErrNotFound) {
		return api.Template{}, api.Errorf(api.ErrNotFound, "template %s points at version %s, which is missing; build it again with force, or import it again", name, v)
	}
	if err != nil {
		return api.Template{}, err
	}
	t.Name = name
	return t, nil
}

// Get is Resolve.
func (s *Store) Get(name string) (api.Template, error) { return s.Resolve(name) }

// pointer returns the version the name points at; api.ErrNotFound if none.
func (s *Store) pointer(name string) (string, error) {
	v, err := os.Readlink(s.namePath(name))
	if errors.Is(err, fs.ErrNotExist) {
		return "", notFound(name)
	}
	if err != nil {
		return "", fmt.Errorf("template %s: %w", name, err)
	}
	if ValidVersion(v) != nil {
		return "", fmt.Errorf("template %s: its pointer holds %q, not a version", name, v)
	}
	return v, nil
}

// Version returns the template of version v, with no Name: api.ErrInvalid
// for a malformed version, api.ErrNotFound if the store does not have it.
func (s *Store) Version(v string) (api.Template, error) {
	m, err := s.readMeta(v)
	if err != nil {
		return api.Template{}, err
	}
	t := m.Template
	t.Name = ""
	return t, nil
}

func (s *Store) readMeta(v string) (meta, error) {
	if err := ValidVersion(v); err != nil {
		return meta{}, err
	}
	b, err := os.ReadFile(filepath.Join(s.versionPath(v), metaFile))
	if errors.Is(err, fs.ErrNotExist) {
		return meta{}, api.Errorf(api.ErrNotFound, "template version %s not found", v)
	}
	if err != nil {
		return meta{}, fmt.Errorf("template version %s: %w", v, err)
	}
	var m meta
	if err := json.Unmarshal(b, &m); err != nil {
		return meta{}, fmt.Errorf("template version %s: read %s: %w", v, metaFile, err)
	}
	m.Version = v // the directory's name is the truth
	return m, nil
}

// VersionRootfs returns the absolute path, with no symlink below the store's
// directory, of version v's rootfs. It is the same for the life of the
// version. Errors are Version's.
func (s *Store) VersionRootfs(v string) (string, error) {
	if _, err := s.Version(v); err != nil {
		return "", err
	}
	return filepath.Join(s.versionPath(v), rootfsDir), nil
}

// Rootfs returns the rootfs of the version name points at now; the errors
// are Resolve's.
func (s *Store) Rootfs(name string) (string, error) {
	t, err := s.Resolve(name)
	if err != nil {
		return "", err
	}
	return s.VersionRootfs(t.Version)
}

// Remove removes the name and returns the template it pointed at:
// api.ErrInvalid for a bad name, api.ErrNotFound if there is none. The
// version's files stay until Collect finds nothing uses them. It waits for a
// build or import of the same name to finish.
func (s *Store) Remove(name string) (api.Template, error) {
	if err := ValidName(name); err != nil {
		return api.Template{}, err
	}
	unlock, err := s.lock(context.Background(), name)
	if err != nil {
		return api.Template{}, err
	}
	defer unlock()
	var t api.Template
	err = s.critical(func() error {
		v, err := s.pointer(name)
		if err != nil {
			return err
		}
		if t, err = s.Version(v); err != nil && !errors.Is(err, api.ErrNotFound) {
			return err
		}
		t.Name, t.Version = name, v
		if err := os.Remove(s.namePath(name)); err != nil {
			return fmt.Errorf("remove template %s: %w", name, err)
		}
		return syncDir(filepath.Join(s.dir, namesDir))
	})
	if err != nil {
		return api.Template{}, err
	}
	return t, nil
}

func notFound(name string) error {
	return api.Errorf(api.ErrNotFound, "template %s not found; build it or import an image under that name", name)
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

// critical runs f holding the store's lock, in this process and across
// processes: the flock of .lock, taken on an open file of its own, which
// excludes another open of it in this process as in another (flock(2)
// locks belong to the open file). No mutex is held: a caller waits in
// flock, and a process that dies drops its lock with its files. f must be
// short, metadata only: no rootfs is built, copied or deleted under it.
func (s *Store) critical(f func() error) error {
	lf, err := os.OpenFile(filepath.Join(s.dir, lockFile), os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return fmt.Errorf("templates: open lock: %w", err)
	}
	defer lf.Close() // drops the flock
	if err := flock(lf, unix.LOCK_EX); err != nil {
		return fmt.Errorf("templates: lock: %w", err)
	}
	return f()
}

func flock(f *os.File, how int) error {
	for {
		err := unix.Flock(int(f.Fd()), how)
		if err != unix.EINTR {
			return err
		}
	}
}

// point makes name point at version v, atomically: a new symlink renamed
// over the old. The caller is in critical.
func (s *Store) point(name, v string) error {
	dir := filepath.Join(s.dir, namesDir)
	tmp := filepath.Join(dir, ".tmp-"+name+"-"+randomSuffix())
	if err := os.Symlink(v, tmp); err != nil {
		return fmt.Errorf("point %s at %s: %w", name, v, err)
	}
	if err := os.Rename(tmp, s.namePath(name)); err != nil {
		os.Remove(tmp)
		return fmt.Errorf("point %s at %s: %w", name, v, err)
	}
	return syncDir(dir)
}

// checkReplace says whether name may be pointed at version v: it may if it
// is free, already points at v, or force is set. The caller is in critical.
func (s *Store) checkReplace(name, v string, force bool, verb string) error {
	cur, err := s.pointer(name)
	if errors.Is(err, api.ErrNotFound) || err == nil && (cur == v || force) {
		return nil
	}
	if err != nil {
		return err
	}
	return api.Errorf(api.ErrConflict, "template %s exists (version %s); %s again with force to point it at the new version (sandboxes on the old one keep it), or remove the name first", name, short(cur), verb)
}

// short abbreviates a digest for messages.
func short(d string) string {
	if len(d) > 19 {
		return d[:19]
	}
	return d
}

// install finishes an operation that made version v in work (a directory
// holding rootfs/ and template.json): it renames work into versions/ unless
// v is there already, and points name at v. It reports whether v was there
// already.
func (s *Store) install(l *lease, name, work, v string, force bool, verb string) (reused bool, err error) {
	err = s.critical(func() error {
		if err := l.holdLocked(v); err != nil {
			return err
		}
		if err := s.checkReplace(name, v, force, verb); err != nil {
			return err
		}
		dst := s.versionPath(v)
		if _, err := os.Lstat(dst); err == nil {
			reused = true
		} else if err := os.Rename(work, dst); err != nil {
			return fmt.Errorf("install version %s: %w", v, err)
		} else if err := syncDir(filepath.Dir(dst)); err != nil {
			return err
		}
		return s.point(name, v)
	})
	return reused, err
}

func writeMeta(path string, m meta) error {
	b, err := json.MarshalIndent(m, "", "  ")
	if err != nil {
		return err
	}
	return writeFileSync(path, append(b, '\n'))
}

// writeFileSync writes path durably and atomically: a synced temporary file
// renamed over it.
func writeFileSync(path string, data []byte) error {
	tmp := path + ".tmp-" + randomSuffix()
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
	if err != nil {
		return err
	}
	if _, err := f.Write(data); err != nil {
		f.Close()
		os.Remove(tmp)
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := f.Sync(); err != nil {
		f.Close()
		os.Remove(tmp)
		return fmt.Errorf("sync %s: %w", path, err)
	}
	if err := f.Close(); err != nil {
		os.Remove(tmp)
		return err
	}
	if err := os.Rename(tmp, path); err != nil {
		os.Remove(tmp)
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
