package main

import (
	"fmt"

	"github.com/spf13/cobra"

	"sbx.dev/sbx/client"
)

func newStopCmd(e *env) *cobra.Command {
	var wait bool
	cmd := &cobra.Command{
		Use:               "stop [flags] ID",
		SuggestFor:        []string{"pause", "hibernate"},
		Short:             "hibernate a sandbox, keeping its memory and processes",
		Args:              exactArgs(1, "one sandbox id"),
		ValidArgsFunction: completeSandboxes(e),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := e.client()
			if err != nil {
				return err
			}
			var opts []client.StopOption
			if !wait {
				opts = append(opts, client.NoWait())
			}
			sb, err := c.Sandbox(args[0]).Stop(e.ctx, opts...)
			if err != nil {
				return err
			}
			if e.json {
				return e.printJSON(sb)
			}
			did := "stopping"
			if wait {
				did = "stopped"
			}
			_, err = fmt.Fprintf(e.stdout, "%s %s\n", did, orDash(sb.ID))
			return err
		},
	}
	cmd.Flags().BoolVar(&wait, "wait", false, "return once the sandbox is stopped")
	return cmd
}
