package sandbox

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"sbx.dev/sbx/api"
	"sbx.dev/sbx/internal/runsc"
)

// sparseEntry encodes a sparse entry's content as sbx's runsc does.
func sparseEntry(extents []sparseExtent, data byte) []byte {
	b := strconv.AppendInt(nil, int64(len(extents)), 10)
	b = append(b, '\n')
	for _, e := range extents {
		b = append(strconv.AppendInt(b, e.off, 10), '\n')
		b = append(strconv.AppendInt(b, e.len, 10), '\n')
	}
	if pad := len(b) % 512; pad != 0 {
		b = append(b, make([]byte, 512-pad)...)
	}
	for _, e := range extents {
		b = append(b, bytes.Repeat([]byte{data}, int(e.len))...)
	}
	return b
}

func TestCheckDiskTar(t *testing.T) {
	type entry struct {
		hdr     tar.Header
		content []byte
	}
	sparse := func(name string, real int64, content []byte) entry {
		return entry{tar.Header{Name: name, Typeflag: tar.TypeReg, Mode: 0o644, Size: int64(len(content)),
			PAXRecords: map[string]string{sparseRecord: strconv.FormatInt(real, 10)}}, content}
	}
	good := sparseEntry([]sparseExtent{{0, 10}, {3000000000, 1}}, 'x')
	cases := []struct {
		name    string
		entries []entry
		// hugeFile: a plain entry of that many bytes, written as a hole of
		// the host's file
		hugeFile int64
		limit    int64
		want     string // "" for no error
	}{
		{name: "empty", limit: 16 << 20},
		{name: "a sparse file of 3 GB on 100 MiB", entries: []entry{
			{tar.Header{Name: "./tmp/", Typeflag: tar.TypeDir, Mode: 0o755}, nil},
			sparse("./tmp/sparse", 3000000001, good),
		}, limit: 100 << 20},
		{name: "a terabyte of holes", entries: []entry{sparse("./tera", 1<<40, sparseEntry([]sparseExtent{{1 << 40, 0}}, 0))}, limit: 16 << 20},
		{name: "a plain file of 3 GB on 100 MiB", hugeFile: 3000000001, limit: 100 << 20, want: "its files need 2.8 GiB, more than the sandbox's disk limit of 100.0 MiB"},
		{name: "sparse data past the limit", entries: []entry{sparse("./s", 64<<20, sparseEntry([]sparseExtent{{0, 20 << 20}}, 1))}, limit: 16 << 20, want: "more than the sandbox's disk limit"},
		{name: "extents out of order", entries: []entry{sparse("./s", 100, sparseEntry([]sparseExtent{{50, 10}, {0, 10}}, 1))}, limit: 16 << 20, want: "out of order"},
		{name: "an extent past the size", entries: []entry{sparse("./s", 100, sparseEntry([]sparseExtent{{95, 10}}, 1))}, limit: 16 << 20, want: "past 100"},
		{name: "a map that is not numbers", entries: []entry{sparse("./s", 100, append([]byte("1\n0\nx\n"), make([]byte, 506)...))}, limit: 16 << 20, want: "bad number"},
		{name: "a map without its data", entries: []entry{sparse("./s", 100, sparseEntry([]sparseExtent{{0, 10}}, 1)[:512])}, limit: 16 << 20, want: "in an entry of 512"},
		{name: "a bad size record", entries: []entry{{tar.Header{Name: "./s", Typeflag: tar.TypeReg, PAXRecords: map[string]string{sparseRecord: "-1"}}, nil}}, limit: 16 << 20, want: "bad SBX.sparse.realsize"},
		{name: "an entry the restore does not make", entries: []entry{{tar.Header{Name: "./x", Typeflag: tar.TypeXGlobalHeader, PAXRecords: map[string]string{"a": "b"}}, nil}}, limit: 16 << 20, want: "does not make"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			p := filepath.Join(t.TempDir(), "disk.tar")
			f, err := os.Create(p)
			if err != nil {
				t.Fatal(err)
			}
			tw := tar.NewWriter(f)
			for _, e := range tc.entries {
				if err := tw.WriteHeader(&e.hdr); err != nil {
					t.Fatal(err)
				}
				if _, err := tw.Write(e.content); err != nil {
					t.Fatal(err)
				}
			}
			if tc.hugeFile > 0 {
				if err := tw.WriteHeader(&tar.Header{Name: "./big", Typeflag: tar.TypeReg, Size: tc.hugeFile}); err != nil {
					t.Fatal(err)
				}
				tw.Flush() // the header is out: its content is a hole of the host's file
				off, _ := f.Seek(0, 1)
				if _, err := f.Seek(off+tc.hugeFile+(512-tc.hugeFile%512)%512, 0); err != nil {
					t.Fatal(err)
				}
				tw = tar.NewWriter(f)
			}
			if err := tw.Close(); err != nil {
				t.Fatal(err)
			}
			f.Close()
			err = checkDiskTar(p, tc.limit)
			switch {
			case tc.want == "" && err != nil:
				t.Errorf("got %v, want no error", err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
				t.Errorf("got %v, want an error with %q", err, tc.want)
			}
		})
	}
}

// TestCheckDiskTarCutShort: a capture cut short (a tar without its end, or
// a file without all its content) never passes for restorable.
func TestCheckDiskTarCutShort(t *testing.T) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	content := bytes.Repeat([]byte("y"), 5000)
	if err := tw.WriteHeader(&tar.Header{Name: "./f", Typeflag: tar.TypeReg, Size: int64(len(content))}); err != nil {
		t.Fatal(err)
	}
	tw.Write(content)
	tw.Close()
	for _, cut := range []int{600, 3000, buf.Len() - 1024 - 512} {
		p := filepath.Join(t.TempDir(), "disk.tar")
		if err := os.WriteFile(p, buf.Bytes()[:cut], 0o600); err != nil {
			t.Fatal(err)
		}
		if err := checkDiskTar(p, 16<<20); err == nil || !strings.Contains(err.Error(), "would not restore") {
			t.Errorf("cut at %d of %d: got %v, want would not restore", cut, buf.Len(), err)
		}
	}
}

// hugeTar writes a disk capture holding one plain file of size bytes (a
// hole of the host's file): what an unpatched runsc made of a sparse file.
func hugeTar(file string, size int64) error {
	f, err := os.Create(file)
	if err != nil {
		return err
	}
	defer f.Close()
	tw := tar.NewWriter(f)
	if err := tw.WriteHeader(&tar.Header{Name: "./tmp/sparse", Typeflag: tar.TypeReg, Mode: 0o644, Size: size}); err != nil {
		return err
	}
	tw.Flush()
	off, _ := f.Seek(0, 1)
	if _, err := f.Seek(off+size+(512-size%512)%512, 0); err != nil {
		return err
	}
	return tar.NewWriter(f).Close()
}

// TestCaptureNotRestorable: a disk snapshot or fork whose tar would not
// restore within the sandbox's disk limit, or that passed its bound, fails
// saying why: no snapshot, no child, no image left, the sandbox ready.
func TestCaptureNotRestorable(t *testing.T) {
	ctx := context.Background()
	m, _ := newTestManager(t, 0)
	rt := m.cfg.Runtime.(*fakeRuntime)
	sb, err := m.Create(ctx, api.CreateRequest{Disk: "100M"})
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name string
		tar  func(file string, max int64) error
		says string
	}{
		{"files past the disk limit", func(file string, max int64) error {
			if max != 100<<20+diskTarSlack(100<<20) {
				t.Errorf("the capture's bound is %d, want the limit and its slack, %d", max, 100<<20+diskTarSlack(100<<20))
			}
			return hugeTar(file, 3000000001)
		}, "it would not restore: its files need 2.8 GiB, more than the sandbox's disk limit of 100.0 MiB"},
		{"a tar past its bound", func(file string, max int64) error {
			return &runsc.Error{Verb: "tar", ID: sb.ID, Err: runsc.ErrTarTooBig}
		}, "more than a disk limit of 100.0 MiB allows"},
		{"a tar cut short", func(file string, max int64) error {
			return os.WriteFile(file, []byte("not a tar at all, and short"), 0o600)
		}, "would not restore"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			rt.tar = tc.tar
			defer func() { rt.tar = nil }()
			if _, err := m.Snapshot(ctx, sb.ID, api.SnapshotRequest{Name: "s"}); !errors.Is(err, api.ErrConflict) || !strings.Contains(err.Error(), tc.says) {
				t.Errorf("snapshot: %v, want ErrConflict with %q", err, tc.says)
			}
			if _, err := m.GetSnapshot(ctx, "s"); !errors.Is(err, api.ErrNotFound) {
				t.Errorf("the failed snapshot: %v, want not found", err)
			}
			if _, err := m.Fork(ctx, sb.ID, api.ForkRequest{}, func(api.ForkEvent) error { return nil }); err == nil || !strings.Contains(err.Error(), tc.says) {
				t.Errorf("fork: %v, want an error with %q", err, tc.says)
			}
			if imgs, _ := os.ReadDir(m.images.root); len(imgs) != 0 {
				t.Errorf("images after the failed captures: %v", imgs)
			}
			got, err := m.cfg.Store.Sandbox(ctx, sb.ID)
			if err != nil || got.State != api.StateReady {
				t.Errorf("the sandbox after the failed captures: %+v %v, want ready", got, err)
			}
		})
	}
	if _, err := m.Snapshot(ctx, sb.ID, api.SnapshotRequest{Name: "s"}); err != nil {
		t.Errorf("a snapshot with a good tar: %v", err)
	}
}
