package main

import (
	"fmt"

	"github.com/spf13/cobra"

	"sbx.dev/sbx/api"
)

func newPruneCmd(e *env) *cobra.Command {
	var req api.PruneRequest
	var olderThan string
	cmd := &cobra.Command{
		Use:   "prune [flags]",
		Short: "reclaim sbxd's disk: remove orphan images and unkept freezes, saying what went",
		Long: "prune removes what nobody asked to keep, and prints each thing it removed:\n" +
			"--orphans: images no sandbox or snapshot owns (a deleted sandbox's hibernation\n" +
			"image), before their grace ends; --freezes: freeze snapshots and crash captures not\n" +
			"promoted with `sbx snapshot keep`. With neither, --orphans. --older-than only takes\n" +
			"what is older; --dry-run says what would go and removes nothing.",
		Example: "  sbx prune --orphans\n  sbx prune --freezes --older-than 24h\n  sbx prune --orphans --freezes --dry-run",
		Args:    exactArgs(0, "no arguments"),
		RunE: func(cmd *cobra.Command, args []string) error {
			if olderThan != "" {
				d, err := parseDuration(olderThan)
				if err != nil {
					return usagef("--older-than: %v", err)
				}
				req.OlderThan = api.Duration(d)
			}
			c, err := e.client()
			if err != nil {
				return err
			}
			res, err := c.Prune(e.ctx, req)
			if err != nil {
				return err
			}
			if e.json {
				return e.printJSON(res)
			}
			verb := "removed"
			if res.DryRun {
				verb = "would remove"
			}
			for _, it := range res.Removed {
				what := it.ID
				if it.Name != "" {
					what = it.Name + " (" + it.ID + ")"
				}
				from := ""
				if it.SandboxID != "" {
					from = " of " + it.SandboxID
				}
				fmt.Fprintf(e.stdout, "%s %s %s%s, %s\n", verb, it.Kind, what, from, sizeIEC(it.Bytes))
			}
			_, err = fmt.Fprintf(e.stdout, "%s %d, %s in all\n", verb, len(res.Removed), sizeIEC(res.Reclaimed))
			return err
		},
	}
	fs := cmd.Flags()
	fs.BoolVar(&req.Orphans, "orphans", false, "remove orphan images (no sandbox or snapshot owns them)")
	fs.BoolVar(&req.Freezes, "freezes", false, "remove freeze snapshots and crash captures not kept (sbx snapshot keep)")
	fs.StringVar(&olderThan, "older-than", "", "only what is older than this (90s, 2h, or bare seconds)")
	fs.BoolVar(&req.DryRun, "dry-run", false, "say what would be removed, remove nothing")
	return cmd
}
