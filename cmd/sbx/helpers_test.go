package main

import (
	"archive/tar"
	"bytes"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"testing/iotest"
	"time"

	"github.com/google/go-cmp/cmp"
)

func TestClassifyScp(t *testing.T) {
	tests := []struct {
		name, src, dst string
		wantSrc        scpPath
		wantDst        scpPath
		wantErr        bool
	}{
		{"upload", "a.txt", "sb_1:/tmp/", scpPath{path: "a.txt"}, scpPath{"sb_1", "/tmp/"}, false},
		{"download", "sb_1:/etc/hosts", ".", scpPath{"sb_1", "/etc/hosts"}, scpPath{path: "."}, false},
		{"named sandbox", "web:/x", "/tmp/y", scpPath{"web", "/x"}, scpPath{path: "/tmp/y"}, false},
		{"local with colon", "./a:b", "sb_1:/x", scpPath{path: "./a:b"}, scpPath{"sb_1", "/x"}, false},
		{"local dir with colon", "dir/a:b", "sb_1:/x", scpPath{path: "dir/a:b"}, scpPath{"sb_1", "/x"}, false},
		{"both local", "a", "b", scpPath{}, scpPath{}, true},
		{"both remote", "sb_1:/a", "sb_2:/b", scpPath{}, scpPath{}, true},
		{"empty remote path", "a", "sb_1:", scpPath{}, scpPath{}, true},
		{"leading colon is local", ":x", "sb_1:/x", scpPath{path: ":x"}, scpPath{"sb_1", "/x"}, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s, d, err := classifyScp(tc.src, tc.dst)
			if tc.wantErr {
				var ue *usageError
				if !errors.As(err, &ue) {
					t.Fatalf("got %v, want a usage error", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if s != tc.wantSrc || d != tc.wantDst {
				t.Errorf("got %+v %+v, want %+v %+v", s, d, tc.wantSrc, tc.wantDst)
			}
		})
	}
}

func TestShellWrap(t *testing.T) {
	tests := []struct {
		name string
		in   []string
		want []string
	}{
		{"plain word", []string{"ls"}, []string{"ls"}},
		{"argv", []string{"ls", "-l", "a b"}, []string{"ls", "-l", "a b"}},
		{"spaces", []string{"ls -l"}, []string{"/bin/sh", "-c", "ls -l"}},
		{"pipe", []string{"a|b"}, []string{"/bin/sh", "-c", "a|b"}},
		{"variable", []string{"echo$HOME"}, []string{"/bin/sh", "-c", "echo$HOME"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if diff := cmp.Diff(tc.want, shellWrap(tc.in)); diff != "" {
				t.Errorf("(-want +got):\n%s", diff)
			}
		})
	}
}

func TestParseMode(t *testing.T) {
	tests := []struct {
		in   string
		want os.FileMode
		ok   bool
	}{
		{"0644", 0o644, true},
		{"100755", 0o755, true},
		{"-rwxr-x---", 0o750, true},
		{"drwxrwxrwt", 0o777, true},
		{"-rw-r--r--", 0o644, true},
		{"bogus", 0, false},
	}
	for _, tc := range tests {
		t.Run(tc.in, func(t *testing.T) {
			got, ok := parseMode(tc.in)
			if got != tc.want || ok != tc.ok {
				t.Errorf("got %v %v, want %v %v", got, ok, tc.want, tc.ok)
			}
		})
	}
}

func TestAge(t *testing.T) {
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	tests := []struct {
		d    time.Duration
		want string
	}{{5 * time.Second, "5s"}, {3 * time.Minute, "3m"}, {5 * time.Hour, "5h"}, {72 * time.Hour, "3d"}}
	for _, tc := range tests {
		if got := age(now, now.Add(-tc.d)); got != tc.want {
			t.Errorf("age(%v) got %q, want %q", tc.d, got, tc.want)
		}
	}
}

// mkTar returns a tar of the given entries; a name ending in "/" is a directory,
// a value starting with "->" a symlink.
func mkTar(t *testing.T, entries [][2]string) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, en := range entries {
		name, body := en[0], en[1]
		hdr := &tar.Header{Name: name, Mode: 0o644, Size: int64(len(body)), Typeflag: tar.TypeReg}
		switch {
		case strings.HasSuffix(name, "/"):
			hdr.Typeflag, hdr.Mode, hdr.Size = tar.TypeDir, 0o755, 0
		case strings.HasPrefix(body, "->"):
			hdr.Typeflag, hdr.Linkname, hdr.Size = tar.TypeSymlink, body[2:], 0
		}
		if err := tw.WriteHeader(hdr); err != nil {
			t.Fatal(err)
		}
		if hdr.Typeflag == tar.TypeReg {
			tw.Write([]byte(body))
		}
	}
	tw.Close()
	return buf.Bytes()
}

func TestExtractTar(t *testing.T) {
	tests := []struct {
		name    string
		entries [][2]string
		wantErr string
	}{
		{"ok", [][2]string{{"proj/", ""}, {"proj/a.txt", "A"}, {"proj/sub/b", "B"}, {"proj/l", "->a.txt"}}, ""},
		{"dotdot", [][2]string{{"proj/", ""}, {"proj/../x", "evil"}}, "leaves"},
		{"bare dotdot", [][2]string{{"../x", "evil"}}, "leaves"},
		{"absolute", [][2]string{{"/etc/x", "evil"}}, "absolute"},
		{"through symlink", [][2]string{{"proj/", ""}, {"proj/out", "->/tmp"}, {"proj/out/x", "evil"}}, "symlink"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			dest := t.TempDir()
			err := extractTar(bytes.NewReader(mkTar(t, tc.entries)), dest)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("got %v, want an error containing %q", err, tc.wantErr)
				}
				if _, err := os.Stat(filepath.Join(filepath.Dir(dest), "x")); err == nil {
					t.Error("x written outside dest")
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			for name, want := range map[string]string{"a.txt": "A", "sub/b": "B", "l": "A"} {
				got, err := os.ReadFile(filepath.Join(dest, name))
				if err != nil || string(got) != want {
					t.Errorf("%s: got %q %v, want %q", name, got, err, want)
				}
			}
		})
	}
}

func TestWriteTarRoundTrip(t *testing.T) {
	src := t.TempDir()
	os.MkdirAll(filepath.Join(src, "sub"), 0o755)
	os.WriteFile(filepath.Join(src, "a"), []byte("A"), 0o600)
	os.WriteFile(filepath.Join(src, "sub", "b"), []byte("B"), 0o644)
	os.Symlink("a", filepath.Join(src, "link"))
	var buf bytes.Buffer
	if err := writeTar(&buf, src); err != nil {
		t.Fatal(err)
	}
	var names []string
	tr := tar.NewReader(&buf)
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		n := hdr.Name
		if hdr.Typeflag == tar.TypeSymlink {
			n += " -> " + hdr.Linkname
		}
		names = append(names, n)
	}
	want := []string{"a", "link -> a", "sub/", "sub/b"}
	if diff := cmp.Diff(want, names); diff != "" {
		t.Errorf("entries (-want +got):\n%s", diff)
	}
}

func TestWriteFileAtomicFailure(t *testing.T) {
	dir := t.TempDir()
	target := filepath.Join(dir, "out")
	r := io.MultiReader(strings.NewReader("half of it"), iotest.ErrReader(io.ErrUnexpectedEOF))
	if _, err := writeFileAtomic(target, r, 0o644); err == nil {
		t.Fatal("got no error for a failed read")
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 0 {
		t.Errorf("left %v behind, want nothing", ents)
	}
	if _, err := writeFileAtomic(target, strings.NewReader("whole"), 0o640); err != nil {
		t.Fatal(err)
	}
	if got, _ := os.ReadFile(target); string(got) != "whole" {
		t.Errorf("got %q, want %q", got, "whole")
	}
}
