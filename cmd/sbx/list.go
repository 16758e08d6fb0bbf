package main

import (
	"fmt"
	"slices"
	"time"

	"github.com/spf13/cobra"

	"sbx.dev/sbx/api"
)

// listJSON is what `sbx --json list` prints.
type listJSON struct {
	Sandboxes []api.Sandbox `json:"sandboxes"`
}

func newListCmd(e *env) *cobra.Command {
	var quiet bool
	cmd := &cobra.Command{
		Use:     "list [flags]",
		Aliases: []string{"ls"},
		Short:   "list sandboxes",
		Args:    exactArgs(0, "no arguments"),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := e.client()
			if err != nil {
				return err
			}
			sbs, err := c.List(e.ctx)
			if err != nil {
				return err
			}
			if e.json {
				if sbs == nil {
					sbs = []api.Sandbox{}
				}
				return e.printJSON(listJSON{sbs})
			}
			if quiet {
				for _, sb := range sbs {
					fmt.Fprintln(e.stdout, sb.ID)
				}
				return nil
			}
			now := time.Now()
			tw := e.table()
			// in a fleet, the node of each (a single sbxd names none)
			fleet := slices.ContainsFunc(sbs, func(sb api.Sandbox) bool { return sb.Node != "" })
			head := "ID\tNAME\tTEMPLATE\tSTATE\tAGE"
			if fleet {
				head += "\tNODE"
			}
			fmt.Fprintln(tw, head)
			for _, sb := range sbs {
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s", safe(sb.ID), safe(orDash(sb.Name)), safe(orDash(sb.Template)), safe(string(sb.State)), age(now, sb.CreatedAt))
				if fleet {
					fmt.Fprintf(tw, "\t%s", safe(orDash(sb.Node)))
				}
				fmt.Fprintln(tw)
			}
			return tw.Flush()
		},
	}
	cmd.Flags().BoolVarP(&quiet, "quiet", "q", false, "print only the ids")
	return cmd
}
