package main

import (
	"errors"
	"fmt"

	"sbx.dev/sbx/api"
)

var forkCommand = &command{
	name:    "fork",
	usage:   "fork ID [--name N] [--memory] [--count N] [--ttl D] [--wait]",
	summary: "make new sandboxes from a sandbox, now; print their ids",
	run:     runFork,
}

// errForked ends a fork's stream once its ids are printed (without --wait);
// the fork goes on on the server.
var errForked = errors.New("forked")

// forkLine is one JSON line of `sbx fork --json`: one per child, so a script
// reads ids as they come.
type forkLine struct {
	Event   string       `json:"event"`
	ID      string       `json:"id"`
	Sandbox *api.Sandbox `json:"sandbox,omitempty"`
}

func runFork(e *env, args []string) error {
	fs := e.flags("fork")
	name := fs.String("name", "", "name of the child (with --count 1)")
	memory := fs.Bool("memory", false, "carry on the parent's processes and memory, not only its disk")
	count := fs.Int("count", 0, fmt.Sprintf("how many children, 1 to %d", api.MaxForks))
	ttl := fs.String("ttl", "", "idle ttl of the children, e.g. 30m")
	wait := fs.Bool("wait", false, "wait until every child is ready")
	pos, err := parseFlags(fs, args)
	if err != nil {
		return err
	}
	if len(pos) != 1 {
		return usagef("fork takes one sandbox id")
	}
	if *count < 0 {
		return usagef("--count %d: want 1 to %d", *count, api.MaxForks)
	}
	c, err := e.client()
	if err != nil {
		return err
	}
	// --count above the limit goes to the server as it is: it names the limit,
	// and a fork is never silently split or cut short
	req := api.ForkRequest{Name: *name, Memory: *memory, Count: *count, TTL: *ttl}
	err = c.ForkEvents(e.ctx, pos[0], req, func(ev api.ForkEvent) error {
		switch ev.Event {
		case "sandbox.forking":
			for _, id := range ev.IDs {
				if err := e.forkPrint(forkLine{Event: ev.Event, ID: id}); err != nil {
					return err
				}
			}
			if !*wait {
				return errForked
			}
		case "sandbox.ready":
			if ev.Sandbox == nil {
				return nil
			}
			return e.forkPrint(forkLine{Event: ev.Event, ID: ev.Sandbox.ID, Sandbox: ev.Sandbox})
		}
		return nil
	})
	if errors.Is(err, errForked) {
		return nil
	}
	return err
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
