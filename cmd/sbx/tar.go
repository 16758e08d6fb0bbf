package main

import (
	"archive/tar"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strings"
	"syscall"
)

// tarDir returns a tar of the contents of dir, made while it is read: names
// are relative to dir, symlinks are kept as links.
func tarDir(dir string) io.ReadCloser {
	pr, pw := io.Pipe()
	go func() { pw.CloseWithError(writeTar(pw, dir)) }()
	return pr
}

// writeTar writes a tar of the contents of root to w.
func writeTar(w io.Writer, root string) error {
	tw := tar.NewWriter(w)
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if p == root {
			return nil
		}
		info, err := d.Info() // of the link itself
		if err != nil {
			return err
		}
		if info.Mode()&fs.ModeSocket != 0 {
			return nil // a tar cannot hold a socket
		}
		link := ""
		if info.Mode()&fs.ModeSymlink != 0 {
			if link, err = os.Readlink(p); err != nil {
				return err
			}
		}
		hdr, err := tar.FileInfoHeader(info, link)
		if err != nil {
			return fmt.Errorf("tar %s: %w", p, err)
		}
		rel, err := filepath.Rel(root, p)
		if err != nil {
			return err
		}
		hdr.Name = filepath.ToSlash(rel)
		if d.IsDir() {
			hdr.Name += "/"
		}
		if err := tw.WriteHeader(hdr); err != nil {
			return fmt.Errorf("tar %s: %w", p, err)
		}
		if !info.Mode().IsRegular() {
			return nil
		}
		f, err := os.Open(p)
		if err != nil {
			return err
		}
		defer f.Close()
		if _, err := io.Copy(tw, f); err != nil {
			return fmt.Errorf("tar %s: %w", p, err)
		}
		return nil
	})
	if err != nil {
		return err
	}
	return tw.Close()
}

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
// refuses entries that would land outside dest.
func extractTar(r io.Reader, dest string) error {
	tr := tar.NewReader(r)
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
			if err := os.Chmod(dest, perm|0o700); err != nil {
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
