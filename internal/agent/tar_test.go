package agent

import (
	"archive/tar"
	"bytes"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// treeEntry is what a round trip must keep of one file.
type treeEntry struct {
	mode    fs.FileMode
	content string
	link    string
	mtime   time.Time
	uid     uint32
	ino     uint64
}

// readTree describes every file under root, by relative path. Hard links
// show as the same ino being shared; the number is made relative.
func readTree(t *testing.T, root string) map[string]treeEntry {
	t.Helper()
	tree := map[string]treeEntry{}
	inos := map[uint64]uint64{}
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, p)
		st := fi.Sys().(*syscall.Stat_t)
		e := treeEntry{mode: fi.Mode(), uid: st.Uid}
		if !fi.IsDir() {
			e.mtime = fi.ModTime() // a directory's own is checked separately
		}
		if _, ok := inos[st.Ino]; !ok {
			inos[st.Ino] = uint64(len(inos))
		}
		e.ino = inos[st.Ino]
		switch {
		case fi.Mode()&fs.ModeSymlink != 0:
			e.link, err = os.Readlink(p)
		case fi.Mode().IsRegular():
			var b []byte
			b, err = os.ReadFile(p)
			e.content = string(b)
		}
		tree[rel] = e
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return tree
}

func TestTarRoundTrip(t *testing.T) {
	src := filepath.Join(t.TempDir(), "project")
	mtime := time.Date(2023, 5, 6, 7, 8, 9, 123456789, time.UTC)
	writeFile(t, filepath.Join(src, "a.txt"), "alpha", 0o640)
	writeFile(t, filepath.Join(src, "sub", "run.sh"), "#!/bin/sh\n", 0o755)
	writeFile(t, filepath.Join(src, "sub", "deeper", "empty"), "", 0o600)
	for _, link := range []struct{ target, name string }{
		{"a.txt", "link"}, {"/etc/passwd", "sub/abs-link"}, {"missing", "dangling"},
	} {
		if err := os.Symlink(link.target, filepath.Join(src, link.name)); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Link(filepath.Join(src, "a.txt"), filepath.Join(src, "sub", "hard")); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(filepath.Join(src, "private"), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(filepath.Join(src, "sub", "run.sh"), 1234, 1234); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{"a.txt", "sub/run.sh", "sub", "private", ""} {
		if err := os.Chtimes(filepath.Join(src, p), mtime, mtime); err != nil {
			t.Fatal(err)
		}
	}

	code, archive, stderr := run(t, nil, "get", "--tar", src)
	if code != 0 {
		t.Fatalf("get --tar: exit code %d: %s", code, stderr)
	}
	names := tarNames(t, []byte(archive))
	if names[0] != "project/" || !strings.Contains(strings.Join(names, " "), "project/sub/run.sh") {
		t.Errorf("entry names: got %v, want them to start at project/", names)
	}
	want := readTree(t, src)

	for _, tc := range []struct {
		name  string
		exist bool
	}{{"into a new directory", false}, {"into an existing directory", true}} {
		t.Run(tc.name, func(t *testing.T) {
			parent := t.TempDir()
			dst := filepath.Join(parent, "out")
			if tc.exist {
				// old content is replaced, other files stay
				writeFile(t, filepath.Join(dst, "project", "a.txt"), "stale", 0o666)
				writeFile(t, filepath.Join(dst, "keep"), "kept", 0o644)
			}
			code, _, stderr := run(t, strings.NewReader(archive), "untar", dst)
			if code != 0 {
				t.Fatalf("untar: exit code %d: %s", code, stderr)
			}
			got := readTree(t, filepath.Join(dst, "project"))
			for name, w := range want {
				if g, ok := got[name]; !ok {
					t.Errorf("%s: missing", name)
				} else if g != w {
					t.Errorf("%s: got %+v, want %+v", name, g, w)
				}
			}
			for name := range got {
				if _, ok := want[name]; !ok {
					t.Errorf("%s: unexpected", name)
				}
			}
			for _, d := range []string{"sub", "private", "."} {
				fi, err := os.Stat(filepath.Join(dst, "project", d))
				if err != nil {
					t.Fatal(err)
				}
				if !fi.ModTime().Equal(mtime) {
					t.Errorf("%s: mtime: got %s, want %s", d, fi.ModTime(), mtime)
				}
			}
			if tc.exist {
				if b, _ := os.ReadFile(filepath.Join(dst, "keep")); string(b) != "kept" {
					t.Errorf("keep: got %q, want %q", b, "kept")
				}
			}
			if tmp := tempFiles(t, parent); len(tmp) > 0 {
				t.Errorf("temporary files left behind: %v", tmp)
			}
			if tmp := tempFiles(t, filepath.Join(dst, "project")); len(tmp) > 0 {
				t.Errorf("temporary files left behind: %v", tmp)
			}
		})
	}
}

func TestGetTarOfFile(t *testing.T) {
	dir := t.TempDir()
	writeFile(t, filepath.Join(dir, "one"), "1", 0o644)
	_, archive, _ := run(t, nil, "get", "--tar", dir+"/one")
	if got := tarNames(t, []byte(archive)); len(got) != 1 || got[0] != "one" {
		t.Errorf("entry names: got %v, want [one]", got)
	}
	if code, _, _ := run(t, nil, "get", "--tar", dir+"/nope"); code != ExitNotFound {
		t.Errorf("missing: exit code %d, want %d", code, ExitNotFound)
	}
}

func tarNames(t *testing.T, archive []byte) []string {
	t.Helper()
	tr := tar.NewReader(bytes.NewReader(archive))
	var names []string
	for {
		hdr, err := tr.Next()
		if err != nil {
			break
		}
		names = append(names, hdr.Name)
	}
	return names
}

// tarOf builds an archive from headers; regular files get their Name as content.
func tarOf(t *testing.T, hdrs ...tar.Header) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, h := range hdrs {
		if h.Mode == 0 {
			h.Mode = 0o644
		}
		var body []byte
		if h.Typeflag == tar.TypeReg {
			body = []byte(h.Name)
			h.Size = int64(len(body))
		}
		if err := tw.WriteHeader(&h); err != nil {
			t.Fatal(err)
		}
		if _, err := tw.Write(body); err != nil {
			t.Fatal(err)
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

func TestUntarRejects(t *testing.T) {
	reg := func(name string) tar.Header { return tar.Header{Name: name, Typeflag: tar.TypeReg} }
	tests := []struct {
		name    string
		hdrs    []tar.Header
		exist   bool // extract into an existing directory
		setup   func(t *testing.T, dst, outside string)
		wantErr string
	}{
		{name: "dot dot", hdrs: []tar.Header{reg("../x")}, wantErr: `tar entry ../x: ".." is not allowed`},
		{name: "dot dot inside", hdrs: []tar.Header{reg("a/../../x")}, wantErr: `tar entry a/../../x: ".." is not allowed`},
		{name: "absolute", hdrs: []tar.Header{reg("/abs")}, wantErr: "tar entry /abs: absolute names are not allowed"},
		{name: "dot dot hard link", hdrs: []tar.Header{{Name: "h", Typeflag: tar.TypeLink, Linkname: "../x"}}, wantErr: "bad hard link target"},
		{name: "under a symlink in the archive", exist: false,
			hdrs:    []tar.Header{{Name: "l", Typeflag: tar.TypeSymlink, Linkname: "OUTSIDE"}, reg("l/x")},
			wantErr: "tar entry l/x: its parent l is a symbolic link"},
		{name: "under a symlink already there", exist: true,
			setup: func(t *testing.T, dst, outside string) {
				if err := os.Symlink(outside, filepath.Join(dst, "l")); err != nil {
					t.Fatal(err)
				}
			},
			hdrs:    []tar.Header{reg("ok"), reg("l/sub/x")},
			wantErr: "tar entry l/sub/x: its parent l is a symbolic link"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			parent, outside := t.TempDir(), t.TempDir()
			dst := filepath.Join(parent, "dst")
			if tc.exist {
				if err := os.Mkdir(dst, 0o755); err != nil {
					t.Fatal(err)
				}
			}
			if tc.setup != nil {
				tc.setup(t, dst, outside)
			}
			for i := range tc.hdrs {
				tc.hdrs[i].Linkname = strings.ReplaceAll(tc.hdrs[i].Linkname, "OUTSIDE", outside)
			}
			code, _, stderr := run(t, bytes.NewReader(tarOf(t, tc.hdrs...)), "untar", dst)
			if code != ExitInvalid {
				t.Errorf("exit code: got %d, want %d (stderr %q)", code, ExitInvalid, stderr)
			}
			if !strings.Contains(stderr, tc.wantErr) {
				t.Errorf("stderr: got %q, want it to contain %q", stderr, tc.wantErr)
			}
			if ents, _ := os.ReadDir(outside); len(ents) > 0 {
				t.Errorf("wrote outside the destination: %v", ents)
			}
			if _, err := os.Stat(filepath.Join(parent, "x")); err == nil {
				t.Errorf("wrote %s", filepath.Join(parent, "x"))
			}
			if _, err := os.Lstat(dst); !tc.exist && err == nil {
				t.Errorf("%s exists after a failed untar into a new directory", dst)
			}
			if tmp := tempFiles(t, parent); len(tmp) > 0 {
				t.Errorf("temporary files left behind: %v", tmp)
			}
		})
	}
}

func TestUntarDestination(t *testing.T) {
	dir := t.TempDir()
	writeFile(t, filepath.Join(dir, "file"), "", 0o644)
	archive := tarOf(t, tar.Header{Name: "x", Typeflag: tar.TypeReg})
	tests := []struct {
		name    string
		dst     string
		code    int
		wantErr string
	}{
		{"missing parent", dir + "/no/dst", ExitNotFound, "directory " + dir + "/no does not exist"},
		{"destination is a file", dir + "/file", ExitInvalid, "is not a directory"},
		{"relative", "dst", ExitInvalid, "not absolute"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			code, _, stderr := run(t, bytes.NewReader(archive), "untar", tc.dst)
			if code != tc.code {
				t.Errorf("exit code: got %d, want %d (stderr %q)", code, tc.code, stderr)
			}
			if !strings.Contains(stderr, tc.wantErr) {
				t.Errorf("stderr: got %q, want it to contain %q", stderr, tc.wantErr)
			}
		})
	}
	// a sender that goes away leaves an archive cut anywhere: mid-header,
	// mid-data, in the padding, between entries or inside the end marker
	for _, cut := range []int{300, 512, 513, 700, 1024, 1536, 2047} {
		t.Run(fmt.Sprintf("cut at %d leaves nothing", cut), func(t *testing.T) {
			code, _, stderr := run(t, bytes.NewReader(archive[:cut]), "untar", dir+"/new")
			if code == 0 {
				t.Errorf("exit code: got 0, want non-zero")
			}
			if !strings.Contains(stderr, "read tar") && !strings.Contains(stderr, "tar entry x") {
				t.Errorf("stderr: got %q, want a read error", stderr)
			}
			if _, err := os.Lstat(dir + "/new"); err == nil {
				t.Errorf("%s/new exists after a failed untar", dir)
			}
			if tmp := tempFiles(t, dir); len(tmp) > 0 {
				t.Errorf("temporary files left behind: %v", tmp)
			}
		})
	}
}

func TestUntarGNUTar(t *testing.T) {
	gnuTar, err := exec.LookPath("tar")
	if err != nil {
		t.Skip("no tar(1)")
	}
	src, dst := t.TempDir(), filepath.Join(t.TempDir(), "dst")
	writeFile(t, filepath.Join(src, "d", "f"), "data", 0o600)
	// "./"-prefixed names and a 10 KiB record padded with zeros
	out, err := exec.Command(gnuTar, "-C", src, "-cf", "-", ".").Output()
	if err != nil {
		t.Fatal(err)
	}
	if code, _, stderr := run(t, bytes.NewReader(out), "untar", dst); code != 0 {
		t.Fatalf("untar: exit code %d: %s", code, stderr)
	}
	if b, err := os.ReadFile(filepath.Join(dst, "d", "f")); err != nil || string(b) != "data" {
		t.Errorf("d/f: got %q, %v; want %q", b, err, "data")
	}
}
