package client

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"

	"sbx.dev/sbx/api"
)

// LogsOption tunes Logs.
type LogsOption func(*logsRequest)

type logsRequest struct {
	stream string
	follow bool
	tail   int
}

// WithStream picks the log stream: "console" (the default), "events",
// "runtime" or "exec/EXEC_ID".
func WithStream(name string) LogsOption { return func(r *logsRequest) { r.stream = name } }

// WithFollow keeps the stream open for what comes, until ctx ends, the
// sandbox is deleted or (for an exec) the exec ends.
func WithFollow() LogsOption { return func(r *logsRequest) { r.follow = true } }

// WithTail starts the stream at its last n lines.
func WithTail(n int) LogsOption { return func(r *logsRequest) { r.tail = n } }

// Logs hands each chunk of one of the sandbox's log streams to fn. An
// unknown stream is api.ErrInvalid; an unknown sandbox or exec,
// api.ErrNotFound. An error from fn ends the stream and is returned.
func (c *Client) Logs(ctx context.Context, id string, fn func(api.LogEvent) error, opts ...LogsOption) error {
	var r logsRequest
	for _, o := range opts {
		o(&r)
	}
	q := url.Values{}
	if r.stream != "" {
		q.Set("stream", r.stream)
	}
	if r.follow {
		q.Set("follow", "1")
	}
	if r.tail > 0 {
		q.Set("tail", strconv.Itoa(r.tail))
	}
	resp, err := c.send(ctx, request{method: http.MethodGet, path: sandboxPath(id, "logs"), query: q, accept: "text/event-stream"})
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if err := readLogs(resp.Body, fn); err != nil {
		return fmt.Errorf("logs of %s: %w", id, err)
	}
	return nil
}

// readLogs hands each "log" event to fn until "eof" or the stream's end.
func readLogs(r io.Reader, fn func(api.LogEvent) error) error {
	_, err := readStream(r, func(name string, ev api.LogEvent) (bool, error) {
		switch name {
		case "log", "":
			return false, fn(ev)
		case "eof":
			return true, nil
		}
		return false, nil
	})
	return err
}

// Metrics returns the sandbox's resource use now. Asking is not activity.
func (c *Client) Metrics(ctx context.Context, id string) (*api.Metrics, error) {
	var m api.Metrics
	if err := c.call(ctx, http.MethodGet, sandboxPath(id, "metrics"), nil, nil, &m); err != nil {
		return nil, err
	}
	return &m, nil
}

// Prometheus returns sbxd's own metrics in the Prometheus text format.
func (c *Client) Prometheus(ctx context.Context) ([]byte, error) {
	resp, err := c.send(ctx, request{method: http.MethodGet, path: "/metrics", accept: "text/plain"})
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, fmt.Errorf("GET /metrics: %w", err)
	}
	return b, nil
}
