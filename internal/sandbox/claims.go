package sandbox

import (
	"context"
	"fmt"
	"sync"
	"time"

	"sbx.dev/sbx/api"
)

// claims serialises the operations on one sandbox without holding a mutex
// through their I/O. An operation that changes a sandbox (a create,
// capture, stop, resume, delete, or the settling of a freeze) claims it
// whole for as long as it runs; an exec or terminal start claims it shared,
// beside other starts. The claim is a record, not a lock: the mutex below
// guards only the table and is never held across a runsc call, a file,
// SQLite or a sleep. Waiting for a claim is a wait on a channel bound by
// the caller's context, and a start that meets a stop or a delete does not
// wait at all: the sandbox is going, which it is told at once.
type claims struct {
	mu sync.Mutex
	m  map[string]*claimed
}

// claimed is one sandbox's entry, present while anything holds or awaits it.
type claimed struct {
	op      string        // the whole claim's operation; "" when none
	since   time.Time     // when op claimed it
	shared  int           // starts under way
	waiters int           // callers waiting; the entry stays while any do
	changed chan struct{} // closed, and replaced, at every release
	// yield ends op early, for a claim nobody asked for (a stop image's
	// background push): the first caller to wait for it calls it
	yield func()
}

// claimEnds are the operations after which a sandbox no longer runs what
// it ran: a start, or an operation that needs it running (needsRunning),
// that meets one is refused at once instead of waiting for its end.
var claimEnds = map[string]string{kindStop: "being stopped", kindDelete: "being deleted", "reap": "being deleted"}

var needsRunning = map[string]bool{kindStop: true, kindSnapshot: true, kindFork: true}

func (k *claims) entry(id string) *claimed {
	if k.m == nil {
		k.m = map[string]*claimed{}
	}
	e, ok := k.m[id]
	if !ok {
		e = &claimed{changed: make(chan struct{})}
		k.m[id] = e
	}
	return e
}

// drop forgets id's entry once nothing holds or awaits it. k.mu is held.
func (k *claims) drop(id string, e *claimed) {
	if e.op == "" && e.shared == 0 && e.waiters == 0 {
		delete(k.m, id)
	}
}

// wake tells id's waiters that its claim changed. k.mu is held.
func (e *claimed) wake() {
	close(e.changed)
	e.changed = make(chan struct{})
}

// await waits, with k.mu held on entry and on return, until ok(e) holds;
// it releases k.mu while it waits. The error is ctx's.
func (k *claims) await(ctx context.Context, id string, ok func(*claimed) bool) (*claimed, error) {
	e := k.entry(id)
	for !ok(e) {
		if e.yield != nil {
			e.yield()
			e.yield = nil
		}
		ch := e.changed
		e.waiters++
		k.mu.Unlock()
		var err error
		select {
		case <-ch:
		case <-ctx.Done():
			err = ctx.Err()
		}
		k.mu.Lock()
		e.waiters--
		if err != nil {
			k.drop(id, e)
			return nil, err
		}
	}
	return e, nil
}

// claim claims sandbox id whole for op, once the claim before it and the
// starts under way have ended, and returns its release. Its wait ends with
// ctx (a caller that must not give up passes a context without cancel).
func (k *claims) claim(ctx context.Context, id, op string) (release func(), err error) {
	return k.claimYielding(ctx, id, op, nil)
}

// claimYielding is claim for an operation that gives way: yield (when not
// nil) is called, once, as soon as anyone waits for the claim, at once if
// someone already does. It must end the operation soon (cancel its
// context), which then releases the claim as any does.
func (k *claims) claimYielding(ctx context.Context, id, op string, yield func()) (release func(), err error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	var going string
	e, err := k.await(ctx, id, func(e *claimed) bool {
		if needsRunning[op] {
			going = claimEnds[e.op]
		}
		return e.op == "" || going != ""
	})
	if err != nil {
		return nil, fmt.Errorf("%s %s: waiting for the operation under way: %w", op, id, err)
	}
	if going != "" {
		k.drop(id, e)
		return nil, api.Errorf(api.ErrConflict, "sandbox %s is %s", id, going)
	}
	// Held from here: no new start gets in, and the ones under way end.
	e.op, e.since = op, time.Now()
	if _, err := k.await(ctx, id, func(e *claimed) bool { return e.shared == 0 }); err != nil {
		e.op = ""
		e.wake()
		k.drop(id, e)
		return nil, fmt.Errorf("%s %s: waiting for the starts under way: %w", op, id, err)
	}
	if yield != nil && e.waiters > 0 {
		yield()
	} else {
		e.yield = yield
	}
	return k.releaser(id, e, func(e *claimed) { e.op, e.yield = "", nil }), nil
}

// tryClaim claims id whole for op if nothing holds it.
func (k *claims) tryClaim(id, op string) (release func(), ok bool) {
	k.mu.Lock()
	defer k.mu.Unlock()
	e := k.entry(id)
	if e.op != "" || e.shared > 0 {
		k.drop(id, e)
		return nil, false
	}
	e.op, e.since = op, time.Now()
	return k.releaser(id, e, func(e *claimed) { e.op = "" }), true
}

// start claims id shared, for a start (an exec's or a terminal's), once
// no operation holds it whole. One that stops or deletes the sandbox is
// api.ErrConflict at once.
func (k *claims) start(ctx context.Context, id string) (release func(), err error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	var going string
	e, err := k.await(ctx, id, func(e *claimed) bool {
		going = claimEnds[e.op]
		return e.op == "" || going != ""
	})
	if err != nil {
		return nil, fmt.Errorf("start in %s: waiting for the operation under way: %w", id, err)
	}
	if going != "" {
		k.drop(id, e)
		return nil, api.Errorf(api.ErrConflict, "sandbox %s is %s", id, going)
	}
	e.shared++
	return k.releaser(id, e, func(e *claimed) { e.shared-- }), nil
}

// idle waits until no operation holds id whole (a create in flight, say).
func (k *claims) idle(ctx context.Context, id string) error {
	k.mu.Lock()
	defer k.mu.Unlock()
	e, err := k.await(ctx, id, func(e *claimed) bool { return e.op == "" })
	if err != nil {
		return err
	}
	k.drop(id, e)
	return nil
}

// holder says which operation holds id whole, and since when.
func (k *claims) holder(id string) (op string, since time.Time) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if e, ok := k.m[id]; ok {
		return e.op, e.since
	}
	return "", time.Time{}
}

func (k *claims) releaser(id string, e *claimed, undo func(*claimed)) func() {
	var once sync.Once
	return func() {
		once.Do(func() {
			k.mu.Lock()
			defer k.mu.Unlock()
			undo(e)
			e.wake()
			k.drop(id, e)
		})
	}
}
