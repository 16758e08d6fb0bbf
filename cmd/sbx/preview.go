package main

import (
	"fmt"
	"strconv"
	"time"

	"github.com/spf13/cobra"

	"sbx.dev/sbx/api"
	"sbx.dev/sbx/client"
)

// previewsJSON is what `sbx --json preview ID` prints.
type previewsJSON struct {
	Previews []api.Preview `json:"previews"`
}

func newPreviewCmd(e *env) *cobra.Command {
	var private, off bool
	cmd := &cobra.Command{
		Use:   "preview [flags] ID [PORT]",
		Short: "publish a port inside a sandbox and print its URL; --off withdraws it; no port lists them",
		Long: `The preview proxy serves only the ports published this way: any other port
answers 404 (and counts as no activity). Publications last until --off or the
sandbox's deletion, across restarts, stops and resumes; forks do not inherit them.`,
		Example:           "  sbx preview web 8080\n  sbx preview web 8080 --private --ttl 1h\n  sbx preview web 8080 --off\n  sbx preview web",
		Args:              rangeArgs(1, 2, "a sandbox id and a port"),
		ValidArgsFunction: completeSandboxes(e),
	}
	cmd.Flags().BoolVar(&private, "private", false, "require a signed, expiring token (carried by the URL)")
	cmd.Flags().BoolVar(&off, "off", false, "withdraw the port: the proxy answers 404 for it from now on")
	ttl := durationVar(cmd.Flags(), "ttl", "how long a private URL's token is valid (default 1h)")
	cmd.RunE = func(cmd *cobra.Command, args []string) error {
		if len(args) == 1 {
			if off || private || ttl.Duration != 0 {
				return usagef("--off, --private and --ttl need a port")
			}
			c, err := e.client()
			if err != nil {
				return err
			}
			ps, err := c.Sandbox(args[0]).Previews(e.ctx)
			if err != nil {
				return err
			}
			if e.json {
				if ps == nil {
					ps = []api.Preview{}
				}
				return e.printJSON(previewsJSON{ps})
			}
			tw := e.table()
			fmt.Fprintln(tw, "PORT\tPRIVATE\tURL")
			for _, p := range ps {
				fmt.Fprintf(tw, "%d\t%v\t%s\n", p.Port, p.Private, p.URL)
			}
			return tw.Flush()
		}
		if off {
			if private || ttl.Duration != 0 {
				return usagef("--off withdraws a port: --private and --ttl do not go with it")
			}
			port, err := strconv.Atoi(args[1])
			if err != nil || port < 1 || port > 65535 {
				return usagef("port %q: want a TCP port, 1-65535", args[1])
			}
			c, err := e.client()
			if err != nil {
				return err
			}
			if err := c.Sandbox(args[0]).WithdrawPreview(e.ctx, port); err != nil {
				return err
			}
			if e.json {
				return e.printJSON(map[string]any{"port": port, "published": false})
			}
			return nil
		}
		opts, err := previewOptions(args, private, ttl.D())
		if err != nil {
			return err
		}
		port, _ := strconv.Atoi(args[1])
		c, err := e.client()
		if err != nil {
			return err
		}
		p, err := c.Sandbox(args[0]).Preview(e.ctx, port, opts...)
		if err != nil {
			return err
		}
		if e.json {
			return e.printJSON(p)
		}
		fmt.Fprintln(e.stdout, p.URL)
		if p.ExpiresAt != nil {
			fmt.Fprintf(e.stderr, "private: valid until %s\n", p.ExpiresAt.Local().Format(time.RFC3339))
		}
		return nil
	}
	return cmd
}

// previewOptions checks a preview's command line and returns its options.
func previewOptions(pos []string, private bool, ttl time.Duration) ([]client.PreviewOption, error) {
	if len(pos) != 2 {
		return nil, usagef("preview takes a sandbox id and a port")
	}
	if port, err := strconv.Atoi(pos[1]); err != nil || port < 1 || port > 65535 {
		return nil, usagef("port %q: want a TCP port, 1-65535", pos[1])
	}
	switch {
	case ttl < 0:
		return nil, usagef("--ttl %s: want a positive duration", ttl)
	case ttl > 0 && !private:
		return nil, usagef("--ttl is for --private previews only")
	case private:
		return []client.PreviewOption{client.Private(ttl)}, nil
	}
	return nil, nil
}
