package e2e

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// countSleeps counts the processes running `sleep ARG` in sandbox id.
func countSleeps(t *testing.T, d *daemon, id, arg string) (int, string) {
	t.Helper()
	ps := d.must(t, "exec", id, "--user", "root", "--timeout", "0", "--", "ps", "-o", "pid,ppid,stat,args")
	n := 0
	var lines []string
	for _, l := range strings.Split(ps, "\n") {
		if strings.Contains(l, "sleep "+arg) {
			n++
			if len(lines) < 10 {
				lines = append(lines, l)
			}
		}
	}
	return n, strings.Join(lines, "\n")
}

// TestAttackReaperContinuedForker: sixteen setsid'd helpers of a timed exec
// wait for init to stop the command at its deadline (they poll
// /proc/CMD/stat for T), then SIGCONT every process they may signal and
// fork setsid'd sleeps as fast as they can. Expectation: nothing of the
// exec outlives its deadline by more than the kill's few seconds, as
// root and as the user. (Broken once: init killed the command with its
// group first, and its orphans went to init, out of the sweep's sight;
// the command now stays, stopped, the anchor of the sweep until it finds
// nothing, and is killed last: killUnder.)
func TestAttackReaperContinuedForker(t *testing.T) {
	testContinuedForker(t, ownDaemon(t))
}

// The same storm on an sbxd without sbx-reaper (the agent's exec, root of
// its own sweep, keeps the timeout): it holds there, the control.
func TestAttackReaperContinuedForkerFallback(t *testing.T) {
	testContinuedForker(t, fallbackDaemon(t))
}

func testContinuedForker(t *testing.T, d *daemon) {
	id := d.newSandbox(t, "--template", "tiny", "--pids", "1024")
	// each helper waits for the command to be stopped (the deadline),
	// then continues every process it may signal and forks setsid'd sleeps
	helper := `while :; do read -r l < /proc/$1/stat || break; case "$l" in *') T '*) break;; esac; done
while :; do kill -CONT -1 2>/dev/null; setsid sleep 4321 & done`
	script := `for i in 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16; do setsid sh -c "$0" helper $$ & done
while :; do :; done`
	for _, user := range []string{"", "root"} {
		args := []string{"exec", id}
		if user != "" {
			args = append(args, "--user", user)
		}
		start := time.Now()
		r := d.sbx(t, append(args, "--timeout", "2s", "--", "sh", "-c", script, helper)...)
		took := time.Since(start)
		if r.code != 124 || !strings.Contains(r.stderr, "sbx: command timed out after 2s") {
			t.Errorf("as %q: exit %d after %s, stderr %q; want 124 and the timeout message", user, r.code, took.Round(time.Millisecond), tail(r.stderr))
		}
		t.Logf("as %q: stdout %q stderr %q", user, tail(r.stdout), tail(r.stderr))
		var n int
		var sample string
		pollUntil(10*time.Second, func() bool {
			n, sample = countSleeps(t, d, id, "4321")
			return n == 0
		})
		if n > 0 {
			t.Errorf("as %q: %d processes of the timed-out exec still run 10s after its deadline (its kill missed them):\n%s", user, n, sample)
			d.sbx(t, "exec", id, "--user", "root", "--timeout", "0", "--", "sh", "-c", "pkill -9 -f 'sleep 4321'; true")
		}
	}
}

// TestAttackReaperCloneParent: a timed command clones with CLONE_PARENT,
// making its child a sibling (init's child, not the command's), which
// execs a sleep. Expectation: the sleep dies at the deadline. (Broken
// once: gVisor gave such a child its parent's process group and session,
// init's, where no kill of the command's group or tree reached it; gVisor
// patch 09 gives it its caller's, as Linux does.)
func TestAttackReaperCloneParent(t *testing.T) {
	testCloneParent(t, ownDaemon(t))
}

// The same attack on an sbxd whose agent dir has no sbx-reaper (the
// agent's exec keeps the timeout): it holds there, the control.
func TestAttackReaperCloneParentFallback(t *testing.T) {
	testCloneParent(t, fallbackDaemon(t))
}

// fallbackDaemon is an sbxd whose agent has no sbx-reaper beside it.
func fallbackDaemon(t *testing.T) *daemon {
	dir := t.TempDir()
	body, err := os.ReadFile(filepath.Join(binDir, "sbx-agent"))
	if err != nil {
		t.Fatal(err)
	}
	agent := filepath.Join(dir, "sbx-agent")
	if err := os.WriteFile(agent, body, 0o755); err != nil {
		t.Fatal(err)
	}
	d, err := startDaemon([]string{"--agent", agent})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.stop(true) })
	t.Cleanup(func() { keepLogs(t, d) })
	return d
}

func testCloneParent(t *testing.T, d *daemon) {
	id := d.newSandbox(t, "--template", "base")
	py := `import ctypes, os, time
libc = ctypes.CDLL(None, use_errno=True)
pid = libc.syscall(56, 0x8000 | 17, 0, 0, 0, 0)
if pid == 0:
    os.execv("/bin/sleep", ["sleep", "4322"])
print("cloned", pid, flush=True)
time.sleep(300)`
	for _, user := range []string{"", "root"} {
		args := []string{"exec", id}
		if user != "" {
			args = append(args, "--user", user)
		}
		start := time.Now()
		r := d.sbx(t, append(args, "--timeout", "2s", "--", "python3", "-c", py)...)
		took := time.Since(start)
		if r.code != 124 || !strings.Contains(r.stderr, "sbx: command timed out after 2s") || !strings.Contains(r.stdout, "cloned") {
			t.Errorf("as %q: exit %d after %s, stdout %q stderr %q; want 124 and the timeout message", user, r.code, took.Round(time.Millisecond), tail(r.stdout), tail(r.stderr))
		}
		var n int
		var sample string
		pollUntil(5*time.Second, func() bool {
			n, sample = countSleeps(t, d, id, "4322")
			return n == 0
		})
		if n > 0 {
			t.Errorf("as %q: %d processes of the timed-out exec (clone(CLONE_PARENT)) still run 5s after its deadline:\n%s", user, n, sample)
			d.sbx(t, "exec", id, "--user", "root", "--timeout", "0", "--", "sh", "-c", "pkill -9 -f 'sleep 4322'; true")
		}
	}
}
