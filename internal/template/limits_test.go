package template

import (
	"archive/tar"
	"compress/gzip"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"sbx.dev/sbx/api"
)

// bombReader is a gzipped tar of one file of size zero bytes, made as it is
// read (nothing of it is held), and how much of it was read.
func bombReader(t *testing.T, size int64) io.Reader {
	t.Helper()
	pr, pw := io.Pipe()
	go func() {
		zw := gzip.NewWriter(pw)
		tw := tar.NewWriter(zw)
		err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: "zeroes", Mode: 0o644, Size: size})
		for left := size; err == nil && left > 0; {
			n := min(left, 1<<20)
			_, err = tw.Write(make([]byte, n))
			left -= n
		}
		if err == nil {
			err = tw.Close()
		}
		if err == nil {
			err = zw.Close()
		}
		pw.CloseWithError(err)
	}()
	return pr
}

func TestImportBounds(t *testing.T) {
	cases := []struct {
		name   string
		limits ImportLimits
		size   int64
		kind   error
		says   string
	}{
		{"a bomb past the layer limit", ImportLimits{Layer: 8 << 20}, 1 << 30, api.ErrInvalid, "more than 8.0 MiB, the layer limit (sbxd --max-layer-size)"},
		{"a bomb past the image limit", ImportLimits{Layer: 64 << 20, Image: 4 << 20}, 1 << 30, api.ErrInvalid, "more than 4.0 MiB, the image limit (sbxd --max-image-size)"},
		{"less free space than the reserve", ImportLimits{Reserve: 1 << 50}, 1 << 20, api.ErrUnavailable, "less than the 1048576.0 GiB sbxd keeps"},
		{"within the limits", ImportLimits{Layer: 8 << 20, Image: 8 << 20, Reserve: 1 << 20}, 4 << 20, nil, ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			s, dir := openStore(t)
			s.SetImportLimits(tc.limits)
			start := time.Now()
			_, err := s.Import(context.Background(), "bomb", bombReader(t, tc.size), false, nil)
			if tc.kind == nil {
				if err != nil {
					t.Fatalf("got %v, want no error", err)
				}
				return
			}
			if !errors.Is(err, tc.kind) || !strings.Contains(err.Error(), tc.says) {
				t.Fatalf("got %v, want %v saying %q", err, tc.kind, tc.says)
			}
			if took := time.Since(start); took > 20*time.Second {
				t.Errorf("refused after %v: not early", took)
			}
			noLeftovers(t, dir)
		})
	}
}

// TestPutLayerBound: a layer past the layer limit is refused before its
// diff ID is ever compared, and leaves nothing.
func TestPutLayerBound(t *testing.T) {
	s, dir := openStore(t)
	s.SetImportLimits(ImportLimits{Layer: 8 << 20})
	_, err := s.PutLayer(context.Background(), "sha256:"+strings.Repeat("0", 64), bombReader(t, 1<<30), nil)
	if !errors.Is(err, api.ErrInvalid) || !strings.Contains(err.Error(), "--max-layer-size") {
		t.Fatalf("got %v, want ErrInvalid naming --max-layer-size", err)
	}
	noLeftovers(t, dir)
	if got := entries(t, filepath.Join(dir, "layers")); len(got) != 0 {
		t.Errorf("layers holds %q, want nothing", got)
	}
}

// TestImportDirsSpill: directories past the in-memory budget are recorded
// in a file beside the rootfs and still get their modes and times, the
// last entry naming a path winning; the file is gone afterwards.
func TestImportDirsSpill(t *testing.T) {
	defer func(old int) { maxCache = old }(maxCache)
	maxCache = 64 // a path or two in memory, the rest spilled
	var es []entry
	for i := range 40 {
		h := dir(fmt.Sprintf("d%02d/", i%10), 0o700+int64(i%8))
		h.ModTime = time.Unix(int64(1000+i), 0)
		es = append(es, entry{hdr: h})
		es = append(es, entry{hdr: file(fmt.Sprintf("d%02d/f%d", i%10, i), 0o644), body: "x"})
	}
	es = append(es, entry{hdr: file("bin/sh", 0o755), body: "x"})
	s, sdir := openStore(t)
	tm, err := s.Import(context.Background(), "spill", tarOf(t, false, es), false, nil)
	if err != nil {
		t.Fatal(err)
	}
	rootfs, err := s.Rootfs(tm.Name)
	if err != nil {
		t.Fatal(err)
	}
	for d := range 10 {
		last := 30 + d // the last of the four entries naming d
		fi, err := os.Stat(filepath.Join(rootfs, fmt.Sprintf("d%02d", d)))
		if err != nil {
			t.Fatal(err)
		}
		if got, want := fi.Mode().Perm(), os.FileMode(0o700+last%8); got != want {
			t.Errorf("d%02d: mode %v, want %v", d, got, want)
		}
		if got, want := fi.ModTime().Unix(), int64(1000+last); got != want {
			t.Errorf("d%02d: time %d, want %d", d, got, want)
		}
	}
	if got := entries(t, filepath.Join(sdir, "tmp")); len(got) != 0 {
		t.Errorf("tmp holds %q after the import, want nothing", got)
	}
}

func TestBudgetFree(t *testing.T) {
	var st syscall.Statfs_t
	if err := syscall.Statfs(t.TempDir(), &st); err != nil {
		t.Fatal(err)
	}
	free := int64(st.Bavail) * st.Bsize
	b := &budget{dir: t.TempDir(), reserve: free / 2}
	if err := b.add(1); err != nil {
		t.Errorf("half the free space as the reserve: %v", err)
	}
	b = &budget{dir: t.TempDir(), reserve: free * 2}
	if err := b.add(1); !errors.Is(err, errTooBig) || !errors.Is(err, api.ErrUnavailable) {
		t.Errorf("twice the free space as the reserve: %v, want too big and unavailable", err)
	}
}
