package sandbox

import (
	"context"
	"log/slog"
	"maps"
	"sync"
	"time"

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

// journal owns the journal of operations under way (the store's intents)
// and the gate a clean shutdown closes. It sees the rest of the manager
// only through journalHost.
type journal struct {
	host  journalHost
	log   *slog.Logger
	gate  captureGate
	files imageFiles // where a capture's image is made
}

// journalHost is what the journal needs of the rest of the manager.
type journalHost interface {
	AddIntent(ctx context.Context, in *store.Intent) error
	StepIntent(ctx context.Context, id, step string, at time.Time) error
	SetIntentDetail(ctx context.Context, id string, detail map[string]any) error
	DeleteIntent(ctx context.Context, id string) error
	// captureRoom: room on the disk and in --storage-max for a capture (storage.go)
	captureRoom(ctx context.Context, kind, id string, memory bool) error
	now() time.Time
}

// journalHost, as the manager gives it.
type managerJournalHost struct {
	*store.Store
	m *Manager
}

func (h managerJournalHost) captureRoom(ctx context.Context, kind, id string, memory bool) error {
	return h.m.storage.captureRoom(ctx, kind, id, memory)
}
func (h managerJournalHost) now() time.Time { return h.m.now() }

// inFlight is one journaled operation under way.
type inFlight struct {
	j    *journal
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
func (j *journal) beginCapture(ctx context.Context, kind, id string, memory bool, detail map[string]any) (*inFlight, error) {
	// in the gate first: a clean shutdown waits for a capture asked before
	// it (a stop accepted just before SIGTERM was refused while its room
	// was measured, and stayed ready: TestCleanShutdown)
	if err := j.gate.enter(); err != nil {
		return nil, err
	}
	return j.beginCaptureEntered(ctx, kind, id, memory, detail)
}

// beginCaptureEntered is beginCapture for a caller that entered the gate
// itself, as it accepted the operation (a stop that answers at once):
// it leaves the gate if it fails, and the capture's end leaves it after.
func (j *journal) beginCaptureEntered(ctx context.Context, kind, id string, memory bool, detail map[string]any) (*inFlight, error) {
	// storage.go: room on the disk and in --storage-max for what it may write
	if err := j.host.captureRoom(ctx, kind, id, memory); err != nil {
		j.gate.inflight.Done()
		return nil, err
	}
	img, err := j.files.make(memory)
	if err != nil {
		j.gate.inflight.Done()
		return nil, err
	}
	if detail == nil {
		detail = map[string]any{}
	}
	detail["memory"] = memory
	c, err := j.begin(ctx, kind, img, id, detail)
	if err != nil {
		_ = j.files.remove(img)
		j.gate.inflight.Done()
		return nil, err
	}
	crashPoint(kind + ":before-image")
	return c, nil
}

// beginOp journals an operation that writes no image (a resume, a delete).
// Resumes are captures for a clean shutdown's sake: it waits for them.
func (j *journal) beginOp(ctx context.Context, kind, id string, detail map[string]any) (*inFlight, error) {
	if err := j.gate.enter(); err != nil {
		if kind != kindDelete {
			return nil, err
		}
		j.gate.inflight.Add(1) // a delete is never refused
	}
	c, err := j.begin(ctx, kind, newID("op_"), id, detail)
	if err != nil {
		j.gate.inflight.Done()
		return nil, err
	}
	return c, nil
}

func (j *journal) begin(ctx context.Context, kind, entry, id string, detail map[string]any) (*inFlight, error) {
	if detail == nil {
		detail = map[string]any{}
	}
	in := &store.Intent{ID: entry, Kind: kind, SandboxID: id, Step: string(stepJournaled), Detail: detail, StartedAt: j.host.now()}
	if err := j.host.AddIntent(context.WithoutCancel(ctx), in); err != nil {
		return nil, err
	}
	return &inFlight{j: j, kind: kind, img: entry, detail: detail}, nil
}

// step records the step the operation reached.
func (c *inFlight) step(ctx context.Context, s step) {
	if err := c.j.host.StepIntent(context.WithoutCancel(ctx), c.img, string(s), c.j.host.now()); err != nil {
		c.j.log.Error("journal a step", "entry", c.img, "step", s, "err", err)
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
		if err := c.j.host.SetIntentDetail(context.WithoutCancel(ctx), c.img, d); err != nil {
			c.j.log.Error("journal a capture process", "entry", c.img, "pid", p.Pid, "err", err)
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
	if err := c.j.host.SetIntentDetail(context.WithoutCancel(ctx), c.img, d); err != nil {
		c.j.log.Error("journal a detail", "entry", c.img, "err", err)
	}
}

// finish closes the journal entry of an operation that succeeded.
func (c *inFlight) finish(ctx context.Context) { c.close(ctx) }

// abandon closes the journal entry of an operation that failed and was undone.
func (c *inFlight) abandon(ctx context.Context) { c.close(ctx) }

func (c *inFlight) close(ctx context.Context) {
	if err := c.j.host.DeleteIntent(context.WithoutCancel(ctx), c.img); err != nil {
		c.j.log.Error("close a journal entry", "entry", c.img, "err", err)
	}
}

// closeIn closes the journal entry inside tx, with the state change that
// records the operation's outcome.
func (c *inFlight) closeIn(ctx context.Context, tx *store.Store) error {
	return tx.DeleteIntent(ctx, c.img)
}

// end marks the operation no longer in flight (for a clean shutdown).
func (c *inFlight) end() { c.once.Do(c.j.gate.inflight.Done) }

// Shutdown stops taking new captures and waits, until ctx ends, for those
// in flight. Sandboxes keep running.
func (m *Manager) Shutdown(ctx context.Context) error {
	m.journal.gate.close()
	done := make(chan struct{})
	go func() {
		m.journal.gate.inflight.Wait()
		close(done)
	}()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
