package agent

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

var testSeq atomic.Int64

// newExecID returns an exec id no other test uses.
func newExecID() string {
	return fmt.Sprintf("ex_test%d", testSeq.Add(1))
}

// startSupervisor runs init's supervisor in this process on a socket and a
// directory of the test's own, which the in-process clients (Main) use too.
// It is stopped, with the commands it still runs killed, when the test ends.
func startSupervisor(t *testing.T) *supervisor {
	t.Helper()
	socket := fmt.Sprintf("@sbx-agent-unit-%d-%d", os.Getpid(), testSeq.Add(1))
	s := newSupervisor(socket, t.TempDir(), false, io.Discard)
	oldSocket, oldDir, oldSelf := initSocket, execsDir, selfExe
	initSocket, execsDir, selfExe = s.socket, s.dir, agentBin
	s.start()
	t.Cleanup(func() {
		s.stop()
		initSocket, execsDir, selfExe = oldSocket, oldDir, oldSelf
	})
	waitListening(t, socket)
	return s
}

// exitRecorded waits, up to 5 s, for init to record exec id's exit, so
// that nothing writes in its directory once a test's cleanup removes it.
func exitRecorded(dir, id string) {
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		if _, err := os.Stat(filepath.Join(dir, id, "exit")); err == nil {
			return
		}
	}
}

// waitListening waits until something accepts connections on socket.
func waitListening(t *testing.T, socket string) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		c, err := dialUnix(socket)
		if err == nil {
			c.Close()
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("nothing listens on %s: %v", socket, err)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// waitFor polls cond until it holds, failing the test after 5s.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// waitDone waits, at most a minute, until ch is closed: a command that
// never ends fails the test instead of hanging it.
func waitDone(t *testing.T, what string, ch <-chan struct{}) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(time.Minute):
		t.Fatalf("%s did not end within a minute", what)
	}
}

func TestSpawn(t *testing.T) {
	startSupervisor(t)
	dir := t.TempDir()
	writeFile(t, filepath.Join(dir, "noexec"), "#!/bin/sh\necho hi\n", 0o644)
	writeFile(t, filepath.Join(dir, "bin", "hello"), "#!/bin/sh\necho hello \"$@\"\n", 0o755)

	tests := []struct {
		name       string
		args       []string
		code       int
		wantOut    string
		wantStderr string
	}{
		{"output and exit code", []string{"--", "/bin/sh", "-c", "echo out; echo err >&2; exit 7"}, 7, "out\n", "err\n"},
		{"PATH lookup", []string{"--", "sh", "-c", "exit 3"}, 3, "", ""},
		{"env overrides, later wins", []string{"--env", "SBX_T=1", "--env", "SBX_T=2", "--", "/bin/sh", "-c", "echo $SBX_T"}, 0, "2\n", ""},
		{"env PATH is searched", []string{"--env", "PATH=" + dir + "/bin", "--", "hello", "a"}, 0, "hello a\n", ""},
		{"stdin is /dev/null", []string{"--", "/bin/cat"}, 0, "", ""},
		{"cwd", []string{"--cwd", dir + "/bin", "--", "/bin/pwd"}, 0, dir + "/bin\n", ""},
		{"relative program from cwd", []string{"--cwd", dir + "/bin", "--", "./hello"}, 0, "hello\n", ""},
		{"signal death", []string{"--", "/bin/sh", "-c", "kill -TERM $$"}, 143, "", ""},
		{"not found", []string{"--", "no-such-command-sbx"}, ExitNotFoundExec, "", "sbx: no-such-command-sbx: command not found\n"},
		{"not executable", []string{"--", dir + "/noexec"}, ExitCannotExec, "", "sbx: " + dir + "/noexec: permission denied\n"},
		{"directory", []string{"--", dir}, ExitCannotExec, "", "is a directory"},
		{"missing cwd", []string{"--cwd", dir + "/nope", "--", "/bin/true"}, ExitError, "", "sbx: cwd " + dir + "/nope: no such directory\n"},
		{"no command", []string{}, ExitUsageExec, "", "no command given"},
		{"bad env", []string{"--env", "=x", "--", "/bin/true"}, ExitUsageExec, "", "is not KEY=VALUE"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			args := append([]string{"spawn", "--id", newExecID()}, tc.args...)
			code, stdout, stderr := run(t, nil, args...)
			if code != tc.code {
				t.Errorf("exit code: got %d, want %d (stderr %q)", code, tc.code, stderr)
			}
			if stdout != tc.wantOut {
				t.Errorf("stdout: got %q, want %q", stdout, tc.wantOut)
			}
			if tc.wantStderr == "" && stderr != "" || !strings.Contains(stderr, tc.wantStderr) {
				t.Errorf("stderr: got %q, want it to contain %q", stderr, tc.wantStderr)
			}
		})
	}
}

func TestSpawnFailureLeavesNoExec(t *testing.T) {
	s := startSupervisor(t)
	id := newExecID()
	if code, _, _ := run(t, nil, "spawn", "--id", id, "--", "no-such-command-sbx"); code != ExitNotFoundExec {
		t.Fatalf("exit code: got %d, want %d", code, ExitNotFoundExec)
	}
	if _, err := os.Stat(filepath.Join(s.dir, id)); !os.IsNotExist(err) {
		t.Errorf("exec dir of a failed spawn: got %v, want it not to exist", err)
	}
	// and the id is still free
	if code, stdout, stderr := run(t, nil, "spawn", "--id", id, "--", "/bin/echo", "ok"); code != 0 || stdout != "ok\n" {
		t.Errorf("spawn after failure: got %d %q %q, want 0 \"ok\\n\"", code, stdout, stderr)
	}
}

func TestSpawnDuplicateID(t *testing.T) {
	startSupervisor(t)
	id := newExecID()
	if code, _, stderr := run(t, nil, "spawn", "--id", id, "--", "/bin/true"); code != 0 {
		t.Fatalf("first spawn: exit code %d (stderr %q)", code, stderr)
	}
	code, _, stderr := run(t, nil, "spawn", "--id", id, "--", "/bin/true")
	if code != ExitUsageExec || !strings.Contains(stderr, "already exists") {
		t.Errorf("second spawn: got %d %q, want %d and \"already exists\"", code, stderr, ExitUsageExec)
	}
}

// timeoutWays runs a test of a timed spawn both ways a timeout is kept:
// by init, the command its own subreaper (sbx-reaper), and by the agent's
// exec (an sbxd that installs no sbx-reaper).
func timeoutWays(t *testing.T, test func(t *testing.T, s *supervisor)) {
	for _, way := range []struct {
		name     string
		noReaper bool
	}{{"reaper", false}, {"agent", true}} {
		t.Run(way.name, func(t *testing.T) {
			s := startSupervisor(t)
			s.noReaper = way.noReaper
			if got := s.reaperPath() != ""; got == way.noReaper {
				t.Fatalf("sbx-reaper in use: %v, want %v (beside %s)", got, !way.noReaper, agentBin)
			}
			test(t, s)
		})
	}
}

func TestSpawnTimeoutKillsTree(t *testing.T) { timeoutWays(t, testSpawnTimeoutKillsTree) }

func testSpawnTimeoutKillsTree(t *testing.T, s *supervisor) {
	dir := t.TempDir()
	child, grandchild, orphan := filepath.Join(dir, "child.pid"), filepath.Join(dir, "grandchild.pid"), filepath.Join(dir, "orphan.pid")
	killPidFiles(t, child, grandchild, orphan)
	// the grandchild leaves the session, so only the /proc walk can find
	// it; the orphan's parent is gone too, so only a subreaper has it
	script := `echo started; setsid /bin/sh -c 'echo $$ > grandchild.pid.tmp; mv grandchild.pid.tmp grandchild.pid; exec sleep 100' &
(setsid sleep 100 & echo $! > orphan.pid.tmp; mv orphan.pid.tmp orphan.pid)
echo $$ > child.pid
exec sleep 100`
	id := newExecID()
	start := time.Now()
	code, stdout, stderr := run(t, nil, "spawn", "--id", id, "--timeout", "700ms", "--cwd", dir,
		"--env", "PATH=/usr/bin:/bin", "--", "/bin/sh", "-c", script)
	if took := time.Since(start); took > 5*time.Second {
		t.Errorf("took %s after a 700ms timeout", took)
	}
	if code != ExitTimeoutExec {
		t.Errorf("exit code: got %d, want %d", code, ExitTimeoutExec)
	}
	if stdout != "started\n" {
		t.Errorf("stdout: got %q, want %q", stdout, "started\n")
	}
	if want := "sbx: command timed out after 700ms\n"; stderr != want {
		t.Errorf("stderr: got %q, want %q", stderr, want)
	}
	if b, _ := os.ReadFile(filepath.Join(s.dir, id, "exit")); string(b) != "124\n" {
		t.Errorf("exit file: got %q, want %q", b, "124\n")
	}
	for _, f := range []string{child, grandchild, orphan} {
		pid := readPid(t, f)
		deadline := time.Now().Add(2 * time.Second)
		for alive(pid) && time.Now().Before(deadline) {
			time.Sleep(10 * time.Millisecond)
		}
		if alive(pid) {
			t.Errorf("%s: process %d is still alive", filepath.Base(f), pid)
		}
	}
}

func TestAttach(t *testing.T) {
	s := startSupervisor(t)
	id := newExecID()
	if code, _, stderr := run(t, nil, "spawn", "--id", id, "--", "/bin/sh", "-c", "echo hello world; printf abcdef >&2; exit 4"); code != 4 {
		t.Fatalf("spawn: exit code %d, want 4 (stderr %q)", code, stderr)
	}
	tests := []struct {
		name             string
		args             []string
		code             int
		wantOut, wantErr string
	}{
		{"from the start", []string{"--id", id}, 4, "hello world\n", "abcdef"},
		{"offsets", []string{"--id", id, "--stdout-offset", "6", "--stderr-offset", "3"}, 4, "world\n", "def"},
		{"offsets past the end", []string{"--id", id, "--stdout-offset", "100", "--stderr-offset", "100"}, 4, "", ""},
		{"unknown id", []string{"--id", "ex_nope"}, ExitUsageExec, "", "sbx: exec ex_nope never reached init"},
		{"id that escapes", []string{"--id", "../" + filepath.Base(s.dir)}, ExitUsageExec, "", "not found"},
		{"no id", []string{}, ExitUsageExec, "", "--id is required"},
		{"negative offset", []string{"--id", id, "--stdout-offset", "-1"}, ExitUsageExec, "", "negative offset"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			code, stdout, stderr := run(t, nil, append([]string{"attach"}, tc.args...)...)
			if code != tc.code {
				t.Errorf("exit code: got %d, want %d (stderr %q)", code, tc.code, stderr)
			}
			if stdout != tc.wantOut {
				t.Errorf("stdout: got %q, want %q", stdout, tc.wantOut)
			}
			if tc.code == 4 && stderr != tc.wantErr || !strings.Contains(stderr, tc.wantErr) {
				t.Errorf("stderr: got %q, want %q", stderr, tc.wantErr)
			}
		})
	}
}

// TestSettle: an exec init has not started, once followed (settled), is
// ended with 125 and a word, and a spawn of it still on its way is
// refused: an exec reported lost never runs afterwards. One that started
// is left alone.
func TestSettle(t *testing.T) {
	startSupervisor(t)
	id := newExecID()
	code, stdout, stderr := run(t, nil, "attach", "--id", id)
	if code != ExitUsageExec || stdout != "" || !strings.Contains(stderr, "exec "+id+" never reached init") {
		t.Fatalf("attach of an exec not started: %d %q %q, want 125 and why", code, stdout, stderr)
	}
	ghost := filepath.Join(t.TempDir(), "ghost")
	code, _, stderr = run(t, nil, "spawn", "--id", id, "--", "/bin/sh", "-c", "echo ran > "+ghost)
	if code != ExitUsageExec || !strings.Contains(stderr, "given up") {
		t.Errorf("a spawn after the settle: %d %q, want it refused", code, stderr)
	}
	if _, err := os.Stat(ghost); err == nil {
		t.Error("the settled exec ran")
	}
	// framed, as sbxd follows, and again: the same answer
	var out bytes.Buffer
	if code := Main([]string{"attach", "--framed", "--id", id}, nil, &out, io.Discard); code != ExitUsageExec {
		t.Errorf("attach --framed of the settled exec: exit %d, want 125", code)
	}
	if !strings.Contains(out.String(), "never reached init") {
		t.Errorf("attach --framed of the settled exec: %q, want why", out.String())
	}

	// one that started is followed as it is
	id2 := newExecID()
	if code, _, stderr := run(t, nil, "spawn", "--id", id2, "--", "/bin/sh", "-c", "echo started; exit 3"); code != 3 {
		t.Fatalf("spawn: %d %q", code, stderr)
	}
	rep, err := callInit(initRequest{Op: "settle", ID: id2})
	if err != nil || rep.Pid <= 0 || rep.Error != "" {
		t.Errorf("settle of a started exec: %+v %v, want its pid", rep, err)
	}
	if code, stdout, _ := run(t, nil, "attach", "--id", id2); code != 3 || stdout != "started\n" {
		t.Errorf("attach of a started exec after a settle: %d %q, want 3 \"started\"", code, stdout)
	}
	if rep, err := callInit(initRequest{Op: "settle", ID: "../x"}); err != nil || rep.Code != ExitInvalid {
		t.Errorf("settle of a bad id: %+v %v, want refused", rep, err)
	}
}

// TestSettleRecordsGone: init's records are files anyone root can remove
// (and prune does): a settled id is still refused once its record is
// gone, a running command whose record was removed is found by a settle
// (not declared never started), and a record forged for an id not yet
// started is not taken for the command's.
func TestSettleRecordsGone(t *testing.T) {
	s := startSupervisor(t)
	id := newExecID()
	if rep, err := callInit(initRequest{Op: "settle", ID: id}); err != nil || rep.Error != "" {
		t.Fatalf("settle: %+v %v", rep, err)
	}
	if err := os.RemoveAll(filepath.Join(s.dir, id)); err != nil {
		t.Fatal(err)
	}
	ghost := filepath.Join(t.TempDir(), "ghost")
	if code, _, stderr := run(t, nil, "spawn", "--id", id, "--", "/bin/sh", "-c", "echo ran > "+ghost); code != ExitUsageExec || !strings.Contains(stderr, "given up") {
		t.Errorf("a spawn after the settle, its record removed: %d %q, want it refused", code, stderr)
	}
	if _, err := os.Stat(ghost); err == nil {
		t.Error("the settled exec ran once its record was gone")
	}

	// running, its record removed
	id2 := newExecID()
	rep, err := callInit(initRequest{Op: "spawn", ID: id2, Argv: []string{"/bin/sh", "-c", "sleep 1; exit 7"}})
	if err != nil || rep.Pid <= 0 {
		t.Fatalf("spawn: %+v %v", rep, err)
	}
	if err := os.RemoveAll(filepath.Join(s.dir, id2)); err != nil {
		t.Fatal(err)
	}
	if rep2, err := callInit(initRequest{Op: "settle", ID: id2}); err != nil || rep2.Pid != rep.Pid {
		t.Errorf("settle of a running exec whose record was removed: %+v %v, want its pid %d", rep2, err, rep.Pid)
	}
	if code, _, stderr := run(t, nil, "attach", "--id", id2); code != 7 {
		t.Errorf("attach of it: %d %q, want its own exit 7", code, stderr)
	}

	// forged ahead of the spawn
	id3 := newExecID()
	dir := filepath.Join(s.dir, id3)
	os.MkdirAll(dir, 0o700)
	os.WriteFile(filepath.Join(dir, "exit"), []byte("0\n"), 0o600)
	os.WriteFile(filepath.Join(dir, "stdout"), []byte("forged\n"), 0o600)
	if code, stdout, _ := run(t, nil, "spawn", "--id", id3, "--", "/bin/sh", "-c", "echo real; exit 4"); code != 4 || stdout != "real\n" {
		t.Errorf("a spawn over a forged record: %d %q, want 4 \"real\"", code, stdout)
	}
}

func TestAttachFollowsOutput(t *testing.T) {
	s := startSupervisor(t)
	id := newExecID()
	gate := filepath.Join(t.TempDir(), "gate")
	script := `echo one; while [ ! -e "$1" ]; do sleep 0.01; done; echo two; exit 3`
	type result struct {
		code           int
		stdout, stderr string
	}
	var r result
	finished := make(chan struct{})
	go func() {
		defer close(finished)
		var out, errb syncBuffer
		code := Main([]string{"spawn", "--id", id, "--", "/bin/sh", "-c", script, "sh", gate}, nil, &out, &errb)
		r = result{code, out.String(), errb.String()}
	}()
	t.Cleanup(func() {
		writeFile(t, gate, "", 0o644)
		waitDone(t, "the spawn", finished)
	})
	waitFor(t, "the first line", func() bool {
		b, _ := os.ReadFile(filepath.Join(s.dir, id, "stdout"))
		return string(b) == "one\n"
	})
	select {
	case <-finished:
		t.Fatalf("attach ended before the command: %+v", r)
	case <-time.After(50 * time.Millisecond):
	}
	writeFile(t, gate, "", 0o644)
	waitDone(t, "the spawn", finished)
	if r.code != 3 || r.stdout != "one\ntwo\n" || r.stderr != "" {
		t.Errorf("got %d %q %q, want 3 \"one\\ntwo\\n\" \"\"", r.code, r.stdout, r.stderr)
	}
}

// syncBuffer is a bytes.Buffer safe to read while another goroutine writes.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

func TestSpawnLeavesDaemon(t *testing.T) { timeoutWays(t, testSpawnLeavesDaemon) }

func testSpawnLeavesDaemon(t *testing.T, _ *supervisor) {
	dir := t.TempDir()
	bg := filepath.Join(dir, "bg.pid")
	killPidFiles(t, bg)
	code, _, stderr := run(t, nil, "spawn", "--id", newExecID(), "--timeout", "10s", "--cwd", dir, "--",
		"/bin/sh", "-c", `/bin/sleep 100 & echo $! > bg.pid`)
	if code != 0 {
		t.Fatalf("exit code: got %d, want 0 (stderr %q)", code, stderr)
	}
	pid := readPid(t, bg)
	time.Sleep(50 * time.Millisecond) // tested: it outlives the command by a while, as a kill on its end would not let it
	if !alive(pid) {
		t.Errorf("background process %d died with the command", pid)
	}
}

func TestKill(t *testing.T) {
	s := startSupervisor(t)
	id := newExecID()
	var code int
	finished := make(chan struct{})
	go func() {
		defer close(finished)
		code = Main([]string{"spawn", "--id", id, "--", "/bin/sleep", "100"}, nil, io.Discard, io.Discard)
	}()
	t.Cleanup(func() {
		if pid, err := readExecPid(s.dir, id); err == nil {
			_ = syscall.Kill(-pid, syscall.SIGKILL)
		}
		waitDone(t, "the spawn", finished)
	})
	waitFor(t, "the pid file", func() bool { _, err := readExecPid(s.dir, id); return err == nil })

	if code, _, stderr := run(t, nil, "kill", "--id", id, "--signal", "15"); code != 0 {
		t.Fatalf("kill: exit code %d (stderr %q)", code, stderr)
	}
	select {
	case <-finished:
		if code != 143 {
			t.Errorf("exit code: got %d, want 143", code)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the command outlived SIGTERM")
	}

	tests := []struct {
		name    string
		args    []string
		code    int
		wantErr string
	}{
		{"unknown id", []string{"--id", "ex_nope"}, ExitNotFound, "sbx-agent: exec ex_nope not found\n"},
		{"bad id", []string{"--id", "../x"}, ExitInvalid, "bad exec id"},
		{"bad signal", []string{"--id", id, "--signal", "99"}, ExitInvalid, "bad signal 99"},
		{"exited", []string{"--id", id}, ExitError, "no process of it is left"},
		{"no id", []string{}, ExitInvalid, "--id is required"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			code, _, stderr := run(t, nil, append([]string{"kill"}, tc.args...)...)
			if code != tc.code || !strings.Contains(stderr, tc.wantErr) {
				t.Errorf("got %d %q, want %d and %q", code, stderr, tc.code, tc.wantErr)
			}
		})
	}
}

func TestInitSurvivesBadRequests(t *testing.T) {
	s := startSupervisor(t)
	for _, req := range []string{"nonsense\n", `{"op":"frob"}` + "\n", `{"op":"spawn","id":"x"}` + "\n", ""} {
		c, err := dialUnix(s.socket)
		if err != nil {
			t.Fatal(err)
		}
		io.WriteString(c, req)
		if rc, err := c.SyscallConn(); err == nil {
			rc.Control(func(fd uintptr) { syscall.Shutdown(int(fd), syscall.SHUT_WR) })
		}
		var rep initReply
		err = json.NewDecoder(c).Decode(&rep)
		c.Close()
		if err != nil || rep.Code != ExitUsageExec || rep.Error == "" {
			t.Errorf("request %q: got %+v, %v; want code %d and an error", req, rep, err, ExitUsageExec)
		}
	}
	// a client that never sends does not hold up the others
	idle, err := dialUnix(s.socket)
	if err != nil {
		t.Fatal(err)
	}
	defer idle.Close()
	if code, stdout, _ := run(t, nil, "spawn", "--id", newExecID(), "--", "/bin/echo", "ok"); code != 0 || stdout != "ok\n" {
		t.Errorf("spawn after bad requests: got %d %q, want 0 \"ok\\n\"", code, stdout)
	}
}

func TestSpawnNoInit(t *testing.T) {
	old := initSocket
	initSocket = fmt.Sprintf("@sbx-agent-nobody-%d", os.Getpid())
	oldWait := initBootWait
	initBootWait = 300 * time.Millisecond
	t.Cleanup(func() { initSocket, initBootWait = old, oldWait })
	code, _, stderr := run(t, nil, "spawn", "--id", newExecID(), "--", "/bin/true")
	if code != ExitUsageExec || !strings.Contains(stderr, "cannot reach init") {
		t.Errorf("got %d %q, want %d and \"cannot reach init\"", code, stderr, ExitUsageExec)
	}
}

// TestSpawnInitBooting: a request sent before init listens (a sandbox just
// booted) waits for it instead of failing with "cannot reach init".
func TestSpawnInitBooting(t *testing.T) {
	s := newSupervisor(fmt.Sprintf("@sbx-agent-late-%d", os.Getpid()), t.TempDir(), false, io.Discard)
	oldSocket, oldDir, oldSelf := initSocket, execsDir, selfExe
	initSocket, execsDir, selfExe = s.socket, s.dir, agentBin
	late := time.AfterFunc(300*time.Millisecond, s.start)
	t.Cleanup(func() {
		late.Stop()
		s.stop()
		initSocket, execsDir, selfExe = oldSocket, oldDir, oldSelf
	})
	code, stdout, stderr := run(t, nil, "spawn", "--id", newExecID(), "--", "/bin/echo", "late")
	if code != 0 || stdout != "late\n" {
		t.Errorf("spawn before init listened: exit %d %q %q; want it to wait and run", code, stdout, stderr)
	}
}

func TestMergeEnv(t *testing.T) {
	got := mergeEnv([]string{"A=1", "B=2", "A=3"}, []string{"B=x", "C=y", "C=z"})
	want := []string{"A=3", "B=x", "C=z"}
	if strings.Join(got, " ") != strings.Join(want, " ") {
		t.Errorf("got %q, want %q", got, want)
	}
}

// The tests below run the built binary: init as the sandbox's first process
// would (a subreaper reaping every child), and spawn, attach and kill as the
// `runsc exec` clients they are.

// startInit runs `sbx-agent init` and waits until it listens. When the test
// ends it kills init with every process below it.
func startInit(t *testing.T) *exec.Cmd {
	t.Helper()
	cmd := agentCmd(t, "init")
	var errb syncBuffer
	cmd.Stderr = &errb
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		// init is a subreaper: everything the commands left is below it
		killTree(cmd.Process.Pid, cmd.Process.Pid)
		_ = cmd.Wait()
		if s := errb.String(); s != "" {
			t.Logf("init stderr: %s", s)
		}
	})
	waitListening(t, binSocket)
	return cmd
}

func TestBinarySpawnPidFd(t *testing.T) {
	startInit(t)
	id := newExecID()
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	cmd := agentCmd(t, "spawn", "--id", id, "--pid-fd", "3", "--", "/bin/sh", "-c", "echo out; echo err >&2; exit 9")
	cmd.ExtraFiles = []*os.File{w}
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err = cmd.Start()
	w.Close()
	if err != nil {
		t.Fatal(err)
	}
	line, rerr := bufio.NewReader(r).ReadString('\n')
	_ = cmd.Wait()
	if code := cmd.ProcessState.ExitCode(); code != 9 || out.String() != "out\n" || errb.String() != "err\n" {
		t.Errorf("got %d %q %q, want 9 \"out\\n\" \"err\\n\"", code, out.String(), errb.String())
	}
	want, err := readExecPid(binExecsDir, id)
	if err != nil {
		t.Fatal(err)
	}
	if rerr != nil || line != strconv.Itoa(want)+"\n" {
		t.Errorf("pid fd: got %q, %v; want %q", line, rerr, strconv.Itoa(want)+"\n")
	}
}

func TestBinaryConcurrentSpawns(t *testing.T) {
	startInit(t)
	// init reaps any child: a command that ends at once must still be
	// matched to its exec, whichever of fork and reap comes first
	var wg sync.WaitGroup
	for i := range 20 {
		wg.Go(func() {
			code, stdout, stderr := runAgent(t, nil, "spawn", "--id", newExecID(), "--", "/bin/sh", "-c", fmt.Sprintf("echo %d; exit %d", i, i))
			if code != i || stdout != fmt.Sprintf("%d\n", i) {
				t.Errorf("spawn %d: got %d %q (stderr %q)", i, code, stdout, stderr)
			}
		})
	}
	wg.Wait()
}

func TestBinaryInitReapsDaemons(t *testing.T) {
	initCmd := startInit(t)
	dir := t.TempDir()
	bg := filepath.Join(dir, "bg.pid")
	killPidFiles(t, bg)
	code, _, stderr := runAgent(t, nil, "spawn", "--id", newExecID(), "--cwd", dir, "--",
		"/bin/sh", "-c", `/bin/sleep 100 & echo $! > bg.pid`)
	if code != 0 {
		t.Fatalf("exit code: got %d, want 0 (stderr %q)", code, stderr)
	}
	pid := readPid(t, bg)
	waitFor(t, "the daemon to be re-parented to init", func() bool {
		ppid, _, ok := procStat(pid)
		return ok && ppid == initCmd.Process.Pid
	})
	if !alive(pid) {
		t.Fatalf("daemon %d died with the command", pid)
	}
	_ = syscall.Kill(pid, syscall.SIGKILL)
	// a zombie still answers kill(pid, 0): gone means reaped
	waitFor(t, "init to reap the daemon", func() bool { return !processExists(pid) })
}

func TestBinaryClientGoesAway(t *testing.T) {
	startInit(t)
	id := newExecID()
	script := `i=0; while :; do echo $i; i=$((i+1)); sleep 0.02; done`
	client := agentCmd(t, "spawn", "--id", id, "--", "/bin/sh", "-c", script)
	stdout, err := client.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := client.Start(); err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReader(stdout)
	if line, err := br.ReadString('\n'); err != nil || line != "0\n" {
		t.Fatalf("first line: got %q, %v", line, err)
	}
	_ = client.Process.Kill()
	_ = client.Wait()
	pid, err := readExecPid(binExecsDir, id)
	if err != nil {
		t.Fatal(err)
	}
	outFile := filepath.Join(binExecsDir, id, "stdout")
	size := func() int64 { fi, _ := os.Stat(outFile); return fi.Size() }
	before := size()
	waitFor(t, "output after the client died", func() bool { return size() > before })
	if !alive(pid) {
		t.Fatalf("command %d died with its client", pid)
	}

	// an attach whose reader goes away ends quietly, and the command goes on
	att := agentCmd(t, "attach", "--id", id)
	attOut, err := att.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var attErr bytes.Buffer
	att.Stderr = &attErr
	if err := att.Start(); err != nil {
		t.Fatal(err)
	}
	if _, err := bufio.NewReader(attOut).ReadString('\n'); err != nil {
		t.Fatal(err)
	}
	attOut.Close()
	_ = att.Wait()
	if code := att.ProcessState.ExitCode(); code != 141 || attErr.String() != "" {
		t.Errorf("attach with its stdout closed: got %d %q, want 141 and no message", code, attErr.String())
	}
	before = size()
	waitFor(t, "output after attach went away", func() bool { return size() > before })

	// a new attach from the offset reached picks up where the first left
	// off, and sees the kill
	offset := size()
	att2 := agentCmd(t, "attach", "--id", id, "--stdout-offset", strconv.FormatInt(offset, 10))
	var out2 bytes.Buffer
	att2.Stdout = &out2
	if err := att2.Start(); err != nil {
		t.Fatal(err)
	}
	if code, _, stderr := runAgent(t, nil, "kill", "--id", id); code != 0 {
		t.Fatalf("kill: exit code %d (stderr %q)", code, stderr)
	}
	_ = att2.Wait()
	if code := att2.ProcessState.ExitCode(); code != 143 {
		t.Errorf("attach after kill: exit code %d, want 143", code)
	}
	all, err := os.ReadFile(outFile)
	if err != nil {
		t.Fatal(err)
	}
	if want := string(all[offset:]); out2.String() != want {
		t.Errorf("attach from %d: got %q, want %q", offset, out2.String(), want)
	}
}

// TestPruneEnded: ended commands' directories go, oldest first, once there
// are too many; running ones never do.
func TestPruneEnded(t *testing.T) {
	s := startSupervisor(t)
	for i := 0; i < keepEnded+5; i++ {
		dir := filepath.Join(s.dir, fmt.Sprintf("ex_old%03d", i))
		os.MkdirAll(dir, 0o700)
		os.WriteFile(filepath.Join(dir, "exit"), []byte("0\n"), 0o600)
		os.Chtimes(filepath.Join(dir, "exit"), time.Now(), time.Now().Add(time.Duration(i)*time.Second))
	}
	running := filepath.Join(s.dir, "ex_running")
	os.MkdirAll(running, 0o700)
	s.prune()
	for i := 0; i < 5; i++ {
		if _, err := os.Stat(filepath.Join(s.dir, fmt.Sprintf("ex_old%03d", i))); !os.IsNotExist(err) {
			t.Errorf("the oldest ended command %d is kept past the budget", i)
		}
	}
	if _, err := os.Stat(filepath.Join(s.dir, fmt.Sprintf("ex_old%03d", keepEnded+4))); err != nil {
		t.Errorf("the newest ended command went: %v", err)
	}
	if _, err := os.Stat(running); err != nil {
		t.Errorf("a running command's directory went: %v", err)
	}
}

// TestInstallEtc: init copies the sandbox's resolv.conf, hosts and hostname
// into /etc as files of its own, replacing a template's symlink (which
// could point anywhere) and leaving the source untouched.
func TestInstallEtc(t *testing.T) {
	src, dst := t.TempDir(), t.TempDir()
	for name, body := range map[string]string{"resolv.conf": "nameserver 10.0.0.1\n", "hosts": "127.0.0.1 localhost\n", "hostname": "sb\n"} {
		if err := os.WriteFile(filepath.Join(src, name), []byte(body), 0o444); err != nil {
			t.Fatal(err)
		}
	}
	outside := filepath.Join(t.TempDir(), "outside")
	os.WriteFile(outside, []byte("keep\n"), 0o644)
	if err := os.Symlink(outside, filepath.Join(dst, "resolv.conf")); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(dst, "hosts", "sub"), 0o755); err != nil { // a template's directory there
		t.Fatal(err)
	}
	if err := installEtc(src, dst); err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string]string{"resolv.conf": "nameserver 10.0.0.1\n", "hosts": "127.0.0.1 localhost\n", "hostname": "sb\n"} {
		fi, err := os.Lstat(filepath.Join(dst, name))
		if err != nil {
			t.Fatal(err)
		}
		if !fi.Mode().IsRegular() || fi.Mode().Perm() != 0o644 {
			t.Errorf("%s: mode %v, want a regular 0644 file", name, fi.Mode())
		}
		if b, _ := os.ReadFile(filepath.Join(dst, name)); string(b) != want {
			t.Errorf("%s = %q, want %q", name, b, want)
		}
	}
	if b, _ := os.ReadFile(outside); string(b) != "keep\n" {
		t.Errorf("the symlink's target was written: %q", b)
	}
	// No source (an older sbx binds the files itself): nothing to do.
	if err := installEtc(filepath.Join(src, "nosuch"), dst); err != nil {
		t.Errorf("missing source: %v", err)
	}
}

// TestSpawnTimedHidesCommand: the agent that enforces a timeout shows as
// `sbx-agent exec` alone, so `pgrep -f` and `pkill -f` of a pattern in the
// user's command find the command, never sbx's agent; and the command does
// not inherit what carried its arguments.
func TestSpawnTimedHidesCommand(t *testing.T) { timeoutWays(t, testSpawnTimedHidesCommand) }

func testSpawnTimedHidesCommand(t *testing.T, s *supervisor) {
	dir := t.TempDir()
	marker := "hidden-" + strconv.Itoa(os.Getpid())
	script := `echo $PPID > ppid; env > env; echo ` + marker + `; exec sleep 30`
	id := newExecID()
	done := make(chan struct{})
	go func() {
		defer close(done)
		run(t, nil, "spawn", "--id", id, "--timeout", "1m", "--cwd", dir, "--", "/bin/sh", "-c", script)
	}()
	t.Cleanup(func() {
		run(t, nil, "kill", "--id", id, "--signal", "9")
		waitDone(t, "the spawn", done)
	})
	ppid := readPid(t, filepath.Join(dir, "ppid"))
	waitFor(t, "the command's env", func() bool { b, _ := os.ReadFile(filepath.Join(dir, "env")); return len(b) > 0 })
	cmdline, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", ppid))
	if err != nil {
		t.Fatal(err)
	}
	args := strings.Split(strings.TrimSuffix(string(cmdline), "\x00"), "\x00")
	switch {
	case !s.noReaper && ppid != os.Getpid():
		// the command is what init started (sbx-reaper became it):
		// nothing of sbx's between them
		t.Errorf("the timed command's parent is pid %d (%q), want init (%d) itself", ppid, args, os.Getpid())
	case s.noReaper && (len(args) != 2 || filepath.Base(args[0]) != "sbx-agent" || args[1] != "exec" || strings.Contains(string(cmdline), marker)):
		t.Errorf("the timeout's agent (pid %d) shows %q; want sbx-agent exec alone", ppid, args)
	}
	env, _ := os.ReadFile(filepath.Join(dir, "env"))
	if strings.Contains(string(env), execArgsEnv) {
		t.Errorf("the command inherited %s: %s", execArgsEnv, env)
	}
}

// TestRenameHost: a copy's /etc names the copy, what else /etc/hosts says
// stays, and files that already agree (or say nothing) are left alone.
func TestRenameHost(t *testing.T) {
	for _, tc := range []struct {
		name, hostname, hosts, host string
		wantName, wantHosts         string
	}{
		{"a copy", "sb_parent\n", "127.0.0.1\tlocalhost\n10.88.0.2\tsb_parent\n10.0.0.9 db # sb_parent's db\n", "sb_copy",
			"sb_copy\n", "127.0.0.1\tlocalhost\n10.88.0.2\tsb_copy\n10.0.0.9 db # sb_parent's db\n"},
		{"aliases and no newline at the end", "sb_parent", "10.88.0.2 sb_parent web sb_parent.local", "sb_copy",
			"sb_copy\n", "10.88.0.2\tsb_copy web sb_parent.local"},
		{"already right", "sb_copy\n", "10.88.0.2\tsb_copy\n", "sb_copy", "sb_copy\n", "10.88.0.2\tsb_copy\n"},
		{"no name in hosts: hostname only", "sb_parent\n", "127.0.0.1 localhost\n", "sb_copy", "sb_copy\n", "127.0.0.1 localhost\n"},
		{"an empty hostname file says nothing", "", "10.88.0.2 sb_parent\n", "sb_copy", "", "10.88.0.2 sb_parent\n"},
		{"a name that is no name", "sb_parent\n", "10.88.0.2 sb_parent\n", "a b", "sb_parent\n", "10.88.0.2 sb_parent\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			etc := t.TempDir()
			writeFile(t, filepath.Join(etc, "hostname"), tc.hostname, 0o644)
			writeFile(t, filepath.Join(etc, "hosts"), tc.hosts, 0o644)
			if err := renameHost(etc, tc.host); err != nil {
				t.Fatal(err)
			}
			name, _ := os.ReadFile(filepath.Join(etc, "hostname"))
			hosts, _ := os.ReadFile(filepath.Join(etc, "hosts"))
			if string(name) != tc.wantName || string(hosts) != tc.wantHosts {
				t.Errorf("hostname %q, hosts %q; want %q, %q", name, hosts, tc.wantName, tc.wantHosts)
			}
		})
	}
	if err := renameHost(filepath.Join(t.TempDir(), "none"), "x"); err != nil {
		t.Errorf("no /etc at all: %v", err)
	}
}

// TestSpawnTimedCannotRun: a program the user may not run is refused the
// same with a timeout as without (init looks it up as root; the execve is
// the user's): 126 and "permission denied" on its stderr, both ways.
func TestSpawnTimedCannotRun(t *testing.T) {
	timeoutWays(t, func(t *testing.T, s *supervisor) {
		dir := t.TempDir()
		prog := filepath.Join(dir, "bin", "x")
		if err := os.MkdirAll(filepath.Dir(prog), 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(prog, []byte("#!/bin/sh\necho secret\n"), 0o755); err != nil {
			t.Fatal(err)
		}
		for _, timeout := range []string{"", "1m"} {
			id := newExecID()
			rep := s.spawn(initRequest{Op: "spawn", ID: id, Argv: []string{prog}, User: "nobody", Timeout: timeout})
			code, stderr := rep.Code, rep.Error
			if rep.Error == "" && rep.Code == 0 {
				// started: its end says
				exit := filepath.Join(s.dir, id, "exit")
				waitFor(t, "the exit of "+id, func() bool { _, err := os.Stat(exit); return err == nil })
				b, _ := os.ReadFile(exit)
				code, _ = strconv.Atoi(strings.TrimSpace(string(b)))
				e, _ := os.ReadFile(filepath.Join(s.dir, id, "stderr"))
				stderr = string(e)
			}
			if code != ExitCannotExec || !strings.Contains(stderr, "permission denied") || strings.Contains(stderr, "secret") {
				t.Errorf("timeout %q: exit %d, stderr %q; want %d and permission denied", timeout, code, stderr, ExitCannotExec)
			}
		}
	})
}

// TestSettlePruned: a command that ran and ended, whose records prune
// then removed (past the budget), is settled to its real end: its exit
// code back in its exit file with a note on stderr, never "it did not
// run" (exit 125), and a start sent again does not run it twice.
// (TestAttackCopierPrunedBeforeReattach in internal/e2e, through a
// restarted sbxd.)
func TestSettlePruned(t *testing.T) {
	s := startSupervisor(t)
	ran := filepath.Join(t.TempDir(), "ran")
	id := newExecID()
	rep, err := callInit(initRequest{Op: "spawn", ID: id, Argv: []string{"/bin/sh", "-c", "echo x >> " + ran + "; exit 7"}})
	if err != nil || rep.Pid <= 0 {
		t.Fatalf("spawn: %+v %v", rep, err)
	}
	exit := filepath.Join(s.dir, id, "exit")
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if _, err := os.Stat(exit); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the command's exit was not recorded in 10 s")
		}
	}
	// older than keepEnded newer ones: prune takes it
	os.Chtimes(exit, time.Now(), time.Now().Add(-time.Hour))
	for i := 0; i < keepEnded; i++ {
		dir := filepath.Join(s.dir, fmt.Sprintf("ex_new%03d", i))
		os.MkdirAll(dir, 0o700)
		os.WriteFile(filepath.Join(dir, "exit"), []byte("0\n"), 0o600)
	}
	s.prune()
	if _, err := os.Stat(filepath.Join(s.dir, id)); !os.IsNotExist(err) {
		t.Fatalf("prune left the oldest ended exec: %v", err)
	}
	if rep, err := callInit(initRequest{Op: "settle", ID: id}); err != nil || rep.Error != "" || rep.Pid <= 0 {
		t.Fatalf("settle of the pruned exec: %+v %v, want its pid", rep, err)
	}
	b, err := os.ReadFile(exit)
	if err != nil || strings.TrimSpace(string(b)) != "7" {
		t.Errorf("the pruned exec's exit file after a settle: %q %v, want 7 (it ran and exited 7)", b, err)
	}
	if b, _ := os.ReadFile(filepath.Join(s.dir, id, "stderr")); !strings.Contains(string(b), "pruned") {
		t.Errorf("its stderr after the settle: %q, want a note that its output was pruned", b)
	}
	if rep, err := callInit(initRequest{Op: "spawn", ID: id, Again: true, Argv: []string{"/bin/sh", "-c", "echo x >> " + ran + "; exit 7"}}); err != nil || rep.Error != "" || rep.Pid <= 0 {
		t.Errorf("a start sent again: %+v %v, want the first's pid", rep, err)
	}
	if b, _ := os.ReadFile(ran); string(b) != "x\n" {
		t.Errorf("the command ran %d times, want once", strings.Count(string(b), "x"))
	}
}
