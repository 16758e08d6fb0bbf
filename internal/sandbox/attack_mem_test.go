package sandbox

import (
	"context"
	"encoding/binary"
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
	"syscall"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/static"
	specs "github.com/opencontainers/runtime-spec/specs-go"

	"sbx.dev/sbx/api"
	"sbx.dev/sbx/internal/runsc"
	"sbx.dev/sbx/internal/snapstore"
)

// memManifest is a memory snapshot's manifest whose facts are this node's
// (testFacts), of a 256 MiB sandbox.
func memManifest(name string) snapstore.Manifest {
	return snapstore.Manifest{Name: name, Memory: true, Template: "tiny", TemplateVersion: "sha256:" + strings.Repeat("1", 64),
		RunscSHA256: testFacts.RunscSHA256, CPUFeatures: []string{"fpu"}, CacheLineBytes: 64, Record: []byte(`{"memLimit":268435456,"agent":"` + testAgentKey() + `"}`)}
}

// testAgentKey is the key of the agent every newTestManager installs.
func testAgentKey() string {
	dir, err := os.MkdirTemp("", "sbx-agent-key-")
	if err != nil {
		panic(err)
	}
	defer os.RemoveAll(dir)
	bin := filepath.Join(dir, "agent-bin")
	if err := os.WriteFile(bin, []byte("#!/bin/true\n"), 0o755); err != nil {
		panic(err)
	}
	_, _, key, err := agentFiles(bin)
	if err != nil {
		panic(err)
	}
	return key
}

// stateFile is a checkpoint.img as runsc writes it: its magic, the length
// of its metadata, the metadata (holding spec), then state bytes.
func stateFile(t *testing.T, spec *specs.Spec) []byte {
	t.Helper()
	all, _ := json.Marshal(map[string]*specs.Spec{"sb_parent": spec})
	meta, _ := json.Marshal(map[string]string{"container_specs": string(all)})
	b := []byte("\x67\x56\x69\x73\x6f\x72\x53\x46")
	b = binary.BigEndian.AppendUint64(b, uint64(len(meta)))
	b = append(b, meta...)
	return append(b, "state follows"...)
}

// memFiles are the files of a memory image whose checkpoint holds spec (a
// spec of today's sbx if nil).
func memFiles(t *testing.T, spec *specs.Spec) map[string][]byte {
	t.Helper()
	if spec == nil {
		spec = runsc.Spec(runsc.SpecOptions{Rootfs: "/r", AgentDir: "/a", EtcDir: "/e"})
	}
	return map[string][]byte{diskTar: tinyTar(t, "d", 10), "memory/checkpoint.img": stateFile(t, spec),
		"memory/pages_meta.img": []byte("meta"), "memory/pages.img": []byte("pages")}
}

// memTestManager is a test manager whose host facts are testFacts.
func memTestManager(t *testing.T) *Manager {
	t.Helper()
	m, _ := newTestManager(t, time.Hour)
	m.cfg.HostFacts = func() (HostFacts, error) { return testFacts, nil }
	return m
}

// assertNothingLeft fails if a pull left an image dir, a disk, a temp dir
// or a snapshot record behind (want: the snapshots there should be).
func assertNothingLeft(t *testing.T, m *Manager, want int) {
	t.Helper()
	ents, _ := os.ReadDir(m.images.root)
	sns, _ := m.cfg.Store.Snapshots(context.Background(), "")
	if len(ents) != want || len(sns) != want {
		var names []string
		for _, e := range ents {
			names = append(names, e.Name())
		}
		t.Errorf("images %v and %d snapshot records, want %d of each", names, len(sns), want)
	}
	memDisks := 0
	for _, sn := range sns {
		if sn.Memory {
			memDisks++
		}
	}
	disks, _ := os.ReadDir(m.storage.disksDir())
	if len(disks) != memDisks {
		t.Errorf("%d disks in %s, want %d (one a memory snapshot)", len(disks), m.storage.disksDir(), memDisks)
	}
	tmps, _ := filepath.Glob(filepath.Join(m.cfg.DataDir, "blobs", "sha256", ".pull-*"))
	if len(tmps) > 0 {
		t.Errorf("the content store holds temp files %v", tmps)
	}
}

// rawPush pushes an artifact whose manifest and layers say what the caller
// says (a hostile node's, sizes and all), with only blobs as blobs.
func rawPush(t *testing.T, srv *httptest.Server, repo string, man snapstore.Manifest, blobs [][]byte) string {
	t.Helper()
	r, err := name.ParseReference(strings.TrimPrefix(srv.URL, "http://") + "/" + repo)
	if err != nil {
		t.Fatal(err)
	}
	for _, b := range blobs {
		if err := remote.WriteLayer(r.Context(), static.NewLayer(b, snapstore.FileMediaType)); err != nil {
			t.Fatal(err)
		}
	}
	man.Schema = snapstore.Schema
	cfg, _ := json.Marshal(man)
	cl := static.NewLayer(cfg, snapstore.ConfigMediaType)
	if err := remote.WriteLayer(r.Context(), cl); err != nil {
		t.Fatal(err)
	}
	cd, _ := cl.Digest()
	var layers []string
	for _, f := range man.Files {
		layers = append(layers, fmt.Sprintf(`{"mediaType":%q,"size":%d,"digest":%q}`, snapstore.FileMediaType, f.Size, f.Digest))
	}
	raw := fmt.Sprintf(`{"schemaVersion":2,"mediaType":"application/vnd.oci.image.manifest.v1+json","artifactType":%q,`+
		`"config":{"mediaType":%q,"size":%d,"digest":%q},"layers":[%s]}`,
		snapstore.ArtifactType, snapstore.ConfigMediaType, len(cfg), cd, strings.Join(layers, ","))
	if err := remote.Put(r, rawMan(raw)); err != nil {
		t.Fatal(err)
	}
	return r.String()
}

// TestAttackMemSizeOverflow: the memory image's size is the sum of what
// the manifest says of its files, and the registry picks the sizes: four
// files of 2^62 bytes and some sum to a few bytes in an int64, which pass
// the bound of the sandbox's memory and the data dir's free space, and the
// node then takes 2^62 bytes a file, as long as the registry sends.
func TestAttackMemSizeOverflow(t *testing.T) {
	ctx := context.Background()
	var mu sync.Mutex
	gets := 0
	h := registry.New(registry.Logger(log.New(io.Discard, "", 0)))
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodGet && strings.Contains(r.URL.Path, "/blobs/sha256:"+strings.Repeat("e", 63)) {
			mu.Lock()
			gets++
			mu.Unlock()
		}
		h.ServeHTTP(w, r)
	}))
	defer srv.Close()
	m := memTestManager(t)
	disk := tinyTar(t, "d", 10)
	man := memManifest("ovf")
	man.Files = []snapstore.File{{Path: diskTar, Size: int64(len(disk)), Digest: sha(disk)}}
	for i, p := range []string{"checkpoint.img", "pages_meta.img", "pages.img", "pages2.img"} {
		size := int64(1) << 62
		if i == 3 {
			size += 1000 // the sum: 2^64 + 1000, 1000 in an int64
		}
		man.Files = append(man.Files, snapstore.File{Path: "memory/" + p, Size: size, Digest: fmt.Sprintf("sha256:%s%d", strings.Repeat("e", 63), i)})
	}
	ref := rawPush(t, srv, "sbx/ovf:1", man, [][]byte{disk})
	_, err := m.PullSnapshot(ctx, api.PullRequest{Ref: ref, Name: "ovf"})
	mu.Lock()
	defer mu.Unlock()
	if err == nil || gets > 0 {
		t.Errorf("memory files of 2^62 bytes each: %d GETs of them, pull error %v; want refused before any GET", gets, err)
	}
	assertNothingLeft(t, m, 0)
}

// TestAttackMemNoCheckpoint: facts that match and memory files that are
// no checkpoint (none of runsc's three files, or an empty state file) were
// recorded as a memory snapshot, which every create then fails to restore
// (and which sbxd's own reconcile holds to be incomplete). A capture here
// verifies its checkpoint; a pull must too.
func TestAttackMemNoCheckpoint(t *testing.T) {
	ctx := context.Background()
	srv := httptest.NewServer(registry.New(registry.Logger(log.New(io.Discard, "", 0))))
	defer srv.Close()
	for _, tc := range []struct {
		name  string
		edit  func(map[string][]byte)
		wants string
	}{
		{"no runsc file at all", func(f map[string][]byte) {
			delete(f, "memory/checkpoint.img")
			delete(f, "memory/pages_meta.img")
			delete(f, "memory/pages.img")
			f["memory/junk"] = []byte("x")
		}, "checkpoint.img"},
		{"no pages", func(f map[string][]byte) { delete(f, "memory/pages.img") }, "pages.img"},
		{"an empty state file", func(f map[string][]byte) { f["memory/checkpoint.img"] = nil }, "checkpoint.img"},
	} {
		tag := fmt.Sprintf("sbx/nock:%d", len(tc.name))
		t.Run(tc.name, func(t *testing.T) {
			m := memTestManager(t)
			files := memFiles(t, nil)
			tc.edit(files)
			ref := hostilePushManifest(t, srv, tag, files, memManifest("nock"))
			res, err := m.PullSnapshot(ctx, api.PullRequest{Ref: ref, Name: "nock"})
			if err == nil {
				t.Fatalf("pulled as %+v, want refused", res.Snapshot)
			}
			if !strings.Contains(err.Error(), tc.wants) {
				t.Errorf("the refusal %q does not name %s", err, tc.wants)
			}
			assertNothingLeft(t, m, 0)
		})
	}
}

// TestAttackMemCheckpointMounts: a restore gives the bundle the mounts of
// the image's checkpoint (runsc compares them), each with this sandbox's
// source where the bundle has one, and the image's own source where it
// has not; and the image's options. A checkpoint is the pushing node's
// word: one naming a bind of the host's / at /host, or the agent's dir
// (every sandbox's) read-write, was pulled as a memory snapshot whose
// restore hands the sandbox those host files.
func TestAttackMemCheckpointMounts(t *testing.T) {
	ctx := context.Background()
	srv := httptest.NewServer(registry.New(registry.Logger(log.New(io.Discard, "", 0))))
	defer srv.Close()
	today := func() *specs.Spec { return runsc.Spec(runsc.SpecOptions{Rootfs: "/r", AgentDir: "/a", EtcDir: "/e"}) }
	for _, tc := range []struct {
		name string
		edit func(*specs.Spec)
		ok   bool
	}{
		{"today's spec", func(*specs.Spec) {}, true},
		{"a bind of the host's root", func(s *specs.Spec) {
			s.Mounts = append(s.Mounts, specs.Mount{Destination: "/host", Type: "bind", Source: "/", Options: []string{"rbind", "rw"}})
		}, false},
		{"the agent's dir read-write", func(s *specs.Spec) {
			for i := range s.Mounts {
				if s.Mounts[i].Destination == runsc.AgentDir {
					s.Mounts[i].Options = []string{"rbind", "rw"}
				}
			}
		}, false},
		{"a bind by its options", func(s *specs.Spec) {
			s.Mounts = append(s.Mounts, specs.Mount{Destination: "/host", Type: "none", Source: "/root", Options: []string{"rbind"}})
		}, false},
		{"a legacy /etc file up a level", func(s *specs.Spec) {
			s.Mounts = append(s.Mounts, specs.Mount{Destination: "/etc/..", Type: "bind", Source: "/", Options: []string{"rbind", "rw"}})
		}, false},
		{"a legacy /etc file", func(s *specs.Spec) {
			s.Mounts = append(s.Mounts, specs.Mount{Destination: "/etc/hosts", Type: "bind", Source: "/old/etc/hosts", Options: []string{"rbind", "rw"}})
		}, true},
		{"a capability sbx never gave", func(s *specs.Spec) {
			s.Process.Capabilities.Bounding = append(s.Process.Capabilities.Bounding, "CAP_SYS_MODULE")
		}, false},
	} {
		tag := fmt.Sprintf("sbx/mnt:%d", len(tc.name))
		t.Run(tc.name, func(t *testing.T) {
			m := memTestManager(t)
			spec := today()
			tc.edit(spec)
			ref := hostilePushManifest(t, srv, tag, memFiles(t, spec), memManifest("mnt"))
			res, err := m.PullSnapshot(ctx, api.PullRequest{Ref: ref, Name: "mnt"})
			if tc.ok {
				if err != nil || !res.Snapshot.Memory {
					t.Fatalf("pulled as %+v, %v; want a memory snapshot", res, err)
				}
				assertNothingLeft(t, m, 1)
				return
			}
			if err == nil {
				t.Fatalf("pulled as %+v, want refused", res.Snapshot)
			}
			assertNothingLeft(t, m, 0)
		})
	}
}

// storeFiles are the files of the node's content store, after a prune.
func storeFiles(t *testing.T, m *Manager) []string {
	t.Helper()
	m.pruneBlobs()
	ents, _ := os.ReadDir(filepath.Join(m.cfg.DataDir, "blobs", "sha256"))
	var out []string
	for _, e := range ents {
		out = append(out, e.Name())
	}
	return out
}

// TestAttackMemSharedBlobs: two memory snapshots pulled from the same blobs
// share the store's inodes (hard links), their disks too. Deleting one
// leaves the other whole; deleting both leaves nothing, in the images, the
// disks or the store.
func TestAttackMemSharedBlobs(t *testing.T) {
	ctx := context.Background()
	srv := httptest.NewServer(registry.New(registry.Logger(log.New(io.Discard, "", 0))))
	defer srv.Close()
	m := memTestManager(t)
	files := memFiles(t, nil)
	ref := hostilePushManifest(t, srv, "sbx/shared:1", files, memManifest("shared"))
	for _, n := range []string{"a", "b"} {
		if _, err := m.PullSnapshot(ctx, api.PullRequest{Ref: ref, Name: n}); err != nil {
			t.Fatal(err)
		}
	}
	b, err := m.cfg.Store.Snapshot(ctx, "b")
	if err != nil {
		t.Fatal(err)
	}
	if err := m.DeleteSnapshot(ctx, "a"); err != nil {
		t.Fatal(err)
	}
	assertNothingLeft(t, m, 1)
	for p, want := range files {
		if got, err := os.ReadFile(filepath.Join(m.images.dir(b.ID), filepath.FromSlash(p))); err != nil || string(got) != string(want) {
			t.Errorf("snapshot b's %s after a's delete: %q %v", p, got, err)
		}
	}
	if got, err := os.ReadFile(b.Disk); err != nil || string(got) != string(files[diskTar]) {
		t.Errorf("snapshot b's disk %s after a's delete: %v", b.Disk, err)
	}
	if len(storeFiles(t, m)) == 0 {
		t.Error("the store let go of the files snapshot b links")
	}
	if err := m.DeleteSnapshot(ctx, "b"); err != nil {
		t.Fatal(err)
	}
	assertNothingLeft(t, m, 0)
	if left := storeFiles(t, m); len(left) > 0 {
		t.Errorf("the store holds %v once no snapshot links them", left)
	}
}

// TestAttackMemFailedPullLeavesNothing: a pull of a memory image that fails
// at any step (a file name the filesystem refuses, a registry that dies
// mid-blob, a context cancelled mid-blob, a disk.tar that is no tar, a
// template this node lacks) leaves no image, disk, temp file or record,
// and nothing in the store its next prune keeps.
func TestAttackMemFailedPullLeavesNothing(t *testing.T) {
	ctx := context.Background()
	h := registry.New(registry.Logger(log.New(io.Discard, "", 0)))
	pages := make([]byte, 1<<20)
	var cancelMid context.CancelFunc
	var mu sync.Mutex
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodGet && strings.Contains(r.URL.Path, strings.TrimPrefix(sha(pages), "sha256:")) {
			mu.Lock()
			cancel := cancelMid
			mu.Unlock()
			w.Header().Set("Content-Length", fmt.Sprint(len(pages)))
			w.WriteHeader(200)
			w.Write(pages[:len(pages)/2])
			w.(http.Flusher).Flush()
			if cancel != nil {
				cancel()
				<-r.Context().Done()
			}
			// else: the registry dies mid-blob
			return
		}
		h.ServeHTTP(w, r)
	}))
	defer srv.Close()
	withPages := func() map[string][]byte {
		f := memFiles(t, nil)
		f["memory/pages.img"] = pages
		return f
	}
	for i, tc := range []struct {
		name   string
		ref    func() string
		cancel bool
	}{
		{"a NUL in a memory file's name", func() string {
			f := memFiles(t, nil)
			man := memManifest("x")
			var blobs [][]byte
			for p, b := range f {
				if p == "memory/pages.img" {
					p = "memory/pa\x00ges.img"
				}
				man.Files = append(man.Files, snapstore.File{Path: p, Size: int64(len(b)), Digest: sha(b)})
				blobs = append(blobs, b)
			}
			man.Files = append(man.Files, snapstore.File{Path: "memory/pages.img", Size: 1, Digest: sha([]byte("p"))})
			return rawPush(t, srv, "sbx/fail:nul", man, append(blobs, []byte("p")))
		}, false},
		{"a registry that dies mid-blob", func() string {
			return hostilePushManifest(t, srv, "sbx/fail:dies", withPages(), memManifest("x"))
		}, false},
		{"a context cancelled mid-blob", func() string {
			return hostilePushManifest(t, srv, "sbx/fail:cancel", withPages(), memManifest("x"))
		}, true},
		{"a disk.tar that is no tar", func() string {
			f := memFiles(t, nil)
			f[diskTar] = []byte(strings.Repeat("not a tar ", 100))
			return hostilePushManifest(t, srv, "sbx/fail:tar", f, memManifest("x"))
		}, false},
		{"a template this node lacks", func() string {
			man := memManifest("x")
			man.TemplateVersion = "sha256:" + strings.Repeat("9", 64)
			return hostilePushManifest(t, srv, "sbx/fail:tpl", memFiles(t, nil), man)
		}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := memTestManager(t)
			if tc.name == "a template this node lacks" {
				m.cfg.Templates = missingTemplates{m.cfg.Templates}
			}
			ref := tc.ref()
			pctx, cancel := context.WithCancel(ctx)
			defer cancel()
			mu.Lock()
			cancelMid = nil
			if tc.cancel {
				cancelMid = cancel
			}
			mu.Unlock()
			res, err := m.PullSnapshot(pctx, api.PullRequest{Ref: ref, Name: fmt.Sprintf("f%d", i)})
			if err == nil {
				t.Fatalf("pulled as %+v, want a failure", res.Snapshot)
			}
			assertNothingLeft(t, m, 0)
			if left := storeFiles(t, m); len(left) > 0 {
				t.Errorf("the store holds %v after a failed pull and a prune", left)
			}
		})
	}
}

// missingTemplates is a template store that has no version but tiny's.
type missingTemplates struct{ Templates }

func (t missingTemplates) Version(v string) (api.Template, error) {
	if v != "sha256:"+strings.Repeat("1", 64) {
		return api.Template{}, api.Errorf(api.ErrNotFound, "no template version %s", v)
	}
	return t.Templates.Version(v)
}

// TestAttackMemConcurrentPulls: pulls of one artifact under one name at
// once: one snapshot, one image, one disk; the others refused, leaving
// nothing.
func TestAttackMemConcurrentPulls(t *testing.T) {
	ctx := context.Background()
	srv := httptest.NewServer(registry.New(registry.Logger(log.New(io.Discard, "", 0))))
	defer srv.Close()
	m := memTestManager(t)
	ref := hostilePushManifest(t, srv, "sbx/conc:1", memFiles(t, nil), memManifest("conc"))
	var wg sync.WaitGroup
	errs := make(chan error, 6)
	for range 6 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, err := m.PullSnapshot(ctx, api.PullRequest{Ref: ref, Name: "conc"})
			errs <- err
		}()
	}
	wg.Wait()
	close(errs)
	ok := 0
	for err := range errs {
		if err == nil {
			ok++
		}
	}
	if ok != 1 {
		t.Errorf("%d of 6 pulls under one name succeeded, want 1", ok)
	}
	assertNothingLeft(t, m, 1)
}

// TestAttackMemControlName: a memory file's name is the manifest's word: a
// NUL in it passed the manifest's check and failed the pull at its link,
// said as "the registry does not answer", with the name's raw bytes (a
// terminal's escapes too) in the error sbxd's client prints.
func TestAttackMemControlName(t *testing.T) {
	ctx := context.Background()
	srv := httptest.NewServer(registry.New(registry.Logger(log.New(io.Discard, "", 0))))
	defer srv.Close()
	for i, bad := range []string{"memory/pa\x00ges.img", "memory/\x1b[2Jx", "memory/x\ny"} {
		m := memTestManager(t)
		f := memFiles(t, nil)
		man := memManifest("x")
		var blobs [][]byte
		for p, b := range f {
			man.Files = append(man.Files, snapstore.File{Path: p, Size: int64(len(b)), Digest: sha(b)})
			blobs = append(blobs, b)
		}
		man.Files = append(man.Files, snapstore.File{Path: bad, Size: 1, Digest: sha([]byte("p"))})
		ref := rawPush(t, srv, fmt.Sprintf("sbx/ctl:%d", i), man, append(blobs, []byte("p")))
		_, err := m.PullSnapshot(ctx, api.PullRequest{Ref: ref, Name: "x"})
		if !errors.Is(err, api.ErrInvalid) || strings.ContainsAny(err.Error(), "\x00\x1b\n") {
			t.Errorf("a file named %q: %q, want it refused as invalid, the name quoted", bad, err)
		}
		assertNothingLeft(t, m, 0)
	}
}

// TestAttackMemLocalError: a pull that fails on this node's own disk (a
// full one, above all: ENOSPC) was said to be the registry's fault ("the
// registry does not answer", unavailable), since a syscall.Errno is a
// net.Error. Here the images dir is a file (ENOTDIR), which fails the same
// way a full disk does.
func TestAttackMemLocalError(t *testing.T) {
	ctx := context.Background()
	srv := httptest.NewServer(registry.New(registry.Logger(log.New(io.Discard, "", 0))))
	defer srv.Close()
	m := memTestManager(t)
	ref := hostilePushManifest(t, srv, "sbx/local:1", memFiles(t, nil), memManifest("local"))
	if err := os.RemoveAll(m.images.root); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(m.images.root, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	_, err := m.PullSnapshot(ctx, api.PullRequest{Ref: ref, Name: "local"})
	if err == nil || strings.Contains(err.Error(), "registry") {
		t.Errorf("a pull failing on this node's disk: %v, want an error that does not blame the registry", err)
	}
	if got := registryError("pull", "r", fmt.Errorf("write: %w", &os.PathError{Op: "write", Path: "/x", Err: syscall.ENOSPC})); !strings.Contains(got.Error(), "free some space") {
		t.Errorf("a full disk: %v, want it to say to free some space", got)
	}
}
