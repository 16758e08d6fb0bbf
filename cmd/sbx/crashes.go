package main

import (
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"sbx.dev/sbx/client"
	"sbx.dev/sbx/internal/flaky"
)

// crashesJSON is what `sbx --json crashes` prints.
type crashesJSON struct {
	Crashes []client.Crash `json:"crashes"`
	// SinceStart is how many crashes the running sandbox has had since it
	// started, caught or not (the sandbox's word); absent when unknown.
	SinceStart *int `json:"crashesSinceStart,omitempty"`
}

func newCrashesCmd(e *env) *cobra.Command {
	var bundle string
	var noBacktrace bool
	cmd := &cobra.Command{
		Use:   "crashes [flags] ID",
		Short: "list the crashes caught in a sandbox, each held at its faulting instruction",
		Long: `crashes lists the crashes caught in a sandbox: every process that got a
signal whose default action dumps core (SIGSEGV, SIGBUS, SIGILL, SIGFPE,
SIGABRT, SIGTRAP, SIGSYS, SIGQUIT, ...) with no handler for it was held at its
faulting instruction while the sandbox was frozen (one per boot of the
sandbox; COUNT says how many crashed in that boot). In a copy resumed from
the crash's snapshot (sbx new --from SNAPSHOT) the process is still stopped
there, its signal pending: gdb -p PID shows the faulting frame.

The backtrace of each crash is read by gdb in such a copy, made and deleted
for it (--no-backtrace skips that); in a template with no gdb (tiny), by the
gdb of this machine from a core sbx-agent writes in the copy. --bundle DIR
writes the last crash's bundle: a core of the held process, the exact
program and its libraries matched by build-id, /usr/lib/debug files if the
sandbox has them, the mappings and backtrace.txt.`,
		Example: `  sbx crashes web
  sbx crashes web --bundle ./crash
  sbx new --from $(sbx --json crashes web --no-backtrace | jq -r '.crashes[-1].snapshot')`,
		Args:              exactArgs(1, "one sandbox id"),
		ValidArgsFunction: completeSandboxes(e),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := e.client()
			if err != nil {
				return err
			}
			crs, err := c.Sandbox(args[0]).Crashes(e.ctx)
			if err != nil {
				return err
			}
			sdk := flaky.Adapt(c)
			if bundle != "" {
				if len(crs) == 0 {
					return fmt.Errorf("sandbox %s has had no crash caught: no bundle to write", args[0])
				}
				cr := crs[len(crs)-1]
				b, err := flaky.CrashBundle(e.ctx, sdk, cr, bundle)
				if err != nil {
					return fmt.Errorf("bundle of the crash of %d (%s): %w", cr.Pid, cr.Snapshot, err)
				}
				crs[len(crs)-1].Backtrace = b.Backtrace
				if !e.json {
					fmt.Fprintf(e.stderr, "wrote %s and %s/backtrace.txt (%d files matched by build-id)\n", b.Tar, bundle, len(b.Files))
					if b.Truncated != "" {
						fmt.Fprintf(e.stderr, "bundle: %s\n", b.Truncated)
					}
				}
			}
			if !noBacktrace {
				for i := range crs {
					if crs[i].Backtrace != "" {
						continue
					}
					bt, err := flaky.CrashBacktrace(e.ctx, sdk, crs[i])
					if err != nil {
						fmt.Fprintf(e.stderr, "sbx: the backtrace of %d: %v\n", crs[i].Pid, err)
						continue
					}
					crs[i].Backtrace = bt
				}
			}
			var since *int
			if b, err := c.Sandbox(args[0]).Files().ReadFile(e.ctx, "/run/sbx/crashes/count", 64); err == nil {
				if n, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil && n >= 0 {
					since = &n
				}
			}
			if e.json {
				return e.printJSON(crashesJSON{crs, since})
			}
			if since != nil {
				defer fmt.Fprintf(e.stdout, "\n%d crashes in %s since it started (one is caught per start: the others end at once)\n", *since, args[0])
			}
			if len(crs) == 0 {
				fmt.Fprintf(e.stdout, "no crash caught in %s\n", args[0])
				return nil
			}
			now := time.Now()
			tw := e.table()
			fmt.Fprintln(tw, "PID\tSIGNAL\tFAULT\tEXE\tAT\tCOUNT\tSNAPSHOT")
			for _, cr := range crs {
				fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s ago\t%d\t%s\n", cr.Pid, safe(cr.Signal), safe(orDash(cr.FaultAddr)), safe(orDash(cr.Exe)), age(now, cr.At), cr.Count, safe(cr.Snapshot))
			}
			if err := tw.Flush(); err != nil {
				return err
			}
			for _, cr := range crs {
				if cr.Backtrace != "" {
					fmt.Fprintf(e.stdout, "\n%d (%s), %s:\n%s", cr.Pid, safe(orDash(cr.Exe)), safe(cr.Signal), safeText(strings.TrimRight(cr.Backtrace, "\n")+"\n"))
				}
			}
			return nil
		},
	}
	cmd.Flags().StringVar(&bundle, "bundle", "", "write the last crash's bundle (core, program, libraries, mappings, backtrace) into `DIR`")
	cmd.Flags().BoolVar(&noBacktrace, "no-backtrace", false, "list without reading each crash's backtrace in a copy")
	return cmd
}
