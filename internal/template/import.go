package template

import (
	"archive/tar"
	"bufio"
	"compress/gzip"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/klauspost/compress/zstd"
	"sbx.dev/sbx/api"
	"sbx.dev/sbx/internal/safetar"
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
	// a root filesystem, as a layer over another: all of it is kept but
	// devices (the runtime provides /dev), and it is bounded
	n, err := safetar.Extract(in, rootfs, safetar.Options{
		AbsoluteNames: true,
		ReplaceDirs:   true,
		Owner:         func(hdr *tar.Header) (int, int) { return hdr.Uid, hdr.Gid },
		KeepMode:      true,
		KeepTimes:     true,
		Xattrs:        true,
		Fifos:         true,
		SkipUnknown:   true,
		Charge:        written.add,
		Note:          progress,
		CacheBytes:    maxCache,
		SpillDir:      filepath.Dir(rootfs),
	})
	if err != nil {
		return "", extractErr(ctx, err, n)
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
	return "sha256:" + hex.EncodeToString(h.Sum(nil)), nil
}

// extractErr is the error of an extraction that stopped after n entries:
// the context's, a bound's as it is, api.ErrInvalid for an archive at
// fault.
func extractErr(ctx context.Context, err error, n int) error {
	var te *safetar.Error
	switch {
	case ctx.Err() != nil:
		return ctx.Err()
	case errors.Is(err, errTooBig):
		return err
	case !errors.As(err, &te):
		return api.Errorf(api.ErrInvalid, "read tar after %d entries: %s", n, err)
	case te.Entry == "":
		return api.Errorf(api.ErrInvalid, "read tar after %d entries: %s", n, te.Err)
	case te.Kind == safetar.Failed:
		return err
	}
	return api.Errorf(api.ErrInvalid, "%s", err)
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

// maxCache bounds the memory of the paths an extraction remembers.
var maxCache = 8 << 20
