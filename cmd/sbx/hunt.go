package main

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"sbx.dev/sbx/client"
	"sbx.dev/sbx/internal/flaky"
)

func newHuntCmd(e *env) *cobra.Command {
	var (
		template, from, setup, seedEnv, name, out, attach, user string
		runs                                                    int
		collect                                                 []string
		onCrash, freeze                                         bool
	)
	cmd := &cobra.Command{
		Use:   "hunt [flags] [--] TEST_CMD [ARGS...]\n  sbx hunt --attach NAME [--out DIR]",
		Short: "loop a test inside a sandbox until it fails, then keep the evidence: files, a fork, a snapshot, the live processes",
		Long: "hunt copies the current directory into a new sandbox (/work), runs --setup once, and\n" +
			"loops the test inside the sandbox, each run with a fresh seed in $SEED, until a run\n" +
			"fails. Then it keeps the evidence: the failing run's output and processes, a disk\n" +
			"fork, the artifacts in ./sbx-hunt-NAME, a snapshot, and a stop that keeps memory.\n" +
			"The test command owns everything from its first word on.\n\n" +
			"Every sandbox catches its first crash of a boot at the faulting instruction\n" +
			"(sbx crashes); --on-crash ends the hunt at the run it happened in and writes\n" +
			"that capture's bundle into the artifacts, read in a copy of the capture (by\n" +
			"its gdb, or with none there by sbx-agent gcore and this machine's gdb).",
		Example: "  sbx hunt --template base --setup ./setup.sh --runs 200 --name login -- ./test.sh\n" +
			"  sbx hunt --attach login",
		Args: cobra.ArbitraryArgs,
	}
	cmd.Flags().SetInterspersed(false)
	fs := cmd.Flags()
	fs.StringVar(&template, "template", "", "the template the sandbox boots from")
	fs.StringVar(&from, "from", "", "make the sandbox from this snapshot instead (the current directory is not copied)")
	fs.StringVar(&setup, "setup", "", "a shell command run once in /work before the loop")
	fs.IntVar(&runs, "runs", flaky.DefaultHuntRuns, "the most runs before giving up")
	fs.StringVar(&seedEnv, "seed-env", flaky.DefaultSeedEnv, "the environment variable each run's seed is passed in")
	fs.StringArrayVar(&collect, "collect", nil, "a path inside the sandbox (relative to /work, or absolute) to keep on a failure, under collected/ by its absolute path; repeatable")
	fs.StringVar(&name, "name", "", "the name of the sandbox and snapshot (default hunt-RANDOM)")
	fs.StringVar(&out, "out", "", "the local folder for the evidence (default ./sbx-hunt-NAME)")
	fs.StringVar(&attach, "attach", "", "pick up the hunt in the sandbox NAME")
	fs.StringVarP(&user, "user", "u", "", "run the setup and the test as this user: a name or uid[:gid] (default: the template's user)")
	timeout := durationVar(fs, "timeout", "a run that lasts longer fails (exit 124) and is captured while it hangs, its processes alive, e.g. 2m or 120 (seconds)")
	fs.BoolVar(&onCrash, "on-crash", false, "end the hunt at the first run in which a process crashed (a signal that dumps core), whatever its exit code; the sandbox's capture of that crash, held at its faulting instruction, is the evidence: its bundle (backtrace, core, binary, libraries) goes in the artifacts under crash/. No gdb per run")
	fs.BoolVar(&freeze, "freeze", false, "freeze the sandbox at the failure: pytest (-p sbx_freeze, loaded for you), Go tests using sbx.dev/sbx/freeze and programs calling /.sbx/freeze freeze at their failing instant, anything else as it exits non-zero; the evidence is read from a copy of the frozen machine")
	keepTTL := durationVar(fs, "keep-ttl", fmt.Sprintf("with --freeze: the idle ttl of the frozen machine's copy NAME-frozen (default %s; 0: none; the freeze stays to make another)", flaky.DefaultKeepTTL))
	cmd.RunE = remote(func(cmd *cobra.Command, args []string) error {
		_, command, err := remoteArgs(cmd, args, 0)
		if err != nil {
			return err
		}
		if seedEnv == "" || strings.ContainsAny(seedEnv, "= '\"$") {
			return usagef("--seed-env %q: want a variable name", seedEnv)
		}
		if attach != "" {
			if len(command) > 0 || template != "" || from != "" || setup != "" || onCrash || freeze || timeout.set || keepTTL.set || user != "" {
				return usagef("hunt --attach takes only a name (and --out)")
			}
		} else {
			if len(command) == 0 {
				return usagef("hunt takes a test command (after its flags, or after --)")
			}
			if template != "" && from != "" {
				return usagef("give --template or --from, not both")
			}
			if runs < 1 {
				return usagef("--runs %d: want at least 1", runs)
			}
			if keepTTL.set && !freeze {
				return usagef("--keep-ttl goes with --freeze (it is the ttl of the frozen machine's copy)")
			}
			if freeze && onCrash {
				return usagef("give --freeze or --on-crash, not both: both use the sandbox's one freeze of a boot, and --freeze freezes a crashing run at its crash already")
			}
		}
		c, err := e.client()
		if err != nil {
			return err
		}
		p := e.newStatusLine()
		event := func(ev flaky.HuntEvent) {
			if e.json {
				e.printJSONLine(ev)
				return
			}
			switch ev.Event {
			case "run":
				p.printf("run %d passed (seed %s)", ev.Run, safe(ev.Seed))
			case "failed":
				p.clear()
				fmt.Fprintf(e.stderr, "run %d FAILED (seed %s, exit %d); capturing\n", ev.Run, safe(ev.Seed), *ev.ExitCode)
			case "frozen":
				fmt.Fprintf(e.stderr, "froze the sandbox at the failure: %s; reading the evidence in a copy\n", safe(ev.Snapshot))
			}
		}
		var s *flaky.HuntSummary
		if attach != "" {
			a := flaky.AttachOptions{Name: attach, OutDir: out, Event: event}
			if cmd.Flags().Changed("seed-env") {
				a.SeedEnv = seedEnv // else the one the hunt noted
			}
			s, err = flaky.Attach(e.ctx, flaky.Adapt(c), a)
		} else {
			if name == "" {
				b := make([]byte, 3)
				rand.Read(b)
				name = "hunt-" + hex.EncodeToString(b)
			}
			o := flaky.HuntOptions{
				Name: name, Template: template, From: from, Setup: setup, Runs: runs, User: user,
				Cmd: shellWrap(command), SeedEnv: seedEnv, Collect: collect, OutDir: out, Event: event,
				OnCrash: onCrash, Timeout: timeout.D(), Freeze: freeze, KeepTTL: keepTTL.keep(),
			}
			if from == "" {
				wd, err := os.Getwd()
				if err != nil {
					return err
				}
				src := client.TarDir(wd)
				defer src.Close()
				o.Source = src
			}
			s, err = flaky.Hunt(e.ctx, flaky.Adapt(c), o)
		}
		p.clear()
		if err != nil {
			return err
		}
		if e.json {
			return e.printJSONLine(flaky.HuntEvent{Event: "summary", Sandbox: s.Sandbox, Summary: s})
		}
		return printHunt(e, s)
	})
	return cmd
}

// printHunt prints a hunt's summary. What the sandbox wrote (the seed, the
// crash's signal and backtrace, names) is quoted for the terminal; the
// crash verdict is the sandbox's own word (its gdb).
func printHunt(e *env, s *flaky.HuntSummary) error {
	if !s.Failed {
		_, err := fmt.Fprintf(e.stdout, "no failure in %d runs; deleted sandbox %s\n", s.Runs, s.Sandbox)
		return err
	}
	if s.Frozen != "" {
		return printFrozenHunt(e, s)
	}
	var b strings.Builder
	if s.Run > 0 {
		how := fmt.Sprintf("exit %d", s.ExitCode)
		if s.TimedOut {
			how = "timed out; captured while it ran"
		}
		fmt.Fprintf(&b, "run %d failed (seed %s, %s) at %s\n", s.Run, safe(s.Seed), how, s.FailedAt.Local().Format(time.RFC3339Nano))
		if s.CaptureMs > 0 {
			fmt.Fprintf(&b, "captured %s after the failure\n", (time.Duration(s.CaptureMs) * time.Millisecond).String())
		}
	}
	lines := [][2]string{
		{"sandbox", s.Sandbox + " (" + s.Name + "), stopped with its memory: the leaked processes are kept"},
		{"fork", orDash(s.Fork) + " (a disk copy to poke at)"},
		{"artifacts", orDash(s.Artifacts)},
		{"snapshot", orDash(s.Snapshot) + " (disk)"},
	}
	tw := e.table()
	for _, l := range lines {
		fmt.Fprintf(tw, "%s\t%s\n", l[0], safe(l[1]))
	}
	if _, err := fmt.Fprint(e.stdout, b.String()); err != nil {
		return err
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if cr := s.Crash; cr != nil {
		fmt.Fprintf(e.stdout, "crash: %s, as the sandbox reports it; the bundle is %s\n", safe(cr.SignalName), safe(cr.Tar))
		if cr.Snapshot != "" {
			fmt.Fprintf(e.stdout, "held at its fault in %s: sbx new --from %s, then gdb -p %d\n", safe(cr.Snapshot), safe(cr.Snapshot), cr.Pid)
		}
		fmt.Fprint(e.stdout, safeText(cr.Backtrace))
		if !strings.HasSuffix(cr.Backtrace, "\n") {
			fmt.Fprintln(e.stdout)
		}
		if cr.Truncated != "" {
			fmt.Fprintf(e.stdout, "warning: the crash bundle is cut short: %s\n", cr.Truncated)
		}
	}
	fmt.Fprintln(e.stdout, "next:")
	labels := []string{"resume", "fork", "replay"}
	for i, cmd := range s.Commands {
		l := ""
		if i < len(labels) {
			l = labels[i]
		}
		fmt.Fprintf(e.stdout, "  %-7s %s\n", l, safe(cmd))
	}
	return nil
}

// printFrozenHunt is the summary of a hunt --freeze.
func printFrozenHunt(e *env, s *flaky.HuntSummary) error {
	var b strings.Builder
	fmt.Fprintf(&b, "run %d failed (seed %s, exit %d) at %s\n", s.Run, s.Seed, s.ExitCode, s.FailedAt.Local().Format(time.RFC3339Nano))
	if s.FrozenMs > 0 {
		fmt.Fprintf(&b, "frozen %s after the failure (gVisor took %s)\n", time.Duration(s.FrozenMs)*time.Millisecond, time.Duration(s.PausedMs)*time.Millisecond)
	}
	if _, err := fmt.Fprint(e.stdout, b.String()); err != nil {
		return err
	}
	tw := e.table()
	for _, l := range [][2]string{
		{"frozen", s.Frozen + " (a snapshot with memory: the machine at the failing instant)"},
		{"copy", s.Copy + " (resumed from it, running: the failing test as it was, if it froze itself)"},
		{"artifacts", orDash(s.Artifacts) + " (read in the copy)"},
		{"snapshot", orDash(s.Snapshot) + " (disk, for replay)"},
		{"sandbox", s.Sandbox + " (the original, deleted: its failing run had ended)"},
	} {
		fmt.Fprintf(tw, "%s\t%s\n", l[0], l[1])
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintln(e.stdout, "next:")
	labels := []string{"look", "again", "replay"}
	for i, cmd := range s.Commands {
		l := ""
		if i < len(labels) {
			l = labels[i]
		}
		fmt.Fprintf(e.stdout, "  %-7s %s\n", l, cmd)
	}
	return nil
}
