package sandbox

import (
	"context"
	"maps"
	"sync"

	"sbx.dev/sbx/api"
	"sbx.dev/sbx/internal/runsc"
	"sbx.dev/sbx/internal/store"
)

// Journal, act, reconcile: every capture (snapshot, stop, fork), every
// resume and every delete is journaled before it starts, with its image and
// the step it reached, so that a restarted sbxd can tell from what is
// actually there what to do with it (reconcile.go). The journal entry is
// closed in the same transaction as the state change that ends the
// operation, so there is no instant at which one is done without the other.

// The kinds of journaled operation.
const (
	kindSnapshot = "snapshot"
	kindStop     = "stop"
	kindFork     = "fork"
	kindResume   = "resume"
	kindDelete   = "delete"
	// kindFreeze records a freeze the sandbox took of itself (freeze.go).
	kindFreeze = "freeze"
)

// captureGate refuses new captures once sbxd shuts down, and lets the
// shutdown wait for those in flight.
type captureGate struct {
	mu       sync.Mutex
	closing  bool
	inflight sync.WaitGroup
}

// enter admits one capture, or refuses while sbxd shuts down.
func (g *captureGate) enter() error {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.closing {
		return api.Errorf(api.ErrUnavailable, "sbxd is shutting down and takes no new captures; try again when it is back")
	}
	g.inflight.Add(1)
	return nil
}

func (g *captureGate) close() {
	g.mu.Lock()
	g.closing = true
	g.mu.Unlock()
}

// inFlight is one journaled operation under way.
type inFlight struct {
	m    *Manager
	kind string
	// img is the entry's id: the image a capture writes, or for a resume or
	// a delete an id of its own.
	img  string
	once sync.Once

	mu     sync.Mutex
	detail map[string]any
}

// beginCapture journals a capture of sandbox id and makes its image. It
// refuses while sbxd shuts down. The caller must call end when done, and
// close the journal entry: finish or abandon, or close it in the
// transaction that records the outcome (closeIn).
func (m *Manager) beginCapture(ctx context.Context, kind, id string, memory bool, detail map[string]any) (*inFlight, error) {
	// in the gate first: a clean shutdown waits for a capture asked before
	// it (a stop accepted just before SIGTERM was refused while its room
	// was measured, and stayed ready: TestCleanShutdown)
	if err := m.captures.enter(); err != nil {
		return nil, err
	}
	// storage.go: room on the disk and in --storage-max for what it may write
	if err := m.captureRoom(ctx, kind, id, memory); err != nil {
		m.captures.inflight.Done()
		return nil, err
	}
	img, err := m.newImage(memory)
	if err != nil {
		m.captures.inflight.Done()
		return nil, err
	}
	if detail == nil {
		detail = map[string]any{}
	}
	detail["memory"] = memory
	c, err := m.journal(ctx, kind, img, id, detail)
	if err != nil {
		_ = m.removeImage(img)
		m.captures.inflight.Done()
		return nil, err
	}
	crashPoint(kind + ":before-image")
	return c, nil
}

// beginOp journals an operation that writes no image (a resume, a delete).
// Resumes are captures for a clean shutdown's sake: it waits for them.
func (m *Manager) beginOp(ctx context.Context, kind, id string, detail map[string]any) (*inFlight, error) {
	if err := m.captures.enter(); err != nil {
		if kind != kindDelete {
			return nil, err
		}
		m.captures.inflight.Add(1) // a delete is never refused
	}
	c, err := m.journal(ctx, kind, newID("op_"), id, detail)
	if err != nil {
		m.captures.inflight.Done()
		return nil, err
	}
	return c, nil
}

func (m *Manager) journal(ctx context.Context, kind, entry, id string, detail map[string]any) (*inFlight, error) {
	if detail == nil {
		detail = map[string]any{}
	}
	in := &store.Intent{ID: entry, Kind: kind, SandboxID: id, Step: "journaled", Detail: detail, StartedAt: m.now()}
	if err := m.cfg.Store.AddIntent(context.WithoutCancel(ctx), in); err != nil {
		return nil, err
	}
	return &inFlight{m: m, kind: kind, img: entry, detail: detail}, nil
}

// step records the step the operation reached.
func (c *inFlight) step(ctx context.Context, step string) {
	if err := c.m.cfg.Store.StepIntent(context.WithoutCancel(ctx), c.img, step, c.m.now()); err != nil {
		c.m.log.Error("journal a step", "entry", c.img, "step", step, "err", err)
	}
}

// watched returns ctx whose runsc calls are recorded in the journal entry
// as they start, so that a restarted sbxd waits for these processes, and
// only these, before it decides (a checkpoint left running may still
// complete the image).
func (c *inFlight) watched(ctx context.Context) context.Context {
	return runsc.WithStarted(ctx, func(p runsc.Proc) {
		c.mu.Lock()
		procs, _ := c.detail["procs"].([]runsc.Proc)
		c.detail["procs"] = append(procs, p)
		d := maps.Clone(c.detail)
		c.mu.Unlock()
		if err := c.m.cfg.Store.SetIntentDetail(context.WithoutCancel(ctx), c.img, d); err != nil {
			c.m.log.Error("journal a capture process", "entry", c.img, "pid", p.Pid, "err", err)
		}
	})
}

// setDetail adds kv to the journal entry's detail.
func (c *inFlight) setDetail(ctx context.Context, kv map[string]any) {
	c.mu.Lock()
	for k, v := range kv {
		c.detail[k] = v
	}
	d := maps.Clone(c.detail)
	c.mu.Unlock()
	if err := c.m.cfg.Store.SetIntentDetail(context.WithoutCancel(ctx), c.img, d); err != nil {
		c.m.log.Error("journal a detail", "entry", c.img, "err", err)
	}
}

// finish closes the journal entry of an operation that succeeded.
func (c *inFlight) finish(ctx context.Context) { c.close(ctx) }

// abandon closes the journal entry of an operation that failed and was undone.
func (c *inFlight) abandon(ctx context.Context) { c.close(ctx) }

func (c *inFlight) close(ctx context.Context) {
	if err := c.m.cfg.Store.DeleteIntent(context.WithoutCancel(ctx), c.img); err != nil {
		c.m.log.Error("close a journal entry", "entry", c.img, "err", err)
	}
}

// closeIn closes the journal entry inside tx, with the state change that
// records the operation's outcome.
func (c *inFlight) closeIn(ctx context.Context, tx *store.Store) error {
	return tx.DeleteIntent(ctx, c.img)
}

// end marks the operation no longer in flight (for a clean shutdown).
func (c *inFlight) end() { c.once.Do(c.m.captures.inflight.Done) }

// Shutdown stops taking new captures and waits, until ctx ends, for those
// in flight. Sandboxes keep running.
func (m *Manager) Shutdown(ctx context.Context) error {
	m.captures.close()
	done := make(chan struct{})
	go func() {
		m.captures.inflight.Wait()
		close(done)
	}()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
