package e2e

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// What a sandbox's runsc boot logs when it sets its collector back to the
// default (gVisor patch 20): once, when its root container runs or its
// restore ends.
const (
	gcReleased     = "sbx: the collector's target is back to 100%"
	restoreStarted = "Starting to restore"
)

// TestCollectorHeldWhileStarting: a sandbox's sentry runs its collector at
// 400% while it boots or restores (patch 20), and sets it back once the
// sandbox runs: once in a created sandbox, once in a memory fork, and
// there after its restore began, so that the restore ran held. A sentry
// left at 400% would keep five times its live heap for its whole life;
// one released before its restore would not save what the patch is for.
func TestCollectorHeldWhileStarting(t *testing.T) {
	logs := t.TempDir()
	d, err := startDaemon([]string{"--runsc-debug-log", logs + "/"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.stop(true) })

	id := d.newSandbox(t, "--template", "tiny")
	d.must(t, "exec", id, "--", "sh", "-c", "echo kept > /tmp/mark")
	kids := forkMemory(t, d, id, 1)
	if len(kids) != 1 {
		t.Fatalf("memory fork: %v", kids)
	}
	if out := d.must(t, "exec", kids[0], "--", "cat", "/tmp/mark"); out != "kept\n" {
		t.Fatalf("the memory fork's /tmp/mark: %q", out)
	}

	boots, err := filepath.Glob(filepath.Join(logs, "*.boot.txt"))
	if err != nil {
		t.Fatal(err)
	}
	created, restored := 0, 0
	for _, f := range boots {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		log := string(b)
		if n := strings.Count(log, gcReleased); n != 1 {
			t.Errorf("%s says %q %d times, want once", filepath.Base(f), gcReleased, n)
			continue
		}
		start := strings.Index(log, restoreStarted)
		if start < 0 {
			created++
			continue
		}
		restored++
		if strings.Index(log, gcReleased) < start {
			t.Errorf("%s: the collector was set back before the restore began", filepath.Base(f))
		}
	}
	if created < 1 || restored < 1 {
		t.Errorf("boot logs: %d of created sandboxes and %d of restored ones, want one of each at least (%d logs)", created, restored, len(boots))
	}
}
