package client

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"time"

	"sbx.dev/sbx/api"
)

// CreateOption sets one field of a sandbox to create.
type CreateOption func(*api.CreateRequest)

// WithTemplate names the template the sandbox boots from (the server's default if unset).
func WithTemplate(name string) CreateOption { return func(r *api.CreateRequest) { r.Template = name } }

// WithName gives the sandbox a name usable wherever an id is.
func WithName(name string) CreateOption { return func(r *api.CreateRequest) { r.Name = name } }

// WithTTL sets the sandbox's idle ttl.
func WithTTL(d time.Duration) CreateOption {
	return func(r *api.CreateRequest) { r.TTL = d.String() }
}

// WithTTLString sets the idle ttl as written by a user ("30m"); the server checks it.
func WithTTLString(s string) CreateOption { return func(r *api.CreateRequest) { r.TTL = s } }

// WithMeta adds one metadata key and value.
func WithMeta(k, v string) CreateOption {
	return func(r *api.CreateRequest) {
		if r.Meta == nil {
			r.Meta = map[string]string{}
		}
		r.Meta[k] = v
	}
}

// WithCPUs sets the sandbox's CPU limit.
func WithCPUs(n float64) CreateOption { return func(r *api.CreateRequest) { r.CPUs = n } }

// WithMemory sets the sandbox's memory limit in bytes (sent as a plain number of bytes).
func WithMemory(bytes int64) CreateOption {
	return func(r *api.CreateRequest) { r.Memory = strconv.FormatInt(bytes, 10) }
}

// WithMemoryString sets the memory limit as written by a user ("512M"); the server checks it.
func WithMemoryString(s string) CreateOption { return func(r *api.CreateRequest) { r.Memory = s } }

// WithDiskString sets the disk limit as written by a user ("10G"): past it
// the sandbox's writes fail with ENOSPC. The server checks it.
func WithDiskString(s string) CreateOption { return func(r *api.CreateRequest) { r.Disk = s } }

// WithPids sets the process limit (per user inside the sandbox).
func WithPids(n int) CreateOption { return func(r *api.CreateRequest) { r.Pids = n } }

// WithNetwork sets the sandbox's network mode: "none" gives it loopback
// only (`sbx new --network none`); "" is NAT egress under the daemon's
// policy. Forks, snapshots and resumes keep it.
func WithNetwork(mode string) CreateOption { return func(r *api.CreateRequest) { r.Network = mode } }

// Create creates and starts a sandbox. A bad field is an api.ErrInvalid naming
// it; an unknown template api.ErrNotFound; a taken name api.ErrConflict.
func (c *Client) Create(ctx context.Context, opts ...CreateOption) (*api.Sandbox, error) {
	var req api.CreateRequest
	for _, o := range opts {
		o(&req)
	}
	var sb api.Sandbox
	if err := c.call(ctx, http.MethodPost, "/v1/sandboxes", nil, &req, &sb); err != nil {
		return nil, err
	}
	return &sb, nil
}

// List returns every sandbox.
func (c *Client) List(ctx context.Context) ([]api.Sandbox, error) {
	var sbs []api.Sandbox
	if err := c.call(ctx, http.MethodGet, "/v1/sandboxes", nil, nil, &sbs); err != nil {
		return nil, err
	}
	return sbs, nil
}

// Get returns the sandbox with this id or name, or an api.ErrNotFound.
func (c *Client) Get(ctx context.Context, id string) (*api.Sandbox, error) {
	var sb api.Sandbox
	if err := c.call(ctx, http.MethodGet, sandboxPath(id), nil, nil, &sb); err != nil {
		return nil, err
	}
	return &sb, nil
}

// Delete destroys the sandbox with this id or name; api.ErrNotFound if there is none.
func (c *Client) Delete(ctx context.Context, id string) error {
	// the DeleteResult only repeats the id
	return c.call(ctx, http.MethodDelete, sandboxPath(id), nil, nil, nil)
}

// WithFrom makes the sandbox from the named snapshot: a disk snapshot boots
// fresh on its disk, a memory snapshot carries on its processes. The template,
// CPUs and memory then come from the snapshot.
func WithFrom(snapshot string) CreateOption { return func(r *api.CreateRequest) { r.From = snapshot } }

// DeleteWithSnapshots destroys the sandbox and the snapshots taken from it,
// and returns what it removed; api.ErrNotFound if there is no such sandbox.
func (c *Client) DeleteWithSnapshots(ctx context.Context, id string) (*api.DeleteResult, error) {
	var res api.DeleteResult
	q := url.Values{"withSnapshots": {"1"}}
	if err := c.call(ctx, http.MethodDelete, sandboxPath(id), q, nil, &res); err != nil {
		return nil, err
	}
	return &res, nil
}

// Stop hibernates the sandbox, keeping its memory and processes in an image.
// Without wait it returns at once with the sandbox stopping; with wait, once
// it is stopped. A sandbox that cannot be stopped (not running) is an
// api.ErrConflict; a failed capture leaves it running and says why.
func (c *Client) Stop(ctx context.Context, id string, wait bool) (*api.Sandbox, error) {
	var q url.Values
	if wait {
		q = url.Values{"wait": {"1"}}
	}
	var sb api.Sandbox
	if err := c.call(ctx, http.MethodPost, sandboxPath(id, "stop"), q, nil, &sb); err != nil {
		return nil, err
	}
	return &sb, nil
}

// Resume brings a stopped sandbox back. The answer says whether its memory
// was restored (MemoryRestored) or, if it booted from its disk, why
// (ResumeReason). With requireMemory a sandbox whose memory cannot be
// restored is not booted from its disk: the server answers with an error and
// keeps the image. A sandbox that is not stopped is an api.ErrConflict.
func (c *Client) Resume(ctx context.Context, id string, requireMemory bool) (*api.Sandbox, error) {
	var sb api.Sandbox
	req := api.ResumeRequest{RequireMemory: requireMemory}
	if err := c.call(ctx, http.MethodPost, sandboxPath(id, "resume"), nil, &req, &sb); err != nil {
		return nil, err
	}
	return &sb, nil
}

// Events hands each lifecycle event of the sandbox to fn, oldest first; with
// follow it then waits for live ones until ctx ends or the server ends the
// stream. An error from fn ends the stream and is returned; so is an "error"
// event. Events with other names than "event" and "error" are skipped.
func (c *Client) Events(ctx context.Context, id string, follow bool, fn func(api.Event) error) error {
	var q url.Values
	if follow {
		q = url.Values{"follow": {"1"}}
	}
	resp, err := c.send(ctx, request{
		method: http.MethodGet, path: sandboxPath(id, "events"),
		query: q, accept: "text/event-stream",
	})
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if err := readEvents(resp.Body, fn); err != nil {
		return fmt.Errorf("events of %s: %w", id, err)
	}
	return nil
}

// readEvents hands each "event" event of an event stream to fn until the stream ends.
func readEvents(r io.Reader, fn func(api.Event) error) error {
	_, err := readStream(r, func(name string, ev api.Event) (bool, error) {
		if name == "event" || name == "" {
			return false, fn(ev)
		}
		return false, nil
	})
	return err
}
