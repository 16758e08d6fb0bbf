package sandbox

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"sbx.dev/sbx/api"
	"sbx.dev/sbx/internal/store"
)

// addFreeze records a freeze of sandbox sb as recordFreeze leaves one: an
// image holding the slot's note and a checkpoint, and its snapshot.
func addFreeze(t *testing.T, m *Manager, sb *store.Sandbox, name string, size int64, at time.Time) *store.Snapshot {
	t.Helper()
	img := newID("im_")
	if err := os.MkdirAll(m.images.mem(img), 0o700); err != nil {
		t.Fatal(err)
	}
	os.WriteFile(filepath.Join(m.images.dir(img), slotMetaFile), []byte(`{"name":"`+name+`"}`), 0o600)
	os.WriteFile(filepath.Join(m.images.mem(img), "pages.img"), make([]byte, 8192), 0o600)
	sn := m.snapshotRecord(sb, name, img, true, size, 0)
	sn.CreatedAt = at
	if err := m.cfg.Store.CreateSnapshot(context.Background(), sn); err != nil {
		t.Fatal(err)
	}
	return sn
}

// addOrphan leaves an image of sandbox id as a delete leaves a stop's: an
// image of size bytes, recorded, orphaned at at.
func addOrphan(t *testing.T, m *Manager, id string, size int, at time.Time) string {
	t.Helper()
	ctx := context.Background()
	img := newID("im_")
	os.MkdirAll(m.images.dir(img), 0o700)
	if err := os.WriteFile(m.images.disk(img), make([]byte, size), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := m.cfg.Store.AddImage(ctx, &store.Image{ID: img, SandboxID: id, Kind: "stop", CreatedAt: at}); err != nil {
		t.Fatal(err)
	}
	if err := m.cfg.Store.OrphanImages(ctx, id, at); err != nil {
		t.Fatal(err)
	}
	return img
}

// TestFreezeQuota: a freeze past its sandbox's count, bytes or rate is
// refused, saying which bound and what to do; promoted freezes count in no
// quota; another sandbox's freezes are not its.
func TestFreezeQuota(t *testing.T) {
	ctx := context.Background()
	m, clk := newTestManager(t, 0)
	m.storage.quota = FreezeQuota{MaxCount: 3, MaxBytes: 1 << 30, MinInterval: 10 * time.Second}
	a, err := m.Create(ctx, api.CreateRequest{})
	if err != nil {
		t.Fatal(err)
	}
	b, _ := m.Create(ctx, api.CreateRequest{})
	sa, _ := m.cfg.Store.Sandbox(ctx, a.ID)
	sbb, _ := m.cfg.Store.Sandbox(ctx, b.ID)
	if err := m.storage.freezeAllowed(ctx, sa, 100<<20); err != nil {
		t.Fatalf("the first freeze: %v, want allowed", err)
	}
	addFreeze(t, m, sa, "freeze-a-1", 100<<20, clk.now())
	if err := m.storage.freezeAllowed(ctx, sa, 100<<20); !errors.Is(err, api.ErrConflict) || !strings.Contains(err.Error(), "at most one per 10s (sbxd --freeze-min-interval)") {
		t.Errorf("a freeze 0s after the last: %v, want the rate limit", err)
	}
	if err := m.storage.freezeAllowed(ctx, sbb, 100<<20); err != nil {
		t.Errorf("another sandbox's freeze: %v, want allowed (quotas are per sandbox)", err)
	}
	clk.add(11 * time.Second)
	addFreeze(t, m, sa, "freeze-a-2", 100<<20, clk.now())
	clk.add(11 * time.Second)
	if err := m.storage.freezeAllowed(ctx, sa, 900<<20); !errors.Is(err, api.ErrConflict) || !strings.Contains(err.Error(), "sbxd --freeze-max-bytes") {
		t.Errorf("a freeze past the bytes: %v, want the bytes quota", err)
	}
	addFreeze(t, m, sa, "freeze-a-3", 100<<20, clk.now())
	clk.add(11 * time.Second)
	err = m.storage.freezeAllowed(ctx, sa, 1<<20)
	if !errors.Is(err, api.ErrConflict) || !strings.Contains(err.Error(), "it has 3 freezes already") || !strings.Contains(err.Error(), "sbx snapshot keep NAME") {
		t.Errorf("a 4th freeze: %v, want the count quota, saying what to do", err)
	}
	if _, err := m.Keep(ctx, "freeze-a-1"); err != nil {
		t.Fatal(err)
	}
	if err := m.storage.freezeAllowed(ctx, sa, 1<<20); err != nil {
		t.Errorf("a freeze once one is kept: %v, want allowed (a kept freeze counts in no quota)", err)
	}
	if _, err := m.Keep(ctx, "no-such"); !errors.Is(err, api.ErrNotFound) {
		t.Errorf("keep of an unknown snapshot: %v, want not found", err)
	}
	// a user's snapshot is no freeze
	if _, err := m.Snapshot(ctx, a.ID, api.SnapshotRequest{Name: "mine", Memory: true}); err != nil {
		t.Fatal(err)
	}
	fzs, _ := m.storage.freezesOf(ctx, a.ID)
	if len(fzs) != 3 {
		t.Errorf("freezes of a: %d, want 3 (a named snapshot is none)", len(fzs))
	}
}

// TestDeleteTakesFreezes: a delete takes its sandbox's freezes, save the
// promoted ones; with KeepFreezes it takes none and marks them kept; its
// named snapshots stay.
func TestDeleteTakesFreezes(t *testing.T) {
	ctx := context.Background()
	m, clk := newTestManager(t, 0)
	mk := func() *store.Sandbox {
		a, err := m.Create(ctx, api.CreateRequest{})
		if err != nil {
			t.Fatal(err)
		}
		sb, _ := m.cfg.Store.Sandbox(ctx, a.ID)
		return sb
	}
	names := func() []string {
		sns, _ := m.cfg.Store.Snapshots(ctx, "")
		var out []string
		for _, sn := range sns {
			out = append(out, sn.Name)
		}
		slices.Sort(out)
		return out
	}
	a := mk()
	fa1 := addFreeze(t, m, a, "freeze-a-1", 1<<20, clk.now())
	addFreeze(t, m, a, "freeze-a-2", 1<<20, clk.now())
	if _, err := m.Snapshot(ctx, a.ID, api.SnapshotRequest{Name: "named"}); err != nil {
		t.Fatal(err)
	}
	if _, err := m.Keep(ctx, "freeze-a-2"); err != nil {
		t.Fatal(err)
	}
	res, err := m.Delete(ctx, a.ID, false)
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"freeze-a-1"}; !slices.Equal(res.Freezes, want) {
		t.Errorf("freezes removed: %v, want %v", res.Freezes, want)
	}
	if got, want := names(), []string{"freeze-a-2", "named"}; !slices.Equal(got, want) {
		t.Errorf("snapshots after the delete: %v, want %v", got, want)
	}
	if fileExists(m.images.dir(fa1.ID)) {
		t.Errorf("the removed freeze's image %s is still there", fa1.ID)
	}

	b := mk()
	addFreeze(t, m, b, "freeze-b-1", 1<<20, clk.now())
	res, err = m.DeleteWith(ctx, b.ID, DeleteOptions{KeepFreezes: true})
	if err != nil || len(res.Freezes) != 0 {
		t.Fatalf("delete --keep-freezes: %+v %v, want no freeze removed", res, err)
	}
	if sn, err := m.cfg.Store.Snapshot(ctx, "freeze-b-1"); err != nil || !sn.Kept {
		t.Errorf("a freeze kept by its delete: %+v %v, want kept", sn, err)
	}
	// a crash between the delete and its freezes: the sweep takes what is left
	c := mk()
	left := addFreeze(t, m, c, "freeze-c-1", 1<<20, clk.now())
	if err := m.cfg.Store.DeleteSandbox(ctx, c.ID); err != nil {
		t.Fatal(err)
	}
	m.storage.sweep(ctx)
	if _, err := m.cfg.Store.Snapshot(ctx, left.Name); !errors.Is(err, api.ErrNotFound) {
		t.Errorf("a freeze whose sandbox is gone, after the sweep: %v, want removed", err)
	}
	if _, err := m.cfg.Store.Snapshot(ctx, "freeze-b-1"); err != nil {
		t.Errorf("the kept freeze after the sweep: %v, want kept", err)
	}
}

// TestPrune: orphans and unkept freezes go, each named with its size;
// --older-than spares the young; a dry run removes nothing; kept freezes
// and named snapshots stay.
func TestPrune(t *testing.T) {
	ctx := context.Background()
	m, clk := newTestManager(t, 0)
	a, _ := m.Create(ctx, api.CreateRequest{})
	sa, _ := m.cfg.Store.Sandbox(ctx, a.ID)
	old := addOrphan(t, m, "sb_gone000001", 1<<20, clk.now().Add(-3*time.Hour))
	young := addOrphan(t, m, "sb_gone000002", 1<<20, clk.now())
	addFreeze(t, m, sa, "freeze-old", 1<<20, clk.now().Add(-3*time.Hour))
	addFreeze(t, m, sa, "freeze-kept", 1<<20, clk.now().Add(-3*time.Hour))
	m.Keep(ctx, "freeze-kept")
	dry, err := m.Prune(ctx, api.PruneRequest{Orphans: true, Freezes: true, DryRun: true})
	if err != nil || len(dry.Removed) != 3 || !dry.DryRun {
		t.Fatalf("dry run: %+v %v, want 3 named", dry, err)
	}
	if !fileExists(m.images.dir(old)) {
		t.Fatal("a dry run removed an orphan")
	}
	res, err := m.Prune(ctx, api.PruneRequest{Orphans: true, Freezes: true, OlderThan: api.Duration(time.Hour)})
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, it := range res.Removed {
		got = append(got, it.Kind+" "+it.ID)
		if it.Bytes <= 0 {
			t.Errorf("%s %s removed with no size", it.Kind, it.ID)
		}
	}
	sn, _ := m.cfg.Store.Snapshot(ctx, "freeze-kept")
	if len(got) != 2 || got[0] != "orphan "+old || !strings.HasPrefix(got[1], "freeze ") || res.Reclaimed < 1<<20 {
		t.Errorf("removed %v (%d bytes), want the old orphan and the old unkept freeze", got, res.Reclaimed)
	}
	if fileExists(m.images.dir(old)) || !fileExists(m.images.dir(young)) || sn == nil {
		t.Errorf("after the prune: old orphan there %v, young orphan there %v, kept freeze %v", fileExists(m.images.dir(old)), fileExists(m.images.dir(young)), sn)
	}
	evs, _ := m.cfg.Store.Events(ctx, "sb_gone000001", 0)
	if len(evs) == 0 || evs[len(evs)-1].Type != EventPruned {
		t.Errorf("events of the pruned orphan's sandbox: %+v, want %q", evs, EventPruned)
	}
}

// TestOrphanBudget: orphans past --orphan-max go before their grace ends,
// oldest first, each with an event; those within it stay.
func TestOrphanBudget(t *testing.T) {
	ctx := context.Background()
	m, clk := newTestManager(t, 0)
	m.storage.orphanMax = 5 << 20
	var imgs []string
	for i := range 4 {
		imgs = append(imgs, addOrphan(t, m, "sb_gone00000"+string(rune('1'+i)), 2<<20, clk.now().Add(time.Duration(i)*time.Minute)))
	}
	m.sweep(ctx)
	for i, img := range imgs {
		if want := i >= 2; fileExists(m.images.dir(img)) != want {
			t.Errorf("orphan %d after the sweep: there %v, want %v (oldest go first, until 4 MiB are left)", i, !want, want)
		}
	}
	evs, _ := m.cfg.Store.Events(ctx, "sb_gone000001", 0)
	if len(evs) == 0 || evs[0].Type != EventSwept || !strings.Contains(evs[0].Detail["reason"].(string), "sbxd --orphan-max") {
		t.Errorf("events of the first orphan's sandbox: %+v, want %q naming --orphan-max", evs, EventSwept)
	}
}

// TestStorageBudget: at --storage-max a capture is refused saying why,
// nothing is left behind and the sandbox runs on; df counts every kind.
func TestStorageBudget(t *testing.T) {
	ctx := context.Background()
	m, clk := newTestManager(t, 0)
	a, _ := m.Create(ctx, api.CreateRequest{})
	sa, _ := m.cfg.Store.Sandbox(ctx, a.ID)
	addFreeze(t, m, sa, "freeze-a", 1<<20, clk.now())
	addOrphan(t, m, "sb_gone000001", 3<<20, clk.now())
	if _, err := m.Snapshot(ctx, a.ID, api.SnapshotRequest{Name: "s1"}); err != nil {
		t.Fatal(err)
	}
	st, err := m.Storage(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(st.Sandboxes) != 1 || len(st.Snapshots) != 1 || len(st.Freezes) != 1 || len(st.Orphans) != 1 {
		t.Errorf("df: %d sandboxes, %d snapshots, %d freezes, %d orphans; want 1 each", len(st.Sandboxes), len(st.Snapshots), len(st.Freezes), len(st.Orphans))
	}
	if st.Totals[api.StorageOrphan] < 3<<20 || st.Used < st.Totals[api.StorageOrphan]+st.Totals[api.StorageFreeze] {
		t.Errorf("df totals %v, used %d: want the orphan's 3 MiB counted", st.Totals, st.Used)
	}
	m.storage.storageMax = st.Used - 1<<20
	imgsBefore, _ := os.ReadDir(m.images.root)
	for _, capture := range []struct {
		name string
		do   func() error
	}{
		{"snapshot", func() error { _, err := m.Snapshot(ctx, a.ID, api.SnapshotRequest{Name: "s2"}); return err }},
		{"fork", func() error {
			_, err := m.Fork(ctx, a.ID, api.ForkRequest{}, func(api.ForkEvent) error { return nil })
			return err
		}},
		{"stop", func() error { _, err := m.Stop(ctx, a.ID, true); return err }},
	} {
		err := capture.do()
		if !errors.Is(err, api.ErrConflict) || !strings.Contains(err.Error(), "sbxd's storage budget is full") || !strings.Contains(err.Error(), "sbx prune") {
			t.Errorf("%s at the budget: %v, want a conflict naming the budget and what to do", capture.name, err)
		}
	}
	if err := m.storage.freezeAllowed(ctx, sa, 0); !errors.Is(err, api.ErrConflict) {
		t.Errorf("a freeze at the budget: %v, want refused", err)
	}
	if imgs, _ := os.ReadDir(m.images.root); len(imgs) != len(imgsBefore) {
		t.Errorf("images after the refused captures: %d, want %d", len(imgs), len(imgsBefore))
	}
	if got, _ := m.cfg.Store.Sandbox(ctx, a.ID); got.State != api.StateReady {
		t.Errorf("the sandbox after the refused captures: %s, want ready", got.State)
	}
	// pruning makes room again
	if _, err := m.Prune(ctx, api.PruneRequest{Orphans: true}); err != nil {
		t.Fatal(err)
	}
	if _, err := m.Snapshot(ctx, a.ID, api.SnapshotRequest{Name: "s2"}); err != nil {
		t.Errorf("a snapshot once the orphan is pruned: %v", err)
	}
}

// TestDeleteReconciledKeepsItsWord: a delete cut short by a crash of sbxd
// is finished at the next start as it was asked: with keepFreezes its
// freezes stay (kept), without it they go.
func TestDeleteReconciledKeepsItsWord(t *testing.T) {
	ctx := context.Background()
	m, clk := newTestManager(t, 0)
	for _, keep := range []bool{true, false} {
		a, err := m.Create(ctx, api.CreateRequest{})
		if err != nil {
			t.Fatal(err)
		}
		sb, _ := m.cfg.Store.Sandbox(ctx, a.ID)
		fz := addFreeze(t, m, sb, "freeze-"+strings.TrimPrefix(sb.ID, "sb_"), 1<<20, clk.now())
		// journaled, then sbxd died
		in := &store.Intent{ID: newID("op_"), Kind: kindDelete, SandboxID: sb.ID, Step: "journaled",
			Detail: map[string]any{"withSnapshots": false, "keepFreezes": keep}, StartedAt: clk.now()}
		if err := m.cfg.Store.AddIntent(ctx, in); err != nil {
			t.Fatal(err)
		}
		if err := m.reconcileJournal(ctx); err != nil {
			t.Fatal(err)
		}
		if _, err := m.cfg.Store.Sandbox(ctx, sb.ID); !errors.Is(err, api.ErrNotFound) {
			t.Errorf("keepFreezes %v: the sandbox after the reconcile: %v, want deleted", keep, err)
		}
		got, err := m.cfg.Store.Snapshot(ctx, fz.Name)
		switch {
		case keep && (err != nil || !got.Kept):
			t.Errorf("keepFreezes: its freeze after the reconcile: %+v %v, want kept", got, err)
		case !keep && !errors.Is(err, api.ErrNotFound):
			t.Errorf("without keepFreezes: its freeze after the reconcile: %+v %v, want gone", got, err)
		}
	}
}

// TestRetiringImageIsNoOrphan: the image a sandbox was just resumed from
// is kept through its retire grace (runsc may still read it): prune and
// the orphan budget leave it; once the grace has passed, it is an orphan.
func TestRetiringImageIsNoOrphan(t *testing.T) {
	ctx := context.Background()
	m, clk := newTestManager(t, 0)
	m.storage.orphanMax = 1
	a, _ := m.Create(ctx, api.CreateRequest{})
	img := newID("im_")
	os.MkdirAll(m.images.dir(img), 0o700)
	os.WriteFile(m.images.disk(img), make([]byte, 1<<20), 0o600)
	m.cfg.Store.AddImage(ctx, &store.Image{ID: img, SandboxID: a.ID, Kind: "stop", CreatedAt: clk.now()})
	m.retireImage(ctx, img)
	m.storage.sweep(ctx)
	res, err := m.Prune(ctx, api.PruneRequest{Orphans: true})
	if err != nil || len(res.Removed) != 0 || !fileExists(m.images.dir(img)) {
		t.Fatalf("prune within the retire grace: %+v %v, image there %v; want nothing removed", res, err, fileExists(m.images.dir(img)))
	}
	clk.add(retireGrace + time.Second)
	if res, err := m.Prune(ctx, api.PruneRequest{Orphans: true}); err != nil || len(res.Removed) != 1 || fileExists(m.images.dir(img)) {
		t.Errorf("prune after the retire grace: %+v %v, want the image removed", res, err)
	}
}
