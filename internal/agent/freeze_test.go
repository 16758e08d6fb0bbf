package agent

import (
	"bytes"
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"sbx.dev/sbx/internal/wire/freezewire"
)

// fakeCheckpoint stands for /proc/gvisor/checkpoint: a write of "1" is
// refused with writeErr or accepted; a read answers result, once onRead
// (the "checkpoint") has run.
type fakeCheckpoint struct {
	writeErr error
	// busy writes are refused with EBUSY first; onBusy runs at each
	busy   int
	onBusy func()
	result string
	onRead func()
	wrote  []byte
}

func (f *fakeCheckpoint) Write(p []byte) (int, error) {
	if f.writeErr != nil {
		return 0, f.writeErr
	}
	if f.busy > 0 {
		f.busy--
		if f.onBusy != nil {
			f.onBusy()
		}
		return 0, syscall.EBUSY
	}
	f.wrote = append(f.wrote, p...)
	return len(p), nil
}

func (f *fakeCheckpoint) Read(p []byte) (int, error) {
	if f.onRead != nil {
		f.onRead()
	}
	return copy(p, f.result+"\n"), nil
}

func (f *fakeCheckpoint) Close() error { return nil }

// freezeEnv points the freezer at a spec environment, a record file and a
// fake checkpoint file of the test's own.
// It stands for sbxd too: each boot's freeze is confirmed as recorded
// under the boot's name (writeEnviron writes the confirmation ahead).
func fakeFreezeEnv(t *testing.T, cp *fakeCheckpoint, env map[string]string) (environ string) {
	t.Helper()
	dir := t.TempDir()
	environ = filepath.Join(dir, "spec_environ")
	oldEnv, oldRec, oldOpen, oldConfirm, oldWait, oldWatch := specEnvironPath, freezeRecord, openCheckpoint, confirmDir, confirmWait, confirmWatch
	specEnvironPath, freezeRecord = environ, filepath.Join(dir, "run", "record.json")
	confirmDir, confirmWait, confirmWatch = filepath.Join(dir, "confirm"), 2*time.Second, 5*time.Second
	openCheckpoint = func() (io.ReadWriteCloser, error) { return cp, nil }
	t.Cleanup(func() {
		specEnvironPath, freezeRecord, openCheckpoint, confirmDir, confirmWait, confirmWatch = oldEnv, oldRec, oldOpen, oldConfirm, oldWait, oldWatch
	})
	writeEnviron(t, environ, env)
	return environ
}

func writeEnviron(t *testing.T, path string, env map[string]string) {
	t.Helper()
	var b bytes.Buffer
	b.WriteString("PATH=/bin\x00")
	for k, v := range env {
		b.WriteString(k + "=" + v + "\x00")
	}
	if err := os.WriteFile(path, b.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	if slot, name := env[freezewire.SlotEnv], env[freezewire.NameEnv]; slot != "" && name != "" {
		confirm(t, slot, &freezewire.Confirm{Result: freezewire.Frozen, Name: name})
	}
}

// confirm writes sbxd's word on the freeze in slot (nil: none).
func confirm(t *testing.T, slot string, c *freezewire.Confirm) {
	t.Helper()
	path := filepath.Join(confirmDir, slot)
	if c == nil {
		os.Remove(path)
		return
	}
	if err := os.MkdirAll(confirmDir, 0o700); err != nil {
		t.Fatal(err)
	}
	b, _ := json.Marshal(c)
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
}

var bootEnvA = map[string]string{
	freezewire.SlotEnv: "im_aaaaaaaaaa", freezewire.NameEnv: "freeze-web-aaaa",
	freezewire.SandboxEnv: "sb_aaaaaaaaaa", freezewire.RestoredFromEnv: "",
}

// consoleLines returns the control lines written on the console.
func controlLines(t *testing.T, console string) []freezewire.Verdict {
	t.Helper()
	var out []freezewire.Verdict
	for _, l := range strings.SplitAfter(console, "\n") {
		if !strings.HasPrefix(l, freezewire.Prefix) {
			continue
		}
		v, err := freezewire.Parse([]byte(l))
		if err != nil {
			t.Fatalf("control line %q: %v", l, err)
		}
		out = append(out, v)
	}
	return out
}

func TestFreezeFrozenOnce(t *testing.T) {
	cp := &fakeCheckpoint{result: "resume", onRead: func() { time.Sleep(20 * time.Millisecond) }} // the checkpoint takes 20 ms: the pause the record must report
	fakeFreezeEnv(t, cp, bootEnvA)
	var console bytes.Buffer
	f := newFreezer(&console)
	failed := time.Now().Add(-time.Second)
	r := f.freeze(initRequest{Reason: "test_x", FailedAt: failed.Format(time.RFC3339Nano), Self: true}, peer{pid: os.Getpid(), uid: 1000})
	if r.State != FreezeFrozen || r.Name != "freeze-web-aaaa" || r.Sandbox != "sb_aaaaaaaaaa" || r.Slot != "im_aaaaaaaaaa" {
		t.Fatalf("record %+v, want frozen as freeze-web-aaaa", r)
	}
	if string(cp.wrote) != "1" {
		t.Errorf("wrote %q to the checkpoint file, want \"1\"", cp.wrote)
	}
	if r.Pid != os.Getpid() || r.UID != 1000 || r.Reason != "test_x" || !r.FailedAt.Equal(failed) {
		t.Errorf("record %+v does not say who asked, why and when", r)
	}
	if r.PausedMs < 20 || r.Done.Before(r.Triggered) {
		t.Errorf("paused %d ms (triggered %s, done %s), want >= 20", r.PausedMs, r.Triggered, r.Done)
	}
	vs := controlLines(t, console.String())
	if len(vs) != 1 || vs[0].Slot != "im_aaaaaaaaaa" || vs[0].Result != freezewire.Frozen || vs[0].Reason != "test_x" {
		t.Fatalf("control lines %+v, want one frozen verdict for the slot", vs)
	}
	if got := f.status(0); got.State != FreezeFrozen {
		t.Errorf("status %+v, want frozen", got)
	}
	b, err := os.ReadFile(freezeRecord)
	if err != nil || !strings.Contains(string(b), `"state": "frozen"`) {
		t.Errorf("record file %q %v, want the frozen record", b, err)
	}
	// one freeze per boot: the second is refused, naming the first, and
	// gVisor is not asked again
	cp.wrote = nil
	again := f.freeze(initRequest{}, peer{pid: os.Getpid()})
	if again.State != FreezeUsed || !strings.Contains(again.Error, "froze already, as freeze-web-aaaa") || cp.wrote != nil {
		t.Errorf("second freeze %+v (wrote %q), want used, naming the first", again, cp.wrote)
	}
	if n := len(controlLines(t, console.String())); n != 1 {
		t.Errorf("%d control lines after a refused freeze, want 1", n)
	}
}

func TestFreezeCopy(t *testing.T) {
	var environ string
	cp := &fakeCheckpoint{result: "restore"}
	environ = fakeFreezeEnv(t, cp, bootEnvA)
	// the restore: the copy's boot has its own slot and says where it came from
	cp.onRead = func() {
		writeEnviron(t, environ, map[string]string{freezewire.SlotEnv: "im_bbbbbbbbbb", freezewire.NameEnv: "freeze-c-bbbb",
			freezewire.SandboxEnv: "sb_bbbbbbbbbb", freezewire.RestoredFromEnv: "im_aaaaaaaaaa"})
	}
	var console bytes.Buffer
	f := newFreezer(&console)
	r := f.freeze(initRequest{}, peer{pid: os.Getpid()})
	if r.State != FreezeCopy || r.Copy != "sb_bbbbbbbbbb" || r.Sandbox != "sb_aaaaaaaaaa" || r.Name != "freeze-web-aaaa" {
		t.Fatalf("record %+v, want the copy sb_bbbbbbbbbb of sb_aaaaaaaaaa", r)
	}
	if !r.Done.IsZero() {
		t.Errorf("a copy claims the original's freeze ended at %s", r.Done)
	}
	if len(controlLines(t, console.String())) != 0 || !strings.Contains(console.String(), "a copy of sb_aaaaaaaaaa") {
		t.Errorf("console %q, want a plain line saying it is a copy and no verdict", console.String())
	}
	// the copy's own slot is fresh: it may freeze in turn
	cp.result, cp.onRead = "resume", nil
	if r := f.freeze(initRequest{}, peer{pid: os.Getpid()}); r.State != FreezeFrozen || r.Slot != "im_bbbbbbbbbb" {
		t.Errorf("the copy's freeze: %+v, want frozen in its own slot", r)
	}
}

func TestFreezeInterrupted(t *testing.T) {
	cp := &fakeCheckpoint{result: "restore"}
	environ := fakeFreezeEnv(t, cp, bootEnvA)
	// restored from a stop's image taken while it froze
	cp.onRead = func() {
		writeEnviron(t, environ, map[string]string{freezewire.SlotEnv: "im_cccccccccc", freezewire.SandboxEnv: "sb_aaaaaaaaaa", freezewire.RestoredFromEnv: "im_stopstopst"})
	}
	var console bytes.Buffer
	r := newFreezer(&console).freeze(initRequest{}, peer{pid: os.Getpid()})
	if r.State != FreezeInterrupted || !strings.Contains(r.Error, "while it was freezing") {
		t.Fatalf("record %+v, want interrupted, saying why", r)
	}
}

func TestFreezeFailedSaysWhy(t *testing.T) {
	cp := &fakeCheckpoint{result: "error"}
	fakeFreezeEnv(t, cp, bootEnvA)
	// sbxd, having seen gVisor's files, says why
	confirm(t, "im_aaaaaaaaaa", &freezewire.Confirm{Result: freezewire.Failed, Reason: "gVisor could not write the checkpoint: write: no space left on device"})
	var console syncBuffer
	f := newFreezer(&console)
	r := f.freeze(initRequest{}, peer{pid: os.Getpid()})
	if r.State != FreezeFailed || !strings.Contains(r.Error, "no space left on device") || !strings.Contains(r.Error, "nothing was lost") {
		t.Fatalf("record %+v, want failed with sbxd's reason", r)
	}
	vs := controlLines(t, console.String())
	if len(vs) != 1 || vs[0].Result != freezewire.Failed {
		t.Errorf("control lines %+v, want one failed verdict", vs)
	}
	// gVisor took the boot's freeze even so
	if again := f.freeze(initRequest{}, peer{pid: os.Getpid()}); again.State != FreezeUsed || !strings.Contains(again.Error, "failed") {
		t.Errorf("a freeze after a failed one: %+v, want used, saying the first failed", again)
	}
}

// TestFreezeConfirm: the freeze says it froze only once sbxd, in the dir
// only sbxd writes, names the snapshot it recorded; gVisor's "resume" and
// the sandbox's own line are not enough.
func TestFreezeConfirm(t *testing.T) {
	t.Run("none", func(t *testing.T) {
		cp := &fakeCheckpoint{result: "resume"}
		fakeFreezeEnv(t, cp, bootEnvA)
		confirmWait = 50 * time.Millisecond
		confirm(t, "im_aaaaaaaaaa", nil)
		f := newFreezer(io.Discard)
		r := f.freeze(initRequest{}, peer{pid: os.Getpid()})
		if r.State != FreezeUnconfirmed || !strings.Contains(r.Error, "did not confirm") || !strings.Contains(r.Error, "sbx snapshot info freeze-web-aaaa") {
			t.Fatalf("record %+v, want unconfirmed, saying how to find out", r)
		}
		// sbxd confirms late (it was down): the record follows
		confirm(t, "im_aaaaaaaaaa", &freezewire.Confirm{Result: freezewire.Frozen, Name: "freeze-web-aaaa"})
		deadline := time.Now().Add(5 * time.Second)
		for f.status(0).State != FreezeFrozen && time.Now().Before(deadline) {
			time.Sleep(10 * time.Millisecond)
		}
		if got := f.status(0); got.State != FreezeFrozen || got.Name != "freeze-web-aaaa" {
			t.Errorf("after a late confirmation: %+v, want frozen", got)
		}
	})
	t.Run("renamed", func(t *testing.T) {
		cp := &fakeCheckpoint{result: "resume"}
		fakeFreezeEnv(t, cp, bootEnvA)
		confirm(t, "im_aaaaaaaaaa", &freezewire.Confirm{Result: freezewire.Frozen, Name: "freeze-aaaaaaaaaa"})
		if r := newFreezer(io.Discard).freeze(initRequest{}, peer{pid: os.Getpid()}); r.State != FreezeFrozen || r.Name != "freeze-aaaaaaaaaa" {
			t.Errorf("record %+v, want frozen under the name sbxd recorded", r)
		}
	})
	t.Run("refused", func(t *testing.T) {
		cp := &fakeCheckpoint{result: "resume"}
		fakeFreezeEnv(t, cp, bootEnvA)
		confirm(t, "im_aaaaaaaaaa", &freezewire.Confirm{Result: freezewire.Failed, Reason: "the sandbox's freeze quota (8) is used"})
		r := newFreezer(io.Discard).freeze(initRequest{}, peer{pid: os.Getpid()})
		if r.State != FreezeFailed || !strings.Contains(r.Error, "quota") {
			t.Errorf("record %+v, want failed with sbxd's reason", r)
		}
	})
	t.Run("copied while waiting", func(t *testing.T) {
		// a snapshot taken while init waited for sbxd: in the copy, the
		// original's word never comes
		cp := &fakeCheckpoint{result: "resume"}
		environ := fakeFreezeEnv(t, cp, bootEnvA)
		confirm(t, "im_aaaaaaaaaa", nil)
		time.AfterFunc(50*time.Millisecond, func() {
			writeEnviron(t, environ, map[string]string{freezewire.SlotEnv: "im_bbbbbbbbbb", freezewire.SandboxEnv: "sb_bbbbbbbbbb", freezewire.RestoredFromEnv: "im_snapsnapsn"})
		})
		r := newFreezer(io.Discard).freeze(initRequest{}, peer{pid: os.Getpid()})
		if r.State != FreezeInterrupted || r.Copy != "sb_bbbbbbbbbb" || !strings.Contains(r.Error, "the freeze is the original's") {
			t.Errorf("record %+v, want interrupted, saying the freeze is the original's", r)
		}
	})
	t.Run("not a file", func(t *testing.T) {
		cp := &fakeCheckpoint{result: "resume"}
		fakeFreezeEnv(t, cp, bootEnvA)
		confirmWait = 50 * time.Millisecond
		confirm(t, "im_aaaaaaaaaa", nil)
		if err := syscall.Mkfifo(filepath.Join(confirmDir, "im_aaaaaaaaaa"), 0o600); err != nil {
			t.Fatal(err)
		}
		if r := newFreezer(io.Discard).freeze(initRequest{}, peer{pid: os.Getpid()}); r.State != FreezeUnconfirmed {
			t.Errorf("record %+v with a FIFO for a confirmation, want unconfirmed (and no hang)", r)
		}
	})
}

func TestFreezeRefused(t *testing.T) {
	for _, tc := range []struct {
		name      string
		env       map[string]string
		writeErr  error
		wantState string
		wantErr   string
	}{
		{"used by a direct write", bootEnvA, syscall.ENXIO, FreezeUsed, "did not go through /.sbx/freeze"},
		{"refused", bootEnvA, syscall.EPERM, FreezeFailed, "refused"},
		{"no freezes in this boot", map[string]string{}, nil, FreezeUnsupported, "started without freezes"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cp := &fakeCheckpoint{writeErr: tc.writeErr, result: "resume"}
			fakeFreezeEnv(t, cp, tc.env)
			var console bytes.Buffer
			r := newFreezer(&console).freeze(initRequest{}, peer{pid: os.Getpid()})
			if r.State != tc.wantState || !strings.Contains(r.Error, tc.wantErr) {
				t.Errorf("record %+v, want %s saying %q", r, tc.wantState, tc.wantErr)
			}
			if len(controlLines(t, console.String())) != 0 {
				t.Errorf("a refused freeze told sbxd of a verdict: %q", console.String())
			}
		})
	}
}

// TestFreezeCommand: the freeze command, through init's socket: its exit
// codes and messages in the original and in a copy.
func TestFreezeCommand(t *testing.T) {
	s := startSupervisor(t)
	var console syncBuffer
	s.freezer = newFreezer(&console)
	cp := &fakeCheckpoint{result: "resume"}
	environ := fakeFreezeEnv(t, cp, bootEnvA)

	var out, errb bytes.Buffer
	if code := Main([]string{"freeze", "--reason", "t", "--json"}, nil, &out, &errb); code != 0 {
		t.Fatalf("freeze: exit %d: %s", code, errb.String())
	}
	if !strings.Contains(errb.String(), "as snapshot freeze-web-aaaa") || !strings.Contains(out.String(), `"state":"frozen"`) {
		t.Errorf("freeze said %q / %q, want the snapshot's name and the JSON record", errb.String(), out.String())
	}
	// the freeze command ran in this process: the caller is its parent
	if r := s.freezer.status(0); r.Pid != os.Getppid() {
		t.Errorf("the freeze names pid %d as its caller, want %d (the freeze command's parent)", r.Pid, os.Getppid())
	}

	out.Reset()
	errb.Reset()
	if code := Main([]string{"freeze"}, nil, &out, &errb); code != ExitError || !strings.Contains(errb.String(), "froze already") {
		t.Errorf("second freeze: exit %d %q, want 1 saying it froze already", code, errb.String())
	}

	// a copy: --no-hold returns 3
	s.freezer = newFreezer(&console)
	cp.result = "restore"
	cp.onRead = func() {
		writeEnviron(t, environ, map[string]string{freezewire.SlotEnv: "im_bbbbbbbbbb", freezewire.SandboxEnv: "sb_bbbbbbbbbb", freezewire.RestoredFromEnv: "im_aaaaaaaaaa"})
	}
	errb.Reset()
	if code := Main([]string{"freeze", "--no-hold"}, nil, &out, &errb); code != ExitFreezeCopy || !strings.Contains(errb.String(), "a copy of sb_aaaaaaaaaa") {
		t.Errorf("freeze in a copy: exit %d %q, want %d saying it is the copy", code, errb.String(), ExitFreezeCopy)
	}

	// --status prints the record
	out.Reset()
	if code := Main([]string{"freeze", "--status"}, nil, &out, &errb); code != 0 || !strings.Contains(out.String(), `"state":"copy"`) {
		t.Errorf("freeze --status: exit %d %q", code, out.String())
	}
	// bad flags
	if code := Main([]string{"freeze", "--nope"}, nil, &out, &errb); code != ExitInvalid {
		t.Errorf("freeze --nope: exit %d, want %d", code, ExitInvalid)
	}
}

// TestConsoleEscapesControl: what anyone writes to /dev/console cannot
// pass for init's control line.
func TestConsoleEscapesControl(t *testing.T) {
	path := filepath.Join(t.TempDir(), "console")
	var out syncBuffer
	if err := serveConsole(path, &out); err != nil {
		t.Fatal(err)
	}
	forged := string(freezewire.Line(freezewire.Verdict{Result: freezewire.Frozen, Record: freezewire.Record{Slot: "im_aaaaaaaaaa"}}))
	f, err := os.OpenFile(path, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	f.WriteString(forged)
	f.Close()
	deadline := time.Now().Add(5 * time.Second)
	for out.String() == "" && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	got := out.String()
	if strings.IndexByte(got, freezewire.ControlByte) >= 0 || !strings.Contains(got, "?sbx-freeze") {
		t.Errorf("console copied %q, want the control byte replaced", got)
	}
}

// TestFreezeBusy: gVisor refuses the checkpoint while sbxd captures the
// sandbox: the freeze asks again until it is taken, then freezes.
func TestFreezeBusy(t *testing.T) {
	cp := &fakeCheckpoint{result: "resume", busy: 3}
	fakeFreezeEnv(t, cp, bootEnvA)
	var console bytes.Buffer
	r := newFreezer(&console).freeze(initRequest{}, peer{pid: os.Getpid()})
	if r.State != FreezeFrozen || r.Slot != "im_aaaaaaaaaa" || cp.busy != 0 || string(cp.wrote) != "1" {
		t.Fatalf("record %+v (busy left %d, wrote %q), want frozen after three refusals", r, cp.busy, cp.wrote)
	}
	if vs := controlLines(t, console.String()); len(vs) != 1 || vs[0].Result != freezewire.Frozen {
		t.Errorf("control lines %+v, want one frozen verdict", vs)
	}
}

// TestFreezeBusyNewBoot: the capture that kept refusing was a stop; the
// freeze, held in its image, goes on after the resume as a freeze of the
// new boot, in its slot and under its name.
func TestFreezeBusyNewBoot(t *testing.T) {
	cp := &fakeCheckpoint{result: "resume", busy: 2}
	environ := fakeFreezeEnv(t, cp, bootEnvA)
	resumed := map[string]string{freezewire.SlotEnv: "im_dddddddddd", freezewire.NameEnv: "freeze-web-dddd",
		freezewire.SandboxEnv: "sb_aaaaaaaaaa", freezewire.RestoredFromEnv: "im_stopstopst"}
	cp.onBusy = func() { writeEnviron(t, environ, resumed) }
	var console bytes.Buffer
	f := newFreezer(&console)
	r := f.freeze(initRequest{}, peer{pid: os.Getpid()})
	if r.State != FreezeFrozen || r.Slot != "im_dddddddddd" || r.Name != "freeze-web-dddd" {
		t.Fatalf("record %+v, want frozen in the new boot's slot", r)
	}
	if vs := controlLines(t, console.String()); len(vs) != 1 || vs[0].Slot != "im_dddddddddd" {
		t.Errorf("control lines %+v, want one verdict for the new boot's slot", vs)
	}
	// the new boot froze already: a freeze held across it says so
	cp.busy, cp.wrote = 1, nil
	writeEnviron(t, environ, bootEnvA)
	cp.onBusy = func() { writeEnviron(t, environ, resumed) }
	if r := f.freeze(initRequest{}, peer{pid: os.Getpid()}); r.State != FreezeUsed || !strings.Contains(r.Error, "froze already, as freeze-web-dddd") {
		t.Errorf("a freeze held into a boot that froze: %+v, want used", r)
	}
}

// TestFreezeBusyGivesUp: refused for longer than busyWait, the freeze
// fails and says why.
func TestFreezeBusyGivesUp(t *testing.T) {
	oldWait, oldPoll := busyWait, busyPoll
	busyWait, busyPoll = 30*time.Millisecond, 5*time.Millisecond
	t.Cleanup(func() { busyWait, busyPoll = oldWait, oldPoll })
	cp := &fakeCheckpoint{result: "resume", busy: 1 << 30}
	fakeFreezeEnv(t, cp, bootEnvA)
	var console bytes.Buffer
	r := newFreezer(&console).freeze(initRequest{}, peer{pid: os.Getpid()})
	if r.State != FreezeFailed || !strings.Contains(r.Error, "sbx was capturing this sandbox") {
		t.Fatalf("record %+v, want failed, saying sbx was capturing", r)
	}
	if len(controlLines(t, console.String())) != 0 {
		t.Errorf("a freeze gVisor never took told sbxd: %q", console.String())
	}
}

// TestFreezeCaughtOnItsWay: a stop paused the sandbox after init took the
// request and before it asked gVisor; resumed, gVisor writes the new
// boot's slot, and the freeze is recorded as the new boot's.
func TestFreezeCaughtOnItsWay(t *testing.T) {
	cp := &fakeCheckpoint{result: "resume"}
	environ := fakeFreezeEnv(t, cp, bootEnvA)
	open := openCheckpoint
	openCheckpoint = func() (io.ReadWriteCloser, error) {
		writeEnviron(t, environ, map[string]string{freezewire.SlotEnv: "im_eeeeeeeeee", freezewire.NameEnv: "freeze-web-eeee",
			freezewire.SandboxEnv: "sb_aaaaaaaaaa", freezewire.RestoredFromEnv: "im_stopstopst"})
		return open()
	}
	var console bytes.Buffer
	r := newFreezer(&console).freeze(initRequest{}, peer{pid: os.Getpid()})
	if r.State != FreezeFrozen || r.Slot != "im_eeeeeeeeee" || r.Name != "freeze-web-eeee" {
		t.Fatalf("record %+v, want frozen as the resumed boot's freeze-web-eeee", r)
	}
	if vs := controlLines(t, console.String()); len(vs) != 1 || vs[0].Slot != "im_eeeeeeeeee" {
		t.Errorf("control lines %+v, want one verdict for the resumed boot's slot", vs)
	}
}

// TestAncestorsOf: a crash names its process's parents up to init, so the
// exec it came from can be told (its pid leads the chain somewhere).
func TestAncestorsOf(t *testing.T) {
	got := ancestorsOf(os.Getpid())
	if len(got) == 0 || got[0] != os.Getppid() {
		t.Fatalf("ancestorsOf(self) = %v, want it to start with the parent %d", got, os.Getppid())
	}
	if g := pgidOf(os.Getpid()); g != syscall.Getpgrp() {
		t.Errorf("pgidOf(self) = %d, want %d", g, syscall.Getpgrp())
	}
	if got := ancestorsOf(1 << 30); got != nil {
		t.Errorf("ancestorsOf(no such pid) = %v, want none", got)
	}
}
