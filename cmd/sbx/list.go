package main

import (
	"fmt"
	"time"
)

var listCommand = &command{
	name:    "list",
	aliases: []string{"ls"},
	usage:   "list",
	summary: "list sandboxes",
	run:     runList,
}

func runList(e *env, args []string) error {
	pos, err := parseFlags(e.flags("list"), args)
	if err != nil {
		return err
	}
	if len(pos) > 0 {
		return usagef("list takes no arguments")
	}
	c, err := e.client()
	if err != nil {
		return err
	}
	sbs, err := c.List(e.ctx)
	if err != nil {
		return err
	}
	if e.json {
		return e.printJSON(sbs)
	}
	now := time.Now()
	tw := e.table()
	fmt.Fprintln(tw, "ID\tNAME\tTEMPLATE\tSTATE\tAGE")
	for _, sb := range sbs {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", sb.ID, orDash(sb.Name), orDash(sb.Template), sb.State, age(now, sb.CreatedAt))
	}
	return tw.Flush()
}
