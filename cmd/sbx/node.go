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

// newNodeCmd is `sbx node ls|cordon|uncordon|drain`: the machines of a fleet,
// through its controller (--host at sbx-controller). A single sbxd has no
// nodes and says so.
func newNodeCmd(e *env) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "node ls|cordon|uncordon|drain",
		Short: "the machines of a fleet: list them, cordon, uncordon or drain one",
		Args:  exactArgs(0, "a verb: ls, cordon, uncordon or drain"),
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
	drain := &cobra.Command{
		Use:   "drain [flags] NODE",
		Short: "cordon a node and move its sandboxes to others, with their memory",
		Long: "drain cordons NODE, then moves each of its sandboxes to another node where its memory restores:\n" +
			"a ready one is stopped with its memory, moved through the fleet's registry and resumed there,\n" +
			"with its processes; a stopped one is moved and stays stopped. One that cannot move stays, and\n" +
			"the line says why; then the exit code is 1.",
		Args: exactArgs(1, "one node name (sbx node ls lists them)"),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := e.client()
			if err != nil {
				return err
			}
			if !e.json && isTerminal(e.stderr) {
				fmt.Fprintf(e.stderr, "draining %s: each sandbox is stopped with its memory, moved and resumed elsewhere...\n", safe(args[0]))
			}
			res, err := c.Drain(e.ctx, args[0])
			if err != nil {
				return err
			}
			failed := 0
			for _, m := range res.Moves {
				if m.Error != "" {
					failed++
				}
			}
			if e.json {
				if err := e.printJSON(res); err != nil {
					return err
				}
			} else {
				for _, m := range res.Moves {
					switch {
					case m.To == "":
						fmt.Fprintf(e.stdout, "%s: stayed on %s: %s\n", m.ID, safe(m.From), safe(m.Error))
					case m.Error != "":
						fmt.Fprintf(e.stdout, "%s: moved to %s, %s: %s\n", m.ID, safe(m.To), m.State, safe(m.Error))
					default:
						fmt.Fprintf(e.stdout, "%s: moved to %s, %s\n", m.ID, safe(m.To), m.State)
					}
				}
				fmt.Fprintf(e.stdout, "%s: cordoned; %d of %d sandboxes moved\n", safe(res.Node), len(res.Moves)-failed, len(res.Moves))
			}
			if failed > 0 {
				return &exitError{code: 1} // each failure is reported already
			}
			return nil
		},
	}
	cmd.AddCommand(ls,
		verb("cordon", "place nothing new on a node; what it runs stays", true),
		verb("uncordon", "place sandboxes on a node again", false),
		drain)
	return cmd
}
