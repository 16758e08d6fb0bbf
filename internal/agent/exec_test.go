package agent

import (
	"bufio"
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// agentCmd returns a command running the built sbx-agent with args, killed
// (with its process group) when the test ends.
func agentCmd(t *testing.T, args ...string) *exec.Cmd {
	t.Helper()
	cmd := exec.Command(agentBin, args...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	// a leftover process holding the output pipes must fail the test, not hang it
	cmd.WaitDelay = 2 * time.Second
	// and a command that never ends must end the test, not hang it: every
	// wait on it has this deadline
	watchdog := time.AfterFunc(2*time.Minute, func() {
		if cmd.Process != nil {
			t.Errorf("sbx-agent %q still running after 2 minutes: killed", args)
			_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
			_ = cmd.Process.Kill()
		}
	})
	t.Cleanup(func() {
		watchdog.Stop()
		if cmd.Process != nil {
			_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
			_ = cmd.Process.Kill()
		}
	})
	return cmd
}

// runAgent runs the built sbx-agent and returns its exit code and output.
func runAgent(t *testing.T, env []string, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	cmd := agentCmd(t, args...)
	cmd.Env = env
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	if _, ok := err.(*exec.ExitError); err != nil && !ok {
		t.Fatalf("run sbx-agent: %v", err)
	}
	// Without a timeout the agent becomes the command, so a signal ends the
	// agent's own process: report it as runsc exec (and a shell) does.
	if ws, ok := cmd.ProcessState.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		return 128 + int(ws.Signal()), out.String(), errb.String()
	}
	return cmd.ProcessState.ExitCode(), out.String(), errb.String()
}

func TestExecExitCodes(t *testing.T) {
	dir := t.TempDir()
	writeFile(t, filepath.Join(dir, "noexec"), "#!/bin/sh\necho hi\n", 0o644)
	writeFile(t, filepath.Join(dir, "bin", "hello"), "#!/bin/sh\necho hello \"$@\"\n", 0o755)
	writeFile(t, filepath.Join(dir, "bin2", "hello"), "#!/bin/sh\necho shadowed\n", 0o644)

	tests := []struct {
		name       string
		env        []string
		args       []string
		code       int
		wantOut    string
		wantStderr string
	}{
		{"exit code passthrough", nil, []string{"--", "/bin/sh", "-c", "exit 7"}, 7, "", ""},
		{"success with output", nil, []string{"--", "/bin/sh", "-c", "echo out; echo err >&2"}, 0, "out\n", "err\n"},
		{"default PATH", nil, []string{"--", "sh", "-c", "exit 3"}, 3, "", ""},
		{"PATH lookup skips non-executable", []string{"PATH=" + dir + "/bin2:" + dir + "/bin"}, []string{"--", "hello", "a"}, 0, "hello a\n", ""},
		{"not found in PATH", nil, []string{"--", "no-such-command-sbx"}, ExitNotFoundExec, "", "sbx: no-such-command-sbx: command not found\n"},
		{"not found by path", nil, []string{"--", dir + "/missing"}, ExitNotFoundExec, "", "command not found"},
		{"not executable", nil, []string{"--", dir + "/noexec"}, ExitCannotExec, "", "sbx: " + dir + "/noexec: permission denied\n"},
		{"only non-executable in PATH", []string{"PATH=" + dir + "/bin2"}, []string{"--", "hello"}, ExitCannotExec, "", "permission denied"},
		{"directory", nil, []string{"--", dir}, ExitCannotExec, "", "is a directory"},
		{"signal death", nil, []string{"--", "/bin/sh", "-c", "kill -TERM $$"}, 128 + int(syscall.SIGTERM), "", ""},
		{"kill -9", nil, []string{"--", "/bin/sh", "-c", "kill -KILL $$"}, 128 + int(syscall.SIGKILL), "", ""},
		{"cwd", nil, []string{"--cwd", dir + "/bin", "--", "/bin/pwd"}, 0, dir + "/bin\n", ""},
		{"relative program from cwd", nil, []string{"--cwd", dir + "/bin", "--", "./hello"}, 0, "hello\n", ""},
		{"missing cwd", nil, []string{"--cwd", dir + "/nope", "--", "/bin/true"}, ExitError, "", "sbx: cwd " + dir + "/nope: no such directory\n"},
		{"no command", nil, []string{"--timeout", "1s"}, ExitUsageExec, "", "no command given"},
		{"bad timeout", nil, []string{"--timeout", "soon", "--", "/bin/true"}, ExitUsageExec, "", "invalid value"},
		{"finishes before timeout", nil, []string{"--timeout", "10s", "--", "/bin/sh", "-c", "exit 5"}, 5, "", ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			env := tc.env
			if env == nil {
				env = []string{} // PATH unset: the default applies
			}
			code, stdout, stderr := runAgent(t, env, append([]string{"exec"}, tc.args...)...)
			if code != tc.code {
				t.Errorf("exit code: got %d, want %d (stderr %q)", code, tc.code, stderr)
			}
			if stdout != tc.wantOut {
				t.Errorf("stdout: got %q, want %q", stdout, tc.wantOut)
			}
			if !strings.Contains(stderr, tc.wantStderr) {
				t.Errorf("stderr: got %q, want it to contain %q", stderr, tc.wantStderr)
			}
		})
	}
}

func TestExecForwardsSignals(t *testing.T) {
	for _, sig := range []syscall.Signal{syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP} {
		t.Run(sig.String(), func(t *testing.T) {
			// the shell reports the signal as an exit code, which proves it
			// reached the command rather than killing the agent
			cmd := agentCmd(t, "exec", "--", "/bin/sh", "-c",
				`trap 'exit 40' TERM; trap 'exit 41' INT; trap 'exit 42' HUP; echo ready; while :; do sleep 0.01; done`)
			out, err := cmd.StdoutPipe()
			if err != nil {
				t.Fatal(err)
			}
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			line, err := bufio.NewReader(out).ReadString('\n')
			if err != nil || line != "ready\n" {
				t.Fatalf("read ready: got %q, %v", line, err)
			}
			if err := cmd.Process.Signal(sig); err != nil {
				t.Fatal(err)
			}
			_ = cmd.Wait()
			want := map[syscall.Signal]int{syscall.SIGTERM: 40, syscall.SIGINT: 41, syscall.SIGHUP: 42}[sig]
			if got := cmd.ProcessState.ExitCode(); got != want {
				t.Errorf("exit code: got %d, want %d", got, want)
			}
		})
	}
}

// readPid waits for a pid file written by a test command.
func readPid(t *testing.T, path string) int {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		b, err := os.ReadFile(path)
		if pid, err2 := strconv.Atoi(strings.TrimSpace(string(b))); err == nil && err2 == nil && pid > 0 {
			return pid
		}
		if time.Now().After(deadline) {
			t.Fatalf("no pid in %s", path)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// killPidFiles kills the processes named in pid files when the test ends.
func killPidFiles(t *testing.T, paths ...string) {
	t.Cleanup(func() {
		for _, p := range paths {
			b, err := os.ReadFile(p)
			if err != nil {
				continue
			}
			if pid, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil && pid > 0 {
				_ = syscall.Kill(pid, syscall.SIGKILL)
			}
		}
	})
}

// alive says whether pid is a process that has not exited.
func alive(pid int) bool {
	_, state, ok := procStat(pid)
	return ok && state != 'Z' && state != 'X'
}

func TestExecTimeoutKillsTree(t *testing.T) {
	dir := t.TempDir()
	child, grandchild := filepath.Join(dir, "child.pid"), filepath.Join(dir, "grandchild.pid")
	killPidFiles(t, child, grandchild)
	// the grandchild leaves the session, so only the /proc walk can find it
	script := `setsid /bin/sh -c 'echo $$ > grandchild.pid.tmp; mv grandchild.pid.tmp grandchild.pid; exec sleep 100' &
echo $$ > child.pid
exec sleep 100`
	start := time.Now()
	code, _, stderr := runAgent(t, []string{"PATH=/usr/bin:/bin"}, "exec", "--timeout", "700ms", "--cwd", dir, "--", "/bin/sh", "-c", script)
	if took := time.Since(start); took > 5*time.Second {
		t.Errorf("took %s after a 700ms timeout", took)
	}
	if code != ExitTimeoutExec {
		t.Errorf("exit code: got %d, want %d", code, ExitTimeoutExec)
	}
	if want := "sbx: command timed out after 700ms\n"; stderr != want {
		t.Errorf("stderr: got %q, want %q", stderr, want)
	}
	for _, f := range []string{child, grandchild} {
		pid := readPid(t, f)
		// SIGKILL is asynchronous; give the kernel a moment to finish
		deadline := time.Now().Add(2 * time.Second)
		for alive(pid) && time.Now().Before(deadline) {
			time.Sleep(10 * time.Millisecond)
		}
		if alive(pid) {
			t.Errorf("%s: process %d is still alive", filepath.Base(f), pid)
		}
	}
}

func TestExecLeavesBackgroundProcesses(t *testing.T) {
	dir := t.TempDir()
	bg := filepath.Join(dir, "bg.pid")
	killPidFiles(t, bg)
	code, _, stderr := runAgent(t, nil, "exec", "--timeout", "10s", "--cwd", dir, "--", "/bin/sh", "-c",
		`/bin/sleep 100 >/dev/null 2>&1 & echo $! > bg.pid`)
	if code != 0 {
		t.Fatalf("exit code: got %d, want 0 (stderr %q)", code, stderr)
	}
	pid := readPid(t, bg)
	time.Sleep(50 * time.Millisecond) // tested: it outlives the agent by a while, as a kill on its exit would not let it
	if !alive(pid) {
		t.Errorf("background process %d died with the agent", pid)
	}
}

func TestDescendants(t *testing.T) {
	cmd := exec.Command("/bin/sh", "-c", "/bin/sleep 100 & wait")
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		killTree(cmd.Process.Pid, cmd.Process.Pid)
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	deadline := time.Now().Add(5 * time.Second)
	for len(descendants(cmd.Process.Pid)) < 1 {
		if time.Now().After(deadline) {
			t.Fatal("the shell's sleep never showed up")
		}
		time.Sleep(5 * time.Millisecond)
	}
	all := descendants(os.Getpid())
	found := false
	for _, p := range all {
		found = found || p == cmd.Process.Pid
	}
	if !found {
		t.Errorf("descendants(self) = %v, want it to contain %d", all, cmd.Process.Pid)
	}
}

// TestExecAs: with a timeout, the agent enforcing it stays root and only
// the command runs as the user (--as, which init passes): at the user's
// process limit, an agent running as them could not get a thread.
func TestExecAs(t *testing.T) {
	if os.Getuid() != 0 {
		t.Skip("needs root")
	}
	code, stdout, stderr := runAgent(t, []string{"PATH=/usr/bin:/bin", "HOME=/kept"}, "exec", "--timeout", "10s", "--as", "65534:65534:65533,65532", "--", "/bin/sh", "-c", "id -u; id -g; id -G; echo $HOME")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	if want := "65534\n65534\n65534 65532 65533\n/kept\n"; stdout != want {
		t.Errorf("got %q, want %q (the user's ids, the environment as given)", stdout, want)
	}
	for _, bad := range []string{"x", "1", "1:x", "1:2:3:4", "1:2:a"} {
		if code, _, stderr := runAgent(t, nil, "exec", "--timeout", "1s", "--as", bad, "--", "/bin/true"); code != ExitUsageExec || !strings.Contains(stderr, "--as") {
			t.Errorf("--as %q: exit %d %q, want a usage error", bad, code, stderr)
		}
	}
	if c, err := parseCred(formatCred(&syscall.Credential{Uid: 1000, Gid: 1000, Groups: []uint32{27, 100}})); err != nil || c.Uid != 1000 || c.Gid != 1000 || len(c.Groups) != 2 || c.Groups[1] != 100 {
		t.Errorf("formatCred and parseCred disagree: %+v %v", c, err)
	}
}
