package main

import (
	"fmt"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"sbx.dev/sbx/internal/flaky"
)

func newFlakeRateCmd(e *env) *cobra.Command {
	var (
		from, seedEnv string
		n, parallel   int
		keep          bool
	)
	cmd := &cobra.Command{
		Use:   "flake-rate [flags] (--from SNAPSHOT | ID) [--] TEST_CMD [ARGS...]",
		Short: "run a test once in each of N memory forks of one state, each with its own seed; print the failure rate",
		Long: "flake-rate forks N sandboxes with memory from one ready state (a sandbox, or a\n" +
			"snapshot with --from), runs the test once in each with its own seed in $SEED, and\n" +
			"prints the failure rate with its 95% Wilson interval. Every fork is deleted after\n" +
			"its run, except failures with --keep-failures: each is named flake-SEED, shows\n" +
			"its seed in `sbx info` (meta flake.seed) and is reaped after --keep-ttl idle.\n" +
			"The test command owns everything from its first word on.",
		Example: "  sbx flake-rate --from ready-state -n 50 --parallel 8 --keep-failures -- 'cd /work && ./test.sh'",
		Args:    cobra.ArbitraryArgs,
	}
	cmd.Flags().SetInterspersed(false)
	fs := cmd.Flags()
	fs.StringVar(&from, "from", "", "start from this snapshot instead of a sandbox")
	fs.IntVarP(&n, "runs", "n", 0, "how many forks, one run each")
	fs.IntVar(&parallel, "parallel", flaky.DefaultParallel, "how many runs at once")
	fs.StringVar(&seedEnv, "seed-env", flaky.DefaultSeedEnv, "the environment variable each run's seed is passed in")
	fs.BoolVar(&keep, "keep-failures", false, "keep the forks whose run failed, named after their seed, and print them")
	keepTTL := durationVar(fs, "keep-ttl", fmt.Sprintf("the idle ttl of a kept failure (default %s; 0: none)", flaky.DefaultKeepTTL))
	timeout := durationVar(fs, "timeout", "kill a run after this long (a failure), e.g. 5m or 300 (seconds)")
	cmd.RunE = remote(func(cmd *cobra.Command, args []string) error {
		fixed := 1
		if from != "" {
			fixed = 0
		}
		pos, command, err := remoteArgs(cmd, args, fixed)
		if err != nil {
			return err
		}
		o := flaky.RateOptions{From: from, N: n, Parallel: parallel, KeepFailures: keep, KeepTTL: keepTTL.keep()}
		if from == "" {
			if len(pos) == 0 || len(command) == 0 {
				return usagef("flake-rate takes a sandbox id (or --from SNAPSHOT) and a test command")
			}
			o.Sandbox = pos[0]
		}
		switch {
		case len(command) == 0:
			return usagef("flake-rate takes a test command (after its flags, or after --)")
		case n < 1:
			return usagef("-n %d: want at least 1 run", n)
		case parallel < 1 || parallel > flaky.MaxParallel:
			return usagef("--parallel %d: want 1 to %d runs at once", parallel, flaky.MaxParallel)
		case seedEnv == "" || strings.ContainsAny(seedEnv, "= "):
			return usagef("--seed-env %q: want a variable name", seedEnv)
		case keepTTL.set && !keep:
			return usagef("--keep-ttl goes with --keep-failures")
		}
		o.Test = flaky.Test{Cmd: shellWrap(command), SeedEnv: seedEnv, Timeout: timeout.Duration}
		c, err := e.client()
		if err != nil {
			return err
		}
		// forks are made while runs go: one status line tells both
		p := e.newStatusLine()
		forked, done, failed := 0, 0, 0
		status := func() { p.printf("forked %d/%d, ran %d/%d, %d failed", forked, n, done, n, failed) }
		o.Forked = func(ready, _ int) {
			forked = ready
			status()
		}
		o.Progress = func(r flaky.Run) {
			done++
			if !r.Pass {
				failed++
			}
			if e.json {
				e.printJSONLine(r)
				return
			}
			status()
		}
		res, err := flaky.FlakeRate(e.ctx, flaky.Adapt(c), o)
		p.clear()
		if err != nil {
			return err
		}
		if e.json {
			return e.printJSONLine(res.Summary)
		}
		tw := e.table()
		fmt.Fprintln(tw, "RUN\tSEED\tSANDBOX\tEXIT\tRESULT\tTIME")
		for _, r := range res.Runs {
			fmt.Fprintf(tw, "%d\t%d\t%s\t%d\t%s\t%s\n", r.Run, r.Seed, r.Sandbox, r.ExitCode, passFail(r.Pass),
				(time.Duration(r.DurationMs) * time.Millisecond).String())
		}
		if err := tw.Flush(); err != nil {
			return err
		}
		if len(res.Summary.Kept) > 0 {
			fmt.Fprintf(e.stdout, "kept %d failing forks: %s\n", len(res.Summary.Kept), strings.Join(res.Summary.Kept, " "))
		}
		_, err = fmt.Fprintln(e.stdout, res.Summary)
		return err
	})
	return cmd
}

func passFail(pass bool) string {
	if pass {
		return "pass"
	}
	return "FAIL"
}

// statusLine rewrites one status line on stderr when it is a terminal
// (and not with --json); otherwise it says nothing.
type statusLine struct {
	e  *env
	on bool
}

func (e *env) newStatusLine() *statusLine {
	return &statusLine{e: e, on: !e.json && isTerminal(e.stderr)}
}

func (p *statusLine) printf(format string, args ...any) {
	if p.on {
		fmt.Fprintf(p.e.stderr, "\r\033[K"+format, args...)
	}
}

func (p *statusLine) clear() {
	if p.on {
		fmt.Fprint(p.e.stderr, "\r\033[K")
	}
}
