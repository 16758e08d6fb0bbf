package template

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
)

// The old layout: <dir>/<name>/ holds rootfs/ and template.json, written
// last. Its scratch directories: .tmp-* (a build), .rm-* (a removal) and
// .old-<name>-* (a template being replaced, put back if <name> is missing).
// Migration renames each old template to .migrate-<name> first, out of the
// way of the new layout's directories (a template may be called "tmp"),
// then makes it a version and points the name at it. A crash at any step
// leaves a .migrate- directory the next Open carries on with.
const (
	oldTmpPrefix = ".tmp-"
	oldRmPrefix  = ".rm-"
	oldOldPrefix = ".old-"
	migrPrefix   = ".migrate-"
)

// migrate moves templates of the old layout into the new one.
func (s *Store) migrate() error {
	return s.critical(func() error {
		entries, err := os.ReadDir(s.dir)
		if err != nil {
			return err
		}
		for _, e := range entries {
			n := e.Name()
			p := filepath.Join(s.dir, n)
			switch {
			case strings.HasPrefix(n, oldTmpPrefix), strings.HasPrefix(n, oldRmPrefix):
				if err := removeTree(p); err != nil {
					return fmt.Errorf("remove leftover %s: %w", n, err)
				}
			case strings.HasPrefix(n, oldOldPrefix):
				rest := strings.TrimPrefix(n, oldOldPrefix)
				i := strings.LastIndex(rest, "-")
				if i > 0 && ValidName(rest[:i]) == nil && !s.oldExists(rest[:i]) {
					if err := os.Rename(p, filepath.Join(s.dir, migrPrefix+rest[:i])); err != nil {
						return fmt.Errorf("restore %s: %w", n, err)
					}
					continue
				}
				if err := removeTree(p); err != nil {
					return fmt.Errorf("remove leftover %s: %w", n, err)
				}
			case ValidName(n) == nil && e.IsDir():
				if _, err := os.Stat(filepath.Join(p, metaFile)); err != nil {
					continue // a directory of the new layout
				}
				if err := os.Rename(p, filepath.Join(s.dir, migrPrefix+n)); err != nil {
					return fmt.Errorf("move template %s aside: %w", n, err)
				}
			}
		}
		for _, d := range []string{namesDir, versionsDir, layersDir, tmpDir} {
			if err := os.MkdirAll(filepath.Join(s.dir, d), 0o700); err != nil {
				return err
			}
		}
		entries, err = os.ReadDir(s.dir)
		if err != nil {
			return err
		}
		for _, e := range entries {
			name, ok := strings.CutPrefix(e.Name(), migrPrefix)
			if !ok || ValidName(name) != nil {
				continue
			}
			if err := s.migrateOne(name, filepath.Join(s.dir, e.Name())); err != nil {
				return fmt.Errorf("template %s: %w", name, err)
			}
		}
		return nil
	})
}

// oldExists says whether a template of the old layout, or a name, is called name.
func (s *Store) oldExists(name string) bool {
	for _, p := range []string{filepath.Join(s.dir, name, metaFile), filepath.Join(s.dir, migrPrefix+name), s.namePath(name)} {
		if _, err := os.Lstat(p); err == nil {
			return true
		}
	}
	return false
}

// migrateOne makes the old template in dir a version and points name at it.
func (s *Store) migrateOne(name, dir string) error {
	b, err := os.ReadFile(filepath.Join(dir, metaFile))
	if errors.Is(err, fs.ErrNotExist) {
		return removeTree(dir) // never complete
	}
	if err != nil {
		return err
	}
	var m meta
	if err := json.Unmarshal(b, &m); err != nil {
		return fmt.Errorf("read %s: %w", metaFile, err)
	}
	rootfs := filepath.Join(dir, rootfsDir)
	// what the old sbx did to every template it opened
	if err := addSkeleton(rootfs); err != nil {
		return fmt.Errorf("add mount points: %w", err)
	}
	v, err := treeDigest(rootfs)
	if err != nil {
		return err
	}
	m.Name, m.Version = name, v
	if err := writeMeta(filepath.Join(dir, metaFile), m); err != nil {
		return err
	}
	if _, err := os.Lstat(s.namePath(name)); errors.Is(err, fs.ErrNotExist) {
		if err := s.point(name, v); err != nil {
			return err
		}
	}
	if _, err := os.Lstat(s.versionPath(v)); err == nil {
		return removeTree(dir) // the same content under another name
	}
	if err := os.Rename(dir, s.versionPath(v)); err != nil {
		return err
	}
	return syncDir(filepath.Join(s.dir, versionsDir))
}
