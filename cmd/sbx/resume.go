package main

import (
	"fmt"

	"github.com/spf13/cobra"

	"sbx.dev/sbx/client"
)

func newResumeCmd(e *env) *cobra.Command {
	var requireMemory bool
	cmd := &cobra.Command{
		Use:               "resume [flags] ID",
		SuggestFor:        []string{"start", "unpause", "restore"},
		Short:             "bring a stopped sandbox back, with its memory if it can be had",
		Args:              exactArgs(1, "one sandbox id"),
		ValidArgsFunction: completeSandboxes(e),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := e.client()
			if err != nil {
				return err
			}
			var opts []client.ResumeOption
			if requireMemory {
				opts = append(opts, client.RequireMemory())
			}
			if !e.json {
				// through a fleet, a resume that requires its memory
				// waits for a node where it restores, and says why
				opts = append(opts, client.OnWait(func(why string) {
					fmt.Fprintf(e.stderr, "sbx: resume %s: %s\n", safe(args[0]), safe(why))
				}))
			}
			sb, err := c.Sandbox(args[0]).Resume(e.ctx, opts...)
			if err != nil {
				return err
			}
			if e.json {
				return e.printJSON(sb)
			}
			_, err = fmt.Fprintln(e.stdout, resumed(sb.ID, sb.MemoryRestored, sb.ResumeReason))
			return err
		},
	}
	cmd.Flags().BoolVar(&requireMemory, "require-memory", false, "fail, keeping the image, rather than boot from the disk")
	return cmd
}

// resumed says how a sandbox came back: with its memory, or from its disk and why.
func resumed(id string, memory bool, reason string) string {
	if memory {
		return fmt.Sprintf("resumed %s (memory restored)", id)
	}
	if reason == "" {
		return fmt.Sprintf("resumed %s from its disk", id)
	}
	return fmt.Sprintf("resumed %s from its disk: %s", id, reason)
}
