package template

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// skeletonDirs are the directories every rootfs has: the runtime mounts
// over them, and /.sbx is where the sbx agent is mounted.
var skeletonDirs = []struct {
	name string
	mode fs.FileMode
}{
	{"proc", 0o555},
	{"sys", 0o555},
	{"dev", 0o755},
	{"tmp", 0o777 | fs.ModeSticky},
	{"root", 0o700},
	{"etc", 0o755},
	{"run", 0o755},
	{".sbx", 0o755},
}

// mountPoints are the skeleton directories the runtime mounts over: they
// must be directories, whatever a template has there.
var mountPoints = map[string]bool{"proc": true, "sys": true, "dev": true, ".sbx": true}

// skeletonFiles are files a rootfs must have. tmp/.sbx-keep keeps /tmp
// non-empty: runsc mounts its own tmpfs over an empty /tmp, and then what a
// sandbox writes there would be in no disk snapshot or fork. (/etc's
// resolv.conf, hosts and hostname are no bind targets any more: the
// sandbox's init writes its own at boot, wherever the template's /etc
// leads.)
var skeletonFiles = []string{"tmp/.sbx-keep"}

// addSkeleton adds the skeleton directories and files a rootfs lacks. It
// works through an os.Root, so a rootfs whose /etc is a symlink out of it
// cannot make it write on the host.
func addSkeleton(rootfs string) error {
	root, err := os.OpenRoot(rootfs)
	if err != nil {
		return err
	}
	defer root.Close()
	for _, d := range skeletonDirs {
		fi, err := root.Lstat(d.name)
		switch {
		case err == nil && (fi.IsDir() || !mountPoints[d.name]):
			continue
		case err == nil:
			// something else where the runtime mounts (an image's /.sbx
			// file, a /proc symlink): the version gets a directory there
			if err := root.Remove(d.name); err != nil {
				return err
			}
		case !errors.Is(err, fs.ErrNotExist):
			return err
		}
		if err := root.Mkdir(d.name, 0o755); err != nil {
			return err
		}
		if err := root.Chmod(d.name, d.mode); err != nil {
			return err
		}
	}
	for _, f := range skeletonFiles {
		fi, err := root.Lstat(f)
		switch {
		case err == nil && fi.Mode()&fs.ModeSymlink == 0:
			continue
		case err == nil:
			// a bind-mount target must be a file in the rootfs, not a
			// link that may dangle (Ubuntu's resolv.conf points into /run)
			if err := root.Remove(f); err != nil {
				return err
			}
		case !errors.Is(err, fs.ErrNotExist):
			return err
		}
		if err := root.WriteFile(f, nil, 0o644); err != nil {
			return err
		}
	}
	return nil
}

// diskUsage returns the bytes the tree at dir occupies on disk, counting
// hard-linked files once (as long as the map of them stays small: past it,
// memory stays flat and a second name of a file is counted again). It reads
// directories a batch at a time, so a directory of millions of entries
// costs no more memory than a small one.
func diskUsage(dir string) (int64, error) {
	const maxSeenInodes = 1 << 17
	type inode struct{ dev, ino uint64 }
	seen := make(map[inode]bool)
	var total int64
	var walk func(p string, st *syscall.Stat_t) error
	walk = func(p string, st *syscall.Stat_t) error {
		if st.Nlink > 1 && st.Mode&syscall.S_IFMT != syscall.S_IFDIR {
			k := inode{uint64(st.Dev), st.Ino}
			if seen[k] {
				return nil
			}
			if len(seen) < maxSeenInodes {
				seen[k] = true
			}
		}
		total += st.Blocks * 512
		if st.Mode&syscall.S_IFMT != syscall.S_IFDIR {
			return nil
		}
		return eachEntry(p, func(e fs.DirEntry) error {
			fi, err := e.Info()
			if err != nil {
				return err
			}
			cst, ok := fi.Sys().(*syscall.Stat_t)
			if !ok {
				total += fi.Size()
				return nil
			}
			return walk(filepath.Join(p, e.Name()), cst)
		})
	}
	var st syscall.Stat_t
	if err := syscall.Lstat(dir, &st); err != nil {
		return 0, err
	}
	err := walk(dir, &st)
	return total, err
}

// eachEntry calls fn for each entry of the directory dir, read a batch at a
// time (in the directory's order, not sorted).
func eachEntry(dir string, fn func(fs.DirEntry) error) error {
	f, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer f.Close()
	for {
		es, err := f.ReadDir(256)
		for _, e := range es {
			if err := fn(e); err != nil {
				return err
			}
		}
		if errors.Is(err, io.EOF) || (err == nil && len(es) == 0) {
			return nil
		}
		if err != nil {
			return err
		}
	}
}

// removeTree deletes the tree at dir. A build tool that was killed may have
// left /proc, /sys or /dev mounted inside it; deleting through such a mount
// would delete the host's files, so they are unmounted first, and if that
// fails nothing is deleted.
func removeTree(dir string) error {
	mounts, err := mountsUnder(dir)
	if err != nil {
		return err
	}
	if len(mounts) > 0 {
		sort.Slice(mounts, func(i, j int) bool { return len(mounts[i]) > len(mounts[j]) })
		for _, m := range mounts {
			unix.Unmount(m, unix.MNT_DETACH) // checked below
		}
		if left, err := mountsUnder(dir); err != nil {
			return err
		} else if len(left) > 0 {
			return fmt.Errorf("remove %s: %s is still mounted", dir, left[0])
		}
	}
	return os.RemoveAll(dir)
}

// mountsUnder returns the mount points at or below dir.
func mountsUnder(dir string) ([]string, error) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return nil, err
	}
	defer f.Close()
	dir = filepath.Clean(dir)
	var out []string
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 5 {
			continue
		}
		mp := unescapeMountPath(fields[4])
		if mp == dir || strings.HasPrefix(mp, dir+"/") {
			out = append(out, mp)
		}
	}
	return out, sc.Err()
}

// unescapeMountPath undoes mountinfo's octal escapes (\040 for a space).
func unescapeMountPath(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+4 <= len(s) {
			if n, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(n))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}
