package atomicfile

import (
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

type failing struct{ n int }

func (f *failing) Read(p []byte) (int, error) {
	if f.n == 0 {
		return 0, errors.New("the source broke")
	}
	f.n--
	return copy(p, "part"), nil
}

func TestWrite(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "f")
	if err := WriteString(path, "old", 0o644); err != nil {
		t.Fatal(err)
	}
	// a source that fails midway leaves the old file, and no temporary
	if _, err := Write(path, &failing{n: 3}, 0o644); err == nil {
		t.Fatal("a failing source: no error")
	}
	if b, _ := os.ReadFile(path); string(b) != "old" {
		t.Errorf("after a failed write: %q, want the old content", b)
	}
	n, err := Write(path, io.LimitReader(strings.NewReader(strings.Repeat("x", 1<<20)), 1<<20), 0o640)
	if err != nil || n != 1<<20 {
		t.Fatalf("Write: %d, %v", n, err)
	}
	st, _ := os.Stat(path)
	if st.Mode().Perm() != 0o640 {
		t.Errorf("mode %v, want 0640", st.Mode().Perm())
	}
	if err := WriteBytes(path, []byte("new"), 0o600); err != nil {
		t.Fatal(err)
	}
	if st, _ := os.Stat(path); st.Mode().Perm() != 0o600 {
		t.Errorf("mode %v, want 0600", st.Mode().Perm())
	}
	ents, _ := os.ReadDir(dir)
	if len(ents) != 1 {
		t.Errorf("%d entries in the dir, want the file alone", len(ents))
	}
	if err := WriteString(filepath.Join(dir, "no", "such"), "x", 0o600); err == nil {
		t.Error("a write into a missing dir: no error")
	}
}

// TestWriteBytesUnsynced: the unsynced write replaces a file whole, with
// its mode, leaving no temporary, and fails into a missing dir.
func TestWriteBytesUnsynced(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "exit")
	for _, want := range []string{"0\n", "137\n"} {
		if err := WriteBytesUnsynced(path, []byte(want), 0o600); err != nil {
			t.Fatal(err)
		}
		if b, _ := os.ReadFile(path); string(b) != want {
			t.Errorf("read %q, want %q", b, want)
		}
	}
	if st, _ := os.Stat(path); st.Mode().Perm() != 0o600 {
		t.Errorf("mode %v, want 0600", st.Mode().Perm())
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 1 {
		t.Errorf("%d entries in the dir, want the file alone", len(ents))
	}
	if err := WriteBytesUnsynced(filepath.Join(dir, "no", "such"), []byte("x"), 0o600); err == nil {
		t.Error("a write into a missing dir: no error")
	}
}

func TestIsTempOf(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "verdict")
	// a write whose rename fails leaves its temporary: name it as one
	f, err := os.CreateTemp(dir, tempPrefix("verdict")+"*")
	if err != nil {
		t.Fatal(err)
	}
	f.Close()
	if !IsTempOf(filepath.Base(f.Name()), "verdict") {
		t.Errorf("%s is not taken for a temporary of verdict", filepath.Base(f.Name()))
	}
	if err := WriteBytes(path, []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"verdict", ".verdict.sbx-", ".verdicts.sbx-1", "verdict.sbx-1", ".done.sbx-1"} {
		if IsTempOf(name, "verdict") {
			t.Errorf("%q is taken for a temporary of verdict", name)
		}
	}
}
