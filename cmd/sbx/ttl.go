package main

import (
	"fmt"

	"github.com/spf13/cobra"
)

func newTTLCmd(e *env) *cobra.Command {
	return &cobra.Command{
		Use:               "ttl [flags] ID DURATION",
		Short:             "set a sandbox's idle ttl (0 turns the idle reaper off for it)",
		Example:           "  sbx ttl web 2h\n  sbx ttl web 3600     # seconds\n  sbx ttl web 0        # never reaped for being idle",
		Args:              exactArgs(2, "a sandbox id and a duration"),
		ValidArgsFunction: completeSandboxes(e),
		RunE: func(cmd *cobra.Command, args []string) error {
			d, err := parseDuration(args[1])
			if err != nil {
				return usagef("ttl: %s", err)
			}
			c, err := e.client()
			if err != nil {
				return err
			}
			sb, err := c.Sandbox(args[0]).SetTTL(e.ctx, d)
			if err != nil {
				return err
			}
			if e.json {
				return e.printJSON(sb)
			}
			_, err = fmt.Fprintf(e.stdout, "%s: ttl %s; %s\n", sb.ID, orDash(ttlText(sb.TTL)), reapLine(sb.ReapAt, sb.ReapReason))
			return err
		},
	}
}
