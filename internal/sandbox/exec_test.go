package sandbox

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"sbx.dev/sbx/api"
	"sbx.dev/sbx/internal/runsc"
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

// TestOutputOfDeletedSandbox: following the output of an exec whose
// sandbox a delete is removing (its files gone, its record not yet) says
// not found, as the finished delete would, not a watch error (CI's
// TestConcurrentClients met this between a delete and an exec).
func TestOutputOfDeletedSandbox(t *testing.T) {
	ctx := context.Background()
	m, _ := newTestManager(t, 0)
	sb, err := m.Create(ctx, api.CreateRequest{})
	if err != nil {
		t.Fatal(err)
	}
	e, err := m.Exec(ctx, sb.ID, api.ExecRequest{Cmd: []string{"sleep", "1"}})
	if err != nil {
		t.Fatal(err)
	}
	if err := os.RemoveAll(m.execDir(sb.ID, e.ID)); err != nil {
		t.Fatal(err)
	}
	err = m.Output(ctx, sb.ID, e.ID, true, func(api.ExecEvent) error { return nil })
	if !errors.Is(err, api.ErrNotFound) || !strings.Contains(err.Error(), "being deleted") {
		t.Errorf("output of an exec whose files a delete removed: %v, want not found: being deleted", err)
	}
}

// TestCopierEndsWithItsSandbox: a copier that ends because its whole
// sandbox ended (the kernel stopped it at its memory limit) records the
// sandbox's end with the exec's, at once, instead of attaching a new
// copier to a sandbox that is gone and leaving it "ready" until the
// watcher comes round (CI's TestLimits saw an exec lost in a sandbox still
// called ready). A copier that ends while its sandbox runs attaches again.
func TestCopierEndsWithItsSandbox(t *testing.T) {
	ctx := context.Background()
	m, _ := newTestManager(t, 0)
	rt := m.cfg.Runtime.(*fakeRuntime)
	start := func() (*api.Sandbox, *execRun) {
		sb, err := m.Create(ctx, api.CreateRequest{})
		if err != nil {
			t.Fatal(err)
		}
		e, err := m.Exec(ctx, sb.ID, api.ExecRequest{Cmd: []string{"sleep", "1"}})
		if err != nil {
			t.Fatal(err)
		}
		run, ok := m.execs.table.get(e.ID)
		if !ok {
			t.Fatal("the exec is not in the table")
		}
		return sb, run
	}

	// the sandbox runs: the copier's end is not the sandbox's
	sb, run := start()
	m.watcher.add(sb.ID, runsc.Proc{Pid: os.Getpid(), Start: runsc.ProcessStart(os.Getpid())})
	m.execs.copierEnded(run, -1, "the copier ended without an exit code")
	if got, _ := m.Get(ctx, sb.ID); got.State != api.StateReady {
		t.Errorf("a copier's end in a running sandbox made it %s (%q)", got.State, got.Reason)
	}

	// the sandbox's process is gone, and runsc agrees
	sb, run = start()
	m.watcher.add(sb.ID, runsc.Proc{Pid: os.Getpid(), Start: "gone"}) // not this process's start: gone
	rt.mu.Lock()
	delete(rt.running, sb.ID)
	rt.mu.Unlock()
	m.execs.copierEnded(run, -1, "the copier ended without an exit code")
	got, err := m.Get(ctx, sb.ID)
	if err != nil {
		t.Fatal(err)
	}
	if got.State != api.StateError || !strings.Contains(got.Reason, "ended unexpectedly") {
		t.Errorf("after its process ended the sandbox is %s (%q), want error: ended unexpectedly", got.State, got.Reason)
	}
	x, err := m.GetExec(ctx, sb.ID, run.exec.ID)
	if err != nil {
		t.Fatal(err)
	}
	if x.State != api.ExecLost {
		t.Errorf("the exec of a sandbox that ended is %s, want lost", x.State)
	}
	if _, watched := m.watcher.get(sb.ID); watched {
		t.Error("a sandbox that ended is still watched")
	}
}

// TestEndedWhileRunscCountsAZombie: the kernel killed a sandbox's process
// out of memory, and runsc state still called it running with its pid (a
// zombie its parent had not reaped). sbxd re-watched that pid, found
// nothing to watch, and watched nothing more: the sandbox stayed ready
// while every exec failed with "container in state stopped"
// (TestAttackForkPagesOOMWhileLoading, in CI). A zombie is an end, and a
// sandbox whose process cannot be named is watched as ended.
func TestEndedWhileRunscCountsAZombie(t *testing.T) {
	ctx := context.Background()
	m, _ := newTestManager(t, 0)
	rt := m.cfg.Runtime.(*fakeRuntime)
	zombie := exec.Command("true")
	if err := zombie.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = zombie.Wait() })
	waitZombie := func() {
		for i := 0; i < 200 && runsc.ProcessStart(zombie.Process.Pid) != ""; i++ {
			time.Sleep(10 * time.Millisecond)
		}
		if runsc.ProcessStart(zombie.Process.Pid) != "" {
			t.Fatal("the child did not end")
		}
	}
	waitZombie()
	for _, how := range []string{"the watcher's look", "a watch that finds it gone"} {
		sb, err := m.Create(ctx, api.CreateRequest{})
		if err != nil {
			t.Fatal(err)
		}
		rt.mu.Lock()
		if rt.pids == nil {
			rt.pids = map[string]int{}
		}
		rt.pids[sb.ID] = zombie.Process.Pid // runsc: running, as this zombie
		rt.mu.Unlock()
		if how == "the watcher's look" {
			m.unwatch(sb.ID)
			m.sandboxEnded(ctx, sb.ID)
		} else {
			m.watch(ctx, sb.ID)
			ended := m.watcher.ended()
			if len(ended) != 1 || ended[0] != sb.ID {
				t.Fatalf("%s: the watcher's ended sandboxes are %q, want %s", how, ended, sb.ID)
			}
			m.sandboxEnded(ctx, sb.ID)
		}
		got, err := m.Get(ctx, sb.ID)
		if err != nil {
			t.Fatal(err)
		}
		if got.State != api.StateError {
			t.Errorf("%s: a sandbox whose process is a zombie runsc calls running is %s, want error", how, got.State)
		}
		if _, watched := m.watcher.get(sb.ID); watched {
			t.Errorf("%s: a sandbox that ended is still watched", how)
		}
	}
}

// TestReattachKnowsThePid: an attach sends no pid (only a start does), so a
// copier attached again after a resume learns the exec's pid from the pid
// file its first copy wrote. Without it the exec read as still starting,
// and every stop after a resume waited startWait (5 s) for it
// (BenchmarkStopResume1GiB: 5 s of its 8).
func TestReattachKnowsThePid(t *testing.T) {
	ctx := context.Background()
	m, _ := newTestManager(t, 0)
	sb, err := m.Create(ctx, api.CreateRequest{})
	if err != nil {
		t.Fatal(err)
	}
	dir := m.execDir(sb.ID, "ex_reattached")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, runsc.PidFile), []byte("77\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	run := &execRun{dir: dir, done: make(chan struct{}), exec: api.Exec{ID: "ex_reattached", SandboxID: sb.ID, State: api.ExecRunning}}
	if err := m.execs.reattach(ctx, run); err != nil {
		t.Fatal(err)
	}
	run.mu.Lock()
	pid := run.exec.Pid
	run.mu.Unlock()
	if pid != 77 {
		t.Errorf("a re-attached exec's pid is %d, want 77 (its pid file's)", pid)
	}
	for _, r := range m.execs.table.starting(sb.ID) {
		if r == run {
			t.Error("a re-attached exec that init started reads as still starting: a stop would wait for it")
		}
	}
}
