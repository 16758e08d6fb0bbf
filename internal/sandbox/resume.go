package sandbox

import (
	"context"
	"fmt"
	"time"

	"sbx.dev/sbx/api"
)

// Resume brings a stopped sandbox back from its hibernation image, with its
// processes and memory (MemoryRestored). If the image cannot be restored it
// boots the sandbox from its disk and says why (ResumeReason), unless
// requireMemory: then it fails, and the sandbox stays stopped with its image.
// A sandbox that is not stopped is api.ErrConflict.
func (m *Manager) Resume(ctx context.Context, ref string, requireMemory bool) (*api.Sandbox, error) {
	sb, err := m.cfg.Store.Sandbox(ctx, ref)
	if err != nil {
		return nil, err
	}
	unlock := m.lock(sb.ID)
	defer unlock()
	ctx = context.WithoutCancel(ctx)
	if sb, err = m.cfg.Store.Sandbox(ctx, sb.ID); err != nil {
		return nil, err
	}
	if sb.State != api.StateStopped {
		return nil, api.Errorf(api.ErrConflict, "sandbox %s is %s, not stopped; only a stopped sandbox can be resumed", sb.ID, sb.State)
	}
	rootfs, err := m.rootfs(sb.Template)
	if err != nil {
		return nil, err
	}
	start := m.now()
	img := sb.Image
	var restoreErr error
	if !m.imageComplete(img) {
		restoreErr = fmt.Errorf("its hibernation image %q is missing or incomplete", img)
	} else {
		// Background: runsc returns before every page is loaded; the
		// sandbox is usable at once and the image stays until it is retired.
		restoreErr = m.boot(ctx, sb, bootSpec{rootfs: rootfs, image: m.imageMem(img), background: true})
	}
	sb.MemoryRestored, sb.ResumeReason = restoreErr == nil, ""
	if restoreErr != nil {
		_ = m.cfg.Runtime.Delete(ctx, sb.ID)
		if requireMemory {
			m.captureEvent(ctx, sb.ID, "resumed", start, 0, restoreErr, map[string]any{"memoryRestored": false})
			return nil, api.Errorf(api.ErrUnavailable, "resume %s: the memory cannot be restored (%v); the image is kept; resume without --require-memory to boot from the disk", sb.ID, restoreErr)
		}
		sb.ResumeReason = "memory not restored: " + restoreErr.Error()
		// Boot on the disk as the stop left it.
		b := bootSpec{rootfs: rootfs}
		if m.imageDiskExists(img) {
			old := sb.Disk
			disk, err := m.newDisk(m.imageDisk(img))
			if err != nil {
				return nil, fmt.Errorf("resume %s: %w", sb.ID, err)
			}
			sb.Disk = disk
			if err := m.cfg.Store.SetDisk(ctx, sb.ID, disk); err != nil {
				return nil, err
			}
			m.releaseDisk(ctx, old)
		}
		if err := m.boot(ctx, sb, b); err != nil {
			_ = m.cfg.Runtime.Delete(ctx, sb.ID)
			m.captureEvent(ctx, sb.ID, "resumed", start, 0, err, map[string]any{"memoryRestored": false})
			return nil, fmt.Errorf("resume %s: memory not restored (%v), and booting from the disk failed: %w", sb.ID, restoreErr, err)
		}
	}
	sb.Image = ""
	if err := m.started(ctx, sb, "", nil); err != nil {
		return nil, err
	}
	if sb.MemoryRestored {
		m.reattachAll(ctx, sb.ID)
	} else {
		m.loseDetached(ctx, sb.ID)
	}
	m.retireImage(ctx, img)
	m.touch(ctx, sb.ID)
	m.captureEvent(ctx, sb.ID, "resumed", start, 0, nil, map[string]any{"memoryRestored": sb.MemoryRestored, "resumeReason": sb.ResumeReason})
	return m.Get(ctx, sb.ID)
}

func (m *Manager) imageDiskExists(img string) bool {
	return img != "" && fileExists(m.imageDisk(img))
}

// retireGrace is how long a restored image is kept: runsc may still be
// loading its pages in the background.
const retireGrace = 2 * time.Minute

// retireImage deletes a hibernation image the sandbox no longer needs, once
// runsc can no longer be reading it. It is marked an orphan first, so a
// restart of sbxd in between still sweeps it.
func (m *Manager) retireImage(ctx context.Context, img string) {
	if img == "" {
		return
	}
	if err := m.cfg.Store.OrphanImage(ctx, img, m.now()); err != nil {
		m.log.Warn("mark image orphaned", "image", img, "err", err)
	}
	time.AfterFunc(retireGrace, func() {
		if err := m.removeImage(img); err != nil {
			m.log.Warn("remove retired image", "image", img, "err", err)
			return
		}
		_ = m.cfg.Store.DeleteImage(context.Background(), img)
	})
}
