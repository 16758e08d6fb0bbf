package client

import (
	"context"
	"net/http"
	"net/url"

	"sbx.dev/sbx/api"
)

// snapshotPath returns the escaped path of a named snapshot.
func snapshotPath(name string) string { return "/v1/snapshots/" + url.PathEscape(name) }

// Snapshot captures the sandbox's disk (and with memory its processes and
// memory) as the snapshot name, which outlives the sandbox. A taken name is
// an api.ErrConflict, a bad one api.ErrInvalid; a failed capture leaves the
// sandbox running and says why.
func (c *Client) Snapshot(ctx context.Context, id, name string, memory bool) (*api.Snapshot, error) {
	var s api.Snapshot
	req := api.SnapshotRequest{Name: name, Memory: memory}
	if err := c.call(ctx, http.MethodPost, sandboxPath(id, "snapshots"), nil, &req, &s); err != nil {
		return nil, err
	}
	return &s, nil
}

// Snapshots lists every snapshot.
func (c *Client) Snapshots(ctx context.Context) ([]api.Snapshot, error) {
	var ss []api.Snapshot
	if err := c.call(ctx, http.MethodGet, "/v1/snapshots", nil, nil, &ss); err != nil {
		return nil, err
	}
	return ss, nil
}

// GetSnapshot returns the snapshot name, or an api.ErrNotFound.
func (c *Client) GetSnapshot(ctx context.Context, name string) (*api.Snapshot, error) {
	var s api.Snapshot
	if err := c.call(ctx, http.MethodGet, snapshotPath(name), nil, nil, &s); err != nil {
		return nil, err
	}
	return &s, nil
}

// DeleteSnapshot removes the snapshot name; api.ErrNotFound if there is none.
func (c *Client) DeleteSnapshot(ctx context.Context, name string) error {
	return c.call(ctx, http.MethodDelete, snapshotPath(name), nil, nil, nil)
}
