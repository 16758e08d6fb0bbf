package main

import (
	"fmt"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"sbx.dev/sbx/api"
)

// psJSON is what `sbx --json ps` prints.
type psJSON struct {
	Execs []api.Exec `json:"execs"`
}

func newPsCmd(e *env) *cobra.Command {
	return &cobra.Command{
		Use:   "ps [flags] ID",
		Short: "list a sandbox's execs",
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) != 1 {
				return usagef("ps takes one sandbox id and lists its execs; `sbx list` lists the sandboxes")
			}
			return nil
		},
		ValidArgsFunction: completeSandboxes(e),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := e.client()
			if err != nil {
				return err
			}
			xs, err := c.Sandbox(args[0]).Execs(e.ctx)
			if err != nil {
				return err
			}
			if e.json {
				if xs == nil {
					xs = []api.Exec{}
				}
				return e.printJSON(psJSON{xs})
			}
			now := time.Now()
			tw := e.table()
			fmt.Fprintln(tw, "EXEC\tSTATE\tEXIT\tPID\tSTARTED\tCMD")
			for _, x := range xs {
				exit := "-"
				if x.ExitCode != nil {
					exit = fmt.Sprint(*x.ExitCode)
				}
				if x.TimedOut {
					exit += " (timeout)"
				}
				pid := "-"
				if x.Pid != 0 {
					pid = fmt.Sprint(x.Pid)
				}
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s ago\t%s\n", safe(x.ID), safe(string(x.State)), exit, pid, age(now, x.StartedAt), safe(strings.Join(x.Cmd, " ")))
			}
			return tw.Flush()
		},
	}
}
