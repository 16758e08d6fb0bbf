package client

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"

	"sbx.dev/sbx/api"
)

// errNoExit is returned when an exec stream ends before its "exit" event.
var errNoExit = errors.New("stream ended before the exec's exit event")

// Exec runs req in the sandbox and waits for it, writing its output to stdout
// and stderr (either may be nil) as it comes. It returns the ended Exec, with
// its ExitCode, from the stream's "exit" event. An "error" event, or a stream
// that ends without "exit", is an error. Errors before the stream starts are
// *api.Error (api.ErrNotFound for an unknown sandbox, api.ErrConflict for one
// not running, api.ErrInvalid for a bad request).
func (c *Client) Exec(ctx context.Context, id string, req api.ExecRequest, stdout, stderr io.Writer) (*api.Exec, error) {
	return c.ExecEvents(ctx, id, req, writeOutput(stdout, stderr))
}

// ExecEvents is Exec with every event of the stream handed to fn; an error
// from fn ends the exec's stream and is returned.
func (c *Client) ExecEvents(ctx context.Context, id string, req api.ExecRequest, fn func(api.ExecEvent) error) (*api.Exec, error) {
	req.Detach = false
	resp, err := c.send(ctx, jsonRequest(http.MethodPost, sandboxPath(id, "exec"), &req))
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	x, err := readExecStream(resp.Body, fn)
	if err == nil && x == nil {
		err = errNoExit
	}
	if err != nil {
		return nil, fmt.Errorf("exec in %s: %w", id, err)
	}
	return x, nil
}

// ExecDetached starts req in the sandbox and returns at once with the running Exec.
func (c *Client) ExecDetached(ctx context.Context, id string, req api.ExecRequest) (*api.Exec, error) {
	req.Detach = true
	var x api.Exec
	if err := c.call(ctx, http.MethodPost, sandboxPath(id, "exec"), nil, &req, &x); err != nil {
		return nil, err
	}
	return &x, nil
}

// Execs lists the sandbox's execs, ended ones included.
func (c *Client) Execs(ctx context.Context, id string) ([]api.Exec, error) {
	var xs []api.Exec
	if err := c.call(ctx, http.MethodGet, sandboxPath(id, "execs"), nil, nil, &xs); err != nil {
		return nil, err
	}
	return xs, nil
}

// GetExec returns one exec of the sandbox; api.ErrNotFound if either is unknown.
func (c *Client) GetExec(ctx context.Context, id, execID string) (*api.Exec, error) {
	var x api.Exec
	if err := c.call(ctx, http.MethodGet, sandboxPath(id, "execs", url.PathEscape(execID)), nil, nil, &x); err != nil {
		return nil, err
	}
	return &x, nil
}

// ExecOutput writes the output kept of an exec to stdout and stderr (either may
// be nil), then with follow its live output until it ends. It returns the Exec
// from the "exit" event when the stream ended with one, else (nil, nil): the
// exec still runs (without follow).
func (c *Client) ExecOutput(ctx context.Context, id, execID string, follow bool, stdout, stderr io.Writer) (*api.Exec, error) {
	return c.ExecOutputEvents(ctx, id, execID, follow, writeOutput(stdout, stderr))
}

// ExecOutputEvents is ExecOutput with every event handed to fn.
func (c *Client) ExecOutputEvents(ctx context.Context, id, execID string, follow bool, fn func(api.ExecEvent) error) (*api.Exec, error) {
	var q url.Values
	if follow {
		q = url.Values{"follow": {"1"}}
	}
	resp, err := c.send(ctx, request{
		method: http.MethodGet, path: sandboxPath(id, "execs", url.PathEscape(execID), "output"),
		query: q, accept: "text/event-stream",
	})
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	x, err := readExecStream(resp.Body, fn)
	if err != nil {
		return nil, fmt.Errorf("output of %s in %s: %w", execID, id, err)
	}
	return x, nil
}

// writeOutput returns an event handler writing output events to stdout and stderr.
func writeOutput(stdout, stderr io.Writer) func(api.ExecEvent) error {
	if stdout == nil {
		stdout = io.Discard
	}
	if stderr == nil {
		stderr = io.Discard
	}
	return func(ev api.ExecEvent) error {
		var err error
		switch ev.Event {
		case "stdout":
			_, err = stdout.Write(ev.Data)
		case "stderr":
			_, err = stderr.Write(ev.Data)
		}
		return err
	}
}

// readExecStream hands each event to fn and returns the Exec of the "exit"
// event, or nil if the stream ended without one. An "error" event is an error.
func readExecStream(r io.Reader, fn func(api.ExecEvent) error) (*api.Exec, error) {
	var x *api.Exec
	_, err := readStream(r, func(name string, ev api.ExecEvent) (bool, error) {
		if name != "" {
			ev.Event = name // the SSE event name is authoritative
		}
		if err := fn(ev); err != nil {
			return false, err
		}
		if ev.Event != "exit" {
			return false, nil
		}
		if ev.Exec == nil {
			return false, errors.New("exit event without the exec")
		}
		x = ev.Exec
		return true, nil
	})
	return x, err
}

// jsonRequest is a request whose body is v as JSON, answered by a stream.
func jsonRequest(method, path string, v any) request {
	b, _ := json.Marshal(v) // api request types always marshal
	return request{
		method: method, path: path,
		body: bytes.NewReader(b), size: int64(len(b)),
		ctype: "application/json", accept: "text/event-stream",
	}
}
