package client

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"

	"sbx.dev/sbx/api"
	"sbx.dev/sbx/internal/safetar"
)

// Templates lists the templates sbxd has.
func (c *Client) Templates(ctx context.Context) ([]api.Template, error) {
	var ts []api.Template
	if err := c.call(ctx, http.MethodGet, "/v1/templates", nil, nil, &ts); err != nil {
		return nil, err
	}
	return ts, nil
}

// Template returns the template name: the version it points at now, and its
// defaults. api.ErrNotFound if there is none.
func (c *Client) Template(ctx context.Context, name string) (*api.Template, error) {
	var t api.Template
	if err := c.call(ctx, http.MethodGet, "/v1/templates/"+url.PathEscape(name), nil, nil, &t); err != nil {
		return nil, err
	}
	return &t, nil
}

// BuildTemplate builds the template name: "tiny", "base", or with
// WithPackages base plus those Debian packages. A name already built the
// same way is cached; WithForce builds it again. WithProgress hears each
// step. It returns the template from the last event, or the build's error
// (api.ErrConflict for a name taken by something else, without WithForce).
// The build goes on on sbxd if the client leaves.
func (c *Client) BuildTemplate(ctx context.Context, name string, opts ...TemplateOption) (*api.Template, error) {
	o := templateOpts(opts)
	progress := o.progress
	q := url.Values{}
	if o.force {
		q.Set("force", "1")
	}
	if len(o.packages) > 0 {
		q.Set("packages", strings.Join(o.packages, ","))
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

func (c *Client) importTar(ctx context.Context, name string, tar io.Reader, force bool, progress func(api.Progress)) (*api.Template, error) {
	var q url.Values
	if force {
		q = url.Values{"force": {"1"}}
	}
	resp, err := c.send(ctx, request{
		method: http.MethodPut, path: "/v1/templates/" + url.PathEscape(name), query: q,
		body: tar, size: -1, ctype: "application/octet-stream", accept: "text/event-stream",
	})
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	return readProgress(resp.Body, name, progress)
}

// RemoveTemplate removes the name and returns what it pointed at, with the
// sandboxes and snapshots that still hold that version (HeldBy): its files
// stay until the last of them goes. api.ErrNotFound if there is no such name.
func (c *Client) RemoveTemplate(ctx context.Context, name string) (*api.Template, error) {
	var t api.Template
	if err := c.call(ctx, http.MethodDelete, "/v1/templates/"+url.PathEscape(name), nil, nil, &t); err != nil {
		return nil, err
	}
	return &t, nil
}

// readProgress follows a progress stream to its last event. An image
// import that ends with "missing" (layers to send first) returns neither a
// template nor an error.
func readProgress(r io.Reader, name string, progress func(api.Progress)) (*api.Template, error) {
	var t *api.Template
	missing := false
	end, err := readStream(r, func(ev string, p api.Progress) (bool, error) {
		if p.Event == "" {
			p.Event = ev
		}
		if progress != nil {
			progress(p)
		}
		switch {
		case p.Error != nil:
			return false, p.Err()
		case ev == "missing":
			missing = true
			return true, nil
		case p.Done:
			t = p.Template
			if t == nil {
				t = &api.Template{Name: name}
			}
			return true, nil
		}
		return false, nil
	})
	if end == streamCut || isBroken(err) {
		return nil, &StreamError{Op: "template " + name, Err: brokenCause(err)}
	}
	if missing {
		return nil, err
	}
	return t, err
}

// tarDir streams a tar of the contents of dir, as it is read.
func tarDir(dir string) io.ReadCloser {
	pr, pw := io.Pipe()
	go func() { pw.CloseWithError(writeTar(pw, dir)) }()
	return pr
}

// writeTar writes a tar of the contents of root to w: owners, modes,
// extended attributes, and hard links as links.
func writeTar(w io.Writer, root string) error {
	return safetar.Write(w, root, safetar.WriteOptions{Xattrs: true})
}
