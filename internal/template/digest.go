package template

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"hash"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// treeDigest returns "sha256:<hex>" over a walk of the tree at root in
// lexical order: for each entry its path, type, mode (setuid and the like
// included), owner, extended attributes, and its content (a file's bytes, a
// symlink's target, a device's number). A second name of a hard-linked file
// is recorded as a link to the first. Times are left out, so the same
// content built twice is the same version.
func treeDigest(root string) (string, error) {
	h := sha256.New()
	type inode struct{ dev, ino uint64 }
	first := map[inode]string{}
	buf := make([]byte, 1<<20)
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(root, p)
		if err != nil {
			return err
		}
		var st unix.Stat_t
		if err := unix.Lstat(p, &st); err != nil {
			return err
		}
		field(h, rel)
		num(h, uint64(st.Mode))
		num(h, uint64(st.Uid))
		num(h, uint64(st.Gid))
		if err := xattrs(h, p); err != nil {
			return fmt.Errorf("%s: %w", rel, err)
		}
		switch st.Mode & syscall.S_IFMT {
		case syscall.S_IFREG:
			if st.Nlink > 1 {
				k := inode{st.Dev, st.Ino}
				if f, ok := first[k]; ok {
					field(h, "link")
					field(h, f)
					return nil
				}
				first[k] = rel
			}
			field(h, "data")
			num(h, uint64(st.Size))
			f, err := os.Open(p)
			if err != nil {
				return err
			}
			n, err := io.CopyBuffer(h, f, buf)
			f.Close()
			if err != nil {
				return fmt.Errorf("%s: %w", rel, err)
			}
			if n != st.Size {
				return fmt.Errorf("%s: changed while it was read", rel)
			}
		case syscall.S_IFLNK:
			t, err := os.Readlink(p)
			if err != nil {
				return err
			}
			field(h, "target")
			field(h, t)
		case syscall.S_IFCHR, syscall.S_IFBLK:
			field(h, "rdev")
			num(h, st.Rdev)
		}
		return nil
	})
	if err != nil {
		return "", fmt.Errorf("digest %s: %w", root, err)
	}
	return "sha256:" + hex.EncodeToString(h.Sum(nil)), nil
}

// field writes s length-first, so that no two walks write the same bytes.
func field(h hash.Hash, s string) {
	num(h, uint64(len(s)))
	io.WriteString(h, s)
}

func num(h hash.Hash, n uint64) {
	var b [8]byte
	binary.BigEndian.PutUint64(b[:], n)
	h.Write(b[:])
}

// xattrs writes p's extended attributes, sorted by name.
func xattrs(h hash.Hash, p string) error {
	names, err := listXattrs(p)
	if err != nil {
		return err
	}
	num(h, uint64(len(names)))
	for _, n := range names {
		v, err := getXattr(p, n)
		if err != nil {
			return err
		}
		field(h, n)
		field(h, string(v))
	}
	return nil
}

func listXattrs(p string) ([]string, error) {
	sz, err := unix.Llistxattr(p, nil)
	if err != nil {
		if err == unix.ENOTSUP {
			return nil, nil
		}
		return nil, err
	}
	if sz == 0 {
		return nil, nil
	}
	buf := make([]byte, sz)
	sz, err = unix.Llistxattr(p, buf)
	if err != nil {
		return nil, err
	}
	var names []string
	for _, n := range strings.Split(string(buf[:sz]), "\x00") {
		if n != "" {
			names = append(names, n)
		}
	}
	sort.Strings(names)
	return names, nil
}

func getXattr(p, name string) ([]byte, error) {
	sz, err := unix.Lgetxattr(p, name, nil)
	if err != nil {
		return nil, err
	}
	buf := make([]byte, sz)
	sz, err = unix.Lgetxattr(p, name, buf)
	if err != nil {
		return nil, err
	}
	return buf[:sz], nil
}
