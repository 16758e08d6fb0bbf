package sandbox

import (
	"cmp"
	"context"
	"fmt"
	"time"

	"sbx.dev/sbx/api"
	"sbx.dev/sbx/internal/store"
)

// Resume brings a stopped sandbox back from its hibernation image, with its
// processes and memory (MemoryRestored). If the image cannot be restored it
// boots the sandbox from its disk and says why (ResumeReason), unless
// requireMemory: then it fails, and the sandbox stays stopped with its image.
// A sandbox that is not stopped is api.ErrConflict. The resume is journaled:
// a crash of sbxd during it leaves the sandbox stopped with its image, or,
// if the restored sandbox answers, ready.
func (m *Manager) Resume(ctx context.Context, ref string, requireMemory bool) (*api.Sandbox, error) {
	sb, err := m.cfg.Store.Sandbox(ctx, ref)
	if err != nil {
		return nil, err
	}
	unlock, err := m.claim(ctx, sb.ID, kindResume)
	if err != nil {
		return nil, err
	}
	defer unlock()
	ctx = context.WithoutCancel(ctx)
	if sb, err = m.cfg.Store.Sandbox(ctx, sb.ID); err != nil {
		return nil, err
	}
	if err := requireState(sb, api.StateStopped); err != nil {
		return nil, err
	}
	rootfs, err := m.rootfs(sb)
	if err != nil {
		return nil, err
	}
	start := m.now()
	img := sb.Image
	c, err := m.journal.beginOp(ctx, kindResume, sb.ID, map[string]any{"image": img})
	if err != nil {
		return nil, err
	}
	defer c.end()
	rctx := c.watched(ctx)
	var restoreErr error
	switch {
	case !m.images.isComplete(img):
		restoreErr = fmt.Errorf("its hibernation image %q is missing or incomplete", img)
	case !fileExists(m.images.mem(img)):
		// adopted without its memory (another node's runsc or CPU)
		restoreErr = fmt.Errorf("its image holds no memory (%s)", cmp.Or(sb.Reason, "a disk image"))
	default:
		// runsc would find a file cut short only as it loads the pages,
		// after the sandbox was said resumed
		if restoreErr = m.images.checkMemory(img); restoreErr != nil {
			break
		}
		// Background: runsc returns before every page is loaded; the
		// sandbox is usable at once and the image stays until it is retired.
		c.step(ctx, stepRestoring)
		restoreErr = m.boot(rctx, sb, bootSpec{rootfs: rootfs, image: m.images.mem(img), from: img, background: true})
	}
	change := store.Change{MemoryRestored: ptr(restoreErr == nil), ResumeReason: ptr(""), Image: ptr("")}
	if restoreErr != nil {
		if err := m.destroyRuntimeKeepNetwork(ctx, sb.ID); err != nil {
			m.log.Warn("resume: remove a failed restore", "sandbox", sb.ID, "err", err)
		}
		if requireMemory {
			c.abandon(ctx)
			m.captureEvent(ctx, sb.ID, "resumed", start, 0, restoreErr, map[string]any{"memoryRestored": false})
			return nil, api.Errorf(api.ErrUnavailable, "resume %s: the memory cannot be restored (%v); the image is kept; resume without requiring the memory to boot from the disk", sb.ID, restoreErr)
		}
		reason := "memory not restored: " + restoreErr.Error()
		change.ResumeReason = &reason
		// Boot on the disk as the stop left it. The record names the new
		// disk only once the boot worked: the image's memory needs the old.
		boot := *sb
		if m.imageDiskExists(img) {
			disk, err := m.storage.newDisk(m.images.disk(img))
			if err != nil {
				c.abandon(ctx)
				return nil, fmt.Errorf("resume %s: %w", sb.ID, err)
			}
			boot.Disk = disk
			change.Disk = &disk
		}
		c.setDetail(ctx, map[string]any{"disk": boot.Disk, "reason": reason})
		c.step(ctx, stepBootingDisk)
		if err := m.boot(rctx, &boot, bootSpec{rootfs: rootfs}); err != nil {
			if derr := m.destroyRuntimeKeepNetwork(ctx, sb.ID); derr != nil {
				m.log.Warn("resume: remove a failed boot", "sandbox", sb.ID, "err", derr)
			}
			if boot.Disk != sb.Disk {
				m.storage.releaseDisk(ctx, boot.Disk)
			}
			c.abandon(ctx)
			m.captureEvent(ctx, sb.ID, "resumed", start, 0, err, map[string]any{"memoryRestored": false})
			return nil, fmt.Errorf("resume %s: memory not restored (%v), and booting from the disk failed: %w", sb.ID, restoreErr, err)
		}
	}
	if err := m.resumed(ctx, c, sb, change); err != nil {
		return nil, fmt.Errorf("resume %s: %w", sb.ID, err)
	}
	m.touch(ctx, sb.ID)
	m.captureEvent(ctx, sb.ID, "resumed", start, 0, nil, map[string]any{"memoryRestored": *change.MemoryRestored, "resumeReason": *change.ResumeReason})
	return m.Get(ctx, sb.ID)
}

// resumed records a resumed sandbox as ready and closes its journal entry
// in one transaction, then watches it, brings its detached execs back (or
// records them lost) and retires the image it came from.
func (m *Manager) resumed(ctx context.Context, c *inFlight, sb *store.Sandbox, change store.Change) error {
	err := m.cfg.Store.Update(ctx, func(tx *store.Store) error {
		if err := moveIn(ctx, tx, sb.ID, moveResumed, change); err != nil {
			return err
		}
		if err := dropImageRef(ctx, tx, sb.ID); err != nil { // the image retires
			return err
		}
		return c.closeIn(ctx, tx)
	})
	if err != nil {
		return err
	}
	old := sb.Disk
	if change.Disk != nil && *change.Disk != old {
		m.storage.releaseDisk(ctx, old)
	}
	m.watch(ctx, sb.ID)
	if *change.MemoryRestored {
		m.execs.reattachAll(ctx, sb.ID)
	} else {
		m.execs.loseExecs(ctx, sb.ID)
	}
	m.retireImage(ctx, sb.Image)
	return nil
}

// destroyRuntimeKeepNetwork removes a runsc sandbox that failed to come up,
// and what is left of it, but keeps the network of the stopped sandbox.
func (m *Manager) destroyRuntimeKeepNetwork(ctx context.Context, id string) error {
	m.unwatch(id)
	m.cfg.Networks.Release(id) // its next boot shapes it again
	defer m.previews.closeAll(id)
	err := m.cfg.Runtime.Delete(ctx, id)
	if kerr := m.killCgroup(id); kerr != nil {
		return kerr
	}
	if err != nil {
		err = m.cfg.Runtime.Delete(ctx, id)
	}
	m.removeCgroups(id)
	return err
}

func ptr[T any](v T) *T { return &v }

func (m *Manager) imageDiskExists(img string) bool {
	return img != "" && fileExists(m.images.disk(img))
}

// retireGrace is how long a restored image is kept: runsc may still be
// loading its pages in the background.
const retireGrace = 2 * time.Minute

// retireImage deletes a hibernation image the sandbox no longer needs, once
// runsc can no longer be reading it. Its retire time is stored, so a
// restart of sbxd in between still removes it on time (sweep.go).
func (m *Manager) retireImage(ctx context.Context, img string) {
	if img == "" {
		return
	}
	now := m.now()
	if err := m.cfg.Store.RetireImage(ctx, img, now, now.Add(retireGrace)); err != nil {
		m.log.Warn("mark image retired", "image", img, "err", err)
	}
	m.sweepSoon(retireGrace)
}
