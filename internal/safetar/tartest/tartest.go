// Package tartest builds small tars for tests, hostile ones too.
package tartest

import (
	"archive/tar"
	"bytes"
	"strings"
	"testing"
)

// Tar returns a tar of entries, each a name and a body: a name ending in
// "/" is a directory, a body starting with "->" a symlink to the rest,
// anything else a file of mode 0644 holding the body. Names are taken as
// they are ("../x", "/etc/x").
func Tar(t testing.TB, entries [][2]string) []byte {
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
			if _, err := tw.Write([]byte(body)); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}
