// Package client is the Go client of sbxd, the daemon of sbx: sandboxes on
// gVisor that run commands, move files, and freeze, fork and replay a
// whole machine.
//
// A Client talks to one sbxd. Most work goes through a Sandbox handle:
//
//	c, err := client.New("") // $SBX_HOST, else the local socket
//	info, err := c.Create(ctx, client.WithTemplate("base"), client.WithTTL(30*time.Minute))
//	sb := c.Sandbox(info.ID)
//	res, err := sb.Exec(ctx, []string{"go", "test", "./..."}, client.WithStdout(os.Stdout))
//	kids, err := sb.Fork(ctx, client.WithMemory(), client.WithCount(4))
//
// Every option is a functional option (WithX) of the call it is passed to;
// durations are time.Duration. Every error that sbxd reports matches one of
// the kinds of package api under errors.Is (api.ErrNotFound,
// api.ErrConflict, api.ErrInvalid, ...), on a plain call and on a stream
// alike; a stream that breaks before its end (sbxd went away) is a
// *StreamError, of kind api.ErrUnavailable, naming what goes on without it.
// Errors carry no advice for the sbx command line: they say what happened.
//
// The examples do three whole jobs: run a project's tests and fetch the
// result (Example_runTests), snapshot a server and fork it N ways,
// querying every child (Example_forkServer), and hunt a flaky test, then
// resume the failure alive (Example_huntFlaky).
//
// Templates from container images (OCI layouts and archives, docker-save
// archives, registries) are made by package sbx.dev/sbx/client/image, on
// this package's import calls: the client itself links no image library.
package client

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"strings"

	"sbx.dev/sbx/api"
)

// DefaultHost is where sbxd listens unless told otherwise.
const DefaultHost = "unix:///run/sbx/sbxd.sock"

// Client talks to one sbxd. It is safe for concurrent use.
type Client struct {
	host  string // as given, for messages
	base  string // scheme://authority the requests go to
	token string
	hc    *http.Client
}

// ClientOption configures New.
type ClientOption interface{ applyClient(*Client) }

type clientOption func(*Client)

func (o clientOption) applyClient(c *Client) { o(c) }

// WithToken sets the bearer token sent with every request; the default is $SBX_TOKEN.
func WithToken(token string) ClientOption { return clientOption(func(c *Client) { c.token = token }) }

// WithHTTPClient replaces the HTTP client (its transport decides how to reach
// the host). It should have no Timeout: streams last as long as their exec.
func WithHTTPClient(hc *http.Client) ClientOption { return clientOption(func(c *Client) { c.hc = hc }) }

// New returns a client of the sbxd at host: "unix:///path/to.sock",
// "tcp://host:port" (or "http://host:port", "https://host:port"). An empty
// host means $SBX_HOST, else DefaultHost. It returns an error wrapping
// api.ErrInvalid for a host it cannot parse; it does not connect.
func New(host string, opts ...ClientOption) (*Client, error) {
	if host == "" {
		host = os.Getenv("SBX_HOST")
	}
	if host == "" {
		host = DefaultHost
	}
	c := &Client{host: host, token: os.Getenv("SBX_TOKEN")}
	scheme, rest, ok := strings.Cut(host, "://")
	if !ok || rest == "" {
		return nil, api.Errorf(api.ErrInvalid, "host %q: want unix:///path/to.sock or tcp://host:port", host)
	}
	// no client-wide timeout: exec and build streams run as long as the server lets them
	tr := http.DefaultTransport.(*http.Transport).Clone()
	switch scheme {
	case "unix":
		sock := rest
		var d net.Dialer
		tr.DialContext = func(ctx context.Context, _, _ string) (net.Conn, error) {
			return d.DialContext(ctx, "unix", sock)
		}
		tr.Proxy = nil
		c.base = "http://sbxd"
	case "tcp", "http":
		c.base = "http://" + strings.TrimSuffix(rest, "/")
	case "https":
		c.base = "https://" + strings.TrimSuffix(rest, "/")
	default:
		return nil, api.Errorf(api.ErrInvalid, "host %q: unknown scheme %q; want unix:// or tcp://", host, scheme)
	}
	c.hc = &http.Client{Transport: tr}
	for _, o := range opts {
		o.applyClient(c)
	}
	return c, nil
}

// Host returns the host this client talks to, as given to New (or defaulted).
func (c *Client) Host() string { return c.host }

// request describes one call; the zero values mean no query, no body.
type request struct {
	method string
	path   string // already escaped
	query  url.Values
	body   io.Reader
	size   int64 // Content-Length of body; -1 streams it chunked
	ctype  string
	accept string
	// progress asks the fleet's controller for 102 answers saying why
	// the request waits (api.HeaderProgress)
	progress bool
}

// send performs r and returns the response when its status is 2xx; any other
// answer is decoded into an *api.Error and the body is closed.
func (c *Client) send(ctx context.Context, r request) (*http.Response, error) {
	u := c.base + r.path
	if len(r.query) > 0 {
		u += "?" + r.query.Encode()
	}
	req, err := http.NewRequestWithContext(ctx, r.method, u, r.body)
	if err != nil {
		return nil, fmt.Errorf("%s %s: %w", r.method, r.path, err)
	}
	if r.body != nil {
		req.ContentLength = r.size
		if r.size == 0 {
			req.Body = http.NoBody
		}
	}
	if r.ctype != "" {
		req.Header.Set("Content-Type", r.ctype)
	}
	if r.accept != "" {
		req.Header.Set("Accept", r.accept)
	}
	if r.progress {
		req.Header.Set(api.HeaderProgress, "102")
	}
	if c.token != "" {
		req.Header.Set("Authorization", "Bearer "+c.token)
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		return nil, c.transportError(err)
	}
	if resp.StatusCode/100 != 2 {
		defer resp.Body.Close()
		return nil, decodeError(resp)
	}
	return resp, nil
}

// transportError says that sbxd could not be reached or went away: an error
// of kind api.ErrUnavailable, unless ctx ended it.
func (c *Client) transportError(err error) error {
	var op *net.OpError
	switch {
	case errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded):
		return fmt.Errorf("sbxd at %s: %w", c.host, err)
	case errors.As(err, &op) && op.Op == "dial":
		return &UnreachableError{Host: c.host, Err: err}
	}
	return &UnreachableError{Host: c.host, Err: err, Dropped: true}
}

// UnreachableError says that sbxd could not be reached (Dropped false: the
// dial failed, nothing was sent), or that the connection broke before an
// answer (Dropped true: the request may have been carried out). It matches
// api.ErrUnavailable.
type UnreachableError struct {
	Host    string
	Dropped bool
	Err     error
}

func (e *UnreachableError) Error() string {
	if e.Dropped {
		return fmt.Sprintf("the connection to sbxd at %s broke before its answer: %v", e.Host, e.Err)
	}
	return fmt.Sprintf("cannot reach sbxd at %s: %v", e.Host, e.Err)
}

func (e *UnreachableError) Unwrap() []error { return []error{e.Err, api.ErrUnavailable} }

// maxErrorBody bounds how much of an error answer is read.
const maxErrorBody = 64 << 10

// decodeError turns a non-2xx answer into an *api.Error. A body that is not
// an api.ErrorBody gets the code its status stands for.
func decodeError(resp *http.Response) *api.Error {
	body, _ := io.ReadAll(io.LimitReader(resp.Body, maxErrorBody))
	e := &api.Error{Status: resp.StatusCode}
	var eb api.ErrorBody
	if json.Unmarshal(body, &eb) == nil && eb.Error.Code != "" {
		e.Code, e.Message = eb.Error.Code, eb.Error.Message
	} else {
		e.Code = codeOf(resp.StatusCode)
	}
	if e.Message == "" {
		msg := strings.TrimSpace(string(bytes.ToValidUTF8(body, []byte("?"))))
		if len(msg) > 200 {
			msg = msg[:200] + "..."
		}
		e.Message = fmt.Sprintf("sbxd answered %s", resp.Status)
		if msg != "" {
			e.Message += ": " + msg
		}
	}
	return e
}

// kinds lists the api error kinds, so the status→code direction reads the
// api's one table through api.StatusOf.
var kinds = []error{
	api.ErrNotFound, api.ErrConflict, api.ErrInvalid, api.ErrForbidden,
	api.ErrUnavailable, api.ErrTooLarge, api.ErrUnauthorized, api.ErrInternal,
}

// codeOf returns the wire code of an HTTP status: the kind the api maps to it,
// else "invalid" for other 4xx and "internal" for the rest.
func codeOf(status int) string {
	for _, k := range kinds {
		if s, code := api.StatusOf(k); s == status {
			return code
		}
	}
	if status/100 == 4 {
		_, code := api.StatusOf(api.ErrInvalid)
		return code
	}
	_, code := api.StatusOf(api.ErrInternal)
	return code
}

// call sends r with in (if not nil) as its JSON body and decodes the answer into out (if not nil).
func (c *Client) call(ctx context.Context, method, path string, query url.Values, in, out any) error {
	return c.callRequest(ctx, request{method: method, path: path, query: query}, in, out)
}

// callRequest is call of r, with its body in and its answer out.
func (c *Client) callRequest(ctx context.Context, r request, in, out any) error {
	method, path := r.method, r.path
	if v, ok := in.(validator); ok {
		if err := v.Validate(); err != nil {
			return err
		}
	}
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			return fmt.Errorf("%s %s: %w", method, path, err)
		}
		r.body, r.size, r.ctype = bytes.NewReader(b), int64(len(b)), "application/json"
	}
	resp, err := c.send(ctx, r)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if out == nil {
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, maxErrorBody))
		return nil
	}
	if err := json.NewDecoder(resp.Body).Decode(out); err != nil {
		return fmt.Errorf("%s %s: decode answer: %w", method, path, err)
	}
	return nil
}

// validator is a request body that checks its fields (api's Validate), as
// sbxd does: a bad one is refused before it is sent, with sbxd's message.
type validator interface{ Validate() error }

// Health reports sbxd's status and version.
func (c *Client) Health(ctx context.Context) (*api.Health, error) {
	var h api.Health
	if err := c.call(ctx, http.MethodGet, "/v1/health", nil, nil, &h); err != nil {
		return nil, err
	}
	return &h, nil
}

// sandboxPath returns the escaped path of a sandbox, plus any escaped suffix.
func sandboxPath(id string, suffix ...string) string {
	p := "/v1/sandboxes/" + url.PathEscape(id)
	for _, s := range suffix {
		p += "/" + s
	}
	return p
}
