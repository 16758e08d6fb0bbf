package sandbox

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"sbx.dev/sbx/api"
)

// An image's COMPLETE names the sizes of its memory files, and a file cut
// short (or grown, or gone) since is found before anything restores it.
// An image completed before COMPLETE named them passes.
func TestImageCheckMemory(t *testing.T) {
	f := imageFiles{root: t.TempDir()}
	id, err := f.make(true)
	if err != nil {
		t.Fatal(err)
	}
	pages := filepath.Join(f.mem(id), "pages.img")
	for name, size := range map[string]int{"checkpoint.img": 100, "pages_meta.img": 10, "pages.img": 3 << 20} {
		if err := os.WriteFile(filepath.Join(f.mem(id), name), make([]byte, size), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(f.disk(id), make([]byte, 1024), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := f.complete(id, true); err != nil {
		t.Fatal(err)
	}
	if err := f.checkMemory(id); err != nil {
		t.Fatalf("a whole image: %v", err)
	}
	// the disk tar is not a memory file: nothing reads its size
	if err := os.Truncate(f.disk(id), 10); err != nil {
		t.Fatal(err)
	}
	if err := f.checkMemory(id); err != nil {
		t.Errorf("a disk tar of another size fails the memory's check: %v", err)
	}
	for _, size := range []int64{3<<20 - 3000, 3 << 19, 0, 3<<20 + 1} {
		if err := os.Truncate(pages, size); err != nil {
			t.Fatal(err)
		}
		err := f.checkMemory(id)
		if err == nil || !strings.Contains(err.Error(), "damaged") || !strings.Contains(err.Error(), "memory/pages.img") {
			t.Errorf("pages.img of %d bytes, %d written: %v, want it named damaged", size, 3<<20, err)
		}
	}
	if err := os.Truncate(pages, 3<<20); err != nil {
		t.Fatal(err)
	}
	if err := f.checkMemory(id); err != nil {
		t.Fatalf("pages.img whole again: %v", err)
	}
	os.Remove(filepath.Join(f.mem(id), "pages_meta.img"))
	if err := f.checkMemory(id); err == nil || !strings.Contains(err.Error(), "pages_meta.img") {
		t.Errorf("a memory file gone: %v, want it named", err)
	}
	// COMPLETE as sbx wrote it before it named sizes: a time alone
	if err := os.WriteFile(filepath.Join(f.dir(id), completeFile), []byte("2026-12-01T10:00:00Z\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := f.checkMemory(id); err != nil {
		t.Errorf("an image completed before sizes were recorded: %v", err)
	}
}

// A stop image whose pages file was cut short is not restored: resume
// --require-memory refuses and keeps the sandbox stopped with its image;
// a plain resume boots from the disk and says why; new --from a memory
// snapshot cut short refuses and creates nothing.
func TestResumeRefusesDamagedImage(t *testing.T) {
	ctx := context.Background()
	m, _ := newTestManager(t, 0)
	rt := m.cfg.Runtime.(*fakeRuntime)
	sb, err := m.Create(ctx, api.CreateRequest{})
	if err != nil {
		t.Fatal(err)
	}
	snap, err := m.Snapshot(ctx, sb.ID, api.SnapshotRequest{Name: "cut", Memory: true})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := m.Stop(ctx, sb.ID, true); err != nil {
		t.Fatal(err)
	}
	st, _ := m.cfg.Store.Sandbox(ctx, sb.ID)
	img := st.Image
	for _, id := range []string{img, snap.ID} {
		if err := os.Truncate(filepath.Join(m.images.mem(id), "pages.img"), 0); err != nil {
			t.Fatal(err)
		}
	}
	before := len(rt.restores)
	_, err = m.Resume(ctx, sb.ID, true)
	if !errors.Is(err, api.ErrUnavailable) || !strings.Contains(err.Error(), "damaged") {
		t.Fatalf("resume --require-memory of a cut image: %v, want unavailable naming the damage", err)
	}
	if len(rt.restores) != before {
		t.Errorf("runsc was asked to restore a damaged image")
	}
	st, _ = m.cfg.Store.Sandbox(ctx, sb.ID)
	if st.State != api.StateStopped || st.Image != img || !imageExists(m, img) {
		t.Fatalf("after the refused resume: %s with image %q (exists %v), want stopped with %q", st.State, st.Image, imageExists(m, img), img)
	}
	back, err := m.Resume(ctx, sb.ID, false)
	if err != nil {
		t.Fatal(err)
	}
	if back.MemoryRestored || !strings.Contains(back.ResumeReason, "damaged") {
		t.Errorf("a plain resume of a cut image: memory restored %v, reason %q; want a boot from the disk naming the damage", back.MemoryRestored, back.ResumeReason)
	}
	n, _ := m.cfg.Store.Sandboxes(ctx)
	_, err = m.Create(ctx, api.CreateRequest{From: "cut"})
	if !errors.Is(err, api.ErrUnavailable) || !strings.Contains(err.Error(), "damaged") {
		t.Errorf("new --from a cut memory snapshot: %v, want unavailable naming the damage", err)
	}
	if after, _ := m.cfg.Store.Sandboxes(ctx); len(after) != len(n) {
		t.Errorf("a refused new --from left a sandbox: %d then %d", len(n), len(after))
	}
}
