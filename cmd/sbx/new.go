package main

import (
	"fmt"
	"strings"

	"github.com/spf13/cobra"

	"sbx.dev/sbx/api"
	"sbx.dev/sbx/client"
)

func newNewCmd(e *env) *cobra.Command {
	var (
		template, from, name, network string
		meta                          []string
		cpus                          float64
		pids                          int
		monitor                       bool
	)
	cmd := &cobra.Command{
		Use:        "new [flags]",
		SuggestFor: []string{"run", "create", "start"},
		Short:      "create a sandbox and print its id",
		Example: "  sbx new --template base --name web --ttl 30m --memory 1G --cpus 1 --meta team=core\n" +
			"  sbx new --disk 20G --pids 1000 --network none\n" +
			"  sbx new --from before-upgrade      # from a snapshot (with memory: its processes carry on)",
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) > 0 {
				return usagef("new takes no arguments, got %q (flags are --template, --from, --name, ...)", args)
			}
			return nil
		},
	}
	fs := cmd.Flags()
	fs.StringVar(&template, "template", "", "the template to boot from (default: sbxd's --default-template)")
	fs.StringVar(&from, "from", "", "the snapshot to make the sandbox from; its template, cpus and memory come with it")
	fs.StringVar(&name, "name", "", "a name, usable wherever the id is")
	ttl := durationVar(fs, "ttl", "idle ttl: delete the sandbox once it has been idle this long, e.g. 30m or 3600 (seconds)")
	fs.StringArrayVar(&meta, "meta", nil, "metadata key=value (repeatable)")
	fs.Float64Var(&cpus, "cpus", 0, "CPU limit, e.g. 0.5 (0: no limit)")
	memory := sizeVar(fs, "memory", "memory limit, e.g. 512M or 2G (default: sbxd's)")
	disk := sizeVar(fs, "disk", "disk limit, e.g. 10G: past it writes fail with ENOSPC inside (default: sbxd's)")
	fs.IntVar(&pids, "pids", 0, "process limit, per user inside (default: sbxd's)")
	fs.BoolVar(&monitor, "monitor", false, "runtime monitoring: a trace of the sandbox's syscalls on files and sockets, execs and exits (sbx trace)")
	fs.StringVar(&network, "network", "", `"none": loopback only, no network (default: NAT egress under sbxd's policy)`)
	shape := shapeVars(fs)
	noCrash := fs.Bool("no-crash-capture", false, "let crashes end their process at once instead of holding each at its faulting instruction in a freeze (meta "+api.MetaCrashes+"=off)")
	cmd.RunE = func(cmd *cobra.Command, args []string) error {
		if template != "" && from != "" {
			return usagef("give --template or --from, not both: a sandbox from a snapshot boots on the snapshot's template")
		}
		opts := []client.CreateOption{client.WithTemplate(template), client.WithFrom(from), client.WithName(name),
			client.WithCPUs(cpus), client.WithMemoryLimit(memory.n), client.WithDiskLimit(disk.n),
			client.WithPidsLimit(pids), client.WithNetwork(network)}
		if ttl.set {
			opts = append(opts, client.WithTTL(ttl.D()))
		}
		if monitor {
			opts = append(opts, client.WithMonitoring())
		}
		if o := shape.option(); o != nil {
			opts = append(opts, o)
		}
		if network != "" && network != "none" {
			return usagef("--network %q: the one network mode to ask for is none", network)
		}
		for _, kv := range meta {
			k, v, ok := strings.Cut(kv, "=")
			if !ok || k == "" {
				return usagef("--meta %q: want key=value", kv)
			}
			opts = append(opts, client.WithMeta(k, v))
		}
		if *noCrash {
			opts = append(opts, client.WithMeta(api.MetaCrashes, "off"))
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
	return cmd
}
