package main

import (
	"bufio"
	"errors"
	"fmt"
	"strings"

	"sbx.dev/sbx/api"
)

var deleteCommand = &command{
	name:    "delete",
	aliases: []string{"rm"},
	usage:   "delete ID... [--yes]",
	summary: "delete sandboxes",
	run:     runDelete,
}

func runDelete(e *env, args []string) error {
	fs := e.flags("delete")
	yes := fs.Bool("yes", false, "do not ask")
	ids, err := parseFlags(fs, args)
	if err != nil {
		return err
	}
	if len(ids) == 0 {
		return usagef("delete takes at least one sandbox id")
	}
	if !*yes && isTerminal(e.stdin) {
		fmt.Fprintf(e.stderr, "delete %d sandbox(es)? [y/N] ", len(ids))
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
		if err := c.Delete(e.ctx, id); err != nil {
			e.printError(err, false)
			failed++
			continue
		}
		deleted = append(deleted, api.DeleteResult{ID: id})
		if !e.json {
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

// confirmed reads one answer line and reports whether it says yes.
func confirmed(r interface{ Read([]byte) (int, error) }) bool {
	line, _ := bufio.NewReader(r).ReadString('\n')
	switch strings.ToLower(strings.TrimSpace(line)) {
	case "y", "yes":
		return true
	}
	return false
}
