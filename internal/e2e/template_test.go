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
	"time"

	"sbx.dev/sbx/api"
	"sbx.dev/sbx/client"
	"sbx.dev/sbx/client/image"
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
	tm, err := image.Import(ctx, d.client, again, dir, image.WithProgress(func(p api.Progress) { msgs = append(msgs, p.Message) }))
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

// TestTemplateVersionsHeld: a template rebuilt (a new version under the
// same name) or removed never moves under what was made on it: a running
// sandbox, a stopped one, a snapshot and a fork keep working on the
// version they were made on; rm says who still holds it; its files go
// only once nothing does.
func TestTemplateVersionsHeld(t *testing.T) {
	d := shared
	ctx := context.Background()
	tiny := templateRootfs(t, d, "tiny")
	name := "held-" + randHex(3)
	imp := func(flavour string, force bool) *api.Template {
		dir := t.TempDir()
		if out, err := exec.Command("cp", "-a", tiny+"/.", dir).CombinedOutput(); err != nil {
			t.Fatalf("cp: %v %s", err, out)
		}
		os.WriteFile(filepath.Join(dir, "etc", "flavour"), []byte(flavour+"\n"), 0o644)
		var opts []image.Option
		if force {
			opts = append(opts, image.WithForce())
		}
		tm, err := image.Import(ctx, d.client, name, dir, opts...)
		if err != nil {
			t.Fatalf("import %s: %v", flavour, err)
		}
		return tm
	}
	v1 := imp("one", false)
	t.Cleanup(func() { d.client.RemoveTemplate(context.Background(), name) })
	newOn := func() string {
		sb, err := d.client.Create(ctx, client.WithTemplate(name))
		if err != nil {
			t.Fatalf("create on %s: %v", name, err)
		}
		t.Cleanup(func() { deleteSandbox(context.Background(), d.client, sb.ID) })
		return sb.ID
	}
	flavour := func(id string) string {
		t.Helper()
		return strings.TrimSpace(d.must(t, "exec", id, "--", "sh", "-c", "cat /etc/flavour && ls /bin | wc -l >/dev/null"))
	}
	running, stopped := newOn(), newOn()
	d.must(t, "exec", running, "--detach", "--", "sleep", "1000")
	snap := "held-snap-" + randHex(3)
	d.must(t, "snapshot", running, snap, "--memory")
	t.Cleanup(func() { d.client.DeleteSnapshot(context.Background(), snap) })
	d.must(t, "stop", stopped, "--wait")

	// a rebuild: the name points at a new version
	v2 := imp("two", true)
	if v1.Version == v2.Version {
		t.Fatalf("a rebuild with other content kept the version %s", v1.Version)
	}
	kids, err := sdk(d.client).Fork(ctx, running, api.ForkRequest{})
	if err != nil {
		t.Fatalf("fork after a rebuild: %v", err)
	}
	fork := kids[0].ID
	t.Cleanup(func() { deleteSandbox(context.Background(), d.client, fork) })
	if got := flavour(running); got != "one" {
		t.Errorf("a running sandbox after a rebuild sees %q, want its own version's %q", got, "one")
	}
	if got := flavour(fork); got != "one" {
		t.Errorf("a fork made after the rebuild sees %q, want its parent's version's %q", got, "one")
	}
	d.must(t, "resume", stopped)
	if got := flavour(stopped); got != "one" {
		t.Errorf("a stopped sandbox resumed after a rebuild sees %q, want %q", got, "one")
	}
	from := strings.TrimSpace(d.must(t, "new", "--from", snap))
	t.Cleanup(func() { deleteSandbox(context.Background(), d.client, from) })
	if got := flavour(from); got != "one" {
		t.Errorf("a sandbox from a snapshot taken before the rebuild sees %q, want %q", got, "one")
	}
	if got := flavour(newOn()); got != "two" {
		t.Errorf("a new sandbox sees %q, want the new version's %q", got, "two")
	}

	// a removal: the name goes, the versions stay for what holds them
	rm, err := d.client.RemoveTemplate(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	if rm.Version != v2.Version || len(rm.HeldBy) == 0 {
		t.Errorf("template rm: %+v, want version %s and who holds it", rm, v2.Version)
	}
	r := d.sbx(t, "template", "rm", name)
	if r.code == 0 || !strings.Contains(r.stderr, "not found") {
		t.Errorf("rm of a removed name: exit %d %q", r.code, r.stderr)
	}
	if got := flavour(running); got != "one" {
		t.Errorf("after rm, the running sandbox sees %q", got)
	}
	d.must(t, "stop", running, "--wait")
	d.must(t, "resume", running)
	if got := flavour(running); got != "one" {
		t.Errorf("after rm, a stop and resume sees %q", got)
	}
	// once nothing holds them, the versions' files go
	versionDir := func(v string) string {
		return filepath.Join(templateCache(), "versions", strings.Replace(v, ":", "-", 1))
	}
	if _, err := os.Stat(versionDir(v1.Version)); err != nil {
		t.Fatalf("version %s is gone while sandboxes hold it: %v", v1.Version, err)
	}
	sbs, _ := d.client.List(ctx)
	for _, sb := range sbs {
		if sb.TemplateVersion == v1.Version || sb.TemplateVersion == v2.Version {
			deleteSandbox(ctx, d.client, sb.ID)
		}
	}
	d.client.DeleteSnapshot(ctx, snap)
	waitFor(t, "the versions nothing holds to be collected", 30*time.Second, func() bool {
		_, e1 := os.Stat(versionDir(v1.Version))
		_, e2 := os.Stat(versionDir(v2.Version))
		return os.IsNotExist(e1) && os.IsNotExist(e2)
	})
}
