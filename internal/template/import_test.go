package template

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"errors"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"sbx.dev/sbx/api"
)

type entry struct {
	hdr  *tar.Header
	body string
}

var mtime = time.Date(2024, 5, 6, 7, 8, 9, 0, time.UTC)

func dir(name string, mode int64) *tar.Header {
	return &tar.Header{Typeflag: tar.TypeDir, Name: name, Mode: mode, ModTime: mtime}
}

func file(name string, mode int64) *tar.Header {
	return &tar.Header{Typeflag: tar.TypeReg, Name: name, Mode: mode, ModTime: mtime}
}

func symlink(name, target string) *tar.Header {
	return &tar.Header{Typeflag: tar.TypeSymlink, Name: name, Linkname: target, Mode: 0o777, ModTime: mtime}
}

func hardlink(name, target string) *tar.Header {
	return &tar.Header{Typeflag: tar.TypeLink, Name: name, Linkname: target, ModTime: mtime}
}

func tarBytes(t *testing.T, gz bool, es []entry) []byte {
	t.Helper()
	var buf bytes.Buffer
	var w io.Writer = &buf
	var zw *gzip.Writer
	if gz {
		zw = gzip.NewWriter(&buf)
		w = zw
	}
	tw := tar.NewWriter(w)
	for _, e := range es {
		if e.hdr.Typeflag == tar.TypeReg {
			e.hdr.Size = int64(len(e.body))
		}
		if err := tw.WriteHeader(e.hdr); err != nil {
			t.Fatal(err)
		}
		if _, err := io.WriteString(tw, e.body); err != nil {
			t.Fatal(err)
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	if zw != nil {
		if err := zw.Close(); err != nil {
			t.Fatal(err)
		}
	}
	return buf.Bytes()
}

func tarOf(t *testing.T, gz bool, es []entry) io.Reader {
	return bytes.NewReader(tarBytes(t, gz, es))
}

func TestImport(t *testing.T) {
	owned := file("home/user/notes", 0o600)
	owned.Uid, owned.Gid = 1000, 1001
	es := []entry{
		{hdr: dir("./", 0o755)},
		{hdr: dir("bin/", 0o755)},
		{hdr: file("bin/tool", 0o4755), body: "#!/bin/sh\necho tool\n"},
		{hdr: symlink("bin/alias", "tool")},
		{hdr: symlink("bin/abs", "/bin/tool")},
		{hdr: hardlink("bin/hard", "bin/tool")},
		{hdr: dir("etc/", 0o755)},
		{hdr: file("etc/motd", 0o640), body: "welcome\n"},
		{hdr: file("/etc/absolute", 0o644), body: "abs\n"},
		{hdr: file("deep/no/parents/file", 0o644), body: "deep\n"}, // parents not in the archive
		{hdr: dir("ro/", 0o555)},
		{hdr: file("ro/inside", 0o444), body: "ro\n"},
		{hdr: owned, body: "mine\n"},
		{hdr: &tar.Header{Typeflag: tar.TypeChar, Name: "dev/null", Mode: 0o666, Devmajor: 1, Devminor: 3}},
	}
	for _, gz := range []bool{false, true} {
		t.Run(map[bool]string{false: "plain", true: "gzip"}[gz], func(t *testing.T) {
			s, dir := openStore(t)
			var rec recorder
			tmpl, err := s.Import(context.Background(), "imp", tarOf(t, gz, es), false, rec.add)
			if err != nil {
				t.Fatalf("Import: %v", err)
			}
			if tmpl.Name != "imp" || tmpl.Source != "import" || tmpl.Size <= 0 {
				t.Errorf("Import = %+v", tmpl)
			}
			if !rec.has("skipping device node dev/null") {
				t.Errorf("progress %q, want a note on dev/null", rec.msgs)
			}
			rootfs, err := s.Rootfs("imp")
			if err != nil {
				t.Fatal(err)
			}
			if want := filepath.Join(dir, "versions", digestDir(tmpl.Version), "rootfs"); rootfs != want {
				t.Errorf("Rootfs = %q, want %q", rootfs, want)
			}
			files := []struct {
				path string
				mode fs.FileMode
				body string
			}{
				{"bin/tool", 0o755 | fs.ModeSetuid, "#!/bin/sh\necho tool\n"},
				{"etc/motd", 0o640, "welcome\n"},
				{"etc/absolute", 0o644, "abs\n"},
				{"deep/no/parents/file", 0o644, "deep\n"},
				{"ro/inside", 0o444, "ro\n"},
				{"home/user/notes", 0o600, "mine\n"},
			}
			for _, f := range files {
				p := filepath.Join(rootfs, f.path)
				fi, err := os.Lstat(p)
				if err != nil {
					t.Errorf("%s: %v", f.path, err)
					continue
				}
				if got := fi.Mode() & (fs.ModePerm | fs.ModeSetuid | fs.ModeType); got != f.mode {
					t.Errorf("%s mode = %v, want %v", f.path, got, f.mode)
				}
				if !fi.ModTime().Equal(mtime) {
					t.Errorf("%s mtime = %v, want %v", f.path, fi.ModTime(), mtime)
				}
				if b, _ := os.ReadFile(p); string(b) != f.body {
					t.Errorf("%s = %q, want %q", f.path, b, f.body)
				}
			}
			for _, l := range []struct{ path, target string }{{"bin/alias", "tool"}, {"bin/abs", "/bin/tool"}} {
				if got, err := os.Readlink(filepath.Join(rootfs, l.path)); err != nil || got != l.target {
					t.Errorf("readlink %s = %q, %v; want %q", l.path, got, err, l.target)
				}
			}
			a, _ := os.Stat(filepath.Join(rootfs, "bin/tool"))
			b, err := os.Stat(filepath.Join(rootfs, "bin/hard"))
			if err != nil || !os.SameFile(a, b) {
				t.Errorf("bin/hard is not a hard link of bin/tool: %v", err)
			}
			if fi, err := os.Stat(filepath.Join(rootfs, "ro")); err != nil || fi.Mode().Perm() != 0o555 || !fi.ModTime().Equal(mtime) {
				t.Errorf("ro/: %v, %v; want mode 0555 and the archive's mtime", fi.Mode(), err)
			}
			if os.Geteuid() == 0 {
				fi, _ := os.Lstat(filepath.Join(rootfs, "home/user/notes"))
				st := fi.Sys().(*syscall.Stat_t)
				if st.Uid != 1000 || st.Gid != 1001 {
					t.Errorf("home/user/notes owner = %d:%d, want 1000:1001", st.Uid, st.Gid)
				}
			}
			if _, err := os.Lstat(filepath.Join(rootfs, "dev/null")); !errors.Is(err, fs.ErrNotExist) {
				t.Errorf("dev/null was created: %v", err)
			}
			checkSkeleton(t, rootfs)

			_, err = s.Import(context.Background(), "imp", tarOf(t, gz, es), false, nil)
			if !errors.Is(err, api.ErrConflict) {
				t.Errorf("second Import = %v, want api.ErrConflict", err)
			}
		})
	}
}

func TestImportRejects(t *testing.T) {
	host := t.TempDir() // stands for any host directory a symlink may point at
	tests := []struct {
		name  string
		es    []entry
		says  string
		check string // a host path that must not exist afterwards
	}{
		{
			name: "dotdot",
			es:   []entry{{hdr: file("../evil", 0o644), body: "x"}},
			says: `entry "../evil"`,
		},
		{
			name: "dotdot inside",
			es:   []entry{{hdr: dir("a/", 0o755)}, {hdr: file("a/../../evil", 0o644), body: "x"}},
			says: `entry "a/../../evil"`,
		},
		{
			name:  "absolute symlink parent",
			es:    []entry{{hdr: symlink("link", host)}, {hdr: file("link/x", 0o644), body: "x"}},
			says:  `entry "link/x"`,
			check: filepath.Join(host, "x"),
		},
		{
			name:  "relative symlink parent",
			es:    []entry{{hdr: symlink("up", "../../../../../../../.."+host)}, {hdr: file("up/y", 0o644), body: "x"}},
			says:  `entry "up/y"`,
			check: filepath.Join(host, "y"),
		},
		{
			name:  "symlink parent of a directory",
			es:    []entry{{hdr: symlink("link", host)}, {hdr: dir("link/sub/", 0o755)}},
			says:  `entry "link/sub/"`,
			check: filepath.Join(host, "sub"),
		},
		{
			name: "hard link out",
			es:   []entry{{hdr: hardlink("passwd", "../../../etc/passwd")}},
			says: `entry "passwd"`,
		},
		{
			name: "hard link through a symlink",
			es:   []entry{{hdr: symlink("etc", "/etc")}, {hdr: hardlink("passwd", "etc/passwd")}},
			says: `entry "passwd"`,
		},
		{
			name: "hard link to a missing file",
			es:   []entry{{hdr: hardlink("passwd", "/etc/passwd")}},
			says: "not in the archive",
		},
		{
			name: "not a tar",
			es:   nil,
			says: "empty",
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s, dir := openStore(t)
			_, err := s.Import(context.Background(), "bad", tarOf(t, false, tc.es), false, nil)
			if !errors.Is(err, api.ErrInvalid) {
				t.Fatalf("Import = %v, want api.ErrInvalid", err)
			}
			if !strings.Contains(err.Error(), tc.says) {
				t.Errorf("Import = %q, want it to say %s", err, tc.says)
			}
			noLeftovers(t, dir)
			if _, err := s.Get("bad"); !errors.Is(err, api.ErrNotFound) {
				t.Errorf("Get = %v, want api.ErrNotFound", err)
			}
			for _, p := range []string{tc.check, filepath.Join(filepath.Dir(dir), "evil"), filepath.Join(dir, "evil")} {
				if p == "" {
					continue
				}
				if _, err := os.Lstat(p); !errors.Is(err, fs.ErrNotExist) {
					t.Errorf("host path %s was touched: %v", p, err)
				}
			}
		})
	}
	if es, _ := os.ReadDir(host); len(es) != 0 {
		t.Errorf("host directory holds %d entries, want none", len(es))
	}
}

// cancelAfter cancels once n bytes have been read through it.
type cancelAfter struct {
	r      io.Reader
	n      int
	cancel context.CancelFunc
}

func (c *cancelAfter) Read(p []byte) (int, error) {
	if c.n <= 0 {
		c.cancel()
	}
	if len(p) > 512 {
		p = p[:512]
	}
	n, err := c.r.Read(p)
	c.n -= n
	return n, err
}

func TestImportCancel(t *testing.T) {
	es := []entry{{hdr: dir("etc/", 0o755)}}
	for i := range 50 {
		es = append(es, entry{hdr: file("etc/f"+strings.Repeat("x", i), 0o644), body: strings.Repeat("data", 1000)})
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	s, sdir := openStore(t)
	r := &cancelAfter{r: tarOf(t, false, es), n: 20000, cancel: cancel}
	_, err := s.Import(ctx, "cancelled", r, false, nil)
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("Import = %v, want context.Canceled", err)
	}
	noLeftovers(t, sdir)
}
