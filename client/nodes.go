package client

import (
	"context"
	"net/http"
	"net/url"

	"sbx.dev/sbx/api"
)

// Nodes lists the machines of the fleet whose controller c speaks to. A
// single sbxd has none: api.ErrNotFound, saying so.
func (c *Client) Nodes(ctx context.Context) ([]api.Node, error) {
	var ns []api.Node
	if err := c.call(ctx, http.MethodGet, "/v1/nodes", nil, nil, &ns); err != nil {
		return nil, err
	}
	return ns, nil
}

// Node returns one node of the fleet.
func (c *Client) Node(ctx context.Context, name string) (*api.Node, error) {
	var n api.Node
	if err := c.call(ctx, http.MethodGet, "/v1/nodes/"+url.PathEscape(name), nil, nil, &n); err != nil {
		return nil, err
	}
	return &n, nil
}

// Cordon stops the fleet from placing anything new on node name; what it
// runs stays. Uncordon undoes it.
func (c *Client) Cordon(ctx context.Context, name string) (*api.Node, error) {
	return c.nodeVerb(ctx, name, "cordon")
}

// Uncordon lets the fleet place sandboxes on node name again.
func (c *Client) Uncordon(ctx context.Context, name string) (*api.Node, error) {
	return c.nodeVerb(ctx, name, "uncordon")
}

func (c *Client) nodeVerb(ctx context.Context, name, verb string) (*api.Node, error) {
	var n api.Node
	if err := c.call(ctx, http.MethodPost, "/v1/nodes/"+url.PathEscape(name)+"/"+verb, nil, nil, &n); err != nil {
		return nil, err
	}
	return &n, nil
}

// Drain cordons node name and moves each of its sandboxes to other nodes
// of the fleet: a ready one is stopped with its memory, moved and resumed
// there; a stopped one is moved and stays stopped. One that cannot move
// stays where it is, and its MoveResult says why.
func (c *Client) Drain(ctx context.Context, name string) (*api.DrainResult, error) {
	var res api.DrainResult
	if err := c.call(ctx, http.MethodPost, "/v1/nodes/"+url.PathEscape(name)+"/drain", nil, nil, &res); err != nil {
		return nil, err
	}
	return &res, nil
}
