package sandbox

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"sbx.dev/sbx/api"
	"sbx.dev/sbx/internal/store"
)

// A warm pool (`sbxd --warm TEMPLATE=N`) keeps N sandboxes of a template
// booted and unclaimed, so that a create of that template is a record's
// update instead of a boot. A pool may have limits of its own (`--warm
// base=2,memory=1G`): its sandboxes boot with them, and serve the creates
// that ask for those limits. A pooled sandbox is an ordinary one, marked by
// the meta key api.MetaPool (its pool's key: the template's name, and its
// limits after a colon): List and Get do not show it, and the reaper
// leaves it (it has no ttl). It never ran anything of a user's, so a
// sandbox taken from the pool is a fresh boot's: its own random state,
// hostname (its id), clock, no process but init and no file but the
// template's.
//
// A create takes one only when it asks nothing a boot fixes but the limits:
// no snapshot, no monitoring, no shaping, the default network; and its
// limits, resolved as a boot resolves them, are a pool's. Then the
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
	want map[string]WarmPool // by key: what to keep ready

	mu       sync.Mutex
	filling  map[string]int  // pool key: boots under way
	skipped  map[string]bool // pool key: a fill found its boot under way
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
	// claim waits for sandbox id's claim until ctx ends
	claim(ctx context.Context, id, op string) (release func(), err error)
	templateVersion(name string) (string, error)
	// poolKey names the pool that would serve a create of template
	// with req's limits
	poolKey(template string, req api.CreateRequest) (string, error)
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
func (h managerPoolHost) claim(ctx context.Context, id, op string) (func(), error) {
	return h.m.claims.claim(ctx, id, op)
}
func (h managerPoolHost) templateVersion(name string) (string, error) {
	t, err := h.m.cfg.Templates.Resolve(name)
	return t.Version, err
}
func (h managerPoolHost) poolKey(template string, req api.CreateRequest) (string, error) {
	return h.m.poolKey(template, req)
}
func (h managerPoolHost) toAPI(sb *store.Sandbox) *api.Sandbox { return h.m.toAPI(sb) }
func (h managerPoolHost) now() time.Time                       { return h.m.now() }

// takeClaimWait is how long a take waits for a pooled sandbox's claim.
const takeClaimWait = 250 * time.Millisecond

// MaxWarm bounds one pool: each sandbox holds its memory.
const MaxWarm = 64

// WarmPool is one warm pool (`sbxd --warm
// TEMPLATE=N[,cpus=C][,memory=M][,pids=P][,disk=D]`): the template its
// sandboxes boot from, the limits they boot with (zero: sbxd's defaults, as
// for a create), and how many it keeps booted and unclaimed.
type WarmPool struct {
	Template string
	N        int
	CPUs     float64
	Memory   string // a size as a create asks it ("1G"); "": the default
	Pids     int
	Disk     string
}

// request is the create a boot of the pool asks (without its mark).
func (w WarmPool) request() api.CreateRequest {
	return api.CreateRequest{Template: w.Template, CPUs: w.CPUs, Memory: w.Memory, Pids: w.Pids, Disk: w.Disk}
}

// setWarm sets the pools the manager keeps, each under its key; two that
// resolve to the same limits are one pool, the later's size. An error
// names the pool whose limits a boot would refuse.
func (m *Manager) setWarm(pools []WarmPool) error {
	want := map[string]WarmPool{}
	for _, w := range pools {
		if w.N < 0 || w.N > MaxWarm {
			return fmt.Errorf("warm pool of %s: %d sandboxes, want 0 to %d", w.Template, w.N, MaxWarm)
		}
		key, err := m.poolKey(w.Template, w.request())
		if err != nil {
			return fmt.Errorf("warm pool of %s: %w", w.Template, err)
		}
		want[key] = w
	}
	m.pool.want = want
	return nil
}

// poolKey names the pool that serves a create of template with req's
// limits: the template's name, then after a colon the limits that are not
// sbxd's defaults, resolved as a boot resolves them (so that a create
// asking memory=2G, the default, takes from the template's plain pool).
// An error is the one the boot would give.
func (m *Manager) poolKey(template string, req api.CreateRequest) (string, error) {
	mem, err := ParseSize("memory", req.Memory)
	if err != nil {
		return "", err
	}
	disk, err := ParseSize("disk", req.Disk)
	if err != nil {
		return "", err
	}
	if err := checkCPUs(req.CPUs, runtime.NumCPU()); err != nil {
		return "", err
	}
	host := hostMemory()
	mem, pids, disk, err := m.cfg.Limits.resolve(mem, req.Pids, disk, host)
	if err != nil {
		return "", err
	}
	dmem, dpids, ddisk, err := m.cfg.Limits.resolve(0, 0, 0, host)
	if err != nil {
		return "", err
	}
	var limits []string
	if req.CPUs != 0 {
		limits = append(limits, "cpus="+strconv.FormatFloat(req.CPUs, 'g', -1, 64))
	}
	if mem != dmem {
		limits = append(limits, "memory="+sizeKey(mem))
	}
	if pids != dpids {
		limits = append(limits, "pids="+strconv.Itoa(pids))
	}
	if disk != ddisk {
		limits = append(limits, "disk="+sizeKey(disk))
	}
	if len(limits) == 0 {
		return template, nil
	}
	return template + ":" + strings.Join(limits, ","), nil
}

// sizeKey writes a size exactly and short: 1GiB, 512MiB, 1234567.
func sizeKey(n int64) string {
	switch {
	case n != 0 && n%(1<<30) == 0:
		return strconv.FormatInt(n>>30, 10) + "GiB"
	case n != 0 && n%(1<<20) == 0:
		return strconv.FormatInt(n>>20, 10) + "MiB"
	}
	return strconv.FormatInt(n, 10)
}

// poolTemplate is the template of the pool named key.
func poolTemplate(key string) string {
	t, _, _ := strings.Cut(key, ":")
	return t
}

// pooled reports whether sb is a warm pool's, unclaimed.
func pooled(sb *store.Sandbox) bool { return sb.Meta[api.MetaPool] != "" }

// poolable reports whether a create of req can be served from a pool: it
// asks nothing that a boot fixes but its limits (which name the pool).
func poolable(req api.CreateRequest) bool {
	return req.From == "" && !req.Monitor && req.Shape == nil && req.Network == ""
}

// take serves a create of template from the pool of its limits: the
// sandbox taken, or nil when that pool has none ready (the caller boots
// one).
func (p *poolOwner) take(ctx context.Context, template string, req api.CreateRequest) (*api.Sandbox, error) {
	if len(p.want) == 0 || !poolable(req) {
		return nil, nil
	}
	key, err := p.host.poolKey(template, req)
	if err != nil || p.want[key].N == 0 {
		return nil, nil // no such pool; or the boot says why
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
		if sb.Meta[api.MetaPool] != key || sb.State != api.StateReady {
			continue
		}
		if sb.TemplateVersion != version {
			continue // stale: the fill removes it
		}
		// its claim may be held a moment still: by the pool's own boot,
		// which records it ready before it returns (CI's
		// TestWarmPoolLimits took that for a busy one, and booted), or by
		// another take, after which it is no longer the pool's
		cctx, cancel := context.WithTimeout(ctx, takeClaimWait)
		release, err := p.host.claim(cctx, sb.ID, "create")
		cancel()
		if err != nil {
			continue // being taken or removed: the next
		}
		now := p.host.now()
		meta := maps.Clone(req.Meta)
		err = p.host.Update(ctx, func(tx *store.Store) error {
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
		p.log.Info("create served from the warm pool", "sandbox", sb.ID, "pool", key)
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
		key := sb.Meta[api.MetaPool]
		if key == "" {
			continue
		}
		version, verr := p.host.templateVersion(poolTemplate(key))
		switch {
		case sb.State != api.StateReady && sb.State != api.StateCreating, p.want[key].N == 0, verr == nil && sb.TemplateVersion != version:
			go p.remove(context.WithoutCancel(ctx), sb.ID) // ended, not wanted, or stale
		default:
			have[key] = append(have[key], sb)
		}
	}
	names := make([]string, 0, len(p.want))
	for key := range p.want {
		names = append(names, key)
	}
	sort.Strings(names)
	for _, t := range names {
		if busy[t] > 0 {
			// its boot tops it up, and has the loop look again when it
			// ends: a take meanwhile is not made up for by that boot
			p.mu.Lock()
			p.skipped[t] = true
			p.mu.Unlock()
			continue
		}
		n, want := len(have[t]), p.want[t].N
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

// boot boots n sandboxes of the pool named key, one after another (a pool
// must not take the machine from the creates it serves). Once they are
// all up, it has the loop look again if a fill skipped the pool meanwhile:
// a take that came while they booted found the pool busy and started none
// (a boot records its sandbox ready before it returns), and would
// otherwise wait for the next poolEvery. A boot that failed waits for
// that look, and so does a pool nobody took from (a template whose
// sandboxes die at once is not booted again and again).
func (p *poolOwner) boot(ctx context.Context, key string, n int) {
	ok := false
	defer func() {
		p.mu.Lock()
		p.filling[key] -= n
		again := ok && p.skipped[key] && p.filling[key] == 0
		if p.filling[key] == 0 {
			delete(p.skipped, key)
		}
		p.mu.Unlock()
		if again {
			p.kick()
		}
	}()
	req := p.want[key].request()
	req.Meta = map[string]string{api.MetaPool: key}
	for range n {
		if _, err := p.host.create(ctx, req); err != nil {
			p.log.Warn("warm pool: boot", "pool", key, "err", err)
			return // tried again at the next look
		}
	}
	ok = true
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

// Pools reports each warm pool by its key (the template, and its limits
// after a colon): how many it keeps and how many are ready now.
func (m *Manager) Pools(ctx context.Context) (map[string][2]int, error) {
	sbs, err := m.cfg.Store.Sandboxes(ctx)
	if err != nil {
		return nil, err
	}
	out := map[string][2]int{}
	for key, w := range m.pool.want {
		out[key] = [2]int{w.N, 0}
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
