package e2e

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"sbx.dev/sbx/api"
	"sbx.dev/sbx/internal/flaky"
)

// The acceptance tests of hunt --freeze: a test with a server fixture, a
// random token in a local variable and a seeded race is hunted with
// --freeze; in the copy resumed from the freeze, the failing process is
// alive, its stack is at the failing line, the token is read from its
// frame, and the server still answers (its teardown never ran there).

// freezeTestdata is internal/e2e/testdata/freeze/sub.
func freezeTestdata(sub string) string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "testdata", "freeze", sub)
}

// failLine is the line of file marked FAIL_LINE.
func failLine(t *testing.T, file string) int {
	t.Helper()
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	for i, l := range strings.Split(string(b), "\n") {
		if strings.Contains(l, "FAIL_LINE") {
			return i + 1
		}
	}
	t.Fatalf("%s has no FAIL_LINE", file)
	return 0
}

// frozenHuntCleanup removes, when the test ends, what a hunt --freeze
// named name makes: the copy NAME-frozen, the original, the freeze's
// snapshot (*frozen, once known) and the disk snapshot NAME.
func frozenHuntCleanup(t *testing.T, d *daemon, name string, frozen *string) {
	t.Helper()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		for _, sb := range []string{name + "-frozen", name, name + "-fork"} {
			_ = sdk(d.client).Delete(ctx, sb)
		}
		snaps := []string{name}
		if *frozen != "" {
			snaps = append(snaps, *frozen)
		}
		for _, sn := range snaps {
			_ = d.client.DeleteSnapshot(ctx, sn)
		}
		for _, sb := range []string{name + "-frozen", name} {
			if _, err := sdk(d.client).Get(ctx, sb); !errors.Is(err, api.ErrNotFound) {
				t.Errorf("cleanup: sandbox %s: %v, want not found", sb, err)
			}
		}
		for _, sn := range snaps {
			if _, err := sdk(d.client).GetSnapshot(ctx, sn); !errors.Is(err, api.ErrNotFound) {
				t.Errorf("cleanup: snapshot %s: %v, want not found", sn, err)
			}
		}
	})
}

// frozenHunt runs `sbx --json hunt --freeze` in dir and returns its
// events and its summary, which must be a frozen failure's.
func frozenHunt(t *testing.T, d *daemon, dir, name string, frozen *string, args ...string) ([]flaky.HuntEvent, *flaky.HuntSummary) {
	t.Helper()
	frozenHuntCleanup(t, d, name, frozen)
	start := time.Now()
	r := d.sbxDir(t, dir, append([]string{"--json", "hunt", "--freeze", "--template", "base", "--name", name}, args...)...)
	t.Logf("sbx hunt --freeze took %s", time.Since(start).Round(time.Millisecond))
	var events []flaky.HuntEvent
	sc := bufio.NewScanner(strings.NewReader(r.stdout))
	for sc.Scan() {
		var ev flaky.HuntEvent
		if err := json.Unmarshal(sc.Bytes(), &ev); err != nil {
			t.Fatalf("line %q: %v", sc.Text(), err)
		}
		events = append(events, ev)
		if ev.Summary != nil && ev.Summary.Frozen != "" {
			*frozen = ev.Summary.Frozen
		}
	}
	if r.code != 0 {
		t.Fatalf("sbx hunt --freeze: exit %d\nstdout: %s\nstderr: %s", r.code, r.stdout, r.stderr)
	}
	if len(events) == 0 {
		t.Fatalf("sbx hunt --freeze printed no events\nstderr: %s", r.stderr)
	}
	var order []string
	for _, ev := range events {
		t.Logf("%s %s run=%d %s %s", ev.Time.Format("15:04:05.000"), ev.Event, ev.Run, ev.Snapshot, ev.Message)
		switch ev.Event {
		case "frozen", "recorded", "copy", "artifacts", "snapshot", "deleted":
			order = append(order, ev.Event)
		}
	}
	if got := strings.Join(order, ","); got != "frozen,recorded,copy,artifacts,snapshot,deleted" {
		t.Errorf("outside steps %s, want frozen, recorded, copy, artifacts, snapshot, deleted", got)
	}
	last := events[len(events)-1]
	s := last.Summary
	if last.Event != "summary" || s == nil || !s.Failed || s.Frozen == "" {
		t.Fatalf("last line %+v, want the summary of a frozen failure\n%s", last, r.stdout)
	}
	t.Logf("run %d failed (seed %s, exit %d); frozen as %s %d ms after the failure (gVisor %d ms)", s.Run, s.Seed, s.ExitCode, s.Frozen, s.FrozenMs, s.PausedMs)
	if s.Copy != name+"-frozen" || s.Snapshot != name || s.Artifacts != filepath.Join(dir, "sbx-hunt-"+name) {
		t.Errorf("summary %+v: want the copy %s-frozen, the snapshot %s, the artifacts in %s", s, name, name, dir)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if sn, err := sdk(d.client).GetSnapshot(ctx, s.Frozen); err != nil || !sn.Memory {
		t.Errorf("the freeze's snapshot %s: %+v, %v; want one with memory", s.Frozen, sn, err)
	}
	if sn, err := sdk(d.client).GetSnapshot(ctx, name); err != nil || sn.Memory {
		t.Errorf("the disk snapshot %s: %+v, %v; want one without memory", name, sn, err)
	}
	if _, err := sdk(d.client).Get(ctx, name); !errors.Is(err, api.ErrNotFound) {
		t.Errorf("the original %s: %v, want deleted", name, err)
	}
	if sb, err := sdk(d.client).Get(ctx, s.Copy); err != nil || sb.State != api.StateReady {
		t.Errorf("the copy %s: %+v, %v; want it running", s.Copy, sb, err)
	} else if want := api.Duration(flaky.DefaultKeepTTL); sb.TTL != want {
		t.Errorf("the copy %s has the idle ttl %q, want %s (a forgotten copy goes by itself)", s.Copy, sb.TTL, want)
	}
	return events, s
}

// frozenPid is the process that froze, as the artifacts say.
func frozenPid(t *testing.T, art string) int {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(art, "frozen-pid.txt"))
	if err != nil {
		t.Fatalf("artifact frozen-pid.txt: %v", err)
	}
	pid, err := strconv.Atoi(strings.TrimSuffix(string(b), "\n"))
	if err != nil || pid <= 1 {
		t.Fatalf("frozen-pid.txt %q: want the pid that froze, alone on its line (--pid $(cat frozen-pid.txt))", b)
	}
	if c, err := os.ReadFile(filepath.Join(art, "frozen-cmd.txt")); err != nil || len(bytes.TrimSpace(c)) == 0 {
		t.Errorf("frozen-cmd.txt %q, %v: want the frozen process's command", c, err)
	}
	return pid
}

// checkFrozenFixture checks, in the copy, that process pid is alive, that
// the fixture's server on port answers with the token it was given (which
// it returns), and that the teardown's marker is not there.
func checkFrozenFixture(t *testing.T, d *daemon, cp string, pid, port int, teardown string) string {
	t.Helper()
	if r := d.sbx(t, "exec", cp, "--", "test", "-d", "/proc/"+strconv.Itoa(pid)); r.code != 0 {
		t.Errorf("the frozen process %d is not alive in the copy %s", pid, cp)
	}
	r := d.sbx(t, "exec", cp, "--", "curl", "-sS", "--max-time", "5", "http://127.0.0.1:"+strconv.Itoa(port)+"/")
	tok := regexp.MustCompile(`token=([0-9a-f]{16})`).FindStringSubmatch(r.stdout)
	if r.code != 0 || tok == nil {
		t.Fatalf("the fixture's server in the copy: exit %d %q %q, want it to answer its token", r.code, r.stdout, r.stderr)
	}
	if r := d.sbx(t, "exec", cp, "--", "test", "-e", teardown); r.code == 0 {
		t.Errorf("%s is in the copy: the fixture's teardown ran before the freeze", teardown)
	}
	return tok[1]
}

// gdbStack is gdb's full backtrace of every thread of pid in sandbox cp.
func gdbStackIn(t *testing.T, d *daemon, cp string, pid int) string {
	t.Helper()
	r := d.sbx(t, "exec", "-u", "0", cp, "--", "gdb", "-batch", "-nx", "-iex", "set debuginfod enabled off",
		"-p", strconv.Itoa(pid), "-ex", "thread apply all bt full")
	if r.code != 0 {
		t.Fatalf("gdb in %s: exit %d %q %q", cp, r.code, r.stdout, r.stderr)
	}
	return r.stdout
}

// TestHuntFreezePytest: `sbx hunt --freeze -- python3 -m pytest -p
// sbx_freeze` freezes the failing test at its assert, before its teardown.
func TestHuntFreezePytest(t *testing.T) {
	d := shared
	dir := t.TempDir()
	src := filepath.Join(freezeTestdata("pytest"), "test_race.py")
	b, err := os.ReadFile(src)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "test_race.py"), b, 0o644); err != nil {
		t.Fatal(err)
	}
	line := failLine(t, src)
	name := "hfpy-" + randHex(4)
	var frozen string
	_, s := frozenHunt(t, d, dir, name, &frozen, "--runs", "40", "--",
		"python3", "-m", "pytest", "-p", "sbx_freeze", "-q", "-p", "no:cacheprovider", "test_race.py")
	if s.ExitCode != 1 {
		t.Errorf("the failing run exited %d, want pytest's 1", s.ExitCode)
	}
	pid := frozenPid(t, s.Artifacts)
	token := checkFrozenFixture(t, d, s.Copy, pid, 8765, "/tmp/pytest-teardown-"+s.Seed)

	// the stack at the assert, the token in the test's frame: as the hunt
	// read it, and read again now
	want := regexp.MustCompile(`(?m)test_race\.py", line ` + strconv.Itoa(line) + `, in test_race\n.*\n(?:      .*\n)*?      token = '` + token + `'`)
	art, err := os.ReadFile(filepath.Join(s.Artifacts, "py-stack-"+strconv.Itoa(pid)+".txt"))
	if err != nil || !want.Match(art) {
		t.Errorf("the artifacts' Python stack of %d (%v), want test_race at line %d with token %s:\n%s", pid, err, line, token, art)
	}
	r := d.sbx(t, "exec", "-u", "0", s.Copy, "--", "/.sbx/sbx-agent", "pystack", "--pid", strconv.Itoa(pid))
	if r.code != 0 || !want.MatchString(r.stdout) {
		t.Errorf("pystack --pid %d in the copy: exit %d, want test_race at line %d with token %s:\n%s\n%s", pid, r.code, line, token, r.stdout, r.stderr)
	}
	// a second look: the process is still there, as it was
	if r := d.sbx(t, "exec", "-u", "0", s.Copy, "--", "/.sbx/sbx-agent", "pystack", "--pid", strconv.Itoa(pid)); r.code != 0 || !want.MatchString(r.stdout) {
		t.Errorf("a second pystack: exit %d:\n%s\n%s", r.code, r.stdout, r.stderr)
	}
}

// TestHuntFreezeGo: a Go test using sbx.dev/sbx/freeze freezes at its
// t.Fatalf, its server fixture alive.
func TestHuntFreezeGo(t *testing.T) {
	d := shared
	dir := t.TempDir()
	src := freezeTestdata("gotest")
	line := failLine(t, filepath.Join(src, "race_test.go"))
	build := exec.Command("go", "test", "-c", "-gcflags=all=-N -l", "-o", filepath.Join(dir, "race.test"), ".")
	build.Dir = src
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go test -c: %v\n%s", err, out)
	}
	name := "hfgo-" + randHex(4)
	var frozen string
	_, s := frozenHunt(t, d, dir, name, &frozen, "--runs", "40", "--", "./race.test", "-test.run", "TestRace", "-test.timeout", "0", "-test.v")
	pid := frozenPid(t, s.Artifacts)
	token := checkFrozenFixture(t, d, s.Copy, pid, 8766, "/tmp/go-teardown-"+s.Seed)
	stack := gdbStackIn(t, d, s.Copy, pid)
	frame := regexp.MustCompile(`gotest\.TestRace \(.*\) at .*race_test\.go:` + strconv.Itoa(line))
	if !frame.MatchString(stack) {
		t.Errorf("gdb's stack of %d has no TestRace frame at race_test.go:%d:\n%s", pid, line, stack)
	}
	if !strings.Contains(stack, token) {
		t.Errorf("gdb's stack of %d does not show the token %s in the test's frame:\n%s", pid, token, stack)
	}
	if m, _ := filepath.Glob(filepath.Join(s.Artifacts, "stack-"+strconv.Itoa(pid)+".txt")); len(m) == 0 {
		t.Errorf("no stack-%d.txt among the artifacts", pid)
	}
}

// TestHuntFreezeC: a C program whose SIGSEGV handler calls /.sbx/freeze is
// frozen in its handler, the faulting frame under it.
func TestHuntFreezeC(t *testing.T) {
	if _, err := exec.LookPath("gcc"); err != nil {
		t.Skip("no gcc on the host")
	}
	d := shared
	dir := t.TempDir()
	src := filepath.Join(freezeTestdata("c"), "race.c")
	line := failLine(t, src)
	if out, err := exec.Command("gcc", "-g", "-O0", "-pthread", "-o", filepath.Join(dir, "race"), src).CombinedOutput(); err != nil {
		t.Fatalf("gcc: %v\n%s", err, out)
	}
	name := "hfc-" + randHex(4)
	var frozen string
	_, s := frozenHunt(t, d, dir, name, &frozen, "--runs", "40", "--", "./race")
	if s.ExitCode != 139 {
		t.Errorf("the failing run exited %d, want 139 (SIGSEGV)", s.ExitCode)
	}
	pid := frozenPid(t, s.Artifacts)
	token := checkFrozenFixture(t, d, s.Copy, pid, 8767, "/nonexistent")
	stack := gdbStackIn(t, d, s.Copy, pid)
	for _, want := range []*regexp.Regexp{
		regexp.MustCompile(`on_segv`),
		regexp.MustCompile(`<signal handler called>`),
		regexp.MustCompile(`check \(token=0x[0-9a-f]+ "` + token + `".*\) at .*race\.c:` + strconv.Itoa(line)),
	} {
		if !want.MatchString(stack) {
			t.Errorf("gdb's stack of %d lacks %s:\n%s", pid, want, stack)
		}
	}
}

// TestHuntFreezeAnyCommand: a failing run of any other command is frozen
// as it ends: the server it leaked is alive in the copy, and read there.
func TestHuntFreezeAnyCommand(t *testing.T) {
	d := shared
	dir := copyExample(t)
	name := "hfsh-" + randHex(4)
	var frozen string
	_, s := frozenHunt(t, d, dir, name, &frozen, "--runs", "20", "--", "./test.sh")
	read := func(f string) string {
		b, err := os.ReadFile(filepath.Join(s.Artifacts, f))
		if err != nil {
			t.Errorf("artifact %s: %v", f, err)
		}
		return string(b)
	}
	if leaked := read("leaked.txt"); !strings.Contains(leaked, "service.py") {
		t.Errorf("leaked.txt %q, want the service", leaked)
	}
	if l := read("listening.txt"); !regexp.MustCompile(`(?m)python3.*8765|8765.*python3`).MatchString(l) {
		t.Errorf("no python3 listener on 8765 in listening.txt:\n%s", l)
	}
	waitFor(t, "the leaked service to answer in the copy", 20*time.Second, func() bool {
		r := d.sbx(t, "exec", s.Copy, "--", "curl", "-sS", "--max-time", "3", "http://127.0.0.1:8765/")
		return r.code == 0 && strings.Contains(r.stdout, "token=")
	})
}
