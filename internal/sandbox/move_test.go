package sandbox

import (
	"context"
	"errors"
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
	"sbx.dev/sbx/internal/store"
)

// stoppedSandbox records on m a stopped sandbox with a complete
// hibernation image (its disk and a checkpoint's three files), as a stop
// leaves one.
func stoppedSandbox(t *testing.T, m *Manager, name string) *store.Sandbox {
	t.Helper()
	ctx := context.Background()
	img, err := m.images.make(true)
	if err != nil {
		t.Fatal(err)
	}
	for p, b := range map[string][]byte{diskTar: tinyTar(t, "d", 10), "memory/checkpoint.img": []byte("kernel"),
		"memory/pages_meta.img": []byte("meta"), "memory/pages.img": []byte("pages"), imageAgentFile: []byte(m.agentKey + "\n")} {
		if err := os.WriteFile(filepath.Join(m.images.dir(img), p), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := m.images.complete(img, true); err != nil {
		t.Fatal(err)
	}
	now := m.now()
	sb := &store.Sandbox{ID: newID("sb_"), Name: name, Template: "tiny", State: api.StateStopped, CreatedAt: now.Add(-time.Hour),
		TTL: 30 * time.Minute, Meta: map[string]string{"team": "ci", api.MetaObject: "obj-1", api.MetaObjectUID: "uid-1"},
		Memory: 256 << 20, LastActivity: now.Add(-time.Minute), Image: img, Persistent: true,
		TemplateVersion: "sha256:" + strings.Repeat("1", 64)}
	err = m.cfg.Store.Update(ctx, func(tx *store.Store) error {
		if err := tx.CreateSandbox(ctx, sb); err != nil {
			return err
		}
		if err := tx.SetPersistent(ctx, sb.ID, true); err != nil {
			return err
		}
		return tx.AddImage(ctx, &store.Image{ID: img, SandboxID: sb.ID, Kind: "hibernation", CreatedAt: now})
	})
	if err != nil {
		t.Fatal(err)
	}
	return sb
}

// TestPushAdoptSandbox: a stopped sandbox pushed by one node is adopted by
// another under its id, name, meta, ttl and limits, stopped, with its
// memory and a disk of the new node's own, and no snapshot left to name
// its image; an adopt asked again answers it as it is; what cannot be
// adopted (a snapshot's artifact, memory that does not restore here, an id
// or a name this node has) is refused and leaves nothing.
func TestPushAdoptSandbox(t *testing.T) {
	ctx := context.Background()
	srv := httptest.NewServer(registry.New(registry.Logger(log.New(io.Discard, "", 0))))
	defer srv.Close()
	reg := strings.TrimPrefix(srv.URL, "http://")
	a, _ := newTestManager(t, time.Hour)
	b, _ := newTestManager(t, time.Hour)
	for _, m := range []*Manager{a, b} {
		m.cfg.HostFacts = func() (HostFacts, error) { return testFacts, nil }
	}
	sb := stoppedSandbox(t, a, "mover")

	// only a stopped sandbox is pushed
	if _, err := a.PushSandbox(ctx, "sb_aaaaaaaaaa", api.PushRequest{Ref: reg + "/sbx/moves:x"}); !errors.Is(err, api.ErrNotFound) {
		t.Errorf("push of an unknown sandbox: %v, want not found", err)
	}
	pushed, err := a.PushSandbox(ctx, "mover", api.PushRequest{Ref: reg + "/sbx/moves:" + sb.ID})
	if err != nil {
		t.Fatal(err)
	}
	if !pushed.Memory || !strings.Contains(pushed.Ref, "@sha256:") || pushed.Files != 5 {
		t.Fatalf("push: %+v, want its memory, by digest, 5 files (the disk, the checkpoint's three, its agent's note)", pushed)
	}
	if got, _ := a.cfg.Store.Sandbox(ctx, sb.ID); got == nil || got.State != api.StateStopped || !a.images.isComplete(got.Image) {
		t.Fatalf("the pushed sandbox on its node: %+v, want it stopped there with its image", got)
	}
	// the fleet places it by the agent its processes run on: the
	// manifest and the sandbox's view say which
	if man, _, err := snapstore.Fetch(ctx, pushed.Ref); err != nil || man.Agent != a.agentKey {
		t.Errorf("the pushed manifest names agent %q (%v), want %s", man.Agent, err, a.agentKey)
	}
	if v, err := a.Get(ctx, sb.ID); err != nil || v.Agent != a.agentKey {
		t.Errorf("the stopped sandbox's view names agent %q (%v), want %s", v.Agent, err, a.agentKey)
	}

	// adopted on b: the same sandbox, stopped, with its memory
	got, err := b.AdoptSandbox(ctx, api.AdoptRequest{Ref: pushed.Ref})
	if err != nil {
		t.Fatal(err)
	}
	if got.ID != sb.ID || got.Name != "mover" || got.State != api.StateStopped || got.TTL.D() != 30*time.Minute || !got.Persistent ||
		got.Meta["team"] != "ci" || got.Meta[api.MetaObject] != "obj-1" || got.Meta[api.MetaAdopted] != pushed.Ref || got.Memory != 256<<20 {
		t.Fatalf("adopted: %+v", got)
	}
	rec, err := b.cfg.Store.Sandbox(ctx, sb.ID)
	if err != nil {
		t.Fatal(err)
	}
	if !b.images.isComplete(rec.Image) {
		t.Errorf("the adopted sandbox's image %s is not complete", rec.Image)
	}
	if p, err := os.ReadFile(filepath.Join(b.images.mem(rec.Image), "pages.img")); err != nil || string(p) != "pages" {
		t.Errorf("the adopted memory: %q %v", p, err)
	}
	if !strings.HasPrefix(rec.Disk, b.storage.disksDir()+"/") {
		t.Errorf("the adopted sandbox's disk %q is not one of b's", rec.Disk)
	}
	if sns, _ := b.cfg.Store.Snapshots(ctx, ""); len(sns) != 0 {
		t.Errorf("an adopt left snapshots: %+v", sns)
	}
	imgs, _ := b.cfg.Store.Images(ctx)
	if len(imgs) != 1 || imgs[0].ID != rec.Image || imgs[0].SandboxID != sb.ID || imgs[0].Kind != "hibernation" {
		t.Errorf("b's images: %+v, want the adopted sandbox's hibernation image alone", imgs)
	}

	// asked again (a controller that restarted): the same, nothing more
	again, err := b.AdoptSandbox(ctx, api.AdoptRequest{Ref: pushed.Ref})
	if err != nil || again.ID != sb.ID {
		t.Fatalf("adopt asked again: %+v %v", again, err)
	}
	if imgs, _ := b.cfg.Store.Images(ctx); len(imgs) != 1 {
		t.Errorf("adopt asked again made images: %+v", imgs)
	}
	// the node it came from has it: a conflict, nothing made
	if _, err := a.AdoptSandbox(ctx, api.AdoptRequest{Ref: pushed.Ref}); !errors.Is(err, api.ErrConflict) {
		t.Errorf("adopt on a node that has the sandbox: %v, want a conflict", err)
	}

	// what b cannot take leaves nothing on it
	c, _ := newTestManager(t, time.Hour)
	c.cfg.HostFacts = func() (HostFacts, error) {
		f := testFacts
		f.RunscSHA256 = strings.Repeat("cd", 32)
		return f, nil
	}
	if _, err := c.AdoptSandbox(ctx, api.AdoptRequest{Ref: pushed.Ref}); !errors.Is(err, api.ErrConflict) || !strings.Contains(err.Error(), "another runsc") {
		t.Errorf("adopt where the memory does not restore: %v, want a conflict saying why", err)
	}
	other := stoppedSandbox(t, a, "taken")
	named := stoppedSandbox(t, c, "taken") // c's own sandbox of that name
	c.cfg.HostFacts = a.cfg.HostFacts
	p2, err := a.PushSandbox(ctx, other.ID, api.PushRequest{Ref: reg + "/sbx/moves:" + other.ID})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.AdoptSandbox(ctx, api.AdoptRequest{Ref: p2.Ref}); !errors.Is(err, api.ErrConflict) || !strings.Contains(err.Error(), named.ID) {
		t.Errorf("adopt of a name this node has: %v, want a conflict naming its sandbox", err)
	}
	snap := hostilePushManifest(t, srv, "sbx/snap:1", map[string][]byte{diskTar: tinyTar(t, "d", 10)},
		snapstore.Manifest{Name: "snap", Template: "tiny", TemplateVersion: "sha256:" + strings.Repeat("1", 64)})
	if _, err := c.AdoptSandbox(ctx, api.AdoptRequest{Ref: snap}); !errors.Is(err, api.ErrInvalid) {
		t.Errorf("adopt of a snapshot's artifact: %v, want invalid", err)
	}
	if imgs, _ := c.cfg.Store.Images(ctx); len(imgs) != 1 {
		t.Errorf("refused adopts left images on c: %+v", imgs)
	}
	if sns, _ := c.cfg.Store.Snapshots(ctx, ""); len(sns) != 0 {
		t.Errorf("refused adopts left snapshots on c: %+v", sns)
	}
	if ds, _ := os.ReadDir(c.storage.disksDir()); len(ds) != 0 {
		t.Errorf("refused adopts left disks on c: %d", len(ds))
	}
}

// TestAdoptAfterCrash: an adopt cut after its pull (the snapshot it pulls
// into recorded, the sandbox not) is done again whole by the next adopt:
// one sandbox, one image, no snapshot.
func TestAdoptAfterCrash(t *testing.T) {
	ctx := context.Background()
	srv := httptest.NewServer(registry.New(registry.Logger(log.New(io.Discard, "", 0))))
	defer srv.Close()
	reg := strings.TrimPrefix(srv.URL, "http://")
	a, _ := newTestManager(t, time.Hour)
	b, _ := newTestManager(t, time.Hour)
	for _, m := range []*Manager{a, b} {
		m.cfg.HostFacts = func() (HostFacts, error) { return testFacts, nil }
	}
	sb := stoppedSandbox(t, a, "")
	pushed, err := a.PushSandbox(ctx, sb.ID, api.PushRequest{Ref: reg + "/sbx/moves:" + sb.ID})
	if err != nil {
		t.Fatal(err)
	}
	// what the crash left: the pull into movingPrefix+id, no sandbox
	if _, err := b.PullSnapshot(ctx, api.PullRequest{Ref: pushed.Ref, Name: movingPrefix + sb.ID}); err != nil {
		t.Fatal(err)
	}
	got, err := b.AdoptSandbox(ctx, api.AdoptRequest{Ref: pushed.Ref})
	if err != nil || got.ID != sb.ID || got.State != api.StateStopped {
		t.Fatalf("adopt after a cut one: %+v %v", got, err)
	}
	if sns, _ := b.cfg.Store.Snapshots(ctx, ""); len(sns) != 0 {
		t.Errorf("snapshots left: %+v", sns)
	}
	imgs, _ := b.cfg.Store.Images(ctx)
	dirs, _ := os.ReadDir(b.images.root)
	if len(imgs) != 1 || len(dirs) != 1 {
		t.Errorf("after an adopt done again: %d image records, %d image dirs; want 1 and 1", len(imgs), len(dirs))
	}
}

// TestAdoptWithoutMemory: a node whose runsc or CPU cannot restore the
// memory adopts the sandbox's disk alone when asked (never unasked): it is
// stopped there saying why, pushes nothing, and its resume boots from the
// disk, saying why, or is refused with the memory required.
func TestAdoptWithoutMemory(t *testing.T) {
	ctx := context.Background()
	srv := httptest.NewServer(registry.New(registry.Logger(log.New(io.Discard, "", 0))))
	defer srv.Close()
	reg := strings.TrimPrefix(srv.URL, "http://")
	a, _ := newTestManager(t, time.Hour)
	a.cfg.HostFacts = func() (HostFacts, error) { return testFacts, nil }
	b, _ := newTestManager(t, time.Hour)
	b.cfg.HostFacts = func() (HostFacts, error) {
		f := testFacts
		f.RunscSHA256 = strings.Repeat("cd", 32)
		return f, nil
	}
	b.cfg.StopRepository = reg + "/sbx/stops"
	sb := stoppedSandbox(t, a, "diskonly")
	pushed, err := a.PushSandbox(ctx, sb.ID, api.PushRequest{Ref: reg + "/sbx/moves:" + sb.ID})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.AdoptSandbox(ctx, api.AdoptRequest{Ref: pushed.Ref}); !errors.Is(err, api.ErrConflict) {
		t.Fatalf("an adopt whose memory does not restore, not asked to leave it: %v, want a conflict", err)
	}
	got, err := b.AdoptSandbox(ctx, api.AdoptRequest{Ref: pushed.Ref, ID: sb.ID, WithoutMemory: true})
	if err != nil {
		t.Fatal(err)
	}
	if got.State != api.StateStopped || !strings.Contains(got.Reason, "its memory stayed on the node it came from") || !strings.Contains(got.Reason, "another runsc") {
		t.Fatalf("adopted without its memory: %+v", got)
	}
	rec, _ := b.cfg.Store.Sandbox(ctx, sb.ID)
	if _, err := os.Stat(b.images.mem(rec.Image)); err == nil || !b.images.isComplete(rec.Image) {
		t.Errorf("its image %s: want complete, with no memory", rec.Image)
	}
	// the memory required: refused, the image kept
	if _, err := b.Resume(ctx, sb.ID, true); !errors.Is(err, api.ErrUnavailable) || !strings.Contains(err.Error(), "holds no memory") {
		t.Errorf("resume requiring the memory: %v", err)
	}
	res, err := b.Resume(ctx, sb.ID, false)
	if err != nil {
		t.Fatal(err)
	}
	if res.MemoryRestored || !strings.Contains(res.ResumeReason, "its memory stayed on the node it came from") || res.State != api.StateReady {
		t.Errorf("resumed from the disk: %+v, want ready, saying why the memory is not there", res)
	}
}
