package sandbox

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"sync"
	"time"

	"sbx.dev/sbx/api"
	"sbx.dev/sbx/internal/cgroup"
	"sbx.dev/sbx/internal/runsc"
	"sbx.dev/sbx/internal/store"
)

// A sandbox can end on its own: the kernel kills the whole gVisor sandbox
// when its memory cgroup is full, or runsc dies. The watcher notices within
// a fraction of a second and records why, so a sandbox never silently
// turns into one whose every exec fails.

// watcher holds the runsc sandbox process of every ready sandbox.
type watcher struct {
	mu sync.Mutex
	m  map[string]runsc.Proc
}

func (w *watcher) add(id string, p runsc.Proc) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.m == nil {
		w.m = map[string]runsc.Proc{}
	}
	w.m[id] = p
}

func (w *watcher) get(id string) (runsc.Proc, bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	p, ok := w.m[id]
	return p, ok
}

// addIfAbsent watches p for id unless something watches id already.
func (w *watcher) addIfAbsent(id string, p runsc.Proc) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if _, ok := w.m[id]; !ok {
		if w.m == nil {
			w.m = map[string]runsc.Proc{}
		}
		w.m[id] = p
	}
}

func (w *watcher) remove(id string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	delete(w.m, id)
}

// ended returns, and stops watching, the sandboxes whose process is gone.
// /proc is read with the lock released.
func (w *watcher) ended() []string {
	w.mu.Lock()
	all := maps.Clone(w.m)
	w.mu.Unlock()
	var dead []string
	for id, p := range all {
		if p.Alive() {
			continue
		}
		w.mu.Lock()
		if cur, ok := w.m[id]; ok && cur == p { // not re-watched meanwhile
			delete(w.m, id)
			dead = append(dead, id)
		}
		w.mu.Unlock()
	}
	return dead
}

// watchInterval is how often the watcher looks at the sandbox processes.
const watchInterval = 250 * time.Millisecond

// watch starts watching sandbox id's runsc sandbox process. A sandbox
// whose process runsc cannot name, or which is already gone (killed out
// of memory as it started), is watched as ended: the next look records
// why, rather than it staying ready with nothing watching it.
func (m *Manager) watch(ctx context.Context, id string) {
	// the pid runsc wrote at the boot, if that process still runs; else
	// runsc state, a process start (the last 50 ms of a create, measured)
	p, ok := runsc.BootedProcess(m.pidFile(id), id)
	if !ok {
		var err error
		if p, err = m.sandboxProcess(ctx, id); err != nil {
			m.log.Warn("cannot watch sandbox; looking again", "sandbox", id, "err", err)
		}
	}
	m.watcher.add(id, p)
	if p.Alive() {
		// At the sandbox's memory limit the kernel kills one process of
		// its cgroup: let it be the sandbox itself, so that it stops
		// whole and is reported out of memory (DESIGN §3). Left to the
		// kernel's choice, it took as often one of runsc's small helpers,
		// and the sandbox went on called ready while its execs were lost
		// (TestLimits, in CI). The copiers' runsc exec are exempt
		// (runsc/shim.go).
		preferOOMKill(p.Pid)
	}
}

// pidFile is where runsc writes sandbox id's sandbox process pid at a boot.
func (m *Manager) pidFile(id string) string {
	return filepath.Join(m.sandboxDir(id), "sandbox.pid")
}

// sandboxProcess is sandbox id's runsc sandbox process as runsc names it:
// a Proc that is not Alive when runsc says the sandbox is not running, or
// names a process already gone. runsc counts a killed process its parent
// has not yet reaped (a zombie) as running; Alive does not. The error is
// runsc's when it could not say.
func (m *Manager) sandboxProcess(ctx context.Context, id string) (runsc.Proc, error) {
	st, err := m.cfg.Runtime.State(ctx, id)
	switch {
	case errors.Is(err, runsc.ErrNotExist):
		return runsc.Proc{}, nil
	case err != nil:
		return runsc.Proc{}, err
	case !st.Live() || st.Pid <= 0:
		return runsc.Proc{}, nil
	}
	return runsc.Proc{Pid: st.Pid, Start: runsc.ProcessStart(st.Pid)}, nil
}

// preferOOMKill makes pid the first the kernel kills at its cgroup's
// memory limit, if it is a runsc sandbox process (never another's: a pid
// reused, or a test's own).
func preferOOMKill(pid int) {
	cmdline, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	if err != nil || !bytes.HasPrefix(cmdline, []byte("runsc-sandbox\x00")) {
		return
	}
	_ = os.WriteFile(fmt.Sprintf("/proc/%d/oom_score_adj", pid), []byte("1000"), 0)
}

func (m *Manager) unwatch(id string) { m.watcher.remove(id) }

// watchLoop runs until ctx ends.
func (m *Manager) watchLoop(ctx context.Context) {
	t := time.NewTicker(watchInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		for _, id := range m.watcher.ended() {
			go m.sandboxEnded(context.WithoutCancel(ctx), id)
		}
	}
}

// sandboxEnded records why a running sandbox's process went away.
func (m *Manager) sandboxEnded(ctx context.Context, id string) {
	unlock, err := m.claim(ctx, id, "ended")
	if err != nil {
		return
	}
	defer unlock()
	sb, err := m.cfg.Store.Sandbox(ctx, id)
	if err != nil || sb.State != api.StateReady {
		return // deleted or changed on purpose meanwhile
	}
	p, err := m.sandboxProcess(ctx, id)
	switch {
	case err != nil:
		// runsc could not say: look again in a while (never call a
		// sandbox ended on a failed runsc state alone)
		m.log.Warn("sandbox process gone; runsc cannot say more, looking again", "sandbox", id, "err", err)
		time.AfterFunc(time.Second, func() { m.watcher.addIfAbsent(id, runsc.Proc{}) })
		return
	case p.Alive():
		m.watcher.add(id, p) // a restore replaced the process under the same id
		preferOOMKill(p.Pid)
		return
	}
	m.recordEnd(ctx, sb)
}

// processGone reports whether sandbox id's watched process has ended and
// runsc agrees: a failed `runsc state` alone proves nothing.
func (m *Manager) processGone(ctx context.Context, id string) bool {
	p, ok := m.watcher.get(id)
	if !ok || p.Alive() {
		return false
	}
	st, err := m.cfg.Runtime.State(ctx, id)
	return (err == nil && !st.Live()) || errors.Is(err, runsc.ErrNotExist)
}

// recordEnd records why ready sandbox sb, which the caller claims, ended
// on its own, and loses its execs: their commands ended with it.
func (m *Manager) recordEnd(ctx context.Context, sb *store.Sandbox) {
	id := sb.ID
	m.unwatch(id)
	reason, event := "the sandbox's runsc process ended unexpectedly", "exited"
	if m.cgroupOf(id).OOMKilled() {
		limit := "its memory limit"
		if sb.Memory > 0 {
			limit = "its memory limit of " + fmtBytes(sb.Memory)
		}
		reason, event = "out of memory: the sandbox used "+limit+" and the kernel stopped it; delete it and create it with a larger memory limit", "oom"
	}
	m.log.Warn("sandbox ended on its own", "sandbox", id, "reason", reason)
	err := m.cfg.Store.Update(ctx, func(tx *store.Store) error {
		if err := moveIn(ctx, tx, id, moveEnded, store.Change{Reason: reason}); err != nil {
			return err
		}
		return tx.AddEvent(ctx, id, event, map[string]any{"reason": reason, "memoryLimit": sb.Memory})
	})
	if err != nil {
		m.log.Error("record the end of a sandbox", "sandbox", id, "err", err)
		return
	}
	m.execs.loseExecs(ctx, id) // their commands ended with it
}

// removeCgroups removes a sandbox's own cgroups (runsc leaves them when a
// sandbox failed to start) and this daemon's parent cgroups once they are
// empty; while a process or a sandbox remains, the kernel refuses, and that
// is fine.
func (m *Manager) removeCgroups(id string) {
	m.cgroupOf(id).Remove()
	cgroup.Host.Group(cgroup.Parent(m.cfg.Tag)).Remove()
}
