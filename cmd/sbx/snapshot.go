package main

import (
	"fmt"
	"time"

	"sbx.dev/sbx/api"
)

var snapshotCommand = &command{
	name:    "snapshot",
	aliases: []string{"snapshots"},
	usage:   "snapshot ID NAME [--memory] | snapshot ls | snapshot info NAME | snapshot rm NAME... | snapshots",
	summary: "capture a sandbox as a named snapshot; list, describe and remove snapshots",
	run:     runSnapshot,
}

// snapshotArgs picks what `sbx snapshot` (or `sbx snapshots`, typed as verb)
// is asked to do from its positional arguments: "ls", "info" (NAME), "rm"
// (NAME...), or "take" (ID NAME) when the first argument is none of those.
func snapshotArgs(verb string, pos []string) (sub string, rest []string, err error) {
	if verb == "snapshots" && len(pos) == 0 {
		return "ls", nil, nil
	}
	if len(pos) == 0 {
		return "", nil, usagef("snapshot takes ID NAME, or ls, info NAME, rm NAME...")
	}
	sub, rest = pos[0], pos[1:]
	switch sub {
	case "ls", "list":
		if len(rest) != 0 {
			return "", nil, usagef("snapshot ls takes no arguments")
		}
		return "ls", nil, nil
	case "info":
		if len(rest) != 1 {
			return "", nil, usagef("snapshot info takes one snapshot name")
		}
		return sub, rest, nil
	case "rm":
		if len(rest) == 0 {
			return "", nil, usagef("snapshot rm takes at least one snapshot name")
		}
		return sub, rest, nil
	}
	if verb == "snapshots" {
		return "", nil, usagef("snapshots takes no arguments; to take one, run `sbx snapshot ID NAME`")
	}
	if len(pos) != 2 {
		return "", nil, usagef("snapshot takes a sandbox id and a snapshot name")
	}
	return "take", pos, nil
}

func runSnapshot(e *env, args []string) error {
	fs := e.flags("snapshot")
	memory := fs.Bool("memory", false, "capture the processes and memory too, not only the disk")
	pos, err := parseFlags(fs, args)
	if err != nil {
		return err
	}
	sub, rest, err := snapshotArgs(e.verb, pos)
	if err != nil {
		return err
	}
	if *memory && sub != "take" {
		return usagef("--memory is for taking a snapshot: sbx snapshot ID NAME --memory")
	}
	c, err := e.client()
	if err != nil {
		return err
	}
	switch sub {
	case "ls":
		ss, err := c.Snapshots(e.ctx)
		if err != nil {
			return err
		}
		if e.json {
			if ss == nil {
				ss = []api.Snapshot{}
			}
			return e.printJSON(ss)
		}
		now := time.Now()
		tw := e.table()
		fmt.Fprintln(tw, "NAME\tSANDBOX\tTEMPLATE\tMEMORY\tSIZE\tAGE")
		for _, s := range ss {
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", s.Name, orDash(s.SandboxID), orDash(s.Template),
				yesNo(s.Memory), size(s.Size), age(now, s.CreatedAt))
		}
		return tw.Flush()
	case "info":
		s, err := c.GetSnapshot(e.ctx, rest[0])
		if err != nil {
			return err
		}
		if e.json {
			return e.printJSON(s)
		}
		for _, kv := range snapshotLines(s) {
			fmt.Fprintf(e.stdout, "%s: %s\n", kv[0], kv[1])
		}
		return nil
	case "rm":
		type removed struct {
			Name string `json:"name"`
		}
		done := []removed{}
		failed := 0
		for _, name := range rest {
			if err := c.DeleteSnapshot(e.ctx, name); err != nil {
				e.printError(err, false)
				failed++
				continue
			}
			done = append(done, removed{name})
			if !e.json {
				fmt.Fprintln(e.stdout, name)
			}
		}
		if e.json {
			if err := e.printJSON(done); err != nil {
				return err
			}
		}
		if failed > 0 {
			return &exitError{code: 1} // each failure is reported already
		}
		return nil
	default: // take
		s, err := c.Snapshot(e.ctx, rest[0], rest[1], *memory)
		if err != nil {
			return err
		}
		if e.json {
			return e.printJSON(s)
		}
		_, err = fmt.Fprintln(e.stdout, snapshotTaken(s, rest[0]))
		return err
	}
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
		if s.Paused != "" {
			what += ", paused " + s.Paused
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
	add("paused", s.Paused)
	add("size", sizeIEC(s.Size))
	if !s.CreatedAt.IsZero() {
		add("created", s.CreatedAt.Local().Format(time.RFC3339))
	}
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
