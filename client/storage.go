package client

import (
	"context"
	"net/http"
	"net/url"

	"sbx.dev/sbx/api"
)

// KeepSnapshot promotes the snapshot name (a freeze, above all): it
// outlives its sandbox, counts in no freeze quota, and a prune leaves it.
// api.ErrNotFound if there is none.
func (c *Client) KeepSnapshot(ctx context.Context, name string) (*api.Snapshot, error) {
	var s api.Snapshot
	if err := c.call(ctx, http.MethodPost, "/v1/snapshots/"+url.PathEscape(name)+"/keep", nil, nil, &s); err != nil {
		return nil, err
	}
	return &s, nil
}

// Storage says what uses sbxd's data dir: per sandbox, snapshot, freeze,
// template and orphan image, with totals and the budget (sbx df).
func (c *Client) Storage(ctx context.Context) (*api.Storage, error) {
	var s api.Storage
	if err := c.call(ctx, http.MethodGet, "/v1/storage", nil, nil, &s); err != nil {
		return nil, err
	}
	return &s, nil
}

// Prune removes orphan images and, with req.Freezes, freezes not kept, and
// says what it removed (with req.DryRun, what it would). A bad OlderThan is
// api.ErrInvalid.
func (c *Client) Prune(ctx context.Context, req api.PruneRequest) (*api.PruneResult, error) {
	var res api.PruneResult
	if err := c.call(ctx, http.MethodPost, "/v1/storage/prune", nil, &req, &res); err != nil {
		return nil, err
	}
	return &res, nil
}
