package sandbox

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
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

// hostilePush pushes dir's files as they are (COMPLETE too: a hostile
// registry may hold any artifact) and returns its ref.
func hostilePush(t *testing.T, srv *httptest.Server, repo string, files map[string][]byte) string {
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
	ref, _, err := st.Push(context.Background(), strings.TrimPrefix(srv.URL, "http://")+"/"+repo, dir,
		snapstore.Manifest{Name: "evil", TemplateVersion: "sha256:" + strings.Repeat("1", 64)}, nil)
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

	victim := bytes.Repeat([]byte("victim disk "), 1000)
	good := hostilePush(t, srv, "sbx/good:1", map[string][]byte{diskTar: victim})
	res, err := m.PullSnapshot(ctx, api.PullRequest{Ref: good, Name: "good"})
	if err != nil {
		t.Fatal(err)
	}
	// the hostile artifact: COMPLETE is the victim's disk.tar, by digest
	evil := hostilePush(t, srv, "sbx/evil:1", map[string][]byte{diskTar: []byte("x"), completeFile: victim})
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
	ref := hostilePush(t, srv, "sbx/m:1", map[string][]byte{diskTar: []byte("d"), "memory/checkpoint.img": []byte("c"), "other": []byte("o")})
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
