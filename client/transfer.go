package client

import (
	"context"
	"net/http"
	"net/url"

	"sbx.dev/sbx/api"
)

// PushSnapshot pushes snapshot name's image to ref, a repository of an OCI
// registry with a tag or not (127.0.0.1:5000/sbx/flaky:run-7), and says
// where it went, by digest. sbxd talks to the registry, with its user's
// docker credentials.
func (c *Client) PushSnapshot(ctx context.Context, name, ref string) (*api.PushResult, error) {
	req := api.PushRequest{Ref: ref}
	if err := req.Validate(); err != nil {
		return nil, err
	}
	var res api.PushResult
	if err := c.call(ctx, http.MethodPost, "/v1/snapshots/"+url.PathEscape(name)+"/push", nil, req, &res); err != nil {
		return nil, err
	}
	return &res, nil
}

// PullSnapshot pulls a snapshot pushed by an sbxd (a tag or a digest) and
// records it under name ("" is the name it was pushed with). Its files
// already on this sbxd's node are not fetched again.
func (c *Client) PullSnapshot(ctx context.Context, ref, name string) (*api.PullResult, error) {
	req := api.PullRequest{Ref: ref, Name: name}
	if err := req.Validate(); err != nil {
		return nil, err
	}
	var res api.PullResult
	if err := c.call(ctx, http.MethodPost, "/v1/snapshots/pull", nil, req, &res); err != nil {
		return nil, err
	}
	return &res, nil
}
