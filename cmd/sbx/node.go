package main

import (
	"fmt"
	"strconv"
	"time"

	"github.com/spf13/cobra"

	"sbx.dev/sbx/api"
)

// nodesJSON is what `sbx --json node ls` prints.
type nodesJSON struct {
	Nodes []api.Node `json:"nodes"`
}

// newNodeCmd is `sbx node ls|cordon|uncordon`: the machines of a fleet,
// through its controller (--host at sbx-controller). A single sbxd has no
// nodes and says so.
func newNodeCmd(e *env) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "node ls|cordon|uncordon",
		Short: "the machines of a fleet: list them, cordon or uncordon one",
		Args:  exactArgs(0, "a verb: ls, cordon or uncordon"),
	}
	ls := &cobra.Command{
		Use:     "ls [flags]",
		Aliases: []string{"list"},
		Short:   "list the fleet's nodes: ready or not and why, cordoned, sandboxes held",
		Args:    exactArgs(0, "no arguments"),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := e.client()
			if err != nil {
				return err
			}
			ns, err := c.Nodes(e.ctx)
			if err != nil {
				return err
			}
			if e.json {
				if ns == nil {
					ns = []api.Node{}
				}
				return e.printJSON(nodesJSON{ns})
			}
			now := time.Now()
			tw := e.table()
			fmt.Fprintln(tw, "NAME\tREADY\tCORDONED\tSANDBOXES\tCPUS\tADDRESS\tRENEWED\tREASON")
			for _, n := range ns {
				renewed := "-"
				if n.Renewed != nil {
					renewed = age(now, *n.Renewed) + " ago"
				}
				fmt.Fprintf(tw, "%s\t%t\t%t\t%d\t%s\t%s\t%s\t%s\n", safe(n.Name), n.Ready, n.Cordoned, n.Sandboxes,
					orDash(strconv.Itoa(n.CPUs)), safe(orDash(n.Address)), renewed, safe(orDash(n.Reason)))
			}
			return tw.Flush()
		},
	}
	verb := func(name, short string, on bool) *cobra.Command {
		return &cobra.Command{
			Use:   name + " [flags] NODE",
			Short: short,
			Args:  exactArgs(1, "one node name (sbx node ls lists them)"),
			RunE: func(cmd *cobra.Command, args []string) error {
				c, err := e.client()
				if err != nil {
					return err
				}
				do := c.Uncordon
				if on {
					do = c.Cordon
				}
				n, err := do(e.ctx, args[0])
				if err != nil {
					return err
				}
				if e.json {
					return e.printJSON(n)
				}
				state := "uncordoned: sandboxes may be placed on it"
				if n.Cordoned {
					state = "cordoned: nothing new is placed on it; what it runs stays"
				}
				_, err = fmt.Fprintf(e.stdout, "%s: %s\n", n.Name, state)
				return err
			},
		}
	}
	cmd.AddCommand(ls,
		verb("cordon", "place nothing new on a node; what it runs stays", true),
		verb("uncordon", "place sandboxes on a node again", false))
	return cmd
}
