package main

import (
	"fmt"
	"strconv"
	"strings"

	"sbx.dev/sbx/internal/flaky"
)

var replayCommand = &command{
	name:    "replay",
	usage:   "replay SNAPSHOT --seed S [-n N] [--parallel P] [--seed-env VAR] [--timeout D] -- TEST_CMD [ARGS...]",
	summary: "run a test with one seed N times, each in a fresh sandbox from a snapshot; print the pass/fail pattern",
	run:     runReplay,
}

func runReplay(e *env, args []string) error {
	fs := e.flags("replay")
	seed := fs.String("seed", "", "the seed every run gets (a uint32)")
	n := fs.Int("n", flaky.DefaultReplays, "how many runs")
	parallel := fs.Int("parallel", flaky.DefaultParallel, "how many runs at once")
	seedEnv := fs.String("seed-env", flaky.DefaultSeedEnv, "the environment variable the seed is passed in")
	timeout := fs.String("timeout", "", "kill a run after this long (a failure), e.g. 5m")
	pos, err := parseFlags(fs, args)
	if err != nil {
		return err
	}
	if len(pos) < 2 {
		return usagef("replay takes a snapshot name and a test command")
	}
	if *seed == "" {
		return usagef("replay needs --seed S")
	}
	s, err := strconv.ParseUint(*seed, 10, 32)
	if err != nil {
		return usagef("--seed %q: want a number from 0 to %d", *seed, uint32(1<<32-1))
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
	o := flaky.ReplayOptions{
		Snapshot: pos[0], Seed: uint32(s), N: *n, Parallel: *parallel,
		Test: flaky.Test{Cmd: shellWrap(pos[1:]), SeedEnv: *seedEnv, Timeout: *timeout},
	}
	c, err := e.client()
	if err != nil {
		return err
	}
	p := e.newStatusLine()
	done, failed := 0, 0
	o.Progress = func(r flaky.Run) {
		done++
		if !r.Pass {
			failed++
		}
		if e.json {
			e.printJSONLine(r)
			return
		}
		p.printf("ran %d/%d, %d failed", done, *n, failed)
	}
	res, err := flaky.Replay(e.ctx, c, o)
	p.clear()
	if err != nil {
		return err
	}
	if e.json {
		return e.printJSONLine(res.Summary)
	}
	_, err = fmt.Fprintf(e.stdout, "%s\n%s\n", res.Summary.Pattern, res.Summary)
	return err
}
