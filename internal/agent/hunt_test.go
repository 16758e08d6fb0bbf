package agent

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"sbx.dev/sbx/internal/wire/freezewire"
)

// runHuntLoop runs the hunt loop (the agent binary) with c, its Dir and
// Work in dir, and returns its output and exit code. It runs in a pid
// namespace of its own with its own /proc: the loop kills the processes a
// passing run leaves behind and reads those of a failing one, and on the
// host those would be anyone's. Leaked processes die with the namespace.
func runHuntLoop(t *testing.T, dir string, c HuntConfig, extra ...string) (string, int) {
	t.Helper()
	if os.Getuid() != 0 {
		t.Skip("needs root for a pid namespace")
	}
	if _, err := exec.LookPath("unshare"); err != nil {
		t.Skip("no unshare")
	}
	c.Dir, c.Work = filepath.Join(dir, ".sbx-hunt"), dir
	if c.SeedEnv == "" {
		c.SeedEnv = "SEED"
	}
	b, _ := json.Marshal(c)
	cfg := filepath.Join(dir, "hunt.json")
	if err := os.WriteFile(cfg, b, 0o644); err != nil {
		t.Fatal(err)
	}
	args := append([]string{"--pid", "--fork", "--mount-proc", "--kill-child", agentBin, "hunt", "--config", cfg}, extra...)
	cmd := exec.Command("unshare", args...)
	out, err := cmd.Output()
	var ee *exec.ExitError
	if err != nil && !errors.As(err, &ee) {
		t.Fatalf("loop: %v", err)
	}
	return string(out), cmd.ProcessState.ExitCode()
}

func readIn(t *testing.T, dir, name string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, ".sbx-hunt", name))
	if err != nil {
		t.Errorf("evidence: %v", err)
	}
	return string(b)
}

// TestHuntLoop: the seeds reach the test, setup runs once, passing runs
// are reported, and a failure leaves the marker and the evidence.
func TestHuntLoop(t *testing.T) {
	dir := t.TempDir()
	out, code := runHuntLoop(t, dir, HuntConfig{Setup: "echo set >>setup-ran", Runs: 10, SeedEnv: "MYSEED", Collect: []string{filepath.Join(dir, "n")},
		Test: []string{"sh", "-c", `echo "seed $MYSEED"; test -e fail-now && exit 7; n=$(cat n 2>/dev/null || echo 0); echo $((n+1)) >n; [ $n -lt 2 ] || touch fail-now; exit 0`}})
	if code != HuntFailed {
		t.Fatalf("loop exit %d, want %d\n%s", code, HuntFailed, out)
	}
	if !strings.Contains(out, "sbx-hunt: setup\n") || !strings.Contains(out, "sbx-hunt: run 3 seed ") || !strings.Contains(out, "sbx-hunt: failed 4 seed ") ||
		!strings.Contains(out, HuntLineCaptured) {
		t.Errorf("loop output:\n%s", out)
	}
	marker := readIn(t, dir, "failed")
	if !strings.Contains(marker, "run=4\n") || !strings.Contains(marker, "exit=7\n") || !strings.Contains(marker, "time=") {
		t.Errorf("marker %q", marker)
	}
	seed := strings.TrimSpace(readIn(t, dir, "seed"))
	if _, err := strconv.ParseUint(seed, 10, 32); err != nil || !strings.Contains(marker, "seed="+seed+"\n") {
		t.Errorf("seed %q (%v), marker %q: want a uint32, the failing run's", seed, err, marker)
	}
	for _, name := range []string{"processes.txt", "listening.txt", "collected" + dir + "/n", "captured", "steps.log"} {
		if _, err := os.Stat(filepath.Join(dir, ".sbx-hunt", name)); err != nil {
			t.Errorf("evidence: %v", err)
		}
	}
	if b := readIn(t, dir, "test-output.txt"); b != "seed "+seed+"\n" {
		t.Errorf("test output %q, want the failing run's seed line", b)
	}
	if b, err := os.ReadFile(filepath.Join(dir, "setup-ran")); string(b) != "set\n" {
		t.Errorf("setup-ran %q (%v), want the setup run once", b, err)
	}
}

func TestHuntLoopEnds(t *testing.T) {
	for _, tc := range []struct {
		name     string
		c        HuntConfig
		wantCode int
		wantOut  string
	}{
		{"no failure", HuntConfig{Runs: 5, Test: []string{"true"}}, HuntNoFailure, "sbx-hunt: no failure in 5 runs"},
		{"setup fails", HuntConfig{Runs: 5, Setup: "echo broken; exit 9", Test: []string{"true"}}, HuntSetupFailed, "sbx-hunt: setup failed exit 9"},
		{"missing program", HuntConfig{Runs: 5, Test: []string{"no-such-program-here"}}, HuntFailed, " exit 127 "},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			out, code := runHuntLoop(t, dir, tc.c)
			if code != tc.wantCode || !strings.Contains(out, tc.wantOut) {
				t.Errorf("loop exit %d, want %d with %q:\n%s", code, tc.wantCode, tc.wantOut, out)
			}
		})
	}
	dir := t.TempDir()
	runHuntLoop(t, dir, HuntConfig{Runs: 1, Setup: "echo broken; exit 9", Test: []string{"true"}})
	if s := readIn(t, dir, "setup.out"); s != "broken\n" {
		t.Errorf("setup.out %q, want the setup's output", s)
	}
}

// TestHuntLoopCleansBetweenRuns: what a passing run leaves behind is
// killed before the next run: a leaked server cannot make later runs pass.
func TestHuntLoopCleansBetweenRuns(t *testing.T) {
	dir := t.TempDir()
	// each run fails if the last run's sleeper is still there
	test := `if [ -s pid ] && kill -0 "$(cat pid)" 2>/dev/null; then echo "left: $(cat pid)"; exit 1; fi; sleep 300 & echo $! >pid`
	out, code := runHuntLoop(t, dir, HuntConfig{Runs: 5, Test: []string{"sh", "-c", test}})
	if code != HuntNoFailure {
		t.Errorf("loop exit %d: a passing run's leftovers reached the next run:\n%s", code, out)
	}
}

// TestHuntLoopSparesOtherExecs: a passing run's leftovers are killed, but
// not the processes of another exec init runs (someone's `sbx exec -it`
// into the hunting sandbox, started during a run): the loop knows them by
// the group init made theirs and recorded in the exec's directory.
func TestHuntLoopSparesOtherExecs(t *testing.T) {
	dir := t.TempDir()
	rec := filepath.Join(binExecsDir, "hunt-spares-"+strconv.Itoa(os.Getpid()))
	t.Cleanup(func() { os.RemoveAll(rec) })
	// run 1 starts the other exec's process, in a group of its own as init
	// would, records it as init does, and leaves a plain leftover too;
	// run 2 fails if the first died or the second lives
	test := `n=$(cat n 2>/dev/null || echo 0); n=$((n+1)); echo $n >n
case $n in
1)
	setsid sleep 300 & o=$!
	until [ "$(cut -d' ' -f5 /proc/$o/stat)" = "$o" ]; do :; done
	mkdir -p ` + rec + ` && echo $o >` + rec + `/pid && echo $o >other
	sleep 300 & echo $! >leftover ;;
2)
	kill -0 "$(cat other)" || { echo "the other exec's process was killed"; exit 1; }
	if kill -0 "$(cat leftover)" 2>/dev/null; then echo "the run's leftover lives"; exit 1; fi ;;
esac`
	out, code := runHuntLoop(t, dir, HuntConfig{Runs: 3, Test: []string{"sh", "-c", test}})
	if code != HuntNoFailure {
		t.Errorf("loop exit %d:\n%s\n%s", code, out, readIn(t, dir, "run.out"))
	}
	// an ended exec (its exit file written) is no longer spared
	dir = t.TempDir()
	test = strings.Replace(test, "echo $o >other", "echo 0 >"+rec+"/exit && echo $o >other", 1)
	out, code = runHuntLoop(t, dir, HuntConfig{Runs: 3, Test: []string{"sh", "-c", test}})
	if code != HuntFailed || !strings.Contains(readIn(t, dir, "run.out"), "the other exec's process was killed") {
		t.Errorf("loop exit %d, want %d as an ended exec's process is a leftover:\n%s", code, HuntFailed, out)
	}
}

// TestHuntLoopLeak: a failing run's leaked processes are named with their
// open files; one that never listens is looked at again until ListenWait
// after the failure, and the loop still ends.
func TestHuntLoopLeak(t *testing.T) {
	dir := t.TempDir()
	start := time.Now()
	// the run ends once its child is sleep, not the shell's fork before the
	// exec (a busy machine showed the loop "sh -c ...")
	leak := `sleep 300 & c=; until [ "$c" = sleep ]; do read -r c < /proc/$!/comm; done; echo leaked $!; exit 1`
	out, code := runHuntLoop(t, dir, HuntConfig{Runs: 3, ListenWait: "1s", Test: []string{"sh", "-c", leak}})
	if code != HuntFailed {
		t.Fatalf("loop exit %d, want %d\n%s", code, HuntFailed, out)
	}
	if d := time.Since(start); d < time.Second || d > 30*time.Second {
		t.Errorf("the loop took %s, want the 1s ListenWait and not much more", d)
	}
	pid := strings.TrimSpace(strings.TrimPrefix(readIn(t, dir, "test-output.txt"), "leaked "))
	if leaked := readIn(t, dir, "leaked.txt"); !strings.HasPrefix(leaked, pid+" sleep 300") {
		t.Errorf("leaked.txt %q, want %s sleep 300", leaked, pid)
	}
	if files := readIn(t, dir, "files-"+pid+".txt"); !strings.Contains(files, "/proc/"+pid+"/fd") {
		t.Errorf("files-%s.txt %q, want its fds", pid, files)
	}
	if l := readIn(t, dir, "listening.txt"); !strings.Contains(l, "# at the failure") || !strings.Contains(l, "waiting for the leaked processes to listen") {
		t.Errorf("listening.txt lacks the first or the second look:\n%s", l)
	}
	steps := readIn(t, dir, "steps.log")
	for _, s := range []string{"processes", "evidence read", "listeners again", "captured"} {
		if !strings.Contains(steps, " "+s+"\n") {
			t.Errorf("steps.log lacks %q:\n%s", s, steps)
		}
	}
	if _, err := exec.LookPath("gdb"); err == nil {
		if st := readIn(t, dir, "stack-"+pid+".txt"); !strings.Contains(st, "thread apply all bt") {
			t.Errorf("stack-%s.txt %q, want gdb's stacks", pid, st)
		}
	}
}

// TestHuntLoopLateListener: a leaked server that starts listening after
// the first look at the listeners is in the second look.
func TestHuntLoopLateListener(t *testing.T) {
	if _, err := exec.LookPath("python3"); err != nil {
		t.Skip("no python3")
	}
	dir := t.TempDir()
	hunt := filepath.Join(dir, ".sbx-hunt")
	// the server listens once the evidence has been read, after the first
	// look, whatever the machine's speed; the deadline is far
	server := `import os, socket, time
while "evidence read" not in open(os.environ["H"] + "/steps.log").read(): time.sleep(0.05)
s = socket.socket(); s.bind(("127.0.0.1", 0)); s.listen(); time.sleep(300)`
	out, code := runHuntLoop(t, dir, HuntConfig{Runs: 1, ListenWait: "60s",
		Test: []string{"sh", "-c", "H=" + hunt + " python3 -c '" + server + "' & echo leaked $!; exit 1"}})
	if code != HuntFailed {
		t.Fatalf("loop exit %d, want %d\n%s", code, HuntFailed, out)
	}
	pid := strings.TrimSpace(strings.TrimPrefix(readIn(t, dir, "test-output.txt"), "leaked "))
	l := readIn(t, dir, "listening.txt")
	first, again, ok := strings.Cut(l, "# again at")
	if !ok {
		t.Fatalf("no second look at the listeners:\n%s", l)
	}
	if strings.Contains(first, "pid="+pid+",") {
		t.Errorf("the server was in the first look, before it listened:\n%s", l)
	}
	if !strings.Contains(again, "pid="+pid+",") {
		t.Errorf("the second look lacks the leaked server %s:\n%s", pid, l)
	}
}

// TestHuntLoopTimeout: a run that outlives the timeout is a failure with
// exit 124, recorded as timed out, and its processes are left running for
// the evidence; the test gets SIGINT and SIGQUIT as in the foreground.
func TestHuntLoopTimeout(t *testing.T) {
	dir := t.TempDir()
	// runs 1-3 pass at once, run 4 hangs
	test := `n=$(cat n 2>/dev/null || echo 0); n=$((n+1)); echo $n >n; grep SigIgn /proc/self/status; echo "run $n pid $$"; [ $n -lt 4 ] || exec sleep 300`
	out, code := runHuntLoop(t, dir, HuntConfig{Runs: 10, Timeout: "500ms", ListenWait: "100ms", Test: []string{"sh", "-c", test}})
	if code != HuntFailed {
		t.Fatalf("loop exit %d, want %d\n%s", code, HuntFailed, out)
	}
	if !strings.Contains(out, "sbx-hunt: failed 4 seed ") || !strings.Contains(out, " exit 124 ") {
		t.Errorf("loop output, want run 4 failed with exit 124:\n%s", out)
	}
	marker := readIn(t, dir, "failed")
	if !strings.Contains(marker, "run=4\n") || !strings.Contains(marker, "exit=124\n") || !strings.Contains(marker, "timedout=1\n") {
		t.Errorf("marker %q, want run 4, exit 124, timed out", marker)
	}
	b := readIn(t, dir, "test-output.txt")
	pid := strings.TrimSpace(b[strings.LastIndex(b, "pid ")+4:])
	var ign uint64
	if _, err := fmt.Sscanf(b, "SigIgn:\t%x", &ign); err != nil || ign&0x6 != 0 {
		t.Errorf("the test's SigIgn %#x (%v), want SIGINT and SIGQUIT not ignored:\n%s", ign, err, b)
	}
	if leaked := readIn(t, dir, "leaked.txt"); !strings.HasPrefix(leaked, pid+" sleep 300") {
		t.Errorf("leaked.txt %q, want the hung run's process %s alive (sleep 300)", leaked, pid)
	}
}

// TestHuntLoopStraySignal: a signal the test sends its parent (the loop)
// does not end the loop, nor turn a run into a failure.
func TestHuntLoopStraySignal(t *testing.T) {
	dir := t.TempDir()
	out, code := runHuntLoop(t, dir, HuntConfig{Runs: 20, Timeout: "5s", Test: []string{"sh", "-c", "kill -USR1 $PPID; kill -HUP $PPID; exit 0"}})
	if code != 0 || !strings.Contains(out, "no failure in 20 runs") {
		t.Fatalf("loop exit %d, want 0 and no failure:\n%s", code, out)
	}
}

// TestHuntLoopBadConfig: a config the loop cannot use is refused at once.
func TestHuntLoopBadConfig(t *testing.T) {
	dir := t.TempDir()
	for _, tc := range []struct{ name, body string }{
		{"not json", "{"},
		{"relative dir", `{"dir":"rel","runs":1,"seedEnv":"SEED","test":["true"]}`},
		{"no test", `{"dir":"/tmp/x","runs":1,"seedEnv":"SEED"}`},
		{"bad seed env", `{"dir":"/tmp/x","runs":1,"seedEnv":"A=B","test":["true"]}`},
		{"bad timeout", `{"dir":"/tmp/x","runs":1,"seedEnv":"SEED","test":["true"],"timeout":"soon"}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := filepath.Join(dir, "c.json")
			os.WriteFile(f, []byte(tc.body), 0o644)
			code, _, stderr := run(t, nil, "hunt", "--config", f)
			if code != ExitInvalid || !strings.Contains(stderr, "hunt:") {
				t.Errorf("exit %d %q, want %d with a message", code, stderr, ExitInvalid)
			}
		})
	}
	if code, _, _ := run(t, nil, "hunt"); code != ExitInvalid {
		t.Errorf("hunt without --config: exit %d, want %d", code, ExitInvalid)
	}
}

// startFreezeInit serves init's freeze requests for agentBin's processes
// (its socket), with a fake checkpoint file that freezes.
func startFreezeInit(t *testing.T) *supervisor {
	t.Helper()
	s := newSupervisor(binSocket, t.TempDir(), false, io.Discard)
	s.freezer = newFreezer(io.Discard)
	fakeFreezeEnv(t, &fakeCheckpoint{result: "resume"}, bootEnvA)
	s.start()
	t.Cleanup(s.stop)
	waitListening(t, binSocket)
	return s
}

// TestHuntLoopFreezes: under --freeze, a failing run that did not freeze
// itself is frozen by the loop as it ends; the loop says so and stops.
func TestHuntLoopFreezes(t *testing.T) {
	s := startFreezeInit(t)
	dir := t.TempDir()
	test := `echo "pp=$PYTHONPATH opts=$PYTEST_ADDOPTS freeze=$SBX_FREEZE"; n=$(cat n 2>/dev/null || echo 0); echo $((n+1)) >n; [ $n -lt 1 ]`
	out, code := runHuntLoop(t, dir, HuntConfig{Runs: 5, Freeze: true, Test: []string{"sh", "-c", test}})
	if code != HuntFrozen || !strings.Contains(out, "sbx-hunt: failed 2 seed ") || !strings.Contains(out, HuntLineFrozen+" freeze-web-aaaa") {
		t.Fatalf("loop exit %d, want %d, run 2 failed and frozen:\n%s", code, HuntFrozen, out)
	}
	if o := readIn(t, dir, "run.out"); !strings.Contains(o, "pp=/.sbx/python opts=-p sbx_freeze freeze=1") {
		t.Errorf("the run's environment: %q, want the plugin importable and loaded", o)
	}
	var rec FreezeRecord
	if err := json.Unmarshal([]byte(readIn(t, dir, "frozen")), &rec); err != nil || rec.State != FreezeFrozen || !strings.Contains(rec.Reason, "run 2 exited 1") {
		t.Errorf("frozen record %+v (%v)", rec, err)
	}
	if r := s.freezer.status(0); r.State != FreezeFrozen || r.FailedAt.IsZero() {
		t.Errorf("init's record %+v, want a freeze with the failure's time", r)
	}
	if _, err := os.Stat(filepath.Join(dir, ".sbx-hunt", "captured")); err == nil {
		t.Error("the loop read the evidence in the original: a frozen failure's is read from a copy")
	}
}

// TestHuntLoopRunFroze: a run that froze itself (a test's hook) is the
// failure; the loop does not freeze again.
func TestHuntLoopRunFroze(t *testing.T) {
	s := startFreezeInit(t)
	dir := t.TempDir()
	out, code := runHuntLoop(t, dir, HuntConfig{Runs: 5, Freeze: true,
		Test: []string{"sh", "-c", agentBin + " freeze --reason test_x --failed-at 1700000000.5; exit 1"}})
	if code != HuntFrozen || !strings.Contains(out, HuntLineFrozen) {
		t.Fatalf("loop exit %d, want %d:\n%s", code, HuntFrozen, out)
	}
	r := s.freezer.status(0)
	if r.Reason != "test_x" {
		t.Errorf("the freeze kept is %+v, want the test's own (test_x)", r)
	}
	if m := readIn(t, dir, "failed"); !strings.Contains(m, "time=1700000000.500000000\n") {
		t.Errorf("marker %q, want the time the test said it failed", m)
	}
}

// TestHuntLoopFreezeFails: a freeze that cannot be had falls back to the
// evidence in the original, and says why.
func TestHuntLoopFreezeFails(t *testing.T) {
	s := newSupervisor(binSocket, t.TempDir(), false, io.Discard)
	s.freezer = newFreezer(io.Discard)
	fakeFreezeEnv(t, &fakeCheckpoint{writeErr: errors.New("no")}, map[string]string{}) // no freezes in this boot
	s.start()
	t.Cleanup(s.stop)
	waitListening(t, binSocket)
	dir := t.TempDir()
	out, code := runHuntLoop(t, dir, HuntConfig{Runs: 1, Freeze: true, Test: []string{"false"}})
	if code != HuntFailed || !strings.Contains(out, "sbx-hunt: freeze failed: this sandbox was started without freezes") || !strings.Contains(out, HuntLineCaptured) {
		t.Fatalf("loop exit %d, want %d with the reason and the evidence:\n%s", code, HuntFailed, out)
	}
	_ = freezewire.Frozen
}

// TestHuntFreezeEnv: the runs of hunt --freeze have the hooks on
// PYTHONPATH once, whatever PYTHONPATH they inherit, and the plugin in
// PYTEST_ADDOPTS once.
func TestHuntFreezeEnv(t *testing.T) {
	for _, c := range []struct {
		env         []string
		pp, addopts string
	}{
		{nil, "/.sbx/python", "-p sbx_freeze"},
		{[]string{"PYTHONPATH=/.sbx/python"}, "/.sbx/python", "-p sbx_freeze"},
		{[]string{"PYTHONPATH=/app:/.sbx/python"}, "/app:/.sbx/python", "-p sbx_freeze"},
		{[]string{"PYTHONPATH=/app"}, "/.sbx/python:/app", "-p sbx_freeze"},
		{[]string{"PYTEST_ADDOPTS=-x"}, "/.sbx/python", "-p sbx_freeze -x"},
		{[]string{"PYTEST_ADDOPTS=-p sbx_freeze -x"}, "/.sbx/python", "-p sbx_freeze -x"},
	} {
		got := freezeEnv(c.env)
		want := []string{"PYTHONPATH=" + c.pp, "PYTEST_ADDOPTS=" + c.addopts, "SBX_FREEZE=1"}
		if !slices.Equal(got, want) {
			t.Errorf("freezeEnv(%q) = %q, want %q", c.env, got, want)
		}
	}
}

// TestHuntLoopOnCrash: under --on-crash a run that passes but during which
// the sandbox's crash count went up (a child of it crashed) ends the hunt;
// without --on-crash it does not.
func TestHuntLoopOnCrash(t *testing.T) {
	count := filepath.Join(t.TempDir(), CrashCountFile)
	// the third run "crashes": it bumps the count as gVisor and init would
	test := `n=$(cat ` + count + ` 2>/dev/null || echo 0); r=$(cat runs 2>/dev/null || echo 0); r=$((r+1)); echo $r >runs; [ $r -eq 3 ] && echo $((n+1)) >` + count + `; exit 0`
	for _, tc := range []struct {
		name     string
		onCrash  bool
		wantCode int
		wantOut  string
	}{
		{"on-crash", true, HuntFailed, "sbx-hunt: failed 3 "},
		{"without", false, HuntNoFailure, "no failure in 5 runs"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			os.Remove(count)
			dir := t.TempDir()
			out, code := runHuntLoop(t, dir, HuntConfig{Runs: 5, OnCrash: tc.onCrash, CrashCount: count, Test: []string{"sh", "-c", test}})
			if code != tc.wantCode || !strings.Contains(out, tc.wantOut) {
				t.Errorf("loop exit %d, want %d with %q:\n%s", code, tc.wantCode, tc.wantOut, out)
			}
		})
	}
}
