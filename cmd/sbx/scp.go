package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/spf13/cobra"

	"sbx.dev/sbx/api"
	"sbx.dev/sbx/client"
)

// scpResult is what --json prints for a copy.
type scpResult struct {
	Source string `json:"source"`
	Target string `json:"target"`
	Bytes  int64  `json:"bytes,omitempty"`
}

func newScpCmd(e *env) *cobra.Command {
	var recursive bool
	cmd := &cobra.Command{
		Use:        "scp [flags] SRC DST",
		SuggestFor: []string{"cp"},
		Short:      "copy files between here and a sandbox",
		Long: "scp copies a file (or with -r a directory) into a sandbox or out of one: one of SRC\n" +
			"and DST is ID:PATH. A path in the sandbox is absolute, or starts at a home directory:\n" +
			"ID:~/file is in the home of the sandbox's user, ID:~name/file in name's. Write a\n" +
			"local path that has a ':' as ./a:b.",
		Example: "  sbx scp ./src web:/srv -r\n  sbx scp web:/srv/report.xml .\n  sbx scp notes.txt web:~/",
		Args:    exactArgs(2, "SRC and DST"),
	}
	cmd.Flags().BoolVarP(&recursive, "recursive", "r", false, "copy directories")
	cmd.RunE = func(cmd *cobra.Command, args []string) error {
		src, dst, err := classifyScp(args[0], args[1])
		if err != nil {
			return err
		}
		c, err := e.client()
		if err != nil {
			return err
		}
		var res *scpResult
		if dst.id != "" {
			res, err = upload(e.ctx, c, src.path, dst, recursive)
		} else {
			res, err = download(e.ctx, c, src, dst.path, recursive)
		}
		if err != nil || !e.json {
			return err
		}
		return e.printJSON(res)
	}
	return cmd
}

// scpPath is one side of a copy: a local path, or a path in sandbox id.
type scpPath struct {
	id, path string
}

// parseScpPath reads "ID:/path" as remote (an id has no '/'), anything else as local.
func parseScpPath(s string) scpPath {
	id, p, ok := strings.Cut(s, ":")
	if !ok || id == "" || strings.Contains(id, "/") {
		return scpPath{path: s}
	}
	return scpPath{id: id, path: p}
}

// classifyScp parses SRC and DST; exactly one must be remote.
func classifyScp(src, dst string) (scpPath, scpPath, error) {
	s, d := parseScpPath(src), parseScpPath(dst)
	switch {
	case s.id == "" && d.id == "":
		return s, d, usagef("one of SRC and DST must be ID:/path")
	case s.id != "" && d.id != "":
		return s, d, usagef("copying from one sandbox to another is not supported; copy through here")
	case s.id != "" && s.path == "", d.id != "" && d.path == "":
		return s, d, usagef("the path in the sandbox is empty; write ID:/path")
	case s.path == "" || d.path == "":
		return s, d, usagef("the local path is empty")
	}
	return s, d, nil
}

func upload(ctx context.Context, c *client.Client, src string, dst scpPath, recursive bool) (*scpResult, error) {
	fi, err := os.Stat(src)
	if err != nil {
		return nil, err
	}
	if fi.IsDir() && !recursive {
		return nil, usagef("%s is a directory; use -r", src)
	}
	abs, err := filepath.Abs(src)
	if err != nil {
		return nil, err
	}
	target := dst.path
	rfi, err := c.Stat(ctx, dst.id, dst.path)
	switch {
	case err == nil && rfi.IsDir && filepath.Base(src) == ".":
		// as cp -r: DIR/. (or .) into an existing directory copies what is in it
	case err == nil && rfi.IsDir:
		target = path.Join(dst.path, filepath.Base(abs))
	case err != nil && !errors.Is(err, api.ErrNotFound):
		return nil, err
	}
	res := &scpResult{Source: src, Target: dst.id + ":" + target}
	if fi.IsDir() {
		r := tarDir(src)
		defer r.Close() // stops the tar writer if the upload ended early
		return res, c.WriteTar(ctx, dst.id, target, r)
	}
	f, err := os.Open(src)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	res.Bytes = fi.Size()
	return res, c.WriteFile(ctx, dst.id, target, f, fi.Size(), fi.Mode())
}

func download(ctx context.Context, c *client.Client, src scpPath, dst string, recursive bool) (*scpResult, error) {
	rfi, err := c.Stat(ctx, src.id, src.path)
	if err != nil {
		return nil, err
	}
	if rfi.IsDir && !recursive {
		return nil, usagef("%s:%s is a directory; use -r", src.id, src.path)
	}
	target := dst
	if fi, err := os.Stat(dst); err == nil && fi.IsDir() {
		target = filepath.Join(dst, path.Base(src.path))
	}
	res := &scpResult{Source: src.id + ":" + src.path, Target: target}
	if rfi.IsDir {
		r, err := c.ReadTar(ctx, src.id, src.path)
		if err != nil {
			return nil, err
		}
		defer r.Close()
		return res, extractInto(r, target)
	}
	r, err := c.ReadFile(ctx, src.id, src.path)
	if err != nil {
		return nil, err
	}
	defer r.Close()
	perm, ok := parseMode(rfi.Mode)
	if !ok {
		perm = 0o644
	}
	res.Bytes, err = writeFileAtomic(target, r, perm)
	return res, err
}

// writeFileAtomic writes r to a temporary file next to target and renames it
// into place once all of r is read: a failed read leaves no file behind.
func writeFileAtomic(target string, r io.Reader, perm fs.FileMode) (int64, error) {
	f, err := os.CreateTemp(filepath.Dir(target), "."+filepath.Base(target)+".sbx-*")
	if err != nil {
		return 0, err
	}
	n, err := io.Copy(f, r)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Chmod(f.Name(), perm)
	}
	if err == nil {
		err = os.Rename(f.Name(), target)
	}
	if err != nil {
		os.Remove(f.Name())
		return 0, fmt.Errorf("copy to %s: %w", target, err)
	}
	return n, nil
}

// extractInto extracts a tar whose entries start with one base name into the
// directory target as cp -r does: into it when it exists, else into a
// temporary directory renamed to target once the tar is whole.
func extractInto(r io.Reader, target string) error {
	if fi, err := os.Lstat(target); err == nil {
		if !fi.IsDir() {
			return fmt.Errorf("cannot copy a directory onto the file %s", target)
		}
		return extractTar(r, target)
	}
	tmp, err := os.MkdirTemp(filepath.Dir(target), "."+filepath.Base(target)+".sbx-*")
	if err != nil {
		return err
	}
	if err := extractTar(r, tmp); err != nil {
		os.RemoveAll(tmp)
		return fmt.Errorf("copy to %s: %w", target, err)
	}
	if err := os.Rename(tmp, target); err != nil {
		os.RemoveAll(tmp)
		return err
	}
	return nil
}

// parseMode reads a FileInfo mode, octal ("0644", "100755") or as ls shows it
// ("-rwxr-xr-x"), and returns its permission bits.
func parseMode(s string) (fs.FileMode, bool) {
	if n, err := strconv.ParseUint(s, 8, 32); err == nil {
		return fs.FileMode(n).Perm(), true
	}
	if len(s) < 9 {
		return 0, false
	}
	rwx := s[len(s)-9:]
	var m fs.FileMode
	for i, ch := range rwx {
		want := "rwxrwxrwx"[i]
		switch {
		case byte(ch) == want, want == 'x' && (ch == 's' || ch == 't'):
			m |= 1 << (8 - i)
		case ch == '-', want == 'x' && (ch == 'S' || ch == 'T'):
		default:
			return 0, false
		}
	}
	return m, true
}
