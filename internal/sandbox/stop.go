package sandbox

import (
	"context"
	"fmt"

	"sbx.dev/sbx/api"
	"sbx.dev/sbx/internal/store"
)

// Stop hibernates a ready sandbox: its processes and memory go into an
// image, then the sandbox is destroyed, using no CPU and no memory, until
// Resume. The source is destroyed only after its image is written, synced
// and complete; a stop that fails leaves the sandbox ready and says why.
// With wait Stop returns when the sandbox is stopped; without, at once, with
// the sandbox stopping. A sandbox that is not ready is api.ErrConflict.
func (m *Manager) Stop(ctx context.Context, ref string, wait bool) (*api.Sandbox, error) {
	sb, err := m.running(ctx, ref)
	if err != nil {
		return nil, err
	}
	unlock, err := m.claim(ctx, sb.ID, kindStop)
	if err != nil {
		return nil, err
	}
	if sb, err = m.running(ctx, sb.ID); err != nil {
		unlock()
		return nil, err
	}
	ctx = context.WithoutCancel(ctx)
	// in the capture gate before it is accepted: a clean shutdown waits for
	// a stop answered "stopping" (TestCleanShutdown: one whose goroutine
	// had not reached the gate when SIGTERM came was refused, and stayed
	// ready)
	if err := m.journal.gate.enter(); err != nil {
		unlock()
		return nil, err
	}
	if err := m.move(ctx, sb.ID, moveStop, store.Change{}); err != nil {
		m.journal.gate.inflight.Done()
		unlock()
		return nil, err
	}
	if !wait {
		go func() {
			defer unlock()
			if err := m.stop(ctx, sb); err != nil {
				m.log.Error("stop failed; the sandbox runs on", "sandbox", sb.ID, "err", err)
			}
		}()
		sb.State = api.StateStopping
		return m.toAPI(sb), nil
	}
	defer unlock()
	if err := m.stop(ctx, sb); err != nil {
		return nil, err
	}
	return m.Get(ctx, sb.ID)
}

// stop does a stop of a stopping sandbox under its claim, its caller in
// the capture gate (which the stop leaves).
func (m *Manager) stop(ctx context.Context, sb *store.Sandbox) error {
	start := m.now()
	backToReady := func() {
		if err := m.move(ctx, sb.ID, moveStopUndone, store.Change{}); err != nil {
			m.log.Error("a failed stop: record the sandbox ready again", "sandbox", sb.ID, "err", err)
		}
	}
	// execs on their way to init get there first (no new one starts: the
	// stop claims the sandbox)
	m.execs.awaitStarts(sb.ID, startWait)
	c, err := m.journal.beginCaptureEntered(ctx, kindStop, sb.ID, true, nil)
	if err != nil {
		backToReady()
		return fmt.Errorf("stop %s: %w", sb.ID, err)
	}
	defer c.end()
	size, paused, err := m.capture(ctx, c, sb.ID, captureKind{memory: true, last: true, diskLimit: sb.DiskLimit})
	img := c.img
	extra := map[string]any{"pausedMs": paused.Milliseconds()}
	if err != nil {
		// capture left it running; say so in its state too.
		backToReady()
		m.captureEvent(ctx, sb.ID, "stopped", start, 0, err, extra)
		return fmt.Errorf("stop %s: %w", sb.ID, err)
	}
	// The image is complete and synced: now, and only now, the source goes,
	// once it has told of a freeze the capture came just after.
	m.freezes.letFreezeTell(ctx, sb.ID)
	m.unwatch(sb.ID)
	if err := m.cfg.Runtime.Delete(ctx, sb.ID); err != nil {
		_ = m.images.remove(img)
		c.abandon(ctx)
		m.ensureRunning(ctx, sb.ID)
		m.watch(ctx, sb.ID)
		backToReady()
		m.captureEvent(ctx, sb.ID, "stopped", start, 0, err, extra)
		return fmt.Errorf("stop %s: %w", sb.ID, err)
	}
	c.step(ctx, stepSourceDestroyed)
	m.previews.closeAll(sb.ID)    // nothing in there answers them now
	m.cfg.Networks.Release(sb.ID) // it sends nothing now; its resume shapes it again
	crashPoint("stop:after-destroy")
	if err := m.killCgroup(sb.ID); err != nil {
		m.log.Warn("stop: processes left of the sandbox", "sandbox", sb.ID, "err", err)
	}
	m.removeCgroups(sb.ID)
	// a freeze it took before the stop is kept; its slot is done
	m.freezes.settleFreezesLocked(ctx, sb, false)
	old := sb.Image
	if err := m.adoptStopped(ctx, c, sb.ID, img, moveStopped); err != nil {
		// The journal still says the image is complete and the source gone:
		// a restart adopts it. Until then the sandbox reads stopping.
		return fmt.Errorf("stop %s: %w", sb.ID, err)
	}
	m.retireImage(ctx, old)
	if sb.PagesImage != "" {
		m.sweepSoon(0) // the fork's image may be read by none now
	}
	m.touch(ctx, sb.ID)
	m.captureEvent(ctx, sb.ID, "stopped", start, size, nil, extra)
	m.pushStopSoon(sb.ID, img)
	return nil
}

// dropImageRef drops from sandbox id's meta where its last stop image is
// in the fleet's registry: a resume, or a new image, makes it false.
func dropImageRef(ctx context.Context, tx *store.Store, id string) error {
	for _, k := range []string{api.MetaImageRef, api.MetaImagePending} {
		if _, err := tx.SetMetaKey(ctx, id, "", "", k, ""); err != nil {
			return err
		}
	}
	return nil
}

// adoptStopped records, in one transaction, that sandbox id is stopped with
// its memory in the complete image img, and closes the journal entry c.
func (m *Manager) adoptStopped(ctx context.Context, c *inFlight, id, img string, mv move) error {
	return m.cfg.Store.Update(ctx, func(tx *store.Store) error {
		if err := tx.AddImage(ctx, &store.Image{ID: img, SandboxID: id, Kind: "hibernation", CreatedAt: m.now()}); err != nil {
			return err
		}
		if err := moveIn(ctx, tx, id, mv, store.Change{Image: &img}); err != nil {
			return err
		}
		if err := dropImageRef(ctx, tx, id); err != nil { // another image's
			return err
		}
		// its runsc, which read a fork's image on demand, is gone
		if err := tx.SetPagesImage(ctx, id, ""); err != nil {
			return err
		}
		return c.closeIn(ctx, tx)
	})
}
