package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"

	"github.com/spf13/cobra"

	"sbx.dev/sbx/api"
	"sbx.dev/sbx/client"
)

// deleteParallel is how many sandboxes are deleted at once: a delete mostly
// waits (for runsc, for the sandbox's processes to be reaped), so a few at
// once go much faster than one by one, without crowding sbxd.
const deleteParallel = 8

// deleteJSON is what `sbx --json delete` prints.
type deleteJSON struct {
	Deleted []api.DeleteResult `json:"deleted"`
}

func newDeleteCmd(e *env) *cobra.Command {
	var yes, withSnapshots, keepFreezes, all bool
	cmd := &cobra.Command{
		Use:     "delete [flags] ID... | --all",
		Aliases: []string{"rm"},
		Short:   "delete sandboxes, several at once",
		Example: "  sbx delete web --yes\n" +
			"  sbx delete --all --yes                # every sandbox of this sbxd\n" +
			"  sbx delete web --with-snapshots       # and the snapshots taken from it, naming each\n" +
			"  sbx delete web --keep-freezes         # its freezes (and crash captures) outlive it",
		Long: "delete removes sandboxes whatever their state. Named snapshots stay (unless\n" +
			"--with-snapshots); a sandbox's freezes and crash captures go with it, unless\n" +
			"--keep-freezes or one was promoted with `sbx snapshot keep NAME`.",
		Args: func(cmd *cobra.Command, args []string) error {
			switch {
			case all && len(args) > 0:
				return usagef("give sandbox ids or --all, not both")
			case !all && len(args) == 0:
				return usagef("delete takes at least one sandbox id (or --all)")
			}
			return nil
		},
		ValidArgsFunction: completeSandboxes(e),
	}
	fs := cmd.Flags()
	fs.BoolVarP(&yes, "yes", "y", false, "do not ask (asked only on a terminal)")
	fs.BoolVarP(&yes, "force", "f", false, "the same as --yes")
	fs.BoolVar(&withSnapshots, "with-snapshots", false, "also remove the snapshots taken from each sandbox")
	fs.BoolVar(&keepFreezes, "keep-freezes", false, "keep each sandbox's freezes and crash captures (they are marked kept, and outlive it)")
	fs.BoolVar(&all, "all", false, "delete every sandbox")
	cmd.RunE = func(cmd *cobra.Command, ids []string) error {
		c, err := e.client()
		if err != nil {
			return err
		}
		if all {
			sbs, err := c.List(e.ctx)
			if err != nil {
				return err
			}
			for _, sb := range sbs {
				ids = append(ids, sb.ID)
			}
		}
		if len(ids) > 0 && !yes && isTerminal(e.stdin) {
			what := "sandbox(es)"
			if withSnapshots {
				what += " and the snapshots taken from them"
			}
			fmt.Fprintf(e.stderr, "delete %d %s? [y/N] ", len(ids), what)
			if !confirmed(e.stdin) {
				return errors.New("not deleted")
			}
		}
		deleted, failed := deleteAll(e, c, ids, withSnapshots, keepFreezes)
		if e.json {
			if err := e.printJSON(deleteJSON{deleted}); err != nil {
				return err
			}
		}
		if failed > 0 {
			return &exitError{code: 1} // each failure is reported already
		}
		return nil
	}
	return cmd
}

// deleteAll deletes the sandboxes deleteParallel at a time, reporting each
// as it goes, and returns those deleted (in the order given) and how many
// failed.
func deleteAll(e *env, c *client.Client, ids []string, withSnapshots, keepFreezes bool) ([]api.DeleteResult, int) {
	results := make([]*api.DeleteResult, len(ids))
	var mu sync.Mutex // one report at a time
	failed := 0
	sem := make(chan struct{}, deleteParallel)
	var wg sync.WaitGroup
	for i, id := range ids {
		wg.Go(func() {
			sem <- struct{}{}
			defer func() { <-sem }()
			res, err := deleteOne(e.ctx, c, id, withSnapshots, keepFreezes)
			mu.Lock()
			defer mu.Unlock()
			switch {
			case err != nil:
				if !e.interrupted() {
					e.printError(err, false)
				}
				failed++
			case e.json:
				results[i] = res
			case withSnapshots:
				results[i] = res
				fmt.Fprintln(e.stdout, deletedLine(res))
			default:
				results[i] = res
				fmt.Fprintln(e.stdout, id)
			}
			if err == nil && !e.json && len(res.Freezes) > 0 {
				fmt.Fprintf(e.stderr, "removed the freezes of %s: %s (--keep-freezes keeps them)\n", res.ID, strings.Join(res.Freezes, ", "))
			}
		})
	}
	wg.Wait()
	deleted := []api.DeleteResult{}
	for _, r := range results {
		if r != nil {
			deleted = append(deleted, *r)
		}
	}
	return deleted, failed
}

// deleteOne deletes one sandbox, with its snapshots if asked.
func deleteOne(ctx context.Context, c *client.Client, id string, withSnapshots, keepFreezes bool) (*api.DeleteResult, error) {
	var opts []client.DeleteOption
	if withSnapshots {
		opts = append(opts, client.WithSnapshots())
	}
	if keepFreezes {
		opts = append(opts, client.KeepFreezes())
	}
	res, err := c.Sandbox(id).Delete(ctx, opts...)
	if err != nil {
		return nil, err
	}
	if res.ID == "" {
		res.ID = id
	}
	return res, nil
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
