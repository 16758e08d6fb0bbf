package client

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"time"

	"sbx.dev/sbx/api"
)

// Ports lists the TCP ports listening inside a running sandbox. An unknown
// sandbox is api.ErrNotFound; one not running api.ErrConflict.
//
// What a port's Command says is the sandbox's (a process names itself):
// quote it before it reaches a terminal.
func (s *Sandbox) Ports(ctx context.Context) ([]api.Port, error) {
	var ps []api.Port
	if err := s.c.call(ctx, http.MethodGet, s.path("ports"), nil, nil, &ps); err != nil {
		return nil, err
	}
	return ps, nil
}

// Preview publishes port of the sandbox on sbxd's preview proxy (which
// serves no other port) and returns the URL that reaches it (PreviewClient
// reaches it without wildcard DNS). The publication lasts until
// WithdrawPreview or the sandbox's deletion, across restarts, stops and
// resumes; forks do not inherit it. A bad port or ttl is api.ErrInvalid;
// an unknown sandbox api.ErrNotFound; a sandbox without a network, or a
// port published private asked for without Private, api.ErrConflict; a
// daemon without a preview proxy api.ErrUnavailable.
func (s *Sandbox) Preview(ctx context.Context, port int, opts ...PreviewOption) (*api.Preview, error) {
	req := api.PreviewRequest{Port: port}
	for _, o := range opts {
		o.applyPreview(&req)
	}
	var p api.Preview
	if err := s.c.call(ctx, http.MethodPost, s.path("preview"), nil, &req, &p); err != nil {
		return nil, err
	}
	return &p, nil
}

// WithdrawPreview withdraws port of the sandbox from the preview proxy:
// from then on its URL answers 404. An unknown sandbox, or a port not
// published, is api.ErrNotFound.
func (s *Sandbox) WithdrawPreview(ctx context.Context, port int) error {
	return s.c.call(ctx, http.MethodDelete, s.path("preview", strconv.Itoa(port)), nil, nil, nil)
}

// Previews lists the ports published of the sandbox, with their URLs (a
// private one's without its token: ask Preview for one).
func (s *Sandbox) Previews(ctx context.Context) ([]api.Preview, error) {
	var ps []api.Preview
	if err := s.c.call(ctx, http.MethodGet, s.path("preview"), nil, nil, &ps); err != nil {
		return nil, err
	}
	return ps, nil
}

// WaitPort waits until something listens on TCP port inside the sandbox,
// and returns it (on any address: one listening on 127.0.0.1 only is not
// reachable through a preview). It looks every 100ms (PollEvery), which is
// not activity. ctx bounds the wait: at its end the error wraps ctx's and
// names the port. A sandbox that is not running is api.ErrConflict at
// once; a bad port api.ErrInvalid.
func (s *Sandbox) WaitPort(ctx context.Context, port int, opts ...WaitPortOption) (*api.Port, error) {
	if port < 1 || port > 65535 {
		return nil, api.Errorf(api.ErrInvalid, "wait for port %d of %s: not a TCP port", port, s.id)
	}
	cfg := waitPortConfig{interval: 100 * time.Millisecond}
	for _, o := range opts {
		o.applyWaitPort(&cfg)
	}
	if cfg.interval <= 0 {
		cfg.interval = 100 * time.Millisecond
	}
	start := time.Now()
	t := time.NewTimer(0)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("wait for port %d of %s: nothing listens after %s: %w", port, s.id, time.Since(start).Round(time.Millisecond), ctx.Err())
		case <-t.C:
		}
		ps, err := s.Ports(ctx)
		if err != nil {
			if ctx.Err() != nil {
				continue // said above, with the port
			}
			return nil, fmt.Errorf("wait for port %d of %s: %w", port, s.id, err)
		}
		for i := range ps {
			if ps[i].Port == port {
				return &ps[i], nil
			}
		}
		t.Reset(cfg.interval)
	}
}

// PreviewDial connects to a preview URL's host without wildcard DNS: for
// an address "PORT-ID.DOMAIN:P" (as Preview's URLs have) it dials
// "DOMAIN:P", where sbxd's preview proxy listens, which routes by the
// request's host name, not by the address dialed. Any other address is
// dialed as it is. It suits http.Transport.DialContext and WebSocket
// dialers.
func PreviewDial(ctx context.Context, network, addr string) (net.Conn, error) {
	var d net.Dialer
	return d.DialContext(ctx, network, previewTarget(addr))
}

// PreviewClient returns an http.Client that reaches preview URLs through
// PreviewDial, keeping each URL's host name in the request: no
// "*.localhost" or wildcard DNS record is needed. It has no timeout.
func PreviewClient() *http.Client {
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.Proxy = nil
	tr.DialContext = PreviewDial
	return &http.Client{Transport: tr}
}

// previewHost matches the first label of a preview host: PORT-sb_ID.
var previewHost = regexp.MustCompile(`^[0-9]{1,5}-[A-Za-z0-9_.-]+$`)

// previewTarget is the address PreviewDial dials for addr.
func previewTarget(addr string) string {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return addr
	}
	label, domain, ok := strings.Cut(host, ".")
	if !ok || domain == "" || !previewHost.MatchString(label) {
		return addr
	}
	return net.JoinHostPort(domain, port)
}
