package main

import (
	"fmt"

	"github.com/spf13/cobra"

	"sbx.dev/sbx/api"
)

// portsJSON is what `sbx --json ports` prints.
type portsJSON struct {
	Ports []api.Port `json:"ports"`
}

func newPortsCmd(e *env) *cobra.Command {
	return &cobra.Command{
		Use:               "ports [flags] ID",
		Short:             "list the TCP ports listening inside a sandbox",
		Args:              exactArgs(1, "one sandbox id"),
		ValidArgsFunction: completeSandboxes(e),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := e.client()
			if err != nil {
				return err
			}
			ps, err := c.Sandbox(args[0]).Ports(e.ctx)
			if err != nil {
				return err
			}
			if e.json {
				if ps == nil {
					ps = []api.Port{}
				}
				return e.printJSON(portsJSON{ps})
			}
			tw := e.table()
			fmt.Fprintln(tw, "PROTO\tADDRESS\tPORT\tPID\tCOMMAND")
			for _, p := range ps {
				pid := "-"
				if p.Pid != 0 {
					pid = fmt.Sprint(p.Pid)
				}
				// a process names itself: its command is quoted for the terminal
				fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%s\n", safe(p.Proto), safe(orDash(p.Address)), p.Port, pid, safe(orDash(p.Command)))
			}
			return tw.Flush()
		},
	}
}
