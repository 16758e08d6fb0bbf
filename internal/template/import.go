package template

import (
	"archive/tar"
	"bufio"
	"compress/gzip"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/klauspost/compress/zstd"
	"golang.org/x/sys/unix"
	"sbx.dev/sbx/api"
)

// progressEvery is how many bytes of the stream an import reads between
// progress messages.
const progressEvery = 100 << 20

// Import makes a version of template name from tarStream, a root
// filesystem as a tar (`docker export` output, say), gzip- or
// zstd-compressed or not, and points name at it. The version is the digest of
// the unpacked tree (see treeDigest): importing content that is there
// already reuses its version and says so. Names with ".." components,
// entries below a symlink and hard links to outside the rootfs are refused;
// device nodes are skipped with a note. A failed or cancelled import changes
// nothing. Errors: api.ErrInvalid for a bad name or archive, api.ErrConflict
// if the name exists and force is false.
func (s *Store) Import(ctx context.Context, name string, tarStream io.Reader, force bool, progress func(msg string)) (api.Template, error) {
	progress = orNop(progress)
	if err := ValidName(name); err != nil {
		return api.Template{}, err
	}
	unlock, err := s.lock(ctx, name)
	if err != nil {
		return api.Template{}, err
	}
	defer unlock()
	if cur, err := s.Resolve(name); err == nil && !force {
		return api.Template{}, api.Errorf(api.ErrConflict, "template %s exists (version %s); import again with force to point it at the new version (sandboxes on the old one keep it), or remove the name first", name, short(cur.Version))
	}
	lim := s.importLimits()
	// a rootfs tar is one layer and the whole image: the smaller bound holds
	bound := unpackBound{max: lim.Layer, what: "the layer limit (sbxd --max-layer-size)", reserve: lim.Reserve}
	if lim.Image > 0 && (bound.max == 0 || lim.Image < bound.max) {
		bound.max, bound.what = lim.Image, "the image limit (sbxd --max-image-size)"
	}
	t, reused, err := s.make(ctx, name, "import", api.TemplateDefaults{}, force, "import", progress, func(ctx context.Context, rootfs string) error {
		_, err := extract(ctx, rootfs, tarStream, false, progress, bound)
		return err
	})
	if err != nil {
		return api.Template{}, fmt.Errorf("import template %s: %w", name, err)
	}
	if reused {
		progress(fmt.Sprintf("imported %s: the same content as version %s, which is reused", name, short(t.Version)))
	} else {
		progress(fmt.Sprintf("imported %s (%d MB), version %s", name, t.Size>>20, short(t.Version)))
	}
	return t, nil
}

// unpackBound is what one unpack may write: max bytes (0: any) of
// uncompressed tar, and as many of files and directories, what naming the
// bound in the error; and the free space it leaves (reserve).
type unpackBound struct {
	max     int64
	what    string
	reserve int64
}

// extract unpacks the tar r (compressed with gzip or zstd, or not) into the
// new directory rootfs and returns the digest of the uncompressed tar, all
// of it (the diff ID of an image layer). An empty archive is refused unless
// allowEmpty. It stops as soon as the uncompressed tar, or what it writes,
// passes bound, or the disk's free space falls below the reserve (the
// caller removes what it wrote); its memory does not grow with the archive.
func extract(ctx context.Context, rootfs string, r io.Reader, allowEmpty bool, progress func(string), bound unpackBound) (diffID string, err error) {
	cr := &countingReader{ctx: ctx, r: r, progress: progress, next: progressEvery}
	in, closeIn, err := decompress(cr)
	if err != nil {
		return "", err
	}
	defer closeIn()
	written := &budget{dir: filepath.Dir(rootfs), max: bound.max, what: bound.what, reserve: bound.reserve}
	if err := written.checkFree(); err != nil {
		return "", err
	}
	in = &limitReader{r: in, b: &budget{max: bound.max, what: bound.what}}
	h := sha256.New()
	in = io.TeeReader(in, h)
	if err := os.Mkdir(rootfs, 0o755); err != nil {
		return "", err
	}
	root, err := os.OpenRoot(rootfs)
	if err != nil {
		return "", err
	}
	defer root.Close()
	x := &extractor{root: root, dir: rootfs, progress: progress, checked: make(map[string]bool), written: written}
	defer x.closeSpill()
	tr := tar.NewReader(in)
	n := 0
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			if ctx.Err() != nil {
				return "", ctx.Err()
			}
			if errors.Is(err, errTooBig) {
				return "", err
			}
			return "", api.Errorf(api.ErrInvalid, "read tar after %d entries: %s", n, err)
		}
		if err := x.entry(hdr, tr); err != nil {
			if ctx.Err() != nil {
				return "", ctx.Err()
			}
			return "", err
		}
		n++
	}
	if n == 0 && !allowEmpty {
		return "", api.Errorf(api.ErrInvalid, "the archive is empty")
	}
	// the diff ID covers the tar's end blocks and any padding after them
	if _, err := io.Copy(io.Discard, in); err != nil {
		if ctx.Err() != nil {
			return "", ctx.Err()
		}
		if errors.Is(err, errTooBig) {
			return "", err
		}
		return "", api.Errorf(api.ErrInvalid, "read the end of the tar: %s", err)
	}
	progress(fmt.Sprintf("extracted %d entries (%d MB read)", n, cr.n>>20))
	if err := x.finishDirs(); err != nil {
		return "", err
	}
	return "sha256:" + hex.EncodeToString(h.Sum(nil)), nil
}

// decompress returns r uncompressed: gzip and zstd are recognised by their
// magic numbers, anything else is taken as it is.
func decompress(r io.Reader) (io.Reader, func(), error) {
	br := bufio.NewReaderSize(r, 64<<10)
	magic, err := br.Peek(4)
	if err != nil && !errors.Is(err, io.EOF) {
		return nil, nil, err
	}
	switch {
	case len(magic) >= 2 && magic[0] == 0x1f && magic[1] == 0x8b:
		zr, err := gzip.NewReader(br)
		if err != nil {
			return nil, nil, api.Errorf(api.ErrInvalid, "read gzip: %s", err)
		}
		return zr, func() { zr.Close() }, nil
	case len(magic) == 4 && magic[0] == 0x28 && magic[1] == 0xb5 && magic[2] == 0x2f && magic[3] == 0xfd:
		zr, err := zstd.NewReader(br, zstd.WithDecoderConcurrency(1), zstd.WithDecoderMaxMemory(1<<30))
		if err != nil {
			return nil, nil, api.Errorf(api.ErrInvalid, "read zstd: %s", err)
		}
		return zr, zr.Close, nil
	}
	return br, func() {}, nil
}

// countingReader stops at cancellation and reports progress as it reads.
type countingReader struct {
	ctx      context.Context
	r        io.Reader
	n, next  int64
	progress func(string)
}

func (c *countingReader) Read(p []byte) (int, error) {
	if err := c.ctx.Err(); err != nil {
		return 0, err
	}
	n, err := c.r.Read(p)
	c.n += int64(n)
	if c.n >= c.next {
		c.progress(fmt.Sprintf("read %d MB", c.n>>20))
		c.next = c.n + progressEvery
	}
	return n, err
}

// extractor writes tar entries below root without ever following a
// symlink: every parent of an entry is checked to be a real directory,
// and the writes themselves go through an os.Root as a second guard.
type extractor struct {
	root     *os.Root
	dir      string
	progress func(string)
	// checked caches paths known to be real directories; it is emptied
	// past maxCache bytes of them (a miss costs an lstat, not correctness)
	checked      map[string]bool
	checkedBytes int
	// dirs holds the mode and time of each directory, set last, when
	// nothing more is written into them: one record per path, however many
	// entries name it, and past maxCache bytes of them the records go to a
	// file (spill) beside the rootfs instead, so that memory stays flat
	dirs      map[string]dirMeta
	dirsBytes int
	spill     *os.File
	spillW    *bufio.Writer
	written   *budget // what the unpack writes
}

// dirMeta is what a directory entry sets once the unpack is done.
type dirMeta struct {
	mode  fs.FileMode
	mtime int64 // Unix nanoseconds
}

// maxCache bounds each of an extractor's maps, in bytes of paths.
var maxCache = 8 << 20

// dirBlock is what a directory costs the disk, counted against the bound.
const dirBlock = 4096

// cleanName turns a tar name into a path relative to the rootfs ("." for
// the rootfs itself). Absolute names are taken as relative to the rootfs.
func cleanName(name string) (string, error) {
	for _, c := range strings.Split(name, "/") {
		if c == ".." {
			return "", api.Errorf(api.ErrInvalid, "entry %q: names must not contain \"..\"", name)
		}
	}
	return path.Clean("./" + strings.TrimLeft(name, "/")), nil
}

// checkParents makes sure no parent of rel is a symlink or a non-directory,
// and creates the missing ones.
func (x *extractor) checkParents(entry, rel string) error {
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
				return fmt.Errorf("entry %q: %w", entry, err)
			}
		case err != nil:
			return fmt.Errorf("entry %q: %w", entry, err)
		case fi.Mode()&fs.ModeSymlink != 0:
			return api.Errorf(api.ErrInvalid, "entry %q: its parent %q is a symbolic link", entry, p)
		case !fi.IsDir():
			return api.Errorf(api.ErrInvalid, "entry %q: its parent %q is not a directory", entry, p)
		}
		x.markChecked(p)
	}
	return nil
}

// markChecked caches p as a real directory, within maxCache.
func (x *extractor) markChecked(p string) {
	if x.checked[p] {
		return
	}
	if x.checkedBytes+len(p) > maxCache {
		clear(x.checked)
		x.checkedBytes = 0
	}
	x.checked[p] = true
	x.checkedBytes += len(p) + 48
}

// setLater records the mode and time a directory takes at the end.
func (x *extractor) setLater(rel string, hdr *tar.Header) error {
	m := dirMeta{mode: hdr.FileInfo().Mode() & (fs.ModePerm | fs.ModeSetuid | fs.ModeSetgid | fs.ModeSticky), mtime: hdr.ModTime.UnixNano()}
	if x.dirs == nil {
		x.dirs = make(map[string]dirMeta)
	}
	if _, ok := x.dirs[rel]; ok || x.dirsBytes+len(rel) <= maxCache {
		if !ok {
			x.dirsBytes += len(rel) + 64
		}
		x.dirs[rel] = m
		return nil
	}
	if x.spill == nil {
		f, err := os.CreateTemp(filepath.Dir(x.dir), ".dirs-")
		if err != nil {
			return fmt.Errorf("entry %q: %w", hdr.Name, err)
		}
		x.spill, x.spillW = f, bufio.NewWriterSize(f, 64<<10)
	}
	var rec [20]byte
	binary.BigEndian.PutUint64(rec[0:], uint64(m.mode))
	binary.BigEndian.PutUint64(rec[8:], uint64(m.mtime))
	binary.BigEndian.PutUint32(rec[16:], uint32(len(rel)))
	x.spillW.Write(rec[:])
	if _, err := x.spillW.WriteString(rel); err != nil {
		return fmt.Errorf("entry %q: %w", hdr.Name, err)
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

// clear removes what is at rel unless keepDir and it is a directory, and
// reports whether a directory was kept.
func (x *extractor) clear(rel string, keepDir bool) (kept bool, err error) {
	fi, err := x.root.Lstat(rel)
	if errors.Is(err, fs.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	if fi.IsDir() {
		if keepDir {
			return true, nil
		}
		clear(x.checked) // anything below may have gone
		return false, x.root.RemoveAll(rel)
	}
	return false, x.root.Remove(rel)
}

func (x *extractor) entry(hdr *tar.Header, r io.Reader) error {
	rel, err := cleanName(hdr.Name)
	if err != nil {
		return err
	}
	if rel == "." {
		return nil // the rootfs itself: its mode is ours to choose
	}
	if err := x.checkParents(hdr.Name, rel); err != nil {
		return err
	}
	full := filepath.Join(x.dir, rel) // safe for lchown and xattrs: the parents are real directories
	mode := hdr.FileInfo().Mode()
	fail := func(err error) error { return entryErr(hdr.Name, err) }

	switch hdr.Typeflag {
	case tar.TypeDir:
		kept, err := x.clear(rel, true)
		if err != nil {
			return fail(err)
		}
		if !kept {
			if err := x.root.Mkdir(rel, 0o700); err != nil {
				return fail(err)
			}
		}
		if err := x.owner(full, hdr); err != nil {
			return fail(err)
		}
		if !kept {
			if err := x.written.add(dirBlock); err != nil {
				return err
			}
		}
		x.markChecked(rel)
		return x.setLater(rel, hdr)

	case tar.TypeReg:
		if _, err := x.clear(rel, false); err != nil {
			return fail(err)
		}
		f, err := x.root.OpenFile(rel, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
		if err != nil {
			return fail(err)
		}
		if _, err := io.Copy(f, &limitReader{r: r, b: x.written}); err != nil {
			f.Close()
			if errors.Is(err, errTooBig) {
				return err
			}
			return fail(err)
		}
		if err := f.Close(); err != nil {
			return fail(err)
		}
		if err := x.owner(full, hdr); err != nil {
			return fail(err)
		}
		// after chown, which clears setuid bits
		if err := x.root.Chmod(rel, mode); err != nil {
			return fail(err)
		}
		return entryErr(hdr.Name, x.root.Chtimes(rel, hdr.ModTime, hdr.ModTime))

	case tar.TypeSymlink:
		if _, err := x.clear(rel, false); err != nil {
			return fail(err)
		}
		if err := x.root.Symlink(hdr.Linkname, rel); err != nil {
			return fail(err)
		}
		if err := x.owner(full, hdr); err != nil {
			return fail(err)
		}
		return entryErr(hdr.Name, lutimes(full, hdr.ModTime))

	case tar.TypeLink:
		target, err := cleanName(hdr.Linkname)
		if err != nil {
			return api.Errorf(api.ErrInvalid, "entry %q: hard link target %q must not contain \"..\"", hdr.Name, hdr.Linkname)
		}
		if target == "." {
			return api.Errorf(api.ErrInvalid, "entry %q: hard link to the root directory", hdr.Name)
		}
		if err := x.checkParents(hdr.Name, target); err != nil {
			return err
		}
		fi, err := x.root.Lstat(target)
		if err != nil {
			return api.Errorf(api.ErrInvalid, "entry %q: hard link target %q is not in the archive before it", hdr.Name, hdr.Linkname)
		}
		if fi.IsDir() {
			return api.Errorf(api.ErrInvalid, "entry %q: hard link to directory %q", hdr.Name, hdr.Linkname)
		}
		if target == rel {
			return nil
		}
		if _, err := x.clear(rel, false); err != nil {
			return fail(err)
		}
		return entryErr(hdr.Name, x.root.Link(target, rel))

	case tar.TypeFifo:
		if _, err := x.clear(rel, false); err != nil {
			return fail(err)
		}
		if err := unix.Mkfifo(full, uint32(mode.Perm())); err != nil {
			return fail(err)
		}
		if err := x.owner(full, hdr); err != nil {
			return fail(err)
		}
		return entryErr(hdr.Name, x.root.Chmod(rel, mode))

	case tar.TypeChar, tar.TypeBlock:
		// the runtime provides /dev; a node in a template is of no use
		x.progress(fmt.Sprintf("skipping device node %s", hdr.Name))
		return nil

	default:
		x.progress(fmt.Sprintf("skipping %s: unsupported tar entry type %q", hdr.Name, hdr.Typeflag))
		return nil
	}
}

// entryErr names the tar entry in err, if there is one.
func entryErr(name string, err error) error {
	if err != nil {
		return fmt.Errorf("entry %q: %w", name, err)
	}
	return nil
}

// owner sets the owner and extended attributes of the entry at full
// without following it if it is a symlink.
func (x *extractor) owner(full string, hdr *tar.Header) error {
	if err := os.Lchown(full, hdr.Uid, hdr.Gid); err != nil {
		return err
	}
	for k, v := range hdr.PAXRecords {
		attr, ok := strings.CutPrefix(k, "SCHILY.xattr.")
		if !ok {
			continue
		}
		if err := unix.Lsetxattr(full, attr, []byte(v), 0); err != nil {
			x.progress(fmt.Sprintf("%s: cannot set attribute %s: %s", hdr.Name, attr, err))
		}
	}
	return nil
}

// finishDirs sets the modes and times of directories, once nothing more is
// written into them: those kept in memory, then those spilled, in the order
// they came (the last entry naming a path wins, as it would have).
func (x *extractor) finishDirs() error {
	for rel, m := range x.dirs {
		if err := x.finishDir(rel, m); err != nil {
			return err
		}
	}
	if x.spill == nil {
		return nil
	}
	if err := x.spillW.Flush(); err != nil {
		return fmt.Errorf("directories: %w", err)
	}
	if _, err := x.spill.Seek(0, io.SeekStart); err != nil {
		return fmt.Errorf("directories: %w", err)
	}
	br := bufio.NewReaderSize(x.spill, 64<<10)
	var rec [20]byte
	name := make([]byte, 0, 4096)
	for {
		if _, err := io.ReadFull(br, rec[:]); errors.Is(err, io.EOF) {
			return nil
		} else if err != nil {
			return fmt.Errorf("directories: %w", err)
		}
		n := int(binary.BigEndian.Uint32(rec[16:]))
		name = slices.Grow(name[:0], n)[:n]
		if _, err := io.ReadFull(br, name); err != nil {
			return fmt.Errorf("directories: %w", err)
		}
		m := dirMeta{mode: fs.FileMode(binary.BigEndian.Uint64(rec[0:])), mtime: int64(binary.BigEndian.Uint64(rec[8:]))}
		if err := x.finishDir(string(name), m); err != nil {
			return err
		}
	}
}

// finishDir sets one directory's mode and time, unless a later entry
// replaced it.
func (x *extractor) finishDir(rel string, m dirMeta) error {
	if fi, err := x.root.Lstat(rel); err != nil || !fi.IsDir() {
		return nil
	}
	if err := x.root.Chmod(rel, m.mode); err != nil {
		return fmt.Errorf("entry %q: %w", rel, err)
	}
	t := time.Unix(0, m.mtime)
	if err := x.root.Chtimes(rel, t, t); err != nil {
		return fmt.Errorf("entry %q: %w", rel, err)
	}
	return nil
}

func lutimes(full string, mtime time.Time) error {
	ts := []unix.Timespec{unix.NsecToTimespec(mtime.UnixNano()), unix.NsecToTimespec(mtime.UnixNano())}
	return unix.UtimesNanoAt(unix.AT_FDCWD, full, ts, unix.AT_SYMLINK_NOFOLLOW)
}
