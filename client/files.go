package client

import (
	"context"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"net/url"
	"strconv"

	"sbx.dev/sbx/api"
)

// ReadFile opens the file at path inside the sandbox; the caller reads it as
// it streams and closes it. A read error before the end (io.ErrUnexpectedEOF)
// means the file did not arrive whole.
func (c *Client) ReadFile(ctx context.Context, id, path string) (io.ReadCloser, error) {
	resp, err := c.send(ctx, request{
		method: http.MethodGet, path: sandboxPath(id, "files"),
		query: url.Values{"path": {path}},
	})
	if err != nil {
		return nil, err
	}
	return resp.Body, nil
}

// WriteFile streams size bytes from r into the file at path inside the
// sandbox, with mode's permission bits. The file lands whole or not at all;
// r must hold at least size bytes.
func (c *Client) WriteFile(ctx context.Context, id, path string, r io.Reader, size int64, mode fs.FileMode) error {
	if size < 0 {
		return api.Errorf(api.ErrInvalid, "write %s in %s: negative size %d", path, id, size)
	}
	resp, err := c.send(ctx, request{
		method: http.MethodPut, path: sandboxPath(id, "files"),
		query: url.Values{"path": {path}, "mode": {fmt.Sprintf("%04o", mode.Perm())}},
		body:  io.LimitReader(r, size), size: size, ctype: "application/octet-stream",
	})
	if err != nil {
		return err
	}
	return drain(resp)
}

// ReadTar streams a tar of path (a file or a directory) inside the sandbox;
// its entries are named from path's base name.
func (c *Client) ReadTar(ctx context.Context, id, path string) (io.ReadCloser, error) {
	resp, err := c.send(ctx, request{
		method: http.MethodGet, path: sandboxPath(id, "files"),
		query: url.Values{"path": {path}, "tar": {"1"}},
	})
	if err != nil {
		return nil, err
	}
	return resp.Body, nil
}

// WriteTar streams the tar r (chunked) to be extracted under the directory dir
// inside the sandbox.
func (c *Client) WriteTar(ctx context.Context, id, dir string, r io.Reader) error {
	resp, err := c.send(ctx, request{
		method: http.MethodPut, path: sandboxPath(id, "files"),
		query: url.Values{"path": {dir}, "tar": {"1"}},
		body:  r, size: -1, ctype: "application/x-tar",
	})
	if err != nil {
		return err
	}
	return drain(resp)
}

// Stat describes the file at path inside the sandbox (the link itself for a
// symlink); api.ErrNotFound if there is none.
func (c *Client) Stat(ctx context.Context, id, path string) (*api.FileInfo, error) {
	var fi api.FileInfo
	if err := c.call(ctx, http.MethodGet, sandboxPath(id, "fs", "stat"), url.Values{"path": {path}}, nil, &fi); err != nil {
		return nil, err
	}
	return &fi, nil
}

// maxListEntries is the most entries ReadDir gathers.
const maxListEntries = 1 << 20

// ReadDir lists the directory at path inside the sandbox, sorted by name,
// a page (api.MaxListPage entries) at a time.
func (c *Client) ReadDir(ctx context.Context, id, path string) ([]api.FileInfo, error) {
	var all []api.FileInfo
	after := ""
	for {
		var page []api.FileInfo
		q := url.Values{"path": {path}, "limit": {strconv.Itoa(api.MaxListPage)}}
		if after != "" {
			q.Set("after", after)
		}
		if err := c.call(ctx, http.MethodGet, sandboxPath(id, "fs", "ls"), q, nil, &page); err != nil {
			return nil, err
		}
		all = append(all, page...)
		if len(page) < api.MaxListPage {
			return all, nil
		}
		// What a sandbox answers may be anything: each page must move on.
		if last := page[len(page)-1].Name; last > after && len(all) < maxListEntries {
			after = last
		} else {
			return nil, fmt.Errorf("list %s in %s: the sandbox's listing does not end (%d entries so far)", path, id, len(all))
		}
	}
}

// drain reads what is left of a short answer so the connection can be reused.
func drain(resp *http.Response) error {
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, maxErrorBody))
	return nil
}
