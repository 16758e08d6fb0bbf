package sandbox

import (
	"context"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"sbx.dev/sbx/api"
	"sbx.dev/sbx/internal/store"
)

// Attacks on the life of a memory fork's image (sandboxes.pages_image, the
// images row of kind "fork"), with the fake runtime. See also
// internal/e2e/attack_forkpages_test.go.

// forkOnDemand makes a parent and n memory forks of it that load their pages
// on demand, and returns them with the image they read.
func forkOnDemand(t *testing.T, m *Manager, n int) (parent string, kids []api.Sandbox, img string) {
	t.Helper()
	ctx := context.Background()
	m.cfg.ForkPagesOnDemand = true
	p, err := m.Create(ctx, api.CreateRequest{})
	if err != nil {
		t.Fatal(err)
	}
	kids, err = m.Fork(ctx, p.ID, api.ForkRequest{Memory: true, Count: n}, func(api.ForkEvent) error { return nil })
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range kids {
		sb, err := m.cfg.Store.Sandbox(ctx, k.ID)
		if err != nil {
			t.Fatal(err)
		}
		if sb.PagesImage == "" || (img != "" && sb.PagesImage != img) {
			t.Fatalf("fork %s reads its pages from %q, want the one fork image (%q)", k.ID, sb.PagesImage, img)
		}
		img = sb.PagesImage
	}
	return p.ID, kids, img
}

func imageExists(m *Manager, img string) bool {
	_, err := os.Stat(m.images.dir(img))
	return err == nil
}

func imageRecorded(t *testing.T, m *Manager, img string) bool {
	t.Helper()
	ims, err := m.cfg.Store.Images(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for _, im := range ims {
		if im.ID == img {
			return true
		}
	}
	return false
}

func pagesOf(t *testing.T, m *Manager, id string) string {
	t.Helper()
	sb, err := m.cfg.Store.Sandbox(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	return sb.PagesImage
}

// TestAttackForkPagesEndedForksHoldImage: a memory fork whose runsc ended
// on its own (its memory limit: the kernel killed it, or it crashed) and one
// runsc lost across a restart of sbxd read nothing any more: no process is
// left to read the image. The README: the image is kept "while any fork
// reads it". Here both forks are in state error / lost, and their image (as
// large as their parent's whole memory) must go at the next sweep.
func TestAttackForkPagesEndedForksHoldImage(t *testing.T) {
	ctx := context.Background()
	m, _ := newTestManager(t, 0)
	rt := m.cfg.Runtime.(*fakeRuntime)
	_, kids, img := forkOnDemand(t, m, 2)

	// kids[0]: its runsc process ends while sbxd runs (the watcher's path)
	rt.mu.Lock()
	delete(rt.running, kids[0].ID)
	rt.mu.Unlock()
	sb0, _ := m.cfg.Store.Sandbox(ctx, kids[0].ID)
	m.recordEnd(ctx, sb0)
	// kids[1]: runsc no longer knows it when sbxd starts again (a reboot)
	rt.mu.Lock()
	delete(rt.running, kids[1].ID)
	rt.mu.Unlock()
	sb1, _ := m.cfg.Store.Sandbox(ctx, kids[1].ID)
	m.reconcile(ctx, sb1)
	for _, k := range kids {
		sb, _ := m.cfg.Store.Sandbox(ctx, k.ID)
		t.Logf("fork %s: %s (%s), pages_image %q", k.ID, sb.State, sb.Reason, sb.PagesImage)
		if sb.State == api.StateReady {
			t.Fatalf("fork %s is still ready after its runsc went", k.ID)
		}
	}
	m.sweep(ctx)
	if imageExists(m, img) {
		t.Errorf("the fork image %s is kept after every fork that read it ended (states error and lost): "+
			"no runsc reads it, yet pages_image still names it until each dead fork is deleted "+
			"(want: the hold dropped when a fork's runsc is gone, as adoptStopped does)", img)
	}
}

// TestAttackForkPagesSnapshotReconciledReleases: a memory snapshot of a fork
// loads every page (the checkpoint reads them): capture() then drops the
// fork's hold (pagesAllLoaded). sbxd killed after the image is complete but
// before the snapshot is recorded: the restart keeps the snapshot
// (reconcileSnapshot); the fork holds every page as much as after an
// uninterrupted snapshot, so its hold must go too.
func TestAttackForkPagesSnapshotReconciledReleases(t *testing.T) {
	ctx := context.Background()
	m, clk := newTestManager(t, 0)
	_, kids, img := forkOnDemand(t, m, 1)
	k := kids[0].ID
	// what capture() did for a snapshot --memory before sbxd died: a
	// journal entry and a complete image, the checkpoint having read every
	// page of the fork
	snap, err := m.images.make(true)
	if err != nil {
		t.Fatal(err)
	}
	if err := m.cfg.Runtime.Checkpoint(ctx, k, m.images.mem(snap), true); err != nil {
		t.Fatal(err)
	}
	if err := noteImageAgent("", m.sandboxDir(k), m.images.dir(snap)); err != nil { // as capture() does
		t.Fatal(err)
	}
	if _, err := m.images.complete(snap, true); err != nil {
		t.Fatal(err)
	}
	in := &store.Intent{ID: snap, Kind: kindSnapshot, SandboxID: k, Step: string(stepComplete),
		Detail: map[string]any{"memory": true, "name": "after-crash"}, StartedAt: clk.now()}
	if err := m.cfg.Store.AddIntent(ctx, in); err != nil {
		t.Fatal(err)
	}
	if err := m.reconcileJournal(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := m.cfg.Store.Snapshot(ctx, "after-crash"); err != nil {
		t.Fatalf("the complete snapshot after the restart: %v", err)
	}
	if got := pagesOf(t, m, k); got != "" {
		t.Errorf("after a memory snapshot of fork %s kept by the restart, the fork still holds the fork image %q "+
			"(an uninterrupted snapshot drops it: capture() calls pagesAllLoaded, reconcileSnapshot does not)", k, got)
	}
	m.sweep(ctx)
	if imageExists(m, img) {
		t.Errorf("the fork image %s is kept though its only fork has every page", img)
	}
}

// TestAttackForkPagesAdoptedOnCopyReleases: sbxd dies during a memory
// snapshot of a fork, and the fork's runsc is gone too when it starts again
// (a host reboot): reconcileSnapshot adopts the fork as stopped on a copy
// of the snapshot (adoptOnCopy). A stopped sandbox has no runsc: it reads
// nothing, as after a plain stop (adoptStopped drops the hold). Resumed, it
// loads its pages from its own stop image, not the fork image.
func TestAttackForkPagesAdoptedOnCopyReleases(t *testing.T) {
	ctx := context.Background()
	m, clk := newTestManager(t, 0)
	rt := m.cfg.Runtime.(*fakeRuntime)
	_, kids, img := forkOnDemand(t, m, 1)
	k := kids[0].ID
	snap, err := m.images.make(true)
	if err != nil {
		t.Fatal(err)
	}
	if err := m.cfg.Runtime.Checkpoint(ctx, k, m.images.mem(snap), true); err != nil {
		t.Fatal(err)
	}
	if err := noteImageAgent("", m.sandboxDir(k), m.images.dir(snap)); err != nil { // as capture() does
		t.Fatal(err)
	}
	if _, err := m.images.complete(snap, true); err != nil {
		t.Fatal(err)
	}
	in := &store.Intent{ID: snap, Kind: kindSnapshot, SandboxID: k, Step: string(stepComplete),
		Detail: map[string]any{"memory": true, "name": "lost-fork"}, StartedAt: clk.now()}
	if err := m.cfg.Store.AddIntent(ctx, in); err != nil {
		t.Fatal(err)
	}
	rt.mu.Lock()
	delete(rt.running, k) // runsc lost it
	rt.mu.Unlock()
	if err := m.reconcileJournal(ctx); err != nil {
		t.Fatal(err)
	}
	sb, _ := m.cfg.Store.Sandbox(ctx, k)
	if sb.State != api.StateStopped {
		t.Fatalf("the fork after the restart is %s (%s), want stopped on a copy of its snapshot", sb.State, sb.Reason)
	}
	if sb.PagesImage != "" {
		t.Errorf("fork %s, stopped (no runsc), still holds the fork image %q", k, sb.PagesImage)
	}
	if _, err := m.Resume(ctx, k, true); err != nil {
		t.Fatal(err)
	}
	if got := pagesOf(t, m, k); got != "" {
		t.Errorf("fork %s resumed from its own image still holds the fork image %q", k, got)
	}
	m.sweep(ctx)
	if imageExists(m, img) {
		t.Errorf("the fork image %s is kept though its only fork was stopped and resumed from another image", img)
	}
}

// TestAttackForkPagesConcurrentDeletesAndSweeps: many forks deleted at once
// while sweeps, prunes, df and the orphan budget (1 byte: every orphan is
// over it) run in a loop: the image stays while any fork is left, and goes,
// files and record, once the last is deleted.
func TestAttackForkPagesConcurrentDeletesAndSweeps(t *testing.T) {
	ctx := context.Background()
	m, _ := newTestManager(t, 0)
	m.storage.orphanMax = 1
	_, kids, img := forkOnDemand(t, m, 12)
	// pages worth counting
	if err := os.WriteFile(filepath.Join(m.images.mem(img), "pages.img"), make([]byte, 1<<20), 0o600); err != nil {
		t.Fatal(err)
	}
	stop := make(chan struct{})
	var bg sync.WaitGroup
	var mu sync.Mutex
	var early []string
	left := func() int {
		n := 0
		for _, k := range kids {
			if _, err := m.cfg.Store.Sandbox(ctx, k.ID); err == nil {
				n++
			}
		}
		return n
	}
	for i := 0; i < 3; i++ {
		bg.Add(1)
		go func() {
			defer bg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				// what is left before the sweep: a fork deleted during it
				// may let the image go, one alive before and after may not
				before := left()
				switch i {
				case 0:
					m.sweep(ctx)
				case 1:
					_, _ = m.Prune(ctx, api.PruneRequest{Orphans: true})
				case 2:
					_, _ = m.Storage(ctx)
					m.storage.sweep(ctx)
				}
				if after := left(); before > 0 && after > 0 && !imageExists(m, img) {
					mu.Lock()
					early = append(early, "image gone with forks left")
					mu.Unlock()
				}
			}
		}()
	}
	var wg sync.WaitGroup
	for _, k := range kids[:len(kids)-1] {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, err := m.Delete(ctx, k.ID, false); err != nil {
				t.Errorf("delete %s: %v", k.ID, err)
			}
		}()
	}
	wg.Wait()
	time.Sleep(50 * time.Millisecond)
	if !imageExists(m, img) {
		t.Errorf("the fork image went while fork %s still reads it", kids[len(kids)-1].ID)
	}
	if _, err := m.Delete(ctx, kids[len(kids)-1].ID, false); err != nil {
		t.Fatal(err)
	}
	close(stop)
	bg.Wait()
	if len(early) > 0 {
		t.Errorf("during the deletes: %v", early[0])
	}
	m.sweep(ctx)
	if imageExists(m, img) || imageRecorded(t, m, img) {
		t.Errorf("the fork image %s (files %v, record %v) is kept after its last fork was deleted", img, imageExists(m, img), imageRecorded(t, m, img))
	}
}

// TestAttackForkPagesParentDeletedFirst: the parent deleted while its forks
// read the image (its delete orphans its images: OrphanImages) does not
// take the image, nor change when it goes: with the last fork.
func TestAttackForkPagesParentDeletedFirst(t *testing.T) {
	ctx := context.Background()
	m, clk := newTestManager(t, 0)
	parent, kids, img := forkOnDemand(t, m, 2)
	if _, err := m.Delete(ctx, parent, false); err != nil {
		t.Fatal(err)
	}
	clk.add(30 * 24 * time.Hour) // past any orphan grace
	m.sweep(ctx)
	if !imageExists(m, img) {
		t.Fatalf("the fork image went with its parent while two forks read it")
	}
	st, err := m.Storage(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, o := range st.Orphans {
		if o.ID == img {
			t.Errorf("df lists the image its forks read as an orphan")
		}
	}
	for _, k := range kids {
		if _, err := m.Delete(ctx, k.ID, false); err != nil {
			t.Fatal(err)
		}
	}
	m.sweep(ctx)
	if imageExists(m, img) || imageRecorded(t, m, img) {
		t.Errorf("the fork image is kept after its parent and both forks were deleted")
	}
}

// TestAttackForkPagesRestartLeftoversKeepImage: the leftover pass of a
// restart keeps the image a fork reads even when sbxd now runs with
// --fork-pages-on-demand=false, and a new fork then loads every page (no
// hold); the old image still goes with its last fork.
func TestAttackForkPagesRestartLeftoversKeepImage(t *testing.T) {
	ctx := context.Background()
	m, _ := newTestManager(t, 0)
	parent, kids, img := forkOnDemand(t, m, 1)
	m.cfg.ForkPagesOnDemand = false
	if err := m.removeLeftovers(ctx); err != nil {
		t.Fatal(err)
	}
	m.sweep(ctx)
	if !imageExists(m, img) {
		t.Fatal("a restart with --fork-pages-on-demand=false removed the image a fork reads")
	}
	more, err := m.Fork(ctx, parent, api.ForkRequest{Memory: true}, func(api.ForkEvent) error { return nil })
	if err != nil {
		t.Fatal(err)
	}
	if got := pagesOf(t, m, more[0].ID); got != "" {
		t.Errorf("a fork made with --fork-pages-on-demand=false holds %q", got)
	}
	if _, err := m.Delete(ctx, kids[0].ID, false); err != nil {
		t.Fatal(err)
	}
	m.sweep(ctx)
	if imageExists(m, img) {
		t.Errorf("the fork image is kept after its last fork went, with on-demand pages now off")
	}
}
