package client

import (
	"archive/tar"
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"

	"sbx.dev/sbx/internal/atomicfile"
)

// The extraction of what comes out of a sandbox. A sandbox may be hostile:
// nothing it sends is written outside the target, through a symlink, over
// a directory, or with more than permission bits (no setuid, no owner); a
// folder that is there already keeps its mode; new ones get the umask.

// tarRel returns where a tar entry goes below the extraction root: its name
// without the first component (the base name the server names entries from).
// "" is the root itself. Absolute names and ".." are refused.
func tarRel(name string) (string, error) {
	if strings.HasPrefix(name, "/") {
		return "", fmt.Errorf("tar entry %q is absolute", name)
	}
	for _, part := range strings.Split(name, "/") {
		if part == ".." {
			return "", fmt.Errorf("tar entry %q leaves the target directory", name)
		}
	}
	clean := path.Clean(name)
	if clean == "." {
		return "", nil
	}
	_, rest, _ := strings.Cut(clean, "/")
	return rest, nil
}

// checkParents refuses to write rel below dest through a symlink or a file.
func checkParents(dest, rel string) error {
	dir := path.Dir(rel)
	if dir == "." {
		return nil
	}
	p := dest
	for _, part := range strings.Split(dir, "/") {
		p = filepath.Join(p, part)
		fi, err := os.Lstat(p)
		if errors.Is(err, fs.ErrNotExist) {
			return nil // nothing below a missing directory exists yet
		}
		if err != nil {
			return err
		}
		if fi.Mode()&fs.ModeSymlink != 0 {
			return fmt.Errorf("refusing to extract %s through the symlink %s", rel, p)
		}
		if !fi.IsDir() {
			return fmt.Errorf("cannot extract %s: %s is not a directory", rel, p)
		}
	}
	return nil
}

// extractTar extracts the tar r into the directory dest, dropping the first
// component of every name. It never follows a symlink while writing and
// refuses entries that would land outside dest. The tar's root entry sets
// dest's mode only when fresh (dest was made for this extraction), and
// then within the umask: an existing folder keeps its mode.
func extractTar(r io.Reader, dest string, fresh bool) error {
	tr := tar.NewReader(r)
	umask := processUmask()
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return fmt.Errorf("read tar: %w", err)
		}
		rel, err := tarRel(hdr.Name)
		if err != nil {
			return err
		}
		perm := fs.FileMode(hdr.Mode).Perm()
		if rel == "" {
			if hdr.Typeflag != tar.TypeDir {
				return fmt.Errorf("tar root %q is not a directory", hdr.Name)
			}
			if !fresh {
				continue // a folder that was there keeps its mode
			}
			if err := os.Chmod(dest, (perm|0o700)&^umask); err != nil {
				return err
			}
			continue
		}
		if err := checkParents(dest, rel); err != nil {
			return err
		}
		target := filepath.Join(dest, filepath.FromSlash(rel))
		if err := os.MkdirAll(filepath.Dir(target), 0o755); err != nil {
			return err
		}
		switch hdr.Typeflag {
		case tar.TypeDir:
			if fi, err := os.Lstat(target); err == nil && fi.IsDir() {
				continue
			}
			if err := replace(target); err != nil {
				return err
			}
			if err := os.Mkdir(target, perm|0o700); err != nil {
				return err
			}
		case tar.TypeReg:
			if err := replace(target); err != nil {
				return err
			}
			f, err := os.OpenFile(target, os.O_WRONLY|os.O_CREATE|os.O_EXCL|syscall.O_NOFOLLOW, perm)
			if err != nil {
				return err
			}
			_, err = io.Copy(f, tr)
			if cerr := f.Close(); err == nil {
				err = cerr
			}
			if err != nil {
				return fmt.Errorf("extract %s: %w", rel, err)
			}
		case tar.TypeSymlink:
			if err := replace(target); err != nil {
				return err
			}
			if err := os.Symlink(hdr.Linkname, target); err != nil {
				return err
			}
		case tar.TypeLink:
			lrel, err := tarRel(hdr.Linkname)
			if err != nil || lrel == "" {
				return fmt.Errorf("tar entry %q links outside the target directory", hdr.Name)
			}
			if err := checkParents(dest, lrel); err != nil {
				return err
			}
			if err := replace(target); err != nil {
				return err
			}
			if err := os.Link(filepath.Join(dest, filepath.FromSlash(lrel)), target); err != nil {
				return err
			}
		default:
			// devices and fifos are not copied out of a sandbox
		}
	}
}

// replace removes what is at p unless it is a directory, as cp does before it writes.
func replace(p string) error {
	fi, err := os.Lstat(p)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	if fi.IsDir() {
		return fmt.Errorf("cannot overwrite directory %s", p)
	}
	return os.Remove(p)
}

// extractInto extracts a tar whose entries start with one base name into
// the directory target: into it when it exists, else into a temporary
// directory renamed to target once the tar is whole.
func extractInto(r io.Reader, target string) error {
	if fi, err := os.Lstat(target); err == nil {
		if !fi.IsDir() {
			return fmt.Errorf("cannot copy a directory onto %s, which is not a directory", target)
		}
		return extractTar(r, target, false)
	}
	tmp, err := os.MkdirTemp(filepath.Dir(target), "."+filepath.Base(target)+".sbx-*")
	if err != nil {
		return err
	}
	if err := extractTar(r, tmp, true); err != nil {
		os.RemoveAll(tmp)
		return fmt.Errorf("copy to %s: %w", target, err)
	}
	if err := os.Rename(tmp, target); err != nil {
		os.RemoveAll(tmp)
		return err
	}
	return nil
}

// writeFileAtomic writes r to a temporary file next to target and renames
// it into place once all of r is read: a failed read leaves no file
// behind. The file gets perm within the umask.
func writeFileAtomic(target string, r io.Reader, perm fs.FileMode) (int64, error) {
	n, err := atomicfile.Write(target, r, perm.Perm()&^processUmask())
	if err != nil {
		return 0, fmt.Errorf("copy to %s: %w", target, err)
	}
	return n, nil
}

// parseMode reads a FileInfo mode, octal ("0644", "100755") or as ls shows it
// ("-rwxr-xr-x"), and returns its permission bits.
func parseMode(s string) (fs.FileMode, bool) {
	if n, err := strconv.ParseUint(s, 8, 32); err == nil {
		return fs.FileMode(n).Perm(), true
	}
	if len(s) < 9 {
		return 0, false
	}
	rwx := s[len(s)-9:]
	var m fs.FileMode
	for i, ch := range rwx {
		want := "rwxrwxrwx"[i]
		switch {
		case byte(ch) == want, want == 'x' && (ch == 's' || ch == 't'):
			m |= 1 << (8 - i)
		case ch == '-', want == 'x' && (ch == 'S' || ch == 'T'):
		default:
			return 0, false
		}
	}
	return m, true
}

// processUmask is the process's umask, read from /proc (setting it to
// read it would race with other goroutines making files); 022 if unknown.
func processUmask() fs.FileMode {
	f, err := os.Open("/proc/self/status")
	if err != nil {
		return 0o022
	}
	defer f.Close()
	sc := bufio.NewScanner(io.LimitReader(f, 64<<10))
	for sc.Scan() {
		if v, ok := bytes.CutPrefix(sc.Bytes(), []byte("Umask:")); ok {
			if n, err := strconv.ParseUint(strings.TrimSpace(string(v)), 8, 32); err == nil {
				return fs.FileMode(n) & 0o777
			}
		}
	}
	return 0o022
}
