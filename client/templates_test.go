package client

import (
	"archive/tar"
	"bytes"
	"io/fs"
	"os"
	"path/filepath"
	"testing"
)

// TestWriteTar: a directory's tar keeps hard links as links and attributes.
func TestWriteTar(t *testing.T) {
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "a"), []byte("data"), 0o4755)
	os.Chmod(filepath.Join(dir, "a"), 0o4755|fs.ModeSetuid)
	os.Link(filepath.Join(dir, "a"), filepath.Join(dir, "b"))
	os.Symlink("/etc/passwd", filepath.Join(dir, "c"))
	var buf bytes.Buffer
	if err := writeTar(&buf, dir); err != nil {
		t.Fatal(err)
	}
	tr := tar.NewReader(&buf)
	got := map[string]*tar.Header{}
	for {
		h, err := tr.Next()
		if err != nil {
			break
		}
		got[h.Name] = h
	}
	if h := got["a"]; h == nil || h.Typeflag != tar.TypeReg || h.Mode&0o4000 == 0 {
		t.Errorf("a = %+v, want a setuid file", h)
	}
	if h := got["b"]; h == nil || h.Typeflag != tar.TypeLink || h.Linkname != "a" {
		t.Errorf("b = %+v, want a hard link to a", h)
	}
	if h := got["c"]; h == nil || h.Typeflag != tar.TypeSymlink || h.Linkname != "/etc/passwd" {
		t.Errorf("c = %+v, want a symlink", h)
	}
}
