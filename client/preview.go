package client

import (
	"context"
	"net/http"
	"strconv"
	"time"

	"sbx.dev/sbx/api"
)

// Ports lists the TCP ports listening inside a running sandbox. An unknown
// sandbox is api.ErrNotFound; one not running api.ErrConflict.
func (c *Client) Ports(ctx context.Context, id string) ([]api.Port, error) {
	var ps []api.Port
	if err := c.call(ctx, http.MethodGet, sandboxPath(id, "ports"), nil, nil, &ps); err != nil {
		return nil, err
	}
	return ps, nil
}

// PreviewOption sets one field of a preview request.
type PreviewOption func(*api.PreviewRequest)

// PrivatePreview asks for a private preview: its URL carries a signed token
// valid for ttl (0: the server's default, an hour), and the port then
// refuses requests without one.
func PrivatePreview(ttl time.Duration) PreviewOption {
	return func(r *api.PreviewRequest) {
		r.Private = true
		if ttl > 0 {
			r.TTL = ttl.String()
		}
	}
}

// Preview publishes port of sandbox id on sbxd's preview proxy (which
// serves no other port) and returns the URL that reaches it. The
// publication lasts until WithdrawPreview or the sandbox's deletion, across
// restarts, stops and resumes; forks do not inherit it. A bad port or ttl
// is api.ErrInvalid; an unknown sandbox api.ErrNotFound; a sandbox without
// a network, or a port published private asked for without
// PrivatePreview, api.ErrConflict; a daemon without a preview proxy
// api.ErrUnavailable.
func (c *Client) Preview(ctx context.Context, id string, port int, opts ...PreviewOption) (*api.Preview, error) {
	req := api.PreviewRequest{Port: port}
	for _, o := range opts {
		o(&req)
	}
	var p api.Preview
	if err := c.call(ctx, http.MethodPost, sandboxPath(id, "preview"), nil, req, &p); err != nil {
		return nil, err
	}
	return &p, nil
}

// WithdrawPreview withdraws port of sandbox id from the preview proxy
// (`sbx preview ID PORT --off`): from then on its URL answers 404. An
// unknown sandbox, or a port not published, is api.ErrNotFound.
func (c *Client) WithdrawPreview(ctx context.Context, id string, port int) error {
	return c.call(ctx, http.MethodDelete, sandboxPath(id, "preview", strconv.Itoa(port)), nil, nil, nil)
}

// Previews lists the ports published of sandbox id, with their URLs (a
// private one's without its token: ask Preview for one).
func (c *Client) Previews(ctx context.Context, id string) ([]api.Preview, error) {
	var ps []api.Preview
	if err := c.call(ctx, http.MethodGet, sandboxPath(id, "preview"), nil, nil, &ps); err != nil {
		return nil, err
	}
	return ps, nil
}
