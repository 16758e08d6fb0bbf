package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"strings"

	"sbx.dev/sbx/api"
	"sbx.dev/sbx/client"
)

var deleteCommand = &command{
	name:    "delete",
	aliases: []string{"rm"},
	usage:   "delete ID... [--yes] [--with-snapshots]",
	summary: "delete sandboxes",
	run:     runDelete,
}

func runDelete(e *env, args []string) error {
	fs := e.flags("delete")
	yes := fs.Bool("yes", false, "do not ask")
	withSnapshots := fs.Bool("with-snapshots", false, "also remove the snapshots taken from each sandbox")
	ids, err := parseFlags(fs, args)
	if err != nil {
		return err
	}
	if len(ids) == 0 {
		return usagef("delete takes at least one sandbox id")
	}
	if !*yes && isTerminal(e.stdin) {
		what := "sandbox(es)"
		if *withSnapshots {
			what += " and the snapshots taken from them"
		}
		fmt.Fprintf(e.stderr, "delete %d %s? [y/N] ", len(ids), what)
		if !confirmed(e.stdin) {
			return errors.New("not deleted")
		}
	}
	c, err := e.client()
	if err != nil {
		return err
	}
	var deleted []api.DeleteResult
	failed := 0
	for _, id := range ids {
		res, err := deleteOne(e.ctx, c, id, *withSnapshots)
		if err != nil {
			e.printError(err, false)
			failed++
			continue
		}
		deleted = append(deleted, *res)
		switch {
		case e.json:
		case *withSnapshots:
			fmt.Fprintln(e.stdout, deletedLine(res))
		default:
			fmt.Fprintln(e.stdout, id)
		}
	}
	if e.json {
		if deleted == nil {
			deleted = []api.DeleteResult{}
		}
		if err := e.printJSON(deleted); err != nil {
			return err
		}
	}
	if failed > 0 {
		return &exitError{code: 1} // each failure is reported already
	}
	return nil
}

// deleteOne deletes one sandbox, with its snapshots if asked.
func deleteOne(ctx context.Context, c *client.Client, id string, withSnapshots bool) (*api.DeleteResult, error) {
	if withSnapshots {
		return c.DeleteWithSnapshots(ctx, id)
	}
	if err := c.Delete(ctx, id); err != nil {
		return nil, err
	}
	return &api.DeleteResult{ID: id}, nil
}

// deletedLine names a deleted sandbox and the snapshots removed with it:
// "deleted sb_x (snapshots: a, b)".
func deletedLine(res *api.DeleteResult) string {
	snaps := "none"
	if len(res.Snapshots) > 0 {
		snaps = strings.Join(res.Snapshots, ", ")
	}
	return fmt.Sprintf("deleted %s (snapshots: %s)", res.ID, snaps)
}

// confirmed reads one answer line and reports whether it says yes.
func confirmed(r interface{ Read([]byte) (int, error) }) bool {
	line, _ := bufio.NewReader(r).ReadString('\n')
	switch strings.ToLower(strings.TrimSpace(line)) {
	case "y", "yes":
		return true
	}
	return false
}
