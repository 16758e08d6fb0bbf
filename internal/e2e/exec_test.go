package e2e

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"sbx.dev/sbx/api"
)

func TestExec(t *testing.T) { testExec(t, shared) }

func testExec(t *testing.T, d *daemon) {
	id := d.newSandbox(t, "--template", "tiny")
	tests := []struct {
		name       string
		args       []string
		code       int
		stdout     string
		stderrPart string
	}{
		{"argv", []string{"--", "echo", "hello", "world"}, 0, "hello world\n", ""},
		{"one string through sh", []string{"--", "echo a; echo b >&2; exit 3"}, 3, "a\n", "b"},
		{"env", []string{"--env", "FOO=bar", "--env", "PATH=/bin", "--", "sh", "-c", "echo $FOO $PATH"}, 0, "bar /bin\n", ""},
		{"cwd", []string{"--cwd", "/tmp", "--", "pwd"}, 0, "/tmp\n", ""},
		{"missing program", []string{"--", "no-such-program"}, 127, "", "not found"},
		{"root", []string{"--", "id", "-u"}, 0, "0\n", ""},
		{"not executable", []string{"--", "/etc/hostname"}, 126, "", "permission denied"},
		{"missing cwd", []string{"--cwd", "/nope", "--", "true"}, 1, "", "cwd /nope: no such directory"},
		{"missing program under a timeout", []string{"--timeout", "5s", "--", "no-such-program"}, 127, "", "not found"},
		{"env under a timeout", []string{"--timeout", "5s", "--env", "PATH=/bin", "--", "sh", "-c", "echo $PATH"}, 0, "/bin\n", ""},
		{"signal", []string{"--", "sh", "-c", "kill -9 $$"}, 137, "", ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := d.sbx(t, append([]string{"exec", id}, tc.args...)...)
			if r.code != tc.code {
				t.Errorf("exit = %d, want %d (stderr %q)", r.code, tc.code, r.stderr)
			}
			if r.stdout != tc.stdout {
				t.Errorf("stdout = %q, want %q", r.stdout, tc.stdout)
			}
			if !strings.Contains(r.stderr, tc.stderrPart) {
				t.Errorf("stderr = %q, want it to contain %q", r.stderr, tc.stderrPart)
			}
		})
	}
}

// TestExecTimeout: the platform kills the command and its children inside
// the sandbox, and the exit code is 124, whatever the client does.
func TestExecTimeout(t *testing.T) { testExecTimeout(t, shared) }

func testExecTimeout(t *testing.T, d *daemon) {
	id := d.newSandbox(t, "--template", "tiny")
	start := time.Now()
	r := d.sbx(t, "exec", id, "--timeout", "1s", "--", "sh", "-c", "(setsid sleep 300 &); sleep 300 & echo started; wait")
	if r.code != 124 {
		t.Fatalf("exit = %d, want 124 (stderr %q)", r.code, r.stderr)
	}
	if !strings.Contains(r.stdout, "started") || !strings.Contains(r.stderr, "timed out") {
		t.Errorf("stdout %q stderr %q", r.stdout, r.stderr)
	}
	if el := time.Since(start); el > 30*time.Second {
		t.Errorf("took %s", el)
	}
	// No sleep survives: neither the child nor the one that left the session.
	ps := d.must(t, "exec", id, "--", "ps")
	if strings.Contains(ps, "sleep 300") {
		t.Errorf("children survived the timeout:\n%s", ps)
	}
	var listed struct{ Execs []api.Exec }
	d.jsonOut(t, &listed, "ps", id)
	execs := listed.Execs
	var timed *api.Exec
	for i := range execs {
		if execs[i].TimedOut {
			timed = &execs[i]
		}
	}
	if timed == nil || timed.ExitCode == nil || *timed.ExitCode != 124 {
		t.Errorf("ps does not show the timed-out exec: %+v", execs)
	}
	// a usage error now: sbx reads the duration before it asks sbxd
	r = d.sbx(t, "exec", id, "--timeout", "forever", "--", "true")
	if r.code != 2 || !strings.Contains(r.stderr, "--timeout") {
		t.Errorf("bad timeout: exit %d stderr %q", r.code, r.stderr)
	}
}

func TestExecDetachAndLogs(t *testing.T) { testExecDetachAndLogs(t, shared) }

func testExecDetachAndLogs(t *testing.T, d *daemon) {
	id := d.newSandbox(t, "--template", "tiny")
	var e api.Exec
	d.jsonOut(t, &e, "exec", id, "--detach", "--", "sh", "-c", "for i in 1 2 3; do echo line$i; sleep 0.3; done; echo err >&2; exit 5")
	if e.ID == "" || e.Pid == 0 || e.State != api.ExecRunning {
		t.Fatalf("detached exec = %+v, want an id, a pid and running", e)
	}
	// Follow: the whole output, then the exit.
	r := d.sbx(t, "logs", id, "--exec", e.ID, "--follow")
	if r.stdout != "line1\nline2\nline3\n" || !strings.Contains(r.stderr, "err") {
		t.Errorf("logs --follow: stdout %q stderr %q", r.stdout, r.stderr)
	}
	ex, err := sdk(d.client).GetExec(context.Background(), id, e.ID)
	if err != nil {
		t.Fatal(err)
	}
	if ex.State != api.ExecExited || ex.ExitCode == nil || *ex.ExitCode != 5 {
		t.Errorf("exec after the end = %+v, want exited with 5", ex)
	}
	// The output is kept: reading it again gives the same.
	r = d.sbx(t, "logs", id, "--exec", e.ID)
	if r.stdout != "line1\nline2\nline3\n" {
		t.Errorf("logs again: %q", r.stdout)
	}
	r = d.sbx(t, "logs", id, "--exec", "ex_nosuchexec")
	if r.code != 1 || !strings.Contains(r.stderr, "not found") {
		t.Errorf("logs of an unknown exec: exit %d stderr %q", r.code, r.stderr)
	}
	out := d.must(t, "ps", id)
	if !strings.Contains(out, e.ID) || !strings.Contains(out, strconv.Itoa(5)) {
		t.Errorf("ps does not list the exec and its exit code:\n%s", out)
	}
}
