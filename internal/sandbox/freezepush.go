package sandbox

import (
	"context"
	"fmt"

	"sbx.dev/sbx/api"
	"sbx.dev/sbx/internal/store"
)

// In a fleet (Config.StopRepository) every freeze goes to the fleet's
// registry as well, in the background, as a stop image does: a failure
// frozen on one runner is wanted elsewhere (a developer's machine: `sbx
// snapshot pull REF`), and must outlive its node. The freeze is done when
// its image is complete here, registry or not. A registry that fails keeps
// it here, says so in the snapshot's record (refPending), and is tried
// again, 1 s doubling to 30 s, for as long as the snapshot holds that
// image, and at sbxd's start for any left unpushed. Once pushed, its ref
// (with its digest) is in the record, `ref` in the snapshot's JSON and in
// its SandboxSnapshot object. Named snapshots are pushed when asked (`sbx
// snapshot push`); a fork's are the controller's.

// pushSnapshotSoon pushes snapshot name, of image img, in the background,
// if it is a freeze with its memory and the node is in a fleet. A freeze
// is told by its image (the slot's note and verdict, which only a freeze
// has: storageOwner.isFreeze), not by its name: a user may name a
// snapshot freeze-anything.
func (m *Manager) pushSnapshotSoon(name, img string) {
	if m.cfg.StopRepository == "" || !m.storage.isFreeze(&store.Snapshot{ID: img}) || !fileExists(m.images.mem(img)) {
		return
	}
	go m.pushSnapshot(context.Background(), name, img)
}

func (m *Manager) pushSnapshot(ctx context.Context, name, img string) {
	wait := stopPushFirst
	for {
		sn, err := m.cfg.Store.Snapshot(ctx, name)
		if err != nil || sn.ID != img || sn.Ref != "" {
			return // deleted, taken again under its name, or pushed
		}
		// the tag names its sandbox and image, as a stop image's does
		res, err := m.PushSnapshot(ctx, name, api.PushRequest{Ref: m.cfg.StopRepository + ":" + sn.SandboxID + "-" + img})
		if err == nil {
			if ok, serr := m.cfg.Store.SetSnapshotRef(ctx, name, img, res.Ref, ""); serr != nil {
				m.log.Warn("a pushed freeze: record its ref", "snapshot", name, "err", serr)
			} else if ok {
				m.event(ctx, sn.SandboxID, "image.pushed", map[string]any{"snapshot": name, "ref": res.Ref, "bytes": res.Bytes})
			}
			return
		}
		why := fmt.Sprintf("kept here, not in the fleet's registry yet (%s): sbxd pushes it again in %s", clip(err.Error(), maxPendingWhy), wait)
		if ok, _ := m.cfg.Store.SetSnapshotRef(ctx, name, img, "", why); !ok {
			return // gone meanwhile: nothing to push
		}
		m.log.Warn("push a freeze to the fleet's registry; trying again", "snapshot", name, "err", err, "retry_in", wait)
		<-m.cfg.After(wait)
		wait = min(2*wait, stopPushMax)
	}
}

// pushFreezesLeft pushes the freezes a registry that was down, or sbxd's
// end, left unpushed.
func (m *Manager) pushFreezesLeft(ctx context.Context) error {
	if m.cfg.StopRepository == "" {
		return nil
	}
	sns, err := m.cfg.Store.Snapshots(ctx, "")
	if err != nil {
		return err
	}
	for _, sn := range sns {
		if sn.Memory && sn.Ref == "" {
			m.pushSnapshotSoon(sn.Name, sn.ID)
		}
	}
	return nil
}
