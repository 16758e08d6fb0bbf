package store

import (
	"context"
	"errors"
	"path/filepath"
	"testing"
	"time"

	"sbx.dev/sbx/api"
)

func TestPreviews(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state.db")
	s, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	now := time.Unix(1700000000, 0)
	id := "sb_aaaaaaaaaa"
	if err := s.CreateSandbox(ctx, &Sandbox{ID: id, Template: "tiny", State: api.StateReady, CreatedAt: now, LastActivity: now}); err != nil {
		t.Fatal(err)
	}
	steps := []struct {
		name        string
		port        int
		private     bool
		wantErr     error
		wantPrivate bool
	}{
		{"publish", 8080, false, nil, false},
		{"publish again", 8080, false, nil, false},
		{"make it private", 8080, true, nil, true},
		{"private stays private", 8080, false, api.ErrConflict, true},
		{"private again", 8080, true, nil, true},
		{"another port", 3000, false, nil, false},
	}
	for _, st := range steps {
		p, err := s.Publish(ctx, id, st.port, st.private, now)
		if !errors.Is(err, st.wantErr) {
			t.Fatalf("%s: got %v, want %v", st.name, err, st.wantErr)
		}
		if err == nil && (p.Private != st.wantPrivate || p.Port != st.port || p.SandboxID != id) {
			t.Errorf("%s: got %+v, want port %d private %v", st.name, p, st.port, st.wantPrivate)
		}
		got, err := s.Published(ctx, id, st.port)
		if err != nil {
			t.Fatalf("%s: Published: %v", st.name, err)
		}
		if got.Private != st.wantPrivate {
			t.Errorf("%s: stored private %v, want %v", st.name, got.Private, st.wantPrivate)
		}
	}
	if _, err := s.Publish(ctx, "sb_zzzzzzzzzz", 80, false, now); !errors.Is(err, api.ErrNotFound) {
		t.Errorf("unknown sandbox: got %v, want ErrNotFound", err)
	}
	if _, err := s.Published(ctx, id, 9999); !errors.Is(err, api.ErrNotFound) {
		t.Errorf("unpublished port: got %v, want ErrNotFound", err)
	}

	// durable: a reopened store has them
	s.Close()
	if s, err = Open(path); err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ps, err := s.Previews(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	if len(ps) != 2 || ps[0].Port != 3000 || ps[0].Private || ps[1].Port != 8080 || !ps[1].Private {
		t.Errorf("after reopening: %+v, want 3000 public and 8080 private", ps)
	}

	// withdraw: gone, and a second time is not found
	if err := s.Unpublish(ctx, id, 3000); err != nil {
		t.Fatal(err)
	}
	if err := s.Unpublish(ctx, id, 3000); !errors.Is(err, api.ErrNotFound) {
		t.Errorf("withdraw twice: got %v, want ErrNotFound", err)
	}
	// a withdrawn private port can be published to everyone
	if err := s.Unpublish(ctx, id, 8080); err != nil {
		t.Fatal(err)
	}
	if p, err := s.Publish(ctx, id, 8080, false, now); err != nil || p.Private {
		t.Errorf("republish public after withdraw: %+v %v", p, err)
	}

	// removed with the sandbox; a new sandbox with the same id starts with none
	if err := s.DeleteSandbox(ctx, id); err != nil {
		t.Fatal(err)
	}
	if err := s.CreateSandbox(ctx, &Sandbox{ID: id, Template: "tiny", State: api.StateReady, CreatedAt: now, LastActivity: now}); err != nil {
		t.Fatal(err)
	}
	if ps, err := s.Previews(ctx, id); err != nil || len(ps) != 0 {
		t.Errorf("after delete: %+v %v, want none", ps, err)
	}
}

func TestNetworkMode(t *testing.T) {
	s := openTest(t)
	ctx := context.Background()
	now := time.Unix(1700000000, 0)
	sb := &Sandbox{ID: "sb_aaaaaaaaaa", Template: "tiny", State: api.StateReady, CreatedAt: now, LastActivity: now, Network: "none"}
	if err := s.CreateSandbox(ctx, sb); err != nil {
		t.Fatal(err)
	}
	got, err := s.Sandbox(ctx, sb.ID)
	if err != nil || got.Network != "none" {
		t.Fatalf("sandbox network: %q %v, want none", got.Network, err)
	}
	// a snapshot takes its sandbox's mode, whatever the caller filled in
	sn := &Snapshot{Name: "snap", ID: "im_1", SandboxID: sb.ID, Template: "tiny", CreatedAt: now}
	if err := s.CreateSnapshot(ctx, sn); err != nil {
		t.Fatal(err)
	}
	if sn.Network != "none" {
		t.Errorf("CreateSnapshot set Network %q, want none", sn.Network)
	}
	back, err := s.Snapshot(ctx, "snap")
	if err != nil || back.Network != "none" {
		t.Errorf("snapshot network: %q %v, want none", back.Network, err)
	}
	// of a sandbox already gone: no network mode recorded
	gone := &Snapshot{Name: "orphan", ID: "im_2", SandboxID: "sb_zzzzzzzzzz", Template: "tiny", CreatedAt: now}
	if err := s.CreateSnapshot(ctx, gone); err != nil || gone.Network != "" {
		t.Errorf("snapshot of an unknown sandbox: %q %v", gone.Network, err)
	}
}
