package template

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// The OCI layer format's markers: ".wh.NAME" deletes NAME from the layers
// below, and ".wh..wh..opq" in a directory hides everything the layers below
// have in it.
const (
	whiteoutPrefix = ".wh."
	opaqueMarker   = ".wh..wh..opq"
)

// compose makes the new directory rootfs from the unpacked layers, lowest
// first, as overlayfs stacks them (what Docker's overlay2 shows a
// container): a directory merges with the directory below it, anything else
// replaces what is below, and whiteouts delete. Files are hard links to the
// layers' files, so versions share them; a directory is made anew with its
// layer's owner, mode, attributes and time. It never follows a symlink: each
// directory it writes in is one it has just checked or made.
//
// The files it links count against bound (the image limit), and the
// free space it leaves against its reserve; a directory's metadata is set
// when its layer's walk of it ends (a later layer that has it sets it
// again), so that nothing is kept per directory.
func compose(ctx context.Context, rootfs string, layers []string, bound *budget) error {
	if err := os.Mkdir(rootfs, 0o755); err != nil {
		return err
	}
	root, err := os.OpenRoot(rootfs)
	if err != nil {
		return err
	}
	defer root.Close()
	c := &composer{ctx: ctx, root: root, dir: rootfs, bound: bound}
	for _, l := range layers {
		c.layer = l
		if err := c.walk("."); err != nil {
			if errors.Is(err, errTooBig) {
				return err
			}
			return fmt.Errorf("layer %s: %w", filepath.Base(l), err)
		}
	}
	return nil
}

type composer struct {
	ctx   context.Context
	root  *os.Root
	dir   string
	layer string
	bound *budget // what the image's files add up to
}

// walk merges the layer's directory rel into the rootfs's directory rel,
// which is a real directory.
func (c *composer) walk(rel string) error {
	if err := c.ctx.Err(); err != nil {
		return err
	}
	ldir := filepath.Join(c.layer, rel)
	// first what this layer hides of the ones below, then what it adds;
	// the layer's directory is read a batch at a time, each pass
	if _, err := os.Lstat(filepath.Join(ldir, opaqueMarker)); err == nil {
		if err := c.removeChildren(rel); err != nil {
			return err
		}
	} else if !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	err := eachEntry(ldir, func(e fs.DirEntry) error {
		target, ok := strings.CutPrefix(e.Name(), whiteoutPrefix)
		if !ok || e.Name() == opaqueMarker {
			return nil
		}
		// an empty name would be the directory itself; ".wh..wh.*" are AUFS's own files
		if target == "" || strings.HasPrefix(target, whiteoutPrefix) || target == "." || target == ".." {
			return nil
		}
		return c.remove(filepath.Join(rel, target))
	})
	if err != nil {
		return err
	}
	return eachEntry(ldir, func(e fs.DirEntry) error {
		if strings.HasPrefix(e.Name(), whiteoutPrefix) {
			return nil
		}
		p := filepath.Join(rel, e.Name())
		lp := filepath.Join(c.layer, p)
		if e.IsDir() { // a real directory: DirEntry does not follow symlinks
			fi, err := c.root.Lstat(p)
			switch {
			case err == nil && fi.IsDir():
			case err == nil || errors.Is(err, fs.ErrNotExist):
				if err == nil {
					if err := c.remove(p); err != nil {
						return err
					}
				}
				if err := c.root.Mkdir(p, 0o700); err != nil {
					return fmt.Errorf("%s: %w", p, err)
				}
			default:
				return fmt.Errorf("%s: %w", p, err)
			}
			if err := c.walk(p); err != nil {
				return err
			}
			// nothing more of this layer goes into it: it takes the
			// layer's metadata now
			lfi, err := os.Lstat(lp)
			if err != nil {
				return err
			}
			if err := copyMeta(lp, filepath.Join(c.dir, p), lfi); err != nil {
				return fmt.Errorf("%s: %w", p, err)
			}
			return nil
		}
		if err := c.remove(p); err != nil {
			return err
		}
		if e.Type().IsRegular() {
			fi, err := e.Info()
			if err != nil {
				return fmt.Errorf("%s: %w", p, err)
			}
			if err := c.bound.add(fi.Size()); err != nil {
				return err
			}
		}
		if err := linkOrCopy(lp, filepath.Join(c.dir, p)); err != nil {
			return fmt.Errorf("%s: %w", p, err)
		}
		return nil
	})
}

// removeChildren deletes everything in the rootfs's directory rel (an
// opaque directory above it), a batch of names at a time.
func (c *composer) removeChildren(rel string) error {
	fi, err := c.root.Lstat(rel)
	if err != nil || !fi.IsDir() {
		return nil
	}
	for {
		f, err := c.root.Open(rel)
		if err != nil {
			return err
		}
		names, err := f.Readdirnames(256)
		f.Close()
		if len(names) == 0 {
			if err == nil || errors.Is(err, io.EOF) {
				return nil
			}
			return err
		}
		for _, n := range names {
			if err := c.remove(filepath.Join(rel, n)); err != nil {
				return err
			}
		}
	}
}

// remove deletes what is at rel in the rootfs, if anything.
func (c *composer) remove(rel string) error {
	fi, err := c.root.Lstat(rel)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	if fi.IsDir() {
		err = c.root.RemoveAll(rel)
	} else {
		err = c.root.Remove(rel)
	}
	if err != nil {
		return fmt.Errorf("%s: %w", rel, err)
	}
	return nil
}

// linkOrCopy makes dst the same file as src, a hard link (a file can have
// only so many, and a copy is what is left then).
func linkOrCopy(src, dst string) error {
	err := os.Link(src, dst)
	if err == nil || !(errors.Is(err, syscall.EMLINK) || errors.Is(err, syscall.EXDEV)) {
		return err
	}
	return copyEntry(src, dst)
}

// copyEntry copies the non-directory src to dst with its owner, mode,
// attributes and time.
func copyEntry(src, dst string) error {
	fi, err := os.Lstat(src)
	if err != nil {
		return err
	}
	switch m := fi.Mode(); {
	case m&fs.ModeSymlink != 0:
		t, err := os.Readlink(src)
		if err != nil {
			return err
		}
		if err := os.Symlink(t, dst); err != nil {
			return err
		}
	case m.IsRegular():
		in, err := os.Open(src)
		if err != nil {
			return err
		}
		defer in.Close()
		out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
		if err != nil {
			return err
		}
		if _, err := io.Copy(out, in); err != nil {
			out.Close()
			return err
		}
		if err := out.Close(); err != nil {
			return err
		}
	case m&fs.ModeNamedPipe != 0:
		if err := unix.Mkfifo(dst, 0o600); err != nil {
			return err
		}
	default:
		return nil // nothing else is in a layer
	}
	return copyMeta(src, dst, fi)
}

// copyMeta gives dst src's owner, attributes, mode and modification time,
// without following a symlink.
func copyMeta(src, dst string, fi fs.FileInfo) error {
	st := fi.Sys().(*syscall.Stat_t)
	if err := os.Lchown(dst, int(st.Uid), int(st.Gid)); err != nil {
		return err
	}
	names, err := listXattrs(src)
	if err != nil {
		return err
	}
	for _, n := range names {
		v, err := getXattr(src, n)
		if err != nil {
			return err
		}
		if err := unix.Lsetxattr(dst, n, v, 0); err != nil {
			return fmt.Errorf("set attribute %s: %w", n, err)
		}
	}
	if fi.Mode()&fs.ModeSymlink == 0 {
		// after chown, which clears setuid bits
		if err := unix.Chmod(dst, st.Mode&0o7777); err != nil {
			return err
		}
	}
	return lutimes(dst, fi.ModTime())
}

func lutimes(full string, mtime time.Time) error {
	ts := []unix.Timespec{unix.NsecToTimespec(mtime.UnixNano()), unix.NsecToTimespec(mtime.UnixNano())}
	return unix.UtimesNanoAt(unix.AT_FDCWD, full, ts, unix.AT_SYMLINK_NOFOLLOW)
}
