package main

import (
	"fmt"

	"github.com/spf13/cobra"
)

// newSnapshotKeepCmd is `sbx snapshot keep NAME...`.
func newSnapshotKeepCmd(e *env) *cobra.Command {
	return &cobra.Command{
		Use:   "keep [flags] NAME...",
		Short: "promote snapshots (freezes, crash captures): they outlive their sandbox and count in no quota",
		Long: "keep marks snapshots as the user's: a freeze (or crash capture) so marked is not\n" +
			"removed when its sandbox is deleted, counts in no freeze quota, and `sbx prune\n" +
			"--freezes` leaves it. `sbx snapshot rm NAME` still removes it.",
		Example: "  sbx snapshot keep freeze-web-abcd",
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) == 0 {
				return usagef("snapshot keep takes at least one snapshot name")
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := e.client()
			if err != nil {
				return err
			}
			kept := []string{}
			failed := 0
			for _, name := range args {
				if _, err := c.KeepSnapshot(e.ctx, name); err != nil {
					e.printError(err, false)
					failed++
					continue
				}
				kept = append(kept, name)
				if !e.json {
					fmt.Fprintf(e.stdout, "kept %s\n", name)
				}
			}
			if e.json {
				if err := e.printJSON(keptJSON{kept}); err != nil {
					return err
				}
			}
			if failed > 0 {
				return &exitError{code: 1} // each failure is reported already
			}
			return nil
		},
	}
}

// keptJSON is what `sbx --json snapshot keep` prints.
type keptJSON struct {
	Kept []string `json:"kept"`
}
