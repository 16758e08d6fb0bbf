package agent

import (
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"sbx.dev/sbx/internal/wire/freezewire"
)

// A freeze captures the whole sandbox at the instant a program asks, with
// gVisor's application-driven checkpoint (see package freezewire), while
// the program waits: the failing test process itself is kept, at its
// failure. Every freeze goes through init, which is root, asks gVisor,
// reads the outcome, tells sbxd (a control line on the console) and
// answers the caller. In a copy restored from the freeze, the same request
// comes back with "restore": init tells the caller it is the copy.

// FreezeCommand is the freeze command inside every sandbox: a link to the
// agent, which runs `sbx-agent freeze` when called by that name.
const FreezeCommand = "/.sbx/freeze"

// ExitFreezeCopy is the freeze command's exit code in a copy restored from
// the freeze, with --no-hold.
const ExitFreezeCopy = 3

// Where gVisor's files are, and init's record; variables for tests.
var (
	checkpointPath  = "/proc/gvisor/checkpoint"
	specEnvironPath = "/proc/gvisor/spec_environ"
	freezeRecord    = FreezeRecordFile
	// openCheckpoint opens gVisor's checkpoint file (tests fake it).
	openCheckpoint = func() (io.ReadWriteCloser, error) { return os.OpenFile(checkpointPath, os.O_RDWR, 0) }
)

// Where sbxd confirms freezes (a variable for tests), how long the freeze
// command waits for it (sbxd moves and syncs the image first), and how
// long init goes on watching for a late one.
var (
	confirmDir     = freezewire.ConfirmDir
	confirmWait    = 30 * time.Second
	confirmWatch   = 15 * time.Minute
	confirmPollMax = 100 * time.Millisecond
)

// freezer is init's part that does freezes, one at a time.
type freezer struct {
	mu   sync.Mutex
	busy bool
	// used are the slots whose freeze was asked, by slot: the name and
	// whether it worked. gVisor takes one freeze per boot, whatever its
	// outcome.
	used   map[string]FreezeRecord
	record FreezeRecord
	// console gets the control lines (init's stdout).
	console io.Writer
	// settled is closed and replaced each time the record changes state.
	settled chan struct{}
}

func newFreezer(console io.Writer) *freezer {
	return &freezer{used: map[string]FreezeRecord{}, console: console, settled: make(chan struct{})}
}

// bootEnv is the current boot's spec environment, from gVisor.
type bootEnv struct {
	slot, name, sandbox, restoredFrom string
	// crashesOff: this boot leaves crashes alone (a fork made with crash
	// capture off from a sandbox with it on)
	crashesOff bool
}

func readBootEnv() (bootEnv, error) {
	b, err := os.ReadFile(specEnvironPath)
	if err != nil {
		return bootEnv{}, err
	}
	var e bootEnv
	for _, kv := range bytes.Split(b, []byte{0}) {
		k, v, _ := strings.Cut(string(kv), "=")
		switch k {
		case freezewire.SlotEnv:
			e.slot = v
		case freezewire.NameEnv:
			e.name = v
		case freezewire.SandboxEnv:
			e.sandbox = v
		case freezewire.RestoredFromEnv:
			e.restoredFrom = v
		case freezewire.CrashesEnv:
			e.crashesOff = v == "off"
		}
	}
	return e, nil
}

// setRecord records r as the last freeze, in memory and in its file.
func (f *freezer) setRecord(r FreezeRecord) {
	f.mu.Lock()
	f.record = r
	close(f.settled)
	f.settled = make(chan struct{})
	f.mu.Unlock()
	if err := os.MkdirAll(filepath.Dir(freezeRecord), 0o755); err == nil {
		b, _ := json.MarshalIndent(r, "", "  ")
		tmp := freezeRecord + ".tmp"
		if os.WriteFile(tmp, append(b, '\n'), 0o644) == nil {
			_ = os.Rename(tmp, freezeRecord)
		}
	}
}

// status returns the last freeze's record; one still under way is waited
// for, up to wait (in a copy just restored, init is about to settle it).
func (f *freezer) status(wait time.Duration) FreezeRecord {
	deadline := time.After(wait)
	for {
		f.mu.Lock()
		r, ch := f.record, f.settled
		f.mu.Unlock()
		if r.State != FreezeFreezing {
			return r
		}
		select {
		case <-ch:
		case <-deadline:
			return r
		}
	}
}

// peer is who is on the other end of a connection to init.
type peer struct{ pid, uid int }

func peerOf(conn *os.File) (peer, error) {
	rc, err := conn.SyscallConn()
	if err != nil {
		return peer{}, err
	}
	var cred *unix.Ucred
	var cerr error
	if err := rc.Control(func(fd uintptr) {
		cred, cerr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
	}); err != nil {
		return peer{}, err
	}
	if cerr != nil {
		return peer{}, cerr
	}
	return peer{pid: int(cred.Pid), uid: int(cred.Uid)}, nil
}

// freeze does one freeze for the process that asked (the parent of the
// freeze command on the other end, or that process itself with req.Self)
// and answers with its record.
func (f *freezer) freeze(req initRequest, p peer) FreezeRecord {
	env, err := readBootEnv()
	if err != nil || env.slot == "" {
		return FreezeRecord{State: FreezeUnsupported, Error: "this sandbox was started without freezes (by an sbx older than freezes, or with gVisor's checkpoint files off): a sandbox started or resumed by this sbx can freeze"}
	}
	rec := FreezeRecord{State: FreezeFreezing, Name: env.name, Sandbox: env.sandbox, Slot: env.slot, UID: p.uid, Reason: req.Reason, Crash: req.Crash}
	rec.Pid = p.pid
	if !req.Self {
		if ppid, _, ok := procStat(p.pid); ok {
			rec.Pid = ppid
		}
	}
	rec.Cmd = cmdline(rec.Pid)
	if req.FailedAt != "" {
		rec.FailedAt = parseTime(req.FailedAt)
	}
	f.mu.Lock()
	if f.busy {
		f.mu.Unlock()
		return FreezeRecord{State: FreezeUsed, Name: env.name, Sandbox: env.sandbox, Slot: env.slot,
			Error: "another freeze of this sandbox is under way (it keeps this process too, as it is now)"}
	}
	if prev, ok := f.used[env.slot]; ok {
		f.mu.Unlock()
		prev.State, prev.Error = FreezeUsed, usedMessage(prev)
		return prev
	}
	f.busy = true
	f.mu.Unlock()
	defer func() {
		f.mu.Lock()
		f.busy = false
		f.mu.Unlock()
	}()
	for p := range pids() {
		rec.Pids = append(rec.Pids, p)
	}
	slices.Sort(rec.Pids)
	f.setRecord(rec)

	file, err := f.trigger(&rec, &env)
	if file != nil {
		defer file.Close()
	}
	if err != nil {
		if errors.Is(err, errFreezeOpen) {
			rec.State, rec.Error = FreezeUnsupported, "this sandbox cannot freeze: "+err.Error()
			f.setRecord(rec)
			return rec
		}
		if errors.Is(err, errFreezeUsed) {
			return rec
		}
		if errors.Is(err, syscall.ENXIO) {
			// gVisor's files for it were used by a write that did not come
			// through here
			rec.State, rec.Error = FreezeUsed, "this sandbox's freeze was used already (a write to /proc/gvisor/checkpoint that did not go through "+FreezeCommand+"): gVisor arms one freeze per start of a sandbox"
			f.mu.Lock()
			f.used[env.slot] = rec
			f.mu.Unlock()
			f.setRecord(rec)
			return rec
		}
		rec.State, rec.Error = FreezeFailed, "gVisor refused the checkpoint: "+err.Error()
		if errors.Is(err, syscall.EBUSY) {
			rec.Error = fmt.Sprintf("gVisor refused the checkpoint for %s: sbx was capturing this sandbox (a stop, a snapshot or a fork) all that time; nothing was lost", busyWait)
		}
		f.setRecord(rec)
		return rec
	}
	buf := make([]byte, 64)
	n, err := file.Read(buf)
	answered := time.Now()
	result := strings.TrimSpace(string(buf[:n]))
	if err != nil && result == "" {
		result = "error"
	}
	if now, err := readBootEnv(); result != "restore" && (err != nil || now.slot == env.slot) {
		// in a copy, the answer comes at its restore, and in a boot
		// restored from a capture that held this read (a stop's, just
		// after the freeze), later: the original's end is not known there
		rec.Done = answered
		rec.PausedMs = rec.Done.Sub(rec.Triggered).Milliseconds()
	}
	f.mu.Lock()
	f.used[env.slot] = rec
	f.mu.Unlock()
	switch result {
	case "resume":
		// gVisor wrote it: frozen once sbxd says it recorded it
		if req.written != nil {
			req.written()
		}
		f.tell(rec, freezewire.Frozen)
		rec = f.confirmed(rec, env)
		f.mu.Lock()
		f.used[env.slot] = rec
		f.mu.Unlock()
		f.setRecord(rec)
		if rec.State == FreezeUnconfirmed {
			go f.lateConfirm(rec, env.slot)
		}
		return rec
	case "restore":
		now, err := readBootEnv()
		if err == nil && now.restoredFrom == env.slot {
			rec.State, rec.Copy = FreezeCopy, now.sandbox
			f.setRecord(rec)
			fmt.Fprintf(f.console, "sbx: this is %s, a copy of %s resumed from its freeze %s\n", now.sandbox, env.sandbox, env.name)
			return rec
		}
		rec.State = FreezeInterrupted
		rec.Error = "sbx captured this sandbox (a stop, a snapshot or a fork) while it was freezing, and this is that capture, restored: whether the freeze was recorded says `sbx snapshot info " + env.name + "`"
		if err == nil {
			rec.Copy = now.sandbox
		}
		f.setRecord(rec)
		return rec
	default:
		rec.State = FreezeFailed
		f.setRecord(rec)
		f.tell(rec, freezewire.Failed)
		rec.Error = "gVisor could not write the checkpoint; the sandbox ran on and nothing was lost"
		if c, ok, _ := waitConfirm(env.slot, env.sandbox, whyWait); ok && c.Result == freezewire.Failed && c.Reason != "" {
			rec.Error = c.Reason + "; the sandbox ran on and nothing was lost"
		} else {
			rec.Error += " (sbxd says why in the sandbox's events: sbx events " + env.sandbox + ")"
		}
		f.mu.Lock()
		f.used[env.slot] = rec
		f.mu.Unlock()
		f.setRecord(rec)
		return rec
	}
}

// whyWait is how long a failed freeze waits for sbxd to say why.
const whyWait = 5 * time.Second

// confirmed is rec once sbxd has said what became of the freeze gVisor
// wrote into env's slot: frozen as the snapshot sbxd names, failed (sbxd
// could not keep it), or unconfirmed after confirmWait. In a copy restored
// from a capture (a snapshot, a fork) taken as the original's freeze ended,
// or while this waited, sbxd's word is the original's and not to be had
// there: the copy says so.
func (f *freezer) confirmed(rec FreezeRecord, env bootEnv) FreezeRecord {
	c, ok, copyID := waitConfirm(env.slot, env.sandbox, confirmWait)
	if copyID != "" {
		rec.State, rec.Copy = FreezeInterrupted, copyID
		rec.Error = "sbx captured sandbox " + env.sandbox + " (a snapshot or a fork) just as its freeze ended, and this is that capture, restored: the freeze is the original's (`sbx snapshot info " + env.name + "` says whether sbxd kept it)"
		return rec
	}
	return applyConfirm(rec, c, ok)
}

func applyConfirm(rec FreezeRecord, c freezewire.Confirm, ok bool) FreezeRecord {
	switch {
	case ok && c.Result == freezewire.Frozen && c.Name != "":
		rec.State, rec.Name, rec.Error = FreezeFrozen, c.Name, ""
	case ok:
		rec.State = FreezeFailed
		rec.Error = orText(c.Reason, "sbxd did not keep the freeze") + "; the sandbox ran on and nothing was lost"
	default:
		rec.State = FreezeUnconfirmed
		rec.Error = fmt.Sprintf("gVisor wrote the checkpoint, but sbxd did not confirm recording it within %s (is sbxd running?): whether it was kept says `sbx snapshot info %s`, and `%s --status` once it is", confirmWait, rec.Name, FreezeCommand)
	}
	return rec
}

func orText(s, def string) string {
	if s == "" {
		return def
	}
	return s
}

// lateConfirm goes on waiting for sbxd's word on an unconfirmed freeze
// (sbxd was down, or slow), and records it when it comes, unless another
// freeze has been recorded since.
func (f *freezer) lateConfirm(rec FreezeRecord, slot string) {
	c, ok, copyID := waitConfirm(slot, rec.Sandbox, confirmWatch)
	if !ok || copyID != "" {
		return
	}
	rec = applyConfirm(rec, c, true)
	f.mu.Lock()
	cur := f.record
	if cur.Slot == slot && cur.State == FreezeUnconfirmed {
		f.used[slot] = rec
	}
	f.mu.Unlock()
	if cur.Slot == slot && cur.State == FreezeUnconfirmed {
		f.setRecord(rec)
	}
}

// waitConfirm waits up to d for sbxd's word on the freeze in slot of
// sandbox, in the read-only dir only sbxd writes (freezewire.ConfirmDir).
// copyID is set when this is now another sandbox (a copy restored from a
// capture taken meanwhile), where that word never comes.
func waitConfirm(slot, sandbox string, d time.Duration) (c freezewire.Confirm, ok bool, copyID string) {
	path := filepath.Join(confirmDir, slot)
	pause := 5 * time.Millisecond
	for deadline := time.Now().Add(d); ; {
		if b, err := readRegular(path, 8<<10); err == nil {
			if json.Unmarshal(b, &c) == nil && (c.Result == freezewire.Frozen || c.Result == freezewire.Failed) {
				c.Name, c.Reason = freezewire.Printable(c.Name), freezewire.Printable(c.Reason)
				return c, true, ""
			}
		}
		if now, err := readBootEnv(); err == nil && now.sandbox != "" && now.sandbox != sandbox {
			return freezewire.Confirm{}, false, now.sandbox
		}
		if time.Now().After(deadline) {
			return freezewire.Confirm{}, false, ""
		}
		time.Sleep(pause)
		pause = min(2*pause, confirmPollMax)
	}
}

func usedMessage(prev FreezeRecord) string {
	what := "froze already, as " + prev.Name
	if prev.State == FreezeFailed {
		what = "tried to freeze already, and failed"
	}
	return "this sandbox " + what + " since it started: gVisor arms one freeze per start of a sandbox; freeze again in a copy (sbx new --from " + prev.Name + ") or after sbx stop and sbx resume"
}

// busyWait is how long a freeze waits, asking again, while gVisor refuses
// it because sbxd is capturing the sandbox (a stop, a snapshot, a fork);
// it starts again at each new boot (a stop's capture is resumed later).
// busyPoll is the pause between two asks.
var (
	busyWait = 10 * time.Minute
	busyPoll = 20 * time.Millisecond
)

var (
	errFreezeOpen = errors.New("cannot open gVisor's checkpoint file")
	errFreezeUsed = errors.New("this boot's freeze was used")
)

// trigger asks gVisor for the checkpoint: it opens the checkpoint file and
// writes "1", and returns the open file to read the outcome from. Right
// before it writes, it reads which boot it is in: a stop may have caught
// the request on its way here (a stop pauses the sandbox anywhere), and
// the resumed boot, with a slot of its own, is the one gVisor writes; rec
// and env follow it. gVisor (as sbx builds it) refuses with EBUSY while
// sbxd's checkpoint runs (a snapshot or a fork): it asks again, on a new
// file each time, so that the outcome it reads is of its own checkpoint.
// rec.Triggered is set. errFreezeUsed: the boot it is in froze already (rec
// says so).
func (f *freezer) trigger(rec *FreezeRecord, env *bootEnv) (io.ReadWriteCloser, error) {
	deadline := time.Now().Add(busyWait)
	for {
		file, err := openCheckpoint()
		if err != nil {
			return nil, fmt.Errorf("%w: %w", errFreezeOpen, err)
		}
		if now, err := readBootEnv(); err == nil && now.slot != "" && now.slot != env.slot {
			// restored from a capture taken since the request came
			*env = now
			deadline = time.Now().Add(busyWait)
			rec.Name, rec.Sandbox, rec.Slot = now.name, now.sandbox, now.slot
			f.mu.Lock()
			prev, used := f.used[now.slot]
			f.mu.Unlock()
			if used {
				file.Close()
				*rec = prev
				rec.State, rec.Error = FreezeUsed, usedMessage(prev)
				return nil, errFreezeUsed
			}
			f.setRecord(*rec)
		}
		rec.Triggered = time.Now()
		_, err = file.Write([]byte("1"))
		if errors.Is(err, syscall.ESTALE) {
			// the sandbox was captured between the check above and the
			// write, and this is that capture restored: the file, opened
			// before, triggers nothing here (gVisor patch 06); again, in
			// this boot
			file.Close()
			continue
		}
		if !errors.Is(err, syscall.EBUSY) || time.Now().After(deadline) {
			return file, err
		}
		file.Close()
		time.Sleep(busyPoll)
	}
}

// tell writes the freeze's control line on the console, where sbxd's
// console shim picks it up.
func (f *freezer) tell(rec FreezeRecord, result string) {
	line := freezewire.Line(freezewire.Verdict{Result: result, Record: rec})
	_, _ = f.console.Write(line)
}

// cmdline is pid's command line, its arguments joined by spaces.
func cmdline(pid int) string {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cmdline")
	if err != nil {
		return ""
	}
	return strings.TrimSpace(strings.ReplaceAll(string(b), "\x00", " "))
}

// parseTime reads a time as RFC 3339 or as seconds since the epoch
// ("1700000000.123"); zero if neither.
func parseTime(s string) time.Time {
	if t, err := time.Parse(time.RFC3339Nano, s); err == nil {
		return t
	}
	sec, frac, _ := strings.Cut(strings.TrimSpace(s), ".")
	n, err := strconv.ParseInt(sec, 10, 64)
	if err != nil {
		return time.Time{}
	}
	var ns int64
	if frac != "" {
		ns, _ = strconv.ParseInt((frac + "000000000")[:9], 10, 64)
	}
	return time.Unix(n, ns)
}

const freezeSyntax = "freeze [--reason TEXT] [--failed-at TIME] [--no-hold] [--json] | freeze --status"

// runFreeze is the freeze command: it asks init to freeze the sandbox and
// says what came of it. In the original it returns once the sandbox's
// whole state is captured (exit 0). In a copy restored from the freeze it
// says so and, unless --no-hold, holds its caller there for good: the
// caller (a test at its failure) stays as it was. A freeze that could not
// be done says why, on stderr, and exits 1; the sandbox runs on.
func runFreeze(args []string, stdout, stderr io.Writer) int {
	fset := flag.NewFlagSet("freeze", flag.ContinueOnError)
	fset.SetOutput(io.Discard)
	reason := fset.String("reason", "", "what failed (a test's name), kept with the freeze")
	failedAt := fset.String("failed-at", "", "when the failure happened: RFC 3339, or seconds since the epoch")
	noHold := fset.Bool("no-hold", false, "in a copy, return (exit 3) instead of holding the caller")
	asJSON := fset.Bool("json", false, "print the freeze's record as JSON on stdout")
	status := fset.Bool("status", false, "print the last freeze's record (JSON) and exit")
	self := fset.Bool("self", false, "freeze for this process, not its parent (scripts that exec it)")
	if err := fset.Parse(args); err != nil || fset.NArg() != 0 {
		msg := "unexpected arguments"
		if err != nil {
			msg = err.Error()
		}
		fmt.Fprintf(stderr, "sbx freeze: %s; usage: %s %s\n", msg, FreezeCommand, strings.TrimPrefix(freezeSyntax, "freeze "))
		return ExitInvalid
	}
	if *status {
		rep, err := callInit(initRequest{Op: "freeze-status"})
		if err != nil {
			fmt.Fprintf(stderr, "sbx freeze: %s\n", oneLine(err.Error()))
			return ExitError
		}
		if rep.Freeze == nil {
			rep.Freeze = &FreezeRecord{}
		}
		_ = writeJSON(stdout, rep.Freeze)
		return ExitOK
	}
	rep, err := callInitFreeze(initRequest{Op: "freeze", Reason: *reason, FailedAt: *failedAt, Self: *self})
	if err != nil {
		fmt.Fprintf(stderr, "sbx freeze: cannot reach the sandbox's init: %s\n", oneLine(err.Error()))
		return ExitError
	}
	if rep.Freeze == nil {
		fmt.Fprintf(stderr, "sbx freeze: %s\n", oneLine(rep.Error))
		return ExitError
	}
	r := *rep.Freeze
	if *asJSON {
		_ = writeJSON(stdout, r)
	}
	switch r.State {
	case FreezeFrozen:
		took := ""
		if !r.Done.IsZero() {
			took = fmt.Sprintf(" (gVisor took %d ms)", r.PausedMs)
		}
		fmt.Fprintf(stderr, "sbx freeze: froze sandbox %s as snapshot %s%s; look at it in a copy: sbx new --from %s\n", r.Sandbox, r.Name, took, r.Name)
		return ExitOK
	case FreezeCopy:
		fmt.Fprintf(stderr, "sbx freeze: this is %s, a copy of %s resumed from its freeze %s\n", r.Copy, r.Sandbox, r.Name)
		if *noHold {
			return ExitFreezeCopy
		}
		fmt.Fprintf(stderr, "sbx freeze: holding process %d here, as it was when it froze\n", r.Pid)
		hold()
		return ExitFreezeCopy
	default:
		fmt.Fprintf(stderr, "sbx freeze: %s\n", oneLine(r.Error))
		return ExitError
	}
}

// hold never returns: a copy's caller stays where it froze.
func hold() {
	for {
		time.Sleep(time.Hour)
	}
}

// callInitFreeze sends a freeze request; its answer comes once gVisor has
// written the sandbox, which takes as long as the sandbox's memory needs.
func callInitFreeze(req initRequest) (initReply, error) {
	conn, err := dialUnix(initSocket)
	if err != nil {
		return initReply{}, err
	}
	defer conn.Close()
	_ = conn.SetWriteDeadline(time.Now().Add(clientTimeout))
	if err := json.NewEncoder(conn).Encode(req); err != nil {
		return initReply{}, err
	}
	var rep initReply
	if err := json.NewDecoder(io.LimitReader(conn, 1<<20)).Decode(&rep); err != nil {
		return initReply{}, err
	}
	return rep, nil
}
