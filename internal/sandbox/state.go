package sandbox

import (
	"context"
	"fmt"
	"slices"

	"sbx.dev/sbx/api"
	"sbx.dev/sbx/internal/store"
)

// The state table: every change of a sandbox's state is one of these
// moves, and goes through move or moveIn, which build the store's
// compare-and-set from it (store.Transition). No caller chooses its own
// "from" states: a move names where it may come from, once, here. The
// states themselves are listed once, in api.States; ARCHITECTURE.md draws
// the table.
type move struct {
	name string
	from []api.State
	to   api.State
}

var (
	// a create, fork or from-snapshot booted
	moveBooted = move{"booted", from(api.StateCreating), api.StateReady}
	// an unfinished create or fork that reconcile could not undo
	moveUndoFailed = move{"undo-failed", from(api.StateCreating), api.StateError}
	moveStop       = move{"stop", from(api.StateReady), api.StateStopping}
	// a stop that failed, or that a restart found unfinished with its
	// source still running
	moveStopUndone = move{"stop-undone", from(api.StateStopping), api.StateReady}
	moveStopped    = move{"stopped", from(api.StateStopping), api.StateStopped}
	// a restart found the complete image of a stop, or of a capture of a
	// sandbox runsc lost meanwhile, and adopts it
	moveImageAdopted = move{"image-adopted", from(api.StateReady, api.StateStopping, api.StateError), api.StateStopped}
	// a restart found a ready sandbox gone from runsc, with a complete
	// memory image of it kept
	moveLostImageKept = move{"lost-image-kept", from(api.StateReady, api.StateStopping), api.StateStopped}
	moveResumed       = move{"resumed", from(api.StateStopped), api.StateReady}
	// its runsc process ended on its own (out of memory, killed)
	moveEnded = move{"ended", from(api.StateReady), api.StateError}
	// after a restart of sbxd: runsc no longer knows it, or cannot say
	moveLost       = move{"lost", from(api.StateReady, api.StateStopping), api.StateLost}
	moveUnanswered = move{"unanswered", from(api.StateReady, api.StateStopping), api.StateError}
	// a delete whose runtime would not go: the record stays, saying so
	moveDeleteFailed = move{"delete-failed", api.States, api.StateError}
)

// moves is the table, for its test and ARCHITECTURE.md.
var moves = []move{moveBooted, moveUndoFailed, moveStop, moveStopUndone, moveStopped, moveImageAdopted,
	moveLostImageKept, moveResumed, moveEnded, moveLost, moveUnanswered, moveDeleteFailed}

// allowed reports whether some move takes a sandbox from one state to another.
func allowed(fromState, to api.State) bool {
	for _, mv := range moves {
		if mv.to == to && slices.Contains(mv.from, fromState) {
			return true
		}
	}
	return false
}

// change is the store's compare-and-set for mv, with c's reason and the
// fields that change with it.
func (mv move) change(c store.Change) store.Change {
	c.From, c.To = mv.from, mv.to
	return c
}

// move makes mv on sandbox id, with its event, in one transaction.
func (m *Manager) move(ctx context.Context, id string, mv move, c store.Change) error {
	return m.cfg.Store.Transition(context.WithoutCancel(ctx), id, mv.change(c))
}

// moveIn makes mv on sandbox id within tx.
func moveIn(ctx context.Context, tx *store.Store, id string, mv move, c store.Change) error {
	return tx.Transition(ctx, id, mv.change(c))
}

// requireState says, as a conflict that tells what to do, why sb is not
// in state want; nil if it is.
func requireState(sb *store.Sandbox, want api.State) error {
	if sb.State == want {
		return nil
	}
	switch {
	case want == api.StateReady && sb.State == api.StateStopped:
		return api.Errorf(api.ErrConflict, "sandbox %s is stopped; resume it first", sb.ID)
	case want == api.StateStopped:
		return api.Errorf(api.ErrConflict, "sandbox %s is %s, not stopped; only a stopped sandbox can be resumed", sb.ID, sb.State)
	}
	msg := fmt.Sprintf("sandbox %s is %s", sb.ID, sb.State)
	if sb.Reason != "" {
		msg += ": " + sb.Reason
	}
	return api.Errorf(api.ErrConflict, "%s", msg)
}

// step is how far a journaled operation got (journal.go): reconcile
// decides from it whether to undo or to finish.
type step string

const (
	stepJournaled       step = "journaled"        // every entry begins so
	stepDiskWritten     step = "disk-written"     // a capture's disk tar is complete
	stepMemoryWritten   step = "memory-written"   // its memory image too
	stepComplete        step = "complete"         // the image is whole and synced
	stepSourceDestroyed step = "source-destroyed" // a stop: the source is gone
	stepCaptured        step = "captured"         // a fork: the parent is captured
	stepRestoring       step = "restoring"        // a resume restores memory
	stepBootingDisk     step = "booting-disk"     // a resume boots from its disk
	stepMoved           step = "moved"            // a freeze's image is in place
)
