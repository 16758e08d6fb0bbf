package template

import (
	"errors"
	"fmt"
	"io"
	"syscall"

	"sbx.dev/sbx/api"
)

// ImportLimits bound what an import may unpack, so that a small archive (a
// decompression bomb: a few MB of gzip, gigabytes of zeroes) cannot fill
// the host's disk: it is stopped as soon as it passes a limit, and what it
// wrote is removed.
type ImportLimits struct {
	// Layer bounds one layer (or a rootfs tar): its uncompressed tar, and
	// what it writes (file contents, a block per directory). 0: no bound.
	Layer int64
	// Image bounds an image: its layers' files together, and a rootfs tar.
	// 0: no bound.
	Image int64
	// Reserve is the free space an import leaves on the store's file
	// system: below it, it stops.
	Reserve int64
}

// DefaultImportLimits are sbxd's unless its flags say otherwise: room for
// the largest images in common use (CUDA's are ~10 GB), not for a bomb.
var DefaultImportLimits = ImportLimits{Layer: 16 << 30, Image: 32 << 30, Reserve: 1 << 30}

// SetImportLimits sets the limits of the imports that start after it.
func (s *Store) SetImportLimits(l ImportLimits) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.limits = l
}

func (s *Store) importLimits() ImportLimits {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.limits
}

// budget counts what one unpack writes against its bound and the store's
// free space.
type budget struct {
	dir     string // on the file system whose free space counts
	max     int64  // 0: no bound
	what    string // the bound, as the error names it ("the layer limit, sbxd --max-layer-size")
	reserve int64
	used    int64
	checked int64 // used when the free space was last looked at
}

// errTooBig is an unpack past its bound, or one that would leave the disk
// with less than the reserve.
var errTooBig = errors.New("too big")

// tooBig marks err (of an api kind) as errTooBig too.
func tooBig(err error) error { return &tooBigError{err} }

type tooBigError struct{ err error }

func (e *tooBigError) Error() string   { return e.err.Error() }
func (e *tooBigError) Unwrap() []error { return []error{e.err, errTooBig} }

// freeEvery is how much an unpack writes between looks at the free space.
const freeEvery = 16 << 20

// add counts n more bytes and refuses them past the bound, or once the
// file system has less than the reserve free.
func (b *budget) add(n int64) error {
	b.used += n
	if b.max > 0 && b.used > b.max {
		return tooBig(api.Errorf(api.ErrInvalid, "it unpacks to more than %s, %s; refused, and what it wrote is removed", fmtSize(b.max), b.what))
	}
	if b.used-b.checked >= freeEvery || b.checked == 0 {
		b.checked = max(b.used, 1)
		return b.checkFree()
	}
	return nil
}

// checkFree refuses to go on when the file system has less than the
// reserve free.
func (b *budget) checkFree() error {
	if b.reserve <= 0 {
		return nil
	}
	var st syscall.Statfs_t
	if err := syscall.Statfs(b.dir, &st); err != nil {
		return nil // cannot tell: the writes will say
	}
	if free := int64(st.Bavail) * st.Bsize; free < b.reserve {
		return tooBig(api.Errorf(api.ErrUnavailable, "the disk of %s has %s free, less than the %s sbxd keeps; refused, and what it wrote is removed: free some space there (`sbx template rm` what is unused) and import again", b.dir, fmtSize(free), fmtSize(b.reserve)))
	}
	return nil
}

// limitReader counts what is read through it against a budget.
type limitReader struct {
	r io.Reader
	b *budget
}

func (l *limitReader) Read(p []byte) (int, error) {
	n, err := l.r.Read(p)
	if n > 0 {
		if berr := l.b.add(int64(n)); berr != nil {
			return n, berr
		}
	}
	return n, err
}

// fmtSize prints a size for a message: 16.0 GiB, 64.0 MiB, 512 B.
func fmtSize(n int64) string {
	switch {
	case n >= 1<<30:
		return fmt.Sprintf("%.1f GiB", float64(n)/(1<<30))
	case n >= 1<<20:
		return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
	case n >= 1<<10:
		return fmt.Sprintf("%.1f KiB", float64(n)/(1<<10))
	default:
		return fmt.Sprintf("%d B", n)
	}
}
