package main

import (
	"fmt"
	"strings"

	"github.com/spf13/cobra"
)

func newTraceCmd(e *env) *cobra.Command {
	return &cobra.Command{
		Use:               "trace [flags] ID",
		Short:             "print what runtime monitoring kept of a monitored sandbox (sbx new/fork --monitor)",
		Example:           "  sbx new --monitor --name m && sbx exec m -- cat /nope; sbx trace m",
		Args:              exactArgs(1, "one sandbox id"),
		ValidArgsFunction: completeSandboxes(e),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := e.client()
			if err != nil {
				return err
			}
			tr, err := c.Sandbox(args[0]).Trace(e.ctx)
			if err != nil {
				return err
			}
			if e.json {
				return e.printJSON(tr)
			}
			tw := e.table()
			fmt.Fprintln(tw, "TIME\tPID\tPROCESS\tEVENT")
			for _, ev := range tr.Events {
				what := ev.Kind
				switch {
				case ev.Path != "":
					what += " " + ev.Path
				case ev.Addr != "":
					what += " " + ev.Addr
				}
				if len(ev.Argv) > 0 {
					what += " [" + strings.Join(ev.Argv, " ") + "]"
				}
				switch {
				case ev.Kind == "exit":
					what += fmt.Sprintf(" status %d", ev.Status)
				case ev.Errno != 0:
					what += fmt.Sprintf(" = errno %d", ev.Errno)
				}
				// what a sandbox names is quoted for the terminal
				fmt.Fprintf(tw, "%d\t%d\t%s\t%s\n", ev.TimeNs, ev.Pid, safe(ev.Process), safe(what))
			}
			if err := tw.Flush(); err != nil {
				return err
			}
			_, err = fmt.Fprintf(e.stdout, "%d events kept (at most %d), %d dropped by sbxd, %d by gVisor\n", len(tr.Events), tr.Limit, tr.Dropped, tr.SentryDropped)
			return err
		},
	}
}
