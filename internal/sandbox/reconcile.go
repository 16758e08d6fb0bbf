package sandbox

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"time"

	"sbx.dev/sbx/api"
	"sbx.dev/sbx/internal/runsc"
	"sbx.dev/sbx/internal/store"
)

// After an abrupt end of sbxd, the restart brings its records in line with
// what is actually there, before it serves, in three passes:
//
//  1. the journal: each operation that was under way is finished or undone
//     from what is there (is the image complete? does runsc still have the
//     sandbox, and does it answer?), and the decision is recorded as a
//     "reconciled" event with its reason;
//  2. every sandbox: its record is checked against runsc's view;
//  3. leftovers: whatever no record names (runsc sandboxes, namespaces,
//     cgroups, directories, images, disks) is removed.
//
// It never cold-boots a sandbox whose memory could still be had, never
// leaves a complete image behind an error, and never calls lost a sandbox
// that runsc still has.

// captureWaitLimit bounds how long a restarted sbxd waits for a capture
// process the previous one left running. It is loose on purpose: cutting
// a checkpoint short is what loses memory. Only the processes the journal
// recorded (pid and start time) are waited for, so nobody else's process
// can hold the restart.
const captureWaitLimit = 30 * time.Minute

// reconcileJournal finishes or undoes each operation a previous sbxd
// journaled and did not finish.
func (m *Manager) reconcileJournal(ctx context.Context) error {
	intents, err := m.cfg.Store.Intents(ctx)
	if err != nil {
		return fmt.Errorf("reconcile: read the journal: %w", err)
	}
	for _, in := range intents {
		m.waitProcs(ctx, in)
		c := &inFlight{j: &m.journal, kind: in.Kind, img: in.ID, detail: in.Detail}
		var decision, reason string
		switch in.Kind {
		case kindSnapshot:
			decision, reason = m.reconcileSnapshot(ctx, c, in)
		case kindStop:
			decision, reason = m.reconcileStop(ctx, c, in)
		case kindFork:
			decision, reason = m.reconcileFork(ctx, c, in)
		case kindResume:
			decision, reason = m.reconcileResume(ctx, c, in)
		case kindDelete:
			decision, reason = m.reconcileDelete(ctx, c, in)
		case kindFreeze:
			decision, reason = m.freezes.reconcileFreeze(ctx, c, in)
		default:
			decision, reason = "dropped", fmt.Sprintf("an operation of unknown kind %q", in.Kind)
		}
		m.log.Info("reconciled an interrupted operation", "sandbox", in.SandboxID, "kind", in.Kind, "step", in.Step, "decision", decision, "reason", reason)
		m.event(ctx, in.SandboxID, "reconciled", map[string]any{
			"operation": in.Kind, "step": in.Step, "entry": in.ID, "decision": decision, "reason": reason,
		})
		// closed with the decision where it could be; else now
		if err := m.cfg.Store.DeleteIntent(ctx, in.ID); err != nil {
			return fmt.Errorf("reconcile: close the journal entry %s: %w", in.ID, err)
		}
	}
	return nil
}

// waitProcs waits for the capture processes the journal entry recorded
// (a runsc checkpoint, tar or restore the previous sbxd left running) to end.
func (m *Manager) waitProcs(ctx context.Context, in *store.Intent) {
	var procs []runsc.Proc
	if raw, ok := in.Detail["procs"]; ok {
		b, _ := json.Marshal(raw)
		_ = json.Unmarshal(b, &procs)
	}
	deadline := time.Now().Add(captureWaitLimit)
	for _, p := range procs {
		if p.Alive() {
			m.log.Info("waiting for a capture process the previous sbxd left", "entry", in.ID, "pid", p.Pid)
		}
		for p.Alive() && time.Now().Before(deadline) {
			select {
			case <-ctx.Done():
				return
			case <-time.After(100 * time.Millisecond):
			}
		}
	}
}

// runtimeStatus is what runsc says of a sandbox, classed.
type runtimeStatus int

const (
	runtimeGone    runtimeStatus = iota // runsc does not have it, or it stopped
	runtimeRunning                      // it runs
	runtimePaused                       // it is paused (a capture cut short)
	runtimeUnknown                      // runsc cannot say
)

// runtimeState asks runsc about sandbox id, a few times if runsc cannot say
// (its state file may be locked by a runsc that is just ending).
func (m *Manager) runtimeState(ctx context.Context, id string) (runtimeStatus, error) {
	var err error
	for attempt := 0; attempt < 3; attempt++ {
		var st runsc.State
		st, err = m.cfg.Runtime.State(ctx, id)
		switch {
		case errors.Is(err, runsc.ErrNotExist):
			return runtimeGone, nil
		case err != nil:
			time.Sleep(200 * time.Millisecond)
			continue
		case st.Status == runsc.StatusRunning:
			return runtimeRunning, nil
		case st.Status == runsc.StatusPaused:
			return runtimePaused, nil
		case st.Status == runsc.StatusStopped:
			return runtimeGone, nil
		default: // creating or created: a start cut short
			return runtimeGone, nil
		}
	}
	return runtimeUnknown, err
}

// completeImage reports whether image img is complete, its memory (if it
// has any) included.
func (m *Manager) completeImageOf(img string, memory bool) bool {
	if !m.images.isComplete(img) {
		return false
	}
	return !memory || verifyCheckpoint(m.images.mem(img)) == nil
}

func detailString(d map[string]any, k string) string {
	s, _ := d[k].(string)
	return s
}

// reconcileSnapshot keeps the snapshot whose image is complete (nothing
// else was left to do but record it) and drops one whose image is not.
// The source itself is left to the second pass (resumed if the capture
// left it paused), unless runsc lost it while a complete memory image of
// it exists: then it is adopted as stopped on a copy of that image.
func (m *Manager) reconcileSnapshot(ctx context.Context, c *inFlight, in *store.Intent) (string, string) {
	memory := in.Detail["memory"] == true
	name := detailString(in.Detail, "name")
	sb, err := m.cfg.Store.Sandbox(ctx, in.SandboxID)
	complete := m.completeImageOf(in.ID, memory)
	if err != nil {
		// its snapshot outlives it, as any snapshot does
		if complete && name != "" {
			if taken, _ := m.cfg.Store.SnapshotNameTaken(ctx, name); !taken {
				sn := &store.Snapshot{Name: name, ID: in.ID, SandboxID: in.SandboxID, Memory: memory, CreatedAt: m.now()}
				if err := m.cfg.Store.CreateSnapshot(ctx, sn); err == nil {
					return "snapshot kept", "the sandbox was deleted; its complete snapshot is kept"
				}
			}
		}
		_ = m.images.remove(in.ID)
		return "dropped", "the sandbox was deleted"
	}
	if !complete {
		_ = m.images.remove(in.ID)
		return "snapshot dropped", "the snapshot's image was not complete; the sandbox is as it was"
	}
	if taken, _ := m.cfg.Store.SnapshotNameTaken(ctx, name); taken || name == "" {
		_ = m.images.remove(in.ID)
		return "snapshot dropped", fmt.Sprintf("the snapshot's name %q was taken meanwhile", name)
	}
	size, _ := m.images.size(in.ID)
	sn := m.snapshotRecord(sb, name, in.ID, memory, size, 0)
	err = m.cfg.Store.Update(ctx, func(tx *store.Store) error {
		if err := tx.CreateSnapshot(ctx, sn); err != nil {
			return err
		}
		return c.closeIn(ctx, tx)
	})
	if err != nil {
		return "error", fmt.Sprintf("the snapshot's image is complete but cannot be recorded: %v; it stays in %s", err, m.images.dir(in.ID))
	}
	reason := "the snapshot's image was complete: the snapshot " + name + " is kept"
	if memory {
		m.pagesAllLoaded(ctx, sb.ID) // its memory was written whole, so runsc had loaded it all
	}
	if memory && sb.State == api.StateReady {
		if st, _ := m.runtimeState(ctx, sb.ID); st == runtimeGone {
			if err := m.adoptOnCopy(ctx, sb.ID, in.ID); err == nil {
				reason += "; the sandbox itself was gone and is adopted as stopped on a copy of it"
			}
		}
	}
	return "snapshot kept", reason
}

// adoptOnCopy adopts sandbox id, which runsc lost, as stopped on a copy
// (hard links) of the complete memory image img.
func (m *Manager) adoptOnCopy(ctx context.Context, id, img string) error {
	cp, err := m.images.clone(img)
	if err != nil {
		return err
	}
	_ = m.destroyRuntimeKeepNetwork(ctx, id)
	err = m.cfg.Store.Update(ctx, func(tx *store.Store) error {
		if err := tx.AddImage(ctx, &store.Image{ID: cp, SandboxID: id, Kind: "hibernation", CreatedAt: m.now()}); err != nil {
			return err
		}
		return moveIn(ctx, tx, id, moveLostImageKept, store.Change{Image: &cp,
			Reason: "runsc lost the sandbox while sbxd was away; a complete memory image of it was kept"})
	})
	if err != nil {
		_ = m.images.remove(cp)
	}
	return err
}

// reconcileStop finishes a stop whose image is complete (the sandbox is
// adopted as stopped, and whatever runsc still has of it goes), and undoes
// one whose image is not (the sandbox is ready again; the second pass
// resumes it if the capture left it paused).
func (m *Manager) reconcileStop(ctx context.Context, c *inFlight, in *store.Intent) (string, string) {
	sb, err := m.cfg.Store.Sandbox(ctx, in.SandboxID)
	if err != nil {
		_ = m.images.remove(in.ID)
		return "dropped", "the sandbox was deleted"
	}
	if m.completeImageOf(in.ID, true) {
		// as a stop does: a freeze the capture came just after is seen,
		// and told of, before the source goes
		m.freezes.letFreezeTell(ctx, sb.ID)
		if err := m.destroyRuntimeKeepNetwork(ctx, sb.ID); err != nil {
			m.log.Warn("reconcile a stop: remove what is left of the source", "sandbox", sb.ID, "err", err)
		}
		if err := m.adoptStopped(ctx, c, sb.ID, in.ID, moveImageAdopted); err != nil {
			return "error", fmt.Sprintf("the stop's image is complete but cannot be recorded: %v; it stays in %s", err, m.images.dir(in.ID))
		}
		m.retireImage(ctx, sb.Image)
		return "adopted as stopped", "the stop's image is complete: the sandbox is stopped with its memory; a resume restores it"
	}
	_ = m.images.remove(in.ID)
	// a stop pauses the sandbox for its capture: it runs on
	m.ensureRunning(ctx, sb.ID)
	err = m.cfg.Store.Update(ctx, func(tx *store.Store) error {
		if sb.State == api.StateStopping {
			if err := moveIn(ctx, tx, sb.ID, moveStopUndone, store.Change{}); err != nil {
				return err
			}
		}
		return c.closeIn(ctx, tx)
	})
	if err != nil {
		return "error", err.Error()
	}
	return "stop undone", "the stop's image was not complete: the sandbox runs on, and the partial image was dropped"
}

// reconcileFork undoes a fork that did not finish: a fork is all its
// children or none, and the children become ready together with the
// closing of its journal entry, so an entry left means none is ready.
func (m *Manager) reconcileFork(ctx context.Context, c *inFlight, in *store.Intent) (string, string) {
	var ids []string
	if raw, ok := in.Detail["children"].([]any); ok {
		for _, v := range raw {
			if s, ok := v.(string); ok {
				ids = append(ids, s)
			}
		}
	}
	removed := 0
	for _, id := range ids {
		sb, err := m.cfg.Store.Sandbox(ctx, id)
		if err != nil || sb.State != api.StateCreating {
			continue
		}
		if err := m.destroy(ctx, id); err != nil {
			m.log.Error("reconcile a fork: remove a child", "sandbox", id, "err", err)
			_ = m.move(ctx, id, moveUndoFailed, store.Change{Reason: "an unfinished fork could not remove it: " + err.Error()})
			continue
		}
		removed++
	}
	_ = m.images.remove(in.ID)
	return "fork undone", fmt.Sprintf("the fork did not finish; its %d children were removed (a fork is all its children or none)", removed)
}

// reconcileResume finishes a resume whose sandbox runsc has and which
// answers, and undoes any other: the sandbox stays stopped with its image.
func (m *Manager) reconcileResume(ctx context.Context, c *inFlight, in *store.Intent) (string, string) {
	sb, err := m.cfg.Store.Sandbox(ctx, in.SandboxID)
	if err != nil {
		return "dropped", "the sandbox was deleted"
	}
	if sb.State != api.StateStopped {
		return "nothing to do", "the sandbox is " + string(sb.State)
	}
	st, _ := m.runtimeState(ctx, sb.ID)
	if st == runtimePaused {
		if err := m.cfg.Runtime.Resume(ctx, sb.ID); err == nil {
			st = runtimeRunning
		}
	}
	newDisk := detailString(in.Detail, "disk")
	if st == runtimeRunning && m.probe(ctx, sb.ID) == nil {
		memory := step(in.Step) == stepRestoring
		change := store.Change{MemoryRestored: ptr(memory), ResumeReason: ptr(""), Image: ptr("")}
		if !memory {
			change.ResumeReason = ptr(detailString(in.Detail, "reason"))
			if newDisk != "" {
				change.Disk = &newDisk
			}
		}
		if err := m.resumed(ctx, c, sb, change); err != nil {
			return "error", err.Error()
		}
		return "resumed", "the resumed sandbox runs and answers"
	}
	if err := m.destroyRuntimeKeepNetwork(ctx, sb.ID); err != nil {
		m.log.Warn("reconcile a resume: remove what was restored", "sandbox", sb.ID, "err", err)
	}
	if newDisk != "" && newDisk != sb.Disk {
		m.storage.releaseDisk(ctx, newDisk)
	}
	return "kept stopped", "the resume did not finish; the sandbox is stopped with its image: resume it again"
}

// reconcileDelete finishes a delete.
func (m *Manager) reconcileDelete(ctx context.Context, c *inFlight, in *store.Intent) (string, string) {
	if _, err := m.cfg.Store.Sandbox(ctx, in.SandboxID); err != nil {
		return "nothing to do", "the sandbox is deleted"
	}
	if err := m.destroyRuntime(ctx, in.SandboxID); err != nil {
		_ = m.move(ctx, in.SandboxID, moveDeleteFailed, store.Change{Reason: "delete failed: " + err.Error() + "; delete it again"})
		return "error", err.Error()
	}
	withSnapshots := in.Detail["withSnapshots"] == true
	if _, err := m.finishDelete(ctx, c, in.SandboxID, withSnapshots, nil); err != nil {
		return "error", err.Error()
	}
	return "deleted", "the delete was finished"
}

// probe runs a trivial command in a sandbox to see that it answers.
func (m *Manager) probe(ctx context.Context, id string) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	code, err := m.cfg.Runtime.Exec(ctx, id, runsc.ExecOptions{Args: []string{runsc.AgentPath, "help"}}, nil, io.Discard, io.Discard)
	if err != nil {
		return err
	}
	if code != 0 {
		return fmt.Errorf("probe exited %d", code)
	}
	return nil
}

// reconcile brings one stored sandbox in line with runsc's view after a
// restart (its journaled operations, if any, were reconciled first).
func (m *Manager) reconcile(ctx context.Context, sb *store.Sandbox) {
	fail := func(mv move, reason string) {
		if err := m.move(ctx, sb.ID, mv, store.Change{Reason: reason}); err != nil {
			m.log.Error("reconcile: record the state", "sandbox", sb.ID, "err", err)
		}
	}
	switch sb.State {
	case api.StateReady, api.StateStopping:
		st, err := m.runtimeState(ctx, sb.ID)
		switch st {
		case runtimeGone:
			reason := "runsc no longer knows the sandbox (was the host restarted?)"
			if m.cgroupOf(sb.ID).OOMKilled() {
				reason = "out of memory: the kernel stopped the sandbox while sbxd was away"
			}
			if err := m.killCgroup(sb.ID); err == nil {
				m.removeCgroups(sb.ID)
			}
			fail(moveLost, reason)
			return
		case runtimeUnknown:
			fail(moveUnanswered, fmt.Sprintf("runsc cannot report the sandbox after a restart of sbxd: %v", err))
			return
		case runtimePaused:
			// A capture left it paused and its journal entry is settled
			// (a capture without one cannot be running). Let it run.
			if err := m.cfg.Runtime.Resume(ctx, sb.ID); err != nil {
				fail(moveUnanswered, fmt.Sprintf("found paused after a restart of sbxd and will not resume: %v", err))
				return
			}
		}
		if sb.State == api.StateStopping {
			if err := m.move(ctx, sb.ID, moveStopUndone, store.Change{}); err != nil {
				m.log.Error("reconcile: record the state", "sandbox", sb.ID, "err", err)
			}
		}
		// the rules outlived sbxd, the reader of the delay's queue did not
		if err := m.applyShape(sb); err != nil {
			m.log.Warn("reconcile: shape the sandbox's traffic again", "sandbox", sb.ID, "err", err)
		}
		m.watch(ctx, sb.ID)
	case api.StateStopped:
		// A stopped sandbox has no runsc sandbox: whatever is there is the
		// leftover of a resume that was undone.
		if st, _ := m.runtimeState(ctx, sb.ID); st != runtimeGone {
			if err := m.destroyRuntimeKeepNetwork(ctx, sb.ID); err != nil {
				m.log.Warn("reconcile: remove a stopped sandbox's leftover runtime", "sandbox", sb.ID, "err", err)
			}
		}
	case api.StateCreating:
		// A create that sbxd did not finish: nobody was told of it, so undo it.
		m.log.Info("removing a sandbox whose creation was interrupted", "sandbox", sb.ID)
		if err := m.destroy(ctx, sb.ID); err != nil {
			fail(moveUndoFailed, "an interrupted create could not be undone: "+err.Error())
		}
	}
}
