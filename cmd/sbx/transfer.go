package main

import (
	"fmt"

	"github.com/spf13/cobra"
)

// newSnapshotPushCmd is `sbx snapshot push NAME REF`.
func newSnapshotPushCmd(e *env) *cobra.Command {
	return &cobra.Command{
		Use:   "push [flags] NAME REF",
		Short: "push a snapshot to an OCI registry, for another sbxd to pull",
		Long: "push sends snapshot NAME's image (its disk, and its memory if it has one) to REF,\n" +
			"a repository of an OCI registry with a tag or not, as one artifact with a manifest\n" +
			"saying what a node must be to restore it. sbxd talks to the registry, with its\n" +
			"user's docker credentials; one on loopback or a private address in plain HTTP.\n" +
			"It prints the artifact by digest: `sbx snapshot pull` of it gets exactly this.",
		Example: "  sbx snapshot push flaky-1 127.0.0.1:5000/sbx/flaky:run-7",
		Args:    exactArgs(2, "a snapshot name and a registry reference"),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := e.client()
			if err != nil {
				return err
			}
			res, err := c.PushSnapshot(e.ctx, args[0], args[1])
			if err != nil {
				return err
			}
			if e.json {
				return e.printJSON(res)
			}
			what := "disk"
			if res.Memory {
				what = "disk and memory"
			}
			_, err = fmt.Fprintf(e.stdout, "pushed %s (%s: %d files, %s) to %s\n", args[0], what, res.Files, humanBytes(res.Bytes), res.Ref)
			return err
		},
	}
}

// newSnapshotPullCmd is `sbx snapshot pull REF`.
func newSnapshotPullCmd(e *env) *cobra.Command {
	var name string
	cmd := &cobra.Command{
		Use:   "pull [flags] REF",
		Short: "pull a snapshot another sbxd pushed, and record it here",
		Long: "pull fetches the snapshot artifact REF (a tag or a digest) from its registry,\n" +
			"verifies every file against its digest, and records it under its own name, or\n" +
			"--name. Files this node holds already (another pull of the same disk) are not\n" +
			"fetched again. The snapshot is of a template version: this node must have it.\n" +
			"A snapshot pushed with memory keeps it where this node can restore it (the same\n" +
			"runsc build, a CPU with the image's features and cache line): a sandbox made\n" +
			"from it here has the processes and memory it had. Elsewhere it is recorded as a\n" +
			"disk snapshot, and the pull says why.",
		Example: "  sbx snapshot pull 127.0.0.1:5000/sbx/flaky:run-7\n  sbx new --from flaky-1",
		Args:    exactArgs(1, "a registry reference"),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := e.client()
			if err != nil {
				return err
			}
			res, err := c.PullSnapshot(e.ctx, args[0], name)
			if err != nil {
				return err
			}
			if e.json {
				return e.printJSON(res)
			}
			fmt.Fprintf(e.stdout, "pulled %s as snapshot %s (%s from the registry, %s in all)\n", res.Ref, res.Snapshot.Name, humanBytes(res.PulledBytes), humanBytes(res.Snapshot.Size))
			if res.MemoryLeft != "" {
				fmt.Fprintf(e.stderr, "sbx: %s: %s\n", res.Snapshot.Name, res.MemoryLeft)
			}
			return nil
		},
	}
	cmd.Flags().StringVar(&name, "name", "", "record the snapshot under this name (default: the name it was pushed with)")
	return cmd
}
