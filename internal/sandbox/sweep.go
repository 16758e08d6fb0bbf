package sandbox

import (
	"context"
	"time"
)

// DefaultOrphanGrace is how long an image without its sandbox is kept.
const DefaultOrphanGrace = 7 * 24 * time.Hour

// sweepInterval is how often orphaned images are looked for.
const sweepInterval = 10 * time.Minute

// sweepLoop removes orphaned images once their grace period has passed.
func (m *Manager) sweepLoop(ctx context.Context) {
	every := sweepInterval
	if half := m.cfg.OrphanGrace / 2; half < every {
		every = max(half, time.Second)
	}
	for {
		m.sweep(ctx)
		select {
		case <-ctx.Done():
			return
		case <-time.After(every):
		case <-m.sweepWake:
		}
	}
}

// sweepSoon has the sweep look again after d (an image's retire time).
func (m *Manager) sweepSoon(d time.Duration) {
	time.AfterFunc(d+time.Second, func() {
		select {
		case m.sweepWake <- struct{}{}:
		default:
		}
	})
}

// sweep removes the images whose retire time has passed and those
// orphaned for longer than the grace period.
func (m *Manager) sweep(ctx context.Context) {
	defer m.collectTemplates(ctx)
	defer m.pruneBlobs()       // transfer.go: pulled files no image links any more
	defer m.storage.sweep(ctx) // storage.go: orphans past --orphan-max, freezes left by their sandbox
	if !m.cfg.Store.ReserveHeld() {
		if err := m.cfg.Store.Replenish(); err == nil {
			m.log.Info("the database's reserve of space is back")
		}
	}
	ims, err := m.cfg.Store.ImagesDue(ctx, m.now(), m.cfg.OrphanGrace)
	if err != nil {
		m.log.Error("list orphaned images", "err", err)
		return
	}
	for _, im := range ims {
		if err := m.images.remove(im.ID); err != nil {
			m.log.Error("sweep orphaned image", "image", im.ID, "err", err)
			continue
		}
		if err := m.cfg.Store.DeleteImage(ctx, im.ID); err != nil {
			m.log.Error("sweep orphaned image", "image", im.ID, "err", err)
			continue
		}
		m.log.Info("swept orphaned image", "image", im.ID, "sandbox", im.SandboxID, "orphaned", im.OrphanedAt)
	}
}
