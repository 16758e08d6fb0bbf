// Package freezewire is what a sandbox's init and sbxd tell each other about
// a freeze: the environment sbxd gives each boot of a sandbox, and the line
// init writes on the console when a freeze has an outcome.
//
// A freeze is gVisor's application-driven checkpoint: a write of "1" to
// /proc/gvisor/checkpoint inside the sandbox makes gVisor write the whole
// sandbox into the files sbxd armed for that boot (the "slot"), with the
// sandbox carrying on after. gVisor arms one such checkpoint per start of
// a sandbox (runsc run or restore), so a slot is used once.
//
// sbxd names the slot and the snapshot a freeze becomes in the boot's spec
// environment, which the sandbox reads from /proc/gvisor/spec_environ (it
// is the current boot's, also in a copy restored from a freeze). init,
// which does every freeze, writes the outcome on its stdout as one control
// line, Prefix + JSON + "\n". Its stdout is the sandbox's console: the
// console shim on the host picks the line out and writes it into the slot
// as VerdictFile, and sbxd, watching the slot, looks at the freeze.
//
// A control line is a hint, never proof: root inside can write one too
// (to /proc/1/fd/1). sbxd decides from what gVisor left in the slot, which
// nothing inside can write: gVisor (as sbx builds it) closes a slot's files
// when its checkpoint is done, and empties the state file of one that
// failed. So a slot whose files the sandbox's process holds no more is
// done: whole if its state file has content, failed if not. The line gives
// only what the sandbox says of it (who asked, why, when, a crash).
//
// sbxd answers in the sandbox's read-only bind of its etc dir, which only
// sbxd writes: ConfirmDir/SLOT holds a Confirm once sbxd has recorded the
// freeze (or knows it failed). The freeze command says "froze as X" only
// when that file names X.
package freezewire

import (
	"encoding/json"
	"fmt"
	"regexp"
	"strings"
	"time"
	"unicode/utf8"
)

// The spec environment of each boot.
const (
	// SlotEnv is the image id the boot's freeze becomes: its slot.
	SlotEnv = "SBX_FREEZE_SLOT"
	// NameEnv is the name of the snapshot the freeze is recorded as.
	NameEnv = "SBX_FREEZE_NAME"
	// SandboxEnv is the sandbox's id.
	SandboxEnv = "SBX_SANDBOX"
	// RestoredFromEnv is the image this boot was restored from ("" for a
	// boot from the template): a copy tells by it whether it is the copy
	// of a freeze.
	RestoredFromEnv = "SBX_RESTORED_FROM"
)

// Envs are the names of the boot's spec environment, which init keeps
// out of the commands it starts (they hold the first boot's values).
// CrashesEnv, "off" in init's environment, leaves crashes alone: they end
// their process at once, as without sbx (api.MetaCrashes).
const CrashesEnv = "SBX_CRASHES"

var Envs = []string{SlotEnv, NameEnv, SandboxEnv, RestoredFromEnv}

// The files of a slot, on the host: gVisor's three (written by the
// sentry) and the verdict (written by the console shim).
const (
	StateFile     = "checkpoint.img"
	PagesMetaFile = "pages_meta.img"
	PagesFile     = "pages.img"
	VerdictFile   = "verdict"
	// DoneFile is sbxd's own note of what it saw of gVisor's checkpoint
	// in the slot while the sandbox ran: DoneWhole or DoneFailed.
	DoneFile   = "done"
	DoneWhole  = "whole"
	DoneFailed = "failed"
)

// ConfirmDir is where sbxd confirms a freeze to the sandbox: a read-only
// bind of the host dir only sbxd writes (ConfirmSubdir of the sandbox's
// etc dir); ConfirmDir/SLOT holds a Confirm as JSON.
const (
	ConfirmDir    = "/run/sbx/etc/" + ConfirmSubdir
	ConfirmSubdir = "freezes"
)

// Confirm is sbxd's word on a freeze. Result is Frozen (Name is the
// snapshot recorded) or Failed (Reason says why, and nothing was kept).
type Confirm struct {
	Result string `json:"result"`
	Name   string `json:"name,omitempty"`
	Reason string `json:"reason,omitempty"`
}

// ControlByte starts a control line on the console; init replaces it in
// whatever it copies from /dev/console.
const ControlByte = 0x1e

// Prefix starts a freeze's control line.
const Prefix = "\x1esbx-freeze "

// MaxLine bounds a control line, newline included: one write of a pipe
// (PIPE_BUF) is never interleaved with another.
const MaxLine = 4096

// The results of a freeze as the verdict tells them.
const (
	// Frozen: the sandbox's state is in the slot, complete.
	Frozen = "frozen"
	// Failed: gVisor could not write it; the sandbox ran on.
	Failed = "failed"
)

// Record is a freeze as init knows it: what the freeze command and
// `sbx-agent freeze --status` print, what init keeps in the record file
// (agentwire.FreezeRecordFile), and, as a Verdict, what it tells sbxd.
// State is one of agentwire's Freeze* states.
type Record struct {
	State string `json:"state"`
	// Name is the snapshot the freeze is recorded as; Sandbox the sandbox
	// frozen; Copy, in a copy, the copy's own id.
	Name    string `json:"name,omitempty"`
	Sandbox string `json:"sandbox,omitempty"`
	Copy    string `json:"copy,omitempty"`
	Slot    string `json:"slot,omitempty"`
	// Pid is the process that asked (the freeze command's parent), UID its
	// user, Cmd its command line.
	Pid int    `json:"pid,omitempty"`
	UID int    `json:"uid"`
	Cmd string `json:"cmd,omitempty"`
	// Reason is what the caller said (a test's name).
	Reason string `json:"reason,omitempty"`
	// FailedAt is when the caller says it failed; Triggered when gVisor was
	// asked; Done when it had written everything, and the sandbox ran on.
	FailedAt  time.Time `json:"failedAt,omitzero"`
	Triggered time.Time `json:"triggered,omitzero"`
	Done      time.Time `json:"done,omitzero"`
	// PausedMs is how long the checkpoint took: what the sandbox's
	// processes saw of it.
	PausedMs int64  `json:"pausedMs,omitempty"`
	Error    string `json:"error,omitempty"`
	// Pids are the sandbox's processes just before the freeze: in a copy,
	// those that were there at the failing instant (and not those started
	// since, to look at it).
	Pids []int `json:"pids,omitempty"`
	// Crash is set when the freeze caught a crash (a signal that dumps
	// core) at its faulting instruction.
	Crash *Crash `json:"crash,omitempty"`
}

// Verdict is a freeze's outcome, from init: its record, with Result
// Frozen or Failed. A control line carries only the slot and what the
// sandbox says of who asked, why and when (see verdictOnly); everything
// but Slot and Result is the sandbox's word, and shown as such.
type Verdict struct {
	Result string `json:"result"`
	Record
}

// verdictOnly leaves of v what a control line carries: init's own
// bookkeeping (state, names, the pids) stays in the sandbox.
func verdictOnly(v Verdict) Verdict {
	v.State, v.Name, v.Sandbox, v.Copy, v.PausedMs, v.Error, v.Pids = "", "", "", "", 0, "", nil
	return v
}

// Crash is a crash a freeze caught, as gVisor told init of it: the process
// stopped with the signal pending, in the capture.
type Crash struct {
	// Signal is the signal's name (SIGSEGV).
	Signal string `json:"signal"`
	// Tid is the thread that faulted; FaultAddr the address it faulted
	// on, IP its instruction pointer (hex, 0x...).
	Tid       int    `json:"tid,omitempty"`
	FaultAddr string `json:"faultAddr,omitempty"`
	IP        string `json:"ip,omitempty"`
	// Exe is the program (/proc/PID/exe).
	Exe string `json:"exe,omitempty"`
	// Count is how many crashes this boot had, this one included.
	Count int `json:"count,omitempty"`
	// Pgid is the process's group; Ancestors its parent, the parent's
	// parent and so on up to init (at most MaxAncestors): what tells which
	// exec a crash came from (an exec's process leads its own group).
	Pgid      int   `json:"pgid,omitempty"`
	Ancestors []int `json:"ancestors,omitempty"`
}

// MaxAncestors bounds Crash.Ancestors.
const MaxAncestors = 32

// Bounds on what a verdict may carry.
const (
	maxCmd    = 512
	maxReason = 512
)

var slotRE = regexp.MustCompile(`^im_[a-z2-7]{10}$`)

// ValidSlot reports whether s can name a slot (an image id).
func ValidSlot(s string) bool { return slotRE.MatchString(s) }

// Line is v as a control line. Over-long text is cut so that the line
// stays within MaxLine.
func Line(v Verdict) []byte {
	v = verdictOnly(v)
	v.Cmd = clip(v.Cmd, maxCmd)
	v.Reason = clip(v.Reason, maxReason)
	if v.Crash != nil {
		c := *v.Crash
		c.Exe = clip(c.Exe, maxCmd)
		c.Ancestors = c.Ancestors[:min(len(c.Ancestors), MaxAncestors)]
		v.Crash = &c
	}
	b, _ := json.Marshal(v)
	return append([]byte(Prefix), append(b, '\n')...)
}

// Parse reads a control line (with or without its newline). It refuses a
// line that is not a freeze's, a bad slot, an unknown result and text
// past the bounds.
func Parse(line []byte) (Verdict, error) {
	s := strings.TrimSuffix(string(line), "\n")
	rest, ok := strings.CutPrefix(s, Prefix)
	if !ok {
		return Verdict{}, fmt.Errorf("not a freeze line")
	}
	if len(line) > MaxLine {
		return Verdict{}, fmt.Errorf("freeze line of %d bytes, over %d", len(line), MaxLine)
	}
	var v Verdict
	if err := json.Unmarshal([]byte(rest), &v); err != nil {
		return Verdict{}, fmt.Errorf("freeze line: %w", err)
	}
	if !ValidSlot(v.Slot) {
		return Verdict{}, fmt.Errorf("freeze line: bad slot %q", v.Slot)
	}
	if v.Result != Frozen && v.Result != Failed {
		return Verdict{}, fmt.Errorf("freeze line: unknown result %q", v.Result)
	}
	v = verdictOnly(v)
	v.Cmd, v.Reason = Printable(clip(v.Cmd, maxCmd)), Printable(clip(v.Reason, maxReason))
	if c := v.Crash; c != nil {
		c.Signal, c.FaultAddr, c.IP = Printable(clip(c.Signal, 16)), Printable(clip(c.FaultAddr, 20)), Printable(clip(c.IP, 20))
		c.Exe = Printable(clip(c.Exe, maxCmd))
		c.Ancestors = c.Ancestors[:min(len(c.Ancestors), MaxAncestors)]
	}
	return v, nil
}

// Printable replaces control characters, so that what a sandbox says
// cannot move a terminal's cursor or forge a line of a log.
func Printable(s string) string {
	return strings.Map(func(r rune) rune {
		if r < 0x20 || r == 0x7f || (r >= 0x80 && r < 0xa0) {
			return '?'
		}
		return r
	}, s)
}

func clip(s string, n int) string {
	if len(s) <= n {
		return s
	}
	s = s[:n]
	for len(s) > 0 && !utf8.ValidString(s) {
		s = s[:len(s)-1] // a rune cut in two
	}
	return s + "..."
}
