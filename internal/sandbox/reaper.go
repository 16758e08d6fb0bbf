package sandbox

import (
	"context"
	"fmt"
	"sync"
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

// busy reports whether a sandbox has a running exec or an open lease.
func (m *Manager) busy(id string) bool {
	return m.execs.running(id) || m.leases.held(id)
}

// Lease marks a sandbox active until release is called: an open PTY or a
// preview connection counts as activity for as long as it is open.
func (m *Manager) Lease(ctx context.Context, ref string) (func(), error) {
	sb, err := m.cfg.Store.Sandbox(ctx, ref)
	if err != nil {
		return nil, err
	}
	release := m.leases.take(sb.ID)
	m.touch(ctx, sb.ID)
	var once sync.Once
	return func() {
		once.Do(func() {
			release()
			m.touch(context.Background(), sb.ID)
		})
	}, nil
}

// reapLoop runs the reaper until ctx ends.
func (m *Manager) reapLoop(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-m.cfg.After(reapInterval):
		}
		m.reapOnce(ctx)
	}
}

// reapOnce deletes every sandbox the reaper judges due, with an event
// saying why. Its snapshots stay. Each sandbox is judged under its lock
// (a sandbox whose lock is held is being changed, which is activity), so
// nothing that starts meanwhile is cut short.
func (m *Manager) reapOnce(ctx context.Context) {
	sbs, err := m.cfg.Store.Sandboxes(ctx)
	if err != nil {
		m.log.Error("reaper: list sandboxes", "err", err)
		return
	}
	for _, sb := range sbs {
		if v := m.judgeSandbox(sb); !v.reap {
			continue
		}
		unlock, ok := m.locks.tryLock(sb.ID)
		if !ok {
			continue
		}
		m.reapLocked(ctx, sb.ID)
		unlock()
	}
}

// judgeSandbox is the reaper's verdict on sb now.
func (m *Manager) judgeSandbox(sb *store.Sandbox) verdict {
	switch sb.State {
	case api.StateReady:
		return judge(sb, m.now(), m.busy(sb.ID), m.cfg.MaxLifetime)
	case api.StateStopped:
		return judgeStopped(sb, m.now(), m.cfg.MaxLifetime, m.cfg.StoppedRetention)
	}
	return verdict{}
}

// reapLocked judges sandbox id again under its lock and deletes it if due.
func (m *Manager) reapLocked(ctx context.Context, id string) {
	sb, err := m.cfg.Store.Sandbox(ctx, id)
	if err != nil {
		return
	}
	v := m.judgeSandbox(sb)
	if !v.reap {
		return
	}
	m.log.Info("reaping a sandbox", "sandbox", sb.ID, "reason", v.reason)
	reaped := &store.Event{Type: "reaped", Detail: map[string]any{"reason": v.reason, "state": string(sb.State)}}
	if _, err := m.deleteLocked(ctx, sb.ID, DeleteOptions{}, reaped); err != nil {
		m.log.Error("reaper: delete", "sandbox", sb.ID, "err", err)
		return
	}
	m.countReaped(v.reason)
}

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

// countReaped counts a sandbox the reaper deleted (see observeReaped).
func (m *Manager) countReaped(reason string) {
	m.reaped.Add(1)
	m.observeReaped(reason)
}

// SetTTL changes a sandbox's idle ttl ("0" or "" turns it off).
func (m *Manager) SetTTL(ctx context.Context, ref, ttl string) (*api.Sandbox, error) {
	d, err := api.ParseDuration("ttl", ttl)
	if err != nil {
		return nil, err
	}
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
