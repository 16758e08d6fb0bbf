package sandbox

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"sbx.dev/sbx/api"
	"sbx.dev/sbx/internal/runsc"
	"sbx.dev/sbx/internal/store"
)

// captureWaitLimit bounds how long a restarted sbxd waits for a capture
// process the previous one left running. It is loose on purpose: cutting
// a checkpoint short is what loses memory.
const captureWaitLimit = 30 * time.Minute

// reconcileCaptures decides, for each capture a previous sbxd journaled
// and did not finish, what to do from what is actually there. It never
// cold-boots a sandbox whose memory could still be had, and never starts
// anything when it cannot tell.
func (m *Manager) reconcileCaptures(ctx context.Context) error {
	intents, err := m.cfg.Store.Intents(ctx)
	if err != nil {
		return fmt.Errorf("reconcile: read the journal: %w", err)
	}
	for _, in := range intents {
		m.waitCaptureProcesses(ctx, in.ID)
		decision, reason := m.reconcileCapture(ctx, in)
		m.log.Info("reconciled an interrupted capture", "sandbox", in.SandboxID, "kind", in.Kind, "step", in.Step, "decision", decision, "reason", reason)
		m.event(ctx, in.SandboxID, "reconciled", map[string]any{
			"capture": in.Kind, "step": in.Step, "image": in.ID, "decision": decision, "reason": reason,
		})
		if err := m.cfg.Store.DeleteIntent(ctx, in.ID); err != nil {
			return fmt.Errorf("reconcile: close the journal entry %s: %w", in.ID, err)
		}
	}
	return nil
}

// waitCaptureProcesses waits for any process still working on an image
// (a runsc checkpoint or tar whose arguments name it) to end.
func (m *Manager) waitCaptureProcesses(ctx context.Context, img string) {
	dir := []byte(m.imageDir(img))
	deadline := time.Now().Add(captureWaitLimit)
	logged := false
	for time.Now().Before(deadline) {
		pids := processesNaming(dir)
		if len(pids) == 0 {
			return
		}
		if !logged {
			m.log.Info("waiting for a capture process the previous sbxd left", "image", img, "pids", pids)
			logged = true
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(100 * time.Millisecond):
		}
	}
	m.log.Warn("a capture process is still running after the wait limit; reconciling anyway", "image", img)
}

// processesNaming returns the pids whose command line contains s.
func processesNaming(s []byte) []int {
	entries, _ := os.ReadDir("/proc")
	var pids []int
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == os.Getpid() {
			continue
		}
		cmd, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err == nil && bytes.Contains(cmd, s) {
			pids = append(pids, pid)
		}
	}
	return pids
}

// reconcileCapture applies the rules of "Never lose the sandbox" to one
// interrupted capture and returns the decision and why.
func (m *Manager) reconcileCapture(ctx context.Context, in *store.Intent) (decision, reason string) {
	sb, err := m.cfg.Store.Sandbox(ctx, in.SandboxID)
	if err != nil {
		_ = m.removeImage(in.ID)
		return "dropped", "the sandbox was deleted"
	}
	complete := m.imageComplete(in.ID)
	st, err := m.cfg.Runtime.State(ctx, sb.ID)
	gone := errors.Is(err, runsc.ErrNotExist) || (err == nil && st.Status == "stopped")
	switch {
	case err != nil && !gone:
		// Nothing can be told: start nothing, say so.
		m.setState(ctx, sb.ID, api.StateError, fmt.Sprintf("after an interrupted %s, runsc cannot report the sandbox: %v; delete it, or inspect it with runsc", in.Kind, err))
		return "error", "runsc cannot report the sandbox's state"

	case !gone && (st.Status == "running" || st.Status == "paused"):
		paused := st.Status == "paused"
		if paused {
			if err := m.cfg.Runtime.Resume(ctx, sb.ID); err != nil {
				m.setState(ctx, sb.ID, api.StateError, fmt.Sprintf("after an interrupted %s the sandbox is paused and will not resume: %v", in.Kind, err))
				return "error", "the paused sandbox will not resume"
			}
		}
		if err := m.probe(ctx, sb.ID); err != nil {
			m.setState(ctx, sb.ID, api.StateError, fmt.Sprintf("after an interrupted %s the sandbox does not answer: %v", in.Kind, err))
			return "error", "the sandbox does not answer a probe; the image is kept"
		}
		// It runs and answers: the capture is moot. Only now the image goes.
		_ = m.removeImage(in.ID)
		_ = m.cfg.Store.DeleteImage(ctx, in.ID)
		if err := m.cfg.Store.SetState(ctx, sb.ID, api.StateReady, ""); err != nil {
			return "error", err.Error()
		}
		r := "the sandbox is running and answers; the capture's image was dropped"
		if paused {
			r = "the sandbox was left paused; it was resumed, answers, and the capture's image was dropped"
		}
		if !complete {
			r += " (it was incomplete)"
		}
		return "kept running", r

	case gone && complete && in.Detail["memory"] == true:
		// Its memory is in a complete image: adopt it as stopped.
		_ = m.cfg.Runtime.Delete(ctx, sb.ID)
		_ = m.cfg.Store.AddImage(ctx, &store.Image{ID: in.ID, SandboxID: sb.ID, Kind: "hibernation", CreatedAt: m.now()})
		if err := m.cfg.Store.SetRuntime(ctx, sb.ID, api.StateStopped, sb.MemoryRestored, sb.ResumeReason, in.ID); err != nil {
			return "error", err.Error()
		}
		return "adopted as stopped", "the sandbox is gone and its image is complete; `sbx resume` restores its memory"

	default:
		_ = m.cfg.Runtime.Delete(ctx, sb.ID)
		_ = m.removeImage(in.ID)
		reason := fmt.Sprintf("the sandbox ended during an interrupted %s and no complete image of it exists", in.Kind)
		m.setState(ctx, sb.ID, api.StateLost, reason)
		return "lost", reason
	}
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
// restart (its journaled captures, if any, were reconciled first).
func (m *Manager) reconcile(ctx context.Context, sb *store.Sandbox) {
	switch sb.State {
	case api.StateReady, api.StateStopping:
		st, err := m.cfg.Runtime.State(ctx, sb.ID)
		switch {
		case errors.Is(err, runsc.ErrNotExist):
			reason := "runsc no longer knows the sandbox (was the host restarted?)"
			if oomKilled(m.cgroupsPath(sb.ID)) {
				reason = "out of memory: the kernel stopped the sandbox while sbxd was away"
			}
			m.setState(ctx, sb.ID, api.StateLost, reason)
		case err != nil:
			m.setState(ctx, sb.ID, api.StateError, fmt.Sprintf("runsc cannot report the sandbox after a restart of sbxd: %v", err))
		case st.Status == "paused":
			// Nothing journaled left it paused; a capture without a journal
			// entry cannot be running. Let it run.
			if err := m.cfg.Runtime.Resume(ctx, sb.ID); err != nil {
				m.setState(ctx, sb.ID, api.StateError, fmt.Sprintf("found paused after a restart of sbxd and will not resume: %v", err))
				return
			}
			_ = m.cfg.Store.SetState(ctx, sb.ID, api.StateReady, "")
			m.watch(ctx, sb.ID)
		case st.Status != "running":
			reason := fmt.Sprintf("runsc reports the sandbox %s after a restart of sbxd", st.Status)
			if oomKilled(m.cgroupsPath(sb.ID)) {
				reason = "out of memory: the kernel stopped the sandbox while sbxd was away"
			}
			m.setState(ctx, sb.ID, api.StateError, reason)
		default:
			if sb.State == api.StateStopping {
				_ = m.cfg.Store.SetState(ctx, sb.ID, api.StateReady, "")
			}
			m.watch(ctx, sb.ID)
		}
	case api.StateCreating:
		// A create that sbxd did not finish: nobody was told of it, so undo it.
		m.log.Info("removing a sandbox whose creation was interrupted", "sandbox", sb.ID)
		_ = m.destroy(ctx, sb.ID)
	}
}
