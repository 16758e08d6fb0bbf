package main

import (
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"sbx.dev/sbx/api"
)

// templatesJSON is what `sbx --json template ls` prints.
type templatesJSON struct {
	Templates []api.Template `json:"templates"`
}

func newTemplateCmd(e *env) *cobra.Command {
	cmd := &cobra.Command{
		Use:        "template COMMAND",
		SuggestFor: []string{"images", "image", "templates"},
		Short:      "build, import, list and remove templates",
		Args:       subcommandArgs,
		RunE:       func(cmd *cobra.Command, args []string) error { return subcommandArgs(cmd, args) },
	}
	var force bool
	build := &cobra.Command{
		Use:   "build [flags] NAME",
		Short: "build a template that ships with sbx (base, tiny); cached",
		Args:  exactArgs(1, "a template name"),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := e.client()
			if err != nil {
				return err
			}
			p := e.progress()
			t, err := c.BuildTemplate(e.ctx, args[0], force, p.event)
			return p.finish(t, err, "built")
		},
	}
	build.Flags().BoolVar(&force, "force", false, "build again even if the template exists")
	cmd.AddCommand(build, &cobra.Command{
		Use:     "ls [flags]",
		Aliases: []string{"list"},
		Short:   "list templates",
		Args:    exactArgs(0, "no arguments"),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := e.client()
			if err != nil {
				return err
			}
			ts, err := c.Templates(e.ctx)
			if err != nil {
				return err
			}
			if e.json {
				if ts == nil {
					ts = []api.Template{}
				}
				return e.printJSON(templatesJSON{ts})
			}
			now := time.Now()
			tw := e.table()
			fmt.Fprintln(tw, "NAME\tSIZE\tSOURCE\tAGE")
			for _, t := range ts {
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", t.Name, size(t.Size), orDash(t.Source), age(now, t.CreatedAt))
			}
			return tw.Flush()
		},
	}, &cobra.Command{
		Use:   "rm [flags] NAME",
		Short: "remove a template (sandboxes made on it keep their version)",
		Args:  exactArgs(1, "a template name"),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := e.client()
			if err != nil {
				return err
			}
			if err := c.RemoveTemplate(e.ctx, args[0]); err != nil {
				return err
			}
			if e.json {
				return e.printJSON(map[string]string{"name": args[0]})
			}
			return nil
		},
	}, &cobra.Command{
		Use:   "import [flags] NAME PATH",
		Short: "make a template from a root filesystem: a directory, a tar (or .tar.gz), or - for stdin",
		Args:  exactArgs(2, "a template name and a path"),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := e.client()
			if err != nil {
				return err
			}
			r, err := openImport(args[1], e.stdin)
			if err != nil {
				return err
			}
			defer r.Close()
			p := e.progress()
			t, err := c.ImportTemplate(e.ctx, args[0], r, p.event)
			return p.finish(t, err, "imported")
		},
	})
	return cmd
}

// openImport returns what to upload for PATH: a tar made on the fly of a
// directory, a file as it is (the server detects gzip), or stdin for "-".
func openImport(p string, stdin io.Reader) (io.ReadCloser, error) {
	if p == "-" {
		return io.NopCloser(stdin), nil
	}
	fi, err := os.Stat(p)
	if err != nil {
		return nil, err
	}
	if fi.IsDir() {
		return tarDir(p), nil
	}
	return os.Open(p)
}

// progressPrinter shows template progress: JSON lines with --json, one
// updating line on a terminal, nothing but the last line otherwise.
type progressPrinter struct {
	e    *env
	tty  bool
	last string
}

func (e *env) progress() *progressPrinter {
	return &progressPrinter{e: e, tty: isTerminal(e.stderr)}
}

func (p *progressPrinter) event(ev api.Progress) {
	switch {
	case p.e.json:
		p.e.printJSONLine(ev)
	case p.tty && ev.Message != "":
		// One updating line: a message wider than the terminal would wrap,
		// and \r could then not take it back.
		msg := strings.TrimSpace(ev.Message)
		if w := termWidth(p.e.stderr); w > 10 && len(msg) >= w {
			msg = msg[:w-4] + "..."
		}
		fmt.Fprintf(p.e.stderr, "\r\033[K%s", msg)
		p.last = msg
	}
}

func (p *progressPrinter) finish(t *api.Template, err error, did string) error {
	if p.tty && p.last != "" && !p.e.json {
		fmt.Fprint(p.e.stderr, "\r\033[K")
	}
	if err != nil || p.e.json {
		return err
	}
	_, err = fmt.Fprintf(p.e.stdout, "template %s %s (%s)\n", t.Name, did, size(t.Size))
	return err
}
