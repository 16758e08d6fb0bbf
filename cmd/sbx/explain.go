package main

import (
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"sbx.dev/sbx/api"
	"sbx.dev/sbx/internal/explain"
	"sbx.dev/sbx/internal/flaky"
)

// defaultExplainTimeout bounds a run of explain unless --timeout says
// otherwise: the defaults suit a small test, and a run that hangs fails.
const defaultExplainTimeout = 10 * time.Minute

func newExplainCmd(e *env) *cobra.Command {
	var (
		from, seedEnv       string
		n, parallel         int
		envs, knobEnv       []string
		cpus, fixedCmd      string
		netDelays, netLoss  string
		report, offsets     string
		pnrParents, pnrWays int
		knobRuns            int
	)
	cmd := &cobra.Command{
		Use:   "explain [flags] (--from SNAPSHOT | ID) [--] TEST_CMD [ARGS...]",
		Short: "run a test in N monitored memory forks and say what its failing runs did that its passing runs did not",
		Long: "explain runs the test once in each of N memory forks of one ready state, as\n" +
			"flake-rate does, with gVisor's runtime monitoring on in each, and prints the\n" +
			"failure rate with its 95% Wilson interval and the divergence: the syscalls on\n" +
			"files and sockets, execs and exits (and the order of two calls on one path or\n" +
			"port) that tell failing runs from passing ones, ranked by Fisher's exact test,\n" +
			"each with one run's events and their times from the run's start.\n" +
			"The test command owns everything from its first word on.",
		Example: "  sbx explain --from ready-state -n 24 -- 'cd /work && ./test.sh'\n" +
			"  sbx --json explain ready -- ./test.sh | tail -1 | jq .divergence[0]",
		Args: cobra.ArbitraryArgs,
	}
	cmd.Flags().SetInterspersed(false)
	fs := cmd.Flags()
	fs.StringVar(&from, "from", "", "start from this snapshot instead of a sandbox")
	fs.IntVarP(&n, "runs", "n", explain.DefaultRuns, "how many forks, one run each")
	fs.IntVar(&parallel, "parallel", flaky.DefaultParallel, "how many runs at once")
	fs.StringVar(&seedEnv, "seed-env", flaky.DefaultSeedEnv, "the environment variable each run's seed is passed in")
	fs.StringArrayVar(&envs, "env", nil, "KEY=VALUE added to every run's environment (repeatable)")
	fs.StringVar(&cpus, "cpus", "0.25,0.5,1,2", `knob: the CPU quotas per fork to measure the rate at, comma-separated ("none": no CPU knob)`)
	fs.StringVar(&netDelays, "net-delay", "0,100ms", `knob: delays of each packet leaving a fork to measure the rate at, comma-separated ("none": no delay knob)`)
	fs.StringVar(&netLoss, "net-loss", "0,10%", `knob: shares of the packets leaving a fork to drop, comma-separated, as 0.1 or 10% ("none": no loss knob)`)
	fs.StringArrayVar(&knobEnv, "knob-env", nil, "knob: KEY=VALUE to measure the rate with, against the variable unchanged (repeatable, e.g. GOMAXPROCS=1)")
	fs.IntVar(&knobRuns, "knob-runs", explain.DefaultKnobRuns, "runs per knob value (0: no knobs)")
	fs.StringVar(&offsets, "offsets", "", "point of no return: the offsets from a run's start to capture at, in ms, comma-separated (default: 0 and each quarter of the failing runs' median time)")
	fs.IntVar(&pnrParents, "pnr-parents", explain.DefaultPNRParents, "point of no return: runs captured at each offset (0: no point of no return)")
	fs.IntVar(&pnrWays, "pnr-ways", explain.DefaultPNRWays, "point of no return: forks of each capture")
	fs.StringVar(&report, "report", "", "write the report, one self-contained HTML file with its plots, to this path")
	fs.StringVar(&fixedCmd, "fixed", "", "verify a fix: run this fixed test (a shell command) as many times as prove it at 99% against the measured rate")
	timeout := durationVar(fs, "timeout", "kill a run after this long (a failure), e.g. 5m or 300 (seconds); 0: none (default "+defaultExplainTimeout.String()+")")
	cmd.RunE = remote(func(cmd *cobra.Command, args []string) error {
		fixed := 1
		if from != "" {
			fixed = 0
		}
		pos, command, err := remoteArgs(cmd, args, fixed)
		if err != nil {
			return err
		}
		o := explain.Options{From: from, N: n, Parallel: parallel}
		if from == "" {
			if len(pos) == 0 || len(command) == 0 {
				return usagef("explain takes a sandbox id (or --from SNAPSHOT) and a test command")
			}
			o.Sandbox = pos[0]
		}
		switch {
		case len(command) == 0:
			return usagef("explain takes a test command (after its flags, or after --)")
		case n < 2 || n > explain.MaxRuns:
			return usagef("-n %d: want 2 runs (a failing and a passing one to compare) to %d", n, explain.MaxRuns)
		case parallel < 1 || parallel > flaky.MaxParallel:
			return usagef("--parallel %d: want 1 to %d runs at once", parallel, flaky.MaxParallel)
		case seedEnv == "" || strings.ContainsAny(seedEnv, "= "):
			return usagef("--seed-env %q: want a variable name", seedEnv)
		}
		for _, kv := range envs {
			if k, _, ok := strings.Cut(kv, "="); !ok || k == "" || strings.ContainsAny(k, " \n") {
				return usagef("--env %q: want KEY=VALUE", kv)
			}
		}
		if !timeout.set {
			// a hang is a failure, not a wait for ever: explain runs many
			timeout.Duration, timeout.set = api.Duration(defaultExplainTimeout), true
		}
		o.Test = flaky.Test{Cmd: shellWrap(command), SeedEnv: seedEnv, Timeout: timeout.Duration, Env: envs}
		if fixedCmd != "" {
			o.Fixed = &flaky.Test{Cmd: shellWrap([]string{fixedCmd}), SeedEnv: seedEnv, Timeout: timeout.Duration, Env: envs}
		}
		if pnrParents < 0 || pnrParents > explain.MaxRuns || pnrWays < 1 || pnrWays > api.MaxForks {
			return usagef("--pnr-parents %d, --pnr-ways %d: want 0 to %d runs and 1 to %d forks", pnrParents, pnrWays, explain.MaxRuns, api.MaxForks)
		}
		if pnrParents > 0 {
			po := &explain.PNROptions{Parents: pnrParents, Ways: pnrWays}
			if offsets != "" {
				for _, f := range strings.Split(offsets, ",") {
					ms, err := strconv.ParseFloat(strings.TrimSpace(f), 64)
					if err != nil || !(ms >= 0 && ms <= 3600e3) { // NaN too
						return usagef("--offsets %q: want milliseconds from 0, comma-separated, e.g. 0,100,250", offsets)
					}
					po.Offsets = append(po.Offsets, time.Duration(ms*float64(time.Millisecond)))
				}
			}
			o.PNR = po
		}
		if knobRuns < 0 || knobRuns > explain.MaxRuns {
			return usagef("--knob-runs %d: want 0 (no knobs) to %d", knobRuns, explain.MaxRuns)
		}
		if knobRuns > 0 {
			knobs, err := parseKnobs(cpus, netDelays, netLoss, knobEnv)
			if err != nil {
				return err
			}
			o.Knobs, o.KnobRuns = knobs, knobRuns
		}
		if report != "" {
			if err := explain.CheckReportPath(report); err != nil {
				return err
			}
		}
		c, err := e.client()
		if err != nil {
			return err
		}
		p := e.newStatusLine()
		forked, done, failed := 0, 0, 0
		o.Progress = func(ev explain.Progress) {
			if e.json {
				e.printJSONLine(ev)
				return
			}
			switch ev.Event {
			case "forked":
				forked = ev.Ready
			case "run":
				done++
				if !ev.Pass {
					failed++
				}
			case "knob":
				p.printf("explain: knob %s=%s: %d/%d failed", ev.Knob.Knob, ev.Knob.Value, ev.Knob.Failed, ev.Knob.Runs)
				return
			}
			p.printf("explain: forked %d/%d, ran %d/%d, %d failed", forked, n, done, n, failed)
		}
		res, err := explain.Explain(e.ctx, explainClient{flaky.Adapt(c)}, o)
		p.clear()
		if err != nil {
			return err
		}
		// a report that cannot be written after all still leaves what
		// was measured printed
		var reportErr error
		if report != "" {
			if reportErr = writeReport(report, res); reportErr == nil {
				res.Report = report
			}
		}
		if e.json {
			return errors.Join(e.printJSONLine(res), reportErr)
		}
		return errors.Join(printExplained(e.stdout, res), reportErr)
	})
	return cmd
}

// parseKnobs reads the knob flags: CPU quotas, delays and losses of the
// packets leaving a fork, and KEY=VALUE variables (each variable also
// measured unchanged, to compare with).
func parseKnobs(cpus, delays, losses string, env []string) ([]explain.KnobValue, error) {
	var out []explain.KnobValue
	if cpus != "" && cpus != "none" {
		for _, f := range strings.Split(cpus, ",") {
			v, err := strconv.ParseFloat(strings.TrimSpace(f), 64)
			if err != nil || !(v > 0 && v <= 1024) { // NaN, Inf too
				return nil, usagef("--cpus %q: want CPU quotas above 0, comma-separated, e.g. 0.25,1,2", cpus)
			}
			out = append(out, explain.KnobValue{Knob: "cpus", Value: strconv.FormatFloat(v, 'g', -1, 64), CPUs: v})
		}
	}
	if delays != "" && delays != "none" {
		for _, f := range strings.Split(delays, ",") {
			d, err := parseDuration(f)
			if err != nil || d > api.MaxNetDelay {
				return nil, usagef("--net-delay %q: want delays from 0 to %s, comma-separated, e.g. 0,100ms,1s", delays, api.MaxNetDelay)
			}
			sh := &api.NetShape{Delay: api.Duration(d)}
			out = append(out, explain.KnobValue{Knob: "net-delay", Value: d.String(), Shape: sh})
		}
	}
	if losses != "" && losses != "none" {
		for _, f := range strings.Split(losses, ",") {
			var l lossFlag
			if err := l.Set(f); err != nil {
				return nil, usagef("--net-loss %q: %v", losses, err)
			}
			out = append(out, explain.KnobValue{Knob: "net-loss", Value: strconv.FormatFloat(100*l.p, 'g', -1, 64) + "%", Shape: &api.NetShape{Loss: l.p}})
		}
	}
	seen := map[string]bool{}
	for _, kv := range env {
		k, _, ok := strings.Cut(kv, "=")
		if !ok || k == "" || strings.ContainsAny(k, " \n") {
			return nil, usagef("--knob-env %q: want KEY=VALUE", kv)
		}
		if !seen[k] {
			seen[k] = true
			out = append(out, explain.KnobValue{Knob: k, Value: "(unchanged)"})
		}
		out = append(out, explain.KnobValue{Knob: k, Value: kv[len(k)+1:], Env: []string{kv}})
	}
	return out, nil
}

// writeReport writes the HTML report to path, whole or not at all.
func writeReport(path string, r *explain.Explained) error { return explain.WriteReportFile(path, r) }

// explainClient is the SDK as explain's Client.
type explainClient struct{ flaky.SDK }

var _ explain.PNRClient = explainClient{}

// terminalFindings is how many findings the terminal shows (--json and
// the report have them all).
const terminalFindings = 5

// printExplained is the short terminal summary of what explain found:
// the rate, the top findings, the knobs, the point of no return, the fix.
func printExplained(w io.Writer, r *explain.Explained) error {
	fmt.Fprintln(w, flaky.RateSummary{Runs: r.Runs, Failures: r.Failed, Rate: r.Rate.Rate, Wilson95: [2]float64{r.Rate.Low, r.Rate.High}})
	if r.Note != "" {
		fmt.Fprintln(w, r.Note)
	}
	if r.Dropped > 0 {
		fmt.Fprintf(w, "the traces lost %d events (a run's trace keeps its first ones)\n", r.Dropped)
	}
	if r.Empty > 0 {
		fmt.Fprintf(w, "%d runs' traces held nothing of their test\n", r.Empty)
	}
	switch {
	case len(r.Divergence) > 0:
		fmt.Fprintln(w, "what tells failing runs from passing runs (best first):")
	case r.Note == "":
		fmt.Fprintln(w, "no event told the failing runs from the passing ones")
	}
	for i, f := range r.Divergence[:min(terminalFindings, len(r.Divergence))] {
		side := "failing runs did this"
		if !f.InFailing {
			side = "passing runs did this"
		}
		fmt.Fprintf(w, "%2d. %s\n    %s: failing %d/%d, passing %d/%d (Fisher p=%.2g)\n", i+1, safe(f.Summary), side,
			f.Failing, f.FailingRuns, f.Passing, f.PassingRuns, f.P)
		ex := f.Example
		if len(ex.Events) > 0 {
			outcome := "passed"
			if ex.Failed {
				outcome = "failed"
			}
			var parts []string
			for _, ev := range ex.Events {
				parts = append(parts, fmt.Sprintf("%.1f ms %s[%d] %s", ev.AtMs, safe(ev.Process), ev.Pid, safe(ev.Event)))
			}
			fmt.Fprintf(w, "    e.g. run %d (seed %d, %s): %s\n", ex.Run, ex.Seed, outcome, strings.Join(parts, "; then "))
			if ex.Note != "" {
				fmt.Fprintf(w, "    (%s)\n", safe(ex.Note))
			}
		}
	}
	if len(r.Divergence) > terminalFindings {
		fmt.Fprintf(w, "    ... %d more (--json, --report)\n", len(r.Divergence)-terminalFindings)
	}
	if len(r.Knobs) > 0 {
		fmt.Fprintln(w, "knobs (the rate per fork, 95% Wilson interval):")
		for _, k := range r.Knobs {
			fmt.Fprintf(w, "    %s=%s: %d/%d failed, %.0f%% [%.0f, %.0f]\n", safe(k.Knob), safe(k.Value), k.Failed, k.Runs, 100*k.Rate, 100*k.Low, 100*k.High)
		}
		for _, v := range r.KnobVerdicts {
			fmt.Fprintf(w, "    %s\n", safe(v.Summary))
		}
	}
	for _, k := range r.KnobSkipped {
		fmt.Fprintf(w, "knob not measured: %s\n", safe(k))
	}
	if pn := r.PointOfNoReturn; pn != nil {
		fmt.Fprintln(w, "point of no return (forks of failing runs, captured at an offset from their start):")
		for _, p := range pn.Curve {
			fmt.Fprintf(w, "    at %6.0f ms: %d/%d forks of %d failing runs failed, %.0f%% [%.0f, %.0f]\n", p.AtMs, p.Failed, p.Runs, p.Parents, 100*p.Rate, 100*p.Low, 100*p.High)
			if p.Ended > 0 {
				fmt.Fprintf(w, "        (%d runs had ended before it: nothing to fork)\n", p.Ended)
			}
		}
		fmt.Fprintf(w, "    %s; a capture paused a run %.0f ms at most\n", safe(pn.Note), pn.PauseMs)
		for _, e := range pn.Before {
			fmt.Fprintf(w, "      %.1f ms %s[%d] %s\n", e.AtMs, safe(e.Process), e.Pid, safe(e.Event))
		}
	}
	if r.Fix != nil {
		fmt.Fprintf(w, "fix: %s\n", safe(r.Fix.Summary))
	}
	if r.Report != "" {
		fmt.Fprintf(w, "report: %s\n", safe(r.Report))
	}
	return nil
}
