package client

import (
	"context"
	"net/http"
	"time"

	"sbx.dev/sbx/api"
)

// SetTTL sets a sandbox's idle ttl; 0 turns the idle reaper off for it.
func (c *Client) SetTTL(ctx context.Context, id string, ttl time.Duration) (*api.Sandbox, error) {
	return c.SetTTLString(ctx, id, ttl.String())
}

// SetTTLString sets a sandbox's idle ttl as the server parses it ("30m");
// a bad duration is api.ErrInvalid naming the field.
func (c *Client) SetTTLString(ctx context.Context, id, ttl string) (*api.Sandbox, error) {
	var sb api.Sandbox
	if err := c.call(ctx, http.MethodPost, sandboxPath(id, "ttl"), nil, &api.TTLRequest{TTL: ttl}, &sb); err != nil {
		return nil, err
	}
	return &sb, nil
}

// SetPersistent exempts a sandbox from the idle reaper (or not). Where sbxd
// caps sandboxes' lifetime it is api.ErrForbidden.
func (c *Client) SetPersistent(ctx context.Context, id string, persistent bool) (*api.Sandbox, error) {
	var sb api.Sandbox
	if err := c.call(ctx, http.MethodPost, sandboxPath(id, "persist"), nil, &api.PersistRequest{Persistent: persistent}, &sb); err != nil {
		return nil, err
	}
	return &sb, nil
}
