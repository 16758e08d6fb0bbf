package sandbox

import (
	"testing"

	"sbx.dev/sbx/api"
)

// TestExecTableStarting: a stop waits for the execs of its sandbox whose
// process init has not reported yet, and only those.
func TestExecTableStarting(t *testing.T) {
	var tab execTable
	mk := func(id, sb string, pid int, ended bool) *execRun {
		r := &execRun{done: make(chan struct{}), exec: api.Exec{ID: id, SandboxID: sb, Pid: pid}}
		if ended {
			close(r.done)
		}
		tab.put(r)
		return r
	}
	starting := mk("ex_starting", "sb_a", 0, false)
	mk("ex_running", "sb_a", 42, false)
	mk("ex_ended", "sb_a", 0, true)
	mk("ex_other", "sb_b", 0, false)
	got := tab.starting("sb_a")
	if len(got) != 1 || got[0] != starting {
		var ids []string
		for _, r := range got {
			ids = append(ids, r.exec.ID)
		}
		t.Fatalf("starting(sb_a) = %v, want only ex_starting", ids)
	}
	starting.mu.Lock()
	starting.exec.Pid = 7
	starting.mu.Unlock()
	if got := tab.starting("sb_a"); len(got) != 0 {
		t.Errorf("starting(sb_a) after its pid came = %d execs, want none", len(got))
	}
}
