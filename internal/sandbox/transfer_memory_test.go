package sandbox

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/registry"

	"sbx.dev/sbx/api"
	"sbx.dev/sbx/internal/snapstore"
)

var testFacts = HostFacts{RunscSHA256: strings.Repeat("ab", 32), CPUFeatures: []string{"sse4_2", "avx2", "fpu"}, CacheLineBytes: 64}

// TestMemoryFitsHost: a memory image restores only where runsc is the very
// build that took it, the CPU has all its features and the same cache line.
func TestMemoryFitsHost(t *testing.T) {
	man := func(f func(*snapstore.Manifest)) snapstore.Manifest {
		m := snapstore.Manifest{Memory: true, RunscSHA256: testFacts.RunscSHA256, CPUFeatures: []string{"fpu", "sse4_2"}, CacheLineBytes: 64}
		if f != nil {
			f(&m)
		}
		return m
	}
	for _, tc := range []struct {
		name string
		m    snapstore.Manifest
		want string
	}{
		{"same build, a subset of the features", man(nil), ""},
		{"another runsc", man(func(m *snapstore.Manifest) { m.RunscSHA256 = strings.Repeat("cd", 32) }), "another runsc"},
		{"no runsc digest", man(func(m *snapstore.Manifest) { m.RunscSHA256 = "" }), "does not say which runsc"},
		{"a feature this CPU lacks", man(func(m *snapstore.Manifest) { m.CPUFeatures = append(m.CPUFeatures, "avx512f", "amx_tile") }), "lacks (amx_tile avx512f)"},
		{"another cache line", man(func(m *snapstore.Manifest) { m.CacheLineBytes = 128 }), "128-byte cache line"},
	} {
		got := memoryFitsHost(tc.m, testFacts)
		if (tc.want == "") != (got == "") || !strings.Contains(got, tc.want) {
			t.Errorf("%s: %q, want %q", tc.name, got, tc.want)
		}
		if got != "" && !strings.Contains(got, "boots from its disk") {
			t.Errorf("%s: %q does not say what becomes of the snapshot", tc.name, got)
		}
	}
}

// TestPullMemorySnapshot: a memory image this node can restore is pulled
// whole (its memory/ files, nothing else the registry lists) and recorded
// with memory and a disk of this node's own; one it cannot is recorded as
// a disk snapshot saying why, with no memory file fetched; one larger than
// its sandbox's memory can have written is refused, leaving nothing.
func TestPullMemorySnapshot(t *testing.T) {
	ctx := context.Background()
	srv := httptest.NewServer(registry.New(registry.Logger(log.New(io.Discard, "", 0))))
	defer srv.Close()
	m, _ := newTestManager(t, time.Hour)
	m.cfg.HostFacts = func() (HostFacts, error) { return testFacts, nil }
	man := snapstore.Manifest{Name: "mem", Memory: true, Template: "tiny", TemplateVersion: "sha256:" + strings.Repeat("1", 64),
		RunscSHA256: testFacts.RunscSHA256, CPUFeatures: []string{"fpu"}, CacheLineBytes: 64, Record: []byte(`{"memLimit":268435456,"agent":"` + m.agentKey + `"}`)}
	files := map[string][]byte{diskTar: tinyTar(t, "d", 10), "memory/checkpoint.img": []byte("kernel"), "memory/pages_meta.img": []byte("meta"), "memory/pages.img": []byte("pages"),
		"memory/COMPLETE": []byte("x"), "memory/deep/x": []byte("x"), "other": []byte("o")}

	res, err := m.PullSnapshot(ctx, api.PullRequest{Ref: hostilePushManifest(t, srv, "sbx/mem:1", files, man), Name: "mem"})
	if err != nil {
		t.Fatal(err)
	}
	if !res.Snapshot.Memory || res.MemoryLeft != "" {
		t.Fatalf("a restorable memory image pulled as %+v", res)
	}
	sn, err := m.cfg.Store.Snapshot(ctx, "mem")
	if err != nil {
		t.Fatal(err)
	}
	if got, err := os.ReadFile(filepath.Join(m.images.mem(sn.ID), "pages.img")); err != nil || string(got) != "pages" {
		t.Errorf("the pulled memory's pages.img: %q %v", got, err)
	}
	// it restores on the agent its processes run, this node's too
	if key, _, err := m.agentFor(sn.ID); err != nil || key != m.agentKey {
		t.Errorf("the pulled image restores on agent %q (%v), want %s", key, err, m.agentKey)
	}
	for _, p := range []string{"memory/COMPLETE", "memory/deep", "other"} {
		if _, err := os.Stat(filepath.Join(m.images.dir(sn.ID), p)); err == nil {
			t.Errorf("the pulled image holds %s, which no image of this node has", p)
		}
	}
	if !strings.HasPrefix(sn.Disk, m.storage.disksDir()+"/") {
		t.Errorf("the pulled memory snapshot names disk %q, want one in this node's %s", sn.Disk, m.storage.disksDir())
	} else if got, err := os.ReadFile(sn.Disk); err != nil || !bytes.Equal(got, files[diskTar]) {
		t.Errorf("its disk %s: %v", sn.Disk, err)
	}
	// its deletion lets the disk go
	if err := m.DeleteSnapshot(ctx, "mem"); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(sn.Disk); err == nil {
		t.Errorf("the deleted snapshot's disk %s is left", sn.Disk)
	}

	// another runsc: a disk snapshot, saying why, without its memory
	other := man
	other.RunscSHA256 = strings.Repeat("cd", 32)
	res, err = m.PullSnapshot(ctx, api.PullRequest{Ref: hostilePushManifest(t, srv, "sbx/mem:2", files, other), Name: "other"})
	if err != nil {
		t.Fatal(err)
	}
	if res.Snapshot.Memory || !strings.Contains(res.MemoryLeft, "another runsc") {
		t.Errorf("an image of another runsc pulled as %+v, want a disk snapshot saying why", res)
	}
	sn, _ = m.cfg.Store.Snapshot(ctx, "other")
	if _, err := os.Stat(m.images.mem(sn.ID)); err == nil || sn.Disk != "" {
		t.Errorf("the disk snapshot pulled has memory files or a disk of its own (%q)", sn.Disk)
	}

	// an image whose agent this node lacks, or which names none (pushed
	// by an sbx from before the notes) or the legacy one (whatever the
	// pushing node had): its processes would wake up on another binary
	for i, rec := range []string{`{"agent":"0123456789abcdef"}`, `{}`, `{"agent":"legacy"}`} {
		other := man
		other.Record = []byte(rec)
		name := fmt.Sprintf("agentless-%d", i)
		res, err = m.PullSnapshot(ctx, api.PullRequest{Ref: hostilePushManifest(t, srv, fmt.Sprintf("sbx/mem:a%d", i), files, other), Name: name})
		if err != nil {
			t.Fatal(err)
		}
		if res.Snapshot.Memory || !strings.Contains(res.MemoryLeft, "agent") {
			t.Errorf("record %s: pulled as %+v, want a disk snapshot saying the agent is missing", rec, res)
		}
	}

	// memory more than its sandbox can have written: refused before a
	// byte is fetched (the sizes are the manifest's word)
	if err := checkMemoryImage(256<<20+maxKernelState+1, 256<<20); err == nil || !strings.Contains(err.Error(), "more than a sandbox of 256.0 MiB") {
		t.Errorf("a memory image larger than its limit allows: %v, want refused", err)
	}
	if err := checkMemoryImage(256<<20+maxKernelState, 256<<20); err != nil {
		t.Errorf("a memory image its limit allows: %v", err)
	}
}
