package e2e

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestShimIsSbxShim: the shims sbxd starts (an exec's when it does not go
// over the exec channel, and a boot's console) are sbx-shim from beside
// sbxd, not sbxd started again: sbxd, which links the fleet's Kubernetes
// client, Prometheus and SQLite, took ten times as long to start, and
// every shim exec and every create, restore and fork paid it. The exec's
// output and exit code still arrive through it.
func TestShimIsSbxShim(t *testing.T) {
	d := shimShared(t)
	id := d.newSandbox(t, "--template", "tiny")
	shimOf := func(what, dir string) {
		t.Helper()
		b, err := os.ReadFile(filepath.Join(dir, "shim.pid"))
		if err != nil {
			t.Fatalf("%s: its shim's pid file: %v", what, err)
		}
		pid := strings.Fields(string(b))[0]
		comm, err := os.ReadFile(filepath.Join("/proc", pid, "comm"))
		if err != nil {
			t.Fatalf("%s: shim %s: %v", what, pid, err)
		}
		if got := strings.TrimSpace(string(comm)); got != "sbx-shim" {
			t.Errorf("%s: its shim %s is %q, want sbx-shim", what, pid, got)
		}
	}
	shimOf("the console", filepath.Join(d.dir, "sandboxes", id))
	out := strings.Fields(d.must(t, "exec", "-d", id, "--", "sh", "-c", "echo started; sleep 30"))
	if len(out) != 2 {
		t.Fatalf("exec -d printed %q, want EXEC_ID PID", out)
	}
	shimOf("a detached exec", filepath.Join(d.dir, "sandboxes", id, "execs", out[0]))
	waitFor(t, "the detached exec's output through its shim", 20*time.Second, func() bool {
		return strings.Contains(d.sbx(t, "logs", id, "--exec", out[0]).stdout, "started")
	})
	d.must(t, "kill", "-s", "KILL", id, out[0])
	if r := d.sbx(t, "exec", id, "--", "sh", "-c", "echo out; echo err >&2; exit 7"); r.code != 7 || r.stdout != "out\n" || r.stderr != "err\n" {
		t.Errorf("an exec through sbx-shim: exit %d, stdout %q, stderr %q; want 7, out, err", r.code, r.stdout, r.stderr)
	}
}
