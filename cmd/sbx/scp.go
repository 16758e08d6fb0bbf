package main

import (
	"context"
	"errors"
	"os"
	"path"
	"path/filepath"
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
	files := c.Sandbox(dst.id).Files()
	target := dst.path
	rfi, err := files.Stat(ctx, dst.path)
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
		return res, files.UploadDir(ctx, src, target)
	}
	res.Bytes, err = files.Upload(ctx, src, target)
	return res, err
}

// download copies a file or (recursive) a directory out of a sandbox, as
// cp does: into DST when it is an existing folder, else to DST. What the
// sandbox sends is extracted as the client's DownloadDir does: nothing
// lands outside the target or through a symlink, an existing folder keeps
// its mode, new files and folders get the umask, a symlink its target's
// mode (or 0644).
func download(ctx context.Context, c *client.Client, src scpPath, dst string, recursive bool) (*scpResult, error) {
	files := c.Sandbox(src.id).Files()
	rfi, err := files.Stat(ctx, src.path)
	if err != nil {
		return nil, err
	}
	if rfi.IsDir && !recursive {
		return nil, usagef("%s:%s is a directory; use -r", src.id, src.path)
	}
	target := dst
	if fi, err := os.Stat(dst); err == nil && fi.IsDir() {
		base := path.Base(src.path)
		if rfi.Path != "" {
			base = path.Base(rfi.Path) // ~ resolved
		}
		target = filepath.Join(dst, base)
	}
	res := &scpResult{Source: src.id + ":" + src.path, Target: target}
	if rfi.IsDir {
		return res, files.DownloadDir(ctx, src.path, target)
	}
	res.Bytes, err = files.Download(ctx, src.path, target)
	return res, err
}
