package store

import (
	"context"
	"errors"
	"path/filepath"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"sbx.dev/sbx/api"
)

func openTest(t *testing.T) *Store {
	t.Helper()
	s, err := Open(filepath.Join(t.TempDir(), "state.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func TestSandboxes(t *testing.T) {
	s := openTest(t)
	ctx := context.Background()
	now := time.Unix(1700000000, 0)
	a := &Sandbox{ID: "sb_aaaaaaaaaa", Name: "alpha", Template: "tiny", State: api.StateReady, CreatedAt: now, TTL: time.Minute, Meta: map[string]string{"k": "v"}, LastActivity: now}
	if err := s.CreateSandbox(ctx, a); err != nil {
		t.Fatal(err)
	}
	b := &Sandbox{ID: "sb_bbbbbbbbbb", Name: "alpha", Template: "tiny", State: api.StateReady, CreatedAt: now, LastActivity: now}
	if err := s.CreateSandbox(ctx, b); !errors.Is(err, api.ErrConflict) {
		t.Errorf("taken name: got %v, want ErrConflict", err)
	}
	b.Name = ""
	if err := s.CreateSandbox(ctx, b); err != nil {
		t.Fatalf("two unnamed sandboxes: %v", err)
	}
	for _, ref := range []string{"alpha", "sb_aaaaaaaaaa"} {
		got, err := s.Sandbox(ctx, ref)
		if err != nil {
			t.Fatal(err)
		}
		if diff := cmp.Diff(a, got); diff != "" {
			t.Errorf("Sandbox(%q) (-want +got):\n%s", ref, diff)
		}
	}
	if _, err := s.Sandbox(ctx, "nope"); !errors.Is(err, api.ErrNotFound) {
		t.Errorf("unknown: got %v, want ErrNotFound", err)
	}
	if err := s.Transition(ctx, a.ID, Change{From: []api.State{api.StateReady}, To: api.StateError, Reason: "runsc says no"}); err != nil {
		t.Fatal(err)
	}
	if err := s.Touch(ctx, a.ID, now.Add(time.Second)); err != nil {
		t.Fatal(err)
	}
	if err := s.Touch(ctx, a.ID, now); err != nil { // older: ignored
		t.Fatal(err)
	}
	got, _ := s.Sandbox(ctx, a.ID)
	if got.State != api.StateError || got.Reason != "runsc says no" || !got.LastActivity.Equal(now.Add(time.Second)) {
		t.Errorf("after updates: %+v", got)
	}
	all, _ := s.Sandboxes(ctx)
	if len(all) != 2 {
		t.Errorf("Sandboxes: got %d, want 2", len(all))
	}
	if err := s.DeleteSandbox(ctx, a.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Sandbox(ctx, "alpha"); !errors.Is(err, api.ErrNotFound) {
		t.Errorf("after delete: got %v, want ErrNotFound", err)
	}
}

func TestExecs(t *testing.T) {
	s := openTest(t)
	ctx := context.Background()
	start := time.Unix(1700000000, 0)
	e := &api.Exec{ID: "ex_1", SandboxID: "sb_a", Cmd: []string{"echo", "hi"}, State: api.ExecRunning, StartedAt: start}
	if err := s.CreateExec(ctx, e, start); err != nil {
		t.Fatal(err)
	}
	running, _ := s.Execs(ctx, "")
	if len(running) != 1 {
		t.Fatalf("running execs: got %d, want 1", len(running))
	}
	code, end := 124, start.Add(time.Second)
	e.State, e.Pid, e.ExitCode, e.TimedOut, e.EndedAt = api.ExecExited, 42, &code, true, &end
	if err := s.UpdateExec(ctx, e, end); err != nil {
		t.Fatal(err)
	}
	got, err := s.Exec(ctx, "sb_a", "ex_1")
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(e, got); diff != "" {
		t.Errorf("Exec (-want +got):\n%s", diff)
	}
	if _, err := s.Exec(ctx, "sb_other", "ex_1"); !errors.Is(err, api.ErrNotFound) {
		t.Errorf("exec of another sandbox: got %v, want ErrNotFound", err)
	}
	if running, _ := s.Execs(ctx, ""); len(running) != 0 {
		t.Errorf("running execs after exit: got %d, want 0", len(running))
	}
}

func TestTransition(t *testing.T) {
	s := openTest(t)
	ctx := context.Background()
	now := time.Unix(1700000000, 0)
	if err := s.CreateSandbox(ctx, &Sandbox{ID: "sb_a", Template: "tiny", State: api.StateReady, CreatedAt: now, LastActivity: now}); err != nil {
		t.Fatal(err)
	}
	img := "im_1"
	tests := []struct {
		name    string
		change  Change
		wantErr error
		want    api.State
	}{
		{"ready to stopping", Change{From: []api.State{api.StateReady}, To: api.StateStopping}, nil, api.StateStopping},
		{"not from ready any more", Change{From: []api.State{api.StateReady}, To: api.StateStopping}, api.ErrConflict, api.StateStopping},
		{"stopping to stopped with its image", Change{From: []api.State{api.StateStopping}, To: api.StateStopped, Image: &img}, nil, api.StateStopped},
		{"one of several", Change{From: []api.State{api.StateReady, api.StateStopped}, To: api.StateLost, Reason: "gone"}, nil, api.StateLost},
		{"no from", Change{To: api.StateReady}, errAny, api.StateLost},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := s.Transition(ctx, "sb_a", tc.change)
			switch {
			case tc.wantErr == nil && err != nil:
				t.Fatalf("got %v, want no error", err)
			case tc.wantErr == errAny && err == nil, tc.wantErr != nil && tc.wantErr != errAny && !errors.Is(err, tc.wantErr):
				t.Fatalf("got %v, want %v", err, tc.wantErr)
			}
			got, _ := s.Sandbox(ctx, "sb_a")
			if got.State != tc.want {
				t.Errorf("state: got %s, want %s", got.State, tc.want)
			}
		})
	}
	if got, _ := s.Sandbox(ctx, "sb_a"); got.Image != img || got.Reason != "gone" {
		t.Errorf("fields: got image %q reason %q, want %q and %q", got.Image, got.Reason, img, "gone")
	}
	evs, _ := s.Events(ctx, "sb_a", 0)
	var types []string
	for _, e := range evs {
		types = append(types, e.Type+" from "+e.Detail["from"].(string))
	}
	want := []string{"state.stopping from ready", "state.stopped from stopping", "state.lost from stopped"}
	if diff := cmp.Diff(want, types); diff != "" {
		t.Errorf("events: one per transition, none for a refused one (-want +got):\n%s", diff)
	}
	if err := s.Transition(ctx, "sb_none", Change{From: []api.State{api.StateReady}, To: api.StateError}); !errors.Is(err, api.ErrNotFound) {
		t.Errorf("unknown sandbox: got %v, want ErrNotFound", err)
	}
}

var errAny = errors.New("any error")

func TestUpdateRollsBack(t *testing.T) {
	s := openTest(t)
	ctx := context.Background()
	now := time.Unix(1700000000, 0)
	if err := s.CreateSandbox(ctx, &Sandbox{ID: "sb_a", Template: "tiny", State: api.StateCreating, CreatedAt: now, LastActivity: now}); err != nil {
		t.Fatal(err)
	}
	boom := errors.New("boom")
	err := s.Update(ctx, func(tx *Store) error {
		if err := tx.Transition(ctx, "sb_a", Change{From: []api.State{api.StateCreating}, To: api.StateReady}); err != nil {
			return err
		}
		if err := tx.AddIntent(ctx, &Intent{ID: "im_x", Kind: "fork", SandboxID: "sb_a", Step: "x", StartedAt: now}); err != nil {
			return err
		}
		return boom
	})
	if !errors.Is(err, boom) {
		t.Fatalf("got %v, want boom", err)
	}
	got, _ := s.Sandbox(ctx, "sb_a")
	ins, _ := s.Intents(ctx)
	evs, _ := s.Events(ctx, "sb_a", 0)
	if got.State != api.StateCreating || len(ins) != 0 || len(evs) != 0 {
		t.Errorf("after a failed transaction: state %s, %d intents, %d events; want creating, 0, 0", got.State, len(ins), len(evs))
	}
}

// TestDeletedByName: a deleted sandbox is found by the name it had, the
// last of that name first; a name no deleted sandbox had is "".
func TestDeletedByName(t *testing.T) {
	s := openTest(t)
	ctx := context.Background()
	for _, ev := range []struct{ id, typ, name string }{
		{"sb_aaaaaaaaaa", "deleted", "web"},
		{"sb_bbbbbbbbbb", "created", "web"},
		{"sb_cccccccccc", "deleted", "web"},
		{"sb_dddddddddd", "deleted", ""},
	} {
		d := map[string]any{"snapshotsRemoved": []string{}}
		if ev.name != "" {
			d["name"] = ev.name
		}
		if err := s.AddEvent(ctx, ev.id, ev.typ, d); err != nil {
			t.Fatal(err)
		}
	}
	if id, err := s.DeletedByName(ctx, "web"); err != nil || id != "sb_cccccccccc" {
		t.Errorf("DeletedByName(web) = %q, %v; want the last deleted web, sb_cccccccccc", id, err)
	}
	if id, err := s.DeletedByName(ctx, "nosuch"); err != nil || id != "" {
		t.Errorf("DeletedByName(nosuch) = %q, %v; want none", id, err)
	}
}
