package sandbox

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"sbx.dev/sbx/api"
)

// TestForkImageKeptWhileForksReadIt: memory forks that load their pages on
// demand read the fork's image for their whole life, so it is kept (and
// counted, once) while any of them reads it, survives a restart's leftover
// pass and the sweep, and goes once the last fork is deleted or has all its
// pages (a stop). Without on-demand pages the image goes at once, as before.
func TestForkImageKeptWhileForksReadIt(t *testing.T) {
	ctx := context.Background()
	m, _ := newTestManager(t, 0)
	m.cfg.ForkPagesOnDemand = true
	rt := m.cfg.Runtime.(*fakeRuntime)
	parent, err := m.Create(ctx, api.CreateRequest{})
	if err != nil {
		t.Fatal(err)
	}
	kids, err := m.Fork(ctx, parent.ID, api.ForkRequest{Memory: true, Count: 3}, func(api.ForkEvent) error { return nil })
	if err != nil {
		t.Fatal(err)
	}
	var img string
	for _, k := range kids {
		if o := rt.restores[k.ID]; !o.PagesOnDemand {
			t.Errorf("fork %s restored with %+v, want its pages on demand", k.ID, o)
		}
		sb, err := m.cfg.Store.Sandbox(ctx, k.ID)
		if err != nil {
			t.Fatal(err)
		}
		if sb.PagesImage == "" || (img != "" && sb.PagesImage != img) {
			t.Fatalf("fork %s reads its pages from %q, want the one fork's image (%q)", k.ID, sb.PagesImage, img)
		}
		img = sb.PagesImage
	}
	exists := func() bool { _, err := os.Stat(m.images.dir(img)); return err == nil }
	if !exists() {
		t.Fatalf("the fork's image %s is gone while its forks read it", img)
	}
	m.sweep(ctx)
	if err := m.removeLeftovers(ctx); err != nil {
		t.Fatal(err)
	}
	if !exists() {
		t.Fatalf("the sweep or a restart's leftover pass removed the image %s its forks read", img)
	}
	// pages worth counting: 4 MiB, where each fork's own files are bytes
	if err := os.WriteFile(filepath.Join(m.images.mem(img), "pages.img"), make([]byte, 4<<20), 0o600); err != nil {
		t.Fatal(err)
	}
	st, err := m.Storage(ctx)
	if err != nil {
		t.Fatal(err)
	}
	counted := 0
	for _, it := range st.Sandboxes {
		if it.ID == kids[0].ID || it.ID == kids[1].ID || it.ID == kids[2].ID {
			if it.Bytes >= 4<<20 {
				counted++
			}
		}
	}
	if counted != 1 || len(st.Orphans) != 0 {
		t.Errorf("df: the image counted with %d forks and %d orphans, want once, with a fork, and no orphan", counted, len(st.Orphans))
	}
	if _, err := m.Delete(ctx, kids[0].ID, false); err != nil {
		t.Fatal(err)
	}
	m.sweep(ctx)
	if !exists() {
		t.Fatal("the image went with the first fork deleted; two still read it")
	}
	// a stop loads every page (the checkpoint reads them) and ends runsc
	if _, err := m.Stop(ctx, kids[1].ID, true); err != nil {
		t.Fatal(err)
	}
	if sb, _ := m.cfg.Store.Sandbox(ctx, kids[1].ID); sb.PagesImage != "" {
		t.Errorf("a stopped fork still reads %q", sb.PagesImage)
	}
	m.sweep(ctx)
	if !exists() {
		t.Fatal("the image went while the last fork reads it")
	}
	// a snapshot with memory of the last one reads every page too
	if _, err := m.Snapshot(ctx, kids[2].ID, api.SnapshotRequest{Name: "kid", Memory: true}); err != nil {
		t.Fatal(err)
	}
	m.sweep(ctx)
	if exists() {
		t.Errorf("the image %s is kept once no fork reads it", img)
	}
	ims, err := m.cfg.Store.Images(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, im := range ims {
		if im.ID == img {
			t.Errorf("the image's record is kept after its files went")
		}
	}

	// without on-demand pages: the image goes as the fork ends
	m.cfg.ForkPagesOnDemand = false
	before, _ := os.ReadDir(m.images.root)
	kids, err = m.Fork(ctx, parent.ID, api.ForkRequest{Memory: true}, func(api.ForkEvent) error { return nil })
	if err != nil {
		t.Fatal(err)
	}
	if o := rt.restores[kids[0].ID]; o.PagesOnDemand {
		t.Errorf("a fork restored on demand with --fork-pages-on-demand=false")
	}
	if after, _ := os.ReadDir(m.images.root); len(after) != len(before) {
		t.Errorf("images after a fork that loads every page: %d, want %d", len(after), len(before))
	}
}
