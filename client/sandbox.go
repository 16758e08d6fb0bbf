package client

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptrace"
	"net/textproto"
	"net/url"
	"time"

	"sbx.dev/sbx/api"
)

// Sandbox is a handle on one sandbox, by id or name. Making one asks
// nothing of sbxd; each method is a call. It is safe for concurrent use.
type Sandbox struct {
	c  *Client
	id string
}

// Sandbox returns a handle on the sandbox with this id or name. An unknown
// one is api.ErrNotFound on the first call.
func (c *Client) Sandbox(id string) *Sandbox { return &Sandbox{c: c, id: id} }

// ID returns the id or name the handle was made with.
func (s *Sandbox) ID() string { return s.id }

// path is the escaped path of the sandbox, plus any escaped suffix.
func (s *Sandbox) path(suffix ...string) string { return sandboxPath(s.id, suffix...) }

// Create creates and starts a sandbox, and returns it once it is ready.
// A bad option is api.ErrInvalid naming it; an unknown template or snapshot
// api.ErrNotFound; a taken name api.ErrConflict; a limit above sbxd's
// maximum api.ErrInvalid naming the limit.
func (c *Client) Create(ctx context.Context, opts ...CreateOption) (*api.Sandbox, error) {
	req := CreateRequest(opts...)
	var sb api.Sandbox
	if err := c.call(ctx, http.MethodPost, "/v1/sandboxes", nil, &req, &sb); err != nil {
		return nil, err
	}
	return &sb, nil
}

// CreateRequest returns the request Create sends to sbxd for opts (a fake
// of Create reads what it was asked from it).
func CreateRequest(opts ...CreateOption) api.CreateRequest {
	var req api.CreateRequest
	for _, o := range opts {
		o.applyCreate(&req)
	}
	return req
}

// List returns the sandboxes, all of them or those that match every
// option: WithMeta, WithParent, WithState. A bad filter is api.ErrInvalid.
func (c *Client) List(ctx context.Context, opts ...ListOption) ([]api.Sandbox, error) {
	q := url.Values{}
	for _, o := range opts {
		o.applyList(q)
	}
	var sbs []api.Sandbox
	if err := c.call(ctx, http.MethodGet, "/v1/sandboxes", q, nil, &sbs); err != nil {
		return nil, err
	}
	return sbs, nil
}

// Info returns the sandbox as sbxd has it now; api.ErrNotFound if there is
// none. Asking is not activity.
func (s *Sandbox) Info(ctx context.Context) (*api.Sandbox, error) {
	var sb api.Sandbox
	if err := s.c.call(ctx, http.MethodGet, s.path(), nil, nil, &sb); err != nil {
		return nil, err
	}
	return &sb, nil
}

// Delete destroys the sandbox (named snapshots stay, unless WithSnapshots;
// its freezes go, unless KeepFreezes or promoted)
// and returns what it removed; api.ErrNotFound if there is none.
func (s *Sandbox) Delete(ctx context.Context, opts ...DeleteOption) (*api.DeleteResult, error) {
	q := url.Values{}
	for _, o := range opts {
		o.applyDelete(q)
	}
	var res api.DeleteResult
	if err := s.c.call(ctx, http.MethodDelete, s.path(), q, nil, &res); err != nil {
		return nil, err
	}
	return &res, nil
}

// Stop hibernates the sandbox: its processes and memory go into an image,
// and it holds no CPU or memory until Resume. It returns once the sandbox
// is stopped (with NoWait, once the stop has begun). A sandbox that is not
// ready is api.ErrConflict; a capture that fails leaves it running and
// says why.
func (s *Sandbox) Stop(ctx context.Context, opts ...StopOption) (*api.Sandbox, error) {
	wait := true
	for _, o := range opts {
		o.applyStop(&wait)
	}
	var q url.Values
	if wait {
		q = url.Values{"wait": {"1"}}
	}
	var sb api.Sandbox
	if err := s.c.call(ctx, http.MethodPost, s.path("stop"), q, nil, &sb); err != nil {
		return nil, err
	}
	return &sb, nil
}

// Resume brings a stopped sandbox back. The answer says whether its
// processes and memory were restored (MemoryRestored) or, when it booted
// from its disk instead, why (ResumeReason); with RequireMemory it fails
// rather than boot from the disk, and keeps the image. A sandbox being
// stopped is resumed once its stop has ended; one that is neither stopped
// nor stopping is api.ErrConflict.
func (s *Sandbox) Resume(ctx context.Context, opts ...ResumeOption) (*api.Sandbox, error) {
	var cfg resumeConfig
	for _, o := range opts {
		o.applyResume(&cfg)
	}
	r := request{method: http.MethodPost, path: s.path("resume")}
	if cfg.onWait != nil {
		r.progress = true
		heard := 0
		ctx = httptrace.WithClientTrace(ctx, &httptrace.ClientTrace{
			Got1xxResponse: func(code int, h textproto.MIMEHeader) error {
				if heard++; heard > 8*MaxWaits {
					// net/http leaves bounding them to who reads them
					return fmt.Errorf("resume %s: more than %d informational answers: not sbx's", s.id, 8*MaxWaits)
				}
				if why := h.Get(api.HeaderWaiting); code == http.StatusProcessing && why != "" && heard <= MaxWaits {
					cfg.onWait(why)
				}
				return nil
			},
		})
	}
	var sb api.Sandbox
	if err := s.c.callRequest(ctx, r, &cfg.req, &sb); err != nil {
		return nil, err
	}
	return &sb, nil
}

// SetTTL sets the sandbox's idle ttl; 0 turns the idle reaper off for it.
func (s *Sandbox) SetTTL(ctx context.Context, ttl time.Duration) (*api.Sandbox, error) {
	var sb api.Sandbox
	if err := s.c.call(ctx, http.MethodPost, s.path("ttl"), nil, &api.TTLRequest{TTL: api.Duration(ttl)}, &sb); err != nil {
		return nil, err
	}
	return &sb, nil
}

// SetPersistent exempts the sandbox from the idle reaper (or not). Where
// sbxd caps sandboxes' lifetime it is api.ErrForbidden.
func (s *Sandbox) SetPersistent(ctx context.Context, persistent bool) (*api.Sandbox, error) {
	var sb api.Sandbox
	if err := s.c.call(ctx, http.MethodPost, s.path("persist"), nil, &api.PersistRequest{Persistent: persistent}, &sb); err != nil {
		return nil, err
	}
	return &sb, nil
}

// Snapshot captures the sandbox's disk (and WithMemory its processes and
// memory) as the snapshot name, which outlives the sandbox. A taken name is
// api.ErrConflict, a bad one api.ErrInvalid; a capture that fails leaves
// the sandbox running and says why.
func (s *Sandbox) Snapshot(ctx context.Context, name string, opts ...SnapshotOption) (*api.Snapshot, error) {
	req := api.SnapshotRequest{Name: name}
	for _, o := range opts {
		o.applySnapshot(&req)
	}
	var sn api.Snapshot
	if err := s.c.call(ctx, http.MethodPost, s.path("snapshots"), nil, &req, &sn); err != nil {
		return nil, err
	}
	return &sn, nil
}

// Events hands each lifecycle event of the sandbox to fn, oldest first
// (After: those after a sequence number). With Follow it then waits for new
// ones until ctx ends (then it returns nil) or the sandbox is deleted. An
// error from fn ends the stream and is returned. A stream that breaks (sbxd
// went away or shut down) is a *StreamError whose LastSeq is the last event
// handed to fn: follow again with After(LastSeq). Each event's typed
// details are ev.Details(); its type is one of the api.Event* constants.
func (s *Sandbox) Events(ctx context.Context, fn func(api.Event) error, opts ...EventsOption) error {
	var cfg eventsConfig
	for _, o := range opts {
		o.applyEvents(&cfg)
	}
	q := url.Values{}
	if cfg.follow {
		q.Set("follow", "1")
	}
	if cfg.after > 0 {
		q.Set("after", fmt.Sprint(cfg.after))
	}
	resp, err := s.c.send(ctx, request{method: http.MethodGet, path: s.path("events"), query: q, accept: "text/event-stream"})
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	last := cfg.after
	var fnErr error
	end, err := readStream(resp.Body, func(name string, ev api.Event) (bool, error) {
		switch name {
		case "event", "":
			if fnErr = fn(ev); fnErr != nil {
				return false, fnErr
			}
			last = ev.Seq
		case "eof":
			return true, nil
		}
		return false, nil
	})
	if err := streamResult(ctx, cfg.follow, end, err, fnErr); err != nil {
		var se *StreamError
		if errors.As(err, &se) {
			se.Op, se.SandboxID, se.LastSeq = "events", s.id, last
			return se
		}
		return fmt.Errorf("events of %s: %w", s.id, err)
	}
	return nil
}

// streamResult says how a stream read for a caller ended: nil at its end
// (or at the end of ctx, for a follow), fn's own error as it is, a
// *StreamError (to be filled in) for a stream that broke or that sbxd cut
// short as unavailable, else the stream's error.
func streamResult(ctx context.Context, follow bool, end streamEnd, err, fnErr error) error {
	switch {
	case fnErr != nil:
		return fnErr
	case err == nil && end == streamDone:
		return nil
	case ctx.Err() != nil && follow:
		return nil // the caller ended the follow
	case ctx.Err() != nil:
		return ctx.Err()
	case err == nil || isBroken(err) || errors.Is(err, api.ErrUnavailable):
		return &StreamError{Err: brokenCause(err)}
	}
	return err
}

// Logs hands each chunk of one of the sandbox's log streams to fn:
// WithStream picks it (api.StreamConsole by default), WithTail starts at
// its last lines, Follow keeps it open. An unknown stream is
// api.ErrInvalid; an unknown sandbox or exec api.ErrNotFound. An error from
// fn ends the stream and is returned; a stream that breaks is a
// *StreamError.
func (s *Sandbox) Logs(ctx context.Context, fn func(api.LogEvent) error, opts ...LogsOption) error {
	q := url.Values{}
	for _, o := range opts {
		o.applyLogs(q)
	}
	resp, err := s.c.send(ctx, request{method: http.MethodGet, path: s.path("logs"), query: q, accept: "text/event-stream"})
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	var fnErr error
	end, err := readStream(resp.Body, func(name string, ev api.LogEvent) (bool, error) {
		switch name {
		case "log", "":
			fnErr = fn(ev)
			return false, fnErr
		case "eof":
			return true, nil
		}
		return false, nil
	})
	if err := streamResult(ctx, q.Get("follow") != "", end, err, fnErr); err != nil {
		var se *StreamError
		if errors.As(err, &se) {
			se.Op, se.SandboxID = "logs", s.id
			return se
		}
		return fmt.Errorf("logs of %s: %w", s.id, err)
	}
	return nil
}

// Metrics returns the sandbox's resource use now. Asking is not activity.
func (s *Sandbox) Metrics(ctx context.Context) (*api.Metrics, error) {
	var m api.Metrics
	if err := s.c.call(ctx, http.MethodGet, s.path("metrics"), nil, nil, &m); err != nil {
		return nil, err
	}
	return &m, nil
}

// Snapshots lists every snapshot.
func (c *Client) Snapshots(ctx context.Context) ([]api.Snapshot, error) {
	var ss []api.Snapshot
	if err := c.call(ctx, http.MethodGet, "/v1/snapshots", nil, nil, &ss); err != nil {
		return nil, err
	}
	return ss, nil
}

// GetSnapshot returns the snapshot name, or an api.ErrNotFound.
func (c *Client) GetSnapshot(ctx context.Context, name string) (*api.Snapshot, error) {
	var s api.Snapshot
	if err := c.call(ctx, http.MethodGet, "/v1/snapshots/"+url.PathEscape(name), nil, nil, &s); err != nil {
		return nil, err
	}
	return &s, nil
}

// DeleteSnapshot removes the snapshot name; api.ErrNotFound if there is none.
func (c *Client) DeleteSnapshot(ctx context.Context, name string) error {
	return c.call(ctx, http.MethodDelete, "/v1/snapshots/"+url.PathEscape(name), nil, nil, nil)
}

// Prometheus returns sbxd's own metrics in the Prometheus text format.
func (c *Client) Prometheus(ctx context.Context) ([]byte, error) {
	resp, err := c.send(ctx, request{method: http.MethodGet, path: "/metrics", accept: "text/plain"})
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, maxMetrics))
	if err != nil {
		return nil, c.transportError(err)
	}
	return b, nil
}

// maxMetrics bounds the metrics text read.
const maxMetrics = 16 << 20
