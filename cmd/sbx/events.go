package main

import (
	"context"
	"fmt"
	"time"

	"github.com/spf13/cobra"

	"sbx.dev/sbx/api"
	"sbx.dev/sbx/client"
)

func newEventsCmd(e *env) *cobra.Command {
	var (
		follow bool
		after  int64
	)
	cmd := &cobra.Command{
		Use:               "events [flags] ID",
		Short:             "print a sandbox's lifecycle events",
		Args:              exactArgs(1, "one sandbox id"),
		ValidArgsFunction: completeSandboxes(e),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := e.client()
			if err != nil {
				return err
			}
			var opts []client.EventsOption
			if follow {
				opts = append(opts, client.Follow())
			}
			if after > 0 {
				opts = append(opts, client.After(after))
			}
			err = c.Sandbox(args[0]).Events(e.ctx, func(ev api.Event) error {
				if e.json {
					return e.printJSONLine(ev)
				}
				_, err := fmt.Fprintln(e.stdout, eventLine(ev))
				return err
			}, opts...)
			if err == nil && e.ctx.Err() != nil {
				// a follow ends without error when its context does; a
				// signal ended it here, and sbx exits 128+N for that
				return context.Cause(e.ctx)
			}
			return err
		},
	}
	cmd.Flags().BoolVarP(&follow, "follow", "f", false, "keep printing live events (Ctrl-C ends it)")
	cmd.Flags().Int64Var(&after, "after", 0, "only the events after this sequence number (the seq of --json), to pick a follow up again")
	return cmd
}

// eventLine writes an event for people: "TIME TYPE key=value ...", the
// detail sorted by key.
func eventLine(ev api.Event) string { return ev.Line(time.Local, safe) }
