package sandbox

import (
	"context"
	"errors"
	"log/slog"
	"maps"
	"sort"
	"sync"
	"time"

	"sbx.dev/sbx/api"
	"sbx.dev/sbx/internal/store"
)

// A warm pool (`sbxd --warm TEMPLATE=N`) keeps N sandboxes of a template
// booted and unclaimed, so that a create of that template is a record's
// update instead of a boot. A pooled sandbox is an ordinary one, booted
// with the daemon's default limits and marked by the meta key api.MetaPool
// (the template's name): List and Get do not show it, and the reaper
// leaves it (it has no ttl). It never ran anything of a user's, so a
// sandbox taken from the pool is a fresh boot's: its own random state,
// hostname (its id), clock, no process but init and no file but the
// template's.
//
// A create takes one only when it asks nothing a boot fixes: no snapshot,
// no monitoring, no shaping, the default network and limits. Then the
// record gets its name, ttl and meta, and now as its creation, in one
// transaction with its "created" event (pooled: true), under the sandbox's
// claim; and the pool is refilled in the background. A version of the
// template older than its name's is not taken, and goes.

// poolOwner owns the warm pools: what each template should have, the boots
// under way, and the loop that keeps them full. It sees the rest of the
// manager only through poolHost.
type poolOwner struct {
	host poolHost
	log  *slog.Logger
	want map[string]int // template name: how many to keep ready

	mu       sync.Mutex
	filling  map[string]int  // template name: boots under way
	removing map[string]bool // pooled sandboxes being removed
	wake     chan struct{}   // a take happened: fill now
}

// poolHost is what the pools need of the rest of the manager.
type poolHost interface {
	Sandboxes(ctx context.Context) ([]*store.Sandbox, error)
	Update(ctx context.Context, f func(tx *store.Store) error) error
	// create boots a sandbox as a create does; delete removes one that is
	// still the pool's (judged under its claim)
	create(ctx context.Context, req api.CreateRequest) (*api.Sandbox, error)
	delete(ctx context.Context, id string) error
	tryClaim(id, op string) (release func(), ok bool)
	templateVersion(name string) (string, error)
	toAPI(sb *store.Sandbox) *api.Sandbox
	now() time.Time
}

// managerPoolHost is poolHost, as the manager gives it.
type managerPoolHost struct {
	*store.Store
	m *Manager
}

func (h managerPoolHost) create(ctx context.Context, req api.CreateRequest) (*api.Sandbox, error) {
	return h.m.create(ctx, req)
}
func (h managerPoolHost) delete(ctx context.Context, id string) error {
	return h.m.deletePooled(ctx, id)
}
func (h managerPoolHost) tryClaim(id, op string) (func(), bool) { return h.m.claims.tryClaim(id, op) }
func (h managerPoolHost) templateVersion(name string) (string, error) {
	t, err := h.m.cfg.Templates.Resolve(name)
	return t.Version, err
}
func (h managerPoolHost) toAPI(sb *store.Sandbox) *api.Sandbox { return h.m.toAPI(sb) }
func (h managerPoolHost) now() time.Time                       { return h.m.now() }

// MaxWarm bounds one template's pool: each holds a sandbox's memory.
const MaxWarm = 64

// pooled reports whether sb is a warm pool's, unclaimed.
func pooled(sb *store.Sandbox) bool { return sb.Meta[api.MetaPool] != "" }

// poolable reports whether a create of req can be served from a pool: it
// asks nothing that a boot fixes.
func poolable(req api.CreateRequest) bool {
	return req.From == "" && !req.Monitor && req.Shape == nil && req.Network == "" &&
		req.CPUs == 0 && req.Memory == "" && req.Pids == 0 && req.Disk == ""
}

// take serves a create of template from its pool: the sandbox taken, or
// nil when the pool has none ready (the caller boots one).
func (p *poolOwner) take(ctx context.Context, template string, req api.CreateRequest) (*api.Sandbox, error) {
	if p.want[template] == 0 || !poolable(req) {
		return nil, nil
	}
	defer p.kick()
	version, err := p.host.templateVersion(template)
	if err != nil {
		return nil, nil // the boot says why
	}
	sbs, err := p.host.Sandboxes(ctx)
	if err != nil {
		return nil, err
	}
	for _, sb := range sbs {
		if sb.Meta[api.MetaPool] != template || sb.State != api.StateReady {
			continue
		}
		if sb.TemplateVersion != version {
			continue // stale: the fill removes it
		}
		release, ok := p.host.tryClaim(sb.ID, "create")
		if !ok {
			continue // being taken by another create, or removed
		}
		now := p.host.now()
		meta := maps.Clone(req.Meta)
		err := p.host.Update(ctx, func(tx *store.Store) error {
			if err := tx.TakePooled(ctx, sb.ID, req.Name, req.TTL.D(), meta, now); err != nil {
				return err
			}
			return tx.AddEvent(ctx, sb.ID, "created", map[string]any{"template": template, "pooled": true, "memoryRestored": false})
		})
		release()
		if err != nil {
			if errors.Is(err, store.ErrNotPooled) {
				continue // taken, gone or ended meanwhile: the next
			}
			return nil, err // a taken name: as a boot would say
		}
		sb.Name, sb.TTL, sb.Meta, sb.CreatedAt, sb.LastActivity = req.Name, req.TTL.D(), meta, now, now
		p.log.Info("create served from the warm pool", "sandbox", sb.ID, "template", template)
		return p.host.toAPI(sb), nil
	}
	return nil, nil
}

// kick has the fill loop look now.
func (p *poolOwner) kick() {
	select {
	case p.wake <- struct{}{}:
	default:
	}
}

// loop keeps the pools full until ctx ends: at a take, and every
// poolEvery (a pooled sandbox reaped at its lifetime cap, or ended).
func (p *poolOwner) loop(ctx context.Context) {
	if len(p.want) == 0 {
		p.fill(ctx) // a pool of an earlier start, not wanted now, goes
		return
	}
	t := time.NewTicker(poolEvery)
	defer t.Stop()
	for {
		p.fill(ctx)
		select {
		case <-ctx.Done():
			return
		case <-p.wake:
		case <-t.C:
		}
	}
}

const poolEvery = 10 * time.Second

// fill starts the boots each pool lacks, and removes the pooled sandboxes
// of a template's older version, of a template no longer pooled, that
// ended, or that are more than the pool keeps. A pool with a boot under
// way is left until it ends: the boots under way are read before the list,
// so a boot that ended meanwhile is in the list, and none starts but here.
func (p *poolOwner) fill(ctx context.Context) {
	p.mu.Lock()
	busy := maps.Clone(p.filling)
	p.mu.Unlock()
	sbs, err := p.host.Sandboxes(ctx)
	if err != nil {
		p.log.Warn("warm pool: list sandboxes", "err", err)
		return
	}
	have := map[string][]*store.Sandbox{}
	for _, sb := range sbs {
		t := sb.Meta[api.MetaPool]
		if t == "" {
			continue
		}
		version, verr := p.host.templateVersion(t)
		switch {
		case sb.State != api.StateReady && sb.State != api.StateCreating, p.want[t] == 0, verr == nil && sb.TemplateVersion != version:
			go p.remove(context.WithoutCancel(ctx), sb.ID) // ended, not wanted, or stale
		default:
			have[t] = append(have[t], sb)
		}
	}
	names := make([]string, 0, len(p.want))
	for t := range p.want {
		names = append(names, t)
	}
	sort.Strings(names)
	for _, t := range names {
		if busy[t] > 0 {
			continue // its boot tops it up; the next look sees what it made
		}
		n, want := len(have[t]), p.want[t]
		if n > want {
			for _, sb := range have[t][want:] { // the newest: Sandboxes is oldest first
				go p.remove(context.WithoutCancel(ctx), sb.ID)
			}
			continue
		}
		p.mu.Lock()
		start := p.filling[t] == 0 && n < want // not started since by a fill beside this one
		if start {
			p.filling[t] = want - n
		}
		p.mu.Unlock()
		if start {
			go p.boot(context.WithoutCancel(ctx), t, want-n)
		}
	}
}

// boot boots n pooled sandboxes of template, one after another (a pool
// must not take the machine from the creates it serves).
func (p *poolOwner) boot(ctx context.Context, template string, n int) {
	defer func() {
		p.mu.Lock()
		p.filling[template] -= n
		p.mu.Unlock()
	}()
	for range n {
		_, err := p.host.create(ctx, api.CreateRequest{Template: template, Meta: map[string]string{api.MetaPool: template}})
		if err != nil {
			p.log.Warn("warm pool: boot", "template", template, "err", err)
			return // tried again at the next look
		}
	}
}

// remove deletes a pooled sandbox the pool does not want, once.
func (p *poolOwner) remove(ctx context.Context, id string) {
	p.mu.Lock()
	if p.removing[id] {
		p.mu.Unlock()
		return
	}
	p.removing[id] = true
	p.mu.Unlock()
	defer func() {
		p.mu.Lock()
		delete(p.removing, id)
		p.mu.Unlock()
	}()
	if err := p.host.delete(ctx, id); err != nil && !errors.Is(err, api.ErrNotFound) {
		p.log.Warn("warm pool: remove", "sandbox", id, "err", err)
	}
}

// Pools reports each warm pool: the template, how many it keeps and how
// many are ready now.
func (m *Manager) Pools(ctx context.Context) (map[string][2]int, error) {
	sbs, err := m.cfg.Store.Sandboxes(ctx)
	if err != nil {
		return nil, err
	}
	out := map[string][2]int{}
	for t, n := range m.pool.want {
		out[t] = [2]int{n, 0}
	}
	for _, sb := range sbs {
		if t := sb.Meta[api.MetaPool]; t != "" && sb.State == api.StateReady {
			c := out[t]
			c[1]++
			out[t] = c
		}
	}
	return out, nil
}

// deletePooled deletes sandbox id if it is still a warm pool's, judged
// under its claim: a create may have taken it since the pool looked.
func (m *Manager) deletePooled(ctx context.Context, id string) error {
	unlock, err := m.claim(ctx, id, kindDelete)
	if err != nil {
		return err
	}
	defer unlock()
	sb, err := m.cfg.Store.Sandbox(ctx, id)
	if err != nil {
		return err
	}
	if !pooled(sb) {
		return nil // taken: a user's now
	}
	_, err = m.deleteLocked(context.WithoutCancel(ctx), id, DeleteOptions{}, nil)
	return err
}
