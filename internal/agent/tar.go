package agent

import (
	"archive/tar"
	"errors"
	"flag"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// writeTar writes a PAX tar of root (a file or a directory, recursively) to w,
// with entry names starting at the base name of root. Symlinks below root
// are stored as symlinks; root itself is resolved, as `get` resolves it.
func writeTar(root string, w io.Writer) error {
	real, err := filepath.EvalSymlinks(root)
	if err != nil {
		return pathError(root, err)
	}
	base := filepath.Base(root)
	if base == "/" {
		base = "."
	}
	tw := tar.NewWriter(w)
	type inode struct{ dev, ino uint64 }
	links := map[inode]string{} // first name of each multiply linked file
	err = filepath.WalkDir(real, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			if p != real && errors.Is(err, fs.ErrNotExist) {
				return nil // removed while walking
			}
			return pathError(p, err)
		}
		fi, err := d.Info()
		if errors.Is(err, fs.ErrNotExist) {
			return nil
		}
		if err != nil {
			return pathError(p, err)
		}
		rel, _ := filepath.Rel(real, p)
		name := path.Join(base, filepath.ToSlash(rel))
		if fi.Mode().Type() == fs.ModeSocket {
			return nil // a socket cannot be stored, nor would it work
		}
		var link string
		if fi.Mode()&fs.ModeSymlink != 0 {
			if link, err = os.Readlink(p); err != nil {
				return pathError(p, err)
			}
		}
		hdr, err := tar.FileInfoHeader(fi, link)
		if err != nil {
			return failf(ExitError, "%s: %s", p, err)
		}
		hdr.Name = name
		if fi.IsDir() {
			hdr.Name += "/"
		}
		hdr.Format = tar.FormatPAX
		// names are no use across the sandbox boundary, ids are
		hdr.Uname, hdr.Gname = "", ""
		if st, ok := fi.Sys().(*syscall.Stat_t); ok && fi.Mode().IsRegular() && st.Nlink > 1 {
			key := inode{uint64(st.Dev), st.Ino}
			if first, ok := links[key]; ok {
				hdr.Typeflag = tar.TypeLink
				hdr.Linkname = first
				hdr.Size = 0
			} else {
				links[key] = name
			}
		}
		if err := tw.WriteHeader(hdr); err != nil {
			return failf(ExitError, "write tar: %s", errText(err))
		}
		if hdr.Typeflag != tar.TypeReg {
			return nil
		}
		f, err := os.Open(p)
		if err != nil {
			return pathError(p, err)
		}
		defer f.Close()
		n, err := io.CopyN(tw, f, hdr.Size)
		if errors.Is(err, io.EOF) {
			return failf(ExitError, "%s shrank from %d to %d bytes while being read", p, hdr.Size, n)
		}
		if err != nil {
			return failf(ExitError, "read %s: %s", p, errText(err))
		}
		return nil
	})
	if err != nil {
		return err
	}
	if err := tw.Close(); err != nil {
		return failf(ExitError, "write tar: %s", errText(err))
	}
	return nil
}

// runUntar extracts a tar from stdin under a directory. A new directory
// appears whole or not at all; into an existing one, entries are extracted
// one by one, each file through a temporary file renamed into place.
func runUntar(args []string, stdin io.Reader) error {
	fset := flag.NewFlagSet("untar", flag.ContinueOnError)
	user := userFlag(fset)
	pos, err := parseFlags(fset, args, 1, "untar [--user U] PATH")
	if err != nil {
		return err
	}
	dest, err := resolvePath(pos[0], *user)
	if err != nil {
		return err
	}
	// what a request for a user extracts is that user's: an upload of a
	// project is theirs to change, whoever owned it where it came from
	if *user != "" {
		if u, err := lookupUser(*user); err == nil && u.uid != 0 {
			extractOwner = &u
			defer func() { extractOwner = nil }()
		}
	}
	fi, err := os.Stat(dest)
	switch {
	case err == nil && !fi.IsDir():
		return invalidf("%s is not a directory", dest)
	case err == nil:
		real, err := filepath.EvalSymlinks(dest)
		if err != nil {
			return pathError(dest, err)
		}
		return extract(stdin, real)
	case !errors.Is(err, fs.ErrNotExist):
		return pathError(dest, err)
	}
	if dest == "/" {
		return invalidf("/ cannot be created")
	}
	if err := requireDir(filepath.Dir(dest)); err != nil {
		return err
	}
	tmp := tempName(dest)
	if err := os.Mkdir(tmp, 0o755); err != nil {
		return pathError(filepath.Dir(dest), err)
	}
	if extractOwner != nil {
		_ = os.Lchown(tmp, extractOwner.uid, extractOwner.gid)
	}
	if err := extract(stdin, tmp); err != nil {
		os.RemoveAll(tmp)
		return err
	}
	// rename would put a directory over an empty one; refuse as for any other
	if _, err := os.Lstat(dest); err == nil {
		os.RemoveAll(tmp)
		return failf(ExitExists, "%s was created while extracting", dest)
	}
	if err := os.Rename(tmp, dest); err != nil {
		os.RemoveAll(tmp)
		return pathError(dest, err)
	}
	syncDir(filepath.Dir(dest))
	return nil
}

// dirMeta is what is applied to a directory once everything in it is written.
type dirMeta struct {
	path string
	hdr  *tar.Header
}

// countingReader counts the bytes read through it.
type countingReader struct {
	r io.Reader
	n int64
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += int64(n)
	return n, err
}

// extract writes the entries of the tar read from r under the existing
// directory root. It fails on an archive without its end marker (two zero
// blocks), which is what a sender that went away between entries leaves.
func extract(r io.Reader, root string) error {
	cr := &countingReader{r: r}
	tr := tar.NewReader(cr)
	var dirs []dirMeta
	var end int64 // where the last entry's data ends; -1 if unknown
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			if end >= 0 && cr.n-end < 2*512 {
				return failf(ExitError, "read tar: the archive ended without its end marker; was the upload cut short?")
			}
			break
		}
		if err != nil {
			return failf(ExitError, "read tar: %s", errText(err))
		}
		switch {
		case end < 0 || isSparse(hdr):
			end = -1 // its stored size is not Size: the check is off
		case hasData(hdr.Typeflag):
			end = cr.n + (hdr.Size+511)&^511
		default:
			end = cr.n
		}
		if hdr.Typeflag == tar.TypeXGlobalHeader {
			continue
		}
		rel, err := entryName(hdr.Name)
		if err != nil {
			return err
		}
		if rel == "." {
			// the destination itself: it keeps its own owner and mode
			continue
		}
		target := filepath.Join(root, filepath.FromSlash(rel))
		if err := makeParents(root, rel, hdr.Name); err != nil {
			return err
		}
		switch hdr.Typeflag {
		case tar.TypeDir:
			err = extractDir(target, hdr)
			dirs = append(dirs, dirMeta{target, hdr})
		case tar.TypeReg, tar.TypeGNUSparse:
			err = extractFile(target, hdr, tr)
		case tar.TypeSymlink:
			err = replaceWith(target, hdr, func(tmp string) error { return os.Symlink(hdr.Linkname, tmp) })
		case tar.TypeLink:
			var old string
			if old, err = linkTarget(root, hdr); err == nil {
				err = replaceWith(target, hdr, func(tmp string) error { return os.Link(old, tmp) })
			}
		case tar.TypeChar, tar.TypeBlock, tar.TypeFifo:
			err = replaceWith(target, hdr, func(tmp string) error {
				mode := uint32(hdr.Mode & 0o7777)
				switch hdr.Typeflag {
				case tar.TypeChar:
					mode |= syscall.S_IFCHR
				case tar.TypeBlock:
					mode |= syscall.S_IFBLK
				default:
					mode |= syscall.S_IFIFO
				}
				return unix.Mknod(tmp, mode, int(unix.Mkdev(uint32(hdr.Devmajor), uint32(hdr.Devminor))))
			})
		default:
			return invalidf("tar entry %s: unsupported type %q", hdr.Name, hdr.Typeflag)
		}
		if err != nil {
			var ee *exitError
			if errors.As(err, &ee) {
				return err
			}
			return failf(ExitError, "tar entry %s: %s", hdr.Name, errText(err))
		}
	}
	// deepest first, so setting a parent's mtime comes after its children
	slices.Reverse(dirs)
	for _, d := range dirs {
		if err := setMeta(d.path, d.hdr); err != nil {
			return failf(ExitError, "tar entry %s: %s", d.hdr.Name, errText(err))
		}
	}
	return nil
}

// hasData says whether entries of type typ are followed by Size bytes of
// data, as archive/tar reads them.
func hasData(typ byte) bool {
	switch typ {
	case tar.TypeLink, tar.TypeSymlink, tar.TypeChar, tar.TypeBlock, tar.TypeDir, tar.TypeFifo:
		return false
	}
	return true
}

// isSparse says whether hdr is a GNU sparse file, stored in fewer bytes
// than its Size.
func isSparse(hdr *tar.Header) bool {
	if hdr.Typeflag == tar.TypeGNUSparse {
		return true
	}
	for k := range hdr.PAXRecords {
		if strings.HasPrefix(k, "GNU.sparse.") {
			return true
		}
	}
	return false
}

// entryName checks a tar entry name and returns it cleaned, relative, with
// slashes. It rejects absolute names and any ".." component.
func entryName(name string) (string, error) {
	if name == "" {
		return "", invalidf("tar entry with an empty name")
	}
	if strings.HasPrefix(name, "/") {
		return "", invalidf("tar entry %s: absolute names are not allowed", name)
	}
	if strings.IndexByte(name, 0) >= 0 {
		return "", invalidf("tar entry %q: name contains a NUL byte", name)
	}
	if slices.Contains(strings.Split(name, "/"), "..") {
		return "", invalidf("tar entry %s: \"..\" is not allowed in names", name)
	}
	return path.Clean(name), nil
}

// makeParents creates the missing parent directories of rel under root and
// refuses a parent that is not a real directory: following a symlink there
// could write outside root.
func makeParents(root, rel, name string) error {
	dir := root
	parts := strings.Split(rel, "/")
	for _, part := range parts[:len(parts)-1] {
		dir = filepath.Join(dir, part)
		fi, err := os.Lstat(dir)
		if errors.Is(err, fs.ErrNotExist) {
			if err := os.Mkdir(dir, 0o755); err != nil {
				return failf(ExitError, "tar entry %s: %s", name, errText(err))
			}
			continue
		}
		if err != nil {
			return failf(ExitError, "tar entry %s: %s", name, errText(err))
		}
		if fi.Mode()&fs.ModeSymlink != 0 {
			return invalidf("tar entry %s: its parent %s is a symbolic link", name, strings.TrimPrefix(dir, root+"/"))
		}
		if !fi.IsDir() {
			return invalidf("tar entry %s: its parent %s is not a directory", name, strings.TrimPrefix(dir, root+"/"))
		}
	}
	return nil
}

// linkTarget is the path of the earlier entry a hard link entry points to.
func linkTarget(root string, hdr *tar.Header) (string, error) {
	rel, err := entryName(hdr.Linkname)
	if err != nil || rel == "." {
		return "", invalidf("tar entry %s: bad hard link target %q", hdr.Name, hdr.Linkname)
	}
	if err := makeParents(root, rel, hdr.Name); err != nil {
		return "", err
	}
	return filepath.Join(root, filepath.FromSlash(rel)), nil
}

func extractDir(target string, hdr *tar.Header) error {
	fi, err := os.Lstat(target)
	if err == nil && fi.IsDir() {
		return nil
	}
	if err == nil {
		// as tar does: the entry replaces what is there
		if err := os.Remove(target); err != nil {
			return err
		}
	}
	return os.Mkdir(target, 0o700)
}

// extractFile writes a regular file through a temporary file renamed over
// target.
func extractFile(target string, hdr *tar.Header, r io.Reader) error {
	return replaceWith(target, hdr, func(tmp string) error {
		f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
		if err != nil {
			return err
		}
		if _, err := io.CopyN(f, r, hdr.Size); err != nil {
			f.Close()
			if errors.Is(err, io.EOF) {
				return errors.New("tar ended inside the file")
			}
			return err
		}
		return f.Close()
	})
}

// replaceWith makes a new file at a temporary name with create, gives it the
// entry's metadata and renames it over target. A directory at target is
// never replaced.
func replaceWith(target string, hdr *tar.Header, create func(tmp string) error) error {
	if fi, err := os.Lstat(target); err == nil && fi.IsDir() {
		return invalidf("tar entry %s: %s is a directory", hdr.Name, target)
	}
	tmp := tempName(target)
	if err := create(tmp); err != nil {
		os.Remove(tmp)
		return err
	}
	if hdr.Typeflag != tar.TypeLink {
		// a hard link shares its metadata with the file it links
		if err := setMeta(tmp, hdr); err != nil {
			os.Remove(tmp)
			return err
		}
	}
	if err := os.Rename(tmp, target); err != nil {
		os.Remove(tmp)
		return err
	}
	return nil
}

// extractOwner, when set, owns everything untar extracts (one untar per
// agent process).
var extractOwner *passwdEntry

// setMeta gives p the owner, mode and times of hdr, without following a
// symlink at p.
func setMeta(p string, hdr *tar.Header) error {
	if os.Geteuid() == 0 {
		uid, gid := hdr.Uid, hdr.Gid
		if extractOwner != nil {
			uid, gid = extractOwner.uid, extractOwner.gid
		}
		if err := os.Lchown(p, uid, gid); err != nil {
			return err
		}
	}
	if hdr.Typeflag != tar.TypeSymlink {
		// after chown, which clears setuid and setgid
		if err := os.Chmod(p, hdr.FileInfo().Mode()&(fs.ModePerm|fs.ModeSetuid|fs.ModeSetgid|fs.ModeSticky)); err != nil {
			return err
		}
	}
	atime := hdr.AccessTime
	if atime.IsZero() {
		atime = hdr.ModTime
	}
	ts := []unix.Timespec{timespec(atime), timespec(hdr.ModTime)}
	return unix.UtimesNanoAt(unix.AT_FDCWD, p, ts, unix.AT_SYMLINK_NOFOLLOW)
}

func timespec(t time.Time) unix.Timespec {
	if t.IsZero() {
		return unix.Timespec{Nsec: unix.UTIME_OMIT}
	}
	return unix.NsecToTimespec(t.UnixNano())
}
