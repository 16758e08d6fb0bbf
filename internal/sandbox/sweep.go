package sandbox

import (
	"context"
	"time"

	"sbx.dev/sbx/api"
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
	defer m.sweepStorage(ctx) // storage.go: orphans past --orphan-max, freezes left by their sandbox
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
		if err := m.removeImage(im.ID); err != nil {
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

// Events sends a sandbox's events after sequence number after (0: from
// the first): those recorded so far, then, with follow, new ones as they
// come, until ctx ends, emit fails, or the sandbox is deleted.
//
// A deleted sandbox's events stay readable by its id (how else would one
// learn why the reaper took it?).
func (m *Manager) Events(ctx context.Context, ref string, after int64, follow bool, emit func(api.Event) error) error {
	if after < 0 {
		return api.Errorf(api.ErrInvalid, "after: %d is not a sequence number (0 or more)", after)
	}
	id := ref
	if sb, err := m.cfg.Store.Sandbox(ctx, ref); err == nil {
		id = sb.ID
	} else if evs, eerr := m.cfg.Store.Events(ctx, ref, 0); eerr == nil && len(evs) > 0 {
		follow = false // nothing more will happen to it
	} else if gone, gerr := m.cfg.Store.DeletedByName(ctx, ref); gerr == nil && gone != "" {
		// the last sandbox of that name, deleted or reaped
		id, follow = gone, false
	} else {
		return err
	}
	for {
		evs, err := m.cfg.Store.Events(ctx, id, after)
		if err != nil {
			return err
		}
		for _, ev := range evs {
			if err := emit(ev); err != nil {
				return err
			}
			after = ev.Seq
			if ev.Type == api.EventDeleted || ev.Type == api.EventReaped {
				follow = false // nothing more will happen to it
			}
		}
		if !follow {
			return nil
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(200 * time.Millisecond):
		}
	}
}
