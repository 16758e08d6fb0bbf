package main

import (
	"fmt"
	"strings"
	"time"

	"sbx.dev/sbx/internal/flaky"
)

var flakeRateCommand = &command{
	name:    "flake-rate",
	usage:   "flake-rate (--from SNAPSHOT | ID) -n N [--parallel P] [--seed-env VAR] [--keep-failures] [--timeout D] -- TEST_CMD [ARGS...]",
	summary: "run a test once in each of N memory forks of one state, each with its own seed; print the failure rate",
	run:     runFlakeRate,
}

func runFlakeRate(e *env, args []string) error {
	fs := e.flags("flake-rate")
	from := fs.String("from", "", "start from this snapshot instead of a sandbox")
	n := fs.Int("n", 0, "how many forks, one run each")
	parallel := fs.Int("parallel", flaky.DefaultParallel, "how many runs at once")
	seedEnv := fs.String("seed-env", flaky.DefaultSeedEnv, "the environment variable each run's seed is passed in")
	keep := fs.Bool("keep-failures", false, "keep the forks whose run failed, and print their ids")
	timeout := fs.String("timeout", "", "kill a run after this long (a failure), e.g. 5m")
	pos, err := parseFlags(fs, args)
	if err != nil {
		return err
	}
	o := flaky.RateOptions{From: *from, N: *n, Parallel: *parallel, KeepFailures: *keep}
	if *from == "" {
		if len(pos) < 2 {
			return usagef("flake-rate takes a sandbox id (or --from SNAPSHOT) and a test command")
		}
		o.Sandbox, pos = pos[0], pos[1:]
	}
	if len(pos) == 0 {
		return usagef("flake-rate takes a test command after --")
	}
	if *n < 1 {
		return usagef("-n %d: want at least 1 run", *n)
	}
	if *parallel < 1 {
		return usagef("--parallel %d: want at least 1", *parallel)
	}
	if *seedEnv == "" || strings.ContainsAny(*seedEnv, "= ") {
		return usagef("--seed-env %q: want a variable name", *seedEnv)
	}
	o.Test = flaky.Test{Cmd: shellWrap(pos), SeedEnv: *seedEnv, Timeout: *timeout}
	c, err := e.client()
	if err != nil {
		return err
	}
	// forks are made while runs go: one status line tells both
	p := e.newStatusLine()
	forked, done, failed := 0, 0, 0
	status := func() { p.printf("forked %d/%d, ran %d/%d, %d failed", forked, *n, done, *n, failed) }
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
	res, err := flaky.FlakeRate(e.ctx, c, o)
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
