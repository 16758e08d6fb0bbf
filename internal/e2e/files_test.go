package e2e

import (
	"bytes"
	"crypto/rand"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"sbx.dev/sbx/api"
)

func TestFiles(t *testing.T) {
	d := shared
	id := d.newSandbox(t, "--template", "tiny")
	local := t.TempDir()
	data := make([]byte, 3<<20+17)
	rand.Read(data)
	src := filepath.Join(local, "blob.bin")
	if err := os.WriteFile(src, data, 0o640); err != nil {
		t.Fatal(err)
	}
	// In, to a directory (keeps the base name), and back out.
	d.must(t, "scp", src, id+":/tmp/")
	back := filepath.Join(local, "back.bin")
	d.must(t, "scp", id+":/tmp/blob.bin", back)
	got, err := os.ReadFile(back)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, data) {
		t.Fatalf("round trip changed the file: %d bytes back, want %d", len(got), len(data))
	}
	var fi api.FileInfo
	d.jsonOut(t, &fi, "fs", "stat", id, "/tmp/blob.bin")
	if fi.Size != int64(len(data)) || fi.IsDir || !strings.HasSuffix(fi.Mode, "rw-r-----") {
		t.Errorf("stat = %+v", fi)
	}

	// Directories with -r, both ways.
	tree := filepath.Join(local, "tree")
	os.MkdirAll(filepath.Join(tree, "sub"), 0o755)
	os.WriteFile(filepath.Join(tree, "a.txt"), []byte("alpha\n"), 0o644)
	os.WriteFile(filepath.Join(tree, "sub", "b.txt"), []byte("beta\n"), 0o600)
	os.Symlink("a.txt", filepath.Join(tree, "link"))
	d.must(t, "scp", "-r", tree, id+":/srv")
	if out := d.must(t, "exec", id, "--", "cat", "/srv/a.txt", "/srv/sub/b.txt"); out != "alpha\nbeta\n" {
		t.Errorf("tree inside = %q", out)
	}
	var dir struct{ Files []api.FileInfo }
	d.jsonOut(t, &dir, "fs", "ls", id, "/srv")
	ls := dir.Files
	var names []string
	for _, f := range ls {
		names = append(names, f.Name)
		if f.Name == "link" && f.Link != "a.txt" {
			t.Errorf("link target = %q, want a.txt", f.Link)
		}
	}
	if strings.Join(names, ",") != "a.txt,link,sub" {
		t.Errorf("ls /srv = %v", names)
	}
	// As cp -r: tree/. into an existing directory copies what is in it.
	d.must(t, "exec", id, "--", "mkdir", "/srv2")
	d.must(t, "scp", "-r", tree+"/.", id+":/srv2")
	if out := d.must(t, "exec", id, "--", "cat", "/srv2/a.txt", "/srv2/sub/b.txt"); out != "alpha\nbeta\n" {
		t.Errorf("tree/. inside = %q, want its files directly in /srv2", out)
	}
	out := filepath.Join(local, "out")
	d.must(t, "scp", "-r", id+":/srv", out)
	if b, _ := os.ReadFile(filepath.Join(out, "sub", "b.txt")); string(b) != "beta\n" {
		t.Errorf("tree out: sub/b.txt = %q", b)
	}

	// Paths are the sandbox's: a symlink to /etc/shadow gives the sandbox's file.
	d.must(t, "exec", id, "--", "sh", "-c", "echo sandbox-shadow > /etc/shadow; ln -s /etc/shadow /tmp/sh")
	shadow := filepath.Join(local, "shadow")
	d.must(t, "scp", id+":/tmp/sh", shadow)
	if b, _ := os.ReadFile(shadow); string(b) != "sandbox-shadow\n" {
		t.Errorf("symlink to /etc/shadow gave %q, want the sandbox's file", b)
	}

	// Bad input: clear errors, nothing lost.
	tests := []struct {
		name string
		args []string
		want string
	}{
		{"into a missing directory", []string{"scp", src, id + ":/no/such/dir/x"}, "does not exist"},
		{"missing remote file", []string{"scp", id + ":/nope", filepath.Join(local, "nope")}, "does not exist"},
		{"directory without -r", []string{"scp", id + ":/srv", filepath.Join(local, "x")}, "-r"},
		{"stat missing", []string{"fs", "stat", id, "/nope"}, "does not exist"},
		{"relative path", []string{"fs", "ls", id, "tmp"}, "absolute"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := d.sbx(t, tc.args...)
			if r.code == 0 || !strings.Contains(r.stderr, tc.want) {
				t.Errorf("exit %d stderr %q; want failure saying %q", r.code, r.stderr, tc.want)
			}
		})
	}
	if _, err := os.Stat(filepath.Join(local, "nope")); !os.IsNotExist(err) {
		t.Errorf("a failed download left a local file: %v", err)
	}
}
