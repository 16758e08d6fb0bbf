package sandbox

import (
	"context"
	"sync"

	"sbx.dev/sbx/api"
	"sbx.dev/sbx/internal/monitor"
)

// monitorTable holds the runtime monitors of the monitored sandboxes. A
// monitor lives from the boot (or restore) that asked for it until the
// sandbox's runtime is destroyed; a stop and resume boots without one.
type monitorTable struct {
	mu sync.Mutex
	m  map[string]*monitor.Monitor
}

// start listens for sandbox id's monitoring in dir, replacing a monitor of
// an earlier boot, and returns the pod init config to boot it with.
func (t *monitorTable) start(id, dir string) (string, error) {
	mon, cfg, err := monitor.Start(id, dir, 0)
	if err != nil {
		return "", err
	}
	t.mu.Lock()
	old := t.m[id]
	if t.m == nil {
		t.m = map[string]*monitor.Monitor{}
	}
	t.m[id] = mon
	t.mu.Unlock()
	if old != nil {
		_ = old.Close()
	}
	return cfg, nil
}

// stop ends sandbox id's monitor, if it has one.
func (t *monitorTable) stop(id string) {
	t.mu.Lock()
	mon := t.m[id]
	delete(t.m, id)
	t.mu.Unlock()
	if mon != nil {
		_ = mon.Close()
	}
}

func (t *monitorTable) get(id string) *monitor.Monitor {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.m[id]
}

// Trace returns what runtime monitoring kept of sandbox ref since its
// monitored boot or restore. An unknown sandbox is api.ErrNotFound; one
// that is not monitored api.ErrConflict.
func (m *Manager) Trace(ctx context.Context, ref string) (*api.Trace, error) {
	sb, err := m.cfg.Store.Sandbox(ctx, ref)
	if err != nil {
		return nil, err
	}
	mon := m.monitors.get(sb.ID)
	if mon == nil {
		return nil, api.Errorf(api.ErrConflict, "sandbox %s is not monitored: create or fork it with monitoring (`--monitor`)", sb.ID)
	}
	tr := mon.Trace()
	return &tr, nil
}
