package runsc

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"sbx.dev/sbx/internal/wire/frame"
	"sbx.dev/sbx/internal/wire/freezewire"
)

// The test binary is also the shim (as sbxd is in production), and a
// framed copier for the shim to run.
func TestMain(m *testing.M) {
	if len(os.Args) > 2 && os.Args[1] == ShimArg {
		os.Exit(ShimMain(os.Args[2:]))
	}
	if len(os.Args) > 1 && os.Args[1] == "frames" {
		os.Exit(writeFrames(os.Args[2:]))
	}
	os.Exit(m.Run())
}

// writeFrames plays the agent's start: a pid, stdout and stderr, an exit
// code; "noexit" ends without one, "garbage" sends a corrupt frame,
// "flood N" sends N bytes of stdout.
func writeFrames(args []string) int {
	fw := frame.NewWriter(os.Stdout)
	_ = fw.WriteCode(frame.Pid, 7)
	_ = fw.Write(frame.Stdout, []byte("out\n"))
	_ = fw.Write(frame.Stderr, []byte("err\n"))
	fmt.Fprintln(os.Stderr, "a runsc message that is not the command's")
	switch {
	case len(args) == 0:
		_ = fw.WriteCode(frame.Exit, 3)
	case args[0] == "noexit":
	case args[0] == "held", args[0] == "heldnoexit":
		// a process that outlives the copier and holds its output
		holder := exec.Command("sleep", "60")
		holder.Stdout = os.Stdout
		if err := holder.Start(); err != nil {
			return 1
		}
		_ = os.WriteFile(args[1], []byte(strconv.Itoa(holder.Process.Pid)), 0o600)
		if args[0] == "held" {
			_ = fw.WriteCode(frame.Exit, 5)
		}
	case args[0] == "stall":
		// a copier stopped inside the sandbox: not a frame more; and, as
		// there, its stdout and stderr stay held (runsc handed them to the
		// sandbox) after runsc exec is gone
		holder := exec.Command("sleep", "60")
		holder.Stdout, holder.Stderr = os.Stdout, os.Stderr
		if err := holder.Start(); err != nil {
			return 1
		}
		_ = os.WriteFile(args[1], []byte(strconv.Itoa(holder.Process.Pid)), 0o600)
		time.Sleep(time.Minute)
	case args[0] == "alive":
		// a quiet command: only the copier's word that it is there
		for range 20 {
			time.Sleep(100 * time.Millisecond)
			_ = fw.Write(frame.Alive, nil)
		}
		_ = fw.WriteCode(frame.Exit, 0)
	case args[0] == "garbage":
		os.Stdout.Write([]byte{'z', 0, 0, 0, 1, 'q'})
	case args[0] == "flood":
		var n int
		fmt.Sscan(args[1], &n)
		chunk := bytes.Repeat([]byte("0123456789abcdef"), 4096)
		for n > 0 {
			k := min(n, len(chunk))
			_ = fw.Write(frame.Stdout, chunk[:k])
			n -= k
		}
		_ = fw.Write(frame.Stdout, []byte("THE-END"))
		_ = fw.WriteCode(frame.Exit, 0)
	}
	return 0
}

func runShim(t *testing.T, spec ShimSpec, stdin []byte) (dir string, events []ShimEvent) {
	t.Helper()
	d := &Driver{}
	dir = t.TempDir()
	spec.Dir = dir
	if spec.Head == 0 {
		spec.Head, spec.Tail = 1<<20, 1<<10
	}
	sh, err := d.StartShim(spec, stdin, nil)
	if err != nil {
		t.Fatal(err)
	}
	timeout := time.After(30 * time.Second)
	for {
		select {
		case ev, ok := <-sh.Events:
			if !ok {
				return dir, events
			}
			events = append(events, ev)
		case <-timeout:
			t.Fatal("the shim did not end")
		}
	}
}

func read(t *testing.T, dir, name string) string {
	t.Helper()
	b, _ := os.ReadFile(filepath.Join(dir, name))
	return string(b)
}

func TestShimFramed(t *testing.T) {
	self, _ := os.Executable()
	log := filepath.Join(t.TempDir(), "runtime.log")
	dir, evs := runShim(t, ShimSpec{Kind: "exec", Argv: []string{self, "frames"}, Framed: true, RuntimeLog: log}, nil)
	if got := read(t, dir, "stdout"); got != "out\n" {
		t.Errorf("stdout: got %q, want %q", got, "out\n")
	}
	if got := read(t, dir, "stderr"); got != "err\n" {
		t.Errorf("stderr: got %q, want only the command's %q (runsc's own goes to the runtime log)", got, "err\n")
	}
	if got := read(t, dir, "pid"); got != "7\n" {
		t.Errorf("pid file: got %q, want 7", got)
	}
	if code, ok := ReadExit(dir); !ok || code != 3 {
		t.Errorf("exit file: got %d %v, want 3", code, ok)
	}
	if got := read(t, dir, OffsetsFile); got != "4 4\n" {
		t.Errorf("offsets: got %q, want \"4 4\"", got)
	}
	if !strings.Contains(readAbs(log), "a runsc message") {
		t.Errorf("runtime log: got %q, want runsc's message", readAbs(log))
	}
	if len(evs) != 2 || evs[0].Pid != 7 || evs[1].Exit == nil || *evs[1].Exit != 3 {
		t.Errorf("events: got %+v, want pid 7 then exit 3", evs)
	}
}

func readAbs(p string) string { b, _ := os.ReadFile(p); return string(b) }

func TestShimLost(t *testing.T) {
	self, _ := os.Executable()
	for _, mode := range []string{"noexit", "garbage"} {
		t.Run(mode, func(t *testing.T) {
			dir, evs := runShim(t, ShimSpec{Kind: "exec", Argv: []string{self, "frames", mode}, Framed: true}, nil)
			if _, ok := ReadExit(dir); ok {
				t.Errorf("an exit file without an exit code from the command")
			}
			last := evs[len(evs)-1]
			if last.Exit != nil || last.Lost == "" {
				t.Errorf("last event: got %+v, want lost with a reason", last)
			}
		})
	}
}

// TestShimHeldOutput: a process that holds the copier's output open after
// the copier ends (root in the sandbox can) does not hold the exec: it ends
// at the exit frame, or lost a grace after runsc exec ends without one.
func TestShimHeldOutput(t *testing.T) {
	self, _ := os.Executable()
	for _, mode := range []string{"held", "heldnoexit"} {
		t.Run(mode, func(t *testing.T) {
			pidFile := filepath.Join(t.TempDir(), "holder")
			t.Cleanup(func() {
				if b, err := os.ReadFile(pidFile); err == nil {
					if pid, err := strconv.Atoi(string(b)); err == nil {
						syscall.Kill(pid, syscall.SIGKILL)
					}
				}
			})
			dir, evs := runShim(t, ShimSpec{Kind: "exec", Argv: []string{self, "frames", mode, pidFile}, Framed: true}, nil)
			last := evs[len(evs)-1]
			code, ok := ReadExit(dir)
			switch mode {
			case "held":
				if !ok || code != 5 || last.Exit == nil || *last.Exit != 5 {
					t.Errorf("exit file %d %v, last event %+v: want exit 5", code, ok, last)
				}
			case "heldnoexit":
				if ok || last.Exit != nil || !strings.Contains(last.Lost, "holds it open") {
					t.Errorf("last event %+v: want lost, saying something holds the output open", last)
				}
			}
		})
	}
}

func TestShimCapsOutput(t *testing.T) {
	self, _ := os.Executable()
	const head, tail = 64 << 10, 4 << 10
	dir, _ := runShim(t, ShimSpec{Kind: "exec", Argv: []string{self, "frames", "flood", "10000000"}, Framed: true, Head: head, Tail: tail}, nil)
	out := read(t, dir, "stdout")
	if len(out) > head+tail+200 {
		t.Errorf("stdout holds %d bytes, want at most head+tail (%d) and a note", len(out), head+tail)
	}
	if !strings.HasPrefix(out, "out\n0123") || !strings.HasSuffix(out, "THE-END") {
		t.Errorf("stdout keeps neither the head nor the tail: %q...%q", out[:16], out[len(out)-16:])
	}
	if !strings.Contains(out, "bytes of stdout dropped") {
		t.Errorf("stdout does not say what was dropped")
	}
	if got := read(t, dir, OffsetsFile); got != fmt.Sprintf("%d 4\n", 4+10000000+7) {
		t.Errorf("offsets count what was received, kept or not: got %q", got)
	}
}

func TestShimPlainAndStdin(t *testing.T) {
	dir, evs := runShim(t, ShimSpec{Kind: "exec", Argv: []string{"/bin/sh", "-c", "cat; echo e >&2; exit 5"}}, []byte("secret-from-stdin\n"))
	if got := read(t, dir, "stdout"); got != "secret-from-stdin\n" {
		t.Errorf("stdout: got %q", got)
	}
	if _, err := os.Stat(filepath.Join(dir, shimStdin)); !os.IsNotExist(err) {
		t.Errorf("the request stays on disk after it was read: %v", err)
	}
	if code, ok := ReadExit(dir); !ok || code != 5 {
		t.Errorf("exit: got %d %v, want 5", code, ok)
	}
	if len(evs) != 1 || evs[0].Exit == nil || *evs[0].Exit != 5 {
		t.Errorf("events: %+v", evs)
	}
}

func TestCappedFile(t *testing.T) {
	tests := []struct {
		name       string
		writes     []string
		head, tail int64
		want       string
	}{
		{"under the head", []string{"abc", "def"}, 10, 4, "abcdef"},
		{"tail kept", []string{"0123456789", "abcdefgh"}, 4, 3, "0123\n[sbx: 11 bytes of s dropped: past its first 4 bytes only the last 3 are kept]\nfgh"},
		{"tail wraps", []string{"0123", "ab", "cd", "e"}, 4, 3, "0123\n[sbx: 2 bytes of s dropped: past its first 4 bytes only the last 3 are kept]\ncde"},
		{"no tail", []string{"0123456"}, 4, 0, "0123\n[sbx: 3 bytes of s dropped: past its first 4 bytes only the last 0 are kept]\n"},
		// past the head but within head and tail: nothing dropped, no note
		{"fits head and tail", []string{"0123", "ab", "c"}, 4, 3, "0123abc"},
		{"fits head and tail in one write", []string{"012345"}, 4, 3, "012345"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p := filepath.Join(t.TempDir(), "f")
			f, _ := os.Create(p)
			c := newCappedFile(f, "s", tc.head, tc.tail, 0)
			for _, w := range tc.writes {
				c.Write([]byte(w))
			}
			c.Close()
			if got := readAbs(p); got != tc.want {
				t.Errorf("got %q, want %q", got, tc.want)
			}
		})
	}
}

// TestControlFilter: init's control lines are taken out of the console,
// wherever a write splits them; a freeze's verdict lands in its slot (the
// latest stands: it is a hint, sbxd decides from the slot), and only in a
// slot of the sandbox's; anything else is text.
func TestControlFilter(t *testing.T) {
	freezeDir := t.TempDir()
	slot := filepath.Join(freezeDir, "im_abcdefghij")
	if err := os.Mkdir(slot, 0o700); err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	c := &controlFilter{out: &out, freezeDir: freezeDir}
	line := freezewire.Line(freezewire.Verdict{Result: freezewire.Frozen, Record: freezewire.Record{Slot: "im_abcdefghij", Reason: "first"}})
	second := freezewire.Line(freezewire.Verdict{Result: freezewire.Failed, Record: freezewire.Record{Slot: "im_abcdefghij", Reason: "second"}})
	other := freezewire.Line(freezewire.Verdict{Result: freezewire.Frozen, Record: freezewire.Record{Slot: "im_zzzzzzzzzz"}})
	all := append(append(append([]byte("before "), line...), second...), other...)
	all = append(all, []byte("after\n")...)
	for len(all) > 0 { // in small pieces, as a pipe may hand them
		n := min(len(all), 7)
		c.Write(all[:n])
		all = all[n:]
	}
	c.flush()
	got := out.String()
	if strings.IndexByte(got, freezewire.ControlByte) >= 0 || !strings.HasPrefix(got, "before sbx: the sandbox says it froze") || !strings.HasSuffix(got, "after\n") {
		t.Errorf("console %q: want the control lines replaced by readable ones", got)
	}
	b, err := os.ReadFile(filepath.Join(slot, freezewire.VerdictFile))
	if err != nil {
		t.Fatal(err)
	}
	v, err := freezewire.Parse(append([]byte(freezewire.Prefix), b...))
	if err != nil || v.Result != freezewire.Failed || v.Reason != "second" {
		t.Errorf("verdict %+v %v, want the latest word", v, err)
	}
	if _, err := os.Stat(filepath.Join(freezeDir, "im_zzzzzzzzzz")); err == nil {
		t.Error("a verdict for a slot the sandbox does not have made a directory")
	}
	// a control byte with no end is text, cut at the bound
	out.Reset()
	c.Write(append([]byte{freezewire.ControlByte}, bytes.Repeat([]byte("x"), freezewire.MaxLine+10)...))
	c.flush()
	if !strings.HasPrefix(out.String(), "?xxx") {
		t.Errorf("an endless control line came out as %.20q", out.String())
	}
}

// TestControlFilterHarmless: a verdict, forged or not, changes nothing
// gVisor wrote: a "failed" line used to empty the slot's files, so root
// inside could destroy a freeze under way.
func TestControlFilterHarmless(t *testing.T) {
	freezeDir := t.TempDir()
	slot := filepath.Join(freezeDir, "im_abcdefghij")
	if err := os.Mkdir(slot, 0o700); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{freezewire.StateFile, freezewire.PagesFile} {
		if err := os.WriteFile(filepath.Join(slot, f), bytes.Repeat([]byte("p"), 8192), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	var out bytes.Buffer
	c := &controlFilter{out: &out, freezeDir: freezeDir}
	c.Write(freezewire.Line(freezewire.Verdict{Result: freezewire.Failed, Record: freezewire.Record{Slot: "im_abcdefghij"}}))
	for _, f := range []string{freezewire.StateFile, freezewire.PagesFile} {
		if fi, err := os.Stat(filepath.Join(slot, f)); err != nil || fi.Size() != 8192 {
			t.Errorf("%s after a failed verdict: %v, want it as gVisor left it", f, err)
		}
	}
	if _, err := os.Stat(filepath.Join(slot, freezewire.VerdictFile)); err != nil {
		t.Errorf("no verdict: %v", err)
	}
	if !strings.Contains(out.String(), "the sandbox says a freeze failed") {
		t.Errorf("console %q: want the failure said, as the sandbox's word", out.String())
	}
}

// TestShimStall: a copier that sends nothing at all for Stall (stopped by
// root inside the sandbox, say) is given up: runsc exec is ended and the
// copy reported lost, so that sbxd attaches a new one instead of waiting
// for ever; a quiet command whose copier says it is alive is not.
func TestShimStall(t *testing.T) {
	self, _ := os.Executable()
	pidFile := filepath.Join(t.TempDir(), "holder")
	t.Cleanup(func() {
		if b, err := os.ReadFile(pidFile); err == nil {
			if pid, err := strconv.Atoi(string(b)); err == nil {
				syscall.Kill(pid, syscall.SIGKILL)
			}
		}
	})
	start := time.Now()
	dir, evs := runShim(t, ShimSpec{Kind: "exec", Argv: []string{self, "frames", "stall", pidFile}, Framed: true, Stall: time.Second}, nil)
	last := evs[len(evs)-1]
	if last.Exit != nil || !strings.Contains(last.Lost, "sent nothing for 1s") {
		t.Errorf("a stalled copier: last event %+v, want lost, saying it sent nothing", last)
	}
	if _, ok := ReadExit(dir); ok {
		t.Error("a stalled copier left an exit file")
	}
	if d := time.Since(start); d > 30*time.Second {
		t.Errorf("the stalled copier held the shim %s (its sleep is a minute: runsc exec was not ended)", d)
	}
	dir, evs = runShim(t, ShimSpec{Kind: "exec", Argv: []string{self, "frames", "alive"}, Framed: true, Stall: time.Second}, nil)
	if code, ok := ReadExit(dir); !ok || code != 0 {
		t.Errorf("a quiet command whose copier says it is alive (2 s, Stall 1 s): exit %d %v, events %+v; want exit 0", code, ok, evs)
	}
}
