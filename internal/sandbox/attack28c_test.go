package sandbox

import (
	"context"
	"errors"
	"fmt"
	"math/rand"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"sbx.dev/sbx/api"
	"sbx.dev/sbx/internal/runsc"
)

// Attacks on issue 28's claims, state table and exec output (session 28c).

// ctlRuntime is the fake runtime with hooks a test sets before any
// operation: a shim of its own, a slow or panicking checkpoint, a slow
// delete. Unset hooks are the fake's.
type ctlRuntime struct {
	*fakeRuntime
	startExec  func(id string, o runsc.ShimExec) (*runsc.Shim, error)
	delete     func(id string)
	checkpoint func(id string)
	starts     atomic.Int32
}

func (c *ctlRuntime) StartExec(id string, o runsc.ShimExec) (*runsc.Shim, error) {
	c.starts.Add(1)
	if c.startExec != nil {
		return c.startExec(id, o)
	}
	return c.fakeRuntime.StartExec(id, o)
}

func (c *ctlRuntime) Delete(ctx context.Context, id string) error {
	if c.delete != nil {
		c.delete(id)
	}
	return c.fakeRuntime.Delete(ctx, id)
}

func (c *ctlRuntime) Checkpoint(ctx context.Context, id, dir string, leave bool) error {
	if c.checkpoint != nil {
		c.checkpoint(id)
	}
	return c.fakeRuntime.Checkpoint(ctx, id, dir, leave)
}

// newCtlManager is newTestManager with a ctlRuntime (set before any
// goroutine of the manager runs).
func newCtlManager(t *testing.T) (*Manager, *ctlRuntime) {
	t.Helper()
	m, _ := newTestManager(t, 0)
	rt := &ctlRuntime{fakeRuntime: m.cfg.Runtime.(*fakeRuntime)}
	m.cfg.Runtime = rt
	return m, rt
}

// lostShim is a shim whose copier fails at once: no pid, no exit, lost.
func lostShim(string, runsc.ShimExec) (*runsc.Shim, error) {
	ev := make(chan runsc.ShimEvent, 1)
	ev <- runsc.ShimEvent{Lost: "runsc exec: the copier could not start"}
	close(ev)
	return &runsc.Shim{Proc: runsc.Proc{Pid: os.Getpid()}, Events: ev}, nil
}

func claimsLeft(m *Manager) map[string]string {
	m.claims.mu.Lock()
	defer m.claims.mu.Unlock()
	out := map[string]string{}
	for id, e := range m.claims.m {
		out[id] = fmt.Sprintf("op=%q shared=%d waiters=%d", e.op, e.shared, e.waiters)
	}
	return out
}

// TestAttack28cDetachedExecLostCopier: a detached exec whose copier ends
// at once without an exit (runsc exec failed) waits 5 s in waitPid holding
// its shared start claim, while the copier's end (copierEnded) waits for a
// whole "exec-end" claim that this very start holds: the exec's own start
// blocks the news of its own end. The exec should come back at once.
func TestAttack28cDetachedExecLostCopier(t *testing.T) {
	ctx := context.Background()
	m, rt := newCtlManager(t)
	sb, err := m.Create(ctx, api.CreateRequest{})
	if err != nil {
		t.Fatal(err)
	}
	rt.startExec = lostShim
	start := time.Now()
	e, err := m.Exec(ctx, sb.ID, api.ExecRequest{Cmd: []string{"true"}, Detach: true})
	took := time.Since(start)
	if err != nil {
		t.Fatal(err)
	}
	if took > 2*time.Second {
		t.Errorf("a detached exec whose copier was lost at once took %s to return (state %s, pid %d): "+
			"its start held the shared claim in waitPid while copierEnded waited for the whole claim (exec.go: exec's "+
			"deferred unlock vs copierEnded's claim \"exec-end\")", took.Round(time.Millisecond), e.State, e.Pid)
	}
	// whatever it took, the exec ends lost and no claim is left
	deadline := time.Now().Add(10 * time.Second)
	for {
		x, err := m.GetExec(ctx, sb.ID, e.ID)
		if err == nil && x.State != api.ExecRunning {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the exec is still %v after 10 s (err %v)", x, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
	waitNoClaims(t, m)
}

func waitNoClaims(t *testing.T, m *Manager) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for len(claimsLeft(m)) > 0 {
		if time.Now().After(deadline) {
			t.Fatalf("claims left: %v", claimsLeft(m))
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestAttack28cForkPanicLeaksClaim: a fork claims its parent whole and
// releases it by hand after the capture (fork.go, "unlock()" after
// m.capture), and its children's "create" claims after m.fork: a panic in
// between (recovered by net/http, so sbxd goes on) leaves the claims held
// for ever: a delete of the parent waits until its client gives up.
func TestAttack28cForkPanicLeaksClaim(t *testing.T) {
	ctx := context.Background()
	m, rt := newCtlManager(t)
	sb, err := m.Create(ctx, api.CreateRequest{})
	if err != nil {
		t.Fatal(err)
	}
	rt.fakeRuntime.tar = func(string, int64) error { panic("runsc tar: a bug") }
	var ids []string
	func() {
		defer func() { _ = recover() }() // as net/http does for a handler
		_, _ = m.Fork(ctx, sb.ID, api.ForkRequest{Count: 2}, func(ev api.ForkEvent) error {
			if ev.Event == "sandbox.forking" {
				ids = ev.IDs
			}
			return nil
		})
	}()
	rt.fakeRuntime.tar = nil
	dctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	if _, err := m.Delete(dctx, sb.ID, false); err != nil {
		t.Errorf("delete of the parent after a fork that panicked: %v (claims: %v)", err, claimsLeft(m))
	}
	for _, id := range ids {
		cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		_, err := m.Delete(cctx, id, false)
		cancel()
		if err != nil && !errors.Is(err, api.ErrNotFound) {
			t.Errorf("delete of child %s after a fork that panicked: %v", id, err)
		}
	}
}

// TestAttack28cStartsMeetADelete: while a delete is in a slowed runsc
// delete, an exec, a stop, a snapshot and a fork on the sandbox are told at
// once (a conflict, or not found), never made to wait; a resume and a
// second delete wait for it and then find it gone.
func TestAttack28cStartsMeetADelete(t *testing.T) {
	ctx := context.Background()
	m, rt := newCtlManager(t)
	sb, err := m.Create(ctx, api.CreateRequest{})
	if err != nil {
		t.Fatal(err)
	}
	gate, in := make(chan struct{}), make(chan struct{}, 1)
	rt.delete = func(id string) {
		if id == sb.ID {
			select {
			case in <- struct{}{}:
				<-gate
			default:
			}
		}
	}
	deleted := make(chan error, 1)
	go func() { _, err := m.Delete(ctx, sb.ID, false); deleted <- err }()
	<-in
	quick := func(what string, f func() error) {
		t.Helper()
		done := make(chan error, 1)
		go func() { done <- f() }()
		select {
		case err := <-done:
			if !errors.Is(err, api.ErrConflict) && !errors.Is(err, api.ErrNotFound) {
				t.Errorf("%s beside a delete = %v, want a conflict or not found", what, err)
			}
		case <-time.After(2 * time.Second):
			t.Errorf("%s beside a delete: still waiting after 2 s (claims %v)", what, claimsLeft(m))
			<-done
		}
	}
	// an exec's gate to the claim: whenReady, then start
	quick("exec", func() error {
		_, err := m.Exec(ctx, sb.ID, api.ExecRequest{Cmd: []string{"true"}})
		return err
	})
	quick("stop", func() error { _, err := m.Stop(ctx, sb.ID, true); return err })
	quick("snapshot", func() error {
		_, err := m.Snapshot(ctx, sb.ID, api.SnapshotRequest{Name: "during-delete"})
		return err
	})
	quick("fork", func() error {
		_, err := m.Fork(ctx, sb.ID, api.ForkRequest{}, func(api.ForkEvent) error { return nil })
		return err
	})
	rctx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	if _, err := m.Resume(rctx, sb.ID, false); !errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, api.ErrConflict) {
		t.Errorf("resume beside a delete = %v, want it to wait (or a conflict)", err)
	}
	cancel()
	close(gate)
	if err := <-deleted; err != nil {
		t.Fatal(err)
	}
	if _, err := m.Get(ctx, sb.ID); !errors.Is(err, api.ErrNotFound) {
		t.Errorf("after the delete: %v", err)
	}
	waitNoClaims(t, m)
}

// TestAttack28cLifecycleStorm: execs, stops, resumes, snapshots, forks and
// a delete on one sandbox, from many goroutines at random moments, with
// contexts that end at random. Nothing hangs, nothing is left claimed,
// every error is one the API names, and the sandbox ends deleted with no
// exec left running in the table.
func TestAttack28cLifecycleStorm(t *testing.T) {
	ctx := context.Background()
	m, _ := newCtlManager(t)
	sb, err := m.Create(ctx, api.CreateRequest{})
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	var unexpected sync.Map
	note := func(op string, err error) {
		if err == nil || errors.Is(err, api.ErrConflict) || errors.Is(err, api.ErrNotFound) ||
			errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) {
			return
		}
		unexpected.Store(op+": "+err.Error(), true)
	}
	var snaps atomic.Int32
	for g := 0; g < 6; g++ {
		wg.Add(1)
		go func(g int) {
			defer wg.Done()
			r := rand.New(rand.NewSource(int64(g)))
			for i := 0; i < 12; i++ {
				c, cancel := context.WithTimeout(ctx, time.Duration(50+r.Intn(300))*time.Millisecond)
				switch r.Intn(6) {
				case 0, 1:
					e, err := m.Exec(c, sb.ID, api.ExecRequest{Cmd: []string{"true"}, Detach: r.Intn(2) == 0})
					note("exec", err)
					if err == nil {
						note("output", m.Output(c, sb.ID, e.ID, true, func(api.ExecEvent) error { return nil }))
					}
				case 2:
					_, err := m.Stop(c, sb.ID, r.Intn(2) == 0)
					note("stop", err)
				case 3:
					_, err := m.Resume(c, sb.ID, false)
					note("resume", err)
				case 4:
					_, err := m.Snapshot(c, sb.ID, api.SnapshotRequest{Name: fmt.Sprintf("storm-%d", snaps.Add(1))})
					note("snapshot", err)
				case 5:
					out, err := m.Fork(c, sb.ID, api.ForkRequest{}, func(api.ForkEvent) error { return nil })
					note("fork", err)
					for _, ch := range out {
						_, err := m.Delete(ctx, ch.ID, false)
						note("delete child", err)
					}
				}
				cancel()
			}
		}(g)
	}
	time.Sleep(300 * time.Millisecond)
	within(t, "the delete in the storm", func() {
		dctx, cancel := context.WithTimeout(ctx, 20*time.Second)
		defer cancel()
		for {
			_, err := m.Delete(dctx, sb.ID, true)
			if err == nil || errors.Is(err, api.ErrNotFound) {
				return
			}
			if dctx.Err() != nil {
				t.Errorf("the delete never got through: %v (claims %v)", err, claimsLeft(m))
				return
			}
			note("delete", err)
		}
	})
	within(t, "the storm's end", wg.Wait)
	unexpected.Range(func(k, _ any) bool { t.Errorf("unexpected error: %s", k); return true })
	if got, err := m.Get(ctx, sb.ID); !errors.Is(err, api.ErrNotFound) {
		t.Errorf("after the storm's delete the sandbox is %+v, %v", got, err)
	}
	waitNoClaims(t, m)
	if m.execs.table.running(sb.ID) {
		t.Error("an exec of the deleted sandbox still runs in the table")
	}
	if _, err := os.Stat(m.sandboxDir(sb.ID)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the deleted sandbox's dir is left: %v", err)
	}
	_ = strings.Contains
}

// TestAttack28cCopierEndAfterItsExecEnded: a copier ends while another
// operation claims its sandbox (a resume, say), so its end (copierEnded)
// waits for the claim; meanwhile that operation ends the exec (a resume
// that booted from the disk loses its execs: loseExecs). Once the claim is
// released, copierEnded, which checked run.ended() only before its wait,
// sees a ready sandbox and attaches a new copier to an exec that has
// ended, and puts it back in the exec table (exec.go, copierEnded: no
// run.ended() after the claim).
func TestAttack28cCopierEndAfterItsExecEnded(t *testing.T) {
	ctx := context.Background()
	m, rt := newCtlManager(t)
	sb, err := m.Create(ctx, api.CreateRequest{})
	if err != nil {
		t.Fatal(err)
	}
	endCopier := make(chan struct{})
	rt.startExec = func(string, runsc.ShimExec) (*runsc.Shim, error) {
		ev := make(chan runsc.ShimEvent, 1)
		ev <- runsc.ShimEvent{Pid: 42}
		go func() { <-endCopier; close(ev) }() // ends with no exit: the sandbox went
		return &runsc.Shim{Proc: runsc.Proc{Pid: os.Getpid()}, Events: ev}, nil
	}
	e, err := m.Exec(ctx, sb.ID, api.ExecRequest{Cmd: []string{"sleep", "100"}})
	if err != nil {
		t.Fatal(err)
	}
	rt.startExec = lostShim // a copier attached now finds nothing
	release, err := m.claims.claim(ctx, sb.ID, kindResume)
	if err != nil {
		t.Fatal(err)
	}
	close(endCopier)
	// copierEnded waits for the claim
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(time.Millisecond) {
		m.claims.mu.Lock()
		w := m.claims.m[sb.ID].waiters
		m.claims.mu.Unlock()
		if w > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("copierEnded never waited for the claim")
		}
	}
	m.execs.loseExecs(ctx, sb.ID) // the claim holder ends the exec
	before := rt.starts.Load()
	release()
	waitNoClaims(t, m)
	time.Sleep(100 * time.Millisecond) // let a copier attached by mistake report
	if n := rt.starts.Load() - before; n > 0 {
		t.Errorf("after its exec ended, %d copier(s) were attached to it again", n)
	}
	if _, inTable := m.execs.table.get(e.ID); inTable {
		t.Error("an exec that ended and is stored is back in the exec table")
	}
	x, err := m.GetExec(ctx, sb.ID, e.ID)
	if err != nil || x.State != api.ExecLost {
		t.Errorf("the exec is %+v, %v; want lost", x, err)
	}
}

// heldShim is a shim that reports its pid, writes a line of output, and
// then holds until its channel closes, ending without an exit.
func heldShim(end <-chan struct{}) func(string, runsc.ShimExec) (*runsc.Shim, error) {
	return func(_ string, o runsc.ShimExec) (*runsc.Shim, error) {
		_ = os.WriteFile(o.Dir+"/stdout", []byte("hello\n"), 0o600)
		_ = os.WriteFile(o.Dir+"/stderr", nil, 0o600)
		ev := make(chan runsc.ShimEvent, 1)
		ev <- runsc.ShimEvent{Pid: 42}
		go func() { <-end; close(ev) }()
		return &runsc.Shim{Proc: runsc.Proc{Pid: os.Getpid()}, Events: ev}, nil
	}
}

// TestAttack28cFollowOutputThroughDelete: a follower of a running exec's
// output, when the sandbox is deleted, returns (not found, or the exit),
// rather than wait for ever. The follower is woken by the exec table and
// by its dir's watch; the copier's end, which waits for the delete's
// claim, is what tells it once the record is gone.
func TestAttack28cFollowOutputThroughDelete(t *testing.T) {
	ctx := context.Background()
	m, rt := newCtlManager(t)
	sb, err := m.Create(ctx, api.CreateRequest{})
	if err != nil {
		t.Fatal(err)
	}
	end := make(chan struct{})
	var once sync.Once
	rt.delete = func(string) { once.Do(func() { close(end) }) } // runsc delete ends the exec's runsc exec
	rt.startExec = heldShim(end)
	e, err := m.Exec(ctx, sb.ID, api.ExecRequest{Cmd: []string{"sleep", "100"}})
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan struct{}, 16)
	followed := make(chan error, 1)
	fctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	go func() {
		followed <- m.Output(fctx, sb.ID, e.ID, true, func(ev api.ExecEvent) error {
			got <- struct{}{}
			return nil
		})
	}()
	<-got // it follows, and has read what there was
	if _, err := m.Delete(ctx, sb.ID, false); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-followed:
		if errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("the follower of an exec whose sandbox was deleted never woke: %v", err)
		}
	case <-time.After(6 * time.Second):
		t.Error("Output still follows 6 s after its sandbox was deleted")
	}
}

// TestAttack28cFollowOutputThroughStopResume: a follower of an exec's
// output stays with it through a stop (the copier ends, the command is in
// the image) and a resume (a copier attaches again), and ends with the
// exit once the command ends after the resume.
func TestAttack28cFollowOutputThroughStopResume(t *testing.T) {
	ctx := context.Background()
	m, rt := newCtlManager(t)
	sb, err := m.Create(ctx, api.CreateRequest{})
	if err != nil {
		t.Fatal(err)
	}
	end := make(chan struct{})
	rt.startExec = heldShim(end)
	e, err := m.Exec(ctx, sb.ID, api.ExecRequest{Cmd: []string{"sleep", "100"}})
	if err != nil {
		t.Fatal(err)
	}
	var exits atomic.Int32
	got := make(chan struct{}, 64)
	followed := make(chan error, 1)
	fctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	go func() {
		followed <- m.Output(fctx, sb.ID, e.ID, true, func(ev api.ExecEvent) error {
			if ev.Event == "exit" {
				exits.Add(1)
			}
			got <- struct{}{}
			return nil
		})
	}()
	<-got
	if _, err := m.Stop(ctx, sb.ID, true); err != nil {
		t.Fatal(err)
	}
	close(end) // the stop ended the copier
	waitNoClaims(t, m)
	// after the resume, a copier attaches and the command ends with 0
	rt.startExec = nil
	if _, err := m.Resume(ctx, sb.ID, true); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-followed:
		if err != nil || exits.Load() != 1 {
			t.Errorf("follow through stop and resume ended with %v after %d exits, want nil after 1", err, exits.Load())
		}
	case <-time.After(8 * time.Second):
		x, _ := m.GetExec(ctx, sb.ID, e.ID)
		t.Errorf("the follower did not end after the resume; the exec is %+v", x)
	}
}

// TestAttack28cFollowOutputStoppedThenDeleted: a follower of an exec stays
// with it through a stop (its command waits in the image, the copier is
// gone, the exec table no longer holds it); then the stopped sandbox is
// deleted. No copier is left to end, so nothing tells the follower once
// the record is gone: the delete's broadcast (table.forget) and its
// removal of the files come before the store forgets the exec (delete.go,
// finishDelete), and the follower, having looked in between, still finds
// it running, then waits on a dir that is gone and a table that is quiet.
func TestAttack28cFollowOutputStoppedThenDeleted(t *testing.T) {
	ctx := context.Background()
	m, rt := newCtlManager(t)
	sb, err := m.Create(ctx, api.CreateRequest{})
	if err != nil {
		t.Fatal(err)
	}
	end := make(chan struct{})
	var once sync.Once
	rt.delete = func(string) { once.Do(func() { close(end) }) } // runsc delete ends the exec's runsc exec
	rt.startExec = heldShim(end)
	e, err := m.Exec(ctx, sb.ID, api.ExecRequest{Cmd: []string{"sleep", "100"}})
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan struct{}, 16)
	followed := make(chan error, 1)
	fctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	go func() {
		followed <- m.Output(fctx, sb.ID, e.ID, true, func(ev api.ExecEvent) error {
			got <- struct{}{}
			return nil
		})
	}()
	<-got
	t0 := time.Now()
	if _, err := m.Stop(ctx, sb.ID, true); err != nil {
		t.Fatal(err)
	}
	if d := time.Since(t0); d > 2*time.Second {
		t.Logf("the stop took %s (letFreezeTell waits tellWait: no process holds the fake's slot files)", d.Round(time.Millisecond))
	}
	// the copier's end is settled: the exec is out of the table, running in the image
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		if _, in := m.execs.table.get(e.ID); !in {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the stopped exec stays in the table")
		}
	}
	select {
	case err := <-followed:
		t.Fatalf("the follower ended at the stop: %v", err)
	default:
	}
	// A delete takes a while between its removal of the sandbox's files
	// and of its record (here: many files in its freeze dir, removed in
	// between), as a real one does; the follower looks in that while.
	junk := filepath.Join(m.freezes.freezeDir(sb.ID), "junk")
	if err := os.MkdirAll(junk, 0o700); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 3000; i++ {
		if err := os.WriteFile(filepath.Join(junk, strconv.Itoa(i)), nil, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := m.Delete(ctx, sb.ID, false); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-followed:
		if errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("the follower of an exec whose stopped sandbox was deleted never woke: %v", err)
		}
	case <-time.After(3 * time.Second):
		t.Errorf("Output still follows 3 s after its stopped sandbox was deleted (the exec in the store: %v)", execGone(m, sb.ID, e.ID))
	}
}

func execGone(m *Manager, sandboxID, execID string) string {
	_, err := m.cfg.Store.Exec(context.Background(), sandboxID, execID)
	if errors.Is(err, api.ErrNotFound) {
		return "gone"
	}
	return fmt.Sprint("there: ", err)
}

// TestExecSurvivesChannelClosedThrice: a crash's freeze from inside holds
// no claim of sbxd's, so the copy attached again after its save closed
// the channel may take a connection the same save closes: the channel
// closes under an exec three times in a row, and the exec still ends with
// its own exit code, not lost.
func TestExecSurvivesChannelClosedThrice(t *testing.T) {
	ctx := context.Background()
	m, rt := newCtlManager(t)
	sb, err := m.Create(ctx, api.CreateRequest{})
	if err != nil {
		t.Fatal(err)
	}
	var calls atomic.Int32
	rt.startExec = func(id string, o runsc.ShimExec) (*runsc.Shim, error) {
		ev := make(chan runsc.ShimEvent, 2)
		if calls.Add(1) <= 3 {
			ev <- runsc.ShimEvent{Pid: 7}
			ev <- runsc.ShimEvent{Lost: runsc.ChannelClosed}
		} else {
			code := 3
			ev <- runsc.ShimEvent{Exit: &code}
		}
		close(ev)
		return &runsc.Shim{Events: ev}, nil
	}
	e, err := m.Exec(ctx, sb.ID, api.ExecRequest{Cmd: []string{"true"}, Detach: true})
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		x, err := m.GetExec(ctx, sb.ID, e.ID)
		if err == nil && x.State != api.ExecRunning {
			if x.State != api.ExecExited || x.ExitCode == nil || *x.ExitCode != 3 {
				t.Errorf("after three closed channels the exec is %s (exit %v), want exited with 3 (copiers: %d)", x.State, x.ExitCode, calls.Load())
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the exec is still %v after 10 s (err %v)", x, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
	waitNoClaims(t, m)
}
