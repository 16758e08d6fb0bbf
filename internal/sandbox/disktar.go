package sandbox

import (
	"archive/tar"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"

	"sbx.dev/sbx/api"
)

// A disk capture is runsc's tar of a sandbox's root overlay upper layer
// (sbx's runsc, third_party/gvisor/_tmpfs/tar.go). A file with holes is a
// sparse entry: a PAX record sparseRecord with the file's size, and content
// that is a map (GNU's sparse format 1.0: the number of extents, then each
// extent's offset and length, one number a line, NUL-padded to 512 bytes)
// followed by the data of each extent. The restore writes only the extents.

// sparseRecord is the PAX record of a sparse entry: the file's size.
const sparseRecord = "SBX.sparse.realsize"

// maxSparseMap is the largest map the restore reads (as gVisor's patch).
const maxSparseMap = 48 << 20

// diskTarSlack is what a disk capture may hold beyond its disk limit: the
// tar's headers, which cost the sandbox's disk nothing (an empty file, a
// directory, a symlink), one 512-byte block or three each.
func diskTarSlack(limit int64) int64 { return 64<<20 + limit/8 }

// maxDiskTar is the most a disk capture of a sandbox with that disk limit
// may write (0: no bound, for a sandbox recorded without a limit).
func maxDiskTar(limit int64) int64 {
	if limit <= 0 {
		return 0
	}
	return limit + diskTarSlack(limit)
}

// checkDiskTar checks that a disk capture restores into a sandbox with that
// disk limit: every entry is of a kind the restore makes, every sparse map
// is well formed and matches its entry, the tar ends where it should, and
// the pages its files need fit the limit (the restore writes into a tmpfs
// of that size, and a file it cannot write whole fails the boot). It reads
// headers and maps only: the data is skipped by seeking.
func checkDiskTar(path string, limit int64) error {
	f, err := os.Open(path)
	if err != nil {
		return fmt.Errorf("check disk: %w", err)
	}
	defer f.Close()
	need, err := diskTarPages(f)
	if err != nil {
		return api.Errorf(api.ErrConflict, "check disk: it would not restore: %s; nothing was kept", err)
	}
	if limit > 0 && need > limit {
		return api.Errorf(api.ErrConflict, "check disk: it would not restore: its files need %s, more than the sandbox's disk limit of %s; nothing was kept", fmtBytes(need), fmtBytes(limit))
	}
	return nil
}

// diskTarPages reads a disk capture and returns the bytes of tmpfs pages its
// files take once restored.
func diskTarPages(r io.Reader) (int64, error) {
	const page = 4096
	pages := func(off, n int64) int64 {
		if n == 0 {
			return 0
		}
		return ((off+n+page-1)/page - off/page) * page
	}
	tr := tar.NewReader(r)
	var need int64
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return need, nil
		}
		if err != nil {
			return 0, fmt.Errorf("read the tar: %w", err)
		}
		switch hdr.Typeflag {
		case tar.TypeDir, tar.TypeFifo, tar.TypeChar, tar.TypeBlock, tar.TypeLink:
		case tar.TypeSymlink:
			if len(hdr.Linkname) >= 128 { // gVisor's shortSymlinkLen: a page of its own
				need += page
			}
		case tar.TypeReg:
			rs, ok := hdr.PAXRecords[sparseRecord]
			if !ok {
				need += pages(0, hdr.Size)
				break
			}
			realSize, err := strconv.ParseInt(rs, 10, 64)
			if err != nil || realSize < 0 {
				return 0, fmt.Errorf("%s: bad %s record %q", hdr.Name, sparseRecord, rs)
			}
			extents, err := readSparseMap(tr, hdr.Size, realSize)
			if err != nil {
				return 0, fmt.Errorf("%s: bad sparse map: %w", hdr.Name, err)
			}
			for _, e := range extents {
				need += pages(e.off, e.len)
			}
		default:
			return 0, fmt.Errorf("%s: an entry of type %q, which the restore does not make", hdr.Name, hdr.Typeflag)
		}
	}
}

// sparseExtent is one run of a file's data: len bytes at off.
type sparseExtent struct{ off, len int64 }

// readSparseMap reads a sparse entry's map from r, as gVisor's restore does
// (third_party/gvisor/_tmpfs/tar.go, readSparseMap): a 512-byte block at a
// time; the extents in order, apart, within realSize; the map and the data
// they name make the entry's size.
func readSparseMap(r io.Reader, entrySize, realSize int64) ([]sparseExtent, error) {
	var (
		block   [512]byte
		read    int64
		tok     []byte
		nums    []int64
		want    int64 = -1 // numbers the map holds: 1 + 2 per extent
		extents []sparseExtent
	)
	for int64(len(nums)) != want {
		if read+512 > min(entrySize, maxSparseMap) {
			return nil, fmt.Errorf("map past %d bytes", read)
		}
		if _, err := io.ReadFull(r, block[:]); err != nil {
			return nil, fmt.Errorf("map cut short: %w", err)
		}
		read += 512
		for i, c := range block {
			if int64(len(nums)) == want {
				if c != 0 {
					return nil, fmt.Errorf("map padding holds %q", block[i:])
				}
				continue
			}
			if c != '\n' {
				if len(tok) == 20 || c < '0' || c > '9' {
					return nil, fmt.Errorf("bad number %q", append(tok, c))
				}
				tok = append(tok, c)
				continue
			}
			v, err := strconv.ParseInt(string(tok), 10, 64)
			if err != nil {
				return nil, fmt.Errorf("bad number %q", tok)
			}
			tok = tok[:0]
			nums = append(nums, v)
			if want < 0 {
				if v > maxSparseMap/4 {
					return nil, fmt.Errorf("%d extents", v)
				}
				want = 1 + 2*v
				extents = make([]sparseExtent, 0, v)
			}
		}
	}
	var end, data int64
	for i := 1; i < len(nums); i += 2 {
		off, length := nums[i], nums[i+1]
		if off < end || length > realSize || off > realSize-length {
			return nil, fmt.Errorf("extent %d+%d out of order or past %d", off, length, realSize)
		}
		end, data = off+length, data+length
		extents = append(extents, sparseExtent{off, length})
	}
	if read+data != entrySize {
		return nil, fmt.Errorf("map of %d bytes and %d bytes of data, in an entry of %d", read, data, entrySize)
	}
	return extents, nil
}
