package e2e

import (
	"context"
	"io"
	"os"
	"strings"
	"testing"
	"time"

	"sbx.dev/sbx/api"
)

// TestAttackInitLendsNoRoot: init is root, and anyone inside can reach its
// socket. The sandbox's default user asking init to run a command (the
// agent's own spawn verb, which names no user) gets a command of its own
// uid, not root's; asking for root by name is refused; and it cannot
// signal a command root started.
func TestAttackInitLendsNoRoot(t *testing.T) {
	d := shared
	id := d.newSandbox(t, "--template", "base")
	uid, _, c := execOut(t, d, id, "", "1m", "id -u")
	if c != 0 || strings.TrimSpace(uid) == "0" {
		t.Fatalf("the default user is %q (exit %d): this test wants one that is not root", uid, c)
	}
	// (its output is root's to read, so the command says who it is in a file)
	out, errOut, _ := execOut(t, d, id, "", "1m", "/.sbx/sbx-agent spawn --id ex_attack28a -- sh -c 'id -u > /tmp/who' >/dev/null 2>&1; for i in $(seq 50); do [ -s /tmp/who ] && break; sleep 0.1; done; cat /tmp/who")
	if strings.TrimSpace(out) != strings.TrimSpace(uid) {
		t.Errorf("the default user's spawn through init ran as %q (%s), want its own uid %s", out, errOut, uid)
	}
	// a hand-made request for root, on init's abstract socket
	probe := `python3 - <<'PY'
import socket, json
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.connect("\0sbx-agent")
s.sendall(json.dumps({"op": "spawn", "id": "ex_attack28b", "argv": ["id", "-u"], "user": "root"}).encode() + b"\n")
s.shutdown(socket.SHUT_WR)
print(s.recv(65536).decode())
PY`
	out, errOut, _ = execOut(t, d, id, "", "1m", probe)
	if !strings.Contains(out, "only as itself") {
		t.Errorf("a request as the default user to spawn as root: %q %s; want it refused", out, errOut)
	}
	// root's command is not the user's to signal
	if _, e, c := execOut(t, d, id, "root", "1m", "/.sbx/sbx-agent spawn --id ex_attack28c -- sleep 300 >/dev/null 2>&1 &"); c != 0 {
		t.Fatalf("root's background command: %s", e)
	}
	out, _, _ = execOut(t, d, id, "", "1m", "sleep 1; /.sbx/sbx-agent kill --id ex_attack28c --signal 9; echo code=$?")
	if strings.Contains(out, "code=0") {
		t.Errorf("the default user signalled root's command: %q", out)
	}
	if o, _, _ := execOut(t, d, id, "root", "1m", "pgrep -x sleep >/dev/null && echo alive"); !strings.Contains(o, "alive") {
		t.Errorf("root's command is gone after the user's kill: %q", o)
	}
}

// TestAttackStoppedCopier: root inside stops (SIGSTOP) the copier that
// carries an exec's output out. The exec does not wait for ever: its shim
// hears nothing from the copier (not even its alive frames) for 30 s,
// gives it up, and sbxd attaches a new copier, which brings the output and
// the exit code. (A copier is a process on the path without the exec
// channel: over the channel it is a goroutine of init.)
func TestAttackStoppedCopier(t *testing.T) {
	d := shimShared(t)
	id := d.newSandbox(t, "--template", "base")
	type res struct {
		out  string
		code int
		err  error
	}
	done := make(chan res, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
		defer cancel()
		var out strings.Builder
		x, err := sdk(d.client).Exec(ctx, id, api.ExecRequest{Cmd: []string{"sh", "-c", "sleep 6; echo done"}}, &out, io.Discard)
		r := res{out: out.String(), err: err, code: -1}
		if err == nil && x.ExitCode != nil {
			r.code = *x.ExitCode
		}
		done <- r
	}()
	var execID string
	waitFor(t, "the exec to run", time.Minute, func() bool {
		xs, _ := d.client.Sandbox(id).Execs(context.Background())
		for _, x := range xs {
			if x.State == api.ExecRunning && len(x.Cmd) == 3 && strings.Contains(x.Cmd[2], "echo done") {
				execID = x.ID
				return true
			}
		}
		return false
	})
	// the copier: an sbx-agent that holds the exec's stdout open to read it
	stop := `n=0; for p in /proc/[0-9]*; do pid=${p#/proc/}; tr '\0' ' ' < $p/cmdline 2>/dev/null | grep -q sbx-agent || continue; ls -l $p/fd 2>/dev/null | grep -q "execs/` + execID + `/stdout" || continue; kill -STOP $pid && n=$((n+1)); done; echo stopped=$n`
	out, errOut, _ := execOut(t, d, id, "root", "1m", stop)
	if !strings.Contains(out, "stopped=") || strings.Contains(out, "stopped=0") {
		t.Fatalf("no copier of %s found to stop: %q %s", execID, out, errOut)
	}
	select {
	case r := <-done:
		if r.err != nil || r.code != 0 || r.out != "done\n" {
			t.Errorf("the exec whose copier was stopped: %q, exit %d, %v; want \"done\\n\", exit 0", r.out, r.code, r.err)
		}
	case <-time.After(3 * time.Minute):
		log, _ := os.ReadFile(d.logPath)
		t.Fatalf("the exec whose copier was stopped (%s) still waits after 3 minutes; sbxd's log ends:\n%s", out, tailLines(string(log), 30))
	}
	// the stopped copier is let go, so the sandbox's cleanup finds it as it is
	execOut(t, d, id, "root", "1m", `for p in /proc/[0-9]*; do grep -q '^State:.*T' $p/status 2>/dev/null && kill -CONT ${p#/proc/}; done; true`)
}

// tailLines is the last n lines of s.
func tailLines(s string, n int) string {
	l := strings.Split(strings.TrimRight(s, "\n"), "\n")
	return strings.Join(l[max(0, len(l)-n):], "\n")
}
