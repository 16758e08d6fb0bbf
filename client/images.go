package client

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/url"
	"strings"

	"sbx.dev/sbx/api"
)

// The calls below are the steps of a template import, each one request.
// Package sbx.dev/sbx/client/image puts them together: it reads images
// (layouts, archives, registries) with go-containerregistry, which this
// package does not link.

// ImportRootfs makes template name from r, a tar of a root filesystem
// (gzipped or not: sbxd tells), streamed as it is read. WithForce points
// an existing name at the new version; WithProgress hears sbxd's events.
// Errors: api.ErrInvalid for what is not a tar or breaks sbxd's bounds,
// api.ErrConflict if name exists and WithForce is not given.
func (c *Client) ImportRootfs(ctx context.Context, name string, r io.Reader, opts ...TemplateOption) (*api.Template, error) {
	o := templateOpts(opts)
	return c.importTar(ctx, name, r, o.force, o.progress)
}

// ImportRootfsDir is ImportRootfs of a tar of the directory dir, made as it
// is sent: owners, modes, extended attributes, and hard links as links.
func (c *Client) ImportRootfsDir(ctx context.Context, name, dir string, opts ...TemplateOption) (*api.Template, error) {
	pr := tarDir(dir)
	defer pr.Close()
	return c.ImportRootfs(ctx, name, pr, opts...)
}

// ImportImageConfig asks sbxd to make template name from an image, given
// its config byte for byte (its digest, the image ID, is the version) and
// source, what `template ls` says it came from. When sbxd has every layer
// the config names it returns the template; otherwise it returns the diff
// IDs of the layers to send first with UploadLayer, and the call is made
// again. WithForce and WithProgress apply. Errors: api.ErrInvalid for a
// config sbxd cannot run, api.ErrConflict if name exists without WithForce.
func (c *Client) ImportImageConfig(ctx context.Context, name string, config []byte, source string, opts ...TemplateOption) (t *api.Template, missing []string, err error) {
	o := templateOpts(opts)
	b, err := json.Marshal(api.ImageImport{Config: config, Source: source, Force: o.force})
	if err != nil {
		return nil, nil, err
	}
	resp, err := c.send(ctx, request{
		method: http.MethodPost, path: "/v1/templates/" + url.PathEscape(name) + "/image",
		body: strings.NewReader(string(b)), size: int64(len(b)), ctype: "application/json", accept: "text/event-stream",
	})
	if err != nil {
		return nil, nil, err
	}
	defer resp.Body.Close()
	t, err = readProgress(resp.Body, name, func(p api.Progress) {
		if p.Event == "missing" {
			missing = p.Missing
			return
		}
		o.progress(p)
	})
	if len(missing) > 0 {
		return nil, missing, nil
	}
	return t, nil, err
}

// UploadLayer sends sbxd the image layer whose diff ID (the digest of its
// uncompressed tar) is diffID: r is the layer as a tar, gzip or zstd,
// streamed as it is read; sbxd checks the digest. WithProgress hears sbxd's
// events. Errors: api.ErrInvalid for a layer that is not what diffID says
// or breaks sbxd's bounds (--max-layer-size).
func (c *Client) UploadLayer(ctx context.Context, diffID string, r io.Reader, opts ...TemplateOption) error {
	o := templateOpts(opts)
	resp, err := c.send(ctx, request{
		method: http.MethodPut, path: "/v1/layers/" + url.PathEscape(diffID),
		body: r, size: -1, ctype: "application/octet-stream", accept: "text/event-stream",
	})
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	_, err = readProgress(resp.Body, diffID, o.progress)
	return err
}

// templateOptions are what TemplateOption set.
type templateOptions struct {
	force    bool
	packages []string
	progress func(api.Progress)
}

func templateOpts(opts []TemplateOption) templateOptions {
	var o templateOptions
	for _, f := range opts {
		f.applyTemplate(&o)
	}
	if o.progress == nil {
		o.progress = func(api.Progress) {}
	}
	return o
}
