package main

import (
	"fmt"
	"time"

	"github.com/spf13/cobra"

	"sbx.dev/sbx/api"
	"sbx.dev/sbx/client"
)

// snapshotsJSON is what `sbx --json snapshot ls` prints.
type snapshotsJSON struct {
	Snapshots []api.Snapshot `json:"snapshots"`
}

// snapshotJSON is what `sbx --json snapshot info` prints, as info does.
type snapshotJSON struct {
	Snapshot *api.Snapshot `json:"snapshot"`
}

// removedJSON is what `sbx --json snapshot rm` prints.
type removedJSON struct {
	Removed []string `json:"removed"`
}

func newSnapshotCmd(e *env) *cobra.Command {
	var memory bool
	cmd := &cobra.Command{
		Use:        "snapshot [flags] ID NAME",
		Aliases:    []string{"snapshots"},
		SuggestFor: []string{"commit", "checkpoint"},
		Short:      "capture a sandbox as a named snapshot; list, describe and remove snapshots",
		Long: "snapshot ID NAME captures the sandbox's disk (the sandbox keeps running); with\n" +
			"--memory its processes and memory too (it is paused while they are written).\n" +
			"A snapshot outlives its sandbox. `sbx snapshot ls` (or `sbx snapshots`) lists them,\n" +
			"`sbx snapshot info NAME` describes one, `sbx snapshot rm NAME...` removes them,\n" +
			"`sbx snapshot keep NAME...` promotes a freeze so that it outlives its sandbox;\n" +
			"`sbx snapshot push NAME REF` sends one to an OCI registry, and `sbx snapshot pull\n" +
			"REF` records one another sbxd pushed.",
		Example: "  sbx snapshot web before-upgrade\n  sbx snapshot web live --memory\n  sbx new --from live",
		Args: func(cmd *cobra.Command, args []string) error {
			switch {
			case cmd.CalledAs() == "snapshots" && len(args) > 0:
				return usagef("snapshots takes no arguments; to take one, run `sbx snapshot ID NAME`")
			case cmd.CalledAs() == "snapshots":
				return nil
			case len(args) == 0:
				return usagef("snapshot takes ID NAME, or ls, info NAME, rm NAME..., keep NAME..., push NAME REF, pull REF")
			case len(args) != 2:
				return usagef("snapshot takes a sandbox id and a snapshot name%s", didYouMean(cmd.SuggestionsFor(args[0])))
			}
			return nil
		},
		ValidArgsFunction: completeSandboxes(e),
		RunE: func(cmd *cobra.Command, args []string) error {
			if cmd.CalledAs() == "snapshots" {
				if memory {
					return usagef("--memory is for taking a snapshot: sbx snapshot ID NAME --memory")
				}
				return listSnapshots(e)
			}
			c, err := e.client()
			if err != nil {
				return err
			}
			var opts []client.SnapshotOption
			if memory {
				opts = append(opts, client.WithMemory())
			}
			s, err := c.Sandbox(args[0]).Snapshot(e.ctx, args[1], opts...)
			if err != nil {
				return err
			}
			if e.json {
				return e.printJSON(s)
			}
			_, err = fmt.Fprintln(e.stdout, snapshotTaken(s, args[0]))
			return err
		},
	}
	cmd.Flags().BoolVar(&memory, "memory", false, "capture the processes and memory too, not only the disk")
	cmd.AddCommand(&cobra.Command{
		Use:     "ls [flags]",
		Aliases: []string{"list"},
		Short:   "list snapshots",
		Args:    exactArgs(0, "no arguments"),
		RunE:    func(cmd *cobra.Command, args []string) error { return listSnapshots(e) },
	}, &cobra.Command{
		Use:   "info [flags] NAME",
		Short: "describe a snapshot",
		Args:  exactArgs(1, "one snapshot name"),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := e.client()
			if err != nil {
				return err
			}
			s, err := c.GetSnapshot(e.ctx, args[0])
			if err != nil {
				return err
			}
			if e.json {
				return e.printJSON(snapshotJSON{s})
			}
			for _, kv := range snapshotLines(s) {
				fmt.Fprintf(e.stdout, "%s: %s\n", kv[0], kv[1])
			}
			return nil
		},
	}, &cobra.Command{
		Use:   "rm [flags] NAME...",
		Short: "remove snapshots",
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) == 0 {
				return usagef("snapshot rm takes at least one snapshot name")
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := e.client()
			if err != nil {
				return err
			}
			done := []string{}
			failed := 0
			for _, name := range args {
				if err := c.DeleteSnapshot(e.ctx, name); err != nil {
					e.printError(err, false)
					failed++
					continue
				}
				done = append(done, name)
				if !e.json {
					fmt.Fprintln(e.stdout, name)
				}
			}
			if e.json {
				if err := e.printJSON(removedJSON{done}); err != nil {
					return err
				}
			}
			if failed > 0 {
				return &exitError{code: 1} // each failure is reported already
			}
			return nil
		},
	}, newSnapshotKeepCmd(e), newSnapshotPushCmd(e), newSnapshotPullCmd(e)) // keep.go, transfer.go
	return cmd
}

// listSnapshots prints every snapshot.
func listSnapshots(e *env) error {
	c, err := e.client()
	if err != nil {
		return err
	}
	ss, err := c.Snapshots(e.ctx)
	if err != nil {
		return err
	}
	if e.json {
		if ss == nil {
			ss = []api.Snapshot{}
		}
		return e.printJSON(snapshotsJSON{ss})
	}
	now := time.Now()
	tw := e.table()
	fmt.Fprintln(tw, "NAME\tSANDBOX\tTEMPLATE\tMEMORY\tSIZE\tAGE")
	for _, s := range ss {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", s.Name, orDash(s.SandboxID), orDash(s.Template),
			yesNo(s.Memory), size(s.Size), age(now, s.CreatedAt))
	}
	return tw.Flush()
}

// snapshotTaken says what a snapshot captured, for people:
// "snapshot NAME of ID (memory, paused 120ms, 3.2 MiB)".
func snapshotTaken(s *api.Snapshot, id string) string {
	if s.SandboxID != "" {
		id = s.SandboxID
	}
	what := "disk"
	if s.Memory {
		what = "memory"
		if s.Paused != nil {
			what += ", paused " + s.Paused.String()
		}
	}
	return fmt.Sprintf("snapshot %s of %s (%s, %s)", s.Name, id, what, sizeIEC(s.Size))
}

// snapshotLines lists a snapshot's fields for people, leaving out empty ones.
func snapshotLines(s *api.Snapshot) [][2]string {
	var out [][2]string
	add := func(k, v string) {
		if v != "" {
			out = append(out, [2]string{k, v})
		}
	}
	add("name", s.Name)
	add("id", s.ID)
	add("sandbox", s.SandboxID)
	add("template", s.Template)
	add("memory", yesNo(s.Memory))
	add("paused", optText(s.Paused))
	add("size", sizeIEC(s.Size))
	if s.Kept {
		add("kept", "yes (sbx snapshot keep: outlives its sandbox, in no freeze quota)")
	}
	if !s.CreatedAt.IsZero() {
		add("created", s.CreatedAt.Local().Format(time.RFC3339))
	}
	// a node's and a registry's words: quoted, as every name is
	add("node", safe(s.Node))
	add("ref", safe(s.Ref))
	add("ref pending", safe(s.RefPending))
	return out
}

func yesNo(b bool) string {
	if b {
		return "yes"
	}
	return "no"
}

// sizeIEC writes a byte count for people with its unit: "512 B", "3.2 MiB".
func sizeIEC(n int64) string {
	s := size(n)
	if n < 1024 {
		return s[:len(s)-1] + " B"
	}
	return s[:len(s)-1] + " " + s[len(s)-1:] + "iB"
}
