package client

import (
	"context"
	"net/http"
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
