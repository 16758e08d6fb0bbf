package main

import (
	"fmt"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"sbx.dev/sbx/api"
	"sbx.dev/sbx/client"
	"sbx.dev/sbx/client/image"
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
	var (
		force, importForce bool
		packages           []string
		platform           string
	)
	build := &cobra.Command{
		Use:   "build [flags] NAME",
		Short: "build a template that ships with sbx (base, tiny), or base plus Debian packages; cached",
		Example: "  sbx template build base\n" +
			"  sbx template build ci --packages jq,postgresql-client   # base plus these packages",
		Args: exactArgs(1, "a template name"),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := e.client()
			if err != nil {
				return err
			}
			p := e.progress()
			opts := []client.TemplateOption{client.WithProgress(p.event)}
			if len(packages) > 0 {
				opts = append(opts, client.WithPackages(packages...))
			}
			if force {
				opts = append(opts, client.WithForce())
			}
			t, err := c.BuildTemplate(e.ctx, args[0], opts...)
			return p.finish(t, err, "built")
		},
	}
	build.Flags().BoolVar(&force, "force", false, "build a new version even if the template exists (sandboxes on the old one keep it)")
	build.Flags().StringSliceVar(&packages, "packages", nil, "Debian packages to add to base, comma-separated")
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
			fmt.Fprintln(tw, "NAME\tVERSION\tSIZE\tSOURCE\tAGE")
			for _, t := range ts {
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", t.Name, shortVersion(t.Version), size(t.Size), orDash(t.Source), age(now, t.CreatedAt))
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
			t, err := c.RemoveTemplate(e.ctx, args[0])
			if err != nil {
				return err
			}
			if e.json {
				return e.printJSON(map[string]any{"template": t})
			}
			if len(t.HeldBy) == 0 {
				_, err = fmt.Fprintf(e.stdout, "template %s removed; nothing holds its version %s, whose files go\n", t.Name, shortVersion(t.Version))
				return err
			}
			_, err = fmt.Fprintf(e.stdout, "template %s removed; its version %s stays for: %s\n", t.Name, shortVersion(t.Version), strings.Join(t.HeldBy, ", "))
			return err
		},
	})
	imp := &cobra.Command{
		Use:   "import [flags] NAME IMAGE",
		Short: "make a template from a container image, or from a root filesystem",
		Long: `IMAGE is any of:
  an OCI image layout directory, an OCI archive, a docker-save archive
  (gzipped or not; - for stdin), a registry reference (registry/repo:tag or
  @sha256:..., pulled with the credentials of ~/.docker/config.json), or a
  root filesystem: a directory or a tar. The forms oci:PATH, oci-archive:PATH,
  docker-archive:PATH and docker://REF say which explicitly. Only the layers
  sbxd does not have are sent; importing the same image again is instant.`,
		Example: "  sbx template import ci ./image.tar          # docker save myimage > image.tar\n" +
			"  sbx template import ci registry.local:5000/ci:latest\n" +
			"  sbx template import rootfs ./rootfs-dir",
		Args: exactArgs(2, "a template name and an image"),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := e.client()
			if err != nil {
				return err
			}
			p := e.progress()
			opts := []image.Option{image.WithProgress(p.event), image.WithStdin(e.stdin), image.WithPlatform(platform)}
			if importForce {
				opts = append(opts, image.WithForce())
			}
			t, err := image.Import(e.ctx, c, args[0], args[1], opts...)
			return p.finish(t, err, "imported")
		},
	}
	imp.Flags().BoolVar(&importForce, "force", false, "point an existing name at the new version (sandboxes on the old one keep it)")
	imp.Flags().StringVar(&platform, "platform", "", "the platform to take from a multi-platform image, os/arch (default: this host's)")
	cmd.AddCommand(imp)
	return cmd
}

// shortVersion is a version as a table shows it.
func shortVersion(v string) string {
	if len(v) > 19 {
		return v[:19]
	}
	return orDash(v)
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
