package sandbox

import (
	"context"
	"maps"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"sbx.dev/sbx/api"
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

// watch starts watching sandbox id's runsc sandbox process.
func (m *Manager) watch(ctx context.Context, id string) {
	st, err := m.cfg.Runtime.State(ctx, id)
	if err != nil || st.Pid <= 0 {
		m.log.Warn("cannot watch sandbox", "sandbox", id, "err", err)
		return
	}
	m.watcher.add(id, runsc.Proc{Pid: st.Pid, Start: runsc.ProcessStart(st.Pid)})
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
	unlock := m.lock(id)
	defer unlock()
	sb, err := m.cfg.Store.Sandbox(ctx, id)
	if err != nil || sb.State != api.StateReady {
		return // deleted or changed on purpose meanwhile
	}
	if st, err := m.cfg.Runtime.State(ctx, id); err == nil && st.Live() {
		m.watch(ctx, id) // a restore replaced the process under the same id
		return
	}
	reason, event := "the sandbox's runsc process ended unexpectedly", "exited"
	if oomKilled(m.cgroupsPath(id)) {
		limit := "its memory limit"
		if sb.Memory > 0 {
			limit = "its memory limit of " + fmtBytes(sb.Memory)
		}
		reason, event = "out of memory: the sandbox used "+limit+" and the kernel stopped it; delete it and create it with a larger memory limit", "oom"
	}
	m.log.Warn("sandbox ended on its own", "sandbox", id, "reason", reason)
	err = m.cfg.Store.Update(ctx, func(tx *store.Store) error {
		if err := tx.Transition(ctx, id, store.Change{From: []api.State{api.StateReady}, To: api.StateError, Reason: reason}); err != nil {
			return err
		}
		return tx.AddEvent(ctx, id, event, map[string]any{"reason": reason, "memoryLimit": sb.Memory})
	})
	if err != nil {
		m.log.Error("record the end of a sandbox", "sandbox", id, "err", err)
		return
	}
	m.loseExecs(ctx, id) // their commands ended with it
}

// oomKilled reports whether the kernel's OOM killer acted in a cgroup.
func oomKilled(cgroupsPath string) bool {
	// cgroup v1
	if b, err := os.ReadFile(filepath.Join("/sys/fs/cgroup/memory", cgroupsPath, "memory.oom_control")); err == nil {
		return counter(string(b), "oom_kill") > 0
	}
	// cgroup v2
	if b, err := os.ReadFile(filepath.Join("/sys/fs/cgroup", cgroupsPath, "memory.events")); err == nil {
		return counter(string(b), "oom_kill") > 0
	}
	return false
}

func counter(text, key string) int64 {
	for _, line := range strings.Split(text, "\n") {
		f := strings.Fields(line)
		if len(f) == 2 && f[0] == key {
			n, _ := strconv.ParseInt(f[1], 10, 64)
			return n
		}
	}
	return 0
}

// removeCgroups removes a sandbox's own cgroups (runsc leaves them when a
// sandbox failed to start) and this daemon's parent cgroups once they are
// empty; while a process or a sandbox remains, the kernel refuses, and that
// is fine.
func (m *Manager) removeCgroups(id string) {
	ctrls, _ := os.ReadDir("/sys/fs/cgroup")
	for _, c := range ctrls {
		_ = syscall.Rmdir(filepath.Join("/sys/fs/cgroup", c.Name(), m.cgroupsPath(id)))
		_ = syscall.Rmdir(filepath.Join("/sys/fs/cgroup", c.Name(), "sbx-"+m.cfg.Tag))
	}
}
