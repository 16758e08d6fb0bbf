package sandbox

import (
	"context"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"sbx.dev/sbx/api"
	"sbx.dev/sbx/internal/cgroup"
	"sbx.dev/sbx/internal/metrics"
	"sbx.dev/sbx/internal/store"
)

// metricsOwner owns what sbx measures: a sandbox's resource use now (its
// cgroup, its /proc, its overlay's blocks), and the registry sbxd serves at
// /metrics, where captures and the reaper's deletes are counted. It sees
// the rest of the manager only through metricsHost.
type metricsOwner struct {
	host metricsHost
	reg  *metrics.Registry // nil: metrics.Default
}

// metricsHost is what the metrics owner needs of the rest of the manager.
type metricsHost interface {
	Sandbox(ctx context.Context, ref string) (*store.Sandbox, error)
	sandboxDir(id string) string
	// sandboxPid is the pid of a running sandbox's runsc process
	sandboxPid(id string) (int, bool)
	cgroupOf(id string) cgroup.Group
	ReadDir(ctx context.Context, ref, p, after string, limit int) ([]api.FileInfo, error)
}

// metricsHost, as the manager gives it.
type managerMetricsHost struct {
	*store.Store
	m *Manager
}

func (h managerMetricsHost) sandboxDir(id string) string     { return h.m.sandboxDir(id) }
func (h managerMetricsHost) cgroupOf(id string) cgroup.Group { return h.m.cgroupOf(id) }
func (h managerMetricsHost) sandboxPid(id string) (int, bool) {
	w, ok := h.m.watcher.get(id)
	return w.Pid, ok
}
func (h managerMetricsHost) ReadDir(ctx context.Context, ref, p, after string, limit int) ([]api.FileInfo, error) {
	return h.m.ReadDir(ctx, ref, p, after, limit)
}

// The facade.

// Metrics: see metricsOwner.sandbox.
func (m *Manager) Metrics(ctx context.Context, ref string) (*api.Metrics, error) {
	return m.metrics.sandbox(ctx, ref)
}

// MetricsRegistry is the registry the manager counts captures and reaper
// actions in, and that sbxd serves at /metrics.
func (m *Manager) MetricsRegistry() *metrics.Registry { return m.metrics.registry() }

// Metrics reports a sandbox's resource use now: CPU time and memory from
// its cgroup, processes counted in its /proc (running sandboxes only; the
// agent that counts is left out), disk as the blocks its overlay's upper
// layer holds on the host. A stopped sandbox reports its disk and zeros.
// Metrics is inspection: it is not activity. An unknown sandbox is
// api.ErrNotFound.
func (o *metricsOwner) sandbox(ctx context.Context, ref string) (*api.Metrics, error) {
	sb, err := o.host.Sandbox(ctx, ref)
	if err != nil {
		return nil, err
	}
	upper := filepath.Join(o.host.sandboxDir(sb.ID), "upper")
	out := &api.Metrics{DiskBytes: diskUsage(upper)}
	if sb.State != api.StateReady {
		return out, nil
	}
	if pid, ok := o.host.sandboxPid(sb.ID); ok {
		out.DiskBytes += openUnder(pid, upper)
	}
	cg := o.host.cgroupOf(sb.ID)
	if d, ok := cg.CPUUsage(); ok {
		out.CPUSeconds = d.Seconds()
	}
	if b, ok := cg.MemoryCurrent(); ok {
		out.MemoryBytes = b
	}
	fis, err := o.host.ReadDir(ctx, sb.ID, "/proc", "", 0)
	if err != nil {
		return nil, fmt.Errorf("metrics of %s: count processes: %w", sb.ID, err)
	}
	for _, fi := range fis {
		if _, err := strconv.Atoi(fi.Name); err == nil {
			out.Processes++
		}
	}
	// The agent listing /proc is one of them.
	out.Processes = max(0, out.Processes-1)
	return out, nil
}

// diskUsage is what du says of dir: the bytes of the blocks its files
// hold, a file of several hard links once (storage.go's du).
func diskUsage(dir string) int64 { return newDU().of(dir) }

// openUnder is the blocks of the files under dir that process pid holds
// open: runsc keeps the overlay's file store open and unlinked in the upper
// dir, so du of the dir alone sees nothing.
func openUnder(pid int, dir string) int64 {
	fdDir := fmt.Sprintf("/proc/%d/fd", pid)
	ents, err := os.ReadDir(fdDir)
	if err != nil {
		return 0
	}
	var total int64
	for _, e := range ents {
		p := filepath.Join(fdDir, e.Name())
		target, err := os.Readlink(p)
		if err != nil || !strings.HasPrefix(target, dir+"/") {
			continue
		}
		if fi, err := os.Stat(p); err == nil && fi.Mode().IsRegular() {
			total += allocated(fi)
		}
	}
	return total
}

// allocated is the bytes of the blocks a file holds (its size where the
// file system does not say).
func allocated(fi fs.FileInfo) int64 {
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		return st.Blocks * 512
	}
	return fi.Size()
}

// MetricsRegistry is the registry the manager counts captures and reaper
// actions in, and that sbxd serves at /metrics.
func (o *metricsOwner) registry() *metrics.Registry {
	if o.reg != nil {
		return o.reg
	}
	return metrics.Default
}

// captureKinds names the capture events' kinds in metrics.
var captureKinds = map[string]string{"snapshot": "snapshot", "stopped": "stop", "forked": "fork", "resumed": "resume"}

// observeCapture counts a capture by kind and outcome and records its duration.
func (o *metricsOwner) observeCapture(typ string, d time.Duration, err error) {
	kind, ok := captureKinds[typ]
	if !ok {
		kind = typ
	}
	outcome := "ok"
	if err != nil {
		outcome = "error"
	}
	r := o.registry()
	r.Counter("sbx_captures_total", "Captures (snapshot, stop, fork, resume) by kind and outcome.", "kind", "outcome").Inc(kind, outcome)
	r.Histogram("sbx_capture_duration_seconds", "How long captures took, by kind and outcome.", metrics.DurationBuckets, "kind", "outcome").
		Observe(d.Seconds(), kind, outcome)
}

// observeReaped counts a sandbox the reaper deleted, by why: idle or lifetime.
func (o *metricsOwner) observeReaped(reason string) {
	why := "other"
	switch {
	case strings.HasPrefix(reason, "idle"):
		why = "idle"
	case strings.HasPrefix(reason, "lifetime"):
		why = "lifetime"
	}
	o.registry().Counter("sbx_reaper_actions_total", "Sandboxes the reaper deleted, by why.", "action", "reason").Inc("delete", why)
}
