package client

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"

	"sbx.dev/sbx/api"
)

// Fork makes new sandboxes from this one, now, and returns them once every
// one is ready. By default each child boots fresh on a copy of the
// sandbox's disk; WithMemory makes each carry on its processes and memory.
// WithCount says how many (default 1): up to api.MaxForks come from one
// capture; more grow a tree breadth-first (children of children, each a
// copy of the same state). WithName names a single child, WithTTL and
// WithMeta set the children's ttl and metadata (merged into the parent's),
// WithForkEvents hears each step; NoWait returns the children's ids at
// once, as they are being made.
//
// It is all or nothing, whatever ends it: on an error, or when ctx ends, it
// deletes every child that sbxd announced (waiting, past ctx, for those
// still being made), and the error says which it could not delete. Errors
// before the fork starts: api.ErrNotFound, api.ErrConflict (the sandbox
// is not ready), api.ErrInvalid (a bad option). A stream that breaks is a
// *StreamError naming the children.
func (s *Sandbox) Fork(ctx context.Context, opts ...ForkOption) ([]api.Sandbox, error) {
	var cfg forkConfig
	for _, o := range opts {
		o.applyFork(&cfg)
	}
	n := cfg.req.Count
	if n == 0 {
		n = 1
	}
	// a tree forks the children, so only a client that waits for them grows one
	if err := api.CheckForkCount(n, !cfg.noWait); err != nil {
		return nil, err
	}
	first := cfg.req
	first.Count = min(api.MaxForks, n)
	if err := first.Validate(); err != nil {
		return nil, err // what sbxd would refuse the first call for
	}
	var announced []string // every id a call named: what to delete on failure
	var made []api.Sandbox
	parents := []string{s.id}
	for len(made) < n {
		var next []string
		for _, p := range parents {
			if len(made) == n {
				break
			}
			req := cfg.req
			req.Count = min(api.MaxForks, n-len(made))
			kids, err := s.c.forkOnce(ctx, p, req, cfg, func(ids []string) { announced = append(announced, ids...) })
			if err == nil && len(kids) == 0 {
				err = fmt.Errorf("fork %s: done without children", p)
			}
			if err != nil {
				return nil, s.c.undoFork(ctx, s.id, announced, err)
			}
			for _, kid := range kids {
				announced = append(announced, kid.ID) // in case "sandbox.forking" named none
				next = append(next, kid.ID)
			}
			made = append(made, kids...)
		}
		parents = next
	}
	return made, nil
}

// forkOnce makes one fork call of id, telling announce the ids sbxd names
// at once, made or not.
func (c *Client) forkOnce(ctx context.Context, id string, req api.ForkRequest, cfg forkConfig, announce func([]string)) ([]api.Sandbox, error) {
	b, err := json.Marshal(&req)
	if err != nil {
		return nil, api.Errorf(api.ErrInvalid, "fork %s: %v", id, err)
	}
	resp, err := c.send(ctx, request{
		method: http.MethodPost, path: sandboxPath(id, "fork"),
		body: bytes.NewReader(b), size: int64(len(b)),
		ctype: "application/json", accept: "text/event-stream",
	})
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	var ready, done []api.Sandbox
	var ids []string
	var fnErr error
	end, err := readStream(resp.Body, func(name string, ev api.ForkEvent) (bool, error) {
		if name != "" {
			ev.Event = name // the SSE event name is authoritative
		}
		switch ev.Event {
		case api.ForkForking:
			ids = ev.IDs
			announce(ev.IDs)
		case api.ForkReady:
			if ev.Sandbox != nil {
				ready = append(ready, *ev.Sandbox)
			}
		case api.ForkDone:
			done = ev.Sandboxes
		}
		if cfg.events != nil {
			if fnErr = cfg.events(ev); fnErr != nil {
				return false, fnErr
			}
		}
		if ev.Event == api.ForkForking && cfg.noWait {
			for _, id := range ev.IDs {
				done = append(done, api.Sandbox{ID: id, State: api.StateCreating})
			}
			return true, nil
		}
		return ev.Event == api.ForkDone, nil
	})
	switch {
	case fnErr != nil:
		return nil, fnErr
	case ctx.Err() != nil:
		return nil, fmt.Errorf("fork %s: %w", id, ctx.Err())
	case err == nil && end == streamCut, isBroken(err), errors.Is(err, api.ErrUnavailable):
		return nil, &StreamError{Op: "fork", SandboxID: id, Children: ids, Err: brokenCause(err)}
	case err != nil:
		return nil, fmt.Errorf("fork %s: %w", id, err)
	}
	if done == nil {
		done = ready // a "done" without its list: the ready events had them all
	}
	return done, nil
}

// undoFork deletes every child a failed Fork announced and returns cause,
// with any failure to delete joined to it.
func (c *Client) undoFork(ctx context.Context, id string, announced []string, cause error) error {
	if len(announced) == 0 {
		return cause
	}
	if derr := c.deleteAll(ctx, announced); derr != nil {
		return errors.Join(cause, fmt.Errorf("fork %s: some of its children may be left: %w", id, derr))
	}
	return cause
}

// deleteAll deletes the sandboxes, newest first, even once ctx has ended:
// a child left behind would outlive the call that promised none. One that
// is already gone is no error.
func (c *Client) deleteAll(ctx context.Context, ids []string) error {
	ctx = context.WithoutCancel(ctx)
	seen := map[string]bool{}
	var errs []error
	for i := len(ids) - 1; i >= 0; i-- {
		id := ids[i]
		if seen[id] {
			continue
		}
		seen[id] = true
		if _, err := c.Sandbox(id).Delete(ctx); err != nil && !errors.Is(err, api.ErrNotFound) {
			errs = append(errs, fmt.Errorf("delete %s: %w", id, err))
		}
	}
	return errors.Join(errs...)
}
