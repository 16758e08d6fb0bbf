package main

import (
	"fmt"
	"strconv"
	"time"

	"github.com/spf13/cobra"

	"sbx.dev/sbx/client"
)

func newPreviewCmd(e *env) *cobra.Command {
	var private bool
	cmd := &cobra.Command{
		Use:               "preview [flags] ID PORT",
		Short:             "print the URL that reaches a port inside a sandbox",
		Example:           "  sbx preview web 8080\n  sbx preview web 8080 --private --ttl 1h",
		Args:              exactArgs(2, "a sandbox id and a port"),
		ValidArgsFunction: completeSandboxes(e),
	}
	cmd.Flags().BoolVar(&private, "private", false, "require a signed, expiring token (carried by the URL)")
	ttl := durationVar(cmd.Flags(), "ttl", "how long a private URL's token is valid (default 1h)")
	cmd.RunE = func(cmd *cobra.Command, args []string) error {
		opts, err := previewOptions(args, private, ttl.d)
		if err != nil {
			return err
		}
		port, _ := strconv.Atoi(args[1])
		c, err := e.client()
		if err != nil {
			return err
		}
		p, err := c.Preview(e.ctx, args[0], port, opts...)
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
		return []client.PreviewOption{client.PrivatePreview(ttl)}, nil
	}
	return nil, nil
}
