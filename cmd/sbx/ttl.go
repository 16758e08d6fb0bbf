package main

import "fmt"

var ttlCommand = &command{
	name:    "ttl",
	usage:   "ttl ID DURATION",
	summary: "set a sandbox's idle ttl (0 turns the idle reaper off for it)",
	run:     runTTL,
}

func runTTL(e *env, args []string) error {
	pos, err := parseFlags(e.flags("ttl"), args)
	if err != nil {
		return err
	}
	if len(pos) != 2 {
		return usagef("ttl takes a sandbox id and a duration")
	}
	c, err := e.client()
	if err != nil {
		return err
	}
	sb, err := c.SetTTLString(e.ctx, pos[0], pos[1])
	if err != nil {
		return err
	}
	if e.json {
		return e.printJSON(sb)
	}
	_, err = fmt.Fprintf(e.stdout, "%s: ttl %s; %s\n", sb.ID, orDash(sb.TTL), reapLine(sb.ReapAt, sb.ReapReason))
	return err
}
