package client

import (
	"archive/tar"
	"context"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
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
		case p.Error != "":
			return false, api.StreamError(p.Code, p.Error)
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
	tw := tar.NewWriter(w)
	type inode struct{ dev, ino uint64 }
	links := map[inode]string{}
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if p == root {
			return nil
		}
		info, err := d.Info() // of the link itself
		if err != nil {
			return err
		}
		if info.Mode()&fs.ModeSocket != 0 {
			return nil // a tar cannot hold a socket
		}
		link := ""
		if info.Mode()&fs.ModeSymlink != 0 {
			if link, err = os.Readlink(p); err != nil {
				return err
			}
		}
		hdr, err := tar.FileInfoHeader(info, link)
		if err != nil {
			return fmt.Errorf("tar %s: %w", p, err)
		}
		rel, err := filepath.Rel(root, p)
		if err != nil {
			return err
		}
		hdr.Name = filepath.ToSlash(rel)
		if d.IsDir() {
			hdr.Name += "/"
		}
		hdr.Uname, hdr.Gname = "", ""
		if st, ok := info.Sys().(*syscall.Stat_t); ok && info.Mode().IsRegular() && st.Nlink > 1 {
			k := inode{uint64(st.Dev), st.Ino}
			if first, ok := links[k]; ok {
				hdr.Typeflag, hdr.Linkname, hdr.Size = tar.TypeLink, first, 0
			} else {
				links[k] = hdr.Name
			}
		}
		addXattrs(hdr, p)
		if err := tw.WriteHeader(hdr); err != nil {
			return fmt.Errorf("tar %s: %w", p, err)
		}
		if hdr.Typeflag != tar.TypeReg {
			return nil
		}
		f, err := os.Open(p)
		if err != nil {
			return err
		}
		defer f.Close()
		if _, err := io.Copy(tw, f); err != nil {
			return fmt.Errorf("tar %s: %w", p, err)
		}
		return nil
	})
	if err != nil {
		return err
	}
	return tw.Close()
}

// addXattrs records p's extended attributes in hdr, as GNU tar does.
func addXattrs(hdr *tar.Header, p string) {
	buf := make([]byte, 64<<10)
	n, err := unix.Llistxattr(p, buf)
	if err != nil || n == 0 {
		return
	}
	for _, name := range strings.Split(string(buf[:n]), "\x00") {
		if name == "" {
			continue
		}
		v := make([]byte, 64<<10)
		m, err := unix.Lgetxattr(p, name, v)
		if err != nil {
			continue
		}
		if hdr.PAXRecords == nil {
			hdr.PAXRecords = map[string]string{}
		}
		hdr.PAXRecords["SCHILY.xattr."+name] = string(v[:m])
	}
	if hdr.PAXRecords != nil {
		hdr.Format = tar.FormatPAX
	}
}
