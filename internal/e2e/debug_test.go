package e2e

import (
	"context"
	"encoding/json"
	"strconv"
	"strings"
	"testing"
	"time"

	"sbx.dev/sbx/api"
)

// leakServer starts, detached as the default user, a Python "server.py"
// that listens on port and outlives the exec that started it (a process
// the user left running), and returns its pid.
func leakServer(t *testing.T, d *daemon, id string, port int) int {
	t.Helper()
	script := `cat > /tmp/server.py <<'EOF'
import socket, time
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("127.0.0.1", ` + strconv.Itoa(port) + `)); s.listen(8)
while True: time.sleep(1)
EOF
python3 /tmp/server.py > /dev/null 2>&1 &
echo $! > /tmp/server.pid`
	if o, e, code := execOut(t, d, id, "", "30s", script); code != 0 {
		t.Fatalf("start the server: exit %d %q %q", code, o, e)
	}
	var pid int
	waitFor(t, "the leaked server to listen", 30*time.Second, func() bool {
		o, _, code := execOut(t, d, id, "", "10s", `cat /tmp/server.pid; ss -ltn | grep -c ":`+strconv.Itoa(port)+` "`)
		f := strings.Fields(o)
		if code != 0 || len(f) != 2 || f[1] != "1" {
			return false
		}
		pid, _ = strconv.Atoi(f[0])
		return pid > 1
	})
	return pid
}

// TestDebugAsDefaultUser: in base, as `user`, the post's tools work on a
// process the user left running, as on a developer's box: gdb -p (a
// backtrace), strace -f -p (attached), gcore (a core), ltrace -p, and
// lsof -p under a sane descriptor limit (1024 soft, a high hard one).
func TestDebugAsDefaultUser(t *testing.T) {
	d := shared
	id := d.newSandbox(t, "--template", "base")
	pid := leakServer(t, d, id, 8771)
	p := strconv.Itoa(pid)
	for _, tc := range []struct{ name, cmd, want string }{
		{"ptrace_scope", `cat /proc/sys/kernel/yama/ptrace_scope`, "0"},
		{"the user", `id -un`, "user"},
		{"limits", `echo $(ulimit -Sn) $(ulimit -Hn)`, "1024 1048576"},
		// before the tracers: an ltrace ended by timeout may leave a
		// breakpoint behind, and the server dies of its SIGTRAP (a CI run
		// saw lsof find no listener after it)
		{"lsof -p", `lsof -p ` + p + ` | grep -c 'TCP localhost:8771 (LISTEN)'`, "1"},
		{"gdb -p", `gdb -p ` + p + ` --batch -ex bt 2>&1 | grep -c '^#0'`, "1"},
		{"strace -f -p", `timeout 2 strace -f -p ` + p + ` 2>&1 | grep -c "Process ` + p + ` attached"`, "1"},
		{"gcore", `cd /tmp && gcore -o core ` + p + ` > /dev/null 2>&1; test -s /tmp/core.` + p + ` && echo written`, "written"},
		{"ltrace -p", `timeout 2 ltrace -p ` + p + ` > /dev/null 2>/tmp/ltrace.err; grep -c "Operation not permitted" /tmp/ltrace.err`, "0"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			start := time.Now()
			o, e, _ := execOut(t, d, id, "", "60s", tc.cmd)
			if got := strings.TrimSpace(o); got != tc.want {
				t.Errorf("%s: %q (stderr %q), want %q", tc.cmd, got, e, tc.want)
			}
			t.Logf("%s took %s", tc.name, time.Since(start).Round(time.Millisecond))
		})
	}
	if o, _, code := execOut(t, d, id, "", "10s", `kill -0 `+p+` && echo alive`); code != 0 || strings.TrimSpace(o) != "alive" {
		t.Logf("the server %s did not outlive the tracers (ltrace's timeout can leave a breakpoint that kills it)", p)
	}
}

// TestDebugConsoleAsUser: the default user's `echo MARKER > /dev/console`
// works and lands in the console log, as the README's marker channel says.
func TestDebugConsoleAsUser(t *testing.T) {
	d := shared
	id := d.newSandbox(t, "--template", "base")
	marker := "marker-" + randHex(4)
	if o, e, code := execOut(t, d, id, "", "30s", `id -un; echo `+marker+` > /dev/console`); code != 0 || o != "user\n" {
		t.Fatalf("echo to /dev/console as the default user: exit %d %q %q", code, o, e)
	}
	waitFor(t, "the marker in the console log", 10*time.Second, func() bool {
		return strings.Contains(d.sbx(t, "logs", id, "--stream", "console").stdout, marker)
	})
}

// TestDebugPgrepFindsOnlyTheUsers: no sbx process inside carries the
// user's command line. A foreground exec (timed, so an agent enforces the
// timeout) of `pgrep -f server.py` finds nothing when no server runs, and
// only the server when one does; `pkill -f` as root kills the server, not
// its own exec.
func TestDebugPgrepFindsOnlyTheUsers(t *testing.T) {
	d := shared
	id := d.newSandbox(t, "--template", "base")
	for _, user := range []string{"", "root"} {
		if r := d.sbx(t, "exec", "-u", cmpOr(user, "user"), id, "pgrep", "-f", "server.py"); r.code != 1 || r.stdout != "" {
			t.Errorf("pgrep -f server.py as %q with no server: exit %d %q %q; want exit 1, nothing found (the agent shows as `sbx-agent exec` alone)", user, r.code, r.stdout, r.stderr)
		}
	}
	if r := d.sbx(t, "exec", "-u", "root", id, "pkill", "-f", "server.py"); r.code != 1 {
		t.Errorf("pkill -f server.py as root with no server: exit %d %q; want 1 (it killed its own exec: 143)", r.code, r.stderr)
	}
	pid := leakServer(t, d, id, 8772)
	if r := d.sbx(t, "exec", id, "pgrep", "-f", "server.py"); r.code != 0 || strings.TrimSpace(r.stdout) != strconv.Itoa(pid) {
		t.Errorf("pgrep -f server.py with the server running: exit %d %q; want just %d", r.code, r.stdout, pid)
	}
	if r := d.sbx(t, "exec", "-u", "root", id, "pkill", "-f", "server.py"); r.code != 0 {
		t.Errorf("pkill -f server.py as root: exit %d %q; want 0, the server killed", r.code, r.stderr)
	}
	waitFor(t, "the server to be gone", 10*time.Second, func() bool {
		return d.sbx(t, "exec", id, "pgrep", "-f", "server.py").code == 1
	})
	o, _, _ := execOut(t, d, id, "root", "30s", `ps -eo args | grep -c '^/.sbx/sbx-agent exec --'`)
	if strings.TrimSpace(o) != "0" {
		t.Errorf("ps shows an agent carrying a command line: %q", o)
	}
}

func cmpOr(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

// TestDebugHostnameInCopies: the hostname resolves in a sandbox and in
// every copy: a memory fork, a sandbox from a memory snapshot (as a
// freeze's copy is), as the user (sudo) and in a root terminal's shell.
func TestDebugHostnameInCopies(t *testing.T) {
	d := shared
	id := d.newSandbox(t, "--template", "base")
	check := func(what, sb string) {
		t.Helper()
		o, e, code := execOut(t, d, sb, "", "30s", `hostname; cat /etc/hostname; getent hosts "$(hostname)" | wc -l; sudo true`)
		want := sb + "\n" + sb + "\n1\n"
		if code != 0 || o != want || strings.Contains(e, "unable to resolve") {
			t.Errorf("%s %s: exit %d %q %q; want its own name in /etc/hostname and /etc/hosts, and sudo quiet", what, sb, code, o, e)
		}
	}
	check("the sandbox", id)
	snap := "dbghost" + randHex(3)
	d.must(t, "snapshot", id, snap, "--memory")
	t.Cleanup(func() { d.sbx(t, "snapshot", "rm", snap) })
	check("a sandbox from a memory snapshot", d.newSandbox(t, "--from", snap))
	var fork struct {
		Sandbox api.Sandbox `json:"sandbox"`
	}
	for _, line := range strings.Split(strings.TrimSpace(d.must(t, "--json", "fork", id, "--memory", "--wait")), "\n") {
		_ = json.Unmarshal([]byte(line), &fork)
	}
	if fork.Sandbox.ID == "" {
		t.Fatal("sbx fork --memory --wait printed no sandbox")
	}
	t.Cleanup(func() { _ = deleteSandbox(context.Background(), d.client, fork.Sandbox.ID) })
	check("a memory fork", fork.Sandbox.ID)

	// a root terminal in another copy, before any exec: its agent puts the
	// names right before the shell starts
	cp := d.newSandbox(t, "--from", snap)
	r := d.sbxIn(t, []byte("tr a-z A-Z < /etc/hostname\nexit\n"), "shell", "-u", "root", cp)
	if !strings.Contains(r.stdout, strings.ToUpper(cp)) {
		t.Errorf("a root shell in a fresh copy %s: %q %q; want /etc/hostname naming it", cp, r.stdout, r.stderr)
	}
}

// TestDebugEventsOfDeleted: `sbx events NAME` of a sandbox that is gone
// finds it by the name it had, and its last event lists the snapshots it
// removed as a list, never null.
func TestDebugEventsOfDeleted(t *testing.T) {
	d := shared
	name := "dbgev" + randHex(3)
	d.newSandbox(t, "--template", "tiny", "--name", name)
	d.must(t, "delete", name, "--yes")
	r := d.sbx(t, "--json", "events", name)
	if r.code != 0 {
		t.Fatalf("sbx events %s after its delete: exit %d %q; want its events", name, r.code, r.stderr)
	}
	lines := strings.Split(strings.TrimSpace(r.stdout), "\n")
	var last map[string]any
	if err := json.Unmarshal([]byte(lines[len(lines)-1]), &last); err != nil {
		t.Fatalf("last event %q: %v", lines[len(lines)-1], err)
	}
	b, _ := json.Marshal(last)
	if !strings.Contains(string(b), `"snapshotsRemoved":[]`) || !strings.Contains(string(b), `"deleted"`) {
		t.Errorf("last event %s: want deleted, with snapshotsRemoved []", b)
	}
	if r := d.sbx(t, "events", "nosuch"+randHex(3)); r.code != 1 || !strings.Contains(r.stderr, "not found") {
		t.Errorf("events of a name nobody had: exit %d %q; want not found", r.code, r.stderr)
	}
}
