package main

import (
	"fmt"
	"strings"

	"sbx.dev/sbx/client"
)

var newCommand = &command{
	name:    "new",
	usage:   "new [--template T | --from SNAPSHOT] [--name N] [--ttl D] [--meta k=v]... [--cpus N] [--memory SIZE]",
	summary: "create a sandbox and print its id",
	run:     runNew,
}

func runNew(e *env, args []string) error {
	fs := e.flags("new")
	template := fs.String("template", "", "template to boot from")
	from := fs.String("from", "", "snapshot to make the sandbox from (its template, cpus and memory come with it)")
	name := fs.String("name", "", "name of the sandbox")
	ttl := fs.String("ttl", "", "idle ttl, e.g. 30m")
	var meta listFlag
	fs.Var(&meta, "meta", "metadata k=v (repeatable)")
	cpus := fs.Float64("cpus", 0, "CPU limit")
	memory := fs.String("memory", "", "memory limit, e.g. 512M")
	pos, err := parseFlags(fs, args)
	if err != nil {
		return err
	}
	if len(pos) > 0 {
		return usagef("new takes no arguments, got %q", pos)
	}
	opts := []client.CreateOption{client.WithTemplate(*template), client.WithFrom(*from), client.WithName(*name),
		client.WithTTLString(*ttl), client.WithCPUs(*cpus), client.WithMemoryString(*memory)}
	for _, kv := range meta {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || k == "" {
			return usagef("--meta %q: want key=value", kv)
		}
		opts = append(opts, client.WithMeta(k, v))
	}
	c, err := e.client()
	if err != nil {
		return err
	}
	sb, err := c.Create(e.ctx, opts...)
	if err != nil {
		return err
	}
	if e.json {
		return e.printJSON(sb)
	}
	_, err = fmt.Fprintln(e.stdout, sb.ID)
	return err
}
