package client

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"

	"sbx.dev/sbx/api"
)

// errNoDone is returned when a fork stream ends before its "done" event.
var errNoDone = errors.New("stream ended before the fork's done event")

// ForkEvents forks the sandbox as req says and hands each event of the fork's
// stream to fn: "sandbox.forking" with the new ids at once,
// "sandbox.captured" once the parent's state is taken, "sandbox.ready" per
// child, then "done". It returns nil after "done"; an "error" event (after
// which no child is left), or a stream that ends without "done", is an error.
// An error from fn ends the stream and is returned wrapped; the fork goes on
// on the server. Errors before the stream starts are *api.Error (a Count
// above api.MaxForks is an api.ErrInvalid naming the limit).
func (c *Client) ForkEvents(ctx context.Context, id string, req api.ForkRequest, fn func(api.ForkEvent) error) error {
	resp, err := c.send(ctx, jsonRequest(http.MethodPost, sandboxPath(id, "fork"), &req))
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if err := readForkStream(resp.Body, fn); err != nil {
		return fmt.Errorf("fork %s: %w", id, err)
	}
	return nil
}

// readForkStream hands each event to fn until "done" (nil) or "error".
func readForkStream(r io.Reader, fn func(api.ForkEvent) error) error {
	ended, err := readStream(r, func(name string, ev api.ForkEvent) (bool, error) {
		if name != "" {
			ev.Event = name // the SSE event name is authoritative
		}
		if err := fn(ev); err != nil {
			return false, err
		}
		return ev.Event == "done", nil
	})
	if ended {
		return errNoDone
	}
	return err
}

// Fork forks the sandbox as req says and waits for every child to be ready;
// it returns the children. See ForkEvents for the errors.
func (c *Client) Fork(ctx context.Context, id string, req api.ForkRequest) ([]api.Sandbox, error) {
	return c.fork(ctx, id, req, nil)
}

// fork is Fork telling announce the ids the server names at once, made or not.
func (c *Client) fork(ctx context.Context, id string, req api.ForkRequest, announce func([]string)) ([]api.Sandbox, error) {
	var ready, done []api.Sandbox
	err := c.ForkEvents(ctx, id, req, func(ev api.ForkEvent) error {
		switch ev.Event {
		case "sandbox.forking":
			if announce != nil {
				announce(ev.IDs)
			}
		case "sandbox.ready":
			if ev.Sandbox != nil {
				ready = append(ready, *ev.Sandbox)
			}
		case "done":
			done = ev.Sandboxes
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	if done == nil {
		done = ready // a "done" without its list: the ready events had them all
	}
	return done, nil
}

// ForkTree makes n memory (or, without memory, disk) forks of the sandbox,
// at most api.MaxForks per call, growing a wider tree breadth-first: first up
// to api.MaxForks children of id, then children of those children (each a
// copy of the same state, since a memory fork carries on its parent), level
// by level, until n exist. The calls are made one after the other. It is all
// or nothing: on an error it deletes the children it made (and those a failed
// call had announced) and returns the error. An n below 1 is api.ErrInvalid.
func (c *Client) ForkTree(ctx context.Context, id string, n int, memory bool) ([]api.Sandbox, error) {
	if n < 1 {
		return nil, api.Errorf(api.ErrInvalid, "fork tree of %s: want at least 1 fork, got %d", id, n)
	}
	var made []api.Sandbox
	var announced []string // every id a call named: what to delete on failure
	parents := []string{id}
	for len(made) < n {
		var next []string
		for _, p := range parents {
			if len(made) == n {
				break
			}
			k := min(api.MaxForks, n-len(made))
			kids, err := c.fork(ctx, p, api.ForkRequest{Memory: memory, Count: k},
				func(ids []string) { announced = append(announced, ids...) })
			if err == nil && len(kids) == 0 {
				err = fmt.Errorf("fork %s: done without children", p)
			}
			if err != nil {
				return nil, c.undoForkTree(ctx, id, len(made), n, announced, err)
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

// undoForkTree deletes every child a failed ForkTree announced and returns
// cause, with any failure to delete joined to it.
func (c *Client) undoForkTree(ctx context.Context, id string, made, n int, announced []string, cause error) error {
	err := fmt.Errorf("fork tree of %s: %d of %d forks made, deleting them: %w", id, made, n, cause)
	if derr := c.deleteAll(ctx, announced); derr != nil {
		return errors.Join(err, derr)
	}
	return err
}

// deleteAll deletes the sandboxes, newest first, even once ctx has ended:
// a child left behind would outlive the call that promised none. One that is
// already gone is no error.
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
		if err := c.Delete(ctx, id); err != nil && !errors.Is(err, api.ErrNotFound) {
			errs = append(errs, fmt.Errorf("delete %s: %w", id, err))
		}
	}
	return errors.Join(errs...)
}
