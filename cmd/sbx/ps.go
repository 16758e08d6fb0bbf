package main

import (
	"fmt"
	"strings"
	"time"
)

var psCommand = &command{
	name:    "ps",
	usage:   "ps ID",
	summary: "list a sandbox's execs",
	run:     runPs,
}

func runPs(e *env, args []string) error {
	pos, err := parseFlags(e.flags("ps"), args)
	if err != nil {
		return err
	}
	if len(pos) != 1 {
		return usagef("ps takes one sandbox id")
	}
	c, err := e.client()
	if err != nil {
		return err
	}
	xs, err := c.Execs(e.ctx, pos[0])
	if err != nil {
		return err
	}
	if e.json {
		return e.printJSON(xs)
	}
	now := time.Now()
	tw := e.table()
	fmt.Fprintln(tw, "EXEC\tSTATE\tEXIT\tPID\tSTARTED\tCMD")
	for _, x := range xs {
		exit := "-"
		if x.ExitCode != nil {
			exit = fmt.Sprint(*x.ExitCode)
		}
		if x.TimedOut {
			exit += " (timeout)"
		}
		pid := "-"
		if x.Pid != 0 {
			pid = fmt.Sprint(x.Pid)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s ago\t%s\n", x.ID, x.State, exit, pid, age(now, x.StartedAt), strings.Join(x.Cmd, " "))
	}
	return tw.Flush()
}
