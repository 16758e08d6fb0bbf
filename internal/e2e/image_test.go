package e2e

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log"
	"math/rand/v2"
	"net/http/httptest"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
	"sbx.dev/sbx/api"
	"sbx.dev/sbx/client/image"
)

// privateDaemon starts an sbxd whose template store is its own, removed
// with its data dir: what a test imports there never reaches the shared
// cache.
func privateDaemon(t *testing.T) *daemon {
	t.Helper()
	d, err := newDaemon()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.stop(true) })
	if err := os.Remove(filepath.Join(d.dir, "templates")); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(filepath.Join(d.dir, "templates"), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := d.start(nil); err != nil {
		t.Fatal(err)
	}
	return d
}

// tarEntry is one entry of a test layer.
type tarEntry struct {
	hdr  *tar.Header
	body []byte
}

func layerTar(t *testing.T, es []tarEntry) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range es {
		if e.hdr.Typeflag == tar.TypeReg {
			e.hdr.Size = int64(len(e.body))
		}
		if e.hdr.ModTime.IsZero() {
			e.hdr.ModTime = time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC)
		}
		if err := tw.WriteHeader(e.hdr); err != nil {
			t.Fatal(err)
		}
		tw.Write(e.body)
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

func tdir(n string, mode int64) tarEntry {
	return tarEntry{hdr: &tar.Header{Typeflag: tar.TypeDir, Name: n, Mode: mode}}
}
func tfile(n string, mode int64, body string) tarEntry {
	return tarEntry{hdr: &tar.Header{Typeflag: tar.TypeReg, Name: n, Mode: mode}, body: []byte(body)}
}
func tlink(n, target string) tarEntry {
	return tarEntry{hdr: &tar.Header{Typeflag: tar.TypeSymlink, Name: n, Linkname: target, Mode: 0o777}}
}
func thard(n, target string) tarEntry {
	return tarEntry{hdr: &tar.Header{Typeflag: tar.TypeLink, Name: n, Linkname: target}}
}

// busyboxLayer is a layer with the host's static busybox and the applets
// the tests run.
func busyboxLayer(t *testing.T) []byte {
	t.Helper()
	bb, err := os.ReadFile("/bin/busybox")
	if err != nil {
		t.Skipf("no busybox: %v", err)
	}
	es := []tarEntry{tdir("bin/", 0o755), {hdr: &tar.Header{Typeflag: tar.TypeReg, Name: "bin/busybox", Mode: 0o755}, body: bb}}
	for _, a := range []string{"sh", "cat", "ls", "stat", "id", "pwd", "readlink", "test", "echo", "sleep", "env"} {
		es = append(es, tlink("bin/"+a, "busybox"))
	}
	return layerTar(t, es)
}

// layerOf makes a go-containerregistry layer of a tar, gzipped as a
// registry would hold it.
func layerOf(t *testing.T, b []byte) v1.Layer {
	t.Helper()
	l, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(b)), nil })
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// imageOf makes an image of the layers with the config.
func imageOf(t *testing.T, cfg v1.Config, layers ...v1.Layer) v1.Image {
	t.Helper()
	img, err := mutate.AppendLayers(empty.Image, layers...)
	if err != nil {
		t.Fatal(err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture, cf.Config = "linux", runtime.GOARCH, cfg
	img, err = mutate.ConfigFile(img, cf)
	if err != nil {
		t.Fatal(err)
	}
	return img
}

// writeLayout writes img as an OCI image layout in a new directory.
func writeLayout(t *testing.T, img v1.Image) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "layout")
	p, err := layout.Write(dir, empty.Index)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.AppendImage(img); err != nil {
		t.Fatal(err)
	}
	return dir
}

// tarDirTo writes a tar of dir's contents (an OCI archive, for a layout).
func tarDirTo(t *testing.T, dir, dst string) {
	t.Helper()
	f, err := os.Create(dst)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	tw := tar.NewWriter(f)
	err = filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || p == dir {
			return err
		}
		fi, _ := d.Info()
		h, _ := tar.FileInfoHeader(fi, "")
		rel, _ := filepath.Rel(dir, p)
		h.Name = rel
		if d.IsDir() {
			h.Name += "/"
		}
		if err := tw.WriteHeader(h); err != nil {
			return err
		}
		if fi.Mode().IsRegular() {
			in, err := os.Open(p)
			if err != nil {
				return err
			}
			defer in.Close()
			_, err = io.Copy(tw, in)
			return err
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
}

// progressLog collects progress messages.
type progressLog struct{ msgs []string }

func (p *progressLog) add(ev api.Progress) {
	if ev.Message != "" {
		p.msgs = append(p.msgs, ev.Message)
	}
}
func (p *progressLog) String() string { return strings.Join(p.msgs, "\n") }
func (p *progressLog) count(sub string) int {
	n := 0
	for _, m := range p.msgs {
		if strings.Contains(m, sub) {
			n++
		}
	}
	return n
}

// TestImageImport: one multi-layer image, with whiteouts, an opaque
// directory, a symlink chain, a hard link, a setuid file, a non-root USER
// and a WORKDIR, imported from each kind of source: an OCI layout, an OCI
// archive, a docker-save archive, the same gzipped on standard input, and a
// registry (go-containerregistry's, on loopback). Each source's image has one
// layer of its own: only that one is sent, the others are stored once. The
// same image again is instant. Sandboxes boot from it and see its files.
func TestImageImport(t *testing.T) {
	d := privateDaemon(t)
	ctx := context.Background()
	base := []v1.Layer{
		layerOf(t, busyboxLayer(t)),
		layerOf(t, layerTar(t, []tarEntry{
			tdir("etc/", 0o755), tfile("etc/keep", 0o644, "old\n"), tfile("etc/gone", 0o644, "x"),
			tdir("opq/", 0o755), tfile("opq/a", 0o644, "a"), tfile("opq/b", 0o644, "b"),
			tdir("usr/", 0o755), tdir("usr/local/", 0o755), tdir("usr/local/bin/", 0o755),
			tfile("usr/local/bin/tool", 0o4755, "#!/bin/sh\necho tool\n"),
			thard("usr/local/bin/tool-hard", "usr/local/bin/tool"),
			tlink("usr/local/bin/l1", "l2"), tlink("usr/local/bin/l2", "/usr/local/bin/l3"), tlink("usr/local/bin/l3", "tool"),
			tdir("home/", 0o755),
			{hdr: &tar.Header{Typeflag: tar.TypeDir, Name: "home/user/", Mode: 0o750, Uid: 1000, Gid: 1000}},
		})),
		layerOf(t, layerTar(t, []tarEntry{
			tdir("etc/", 0o755), tfile("etc/.wh.gone", 0o644, ""), tfile("etc/keep", 0o644, "new\n"),
			tdir("opq/", 0o755), tfile("opq/.wh..wh..opq", 0o644, ""), tfile("opq/c", 0o644, "c"),
		})),
	}
	cfg := v1.Config{User: "1000:1000", WorkingDir: "/home/user", Env: []string{"PATH=/usr/local/bin:/bin", "GREETING=hi"}, Entrypoint: []string{"/usr/local/bin/tool"}, Cmd: []string{"--serve"}}
	imageFor := func(kind string) v1.Image {
		own := layerOf(t, layerTar(t, []tarEntry{tdir("etc/", 0o755), tfile("etc/source", 0o644, kind)}))
		return imageOf(t, cfg, append(append([]v1.Layer{}, base...), own)...)
	}

	// the sources
	ociDir := writeLayout(t, imageFor("oci"))
	ociArchive := filepath.Join(t.TempDir(), "image.oci.tar")
	tarDirTo(t, writeLayout(t, imageFor("oci-archive")), ociArchive)
	dockerArchive := filepath.Join(t.TempDir(), "image.docker.tar")
	tag, _ := name.NewTag("example.test/app:v1")
	if err := tarball.WriteToFile(dockerArchive, tag, imageFor("docker")); err != nil {
		t.Fatal(err)
	}
	var gz bytes.Buffer
	zw := gzip.NewWriter(&gz)
	if err := tarball.Write(tag, imageFor("stdin"), zw); err != nil {
		t.Fatal(err)
	}
	zw.Close()
	reg := httptest.NewServer(registry.New(registry.Logger(log.New(io.Discard, "", 0))))
	t.Cleanup(reg.Close)
	ref := strings.TrimPrefix(reg.URL, "http://") + "/team/app:v1"
	regRef, _ := name.ParseReference(ref)
	if err := remote.Write(regRef, imageFor("registry")); err != nil {
		t.Fatal(err)
	}

	sources := []struct {
		kind, src string
		opts      []image.Option
		uploads   int // layers sent
	}{
		{"oci", ociDir, nil, 4},
		{"oci-archive", ociArchive, nil, 1},
		{"docker", dockerArchive, nil, 1},
		{"stdin", "-", []image.Option{image.WithStdin(bytes.NewReader(gz.Bytes()))}, 1},
		{"registry", ref, nil, 1},
	}
	versions := map[string]bool{}
	for _, s := range sources {
		t.Run(s.kind, func(t *testing.T) {
			tname := "img-" + strings.ReplaceAll(s.kind, "-", "")
			var p progressLog
			tm, err := image.Import(ctx, d.client, tname, s.src, append(s.opts, image.WithProgress(p.add))...)
			if err != nil {
				t.Fatalf("import %s: %v\n%s", s.src, err, &p)
			}
			if got := p.count("layer "); got < s.uploads || p.count(fmt.Sprintf("/%d", s.uploads)) == 0 {
				t.Errorf("progress:\n%s\nwant %d layers sent", &p, s.uploads)
			}
			versions[tm.Version] = true
			want := api.TemplateDefaults{User: "1000:1000", WorkDir: "/home/user", Env: cfg.Env, Entrypoint: cfg.Entrypoint, Cmd: cfg.Cmd}
			if tm.Defaults.User != want.User || tm.Defaults.WorkDir != want.WorkDir || strings.Join(tm.Defaults.Env, " ") != strings.Join(want.Env, " ") ||
				strings.Join(tm.Defaults.Entrypoint, " ") != "/usr/local/bin/tool" || strings.Join(tm.Defaults.Cmd, " ") != "--serve" {
				t.Errorf("defaults = %+v, want %+v", tm.Defaults, want)
			}
			if s.kind != "oci" && s.kind != "registry" {
				return // the files are the same; boot two of them
			}
			id := d.newSandbox(t, "--template", tname)
			checks := map[string]string{
				"cat /etc/keep /etc/source":           "new\n" + s.kind,
				"ls /opq":                             "c\n",
				"test -e /etc/gone || echo gone":      "gone\n",
				"stat -c '%a %u' /usr/local/bin/tool": "4755 0\n",
				"stat -c '%i' /usr/local/bin/tool /usr/local/bin/tool-hard | uniq | wc -l": "1\n",
				"readlink /usr/local/bin/l1; readlink /usr/local/bin/l2":                   "l2\n/usr/local/bin/l3\n",
				"cat /usr/local/bin/l1":                                "#!/bin/sh\necho tool\n",
				"stat -c '%u:%g %a' /home/user":                        "1000:1000 750\n",
				"test -d /.sbx && test -f /etc/resolv.conf && echo ok": "ok\n",
			}
			for cmd, want := range checks {
				if got := d.must(t, "exec", id, "--", "/bin/sh", "-c", cmd); got != want {
					t.Errorf("%s = %q, want %q", cmd, got, want)
				}
			}
		})
	}
	if len(versions) != len(sources) {
		t.Errorf("%d versions for %d images", len(versions), len(sources))
	}

	// the same image again, from any source: nothing is sent, at once
	for _, src := range []string{ociDir, "oci:" + ociDir} {
		var p progressLog
		start := time.Now()
		tm, err := image.Import(ctx, d.client, "img-again", src, image.WithProgress(p.add), image.WithForce())
		if err != nil {
			t.Fatal(err)
		}
		took := time.Since(start)
		first, _ := d.client.Template(ctx, "img-oci")
		if tm.Version != first.Version || p.count("layer ") != 0 || p.count("already") == 0 {
			t.Errorf("second import of %s: version %s (want %s), progress:\n%s", src, tm.Version, first.Version, &p)
		}
		if took > 2*time.Second {
			t.Errorf("second import took %v", took)
		}
		t.Logf("second import of the same image: %v", took.Round(time.Millisecond))
	}
	// the CLI lists them with the registry's name as the source
	ts, err := d.client.Templates(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, tm := range ts {
		if tm.Name == "img-registry" && tm.Source != regRef.Name() {
			t.Errorf("img-registry source = %q, want %q", tm.Source, regRef.Name())
		}
	}
}

// TestImageImportErrors: what is not an image, or not one sbx runs, gets a
// clear error and leaves nothing.
func TestImageImportErrors(t *testing.T) {
	d := privateDaemon(t)
	ctx := context.Background()
	armCfg := imageOf(t, v1.Config{}, layerOf(t, busyboxLayer(t)))
	cf, _ := armCfg.ConfigFile()
	cf = cf.DeepCopy()
	cf.Architecture = "s390x"
	arm, _ := mutate.ConfigFile(armCfg, cf)
	armDir := writeLayout(t, arm)
	emptyDir := filepath.Join(t.TempDir(), "not-a-layout")
	os.Mkdir(emptyDir, 0o755)
	os.WriteFile(filepath.Join(emptyDir, "oci-layout"), []byte(`{"imageLayoutVersion":"1.0.0"}`), 0o644)
	tests := []struct {
		name, src string
		kind      error
		says      string
	}{
		{"missing file", "./no-such-image.tar", api.ErrInvalid, "no such file"},
		{"bad reference", "UPPER CASE", api.ErrInvalid, "neither a file"},
		{"other architecture", armDir, api.ErrInvalid, "s390x"},
		{"layout without index", emptyDir, api.ErrInvalid, "index.json"},
		{"empty stdin", "-", api.ErrInvalid, "standard input is empty"},
		{"unknown layout ref", "oci:" + armDir + ":nosuch", api.ErrInvalid, "no image"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := image.Import(ctx, d.client, "bad", tc.src, image.WithStdin(bytes.NewReader(nil)))
			if !errors.Is(err, tc.kind) || !strings.Contains(err.Error(), tc.says) {
				t.Errorf("import %q = %v, want %v saying %q", tc.src, err, tc.kind, tc.says)
			}
		})
	}
	if ts, err := d.client.Templates(ctx); err != nil || len(ts) != 0 {
		t.Errorf("templates after failed imports: %v, %v", ts, err)
	}
	if _, err := image.Import(ctx, d.client, "Bad Name", armDir); !errors.Is(err, api.ErrInvalid) {
		t.Errorf("bad template name = %v, want api.ErrInvalid", err)
	}
}

// TestImageImportHostile: an image whose layers try to get out is refused
// or neutralized, and the host is untouched either way.
func TestImageImportHostile(t *testing.T) {
	d := privateDaemon(t)
	ctx := context.Background()
	host := t.TempDir()
	bb := layerOf(t, busyboxLayer(t))
	refused := []struct{ name, says string }{}
	for _, tc := range []struct {
		name  string
		layer []tarEntry
		says  string
	}{
		{"dotdot", []tarEntry{tfile("../../../../tmp/sbx-pwned", 0o644, "x")}, `".."`},
		{"through a symlink", []tarEntry{tlink("out", host), tfile("out/pwned", 0o644, "x")}, "symbolic link"},
		{"hard link out", []tarEntry{thard("shadow", "/etc/shadow")}, "not in the archive"},
	} {
		img := imageOf(t, v1.Config{}, bb, layerOf(t, layerTar(t, tc.layer)))
		_, err := image.Import(ctx, d.client, "hostile", writeLayout(t, img))
		if err == nil || !strings.Contains(err.Error(), tc.says) {
			t.Errorf("%s: import = %v, want a refusal saying %s", tc.name, err, tc.says)
		}
		refused = append(refused, struct{ name, says string }{tc.name, tc.says})
	}
	// neutralized: a symlink out in one layer, written through in the next;
	// device nodes; an absolute symlink to the host's root
	img := imageOf(t, v1.Config{}, bb,
		layerOf(t, layerTar(t, []tarEntry{tlink("out", host), tlink("hostroot", "/"),
			{hdr: &tar.Header{Typeflag: tar.TypeBlock, Name: "sda", Mode: 0o666, Devmajor: 8}},
			{hdr: &tar.Header{Typeflag: tar.TypeChar, Name: "kmem", Mode: 0o666, Devmajor: 1, Devminor: 2}}})),
		layerOf(t, layerTar(t, []tarEntry{tdir("out/", 0o755), tfile("out/pwned", 0o644, "inside")})),
	)
	if _, err := image.Import(ctx, d.client, "neutral", writeLayout(t, img)); err != nil {
		t.Fatalf("import: %v", err)
	}
	if _, err := os.Stat("/tmp/sbx-pwned"); err == nil {
		t.Errorf("/tmp/sbx-pwned was written on the host")
	}
	if es, _ := os.ReadDir(host); len(es) != 0 {
		t.Errorf("the host directory holds %d entries", len(es))
	}
	id := d.newSandbox(t, "--template", "neutral")
	if got := d.must(t, "exec", id, "--", "/bin/cat", "/out/pwned"); got != "inside" {
		t.Errorf("/out/pwned in the sandbox = %q", got)
	}
	if got := d.must(t, "exec", id, "--", "/bin/sh", "-c", "test -e /sda || test -e /kmem || echo none; readlink /hostroot"); got != "none\n/\n" {
		t.Errorf("devices and the root link = %q, want none and a link the sandbox resolves itself", got)
	}
	// the host's root, seen through the link, is the sandbox's own
	if got := d.must(t, "exec", id, "--", "/bin/sh", "-c", "ls /hostroot/out"); got != "pwned\n" {
		t.Errorf("ls /hostroot/out = %q, want the sandbox's /out", got)
	}
	_ = refused
}

// bigLayer is a layer read from a file: uncompressed, so that its blob is
// the tar itself and nothing in the test holds it in memory.
type bigLayer struct {
	path   string
	digest v1.Hash
	size   int64
}

func (l *bigLayer) Digest() (v1.Hash, error)             { return l.digest, nil }
func (l *bigLayer) DiffID() (v1.Hash, error)             { return l.digest, nil }
func (l *bigLayer) Compressed() (io.ReadCloser, error)   { return os.Open(l.path) }
func (l *bigLayer) Uncompressed() (io.ReadCloser, error) { return os.Open(l.path) }
func (l *bigLayer) Size() (int64, error)                 { return l.size, nil }
func (l *bigLayer) MediaType() (types.MediaType, error)  { return types.OCIUncompressedLayer, nil }

// writeBigLayer writes a layer of files of pseudo-random bytes straight into
// the layout's blobs, streaming.
func writeBigLayer(t *testing.T, blobs string, seed uint64, files int, fileSize int64) *bigLayer {
	t.Helper()
	tmp, err := os.CreateTemp(blobs, "layer-")
	if err != nil {
		t.Fatal(err)
	}
	h := sha256.New()
	tw := tar.NewWriter(io.MultiWriter(tmp, h))
	rng := rand.NewChaCha8([32]byte{byte(seed)})
	buf := make([]byte, 1<<20)
	tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: "data/", Mode: 0o755})
	for i := range files {
		tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: fmt.Sprintf("data/%d-%d.bin", seed, i), Mode: 0o644, Size: fileSize})
		for left := fileSize; left > 0; left -= int64(len(buf)) {
			rng.Read(buf)
			n := min(left, int64(len(buf)))
			if _, err := tw.Write(buf[:n]); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	fi, _ := tmp.Stat()
	tmp.Close()
	d := v1.Hash{Algorithm: "sha256", Hex: fmt.Sprintf("%x", h.Sum(nil))}
	p := filepath.Join(blobs, d.Hex)
	if err := os.Rename(tmp.Name(), p); err != nil {
		t.Fatal(err)
	}
	return &bigLayer{path: p, digest: d, size: fi.Size()}
}

// TestImageImportBig imports an image of 1.5 GiB of layers, streamed: sbxd's
// peak resident memory stays far below the image's size. It logs the
// figures the README gives: import time per GiB, and a second import's time.
func TestImageImportBig(t *testing.T) {
	if testing.Short() {
		t.Skip("a 1.5 GiB image")
	}
	d := privateDaemon(t)
	ctx := context.Background()
	dir := filepath.Join(t.TempDir(), "big")
	p, err := layout.Write(dir, empty.Index)
	if err != nil {
		t.Fatal(err)
	}
	blobs := filepath.Join(dir, "blobs", "sha256")
	os.MkdirAll(blobs, 0o755)
	layers := []v1.Layer{layerOf(t, busyboxLayer(t))}
	var total int64
	for i := range 3 {
		l := writeBigLayer(t, blobs, uint64(i+1), 8, 64<<20)
		total += l.size
		layers = append(layers, l)
	}
	if err := p.AppendImage(imageOf(t, v1.Config{}, layers...)); err != nil {
		t.Fatal(err)
	}
	before := rssKB(t, d, "VmRSS")
	start := time.Now()
	var pl progressLog
	tm, err := image.Import(ctx, d.client, "big", dir, image.WithProgress(pl.add))
	if err != nil {
		t.Fatalf("import: %v\n%s", err, &pl)
	}
	took := time.Since(start)
	peak := rssKB(t, d, "VmHWM")
	gib := float64(total) / (1 << 30)
	t.Logf("imported %.2f GiB of layers in %v: %.1f s per GiB; sbxd RSS %d MB before, peak %d MB", gib, took.Round(time.Millisecond), took.Seconds()/gib, before>>10, peak>>10)
	if peak > 256<<10 {
		t.Errorf("sbxd's peak RSS was %d MB importing %.2f GiB: the image is held in memory", peak>>10, gib)
	}
	if tm.Size < total {
		t.Errorf("template size %d, want at least the layers' %d", tm.Size, total)
	}
	start = time.Now()
	pl = progressLog{}
	if _, err := image.Import(ctx, d.client, "big2", dir, image.WithProgress(pl.add)); err != nil {
		t.Fatal(err)
	}
	again := time.Since(start)
	t.Logf("second import of the same image: %v", again.Round(time.Millisecond))
	if again > 2*time.Second || pl.count("already") == 0 {
		t.Errorf("second import took %v, progress:\n%s", again, &pl)
	}
	id := d.newSandbox(t, "--template", "big")
	if got := d.must(t, "exec", id, "--", "/bin/sh", "-c", "ls /data | wc -l"); strings.TrimSpace(got) != "24" {
		t.Errorf("ls /data | wc -l = %q, want 24", got)
	}
}

// rssKB reads a memory figure of sbxd from /proc, in KiB.
func rssKB(t *testing.T, d *daemon, field string) int64 {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", d.cmd.Process.Pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, field+":"); ok {
			n, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			return n
		}
	}
	t.Fatalf("no %s in /proc/%d/status", field, d.cmd.Process.Pid)
	return 0
}
