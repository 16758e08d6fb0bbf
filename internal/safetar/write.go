package safetar

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

	"golang.org/x/sys/unix"
)

// WriteOptions says how Write names and describes what it stores.
type WriteOptions struct {
	// Base is the name root is stored under, what is below it as
	// Base/...; "" stores only what is below root, named relative to it.
	Base string
	// Xattrs records each entry's extended attributes, as GNU tar does
	// (SCHILY.xattr.*).
	Xattrs bool
	// ExactTimes stores modification times to the nanosecond, and access
	// and change times, in PAX records (a block more per entry); without
	// it, modification times to the second.
	ExactTimes bool
}

// Write writes a tar of root (a directory, recursively, or a file) to
// w. root itself is resolved if it is a symlink; symlinks below it are
// stored as symlinks, files linked more than once as one file and hard
// links to it. Modes and owner ids are kept, owner names are not (they
// mean nothing on the other side); sockets are left out, and so is what
// goes away while it is read. A file is stored as long as it was when its
// entry was written; one that shrank is an error. Errors from the file
// system are *fs.PathError, wrapped.
func Write(w io.Writer, root string, o WriteOptions) error {
	real, err := filepath.EvalSymlinks(root)
	if err != nil {
		return err
	}
	tw := tar.NewWriter(w)
	type inode struct{ dev, ino uint64 }
	links := map[inode]string{} // first name of each multiply linked file
	err = filepath.WalkDir(real, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			if p != real && errors.Is(err, fs.ErrNotExist) {
				return nil // removed while walking
			}
			return err
		}
		if p == real && o.Base == "" {
			return nil
		}
		fi, err := d.Info() // of the link itself
		if errors.Is(err, fs.ErrNotExist) {
			return nil
		}
		if err != nil {
			return err
		}
		if fi.Mode().Type() == fs.ModeSocket {
			return nil // a socket cannot be stored, nor would it work
		}
		rel, err := filepath.Rel(real, p)
		if err != nil {
			return err
		}
		name := path.Join(o.Base, filepath.ToSlash(rel))
		var link string
		if fi.Mode()&fs.ModeSymlink != 0 {
			if link, err = os.Readlink(p); err != nil {
				return err
			}
		}
		hdr, err := tar.FileInfoHeader(fi, link)
		if err != nil {
			return fmt.Errorf("%s: %w", p, err)
		}
		hdr.Name = name
		if fi.IsDir() {
			hdr.Name += "/"
		}
		if o.ExactTimes {
			hdr.Format = tar.FormatPAX
		}
		hdr.Uname, hdr.Gname = "", ""
		if st, ok := fi.Sys().(*syscall.Stat_t); ok && fi.Mode().IsRegular() && st.Nlink > 1 {
			key := inode{uint64(st.Dev), st.Ino}
			if first, ok := links[key]; ok {
				hdr.Typeflag, hdr.Linkname, hdr.Size = tar.TypeLink, first, 0
			} else {
				links[key] = hdr.Name
			}
		}
		if o.Xattrs {
			addXattrs(hdr, p)
		}
		if err := tw.WriteHeader(hdr); err != nil {
			return fmt.Errorf("write tar: %w", err)
		}
		if hdr.Typeflag != tar.TypeReg {
			return nil
		}
		f, err := os.Open(p)
		if err != nil {
			return err
		}
		defer f.Close()
		n, err := io.CopyN(tw, f, hdr.Size)
		if errors.Is(err, io.EOF) {
			return fmt.Errorf("%s shrank from %d to %d bytes while being read", p, hdr.Size, n)
		}
		if err != nil {
			return fmt.Errorf("read %s: %w", p, err)
		}
		return nil
	})
	if err != nil {
		return err
	}
	if err := tw.Close(); err != nil {
		return fmt.Errorf("write tar: %w", err)
	}
	return nil
}

// addXattrs records p's extended attributes in hdr, as GNU tar does.
func addXattrs(hdr *tar.Header, p string) {
	buf := make([]byte, 64<<10)
	n, err := unix.Llistxattr(p, buf)
	if err != nil || n == 0 {
		return
	}
	for _, name := range strings.Split(string(buf[:n]), "\x00") {
		if name == "" {
			continue
		}
		v := make([]byte, 64<<10)
		m, err := unix.Lgetxattr(p, name, v)
		if err != nil {
			continue
		}
		if hdr.PAXRecords == nil {
			hdr.PAXRecords = map[string]string{}
		}
		hdr.PAXRecords["SCHILY.xattr."+name] = string(v[:m])
	}
	if hdr.PAXRecords != nil {
		hdr.Format = tar.FormatPAX
	}
}
