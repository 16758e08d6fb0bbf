package sandbox

import (
	"context"
	"sync"

	"sbx.dev/sbx/api"
	"sbx.dev/sbx/internal/store"
)

// Journal, act, reconcile: every capture that writes memory (or stops a
// sandbox) is journaled before it starts, with its image and the step it
// reached, so that a restarted sbxd can tell from what is actually there
// what to do with it (reconcile.go).

// inFlight is one journaled capture under way.
type inFlight struct {
	m    *Manager
	kind string
	img  string
	once sync.Once
}

// beginCapture journals a capture of sandbox id and makes its image. It
// refuses while sbxd shuts down. The caller must call end when done, and
// finish (success) or abandon (failure) the journal entry.
func (m *Manager) beginCapture(ctx context.Context, kind, id string, memory bool, detail map[string]any) (*inFlight, error) {
	m.mu.Lock()
	if m.closing {
		m.mu.Unlock()
		return nil, api.Errorf(api.ErrUnavailable, "sbxd is shutting down and takes no new captures; try again when it is back")
	}
	m.inflight.Add(1)
	m.mu.Unlock()
	img, err := m.newImage(memory)
	if err != nil {
		m.inflight.Done()
		return nil, err
	}
	if detail == nil {
		detail = map[string]any{}
	}
	detail["memory"] = memory
	in := &store.Intent{ID: img, Kind: kind, SandboxID: id, Step: "journaled", Detail: detail, StartedAt: m.now()}
	if err := m.cfg.Store.AddIntent(context.WithoutCancel(ctx), in); err != nil {
		_ = m.removeImage(img)
		m.inflight.Done()
		return nil, err
	}
	crashPoint(kind + ":before-image")
	return &inFlight{m: m, kind: kind, img: img}, nil
}

// step records the step the capture reached.
func (c *inFlight) step(ctx context.Context, step string) {
	if err := c.m.cfg.Store.StepIntent(context.WithoutCancel(ctx), c.img, step, c.m.now()); err != nil {
		c.m.log.Error("journal a capture step", "image", c.img, "step", step, "err", err)
	}
}

// finish closes the journal entry of a capture that succeeded.
func (c *inFlight) finish(ctx context.Context) { c.close(ctx) }

// abandon closes the journal entry of a capture that failed and was undone.
func (c *inFlight) abandon(ctx context.Context) { c.close(ctx) }

func (c *inFlight) close(ctx context.Context) {
	if err := c.m.cfg.Store.DeleteIntent(context.WithoutCancel(ctx), c.img); err != nil {
		c.m.log.Error("close a capture's journal entry", "image", c.img, "err", err)
	}
}

// end marks the capture no longer in flight (for a clean shutdown).
func (c *inFlight) end() { c.once.Do(c.m.inflight.Done) }

// Shutdown stops taking new captures and waits, until ctx ends, for those
// in flight. Sandboxes keep running.
func (m *Manager) Shutdown(ctx context.Context) error {
	m.mu.Lock()
	m.closing = true
	m.mu.Unlock()
	done := make(chan struct{})
	go func() {
		m.inflight.Wait()
		close(done)
	}()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
