package main

import (
	"fmt"
)

var portsCommand = &command{
	name:    "ports",
	usage:   "ports ID",
	summary: "list the TCP ports listening inside a sandbox",
	run:     runPorts,
}

func runPorts(e *env, args []string) error {
	pos, err := parseFlags(e.flags("ports"), args)
	if err != nil {
		return err
	}
	if len(pos) != 1 {
		return usagef("ports takes one sandbox id")
	}
	c, err := e.client()
	if err != nil {
		return err
	}
	ps, err := c.Ports(e.ctx, pos[0])
	if err != nil {
		return err
	}
	if e.json {
		return e.printJSON(ps)
	}
	tw := e.table()
	fmt.Fprintln(tw, "PROTO\tADDRESS\tPORT\tPID\tCOMMAND")
	for _, p := range ps {
		pid := "-"
		if p.Pid != 0 {
			pid = fmt.Sprint(p.Pid)
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%s\n", p.Proto, orDash(p.Address), p.Port, pid, orDash(p.Command))
	}
	return tw.Flush()
}
