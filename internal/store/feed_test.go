package store

import (
	"context"
	"errors"
	"testing"
	"time"

	"sbx.dev/sbx/api"
)

func closed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

// TestChanged: every way a sandbox's state changes closes the channel, a
// failed transaction does not, and a transaction tells only at its commit.
func TestChanged(t *testing.T) {
	s := openTest(t)
	ctx := context.Background()
	now := time.Unix(1700000000, 0)
	sb := &Sandbox{ID: "sb_aaaaaaaaaa", Template: "tiny", State: api.StateCreating, CreatedAt: now, LastActivity: now}
	steps := []struct {
		name string
		do   func() error
		want bool
	}{
		{"create", func() error { return s.CreateSandbox(ctx, sb) }, true},
		{"touch", func() error { return s.Touch(ctx, sb.ID, now.Add(time.Second)) }, false},
		{"transition", func() error {
			return s.Transition(ctx, sb.ID, Change{From: []api.State{api.StateCreating}, To: api.StateReady})
		}, true},
		{"refused transition", func() error {
			err := s.Transition(ctx, sb.ID, Change{From: []api.State{api.StateStopped}, To: api.StateReady})
			if !errors.Is(err, api.ErrConflict) {
				return err
			}
			return nil
		}, false},
		{"rolled back", func() error {
			_ = s.Update(ctx, func(tx *Store) error {
				if err := tx.AddEvent(ctx, sb.ID, "x", nil); err != nil {
					return err
				}
				return errors.New("no")
			})
			return nil
		}, false},
		{"delete", func() error {
			return s.Update(ctx, func(tx *Store) error {
				if err := tx.DeleteSandbox(ctx, sb.ID); err != nil {
					return err
				}
				return tx.AddEvent(ctx, sb.ID, "deleted", nil)
			})
		}, true},
	}
	for _, st := range steps {
		ch := s.Changed()
		if err := st.do(); err != nil {
			t.Fatalf("%s: %v", st.name, err)
		}
		if got := closed(ch); got != st.want {
			t.Errorf("%s: told %v, want %v", st.name, got, st.want)
		}
	}
	// inside a transaction, nothing is told before the commit
	ch := s.Changed()
	_ = s.Update(ctx, func(tx *Store) error {
		_ = tx.AddEvent(ctx, sb.ID, "y", nil)
		if closed(ch) {
			t.Error("told before the commit")
		}
		return nil
	})
	if !closed(ch) {
		t.Error("not told at the commit")
	}
}
