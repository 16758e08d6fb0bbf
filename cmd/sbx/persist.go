package main

import (
	"fmt"
	"time"

	"github.com/spf13/cobra"
)

func newPersistCmd(e *env) *cobra.Command {
	var off bool
	cmd := &cobra.Command{
		Use:               "persist [flags] ID",
		Short:             "exempt a sandbox from the idle reaper (--off: no longer)",
		Args:              exactArgs(1, "one sandbox id"),
		ValidArgsFunction: completeSandboxes(e),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := e.client()
			if err != nil {
				return err
			}
			sb, err := c.Sandbox(args[0]).SetPersistent(e.ctx, !off)
			if err != nil {
				return err
			}
			if e.json {
				return e.printJSON(sb)
			}
			state := "persistent"
			if !sb.Persistent {
				state = "not persistent"
			}
			_, err = fmt.Fprintf(e.stdout, "%s: %s; %s\n", sb.ID, state, reapLine(sb.ReapAt, sb.ReapReason))
			return err
		},
	}
	cmd.Flags().BoolVar(&off, "off", false, "make the sandbox subject to the idle reaper again")
	return cmd
}

// reapLine says when the reaper will act, and why (or why not).
func reapLine(at *time.Time, reason string) string {
	if at == nil {
		return "never reaped (" + reason + ")"
	}
	return fmt.Sprintf("reaped at %s (%s)", at.Local().Format(time.RFC3339), reason)
}
