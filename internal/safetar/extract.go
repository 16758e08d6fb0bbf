// Package safetar extracts tar archives that may come from an attacker, and
// writes trees into tars: the one tar code of the client, the agent and the
// template store.
//
// Extract never writes outside its target, through a symlink, or over a
// directory (unless asked, as an image layer asks); it refuses names with
// "..", absolute names (unless told to take them as relative), names with
// NUL bytes and empty names, and hard links to anything but an earlier
// file below the target. What differs between callers (ownership, modes,
// devices, bounds) is an Option, off by default.
package safetar

import (
	"archive/tar"
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"maps"
	"math/rand/v2"
	"os"
	"path"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// DirCost is what a directory Extract makes is charged (see Options.Charge):
// the block it costs the disk.
const DirCost = 4096

// Options says what an extraction keeps of the archive beyond names and
// contents, and what it allows. The zero value keeps nothing (no owner, no
// setuid, no times; modes within Umask), skips fifos and devices, and
// refuses unknown entry types.
type Options struct {
	// StripComponents drops that many leading components of every name and
	// hard link target; an entry left with none is the target itself.
	StripComponents int
	// AbsoluteNames takes "/etc/x" as "etc/x" (a root filesystem's export);
	// without it an absolute name is refused.
	AbsoluteNames bool
	// RootMode gives the target the mode of the archive's entry for it
	// (within Umask and at least 0700); without it the target keeps its own.
	// Only for a target made for this extraction.
	RootMode bool
	// RequireEnd refuses an archive that ends without its end marker (two
	// zero blocks), which is what a sender that went away between entries
	// leaves.
	RequireEnd bool
	// ReplaceDirs lets an entry that is not a directory replace a directory
	// there, with all below it, as a layer over another does; without it
	// such an entry is refused.
	ReplaceDirs bool

	// Owner, if set, gives each entry's owner; nil leaves the extracting
	// user's.
	Owner func(hdr *tar.Header) (uid, gid int)
	// KeepMode sets each entry's mode as the archive has it, setuid, setgid
	// and sticky bits too; without it only permission bits, less Umask.
	KeepMode bool
	// Umask is taken away from modes without KeepMode.
	Umask fs.FileMode
	// KeepTimes sets each entry's access and modification times.
	KeepTimes bool
	// Xattrs sets the extended attributes the archive records
	// (SCHILY.xattr.*); one that cannot be set is reported to Note.
	Xattrs bool
	// Fifos and Devices make named pipes and device nodes; without them
	// those entries are skipped, and Note hears of it.
	Fifos, Devices bool
	// SkipUnknown skips entries of types Extract does not make (Note hears
	// of them); without it they are refused.
	SkipUnknown bool

	// Charge, if set, is told of every byte of file data written and of
	// DirCost for every directory made; an error from it stops the
	// extraction and is returned as it is.
	Charge func(n int64) error
	// Note, if set, hears what is skipped.
	Note func(msg string)
	// CacheBytes bounds the memory of the paths Extract remembers (real
	// directories it checked; directories whose mode and times it sets
	// last): past it, the first are forgotten and the second spilled to a
	// file in SpillDir. 0: 8 MiB.
	CacheBytes int
	// SpillDir holds that file; "": os.TempDir().
	SpillDir string
}

// Kind says whose fault an Error is.
type Kind int

const (
	// Invalid is an entry refused: a hostile or malformed name, link or type.
	Invalid Kind = iota + 1
	// Unreadable is an archive that cannot be read: not a tar, or cut short.
	Unreadable
	// Failed is the file system's refusal to make an entry.
	Failed
)

// Error is why Extract stopped at an entry, or at the archive.
type Error struct {
	Entry string // the entry's name as the archive has it; "" for the archive
	Kind  Kind
	Err   error
}

func (e *Error) Error() string {
	if e.Entry == "" {
		return "read tar: " + e.Err.Error()
	}
	return fmt.Sprintf("tar entry %q: %s", e.Entry, e.Err)
}

func (e *Error) Unwrap() error { return e.Err }

// Extract writes the entries of the tar read from r below the existing
// directory dest, as o says, and returns how many entries it read. A file,
// symlink, hard link or node appears whole, through a temporary name
// renamed into place. Errors: an *Error, or an error of r's or of Charge's
// as it is (a bound, a cancellation). What
// was written before an error stays; a caller extracting into a new
// directory removes it.
func Extract(r io.Reader, dest string, o Options) (int, error) {
	root, err := os.OpenRoot(dest)
	if err != nil {
		return 0, &Error{Kind: Failed, Err: err}
	}
	defer root.Close()
	if o.CacheBytes <= 0 {
		o.CacheBytes = 8 << 20
	}
	if o.Note == nil {
		o.Note = func(string) {}
	}
	cr := &countingReader{r: r}
	x := &extractor{o: o, root: root, dir: dest, cr: cr, checked: map[string]bool{}}
	defer x.closeSpill()
	tr := tar.NewReader(cr)
	n := 0
	var end int64 // where the last entry's data ends; -1 if unknown
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			if o.RequireEnd && end >= 0 && cr.n-end < 2*512 {
				return n, &Error{Kind: Unreadable, Err: errors.New("the archive ended without its end marker; was it cut short?")}
			}
			break
		}
		if err != nil {
			if cr.err != nil && errors.Is(err, cr.err) {
				return n, err // r's own (a bound, a cancellation)
			}
			return n, &Error{Kind: Unreadable, Err: err}
		}
		switch {
		case end < 0 || isSparse(hdr):
			end = -1 // its stored size is not Size: the check is off
		case hasData(hdr.Typeflag):
			end = cr.n + (hdr.Size+511)&^511
		default:
			end = cr.n
		}
		n++
		if hdr.Typeflag == tar.TypeXGlobalHeader {
			continue
		}
		if err := x.entry(hdr, tr); err != nil {
			return n, err
		}
	}
	return n, x.finishDirs()
}

// countingReader counts the bytes read through it and keeps its error.
type countingReader struct {
	r   io.Reader
	n   int64
	err error
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += int64(n)
	if err != nil && err != io.EOF {
		c.err = err
	}
	return n, err
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

// extractor writes entries below root without following a symlink: every
// parent of an entry is checked to be a real directory, and the writes go
// through an os.Root as a second guard.
type extractor struct {
	o    Options
	root *os.Root
	dir  string
	cr   *countingReader
	// checked caches paths known to be real directories
	checked      map[string]bool
	checkedBytes int
	// dirs holds the mode and times of each directory, set last: one record
	// per path, and past CacheBytes of them the records go to spill
	dirs      map[string]dirMeta
	dirsBytes int
	spill     *os.File
	spillW    *bufio.Writer
}

// dirMeta is what a directory entry sets once the extraction is done.
type dirMeta struct {
	mode         fs.FileMode
	atime, mtime int64 // Unix nanoseconds; omitTime if none
}

const omitTime = -1 << 63

// why a name is refused
type badName int

const (
	nameOK badName = iota
	nameEmpty
	nameNUL
	nameAbsolute
	nameDotDot
)

// clean turns an entry name or hard link target into a path relative to
// the target, "." for the target itself.
func (x *extractor) clean(name string) (string, badName) {
	switch {
	case name == "":
		return "", nameEmpty
	case strings.IndexByte(name, 0) >= 0:
		return "", nameNUL
	case strings.HasPrefix(name, "/") && !x.o.AbsoluteNames:
		return "", nameAbsolute
	case slices.Contains(strings.Split(name, "/"), ".."):
		return "", nameDotDot
	}
	rel := path.Clean("./" + strings.TrimLeft(name, "/"))
	for range x.o.StripComponents {
		_, rest, ok := strings.Cut(rel, "/")
		if !ok {
			return ".", nameOK
		}
		rel = rest
	}
	return rel, nameOK
}

func (b badName) String() string {
	return [...]string{"", "an empty name", "the name contains a NUL byte", "absolute names are not allowed", `".." is not allowed in names: it leaves the target directory`}[b]
}

func invalid(hdr *tar.Header, format string, args ...any) error {
	return &Error{Entry: hdr.Name, Kind: Invalid, Err: fmt.Errorf(format, args...)}
}

func failed(hdr *tar.Header, err error) error {
	if err == nil {
		return nil
	}
	var e *Error
	if errors.As(err, &e) {
		return err
	}
	var a asIs
	if errors.As(err, &a) {
		return a.err
	}
	return &Error{Entry: hdr.Name, Kind: Failed, Err: err}
}

// asIs carries an error of the reader's or of Charge's up to Extract's
// caller unwrapped.
type asIs struct{ err error }

func (a asIs) Error() string { return a.err.Error() }

func (x *extractor) entry(hdr *tar.Header, r io.Reader) error {
	rel, bad := x.clean(hdr.Name)
	if bad != nameOK {
		return invalid(hdr, "%s", bad)
	}
	if rel == "." {
		if hdr.Typeflag != tar.TypeDir {
			return invalid(hdr, "it names the target directory, which an entry of type %q cannot be", hdr.Typeflag)
		}
		if x.o.RootMode {
			return failed(hdr, x.root.Chmod(".", (fs.FileMode(hdr.Mode).Perm()|0o700)&^x.o.Umask))
		}
		return nil // the target keeps its own owner and mode
	}
	if err := x.parents(hdr, rel); err != nil {
		return err
	}
	switch hdr.Typeflag {
	case tar.TypeDir:
		return x.mkdir(hdr, rel)
	case tar.TypeReg, tar.TypeGNUSparse:
		return x.place(hdr, rel, func(tmp string) error { return x.writeFile(hdr, tmp, r) })
	case tar.TypeSymlink:
		return x.place(hdr, rel, func(tmp string) error { return x.root.Symlink(hdr.Linkname, tmp) })
	case tar.TypeLink:
		return x.link(hdr, rel)
	case tar.TypeFifo, tar.TypeChar, tar.TypeBlock:
		if hdr.Typeflag == tar.TypeFifo && !x.o.Fifos {
			x.o.Note(fmt.Sprintf("skipping fifo %s", hdr.Name))
			return nil
		}
		if hdr.Typeflag != tar.TypeFifo && !x.o.Devices {
			x.o.Note(fmt.Sprintf("skipping device node %s", hdr.Name))
			return nil
		}
		return x.place(hdr, rel, func(tmp string) error {
			mode := uint32(hdr.Mode & 0o777)
			switch hdr.Typeflag {
			case tar.TypeChar:
				mode |= syscall.S_IFCHR
			case tar.TypeBlock:
				mode |= syscall.S_IFBLK
			default:
				mode |= syscall.S_IFIFO
			}
			return x.at(tmp, func(dirfd int, base string) error {
				return unix.Mknodat(dirfd, base, mode, int(unix.Mkdev(uint32(hdr.Devmajor), uint32(hdr.Devminor))))
			})
		})
	}
	if x.o.SkipUnknown {
		x.o.Note(fmt.Sprintf("skipping %s: unsupported tar entry type %q", hdr.Name, hdr.Typeflag))
		return nil
	}
	return invalid(hdr, "unsupported type %q", hdr.Typeflag)
}

// at calls f with rel's parent directory, opened through the root, and
// rel's last name: for the calls os.Root has no method for (nodes, times,
// attributes), made relative to that directory. rel's parents were checked
// real directories, but whoever else writes below the target may have
// swapped one for a symlink since: a path from the target would follow it
// (a node, an attribute or times set outside it, by root), an open through
// the root does not leave it.
func (x *extractor) at(rel string, f func(dirfd int, base string) error) error {
	d, err := x.root.OpenFile(path.Dir(rel), os.O_RDONLY|syscall.O_DIRECTORY, 0)
	if err != nil {
		return err
	}
	defer d.Close()
	return f(int(d.Fd()), path.Base(rel))
}

// parents makes sure no parent of rel is a symlink or a non-directory, and
// creates the missing ones.
func (x *extractor) parents(hdr *tar.Header, rel string) error {
	dir := path.Dir(rel)
	if dir == "." || x.checked[dir] {
		return nil
	}
	parts := strings.Split(dir, "/")
	for i := range parts {
		p := strings.Join(parts[:i+1], "/")
		if x.checked[p] {
			continue
		}
		fi, err := x.root.Lstat(p)
		switch {
		case errors.Is(err, fs.ErrNotExist):
			if err := x.root.Mkdir(p, 0o755); err != nil {
				return failed(hdr, err)
			}
		case err != nil:
			return failed(hdr, err)
		case fi.Mode()&fs.ModeSymlink != 0:
			return invalid(hdr, "its parent %s is a symbolic link, and nothing is written through a symlink", p)
		case !fi.IsDir():
			return invalid(hdr, "its parent %s is not a directory", p)
		}
		x.markChecked(p)
	}
	return nil
}

// markChecked caches p as a real directory, within CacheBytes.
func (x *extractor) markChecked(p string) {
	if x.checked[p] {
		return
	}
	if x.checkedBytes+len(p) > x.o.CacheBytes {
		clear(x.checked)
		x.checkedBytes = 0
	}
	x.checked[p] = true
	x.checkedBytes += len(p) + 48
}

func (x *extractor) mkdir(hdr *tar.Header, rel string) error {
	fi, err := x.root.Lstat(rel)
	kept := err == nil && fi.IsDir()
	switch {
	case kept:
	case err == nil: // as tar does: the entry replaces what is there
		if err := x.root.Remove(rel); err != nil {
			return failed(hdr, err)
		}
	case !errors.Is(err, fs.ErrNotExist):
		return failed(hdr, err)
	}
	if !kept {
		mode := fs.FileMode(0o700)
		if !x.o.KeepMode {
			mode = (fs.FileMode(hdr.Mode).Perm() | 0o700) &^ x.o.Umask
		}
		if err := x.root.Mkdir(rel, mode); err != nil {
			return failed(hdr, err)
		}
		if x.o.Charge != nil {
			if err := x.o.Charge(DirCost); err != nil {
				return err
			}
		}
	}
	if err := x.owner(hdr, rel); err != nil {
		return failed(hdr, err)
	}
	x.markChecked(rel)
	if x.o.KeepMode || x.o.KeepTimes {
		return x.setLater(hdr, rel)
	}
	return nil
}

// place makes an entry at a temporary name with create, gives it the
// entry's owner, mode and times, and renames it over rel.
func (x *extractor) place(hdr *tar.Header, rel string, create func(tmp string) error) error {
	if err := x.notDir(hdr, rel); err != nil {
		return err
	}
	tmp := tempName(rel)
	err := create(tmp)
	if err == nil {
		err = x.meta(hdr, tmp)
	}
	if err == nil {
		err = x.root.Rename(tmp, rel)
	}
	if err != nil {
		x.root.Remove(tmp)
		return failed(hdr, err)
	}
	return nil
}

// notDir clears a directory at rel for an entry that is not one, or
// refuses to.
func (x *extractor) notDir(hdr *tar.Header, rel string) error {
	fi, err := x.root.Lstat(rel)
	if err != nil || !fi.IsDir() {
		return nil
	}
	if !x.o.ReplaceDirs {
		return invalid(hdr, "%s is a directory, which an entry of type %q does not replace", rel, hdr.Typeflag)
	}
	clear(x.checked) // anything below goes
	return failed(hdr, x.root.RemoveAll(rel))
}

func (x *extractor) writeFile(hdr *tar.Header, tmp string, r io.Reader) error {
	f, err := x.root.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	src := &chargeReader{r: r, charge: x.o.Charge}
	_, err = io.CopyN(f, src, hdr.Size)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	switch {
	case src.chargeErr != nil: // CopyN drops an error with the last bytes
		return asIs{src.chargeErr}
	case err == nil:
		return nil
	case x.cr.err != nil && errors.Is(err, x.cr.err):
		return asIs{err}
	case errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF):
		return &Error{Entry: hdr.Name, Kind: Unreadable, Err: errors.New("the archive ended inside the file")}
	case src.readErr != nil:
		return &Error{Entry: hdr.Name, Kind: Unreadable, Err: err}
	}
	return err
}

// chargeReader tells Charge of what is read through it, and keeps its own
// error apart from the reader's.
type chargeReader struct {
	r                  io.Reader
	charge             func(int64) error
	readErr, chargeErr error
}

func (c *chargeReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	if err != nil && err != io.EOF {
		c.readErr = err
	}
	if n > 0 && c.charge != nil {
		if cerr := c.charge(int64(n)); cerr != nil {
			c.chargeErr = cerr
			return n, cerr
		}
	}
	return n, err
}

func (x *extractor) link(hdr *tar.Header, rel string) error {
	target, bad := x.clean(hdr.Linkname)
	switch {
	case bad == nameDotDot:
		return invalid(hdr, "bad hard link target %q: it must not contain \"..\"", hdr.Linkname)
	case bad != nameOK:
		return invalid(hdr, "bad hard link target %q: %s", hdr.Linkname, bad)
	case target == ".":
		return invalid(hdr, "bad hard link target %q: it is the target directory", hdr.Linkname)
	}
	if err := x.parents(hdr, target); err != nil {
		return err
	}
	fi, err := x.root.Lstat(target)
	if err != nil {
		return invalid(hdr, "hard link target %q is not in the archive before it", hdr.Linkname)
	}
	if fi.IsDir() {
		return invalid(hdr, "hard link to directory %q", hdr.Linkname)
	}
	if cur, err := x.root.Lstat(rel); err == nil && os.SameFile(fi, cur) {
		return nil // a link to itself, or there already
	}
	if err := x.notDir(hdr, rel); err != nil {
		return err
	}
	tmp := tempName(rel)
	if err := x.root.Link(target, tmp); err != nil {
		return failed(hdr, err)
	}
	// a hard link shares its metadata with the file it links
	if err := x.root.Rename(tmp, rel); err != nil {
		x.root.Remove(tmp)
		return failed(hdr, err)
	}
	return nil
}

// owner sets the owner and extended attributes of rel, not following it.
func (x *extractor) owner(hdr *tar.Header, rel string) error {
	if x.o.Owner != nil {
		uid, gid := x.o.Owner(hdr)
		if err := x.root.Lchown(rel, uid, gid); err != nil {
			return err
		}
	}
	if !x.o.Xattrs {
		return nil
	}
	if !slices.ContainsFunc(slices.Collect(maps.Keys(hdr.PAXRecords)), func(k string) bool { return strings.HasPrefix(k, "SCHILY.xattr.") }) {
		return nil
	}
	return x.at(rel, func(dirfd int, base string) error {
		// lsetxattr has no *at form: the parent is named by its open
		// descriptor, and the last name is not followed
		p := "/proc/self/fd/" + strconv.Itoa(dirfd) + "/" + base
		for k, v := range hdr.PAXRecords {
			attr, ok := strings.CutPrefix(k, "SCHILY.xattr.")
			if !ok {
				continue
			}
			if err := unix.Lsetxattr(p, attr, []byte(v), 0); err != nil {
				x.o.Note(fmt.Sprintf("%s: cannot set attribute %s: %s", hdr.Name, attr, err))
			}
		}
		return nil
	})
}

// mode is the mode an entry gets.
func (x *extractor) mode(hdr *tar.Header) fs.FileMode {
	if x.o.KeepMode {
		return hdr.FileInfo().Mode() & (fs.ModePerm | fs.ModeSetuid | fs.ModeSetgid | fs.ModeSticky)
	}
	return fs.FileMode(hdr.Mode).Perm() &^ x.o.Umask
}

// meta gives rel (not a directory) the owner, mode and times of hdr.
func (x *extractor) meta(hdr *tar.Header, rel string) error {
	if err := x.owner(hdr, rel); err != nil {
		return err
	}
	if hdr.Typeflag != tar.TypeSymlink {
		// after chown, which clears setuid and setgid
		if err := x.root.Chmod(rel, x.mode(hdr)); err != nil {
			return err
		}
	}
	if !x.o.KeepTimes {
		return nil
	}
	at, mt := times(hdr)
	return x.times(rel, at, mt)
}

func times(hdr *tar.Header) (atime, mtime int64) {
	at := hdr.AccessTime
	if at.IsZero() {
		at = hdr.ModTime
	}
	return nsec(at), nsec(hdr.ModTime)
}

func nsec(t time.Time) int64 {
	if t.IsZero() {
		return omitTime
	}
	return t.UnixNano()
}

func (x *extractor) times(rel string, atime, mtime int64) error {
	ts := []unix.Timespec{timespec(atime), timespec(mtime)}
	if rel == "." {
		return unix.UtimesNanoAt(unix.AT_FDCWD, x.dir, ts, unix.AT_SYMLINK_NOFOLLOW)
	}
	return x.at(rel, func(dirfd int, base string) error {
		return unix.UtimesNanoAt(dirfd, base, ts, unix.AT_SYMLINK_NOFOLLOW)
	})
}

func timespec(ns int64) unix.Timespec {
	if ns == omitTime {
		return unix.Timespec{Nsec: unix.UTIME_OMIT}
	}
	return unix.NsecToTimespec(ns)
}

// tempName is a temporary sibling of rel: "<dir>/.<base>.sbx-tmp-<random>".
func tempName(rel string) string {
	dir, base := path.Split(rel)
	return dir + "." + base + ".sbx-tmp-" + strconv.FormatUint(rand.Uint64(), 36)
}

// setLater records the mode and times a directory takes at the end.
func (x *extractor) setLater(hdr *tar.Header, rel string) error {
	m := dirMeta{mode: x.mode(hdr), atime: omitTime, mtime: omitTime}
	if x.o.KeepTimes {
		m.atime, m.mtime = times(hdr)
	}
	if x.dirs == nil {
		x.dirs = make(map[string]dirMeta)
	}
	if _, ok := x.dirs[rel]; ok || x.dirsBytes+len(rel) <= x.o.CacheBytes {
		if !ok {
			x.dirsBytes += len(rel) + 64
		}
		x.dirs[rel] = m
		return nil
	}
	if x.spill == nil {
		f, err := os.CreateTemp(x.o.SpillDir, ".dirs-")
		if err != nil {
			return failed(hdr, err)
		}
		x.spill, x.spillW = f, bufio.NewWriterSize(f, 64<<10)
	}
	var rec [28]byte
	binary.BigEndian.PutUint64(rec[0:], uint64(m.mode))
	binary.BigEndian.PutUint64(rec[8:], uint64(m.atime))
	binary.BigEndian.PutUint64(rec[16:], uint64(m.mtime))
	binary.BigEndian.PutUint32(rec[24:], uint32(len(rel)))
	x.spillW.Write(rec[:])
	if _, err := x.spillW.WriteString(rel); err != nil {
		return failed(hdr, err)
	}
	return nil
}

// closeSpill removes the spill file, if there is one.
func (x *extractor) closeSpill() {
	if x.spill != nil {
		x.spill.Close()
		os.Remove(x.spill.Name())
		x.spill = nil
	}
}

// finishDirs sets the modes and times of directories once nothing more is
// written into them: those kept in memory deepest first (a parent's time is
// set after its children's, and a parent without write or search
// permission comes last), then those spilled, in the order they came (the
// last entry naming a path wins, as it would have).
func (x *extractor) finishDirs() error {
	paths := make([]string, 0, len(x.dirs))
	for rel := range x.dirs {
		paths = append(paths, rel)
	}
	slices.SortFunc(paths, func(a, b string) int { return strings.Count(b, "/") - strings.Count(a, "/") })
	for _, rel := range paths {
		if err := x.finishDir(rel, x.dirs[rel]); err != nil {
			return err
		}
	}
	if x.spill == nil {
		return nil
	}
	fail := func(err error) error { return &Error{Kind: Failed, Err: fmt.Errorf("directories: %w", err)} }
	if err := x.spillW.Flush(); err != nil {
		return fail(err)
	}
	if _, err := x.spill.Seek(0, io.SeekStart); err != nil {
		return fail(err)
	}
	br := bufio.NewReaderSize(x.spill, 64<<10)
	var rec [28]byte
	name := make([]byte, 0, 4096)
	for {
		if _, err := io.ReadFull(br, rec[:]); errors.Is(err, io.EOF) {
			return nil
		} else if err != nil {
			return fail(err)
		}
		n := int(binary.BigEndian.Uint32(rec[24:]))
		name = slices.Grow(name[:0], n)[:n]
		if _, err := io.ReadFull(br, name); err != nil {
			return fail(err)
		}
		m := dirMeta{
			mode:  fs.FileMode(binary.BigEndian.Uint64(rec[0:])),
			atime: int64(binary.BigEndian.Uint64(rec[8:])),
			mtime: int64(binary.BigEndian.Uint64(rec[16:])),
		}
		if err := x.finishDir(string(name), m); err != nil {
			return err
		}
	}
}

// finishDir sets one directory's mode and times, unless a later entry
// replaced it.
func (x *extractor) finishDir(rel string, m dirMeta) error {
	if fi, err := x.root.Lstat(rel); err != nil || !fi.IsDir() {
		return nil
	}
	hdr := &tar.Header{Name: rel}
	if x.o.KeepMode {
		if err := x.root.Chmod(rel, m.mode); err != nil {
			return failed(hdr, err)
		}
	}
	if x.o.KeepTimes {
		return failed(hdr, x.times(rel, m.atime, m.mtime))
	}
	return nil
}
