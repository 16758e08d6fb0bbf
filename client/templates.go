package client

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"

	"sbx.dev/sbx/api"
)

// Templates lists the templates sbxd has.
func (c *Client) Templates(ctx context.Context) ([]api.Template, error) {
	var ts []api.Template
	if err := c.call(ctx, http.MethodGet, "/v1/templates", nil, nil, &ts); err != nil {
		return nil, err
	}
	return ts, nil
}

// BuildTemplate builds the template name (again, with force), handing each
// progress event to progress (which may be nil). It returns the template from
// the last event, or the build's error.
func (c *Client) BuildTemplate(ctx context.Context, name string, force bool, progress func(api.Progress)) (*api.Template, error) {
	var q url.Values
	if force {
		q = url.Values{"force": {"1"}}
	}
	resp, err := c.send(ctx, request{
		method: http.MethodPost, path: "/v1/templates/" + url.PathEscape(name) + "/build",
		query: q, accept: "text/event-stream",
	})
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	t, err := readProgress(resp.Body, name, progress)
	if err != nil {
		return nil, fmt.Errorf("build template %s: %w", name, err)
	}
	return t, nil
}

// ImportTemplate makes the template name from tar, a tar (or gzipped tar) of a
// root filesystem, streamed as it is read.
func (c *Client) ImportTemplate(ctx context.Context, name string, tar io.Reader, progress func(api.Progress)) (*api.Template, error) {
	resp, err := c.send(ctx, request{
		method: http.MethodPut, path: "/v1/templates/" + url.PathEscape(name),
		body: tar, size: -1, ctype: "application/octet-stream", accept: "text/event-stream",
	})
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	t, err := readProgress(resp.Body, name, progress)
	if err != nil {
		return nil, fmt.Errorf("import template %s: %w", name, err)
	}
	return t, nil
}

// RemoveTemplate deletes the template name; api.ErrNotFound if there is none.
func (c *Client) RemoveTemplate(ctx context.Context, name string) error {
	return c.call(ctx, http.MethodDelete, "/v1/templates/"+url.PathEscape(name), nil, nil, nil)
}

// readProgress follows a progress stream to its last event.
func readProgress(r io.Reader, name string, progress func(api.Progress)) (*api.Template, error) {
	sr := newSSEReader(r)
	for {
		raw, err := sr.next()
		if err == io.EOF {
			return nil, errors.New("stream ended before the last progress event")
		}
		if err != nil {
			return nil, err
		}
		var p api.Progress
		if len(raw.data) > 0 {
			if err := json.Unmarshal(raw.data, &p); err != nil {
				return nil, fmt.Errorf("decode %q event: %w", raw.name, err)
			}
		}
		if p.Event == "" {
			p.Event = raw.name
		}
		if progress != nil {
			progress(p)
		}
		switch {
		case p.Error != "":
			return nil, errors.New(p.Error)
		case raw.name == "error":
			return nil, errors.New("the server reported an error without a message")
		case p.Done:
			if p.Template == nil {
				return &api.Template{Name: name}, nil
			}
			return p.Template, nil
		}
	}
}
