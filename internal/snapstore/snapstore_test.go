package snapstore

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"
)

// reg is an in-memory registry (go-containerregistry's, fine for small
// blobs) that counts the blob bytes it serves, and lets a test tamper with
// what it answers.
type reg struct {
	*httptest.Server
	mu      sync.Mutex
	served  int64
	blobGet int
	tamper  func(path string, body []byte) []byte
}

func newReg(t *testing.T) *reg {
	r := &reg{}
	h := registry.New(registry.Logger(log.New(io.Discard, "", 0)))
	r.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		body := rec.Body.Bytes()
		r.mu.Lock()
		if req.Method == http.MethodGet && strings.Contains(req.URL.Path, "/blobs/") {
			r.blobGet++
			r.served += int64(len(body))
		}
		tamper := r.tamper
		r.mu.Unlock()
		if tamper != nil && req.Method == http.MethodGet {
			body = tamper(req.URL.Path, body)
		}
		for k, v := range rec.Header() {
			w.Header()[k] = v
		}
		if req.Method == http.MethodGet {
			w.Header().Del("Content-Length")
		}
		w.WriteHeader(rec.Code)
		w.Write(body)
	}))
	t.Cleanup(r.Close)
	return r
}

func (r *reg) ref(repo string) string { return strings.TrimPrefix(r.URL, "http://") + "/" + repo }

func (r *reg) counts() (int, int64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.blobGet, r.served
}

// image makes a capture-like directory: disk.tar and memory/ files.
func image(t *testing.T, files map[string][]byte) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "im")
	for p, b := range files {
		full := filepath.Join(dir, filepath.FromSlash(p))
		if err := os.MkdirAll(filepath.Dir(full), 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(full, b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

func randBytes(n int) []byte {
	b := make([]byte, n)
	rand.Read(b)
	return b
}

func sameFiles(t *testing.T, want map[string][]byte, dir string) {
	t.Helper()
	got := map[string][]byte{}
	filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err == nil && !d.IsDir() {
			rel, _ := filepath.Rel(dir, p)
			got[filepath.ToSlash(rel)], _ = os.ReadFile(p)
		}
		return nil
	})
	if len(got) != len(want) {
		t.Errorf("%s holds %d files, want %d", dir, len(got), len(want))
	}
	for p, b := range want {
		if !bytes.Equal(got[p], b) {
			t.Errorf("%s: %d bytes differ from the %d pushed", p, len(got[p]), len(b))
		}
	}
}

// TestPushPull: an image pushed from one node's store is pulled whole on
// another's, each file verified; its manifest comes back as pushed; a
// second pull of it on that node takes nothing from the registry, nor does
// a pull on the node that pushed it; an image sharing a file with one
// pulled before fetches only what is new.
func TestPushPull(t *testing.T) {
	ctx := context.Background()
	r := newReg(t)
	files := map[string][]byte{
		"disk.tar":              randBytes(300 << 10),
		"memory/checkpoint.img": randBytes(40 << 10),
		"memory/pages.img":      randBytes(200 << 10),
		"memory/pages_meta.img": []byte{},
		"COMPLETE":              []byte("2026-12-02T00:00:00Z\n"),
	}
	src := image(t, files)
	a, _ := Open(t.TempDir())
	rec, _ := json.Marshal(map[string]any{"cpus": 1})
	m := Manifest{Name: "snap", Memory: true, RunscSHA256: "abc", CPUFeatures: []string{"avx", "sse2"}, CacheLineBytes: 64,
		Template: "tiny", TemplateVersion: "sha256:" + strings.Repeat("1", 64), Record: rec}
	ref, _, err := a.Push(ctx, r.ref("sbx/snap:one"), src, m, nil)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(ref, "@sha256:") {
		t.Fatalf("Push returned %q, want the artifact by digest", ref)
	}

	got, byDigest, err := Fetch(ctx, r.ref("sbx/snap:one"))
	if err != nil {
		t.Fatal(err)
	}
	if byDigest != ref {
		t.Errorf("Fetch by tag gives %s, Push said %s", byDigest, ref)
	}
	if got.Name != "snap" || !got.Memory || got.RunscSHA256 != "abc" || got.CacheLineBytes != 64 || len(got.CPUFeatures) != 2 ||
		got.Template != "tiny" || string(got.Record) != string(rec) || len(got.Files) != len(files) {
		t.Errorf("the manifest came back as %+v", got)
	}

	b, _ := Open(t.TempDir())
	dst := filepath.Join(t.TempDir(), "pulled")
	before, _ := r.counts()
	n, err := b.Pull(ctx, ref, got, dst)
	if err != nil {
		t.Fatal(err)
	}
	sameFiles(t, files, dst)
	if n < 540<<10 {
		t.Errorf("the pull says it took %d bytes from the registry, want the image's", n)
	}
	after, _ := r.counts()
	// again on the same node: from its store
	dst2 := filepath.Join(t.TempDir(), "again")
	if n, err := b.Pull(ctx, ref, got, dst2); err != nil || n != 0 {
		t.Errorf("a second pull took %d bytes from the registry (%v), want none", n, err)
	}
	sameFiles(t, files, dst2)
	// on the node that pushed it: from its store too
	if n, err := a.Pull(ctx, ref, got, filepath.Join(t.TempDir(), "home")); err != nil || n != 0 {
		t.Errorf("a pull on the pushing node took %d bytes (%v), want none", n, err)
	}
	if again, _ := r.counts(); again != after {
		t.Errorf("%d blob GETs after the pulls from the stores, want none", again-after)
	}
	if after-before < len(files) {
		t.Errorf("the first pull made %d blob GETs for %d files", after-before, len(files))
	}

	// a second image sharing disk.tar: only its own files come
	files2 := map[string][]byte{"disk.tar": files["disk.tar"], "memory/pages.img": randBytes(10 << 10)}
	ref2, _, err := a.Push(ctx, r.ref("sbx/snap:two"), image(t, files2), Manifest{Name: "two"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	m2, _, err := Fetch(ctx, ref2)
	if err != nil {
		t.Fatal(err)
	}
	if n, err := b.Pull(ctx, ref2, m2, filepath.Join(t.TempDir(), "two")); err != nil || n != 10<<10 {
		t.Errorf("a pull sharing disk.tar took %d bytes (%v), want only the new 10 KiB", n, err)
	}
	// five files of the first image, and the second's new pages
	if ds, err := b.Digests(); err != nil || len(ds) != 6 {
		t.Errorf("the store holds %d digests (%v), want 6", len(ds), err)
	}
	// pulled files are read-only
	fi, err := os.Stat(filepath.Join(dst, "disk.tar"))
	if err != nil || fi.Mode().Perm() != 0o400 {
		t.Errorf("a pulled file's mode: %v %v, want 0400", fi.Mode(), err)
	}
	// the pulled dir exists: refused, nothing fetched
	if _, err := b.Pull(ctx, ref, got, dst); err == nil {
		t.Error("a pull onto an existing dir succeeded")
	}
}

// TestPullTampered: a registry that sends other bytes than a file's digest
// says, or a manifest whose files reach outside the image or disagree with
// its layers, is refused, and the pull leaves no image and nothing in the
// store under that digest.
func TestPullTampered(t *testing.T) {
	ctx := context.Background()
	r := newReg(t)
	files := map[string][]byte{"disk.tar": randBytes(64 << 10)}
	a, _ := Open(t.TempDir())
	ref, _, err := a.Push(ctx, r.ref("sbx/t:x"), image(t, files), Manifest{Name: "x"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	m, _, err := Fetch(ctx, ref)
	if err != nil {
		t.Fatal(err)
	}
	r.mu.Lock()
	r.tamper = func(p string, body []byte) []byte {
		if strings.Contains(p, strings.TrimPrefix(m.Files[0].Digest, "sha256:")) && len(body) > 10 {
			body = bytes.Clone(body)
			body[5] ^= 0xff
		}
		return body
	}
	r.mu.Unlock()
	b, _ := Open(t.TempDir())
	dst := filepath.Join(t.TempDir(), "pulled")
	if _, err := b.Pull(ctx, ref, m, dst); err == nil {
		t.Fatal("a pull of a tampered blob succeeded")
	}
	if _, err := os.Stat(dst); !os.IsNotExist(err) {
		t.Errorf("a failed pull left %s: %v", dst, err)
	}
	if b.Has(m.Files[0].Digest) {
		t.Error("the store holds the tampered blob under its digest")
	}

	// hostile manifests
	d := m.Files[0].Digest
	layer := func() []v1.Descriptor {
		h, _ := v1.NewHash(d)
		return []v1.Descriptor{{MediaType: FileMediaType, Digest: h, Size: m.Files[0].Size}}
	}
	for _, p := range []string{"../x", "/etc/passwd", "a/../../x", "..", ".", "", "a//b", `a\..\b`} {
		bad := Manifest{Schema: Schema, Files: []File{{Path: p, Size: m.Files[0].Size, Digest: d}}}
		if err := bad.check(layer()); err == nil {
			t.Errorf("a manifest with path %q passed", p)
		}
	}
	twice := Manifest{Schema: Schema, Files: []File{{Path: "a", Size: m.Files[0].Size, Digest: d}, {Path: "a", Size: m.Files[0].Size, Digest: d}}}
	if err := twice.check(append(layer(), layer()...)); err == nil {
		t.Error("a manifest listing a path twice passed")
	}
	nested := Manifest{Schema: Schema, Files: []File{{Path: "a", Size: m.Files[0].Size, Digest: d}, {Path: "a/b", Size: m.Files[0].Size, Digest: d}}}
	if err := nested.check(append(layer(), layer()...)); err == nil {
		t.Error("a manifest with a file inside a file passed")
	}
	other := Manifest{Schema: Schema, Files: []File{{Path: "a", Size: m.Files[0].Size + 1, Digest: d}}}
	if err := other.check(layer()); err == nil {
		t.Error("a manifest whose file's size is not its layer's passed")
	}
	if err := (Manifest{Schema: 2}).check(nil); err == nil {
		t.Error("a manifest of schema 2 passed")
	}
	// a digest that is no digest never names a store path
	if _, err := b.path("sha256:../../etc"); err == nil {
		t.Error("a bad digest named a path in the store")
	}

	// not an sbx snapshot: an ordinary image
	img := remoteImage(t, r)
	if _, _, err := Fetch(ctx, img); err == nil || !strings.Contains(err.Error(), "not an sbx snapshot") {
		t.Errorf("Fetch of an ordinary image: %v, want not an sbx snapshot", err)
	}
}

// remoteImage pushes an empty ordinary image and returns its reference.
func remoteImage(t *testing.T, r *reg) string {
	t.Helper()
	ref := r.ref("other/img:latest")
	pr, err := name.ParseReference(ref)
	if err != nil {
		t.Fatal(err)
	}
	raw := []byte(`{"schemaVersion":2,"mediaType":"application/vnd.oci.image.manifest.v1+json","config":{"mediaType":"application/vnd.oci.image.config.v1+json","size":2,"digest":"sha256:44136fa355b3678a1146ad16f7e8649e94fb4fc21fe77e8310c060f61caaff8a"},"layers":[]}`)
	if err := remote.WriteLayer(pr.Context(), &bytesLayer{b: []byte("{}"), mt: "application/vnd.oci.image.config.v1+json"}); err != nil {
		t.Fatal(err)
	}
	if err := remote.Put(pr, rawManifest(raw)); err != nil {
		t.Fatal(err)
	}
	return ref
}

// TestPrune: a store file no image links to goes; one an image holds stays.
func TestPrune(t *testing.T) {
	ctx := context.Background()
	r := newReg(t)
	files := map[string][]byte{"a": randBytes(8 << 10), "b": randBytes(4 << 10)}
	a, _ := Open(t.TempDir())
	ref, _, err := a.Push(ctx, r.ref("sbx/p:1"), image(t, files), Manifest{Name: "p"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	m, _, _ := Fetch(ctx, ref)
	b, _ := Open(t.TempDir())
	dst := filepath.Join(t.TempDir(), "im")
	if _, err := b.Pull(ctx, ref, m, dst); err != nil {
		t.Fatal(err)
	}
	if freed, _ := b.Prune(); freed != 0 {
		t.Errorf("Prune freed %d bytes an image still holds", freed)
	}
	os.Remove(filepath.Join(dst, "a"))
	if freed, _ := b.Prune(); freed != 8<<10 {
		t.Errorf("Prune freed %d bytes, want a's 8 KiB", freed)
	}
	if b.Has(m.Files[1].Digest) != true {
		t.Error("Prune removed b, which an image holds")
	}
}
