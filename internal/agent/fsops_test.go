package agent

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestMkdirRmMv(t *testing.T) {
	dir := t.TempDir()
	writeFile(t, filepath.Join(dir, "f"), "x", 0o644)
	must := func(t *testing.T, args ...string) {
		t.Helper()
		if code, _, stderr := run(t, nil, args...); code != ExitOK {
			t.Fatalf("%v: exit %d: %s", args, code, stderr)
		}
	}
	tests := []struct {
		name    string
		args    []string
		code    int
		wantErr string
	}{
		{"mkdir -p", []string{"mkdir", dir + "/a/b/c"}, ExitOK, ""},
		{"mkdir of an existing directory", []string{"mkdir", dir + "/a/b"}, ExitOK, ""},
		{"mkdir over a file", []string{"mkdir", dir + "/f"}, ExitExists, "not a directory"},
		{"mkdir under a file", []string{"mkdir", dir + "/f/x"}, ExitInvalid, "not a directory"},
		{"mkdir bad mode", []string{"mkdir", "--mode", "9", dir + "/m"}, ExitInvalid, "bad --mode"},
		{"mkdir relative", []string{"mkdir", "rel"}, ExitInvalid, "not absolute"},
		{"rm a non-empty directory", []string{"rm", dir + "/a"}, ExitExists, "not empty"},
		{"rm missing", []string{"rm", dir + "/nope"}, ExitNotFound, "does not exist"},
		{"rm -r missing is fine", []string{"rm", "-r", dir + "/nope"}, ExitOK, ""},
		{"rm /", []string{"rm", "-r", "/"}, ExitInvalid, "refusing"},
		{"mv missing", []string{"mv", dir + "/nope", dir + "/x"}, ExitNotFound, "does not exist"},
		{"mv into itself", []string{"mv", dir + "/a", dir + "/a/b/c/d"}, ExitInvalid, "into itself"},
		{"mv wants two paths", []string{"mv", dir + "/a"}, ExitInvalid, "want 2"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			code, _, stderr := run(t, nil, tc.args...)
			if code != tc.code {
				t.Errorf("exit code: got %d, want %d (stderr %q)", code, tc.code, stderr)
			}
			if !strings.Contains(stderr, tc.wantErr) {
				t.Errorf("stderr: got %q, want it to contain %q", stderr, tc.wantErr)
			}
		})
	}
	t.Run("mode is kept whatever the umask", func(t *testing.T) {
		must(t, "mkdir", "--mode", "0777", dir+"/open")
		fi, err := os.Stat(dir + "/open")
		if err != nil {
			t.Fatal(err)
		}
		if got := fi.Mode().Perm(); got != 0o777 {
			t.Errorf("mode: got %o, want 777", got)
		}
	})
	t.Run("mv then rm -r", func(t *testing.T) {
		must(t, "mv", dir+"/a", dir+"/z")
		if _, err := os.Stat(dir + "/z/b/c"); err != nil {
			t.Fatalf("after mv: %v", err)
		}
		must(t, "rm", "-r", dir+"/z")
		if _, err := os.Stat(dir + "/z"); !os.IsNotExist(err) {
			t.Fatalf("after rm -r: got %v, want it gone", err)
		}
	})
	t.Run("rm a symlink leaves its target", func(t *testing.T) {
		if err := os.Symlink(dir+"/f", dir+"/link"); err != nil {
			t.Fatal(err)
		}
		must(t, "rm", dir+"/link")
		if _, err := os.Stat(dir + "/f"); err != nil {
			t.Fatalf("target: %v", err)
		}
	})
}
