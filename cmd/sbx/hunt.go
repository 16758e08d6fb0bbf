package main

import (
	"crypto/rand"
	"encoding/hex"
	"flag"
	"fmt"
	"os"
	"strings"
	"time"

	"sbx.dev/sbx/internal/flaky"
)

var huntCommand = &command{
	name: "hunt",
	usage: "hunt [--template T | --from SNAPSHOT] [--setup CMD] [--runs N] [--seed-env VAR] [--collect PATH]... [--on-crash] [--timeout D] [--name N] [--out DIR] -- TEST_CMD [ARGS...]\n" +
		"       sbx hunt --attach NAME [--out DIR]",
	summary: "loop a test inside a sandbox until it fails, then keep the evidence: files, a fork, a snapshot, the live processes",
	run:     runHunt,
}

func runHunt(e *env, args []string) error {
	fs := e.flags("hunt")
	template := fs.String("template", "", "the template the sandbox boots from")
	from := fs.String("from", "", "make the sandbox from this snapshot instead (the current directory is not copied)")
	setup := fs.String("setup", "", "a shell command run once in /work before the loop")
	runs := fs.Int("runs", flaky.DefaultHuntRuns, "the most runs before giving up")
	seedEnv := fs.String("seed-env", flaky.DefaultSeedEnv, "the environment variable each run's seed is passed in")
	var collect listFlag
	fs.Var(&collect, "collect", "a path inside the sandbox (relative to /work, or absolute) to keep on a failure, under collected/ by its absolute path; repeatable")
	name := fs.String("name", "", "the name of the sandbox and snapshot (default hunt-RANDOM)")
	out := fs.String("out", "", "the local folder for the evidence (default ./sbx-hunt-NAME)")
	attach := fs.String("attach", "", "pick up the hunt in the sandbox NAME")
	timeout := fs.Duration("timeout", 0, "a run that lasts longer fails (exit 124) and is captured while it hangs, its processes alive, e.g. 2m")
	onCrash := fs.Bool("on-crash", false, "run each run under gdb; a run that dies of a fatal signal leaves a crash bundle (backtrace, core, binary, libraries) in the artifacts")
	pos, err := parseFlags(fs, args)
	if err != nil {
		return err
	}
	if *seedEnv == "" || strings.ContainsAny(*seedEnv, "= '\"$") {
		return usagef("--seed-env %q: want a variable name", *seedEnv)
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
			p.printf("run %d passed (seed %s)", ev.Run, ev.Seed)
		case "failed":
			p.clear()
			fmt.Fprintf(e.stderr, "run %d FAILED (seed %s, exit %d); capturing\n", ev.Run, ev.Seed, *ev.ExitCode)
		}
	}
	var s *flaky.HuntSummary
	if *attach != "" {
		if len(pos) > 0 || *template != "" || *from != "" || *setup != "" || *onCrash || *timeout != 0 {
			return usagef("hunt --attach takes only a name (and --out)")
		}
		a := flaky.AttachOptions{Name: *attach, OutDir: *out, Event: event}
		fs.Visit(func(f *flag.Flag) {
			if f.Name == "seed-env" {
				a.SeedEnv = *seedEnv // else the one the hunt noted
			}
		})
		s, err = flaky.Attach(e.ctx, c, a)
	} else {
		if len(pos) == 0 {
			return usagef("hunt takes a test command after --")
		}
		if *template != "" && *from != "" {
			return usagef("give --template or --from, not both")
		}
		if *runs < 1 {
			return usagef("--runs %d: want at least 1", *runs)
		}
		if *name == "" {
			b := make([]byte, 3)
			rand.Read(b)
			*name = "hunt-" + hex.EncodeToString(b)
		}
		o := flaky.HuntOptions{
			Name: *name, Template: *template, From: *from, Setup: *setup, Runs: *runs,
			Cmd: shellWrap(pos), SeedEnv: *seedEnv, Collect: collect, OutDir: *out, Event: event,
			OnCrash: *onCrash, Timeout: *timeout,
		}
		if *from == "" {
			wd, err := os.Getwd()
			if err != nil {
				return err
			}
			src := tarDir(wd)
			defer src.Close()
			o.Source = src
		}
		s, err = flaky.Hunt(e.ctx, c, o)
	}
	p.clear()
	if err != nil {
		return err
	}
	if e.json {
		return e.printJSONLine(flaky.HuntEvent{Event: "summary", Sandbox: s.Sandbox, Summary: s})
	}
	return printHunt(e, s)
}

func printHunt(e *env, s *flaky.HuntSummary) error {
	if !s.Failed {
		_, err := fmt.Fprintf(e.stdout, "no failure in %d runs; deleted sandbox %s\n", s.Runs, s.Sandbox)
		return err
	}
	var b strings.Builder
	if s.Run > 0 {
		how := fmt.Sprintf("exit %d", s.ExitCode)
		if s.TimedOut {
			how = "timed out; captured while it ran"
		}
		fmt.Fprintf(&b, "run %d failed (seed %s, %s) at %s\n", s.Run, s.Seed, how, s.FailedAt.Local().Format(time.RFC3339Nano))
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
		fmt.Fprintf(tw, "%s\t%s\n", l[0], l[1])
	}
	if _, err := fmt.Fprint(e.stdout, b.String()); err != nil {
		return err
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if cr := s.Crash; cr != nil {
		fmt.Fprintf(e.stdout, "crash: %s; the bundle is %s\n%s", cr.SignalName, cr.Tar, cr.Backtrace)
		if !strings.HasSuffix(cr.Backtrace, "\n") {
			fmt.Fprintln(e.stdout)
		}
	}
	fmt.Fprintln(e.stdout, "next:")
	labels := []string{"resume", "fork", "replay"}
	for i, cmd := range s.Commands {
		l := ""
		if i < len(labels) {
			l = labels[i]
		}
		fmt.Fprintf(e.stdout, "  %-7s %s\n", l, cmd)
	}
	return nil
}
