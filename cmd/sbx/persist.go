package main

import (
	"fmt"
	"time"
)

var persistCommand = &command{
	name:    "persist",
	usage:   "persist ID [--off]",
	summary: "exempt a sandbox from the idle reaper (--off: no longer)",
	run:     runPersist,
}

func runPersist(e *env, args []string) error {
	fs := e.flags("persist")
	off := fs.Bool("off", false, "make the sandbox subject to the idle reaper again")
	pos, err := parseFlags(fs, args)
	if err != nil {
		return err
	}
	if len(pos) != 1 {
		return usagef("persist takes one sandbox id")
	}
	c, err := e.client()
	if err != nil {
		return err
	}
	sb, err := c.SetPersistent(e.ctx, pos[0], !*off)
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
}

// reapLine says when the reaper will act, and why (or why not).
func reapLine(at *time.Time, reason string) string {
	if at == nil {
		return "never reaped (" + reason + ")"
	}
	return fmt.Sprintf("reaped at %s (%s)", at.Local().Format(time.RFC3339), reason)
}
