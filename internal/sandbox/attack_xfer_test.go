package sandbox

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/static"
	"github.com/google/go-containerregistry/pkg/v1/types"

	"sbx.dev/sbx/api"
	"sbx.dev/sbx/internal/snapstore"
)

// hostilePush pushes dir's files as they are (COMPLETE too: a hostile
// registry may hold any artifact) and returns its ref.
func hostilePush(t *testing.T, srv *httptest.Server, repo string, files map[string][]byte) string {
	t.Helper()
	return hostilePushManifest(t, srv, repo, files, snapstore.Manifest{Name: "evil", Template: "tiny", TemplateVersion: "sha256:" + strings.Repeat("1", 64)})
}

// hostilePushManifest is hostilePush with a manifest of the caller's.
func hostilePushManifest(t *testing.T, srv *httptest.Server, repo string, files map[string][]byte, man snapstore.Manifest) string {
	t.Helper()
	dir := t.TempDir()
	for p, b := range files {
		full := filepath.Join(dir, filepath.FromSlash(p))
		os.MkdirAll(filepath.Dir(full), 0o700)
		if err := os.WriteFile(full, b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	st, err := snapstore.Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	ref, _, err := st.Push(context.Background(), strings.TrimPrefix(srv.URL, "http://")+"/"+repo, dir, man, nil)
	if err != nil {
		t.Fatal(err)
	}
	return ref
}

func sha(b []byte) string { h := sha256.Sum256(b); return "sha256:" + hex.EncodeToString(h[:]) }

// TestAttackXferCompleteAliasesStore: a manifest may list COMPLETE (the
// node's own marker) as one of the image's files. The pull hard-links it
// from the content store, then images.complete opens COMPLETE O_TRUNC and
// writes the timestamp through the link: into the store's blob, and into
// every image (here: another pulled snapshot's disk.tar) sharing that inode.
func TestAttackXferCompleteAliasesStore(t *testing.T) {
	ctx := context.Background()
	srv := httptest.NewServer(registry.New(registry.Logger(log.New(io.Discard, "", 0))))
	defer srv.Close()
	m, _ := newTestManager(t, time.Hour)

	victim := tinyTar(t, "victim", 10000)
	good := hostilePush(t, srv, "sbx/good:1", map[string][]byte{diskTar: victim})
	res, err := m.PullSnapshot(ctx, api.PullRequest{Ref: good, Name: "good"})
	if err != nil {
		t.Fatal(err)
	}
	// the hostile artifact: COMPLETE is the victim's disk.tar, by digest
	evil := hostilePush(t, srv, "sbx/evil:1", map[string][]byte{diskTar: tinyTar(t, "x", 1), completeFile: victim})
	_, perr := m.PullSnapshot(ctx, api.PullRequest{Ref: evil, Name: "evil"})

	sn, err := m.cfg.Store.Snapshot(ctx, res.Snapshot.Name)
	if err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile(m.images.disk(sn.ID))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, victim) {
		t.Errorf("pulling %s (err %v) rewrote another snapshot's disk.tar: now %q", evil, perr, got)
	}
	blob := filepath.Join(m.cfg.DataDir, "blobs", "sha256", strings.TrimPrefix(sha(victim), "sha256:"))
	if b, err := os.ReadFile(blob); err == nil && sha(b) != sha(victim) {
		t.Errorf("the content store's %s no longer holds its digest's bytes", sha(victim))
	}
}

// TestAttackXferMemoryFilesOfDiskSnapshot: a manifest saying Memory false
// keeps its memory/ files: the pulled "disk snapshot" holds a memory image
// nobody checked.
func TestAttackXferMemoryFilesOfDiskSnapshot(t *testing.T) {
	ctx := context.Background()
	srv := httptest.NewServer(registry.New(registry.Logger(log.New(io.Discard, "", 0))))
	defer srv.Close()
	m, _ := newTestManager(t, time.Hour)
	ref := hostilePush(t, srv, "sbx/m:1", map[string][]byte{diskTar: tinyTar(t, "d", 1), "memory/checkpoint.img": []byte("c"), "other": []byte("o")})
	res, err := m.PullSnapshot(ctx, api.PullRequest{Ref: ref, Name: "m"})
	if err != nil {
		t.Fatal(err)
	}
	sn, _ := m.cfg.Store.Snapshot(ctx, res.Snapshot.Name)
	for _, p := range []string{memoryDir, "other"} {
		if _, err := os.Stat(filepath.Join(m.images.dir(sn.ID), p)); err == nil {
			t.Errorf("a pulled disk snapshot's image holds %s, which no image of this node has", p)
		}
	}
}

// tinyTar is a disk capture of one file of n bytes.
func tinyTar(t *testing.T, file string, n int) []byte {
	t.Helper()
	var b bytes.Buffer
	tw := tar.NewWriter(&b)
	if err := tw.WriteHeader(&tar.Header{Name: file, Mode: 0o644, Size: int64(n), Typeflag: tar.TypeReg}); err != nil {
		t.Fatal(err)
	}
	tw.Write(bytes.Repeat([]byte("v"), n))
	tw.Close()
	return b.Bytes()
}

// TestAttackXferUncheckedDisk: checkDiskTar ran only when the record names
// a disk limit, so a record without one (the registry's choice) had any
// bytes recorded as a restorable disk snapshot.
func TestAttackXferUncheckedDisk(t *testing.T) {
	ctx := context.Background()
	srv := httptest.NewServer(registry.New(registry.Logger(log.New(io.Discard, "", 0))))
	defer srv.Close()
	m, _ := newTestManager(t, time.Hour)
	ref := hostilePush(t, srv, "sbx/u:1", map[string][]byte{diskTar: bytes.Repeat([]byte("not a tar "), 200)})
	if _, err := m.PullSnapshot(ctx, api.PullRequest{Ref: ref, Name: "u"}); err == nil {
		t.Error("a disk.tar that is no tar was pulled as a restorable snapshot")
	}
}

type rawMan []byte

func (r rawMan) RawManifest() ([]byte, error)        { return r, nil }
func (r rawMan) MediaType() (types.MediaType, error) { return types.OCIManifestSchema1, nil }

// TestAttackXferHugeDisk: a manifest declaring a disk.tar of a petabyte is
// fetched as it comes, up to the declared size: the node's disk fills.
// It must be refused before a byte of it is asked for.
func TestAttackXferHugeDisk(t *testing.T) {
	ctx := context.Background()
	var mu sync.Mutex
	gets := 0
	h := registry.New(registry.Logger(log.New(io.Discard, "", 0)))
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodGet && strings.Contains(r.URL.Path, "/blobs/sha256:"+strings.Repeat("ab", 32)) {
			mu.Lock()
			gets++
			mu.Unlock()
		}
		h.ServeHTTP(w, r)
	}))
	defer srv.Close()
	m, _ := newTestManager(t, time.Hour)
	huge := int64(1) << 50
	dd := "sha256:" + strings.Repeat("ab", 32)
	cfg, _ := json.Marshal(snapstore.Manifest{Schema: snapstore.Schema, Name: "huge", Template: "tiny", TemplateVersion: "sha256:" + strings.Repeat("1", 64),
		Files: []snapstore.File{{Path: diskTar, Size: huge, Digest: dd}}})
	r, err := name.ParseReference(strings.TrimPrefix(srv.URL, "http://") + "/sbx/huge:1")
	if err != nil {
		t.Fatal(err)
	}
	cl := static.NewLayer(cfg, snapstore.ConfigMediaType)
	if err := remote.WriteLayer(r.Context(), cl); err != nil {
		t.Fatal(err)
	}
	cd, _ := cl.Digest()
	raw := fmt.Sprintf(`{"schemaVersion":2,"mediaType":"application/vnd.oci.image.manifest.v1+json","artifactType":%q,`+
		`"config":{"mediaType":%q,"size":%d,"digest":%q},"layers":[{"mediaType":%q,"size":%d,"digest":%q}]}`,
		snapstore.ArtifactType, snapstore.ConfigMediaType, len(cfg), cd, snapstore.FileMediaType, huge, dd)
	if err := remote.Put(r, rawMan(raw)); err != nil {
		t.Fatal(err)
	}
	_, perr := m.PullSnapshot(ctx, api.PullRequest{Ref: r.String(), Name: "huge"})
	mu.Lock()
	defer mu.Unlock()
	if perr == nil || gets > 0 {
		t.Errorf("a disk.tar declared %d bytes: %d GETs of it, pull error %v; want it refused before any GET", huge, gets, perr)
	}
}

// TestAttackXferTemplateName: the manifest's template name was recorded
// as the registry sent it (escapes, newlines, anything), though only its
// version was checked.
func TestAttackXferTemplateName(t *testing.T) {
	ctx := context.Background()
	srv := httptest.NewServer(registry.New(registry.Logger(log.New(io.Discard, "", 0))))
	defer srv.Close()
	m, _ := newTestManager(t, time.Hour)
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, diskTar), tinyTar(t, "a", 1), 0o600)
	st, _ := snapstore.Open(t.TempDir())
	ref, _, err := st.Push(ctx, strings.TrimPrefix(srv.URL, "http://")+"/sbx/tn:1", dir,
		snapstore.Manifest{Name: "tn", Template: "\x1b[2J../../evil\n", TemplateVersion: "sha256:" + strings.Repeat("1", 64)}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if res, err := m.PullSnapshot(ctx, api.PullRequest{Ref: ref}); err == nil {
		t.Errorf("a pull recorded template name %q", res.Snapshot.Template)
	}
}

// TestAttackXferRedirectLeak: a registry may redirect a blob GET anywhere
// the node reaches (a loopback service, a metadata endpoint), and the raw
// body of a refusal there came back in the pull's error, to sbxd's client.
func TestAttackXferRedirectLeak(t *testing.T) {
	ctx := context.Background()
	srv := httptest.NewServer(registry.New(registry.Logger(log.New(io.Discard, "", 0))))
	defer srv.Close()
	m, _ := newTestManager(t, time.Hour)
	disk := tinyTar(t, "a", 10)
	ref := hostilePush(t, srv, "sbx/rd:1", map[string][]byte{diskTar: disk})
	internal := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		http.Error(w, "SECRET-TOKEN-of-the-node", http.StatusForbidden)
	}))
	defer internal.Close()
	hex := strings.TrimPrefix(sha(disk), "sha256:")
	evil := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		if strings.Contains(req.URL.Path, hex) {
			http.Redirect(w, req, internal.URL+"/latest/meta-data/iam?x=1", http.StatusTemporaryRedirect)
			return
		}
		http.Redirect(w, req, srv.URL+req.URL.Path, http.StatusTemporaryRedirect)
	}))
	defer evil.Close()
	ref = strings.Replace(ref, strings.TrimPrefix(srv.URL, "http://"), strings.TrimPrefix(evil.URL, "http://"), 1)
	_, err := m.PullSnapshot(ctx, api.PullRequest{Ref: ref, Name: "rd"})
	if err == nil {
		t.Fatal("the pull succeeded")
	}
	if strings.Contains(err.Error(), "SECRET-TOKEN") {
		t.Errorf("a redirected blob GET's refusal reads back in the error: %v", err)
	}
	if !errors.Is(err, api.ErrForbidden) {
		t.Errorf("the error %v lost its kind", err)
	}
}

// TestAttackXferSlowPullStallsSweep: a pull holds the content store's lock
// while it fetches, so a registry that stops mid-blob (and a client that
// keeps its request open) stalls every other pull past its own context,
// and the sweep (pruneBlobs), and with it the rest of the node's GC.
func TestAttackXferSlowPullStallsSweep(t *testing.T) {
	ctx := context.Background()
	srv := httptest.NewServer(registry.New(registry.Logger(log.New(io.Discard, "", 0))))
	defer srv.Close()
	m, _ := newTestManager(t, time.Hour)
	slowDisk := tinyTar(t, "slow", 64<<10)
	slow := hostilePush(t, srv, "sbx/slow:1", map[string][]byte{diskTar: slowDisk})
	fast := hostilePush(t, srv, "sbx/fast:1", map[string][]byte{diskTar: tinyTar(t, "fast", 10)})
	hex := strings.TrimPrefix(sha(slowDisk), "sha256:")
	release := make(chan struct{})
	hang := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		if strings.Contains(req.URL.Path, hex) && req.Method == http.MethodGet {
			w.Header().Set("Content-Length", fmt.Sprint(len(slowDisk)))
			w.WriteHeader(200)
			w.Write(slowDisk[:1000])
			w.(http.Flusher).Flush()
			select {
			case <-req.Context().Done():
			case <-release:
			}
			return
		}
		http.Redirect(w, req, srv.URL+req.URL.Path, http.StatusTemporaryRedirect)
	}))
	defer hang.Close()
	slow = strings.Replace(slow, strings.TrimPrefix(srv.URL, "http://"), strings.TrimPrefix(hang.URL, "http://"), 1)
	sctx, cancel := context.WithCancel(ctx)
	slowDone := make(chan error, 1)
	go func() { _, err := m.PullSnapshot(sctx, api.PullRequest{Ref: slow, Name: "slow"}); slowDone <- err }()
	defer func() { cancel(); close(release); <-slowDone }()
	time.Sleep(500 * time.Millisecond) // the slow pull is mid-blob

	swept := make(chan struct{})
	go func() { m.pruneBlobs(); close(swept) }()
	select {
	case <-swept:
	case <-time.After(3 * time.Second):
		t.Error("the sweep's prune waits on a pull that a registry holds")
	}
	fctx, fcancel := context.WithTimeout(ctx, time.Second)
	defer fcancel()
	fastDone := make(chan error, 1)
	go func() { _, err := m.PullSnapshot(fctx, api.PullRequest{Ref: fast, Name: "fast"}); fastDone <- err }()
	select {
	case <-fastDone:
	case <-time.After(4 * time.Second):
		t.Error("a pull with a 1 s context waits past it on another's registry")
	}
}
