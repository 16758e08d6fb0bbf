package e2e

import (
	"context"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"sbx.dev/sbx/api"
)

// TestRestartKnowsRunningPids: execs running across a restart of sbxd come
// back with the pid init gave them, so a stop after the restart does not
// wait for them as if they were still starting (it waited 5 s for each:
// the attack of the fifth round, TestAttack5StopAfterRestartWaits).
func TestRestartKnowsRunningPids(t *testing.T) {
	d, err := startDaemon(nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.stop(true) })
	id := d.newSandbox(t, "--template", "tiny")
	x, err := sdk(d.client).ExecDetached(context.Background(), id, api.ExecRequest{Cmd: []string{"sleep", "300"}, Detach: true})
	if err != nil {
		t.Fatal(err)
	}
	var pid int
	waitFor(t, "the exec's pid", 10*time.Second, func() bool {
		e, err := sdk(d.client).GetExec(context.Background(), id, x.ID)
		if err == nil {
			pid = e.Pid
		}
		return pid > 0
	})
	d.kill(syscall.SIGTERM)
	d.waitExit(t, 60*time.Second)
	if err := d.start(nil); err != nil {
		t.Fatal(err)
	}
	e, err := sdk(d.client).GetExec(context.Background(), id, x.ID)
	if err != nil || e.Pid != pid || e.State != api.ExecRunning {
		t.Fatalf("after the restart: %+v, %v; want exec %s running with pid %d", e, err, x.ID, pid)
	}
	d.must(t, "stop", id, "--wait")
	b, _ := os.ReadFile(d.logPath)
	if strings.Contains(string(b), "an exec is still starting") {
		t.Errorf("the stop after the restart waited for a running exec as if it were starting")
	}
	d.must(t, "resume", id)
}
