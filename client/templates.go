package client

import (
	"context"
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
	var t *api.Template
	ended, err := readStream(r, func(ev string, p api.Progress) (bool, error) {
		if p.Event == "" {
			p.Event = ev
		}
		if progress != nil {
			progress(p)
		}
		switch {
		case p.Error != "":
			return false, api.StreamError(p.Code, p.Error)
		case p.Done:
			t = p.Template
			if t == nil {
				t = &api.Template{Name: name}
			}
			return true, nil
		}
		return false, nil
	})
	if ended {
		return nil, errors.New("stream ended before the last progress event")
	}
	return t, err
}
