package client

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"net/url"
	"os"
	"path"
	"strconv"
	"strings"

	"sbx.dev/sbx/api"
)

// Files is the file system of a sandbox. Every path is resolved inside the
// sandbox, by its own kernel (a symlink to /etc/shadow in the sandbox is
// the sandbox's /etc/shadow): absolute, or starting at a home directory,
// "~/x" the sandbox user's, "~name/x" name's. Nothing here reads or writes
// a host path but the local side of UploadDir, DownloadDir, Upload and
// Download. Bytes moved count as activity; Stat and ReadDir do not.
type Files struct{ sb *Sandbox }

// Files returns the sandbox's file system.
func (s *Sandbox) Files() *Files { return &Files{sb: s} }

// Open streams the file at path; the caller reads it and closes it. A read
// error before the end (io.ErrUnexpectedEOF) means the file did not arrive
// whole. A missing file is api.ErrNotFound; a directory or a file that is
// not regular api.ErrInvalid.
func (f *Files) Open(ctx context.Context, path string) (io.ReadCloser, error) {
	resp, err := f.sb.c.send(ctx, request{method: http.MethodGet, path: f.sb.path("files"), query: url.Values{"path": {path}}})
	if err != nil {
		return nil, err
	}
	return resp.Body, nil
}

// ReadFile returns the content of the file at path, which must be at most
// max bytes: a larger one is api.ErrTooLarge, read no further (what a
// sandbox holds may be anything).
func (f *Files) ReadFile(ctx context.Context, path string, max int64) ([]byte, error) {
	if max < 0 {
		return nil, api.Errorf(api.ErrInvalid, "read %s in %s: negative limit %d", path, f.sb.id, max)
	}
	rc, err := f.Open(ctx, path)
	if err != nil {
		return nil, err
	}
	defer rc.Close()
	b, err := io.ReadAll(io.LimitReader(rc, max+1))
	if err != nil {
		return nil, fmt.Errorf("read %s in %s: %w", path, f.sb.id, err)
	}
	if int64(len(b)) > max {
		return nil, api.Errorf(api.ErrTooLarge, "read %s in %s: the file is larger than %d bytes", path, f.sb.id, max)
	}
	return b, nil
}

// Write streams size bytes from r into the file at path, which lands whole
// or not at all (a failed or cancelled write leaves the old file). Its
// permission bits are WithMode's (default 0644). The directory must exist
// (see MkdirAll): a missing one is api.ErrNotFound. r must hold at least
// size bytes.
func (f *Files) Write(ctx context.Context, path string, r io.Reader, size int64, opts ...FileOption) error {
	if size < 0 {
		return api.Errorf(api.ErrInvalid, "write %s in %s: negative size %d", path, f.sb.id, size)
	}
	cfg := fileOpts(opts)
	q := url.Values{"path": {path}}
	if cfg.modeSet {
		q.Set("mode", fmt.Sprintf("%04o", cfg.mode))
	}
	resp, err := f.sb.c.send(ctx, request{
		method: http.MethodPut, path: f.sb.path("files"), query: q,
		body: io.LimitReader(r, size), size: size, ctype: "application/octet-stream",
	})
	if err != nil {
		return err
	}
	return drain(resp)
}

// WriteFile writes data into the file at path, as Write does.
func (f *Files) WriteFile(ctx context.Context, path string, data []byte, opts ...FileOption) error {
	return f.Write(ctx, path, bytes.NewReader(data), int64(len(data)), opts...)
}

// WriteString writes s into the file at path, as Write does.
func (f *Files) WriteString(ctx context.Context, path, s string, opts ...FileOption) error {
	return f.Write(ctx, path, strings.NewReader(s), int64(len(s)), opts...)
}

func fileOpts(opts []FileOption) fileConfig {
	var c fileConfig
	for _, o := range opts {
		o.applyFile(&c)
	}
	return c
}

// Stat describes the file at path (the link itself for a symlink);
// api.ErrNotFound if there is none.
func (f *Files) Stat(ctx context.Context, path string) (*api.FileInfo, error) {
	var fi api.FileInfo
	if err := f.sb.c.call(ctx, http.MethodGet, f.sb.path("fs", "stat"), url.Values{"path": {path}}, nil, &fi); err != nil {
		return nil, err
	}
	return &fi, nil
}

// ReadDir lists the directory at path, sorted by name. Names are the
// sandbox's: they may hold any byte but '/' and NUL.
//
// A big directory is listed a page (api.MaxListPage entries) at a time,
// each asking for the names after the last one; a listing that does not
// move on, or passes a million entries, is an error.
func (f *Files) ReadDir(ctx context.Context, path string) ([]api.FileInfo, error) {
	var all []api.FileInfo
	after, size := "", 0
	for {
		var page []api.FileInfo
		q := url.Values{"path": {path}, "limit": {strconv.Itoa(api.MaxListPage)}}
		if after != "" {
			q.Set("after", after)
		}
		if err := f.sb.c.call(ctx, http.MethodGet, f.sb.path("fs", "ls"), q, nil, &page); err != nil {
			return nil, err
		}
		for _, fi := range page {
			// a file name is at most 255 bytes, a path 4096: past that the
			// sandbox is lying
			if len(fi.Name) > 255*3 || len(fi.Path) > 4096*3 || len(fi.Link) > 4096*3 {
				return nil, fmt.Errorf("list %s in %s: the sandbox answered an entry no file system has (a name of %d bytes)", path, f.sb.id, len(fi.Name))
			}
			size += len(fi.Name) + len(fi.Path) + len(fi.Link) + len(fi.Mode) + len(fi.Raw) + 64
		}
		if size > maxListBytes {
			return nil, fmt.Errorf("list %s in %s: the listing passed %d MiB (%d entries so far)", path, f.sb.id, maxListBytes>>20, len(all)+len(page))
		}
		all = append(all, page...)
		if len(page) < api.MaxListPage {
			return all, nil
		}
		// What a sandbox answers may be anything: each page must move on.
		last := page[len(page)-1]
		next := last.Name
		if last.Raw != nil {
			next = string(last.Raw) // the name as it is, not as JSON could carry it
		}
		if next > after && len(all) < maxListEntries {
			after = next
		} else {
			return nil, fmt.Errorf("list %s in %s: the sandbox's listing does not end (%d entries so far)", path, f.sb.id, len(all))
		}
	}
}

// maxListEntries and maxListBytes bound what ReadDir gathers.
const (
	maxListEntries = 1 << 20
	maxListBytes   = 128 << 20
)

// MkdirAll makes the directory path and any missing parents, with
// WithMode's permission bits (default 0755), owned by the sandbox's user.
// An existing directory is no error; a file in the way is api.ErrConflict.
func (f *Files) MkdirAll(ctx context.Context, path string, opts ...FileOption) error {
	cfg := fileOpts(opts)
	q := url.Values{"path": {path}}
	if cfg.modeSet {
		q.Set("mode", fmt.Sprintf("%04o", cfg.mode))
	}
	return f.sb.c.call(ctx, http.MethodPost, f.sb.path("fs", "mkdir"), q, nil, nil)
}

// Remove removes the file at path: a file, a symlink (not what it points
// to) or an empty directory. A missing one is api.ErrNotFound; a directory
// that is not empty api.ErrConflict.
func (f *Files) Remove(ctx context.Context, path string) error {
	return f.sb.c.call(ctx, http.MethodDelete, f.sb.path("files"), url.Values{"path": {path}}, nil, nil)
}

// RemoveAll removes path and everything below it; a missing path is no
// error.
func (f *Files) RemoveAll(ctx context.Context, path string) error {
	return f.sb.c.call(ctx, http.MethodDelete, f.sb.path("files"), url.Values{"path": {path}, "recursive": {"1"}}, nil, nil)
}

// Rename renames from to to, as rename(2): a file at to is replaced; a
// directory only by a directory, and only an empty one (else
// api.ErrConflict). A missing from is api.ErrNotFound.
func (f *Files) Rename(ctx context.Context, from, to string) error {
	return f.sb.c.call(ctx, http.MethodPost, f.sb.path("fs", "rename"), nil, &api.RenameRequest{From: from, To: to}, nil)
}

// ReadTar streams a tar of path (a file or a directory), its entries named
// from path's base name. What it holds is the sandbox's: extract it with
// care (DownloadDir does).
func (f *Files) ReadTar(ctx context.Context, path string) (io.ReadCloser, error) {
	resp, err := f.sb.c.send(ctx, request{method: http.MethodGet, path: f.sb.path("files"), query: url.Values{"path": {path}, "tar": {"1"}}})
	if err != nil {
		return nil, err
	}
	return resp.Body, nil
}

// WriteTar streams the tar r, extracted under the directory dir (made if
// missing: then it appears whole, or not at all).
func (f *Files) WriteTar(ctx context.Context, dir string, r io.Reader) error {
	resp, err := f.sb.c.send(ctx, request{
		method: http.MethodPut, path: f.sb.path("files"),
		query: url.Values{"path": {dir}, "tar": {"1"}},
		body:  r, size: -1, ctype: "application/x-tar",
	})
	if err != nil {
		return err
	}
	return drain(resp)
}

// TarDir returns a tar of the contents of the local directory dir, made as
// it is read (names relative to dir; symlinks as links, hard links as
// links, modes and extended attributes kept). It is what UploadDir sends;
// Close stops it.
func TarDir(dir string) io.ReadCloser { return tarDir(dir) }

// UploadDir copies the contents of the local directory localDir into the
// directory dir of the sandbox (made if missing, then it appears whole or
// not at all; into an existing one, file by file, each whole).
func (f *Files) UploadDir(ctx context.Context, localDir, dir string) error {
	fi, err := os.Stat(localDir)
	if err != nil {
		return err
	}
	if !fi.IsDir() {
		return api.Errorf(api.ErrInvalid, "upload %s: not a directory", localDir)
	}
	r := tarDir(localDir)
	defer r.Close() // stops the tar writer if the upload ended early
	return f.WriteTar(ctx, dir, r)
}

// DownloadDir copies the contents of the directory dir of the sandbox into
// the local directory localDir: made if missing (then it appears whole, or
// not at all, with the sandbox directory's mode within the umask); into an
// existing one entry by entry, and that folder keeps its mode. What comes
// from the sandbox is taken as hostile: no entry lands outside localDir or
// through a symlink, devices and fifos are skipped, files get permission
// bits only, within the umask.
func (f *Files) DownloadDir(ctx context.Context, dir, localDir string) error {
	fi, err := f.Stat(ctx, dir)
	if err != nil {
		return err
	}
	if !fi.IsDir {
		return api.Errorf(api.ErrInvalid, "download %s from %s: not a directory", dir, f.sb.id)
	}
	r, err := f.ReadTar(ctx, dir)
	if err != nil {
		return err
	}
	defer r.Close()
	return extractInto(r, localDir)
}

// Upload copies the local file local to path in the sandbox, with its
// permission bits, and returns how many bytes it sent.
func (f *Files) Upload(ctx context.Context, local, path string) (int64, error) {
	fh, err := os.Open(local)
	if err != nil {
		return 0, err
	}
	defer fh.Close()
	fi, err := fh.Stat()
	if err != nil {
		return 0, err
	}
	if !fi.Mode().IsRegular() {
		return 0, api.Errorf(api.ErrInvalid, "upload %s: not a regular file", local)
	}
	return fi.Size(), f.Write(ctx, path, fh, fi.Size(), WithMode(fi.Mode().Perm()))
}

// Download copies the file at path in the sandbox to the local file local
// (replaced whole once every byte has arrived, or left as it was) and
// returns how many bytes it wrote. The local file gets the sandbox file's
// permission bits within the umask; for a symlink, those of its target, or
// 0644 when they cannot be had.
func (f *Files) Download(ctx context.Context, path, local string) (int64, error) {
	fi, err := f.Stat(ctx, path)
	if err != nil {
		return 0, err
	}
	if fi.IsDir {
		return 0, api.Errorf(api.ErrInvalid, "download %s from %s: a directory (see DownloadDir)", path, f.sb.id)
	}
	perm := f.modeOf(ctx, path, fi)
	r, err := f.Open(ctx, path)
	if err != nil {
		return 0, err
	}
	defer r.Close()
	return writeFileAtomic(local, r, perm)
}

// modeOf is the permission bits a download of fi gets: its own, or, for
// a symlink, its target's (followed once), else 0644.
func (f *Files) modeOf(ctx context.Context, p string, fi *api.FileInfo) fs.FileMode {
	if fi.Link != "" {
		target, at := fi.Link, fi.Path
		if at == "" {
			at = p
		}
		if !path.IsAbs(target) {
			target = path.Join(path.Dir(at), target)
		}
		tfi, err := f.Stat(ctx, target)
		if err != nil || tfi.Link != "" || tfi.IsDir {
			return 0o644
		}
		fi = tfi
	}
	if m, ok := parseMode(fi.Mode); ok {
		return m
	}
	return 0o644
}

// drain reads what is left of a short answer so the connection can be reused.
func drain(resp *http.Response) error {
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, maxErrorBody))
	return nil
}
