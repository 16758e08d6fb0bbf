package sandbox

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"sbx.dev/sbx/api"
	"sbx.dev/sbx/internal/store"
)

// The idle reaper. ttl is an IDLE ttl: a sandbox is reaped once it has done
// nothing that counts as activity for longer than its ttl. What counts:
// an exec, for as long as it runs; bytes through the file API; an open PTY
// or preview connection, for as long as it is open (a lease); a fork, a
// snapshot, a stop or a resume. What does not: status, info, list, logs,
// events, metrics, ports, fs stat and fs ls. A daemon-wide max lifetime
// (wall clock from creation) caps every sandbox; persistent sandboxes are
// exempt from the idle reaper, and refused where a lifetime cap is set.

// reapInterval is how often the reaper looks.
const reapInterval = 5 * time.Second

// verdict is the reaper's view of one sandbox.
type verdict struct {
	reap   bool
	at     time.Time // when it will be reaped if nothing happens (zero: never)
	reason string
}

// judge decides whether a sandbox is to be reaped at now. busy says whether
// it has a running exec or an open lease: it is active right now.
func judge(sb *store.Sandbox, now time.Time, busy bool, maxLifetime time.Duration) verdict {
	var v verdict
	if maxLifetime > 0 {
		end := sb.CreatedAt.Add(maxLifetime)
		v = verdict{at: end, reason: fmt.Sprintf("its lifetime cap of %s ends", maxLifetime)}
		if !now.Before(end) {
			return verdict{reap: true, at: end, reason: fmt.Sprintf("lifetime cap: created %s ago, the cap is %s", now.Sub(sb.CreatedAt).Round(time.Second), maxLifetime)}
		}
	}
	switch {
	case sb.Persistent:
		if v.at.IsZero() {
			v.reason = "persistent: exempt from the idle reaper"
		}
		return v
	case sb.TTL <= 0:
		if v.at.IsZero() {
			v.reason = "no ttl"
		}
		return v
	case busy:
		if v.at.IsZero() {
			v.reason = "active now (an exec runs or a terminal or preview connection is open)"
		}
		return v
	}
	idleEnd := sb.LastActivity.Add(sb.TTL)
	if !now.Before(idleEnd) {
		return verdict{reap: true, at: idleEnd, reason: fmt.Sprintf("idle for %s, longer than its ttl of %s", now.Sub(sb.LastActivity).Round(time.Second), sb.TTL)}
	}
	if v.at.IsZero() || idleEnd.Before(v.at) {
		v = verdict{at: idleEnd, reason: fmt.Sprintf("idle ttl of %s after the last activity", sb.TTL)}
	}
	return v
}

// reaper owns the idle reaper: its verdicts, its loop, the leases that keep
// a sandbox active while they are open, and the count of what it reaped.
// It sees the rest of the manager only through reapHost.
type reaper struct {
	host             reapHost
	log              *slog.Logger
	maxLifetime      time.Duration
	stoppedRetention time.Duration
	after            func(time.Duration) <-chan time.Time

	leases leaseTable // its own lock (leases.go)
	reaped atomic.Int64
}

// reapHost is what the reaper needs of the rest of the manager.
type reapHost interface {
	Sandboxes(ctx context.Context) ([]*store.Sandbox, error)
	Sandbox(ctx context.Context, ref string) (*store.Sandbox, error)
	// execRunning: sandbox id has an exec running now
	execRunning(id string) bool
	// tryClaim claims id whole if no other operation does (claims.go)
	tryClaim(id, op string) (release func(), ok bool)
	// reapDelete deletes a sandbox the caller claims, with the reaper's event
	reapDelete(ctx context.Context, id string, reaped *store.Event) error
	touch(ctx context.Context, id string)
	observeReaped(reason string)
	now() time.Time
}

// busy reports whether a sandbox has a running exec or an open lease.
func (r *reaper) busy(id string) bool {
	return r.host.execRunning(id) || r.leases.held(id)
}

// lease marks a sandbox active until release is called: an open PTY or a
// preview connection counts as activity for as long as it is open.
func (r *reaper) lease(ctx context.Context, ref string) (func(), error) {
	sb, err := r.host.Sandbox(ctx, ref)
	if err != nil {
		return nil, err
	}
	release := r.leases.take(sb.ID)
	r.host.touch(ctx, sb.ID)
	var once sync.Once
	return func() {
		once.Do(func() {
			release()
			r.host.touch(context.Background(), sb.ID)
		})
	}, nil
}

// loop runs the reaper until ctx ends.
func (r *reaper) loop(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-r.after(reapInterval):
		}
		r.once(ctx)
	}
}

// once deletes every sandbox the reaper judges due, with an event saying
// why. Its snapshots stay. Each sandbox is judged again under its claim
// (a sandbox another operation claims is being changed, which is
// activity), so nothing that starts meanwhile is cut short.
func (r *reaper) once(ctx context.Context) {
	sbs, err := r.host.Sandboxes(ctx)
	if err != nil {
		r.log.Error("reaper: list sandboxes", "err", err)
		return
	}
	for _, sb := range sbs {
		if v := r.judgeSandbox(sb); !v.reap {
			continue
		}
		release, ok := r.host.tryClaim(sb.ID, "reap")
		if !ok {
			continue
		}
		r.reapClaimed(ctx, sb.ID)
		release()
	}
}

// judgeSandbox is the reaper's verdict on sb now.
func (r *reaper) judgeSandbox(sb *store.Sandbox) verdict {
	switch sb.State {
	case api.StateReady:
		return judge(sb, r.host.now(), r.busy(sb.ID), r.maxLifetime)
	case api.StateStopped:
		return judgeStopped(sb, r.host.now(), r.maxLifetime, r.stoppedRetention)
	}
	return verdict{}
}

// reapClaimed judges sandbox id again under its claim and deletes it if due.
func (r *reaper) reapClaimed(ctx context.Context, id string) {
	sb, err := r.host.Sandbox(ctx, id)
	if err != nil {
		return
	}
	v := r.judgeSandbox(sb)
	if !v.reap {
		return
	}
	r.log.Info("reaping a sandbox", "sandbox", sb.ID, "reason", v.reason)
	reaped := &store.Event{Type: "reaped", Detail: map[string]any{"reason": v.reason, "state": string(sb.State)}}
	if err := r.host.reapDelete(ctx, sb.ID, reaped); err != nil {
		r.log.Error("reaper: delete", "sandbox", sb.ID, "err", err)
		return
	}
	r.reaped.Add(1)
	r.host.observeReaped(v.reason)
}

// reapHost, as the manager gives it.
type managerReapHost struct {
	*store.Store
	m *Manager
}

func (h managerReapHost) execRunning(id string) bool { return h.m.execs.table.running(id) }
func (h managerReapHost) tryClaim(id, op string) (func(), bool) {
	return h.m.claims.tryClaim(id, op)
}
func (h managerReapHost) reapDelete(ctx context.Context, id string, reaped *store.Event) error {
	_, err := h.m.deleteLocked(ctx, id, DeleteOptions{}, reaped)
	return err
}
func (h managerReapHost) touch(ctx context.Context, id string) { h.m.touch(ctx, id) }
func (h managerReapHost) observeReaped(reason string)          { h.m.metrics.observeReaped(reason) }
func (h managerReapHost) now() time.Time                       { return h.m.now() }

// The facade.

// Lease: see reaper.lease.
func (m *Manager) Lease(ctx context.Context, ref string) (func(), error) {
	return m.reaper.lease(ctx, ref)
}

// judgeSandbox is the reaper's verdict on sb now.
func (m *Manager) judgeSandbox(sb *store.Sandbox) verdict { return m.reaper.judgeSandbox(sb) }

// judgeStopped decides whether a stopped sandbox is to be deleted at now:
// never by the idle reaper (a stopped sandbox is what a user chose to
// keep), only by the lifetime cap or the daemon's retention for stopped
// sandboxes (counted from the stop, its last activity).
func judgeStopped(sb *store.Sandbox, now time.Time, maxLifetime, retention time.Duration) verdict {
	var v verdict
	if maxLifetime > 0 {
		end := sb.CreatedAt.Add(maxLifetime)
		if !now.Before(end) {
			return verdict{reap: true, at: end, reason: fmt.Sprintf("lifetime cap: created %s ago, the cap is %s", now.Sub(sb.CreatedAt).Round(time.Second), maxLifetime)}
		}
		v = verdict{at: end, reason: fmt.Sprintf("its lifetime cap of %s ends", maxLifetime)}
	}
	if retention > 0 {
		end := sb.LastActivity.Add(retention)
		if !now.Before(end) {
			return verdict{reap: true, at: end, reason: fmt.Sprintf("stopped retention: stopped for %s, sbxd keeps stopped sandboxes for %s", now.Sub(sb.LastActivity).Round(time.Second), retention)}
		}
		if v.at.IsZero() || end.Before(v.at) {
			v = verdict{at: end, reason: fmt.Sprintf("sbxd keeps stopped sandboxes for %s", retention)}
		}
	}
	if v.at.IsZero() {
		v.reason = "stopped: the idle reaper keeps stopped sandboxes"
	}
	return v
}

// SetTTL changes a sandbox's idle ttl (0 turns it off; the server has
// checked it, api.TTLRequest.Validate).
func (m *Manager) SetTTL(ctx context.Context, ref string, d time.Duration) (*api.Sandbox, error) {
	sb, err := m.cfg.Store.Sandbox(ctx, ref)
	if err != nil {
		return nil, err
	}
	if err := m.cfg.Store.SetTTL(ctx, sb.ID, d); err != nil {
		return nil, err
	}
	m.event(ctx, sb.ID, "ttl", map[string]any{"ttl": d.String()})
	return m.Get(ctx, sb.ID)
}

// SetPersistent exempts a sandbox from the idle reaper, or not. Where a
// lifetime cap is set it is refused (api.ErrForbidden): persistence would
// promise what the cap takes away.
func (m *Manager) SetPersistent(ctx context.Context, ref string, persistent bool) (*api.Sandbox, error) {
	sb, err := m.cfg.Store.Sandbox(ctx, ref)
	if err != nil {
		return nil, err
	}
	if persistent && m.cfg.MaxLifetime > 0 {
		return nil, api.Errorf(api.ErrForbidden, "sbxd caps every sandbox's lifetime at %s (max_lifetime), so no sandbox can be persistent", m.cfg.MaxLifetime)
	}
	if err := m.cfg.Store.SetPersistent(ctx, sb.ID, persistent); err != nil {
		return nil, err
	}
	m.event(ctx, sb.ID, "persist", map[string]any{"persistent": persistent})
	return m.Get(ctx, sb.ID)
}
