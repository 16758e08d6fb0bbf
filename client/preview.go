package client

import (
	"context"
	"net/http"
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

// Preview returns the URL that reaches port inside sandbox id through
// sbxd's preview proxy. A bad port or ttl is api.ErrInvalid; an unknown
// sandbox api.ErrNotFound; a daemon without a preview proxy api.ErrUnavailable.
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
