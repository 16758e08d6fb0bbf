package client

import (
	"archive/tar"
	"bytes"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"testing/iotest"

	"sbx.dev/sbx/internal/safetar/tartest"
)

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
			err := extractTar(bytes.NewReader(tartest.Tar(t, tc.entries)), dest, false)
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

// A download never changes the mode of a folder that is there, and what it
// makes gets the umask: a hostile sandbox's 0777 does not reach the host.
func TestExtractModes(t *testing.T) {
	old := syscall.Umask(0o027)
	defer syscall.Umask(old)
	entries := func() []byte {
		var buf bytes.Buffer
		tw := tar.NewWriter(&buf)
		tw.WriteHeader(&tar.Header{Name: "d/", Typeflag: tar.TypeDir, Mode: 0o777})
		tw.WriteHeader(&tar.Header{Name: "d/sub/", Typeflag: tar.TypeDir, Mode: 0o777})
		tw.WriteHeader(&tar.Header{Name: "d/f", Typeflag: tar.TypeReg, Mode: 0o4777, Size: 1})
		tw.Write([]byte("x"))
		tw.Close()
		return buf.Bytes()
	}
	t.Run("existing folder keeps its mode", func(t *testing.T) {
		dest := filepath.Join(t.TempDir(), "mine")
		if err := os.Mkdir(dest, 0o700); err != nil {
			t.Fatal(err)
		}
		if err := extractInto(bytes.NewReader(entries()), dest); err != nil {
			t.Fatal(err)
		}
		checkMode(t, dest, 0o700)
		checkMode(t, filepath.Join(dest, "sub"), 0o750)
		checkMode(t, filepath.Join(dest, "f"), 0o750)
	})
	t.Run("new folder gets the umask", func(t *testing.T) {
		dest := filepath.Join(t.TempDir(), "new")
		if err := extractInto(bytes.NewReader(entries()), dest); err != nil {
			t.Fatal(err)
		}
		checkMode(t, dest, 0o750)
		checkMode(t, filepath.Join(dest, "sub"), 0o750)
	})
	t.Run("a file gets the umask", func(t *testing.T) {
		target := filepath.Join(t.TempDir(), "f")
		if _, err := writeFileAtomic(target, strings.NewReader("x"), 0o777); err != nil {
			t.Fatal(err)
		}
		checkMode(t, target, 0o750)
	})
}

func checkMode(t *testing.T, p string, want fs.FileMode) {
	t.Helper()
	fi, err := os.Lstat(p)
	if err != nil {
		t.Fatal(err)
	}
	if got := fi.Mode() & (fs.ModePerm | fs.ModeSetuid | fs.ModeSetgid | fs.ModeSticky); got != want {
		t.Errorf("%s: mode %v, want %v", filepath.Base(p), got, want)
	}
}

func TestProcessUmask(t *testing.T) {
	old := syscall.Umask(0o037)
	defer syscall.Umask(old)
	if got := processUmask(); got != 0o037 {
		t.Errorf("got %o, want 037", got)
	}
}
