package main

import (
	"fmt"

	"github.com/spf13/cobra"

	"sbx.dev/sbx/api"
	"sbx.dev/sbx/client"
)

// forkLine is one JSON line of `sbx fork --json`: one per child, so a script
// reads ids as they come.
type forkLine struct {
	Event   string       `json:"event"`
	ID      string       `json:"id"`
	Sandbox *api.Sandbox `json:"sandbox,omitempty"`
}

func newForkCmd(e *env) *cobra.Command {
	var (
		name                  string
		memory, wait, monitor bool
		count                 int
	)
	cmd := &cobra.Command{
		Use:   "fork [flags] ID",
		Short: "make new sandboxes from a sandbox, now; print their ids",
		Long: "fork makes new sandboxes from a sandbox as it is now: on a copy of its disk, booting\n" +
			"fresh, or with --memory carrying on its processes and memory. It prints each new id at\n" +
			"once (with --json, a sandbox.forking line per child); --wait waits until each is ready.",
		Example:           "  sbx fork web --wait\n  sbx fork web --memory --count 16",
		Args:              exactArgs(1, "one sandbox id"),
		ValidArgsFunction: completeSandboxes(e),
	}
	fs := cmd.Flags()
	fs.StringVar(&name, "name", "", "name of the child (with --count 1)")
	fs.BoolVar(&memory, "memory", false, "carry on the parent's processes and memory, not only its disk")
	fs.IntVar(&count, "count", 1, fmt.Sprintf("how many children: 1 to %d per fork call; with --wait, more grow a tree from the children", api.MaxForks))
	ttl := durationVar(fs, "ttl", "idle ttl of the children, e.g. 30m; 0: none (default: the parent's)")
	fs.BoolVar(&wait, "wait", false, "wait until every child is ready")
	fs.BoolVar(&monitor, "monitor", false, "runtime monitoring in each child: a trace of its syscalls on files and sockets, execs and exits (sbx trace)")
	shape := shapeVars(fs) // the children's; not given: the parent's
	cmd.RunE = func(cmd *cobra.Command, args []string) error {
		// the client's rule: past api.MaxForks it grows a tree from the
		// children, which it must wait for; the flag is the field
		if err := api.CheckForkCount(count, wait); err != nil {
			if count < 1 {
				return usagef("--%s", err)
			}
			return fmt.Errorf("--%w (--wait)", err)
		}
		if name != "" && count > 1 {
			return usagef("--name names one child; with --count %d the children get ids only", count)
		}
		c, err := e.client()
		if err != nil {
			return err
		}
		opts := []client.ForkOption{client.WithCount(count), client.WithForkEvents(func(ev api.ForkEvent) error {
			switch ev.Event {
			case api.ForkForking:
				for _, id := range ev.IDs {
					if err := e.forkPrint(forkLine{Event: ev.Event, ID: id}); err != nil {
						return err
					}
				}
			case api.ForkReady:
				if ev.Sandbox == nil {
					return nil
				}
				return e.forkPrint(forkLine{Event: ev.Event, ID: ev.Sandbox.ID, Sandbox: ev.Sandbox})
			}
			return nil
		})}
		if name != "" {
			opts = append(opts, client.WithName(name))
		}
		if memory {
			opts = append(opts, client.WithMemory())
		}
		if o := shape.option(); o != nil {
			opts = append(opts, o)
		}
		if monitor {
			opts = append(opts, client.WithMonitoring())
		}
		if ttl.set {
			opts = append(opts, client.WithTTL(ttl.D()))
		}
		if !wait {
			// the ids are printed as sbxd names them; the fork goes on there
			opts = append(opts, client.NoWait())
		}
		_, err = c.Sandbox(args[0]).Fork(e.ctx, opts...)
		return err
	}
	return cmd
}

// forkPrint prints one child's event: a JSON line, or for people the new id
// alone and then "ready ID".
func (e *env) forkPrint(l forkLine) error {
	if e.json {
		return e.printJSONLine(l)
	}
	var err error
	if l.Event == "sandbox.ready" {
		_, err = fmt.Fprintf(e.stdout, "ready %s\n", l.ID)
	} else {
		_, err = fmt.Fprintln(e.stdout, l.ID)
	}
	return err
}
