package main

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/spf13/cobra"

	"sbx.dev/sbx/internal/flaky"
)

func newReplayCmd(e *env) *cobra.Command {
	var (
		seed, seedEnv string
		n, parallel   int
	)
	cmd := &cobra.Command{
		Use:     "replay [flags] SNAPSHOT [--] TEST_CMD [ARGS...]",
		Short:   "run a test with one seed N times, each in a fresh sandbox from a snapshot; print the pass/fail pattern",
		Example: "  sbx replay ready-state --seed 3141592653 -n 12 -- 'cd /work && ./test.sh'",
		Args:    cobra.ArbitraryArgs,
	}
	cmd.Flags().SetInterspersed(false)
	fs := cmd.Flags()
	fs.StringVar(&seed, "seed", "", "the seed every run gets (a uint32)")
	fs.IntVarP(&n, "runs", "n", flaky.DefaultReplays, "how many runs")
	fs.IntVar(&parallel, "parallel", flaky.DefaultParallel, "how many runs at once")
	fs.StringVar(&seedEnv, "seed-env", flaky.DefaultSeedEnv, "the environment variable the seed is passed in")
	timeout := durationVar(fs, "timeout", "kill a run after this long (a failure), e.g. 5m or 300 (seconds)")
	cmd.RunE = remote(func(cmd *cobra.Command, args []string) error {
		pos, command, err := remoteArgs(cmd, args, 1)
		if err != nil {
			return err
		}
		if len(pos) == 0 || len(command) == 0 {
			return usagef("replay takes a snapshot name and a test command")
		}
		if seed == "" {
			return usagef("replay needs --seed S")
		}
		s, err := strconv.ParseUint(seed, 10, 32)
		switch {
		case err != nil:
			return usagef("--seed %q: want a number from 0 to %d", seed, uint32(1<<32-1))
		case n < 1:
			return usagef("-n %d: want at least 1 run", n)
		case parallel < 1 || parallel > flaky.MaxParallel:
			return usagef("--parallel %d: want 1 to %d runs at once", parallel, flaky.MaxParallel)
		case seedEnv == "" || strings.ContainsAny(seedEnv, "= "):
			return usagef("--seed-env %q: want a variable name", seedEnv)
		}
		o := flaky.ReplayOptions{
			Snapshot: pos[0], Seed: uint32(s), N: n, Parallel: parallel,
			Test: flaky.Test{Cmd: shellWrap(command), SeedEnv: seedEnv, Timeout: timeout.Duration},
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
			p.printf("ran %d/%d, %d failed", done, n, failed)
		}
		res, err := flaky.Replay(e.ctx, flaky.Adapt(c), o)
		p.clear()
		if err != nil {
			return err
		}
		if e.json {
			return e.printJSONLine(res.Summary)
		}
		_, err = fmt.Fprintf(e.stdout, "%s\n%s\n", res.Summary.Pattern, res.Summary)
		return err
	})
	return cmd
}
