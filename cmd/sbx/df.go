package main

import (
	"fmt"
	"time"

	"github.com/spf13/cobra"

	"sbx.dev/sbx/api"
)

func newDfCmd(e *env) *cobra.Command {
	return &cobra.Command{
		Use:   "df [flags]",
		Short: "show what uses sbxd's disk: per sandbox, snapshot, freeze, template and orphan image",
		Long: "df says what sbxd's data dir holds, by owner: each sandbox (its files, outputs,\n" +
			"hibernation image and disk), snapshot, freeze (crash captures too), template version\n" +
			"and orphan image (a deleted sandbox's, swept after the grace or `sbx prune`), with\n" +
			"the totals and the budget (sbxd --storage-max). Sizes are the blocks files hold.",
		Example: "  sbx df\n  sbx --json df",
		Args:    exactArgs(0, "no arguments"),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := e.client()
			if err != nil {
				return err
			}
			st, err := c.Storage(e.ctx)
			if err != nil {
				return err
			}
			if e.json {
				return e.printJSON(st)
			}
			now := time.Now()
			tw := e.table()
			fmt.Fprintln(tw, "KIND\tNAME\tID\tSANDBOX\tSIZE\tAGE")
			for _, list := range [][]api.StorageItem{st.Sandboxes, st.Snapshots, st.Freezes, st.Templates, st.Orphans} {
				for _, it := range list {
					kind := it.Kind
					if it.Kept {
						kind += " (kept)"
					}
					fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", kind, orDash(it.Name), it.ID, orDash(it.SandboxID), size(it.Bytes), age(now, it.CreatedAt))
				}
			}
			if err := tw.Flush(); err != nil {
				return err
			}
			fmt.Fprintln(e.stdout)
			tw = e.table()
			for _, k := range [][2]string{{api.StorageSandbox, "sandboxes"}, {api.StorageSnapshot, "snapshots"}, {api.StorageFreeze, "freezes"},
				{api.StorageTemplate, "templates"}, {api.StorageOrphan, "orphans"}, {api.StorageOther, "sbxd's own"}} {
				fmt.Fprintf(tw, "%s\t%s\n", k[1], size(st.Totals[k[0]]))
			}
			budget := "no budget (sbxd --storage-max)"
			if st.Max > 0 {
				budget = fmt.Sprintf("of %s (sbxd --storage-max)", size(st.Max))
			}
			fmt.Fprintf(tw, "total\t%s %s, %s free on %s\n", size(st.Used), budget, size(st.Free), st.DataDir)
			return tw.Flush()
		},
	}
}
