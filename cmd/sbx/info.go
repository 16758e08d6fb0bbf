package main

import (
	"fmt"
	"sort"
	"time"

	"github.com/spf13/cobra"

	"sbx.dev/sbx/api"
)

// infoJSON is what `sbx --json info` prints: {"sandbox": {...}}, as the
// scripts of sbx's users read it (jq .sandbox.state).
type infoJSON struct {
	Sandbox *api.Sandbox `json:"sandbox"`
}

func newInfoCmd(e *env) *cobra.Command {
	return &cobra.Command{
		Use:               "info [flags] ID",
		SuggestFor:        []string{"inspect", "status"},
		Short:             "describe a sandbox",
		Args:              exactArgs(1, "one sandbox id"),
		ValidArgsFunction: completeSandboxes(e),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := e.client()
			if err != nil {
				return err
			}
			sb, err := c.Sandbox(args[0]).Info(e.ctx)
			if err != nil {
				return err
			}
			if e.json {
				return e.printJSON(infoJSON{sb})
			}
			for _, kv := range infoLines(sb) {
				fmt.Fprintf(e.stdout, "%s: %s\n", safe(kv[0]), safe(kv[1]))
			}
			return nil
		},
	}
}

// infoLines lists a sandbox's fields for people, leaving out empty ones.
func infoLines(sb *api.Sandbox) [][2]string {
	var out [][2]string
	add := func(k, v string) {
		if v != "" {
			out = append(out, [2]string{k, v})
		}
	}
	add("id", sb.ID)
	add("name", sb.Name)
	add("template", sb.Template)
	add("state", string(sb.State))
	add("reason", sb.Reason)
	add("node", sb.Node)
	if !sb.CreatedAt.IsZero() {
		add("created", sb.CreatedAt.Local().Format(time.RFC3339))
	}
	if !sb.LastActivity.IsZero() {
		add("last activity", sb.LastActivity.Local().Format(time.RFC3339))
	}
	add("idle", optText(sb.Idle))
	add("ttl", ttlText(sb.TTL))
	if sb.Persistent {
		add("persistent", "yes")
	}
	if sb.ReapReason != "" {
		add("reaper", reapLine(sb.ReapAt, sb.ReapReason))
	}
	if sb.CPUs != 0 {
		add("cpus", fmt.Sprint(sb.CPUs))
	}
	if sb.Memory != 0 {
		add("memory", size(sb.Memory))
	}
	if sb.DiskLimit != 0 {
		add("disk", size(sb.DiskLimit))
	}
	if sb.Pids != 0 {
		add("pids", fmt.Sprint(sb.Pids))
	}
	add("network", sb.Network)
	if sh := sb.Shape; sh != nil {
		add("net shape", fmt.Sprintf("delay %s, loss %g", sh.Delay, sh.Loss))
	}
	add("template version", sb.TemplateVersion)
	add("address", sb.Address)
	add("from", sb.From)
	add("parent", sb.Parent)
	// memoryRestored is false for every sandbox that booted fresh: say so
	// only where it was in question (a resume that fell back to the disk)
	if sb.MemoryRestored || sb.ResumeReason != "" {
		add("memory restored", yesNo(sb.MemoryRestored))
	}
	add("resume reason", sb.ResumeReason)
	keys := make([]string, 0, len(sb.Meta))
	for k := range sb.Meta {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		add("meta."+k, sb.Meta[k])
	}
	return out
}
