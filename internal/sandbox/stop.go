package sandbox

import (
	"context"
	"fmt"

	"sbx.dev/sbx/api"
	"sbx.dev/sbx/internal/store"
)

// Stop hibernates a running sandbox: its processes and memory go into an
// image, then the sandbox is destroyed, using no CPU and no memory, until
// Resume. The source is destroyed only after its image is written, synced
// and complete; a stop that fails leaves the sandbox running and says why.
// With wait Stop returns when the sandbox is stopped; without, at once, with
// the sandbox stopping.
func (m *Manager) Stop(ctx context.Context, ref string, wait bool) (*api.Sandbox, error) {
	sb, err := m.running(ctx, ref)
	if err != nil {
		return nil, err
	}
	unlock := m.lock(sb.ID)
	if sb, err = m.running(ctx, sb.ID); err != nil {
		unlock()
		return nil, err
	}
	ctx = context.WithoutCancel(ctx)
	if err := m.cfg.Store.SetState(ctx, sb.ID, api.StateStopping, ""); err != nil {
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
		return toAPI(sb), nil
	}
	defer unlock()
	if err := m.stop(ctx, sb); err != nil {
		return nil, err
	}
	return m.Get(ctx, sb.ID)
}

// stop does a stop under the sandbox's lock.
func (m *Manager) stop(ctx context.Context, sb *store.Sandbox) error {
	start := m.now()
	c, err := m.beginCapture(ctx, "stop", sb.ID, true, nil)
	if err != nil {
		_ = m.cfg.Store.SetState(ctx, sb.ID, api.StateReady, "")
		return err
	}
	defer c.end()
	size, paused, err := m.capture(ctx, c, sb.ID, captureKind{memory: true})
	img := c.img
	extra := map[string]any{"pausedMs": paused.Milliseconds()}
	if err != nil {
		// capture left it running; say so in its state too.
		_ = m.cfg.Store.SetState(ctx, sb.ID, api.StateReady, "")
		m.captureEvent(ctx, sb.ID, "stopped", start, 0, err, extra)
		return fmt.Errorf("stop %s: %w", sb.ID, err)
	}
	// The image is complete and synced: now, and only now, the source goes.
	undo := func(err error) error {
		_ = m.removeImage(img)
		c.abandon(ctx)
		m.watch(ctx, sb.ID)
		_ = m.cfg.Store.SetState(ctx, sb.ID, api.StateReady, "")
		m.captureEvent(ctx, sb.ID, "stopped", start, 0, err, extra)
		return fmt.Errorf("stop %s: %w", sb.ID, err)
	}
	if err := m.cfg.Store.AddImage(ctx, &store.Image{ID: img, SandboxID: sb.ID, Kind: "hibernation", CreatedAt: m.now()}); err != nil {
		return undo(err)
	}
	old := sb.Image
	m.unwatch(sb.ID)
	if err := m.cfg.Runtime.Delete(ctx, sb.ID); err != nil {
		_ = m.cfg.Store.DeleteImage(ctx, img)
		return undo(err)
	}
	c.step(ctx, "source-destroyed")
	crashPoint("stop:after-destroy")
	m.removeCgroups(sb.ID)
	if err := m.cfg.Store.SetRuntime(ctx, sb.ID, api.StateStopped, sb.MemoryRestored, sb.ResumeReason, img); err != nil {
		return err
	}
	c.finish(ctx)
	m.retireImage(ctx, old)
	m.touch(ctx, sb.ID)
	m.captureEvent(ctx, sb.ID, "stopped", start, size, nil, extra)
	return nil
}
