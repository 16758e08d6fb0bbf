package sandbox

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"sbx.dev/sbx/api"
)

// within runs f and fails the test if it has not returned after a minute:
// the sign that it waited on something it should not (not a speed test).
func within(t *testing.T, what string, f func()) {
	t.Helper()
	done := make(chan struct{})
	go func() { defer close(done); f() }()
	select {
	case <-done:
	case <-time.After(time.Minute):
		t.Fatalf("%s: still waiting after a minute", what)
	}
}

func TestClaims(t *testing.T) {
	var k claims
	ctx := context.Background()
	empty := func() {
		t.Helper()
		k.mu.Lock()
		defer k.mu.Unlock()
		if len(k.m) != 0 {
			t.Fatalf("entries left: %v", k.m)
		}
	}

	// two starts share; a whole claim waits for both
	s1, err := k.start(ctx, "a")
	if err != nil {
		t.Fatal(err)
	}
	s2, err := k.start(ctx, "a")
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := k.tryClaim("a", kindSnapshot); ok {
		t.Fatal("a whole claim beside two starts")
	}
	got := make(chan func(), 1)
	go func() {
		r, err := k.claim(ctx, "a", kindSnapshot)
		if err != nil {
			t.Error(err)
		}
		got <- r
	}()
	// once it is waiting for the starts, no new start gets in
	for op, _ := k.holder("a"); op != kindSnapshot; op, _ = k.holder("a") {
		time.Sleep(time.Millisecond) // polling a test's own goroutine's progress
	}
	sctx, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	if _, err := k.start(sctx, "a"); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("a start got in beside a pending whole claim: %v", err)
	}
	cancel()
	s1()
	s1() // a release is once
	select {
	case <-got:
		t.Fatal("claimed with a start still under way")
	default:
	}
	s2()
	snap := <-got

	// a stop waits for the snapshot; a start waits too, then gets in
	stopped := make(chan func(), 1)
	go func() {
		r, err := k.claim(ctx, "a", kindStop)
		if err != nil {
			t.Error(err)
		}
		stopped <- r
	}()
	snap()
	stop := <-stopped

	// the stop holds it: starts, snapshots, forks and stops are refused at
	// once; a delete and a resume wait for it
	within(t, "a start beside a stop", func() {
		if _, err := k.start(ctx, "a"); !errors.Is(err, api.ErrConflict) || !strings.Contains(err.Error(), "being stopped") {
			t.Errorf("start beside a stop = %v, want a conflict saying it is being stopped", err)
		}
	})
	for _, op := range []string{kindSnapshot, kindFork, kindStop} {
		within(t, op+" beside a stop", func() {
			if _, err := k.claim(ctx, "a", op); !errors.Is(err, api.ErrConflict) {
				t.Errorf("%s beside a stop = %v, want a conflict", op, err)
			}
		})
	}
	dctx, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	if _, err := k.claim(dctx, "a", kindDelete); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("a delete beside a stop = %v, want it to wait", err)
	}
	cancel()
	// another sandbox is not held by it
	within(t, "another sandbox", func() {
		r, err := k.claim(ctx, "b", kindStop)
		if err != nil {
			t.Fatal(err)
		}
		r()
	})
	ictx, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	if err := k.idle(ictx, "a"); err == nil {
		t.Fatal("idle while a stop holds it")
	}
	cancel()
	stop()
	if err := k.idle(ctx, "a"); err != nil {
		t.Fatal(err)
	}
	empty()
}

// TestSlowRuntimeHoldsOnlyItsSandbox (issue 28): while one sandbox's stop
// is in a slowed runsc checkpoint, an exec or a second stop on it is told
// at once that it is being stopped, and list, info, exec and a snapshot
// on other sandboxes do not wait for it. Then the stop finishes, and the
// sandbox resumes and runs.
func TestSlowRuntimeHoldsOnlyItsSandbox(t *testing.T) {
	ctx := context.Background()
	m, _ := newTestManager(t, 0)
	a, err := m.Create(ctx, api.CreateRequest{})
	if err != nil {
		t.Fatal(err)
	}
	b, err := m.Create(ctx, api.CreateRequest{})
	if err != nil {
		t.Fatal(err)
	}
	gate, in := make(chan struct{}), make(chan struct{}, 1)
	m.cfg.Runtime.(*fakeRuntime).checkpoint = func(id string) {
		if id == a.ID {
			in <- struct{}{}
			<-gate
		}
	}
	stopped := make(chan error, 1)
	go func() {
		_, err := m.Stop(ctx, a.ID, true)
		stopped <- err
	}()
	<-in // the stop is in runsc checkpoint, and stays there

	within(t, "exec on the stopping sandbox", func() {
		_, err := m.Exec(ctx, a.ID, api.ExecRequest{Cmd: []string{"true"}})
		if !errors.Is(err, api.ErrConflict) {
			t.Errorf("exec on a stopping sandbox = %v, want a conflict", err)
		}
	})
	within(t, "a second stop", func() {
		if _, err := m.Stop(ctx, a.ID, true); !errors.Is(err, api.ErrConflict) {
			t.Errorf("a second stop = %v, want a conflict", err)
		}
	})
	within(t, "list", func() {
		l, err := m.List(ctx)
		if err != nil || len(l) != 2 {
			t.Errorf("list = %d, %v", len(l), err)
		}
	})
	within(t, "info on the stopping sandbox", func() {
		if got, err := m.Get(ctx, a.ID); err != nil || got.State != api.StateStopping {
			t.Errorf("info = %+v, %v; want stopping", got, err)
		}
	})
	within(t, "info on another sandbox", func() {
		if got, err := m.Get(ctx, b.ID); err != nil || got.State != api.StateReady {
			t.Errorf("info = %+v, %v; want ready", got, err)
		}
	})
	within(t, "exec on another sandbox", func() {
		e, err := m.Exec(ctx, b.ID, api.ExecRequest{Cmd: []string{"true"}})
		if err != nil {
			t.Error(err)
			return
		}
		if err := m.Output(ctx, b.ID, e.ID, true, func(api.ExecEvent) error { return nil }); err != nil {
			t.Error(err)
		}
	})
	within(t, "snapshot of another sandbox", func() {
		if _, err := m.Snapshot(ctx, b.ID, api.SnapshotRequest{Name: "other"}); err != nil {
			t.Error(err)
		}
	})

	close(gate)
	if err := <-stopped; err != nil {
		t.Fatal(err)
	}
	if got, _ := m.Get(ctx, a.ID); got.State != api.StateStopped {
		t.Fatalf("after the stop: %s", got.State)
	}
	if _, err := m.Resume(ctx, a.ID, true); err != nil {
		t.Fatal(err)
	}
	e, err := m.Exec(ctx, a.ID, api.ExecRequest{Cmd: []string{"true"}})
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Output(ctx, a.ID, e.ID, true, func(api.ExecEvent) error { return nil }); err != nil {
		t.Fatal(err)
	}
	m.claims.mu.Lock()
	left := len(m.claims.m)
	m.claims.mu.Unlock()
	if left != 0 {
		t.Errorf("claims left: %d", left)
	}
}

// TestPreferOOMKillOnlyRunsc: only a runsc sandbox process is made the
// kernel's first victim; any other pid (here the test's own, which a fake
// runtime reports) is left as it was.
func TestPreferOOMKillOnlyRunsc(t *testing.T) {
	path := fmt.Sprintf("/proc/%d/oom_score_adj", os.Getpid())
	before, err := os.ReadFile(path)
	if err != nil {
		t.Skip(err)
	}
	preferOOMKill(os.Getpid())
	if after, _ := os.ReadFile(path); string(after) != string(before) {
		t.Errorf("preferOOMKill changed the oom_score_adj of a process that is no runsc sandbox: %q, then %q", before, after)
	}
}
