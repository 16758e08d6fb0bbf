package main

import "fmt"

var stopCommand = &command{
	name:    "stop",
	usage:   "stop ID [--wait]",
	summary: "hibernate a sandbox, keeping its memory and processes",
	run:     runStop,
}

func runStop(e *env, args []string) error {
	fs := e.flags("stop")
	wait := fs.Bool("wait", false, "return once the sandbox is stopped")
	pos, err := parseFlags(fs, args)
	if err != nil {
		return err
	}
	if len(pos) != 1 {
		return usagef("stop takes one sandbox id")
	}
	c, err := e.client()
	if err != nil {
		return err
	}
	sb, err := c.Stop(e.ctx, pos[0], *wait)
	if err != nil {
		return err
	}
	if e.json {
		return e.printJSON(sb)
	}
	did := "stopping"
	if *wait {
		did = "stopped"
	}
	_, err = fmt.Fprintf(e.stdout, "%s %s\n", did, orDash(sb.ID))
	return err
}
