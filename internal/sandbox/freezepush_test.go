package sandbox

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"sbx.dev/sbx/api"
	"sbx.dev/sbx/internal/store"
	"sbx.dev/sbx/internal/wire/freezewire"
)

// frozenSnapshot records a freeze of a sandbox with a whole memory image,
// as the freeze owner does: its image holds the slot's note and verdict.
func frozenSnapshot(t *testing.T, m *Manager, name string) *store.Snapshot {
	return memorySnapshotOf(t, m, name, true)
}

// namedSnapshot records a user's memory snapshot, the record a freeze
// has, without a freeze's files.
func namedSnapshot(t *testing.T, m *Manager, name string) *store.Snapshot {
	return memorySnapshotOf(t, m, name, false)
}

func memorySnapshotOf(t *testing.T, m *Manager, name string, freeze bool) *store.Snapshot {
	t.Helper()
	ctx := context.Background()
	img, err := m.images.make(true)
	if err != nil {
		t.Fatal(err)
	}
	files := map[string][]byte{"memory/checkpoint.img": []byte("kernel"),
		"memory/pages_meta.img": []byte("meta"), "memory/pages.img": []byte("pages"), imageAgentFile: []byte(m.agentKey + "\n")}
	// a freeze's image is its memory alone, its disk the tar its boot
	// started from (the record's Disk); a snapshot's holds its disk.tar
	var disk string
	if freeze {
		files[slotMetaFile] = []byte(`{}`)
		files[freezewire.VerdictFile] = []byte(`{"result":"frozen"}`)
		disk = filepath.Join(t.TempDir(), "boot.tar")
		if err := os.WriteFile(disk, tinyTar(t, "d", 10), 0o600); err != nil {
			t.Fatal(err)
		}
	} else {
		files[diskTar] = tinyTar(t, "d", 10)
	}
	for p, b := range files {
		if err := os.WriteFile(filepath.Join(m.images.dir(img), p), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	size, err := m.images.complete(img, true)
	if err != nil {
		t.Fatal(err)
	}
	sn := &store.Snapshot{Name: name, ID: img, SandboxID: "sb_frozenaaaa", Template: "tiny", Memory: true, MemLimit: 256 << 20,
		CreatedAt: m.now(), Size: size, TemplateVersion: "sha256:" + strings.Repeat("1", 64), Disk: disk}
	if err := m.cfg.Store.CreateSnapshot(ctx, sn); err != nil {
		t.Fatal(err)
	}
	return sn
}

// TestFreezePushedLater: in a fleet, a freeze goes to the fleet's registry
// in the background. With the registry down it stays here, its record says
// why, and the push is tried again until the registry is back; then its
// ref (by digest) is in the record and its JSON, and another node pulls it
// with its memory. A named snapshot is not pushed unasked, and a freeze
// left unpushed at sbxd's start is pushed then.
func TestFreezePushedLater(t *testing.T) {
	ctx := context.Background()
	m, down := fleetManagerRegistryDown(t)

	fz := frozenSnapshot(t, m, "freeze-assert-ab12")
	named := namedSnapshot(t, m, "before-the-fix")
	m.pushSnapshotSoon(named.Name, named.ID)
	m.pushSnapshotSoon(fz.Name, fz.ID)
	info := func(name string) *api.Snapshot {
		got, err := m.GetSnapshot(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		return got
	}
	waitUntil(t, "the why in the freeze's record", func() bool {
		return strings.Contains(info(fz.Name).RefPending, "not in the fleet's registry yet") && strings.Contains(info(fz.Name).RefPending, "503")
	})
	if got := info(fz.Name); got.Ref != "" || !m.images.isComplete(fz.ID) {
		t.Fatalf("the freeze with the registry down: %+v, want no ref, its image here", got)
	}
	down.Store(false)
	waitUntil(t, "the freeze's ref", func() bool { return strings.Contains(info(fz.Name).Ref, "@sha256:") })
	got := info(fz.Name)
	if got.RefPending != "" || !strings.Contains(got.Ref, "/sbx/stops@sha256:") {
		t.Errorf("pushed: ref %q, pending %q", got.Ref, got.RefPending)
	}
	if n := info(named.Name); n.Ref != "" || n.RefPending != "" {
		t.Errorf("a named snapshot was pushed unasked: %+v", n)
	}
	// another node pulls it, with its memory
	b, _ := newTestManager(t, time.Hour)
	b.cfg.HostFacts = m.cfg.HostFacts
	res, err := b.PullSnapshot(ctx, api.PullRequest{Ref: got.Ref, Name: "from-the-runner"})
	if err != nil || !res.Snapshot.Memory {
		t.Fatalf("pull the pushed freeze: %+v %v", res, err)
	}
	// with the disk its boot started from (the freeze's image has none)
	pulled, err := b.cfg.Store.Snapshot(ctx, "from-the-runner")
	if err != nil {
		t.Fatal(err)
	}
	if d, err := os.ReadFile(pulled.Disk); err != nil || !bytes.Equal(d, tinyTar(t, "d", 10)) {
		t.Errorf("the pulled freeze's disk %s: %v, want its boot's tar", pulled.Disk, err)
	}

	// a freeze of a sandbox that booted on its template alone (no disk
	// tar): pushed with an empty disk, and pulled
	bare := frozenSnapshot(t, m, "freeze-bare-ef56")
	if err := m.cfg.Store.Update(ctx, func(tx *store.Store) error {
		if err := tx.DeleteSnapshot(ctx, bare.Name); err != nil {
			return err
		}
		bare.Disk = ""
		return tx.CreateSnapshot(ctx, bare)
	}); err != nil {
		t.Fatal(err)
	}
	m.pushSnapshotSoon(bare.Name, bare.ID)
	waitUntil(t, "the bare freeze's ref", func() bool { return info(bare.Name).Ref != "" })
	if res, err := b.PullSnapshot(ctx, api.PullRequest{Ref: info(bare.Name).Ref, Name: "bare-here"}); err != nil || !res.Snapshot.Memory {
		t.Fatalf("pull the bare freeze: %+v %v", res, err)
	}

	// a freeze recorded while sbxd was down, or its push cut short, is
	// pushed at the next start
	left := frozenSnapshot(t, m, "freeze-left-cd34")
	if err := m.pushFreezesLeft(ctx); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "the freeze left unpushed, pushed", func() bool { return info(left.Name).Ref != "" })
	// a freeze deleted under its push records nothing
	if ok, err := m.cfg.Store.SetSnapshotRef(ctx, left.Name, "im_other", "stale", ""); err != nil || ok {
		t.Errorf("a ref set on another image of that name: %v %v", ok, err)
	}
}
