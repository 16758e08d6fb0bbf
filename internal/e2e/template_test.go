package e2e

import (
	"archive/tar"
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"sbx.dev/sbx/api"
)

// TestTemplateImport: a template made from a directory and one from a tar
// (as `docker export` writes) both boot, and rm removes them.
func TestTemplateImport(t *testing.T) {
	d := shared
	tiny := templateRootfs(t, d, "tiny")

	// From a directory: tiny's rootfs plus a marker file.
	dir := t.TempDir()
	if out, err := exec.Command("cp", "-a", tiny+"/.", dir).CombinedOutput(); err != nil {
		t.Fatalf("cp: %v %s", err, out)
	}
	os.WriteFile(filepath.Join(dir, "etc", "flavour"), []byte("from-dir\n"), 0o644)
	fromDir := "imp-dir-" + randHex(3)
	d.must(t, "template", "import", fromDir, dir)
	t.Cleanup(func() { d.sbx(t, "template", "rm", fromDir) })

	// From a tar file.
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	filepath.Walk(tiny, func(p string, fi os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(tiny, p)
		if rel == "." {
			return nil
		}
		link := ""
		if fi.Mode()&os.ModeSymlink != 0 {
			link, _ = os.Readlink(p)
		}
		h, _ := tar.FileInfoHeader(fi, link)
		h.Name = rel
		if fi.IsDir() {
			h.Name += "/"
		}
		tw.WriteHeader(h)
		if fi.Mode().IsRegular() {
			b, _ := os.ReadFile(p)
			tw.Write(b)
		}
		return nil
	})
	tw.WriteHeader(&tar.Header{Name: "etc/flavour", Mode: 0o644, Size: 8, Typeflag: tar.TypeReg})
	tw.Write([]byte("from-tar"))
	tw.Close()
	tarPath := filepath.Join(t.TempDir(), "rootfs.tar")
	os.WriteFile(tarPath, buf.Bytes(), 0o644)
	fromTar := "imp-tar-" + randHex(3)
	d.must(t, "template", "import", fromTar, tarPath)
	t.Cleanup(func() { d.sbx(t, "template", "rm", fromTar) })

	var ts struct{ Templates []api.Template }
	d.jsonOut(t, &ts, "template", "ls")
	names := map[string]bool{}
	for _, tp := range ts.Templates {
		names[tp.Name] = true
	}
	if !names[fromDir] || !names[fromTar] || !names["tiny"] {
		t.Errorf("template ls = %v", ts)
	}
	for name, want := range map[string]string{fromDir: "from-dir\n", fromTar: "from-tar"} {
		id := d.newSandbox(t, "--template", name)
		if out := d.must(t, "exec", id, "--", "cat", "/etc/flavour"); out != want {
			t.Errorf("sandbox from %s: /etc/flavour = %q, want %q", name, out, want)
		}
	}
	r := d.sbx(t, "template", "import", fromDir, dir)
	if r.code != 1 || !strings.Contains(r.stderr, "--force") {
		t.Errorf("importing over an existing template: exit %d %s", r.code, r.stderr)
	}
	// the same tree again, under another name, is the same version
	ctx := context.Background()
	first, err := d.client.Template(ctx, fromDir)
	if err != nil {
		t.Fatal(err)
	}
	again := "imp-again-" + randHex(3)
	var msgs []string
	tm, err := d.client.ImportTemplateFrom(ctx, again, dir, func(p api.Progress) { msgs = append(msgs, p.Message) })
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.client.RemoveTemplate(context.Background(), again) })
	if tm.Version != first.Version || !strings.Contains(strings.Join(msgs, "\n"), "reused") {
		t.Errorf("the same tree again: version %s (first %s), progress %q; want the same version, reused", tm.Version, first.Version, msgs)
	}
	r = d.sbx(t, "template", "import", "Bad Name", dir)
	if r.code != 1 || !strings.Contains(r.stderr, "name") {
		t.Errorf("bad template name: exit %d %q", r.code, r.stderr)
	}
	d.must(t, "template", "rm", fromTar)
	if r := d.sbx(t, "new", "--template", fromTar); r.code != 1 || !strings.Contains(r.stderr, "not found") {
		t.Errorf("new from a removed template: exit %d %q", r.code, r.stderr)
	}
	if r := d.sbx(t, "template", "rm", "no-such-template"); r.code != 1 || !strings.Contains(r.stderr, "not found") {
		t.Errorf("rm of an unknown template: exit %d %q", r.code, r.stderr)
	}
	if r := d.sbx(t, "template", "build", "nosuch"); r.code != 1 || !strings.Contains(r.stderr, "import") {
		t.Errorf("build of an unknown template: exit %d %q", r.code, r.stderr)
	}
}

// templateRootfs returns the rootfs of the version template name points at,
// in the shared cache.
func templateRootfs(t *testing.T, d *daemon, name string) string {
	t.Helper()
	tm, err := d.client.Template(context.Background(), name)
	if err != nil {
		t.Fatal(err)
	}
	return filepath.Join(templateCache(), "versions", strings.Replace(tm.Version, ":", "-", 1), "rootfs")
}
