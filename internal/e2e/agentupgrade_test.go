package e2e

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// TestAgentUpgradeKeepsImages: sbxd restarted with a new agent binary (an
// upgrade of sbx) restores what it kept from before on the agent each was
// captured with. A memory image holds its processes' memory, not the text
// of the agent's binary, which gVisor maps from the host's file again: a
// stopped sandbox and a memory snapshot of the old release woke up on the
// new binary at the same path, and their init died of a SIGSEGV at once.
func TestAgentUpgradeKeepsImages(t *testing.T) {
	d, err := startDaemon(nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.stop(true) })

	stopped := d.newSandbox(t)
	sleeper := d.must(t, "exec", "-d", stopped, "sleep", "1000")
	orphan := d.newSandbox(t) // its agent goes missing below
	d.must(t, "stop", "--wait", orphan)
	snapped := d.newSandbox(t)
	d.must(t, "snapshot", snapped, "before-upgrade", "--memory")
	d.must(t, "stop", "--wait", stopped)

	// the next release: an agent binary of other code (built without
	// inlining, so that little of it is where it was) and a mark at its
	// end; sbx-reaper beside it
	next := t.TempDir()
	build := exec.Command("go", "build", "-trimpath", "-gcflags=all=-l", "-ldflags=-s -w", "-o", filepath.Join(next, "sbx-agent"), "./cmd/sbx-agent")
	build.Dir = filepath.Join(binDir, "..")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build the next agent: %v\n%s", err, out)
	}
	const mark = "\n# sbx: the next release\n"
	f, err := os.OpenFile(filepath.Join(next, "sbx-agent"), os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteString(mark); err != nil {
		t.Fatal(err)
	}
	f.Close()
	reaper, err := os.ReadFile(filepath.Join(binDir, "sbx-reaper"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(next, "sbx-reaper"), reaper, 0o755); err != nil {
		t.Fatal(err)
	}
	d.kill(syscall.SIGTERM)
	if err := d.start([]string{"--agent", filepath.Join(next, "sbx-agent")}); err != nil {
		t.Fatal(err)
	}

	// a fresh sandbox runs the new agent
	fresh := d.newSandbox(t)
	if r := d.sbx(t, "exec", fresh, "tail", "-c", "40", "/.sbx/sbx-agent"); r.code != 0 || !strings.Contains(r.stdout, "the next release") {
		t.Errorf("a fresh sandbox's agent: exit %d %q %s; want the new release's", r.code, r.stdout, r.stderr)
	}
	// the stopped sandbox resumes on its own, its process alive
	d.must(t, "resume", stopped)
	if r := d.sbx(t, "exec", stopped, "true"); r.code != 0 {
		d.logAbout(t, stopped)
		t.Fatalf("exec in the sandbox stopped before the upgrade: exit %d %s", r.code, r.stderr)
	}
	execID := strings.Fields(sleeper)[0]
	if r := d.sbx(t, "ps", stopped); !strings.Contains(r.stdout, execID) || !strings.Contains(r.stdout, "running") {
		t.Errorf("the sleeper %s after the resume:\n%s", execID, r.stdout)
	}
	if r := d.sbx(t, "exec", stopped, "tail", "-c", "40", "/.sbx/sbx-agent"); r.code != 0 || strings.Contains(r.stdout, "the next release") {
		t.Errorf("the resumed sandbox's agent: exit %d %q %s; want the old release's", r.code, r.stdout, r.stderr)
	}
	// and the snapshot of the old release restores
	restored := d.newSandbox(t, "--from", "before-upgrade")
	if r := d.sbx(t, "exec", restored, "true"); r.code != 0 {
		d.logAbout(t, restored)
		t.Fatalf("exec in a sandbox restored from a snapshot of before the upgrade: exit %d %s", r.code, r.stderr)
	}
	if sb := d.info(t, restored); sb.State != "ready" {
		t.Errorf("the restored sandbox is %s, want ready", sb.State)
	}

	// the old agent gone (removed by hand): a stopped sandbox of its
	// boots from its disk, never on another agent
	old, err := filepath.Glob(filepath.Join(d.dir, "agent", "v", "*"))
	if err != nil {
		t.Fatal(err)
	}
	removed := 0
	for _, dir := range old {
		if b, err := os.ReadFile(filepath.Join(dir, "sbx-agent")); err == nil && !strings.Contains(string(b[max(0, len(b)-64):]), "the next release") {
			if err := os.RemoveAll(dir); err != nil {
				t.Fatal(err)
			}
			removed++
		}
	}
	if removed != 1 {
		t.Fatalf("%d agent directories of the old release in %v, want 1", removed, old)
	}
	before := len(d.list(t))
	if r := d.sbx(t, "new", "--from", "before-upgrade"); r.code == 0 || !strings.Contains(r.stderr, "agent") {
		t.Errorf("a create from a snapshot whose agent is gone: exit %d %q %s; want it refused, naming the agent", r.code, r.stdout, r.stderr)
	}
	if n := len(d.list(t)); n != before {
		t.Errorf("%d sandboxes after the refused create, %d before", n, before)
	}
	d.must(t, "resume", orphan)
	sb := d.info(t, orphan)
	if sb.State != "ready" || sb.MemoryRestored || !strings.Contains(sb.ResumeReason, "agent") {
		t.Errorf("resumed without its agent: %s, memory restored %v, reason %q; want ready, booted from its disk, saying why", sb.State, sb.MemoryRestored, sb.ResumeReason)
	}
	if r := d.sbx(t, "exec", orphan, "tail", "-c", "40", "/.sbx/sbx-agent"); r.code != 0 || !strings.Contains(r.stdout, "the next release") {
		t.Errorf("the sandbox booted from its disk runs: exit %d %q %s; want the new agent", r.code, r.stdout, r.stderr)
	}
}
