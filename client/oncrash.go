package client

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"syscall"
	"time"

	"sbx.dev/sbx/api"
	"sbx.dev/sbx/internal/wire/freezewire"
)

// An exec with WithOnCrash. Every sandbox holds a process that gets a
// signal whose default action dumps core (and has no handler for it) at its
// faulting instruction and freezes the sandbox: one such capture per boot
// (gVisor arms one application checkpoint per boot); later crashes of the
// boot are counted and end at once. The exec runs as any other, nothing
// traces it; once it ends, the capture of a crash of its process tree is
// looked up in what the sandbox says of its last freeze, and waited for in
// sbxd's events.

// Where the sandbox's init keeps the record of the boot's freeze and the
// count of its crashes (agentwire.FreezeRecordFile, internal/agent.CrashDir).
const (
	freezeRecordPath = "/run/sbx/freeze/record.json"
	crashCountPath   = "/run/sbx/crashes/count"
)

// crashWait bounds the wait for sbxd to record a capture the sandbox made
// (it is recorded before the crashed process is let go, so it is there at
// once unless sbxd is slow to move the image); a variable for tests.
var crashWait = 2 * time.Minute

// crashSlack is how far a crash's time may lie outside its exec's start
// and end (two clocks that read the host's, sbxd's and the sandbox's).
const crashSlack = 2 * time.Second

// WithOnCrash has Exec report a crash of the command or of any process it
// started: when one of them died of a signal that dumps core, Exec waits
// for the sandbox's capture of it and returns it as Result.Crash (a
// snapshot with the process held at its faulting instruction: see
// Sandbox.Crashes); when the boot's one capture was spent before, on an
// earlier crash or freeze, Result.CrashMissed says by which. With Start it
// only checks that the sandbox catches crashes: a detached command's crash
// is read later with Sandbox.Crashes. A sandbox made with crash capture off
// (api.MetaCrashes "off") is api.ErrInvalid, before anything runs.
func WithOnCrash() ExecOption { return execFunc(func(c *execConfig) { c.onCrash = true }) }

// checkCrashes refuses a sandbox that does not catch crashes and returns
// its count of crashes so far (-1 if it does not say).
func (s *Sandbox) checkCrashes(ctx context.Context, op string) (int, error) {
	sb, err := s.Info(ctx)
	if err != nil {
		return 0, err
	}
	if sb.Meta[api.MetaCrashes] == "off" {
		return 0, api.Errorf(api.ErrInvalid, "%s in %s: the sandbox was made with crash capture off (meta %s=off, sbx new --no-crash-capture): it catches no crash; run it in a sandbox made without that", op, s.id, api.MetaCrashes)
	}
	return s.crashCount(ctx), nil
}

// crashCount is the sandbox's count of crashes since it started (0 before
// the first: init writes the file then), -1 if it does not say.
func (s *Sandbox) crashCount(ctx context.Context) int {
	b, err := s.Files().ReadFile(ctx, crashCountPath, 64)
	if errors.Is(err, api.ErrNotFound) {
		return 0
	}
	if err != nil {
		return -1
	}
	n, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || n < 0 {
		return -1
	}
	return n
}

// ofExec reports whether r, what the sandbox's init says of the boot's
// last freeze, is of a crash of res's process tree, during res.
func ofExec(r freezewire.Record, res *Result) bool {
	if r.Crash == nil || r.Name == "" {
		return false
	}
	c := Crash{Pid: r.Pid, Pgid: r.Crash.Pgid, Ancestors: r.Crash.Ancestors}
	// an exec whose pid is not known is matched by time alone
	return (res.Pid <= 0 || c.Of(res.Pid)) && during(r.FailedAt, res)
}

// during reports whether t falls within res's run (with crashSlack).
func during(t time.Time, res *Result) bool {
	if t.IsZero() || t.Before(res.StartedAt.Add(-crashSlack)) {
		return false
	}
	return res.EndedAt.IsZero() || !t.After(res.EndedAt.Add(crashSlack))
}

// coreSignal reports whether an exit code (128+N, or -N as some paths
// report a death by signal N) is a death by a signal whose default action
// dumps core.
func coreSignal(code int) (syscall.Signal, bool) {
	if code < 0 {
		code = 128 - code
	}
	if code <= 128 || code >= 128+65 {
		return 0, false
	}
	switch sig := syscall.Signal(code - 128); sig {
	case syscall.SIGSEGV, syscall.SIGBUS, syscall.SIGILL, syscall.SIGFPE, syscall.SIGABRT,
		syscall.SIGTRAP, syscall.SIGSYS, syscall.SIGQUIT, syscall.SIGXCPU, syscall.SIGXFSZ:
		return sig, true
	}
	return 0, false
}

// errFound ends the events stream once the crash is seen.
var errFound = errors.New("found")

// findCrash fills res.Crash or res.CrashMissed after an exec with
// WithOnCrash ended. before is the sandbox's crash count before it started.
func (s *Sandbox) findCrash(ctx context.Context, res *Result, before int) error {
	_, died := coreSignal(res.ExitCode)
	after := s.crashCount(ctx)
	crashed := died || before >= 0 && after > before
	if !crashed {
		return nil
	}
	var rec freezewire.Record
	if b, err := s.Files().ReadFile(ctx, freezeRecordPath, 64<<10); err == nil {
		_ = json.Unmarshal(b, &rec)
	}
	if !ofExec(rec, res) {
		if died {
			res.CrashMissed = missedWhy(ctx, s, rec)
		}
		return nil
	}
	if rec.State == "failed" || rec.State == "unsupported" {
		res.CrashMissed = fmt.Sprintf("the sandbox could not capture the crash of %d (%s): %s", rec.Pid, rec.Crash.Signal, rec.Error)
		return nil
	}
	// the capture is the sandbox's; sbxd records it before the process
	// is let go, or soon after
	wctx, cancel := context.WithTimeout(ctx, crashWait)
	defer cancel()
	var why string
	err := s.Events(wctx, func(ev api.Event) error {
		if ev.Type != "frozen" || ev.Detail["name"] != rec.Name {
			return nil
		}
		if c, ok := crashOf(ev); ok {
			res.Crash = &c
			return errFound
		}
		why, _ = ev.Detail["error"].(string)
		return errFound
	}, Follow())
	switch {
	case res.Crash != nil:
		return nil
	case errors.Is(err, errFound):
		res.CrashMissed = fmt.Sprintf("the sandbox caught the crash of %d (%s) as %s, but sbxd could not keep it: %s", rec.Pid, rec.Crash.Signal, rec.Name, why)
		return nil
	case ctx.Err() != nil:
		return ctx.Err()
	case wctx.Err() != nil:
		res.CrashMissed = fmt.Sprintf("the sandbox caught the crash of %d (%s) as %s, but sbxd had not recorded it after %s (it may yet: sbx crashes %s)", rec.Pid, rec.Crash.Signal, rec.Name, crashWait, s.id)
		return nil
	}
	return fmt.Errorf("exec %s in %s: wait for its crash's capture %s: %w", res.ID, s.id, rec.Name, err)
}

// missedWhy says why a crash of an exec was not caught: the boot's capture
// was spent on rec (a crash's or a freeze's), or no freeze was made.
func missedWhy(ctx context.Context, s *Sandbox, rec freezewire.Record) string {
	const one = "a sandbox catches one crash per boot (gVisor arms one capture per boot): after sbx stop and sbx resume, in a copy, or in a new sandbox the next is caught"
	switch {
	case rec.Name == "":
		return "the sandbox made no capture of it (see sbx logs " + s.id + " --stream console)"
	case rec.Crash != nil:
		at := ""
		if crs, err := s.Crashes(ctx); err == nil {
			for _, c := range crs {
				if c.Snapshot == rec.Name {
					at = " at " + c.At.UTC().Format(time.RFC3339)
				}
			}
		}
		return fmt.Sprintf("not caught: this boot's capture was spent on an earlier crash, of %d (%s, %s)%s, snapshot %s; %s",
			rec.Pid, rec.Crash.Exe, rec.Crash.Signal, at, rec.Name, one)
	default:
		return fmt.Sprintf("not caught: this boot's capture was spent on the freeze %s (%s); %s", rec.Name, strings.TrimSpace(rec.Reason+" "+rec.Cmd), one)
	}
}
