package sandbox

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"sbx.dev/sbx/api"
)

// A sandbox can end on its own: the kernel kills the whole gVisor sandbox
// when its memory cgroup is full, or runsc dies. The watcher notices within
// a fraction of a second and records why, so a sandbox never silently
// turns into one whose every exec fails.

// watched is one sandbox process being watched.
type watched struct {
	pid   int
	start string // the process's start time, so a reused pid is not taken for it
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
	m.mu.Lock()
	m.watching[id] = watched{pid: st.Pid, start: procStart(st.Pid)}
	m.mu.Unlock()
}

func (m *Manager) unwatch(id string) {
	m.mu.Lock()
	delete(m.watching, id)
	m.mu.Unlock()
}

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
		var dead []string
		m.mu.Lock()
		for id, w := range m.watching {
			if w.start == "" || procStart(w.pid) != w.start {
				dead = append(dead, id)
				delete(m.watching, id)
			}
		}
		m.mu.Unlock()
		for _, id := range dead {
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
	reason, event := "the sandbox's runsc process ended unexpectedly", "exited"
	if oomKilled(m.cgroupsPath(id)) {
		limit := "its memory limit"
		if sb.Memory > 0 {
			limit = "its memory limit of " + fmtBytes(sb.Memory)
		}
		reason, event = "out of memory: the sandbox used "+limit+" and the kernel stopped it; delete it and create it with a larger --memory", "oom"
	}
	m.log.Warn("sandbox ended on its own", "sandbox", id, "reason", reason)
	if err := m.cfg.Store.SetState(ctx, id, api.StateError, reason); err != nil {
		m.log.Error("record state", "sandbox", id, "err", err)
	}
	m.event(ctx, id, event, map[string]any{"reason": reason, "memoryLimit": sb.Memory})
}

// procStart returns the start time of pid from /proc, or "" if it is gone
// (or a zombie: a dead sandbox that nobody reaped is dead all the same).
func procStart(pid int) string {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return ""
	}
	// The command name may hold spaces; the fields after it do not.
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return ""
	}
	f := strings.Fields(s[i+1:])
	if len(f) < 20 || f[0] == "Z" || f[0] == "X" {
		return ""
	}
	return f[19]
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
