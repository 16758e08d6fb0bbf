package sandbox

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"sbx.dev/sbx/api"
	"sbx.dev/sbx/internal/store"
)

// Attacks on the warm pools (issue 25): pool.go's take, fill, boot and
// remove, and what the rest of the manager does with a pooled sandbox.

// hookHost is the manager's poolHost with some of its methods replaced: a
// test stands a step of the pool still where the scheduler could.
type hookHost struct {
	poolHost
	sandboxes func(ctx context.Context) ([]*store.Sandbox, error)
	version   func(name string) (string, error)
	boot      func(ctx context.Context, req api.CreateRequest) (*api.Sandbox, error)
	remove    func(ctx context.Context, id string) error
}

func (h *hookHost) Sandboxes(ctx context.Context) ([]*store.Sandbox, error) {
	if h.sandboxes != nil {
		return h.sandboxes(ctx)
	}
	return h.poolHost.Sandboxes(ctx)
}
func (h *hookHost) templateVersion(name string) (string, error) {
	if h.version != nil {
		return h.version(name)
	}
	return h.poolHost.templateVersion(name)
}
func (h *hookHost) create(ctx context.Context, req api.CreateRequest) (*api.Sandbox, error) {
	if h.boot != nil {
		return h.boot(ctx, req)
	}
	return h.poolHost.create(ctx, req)
}
func (h *hookHost) delete(ctx context.Context, id string) error {
	if h.remove != nil {
		return h.remove(ctx, id)
	}
	return h.poolHost.delete(ctx, id)
}

// poolReady is the ids of the ready pooled sandboxes of template.
func poolReady(t *testing.T, m *Manager, template string) []string {
	t.Helper()
	sbs, err := m.cfg.Store.Sandboxes(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, sb := range sbs {
		if sb.Meta[api.MetaPool] == template && sb.State == api.StateReady {
			ids = append(ids, sb.ID)
		}
	}
	return ids
}

// fillPool fills the pool of template until it holds n ready.
func fillPool(t *testing.T, m *Manager, template string, n int) []string {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		m.pool.fill(context.Background())
		ids := poolReady(t, m, template)
		if len(ids) == n {
			return ids
		}
		if time.Now().After(deadline) {
			t.Fatalf("the pool of %s holds %d ready, want %d", template, len(ids), n)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// waitFilled waits until no boot of the pool is under way.
func waitFilled(t *testing.T, m *Manager) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		m.pool.mu.Lock()
		n := 0
		for _, c := range m.pool.filling {
			n += c
		}
		r := len(m.pool.removing)
		m.pool.mu.Unlock()
		if n == 0 && r == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the pool's boots or removes never end: filling %v, removing %d", m.pool.filling, r)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestAttack25DoubleTake: two creates that listed the pool at the same
// time both see pooled sandbox X. The first claims it, takes it, releases
// the claim; the second then claims it too, and store.TakePooled takes it
// again, because its WHERE asks only that the sandbox be ready, not that
// it still be the pool's. Two creates get one sandbox, and the first's
// name, ttl and meta are overwritten by the second's.
func TestAttack25DoubleTake(t *testing.T) {
	ctx := context.Background()
	m, _ := newTestManager(t, 0)
	warm(t, m, WarmPool{Template: "tiny", N: 1})
	fillPool(t, m, "tiny", 1)
	// the second create's list was read before the first create's take
	// committed: the same list for both
	stale, err := m.cfg.Store.Sandboxes(ctx)
	if err != nil {
		t.Fatal(err)
	}
	real := m.pool.host
	m.pool.host = &hookHost{poolHost: real, sandboxes: func(context.Context) ([]*store.Sandbox, error) {
		out := make([]*store.Sandbox, len(stale))
		for i, sb := range stale {
			c := *sb
			out[i] = &c
		}
		return out, nil
	}}
	a, err := m.Create(ctx, api.CreateRequest{Template: "tiny", Name: "first", Meta: map[string]string{"owner": "alice"}})
	if err != nil {
		t.Fatal(err)
	}
	b, err := m.Create(ctx, api.CreateRequest{Template: "tiny", Name: "second", Meta: map[string]string{"owner": "bob"}})
	if err != nil {
		t.Fatal(err)
	}
	if a.ID == b.ID {
		got, _ := m.Get(ctx, a.ID)
		t.Fatalf("two creates were given the same pooled sandbox %s (alice's %q and bob's %q); it is now named %q, meta %v: "+
			"TakePooled takes a sandbox that is ready though no longer the pool's", a.ID, a.Name, b.Name, got.Name, got.Meta)
	}
	if _, err := m.Get(ctx, "first"); err != nil {
		t.Errorf("the first create's sandbox is gone: %v", err)
	}
}

// TestAttack25ConcurrentCreates: many creates at once over a small pool.
// Each must get its own sandbox, under its own name, and none may fail.
func TestAttack25ConcurrentCreates(t *testing.T) {
	ctx := context.Background()
	m, _ := newTestManager(t, 0)
	const pool, creates = 4, 24
	for round := 0; round < 3; round++ {
		warm(t, m, WarmPool{Template: "tiny", N: pool})
		waitFilled(t, m)
		fillPool(t, m, "tiny", pool)
		var wg sync.WaitGroup
		start := make(chan struct{})
		ids := make([]string, creates)
		errs := make([]error, creates)
		for i := range creates {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				sb, err := m.Create(ctx, api.CreateRequest{Template: "tiny", Name: fmt.Sprintf("r%d-c%d", round, i)})
				if err == nil {
					ids[i] = sb.ID
				}
				errs[i] = err
			}()
		}
		close(start)
		wg.Wait()
		warm(t, m, WarmPool{Template: "tiny", N: 0}) // no refills under the next round's count
		by := map[string][]int{}
		for i := range creates {
			if errs[i] != nil {
				t.Fatalf("round %d: create %d failed: %v", round, i, errs[i])
			}
			by[ids[i]] = append(by[ids[i]], i)
		}
		for id, who := range by {
			if len(who) > 1 {
				t.Fatalf("round %d: creates %v were all given sandbox %s (a pooled sandbox taken more than once)", round, who, id)
			}
		}
		for i := range creates {
			got, err := m.Get(ctx, fmt.Sprintf("r%d-c%d", round, i))
			if err != nil || got.ID != ids[i] {
				t.Fatalf("round %d: create %d got %s, but its name now gives %+v, %v", round, i, ids[i], got, err)
			}
		}
		waitFilled(t, m)
	}
}

// TestAttack25RemoveDeletesTaken: the fill judges pooled sandbox X stale
// (the template was rebuilt) and starts its remove, while a create that
// resolved the template just before the rebuild takes X. The remove then
// deletes X by id (pool.go remove -> Manager.Delete) without looking
// whether it is still the pool's: the user's new sandbox is deleted under
// them.
func TestAttack25RemoveDeletesTaken(t *testing.T) {
	ctx := context.Background()
	m, _ := newTestManager(t, 0)
	warm(t, m, WarmPool{Template: "tiny", N: 1})
	ids := fillPool(t, m, "tiny", 1)
	x := ids[0]

	real := m.pool.host
	var calls atomic.Int32
	var version atomic.Value
	version.Store("sha256:tiny")
	inTake, resume := make(chan struct{}), make(chan struct{})
	delGate := make(chan struct{})
	removed := make(chan error, 4)
	m.pool.host = &hookHost{poolHost: real,
		version: func(name string) (string, error) {
			v := version.Load().(string)
			if calls.Add(1) == 1 { // the create's take: resolved, then a pause
				close(inTake)
				<-resume
			}
			return v, nil
		},
		boot: func(ctx context.Context, req api.CreateRequest) (*api.Sandbox, error) {
			<-delGate // the refill boots after: the take has only X to take
			return real.create(ctx, req)
		},
		remove: func(ctx context.Context, id string) error {
			<-delGate
			err := real.delete(ctx, id)
			removed <- err
			return err
		},
	}
	type res struct {
		sb  *api.Sandbox
		err error
	}
	done := make(chan res, 1)
	go func() {
		sb, err := m.Create(ctx, api.CreateRequest{Template: "tiny", Name: "mine"})
		done <- res{sb, err}
	}()
	<-inTake
	version.Store("sha256:tiny-rebuilt") // sbx template build tiny
	m.pool.fill(ctx)                     // X is stale: its remove starts
	close(resume)
	r := <-done
	if r.err != nil {
		t.Fatal(r.err)
	}
	if r.sb.ID != x {
		t.Skipf("the create booted (%s) rather than taking %s: the race was not run", r.sb.ID, x)
	}
	close(delGate)
	select {
	case <-removed:
	case <-time.After(5 * time.Second):
		t.Fatal("the remove never ran")
	}
	if got, err := m.Get(ctx, "mine"); err != nil {
		t.Fatalf("the sandbox a create was just given (%s, from the pool) was deleted by the pool's remove of a stale sandbox: Get mine: %v, %+v", x, err, got)
	}
	waitPoolIdle(t, m)
}

// waitPoolIdle waits until no boot of m's pools is under way (a refill
// the test let go), so that none writes in the data dir as it is removed.
func waitPoolIdle(t *testing.T, m *Manager) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		m.pool.mu.Lock()
		busy := 0
		for _, n := range m.pool.filling {
			busy += n
		}
		m.pool.mu.Unlock()
		if busy == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("a pool's boot still under way after 10 s")
		}
	}
}

// TestAttack25ExecIntoPooled: a pooled sandbox's id is shown by Storage
// (`sbx df`), and while Get says it does not exist, Exec by that id runs
// in it (Manager.running does not look at the pool's mark). What runs there
// then is in the sandbox the next create of the template is given, against
// pool.go's promise that a taken sandbox "never ran anything of a user's".
func TestAttack25ExecIntoPooled(t *testing.T) {
	ctx := context.Background()
	m, _ := newTestManager(t, 0)
	warm(t, m, WarmPool{Template: "tiny", N: 1})
	fillPool(t, m, "tiny", 1)
	st, err := m.Storage(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var id string
	for _, it := range st.Sandboxes {
		if strings.HasPrefix(it.Name, "(warm pool") {
			id = it.ID
		}
	}
	if id == "" {
		t.Skip("Storage names no pooled sandbox by id: not reachable this way")
	}
	if _, err := m.Get(ctx, id); !errors.Is(err, api.ErrNotFound) {
		t.Fatalf("Get of a pooled sandbox: %v, want not found", err)
	}
	var broke []string
	if e, err := m.Exec(ctx, id, api.ExecRequest{Cmd: []string{"sh", "-c", "echo planted > /tmp/x"}}); err == nil {
		broke = append(broke, "exec ran ("+e.ID+")")
	}
	if err := m.WriteFile(ctx, id, "/tmp/planted", strings.NewReader("x"), 1, ""); err == nil {
		broke = append(broke, "a file was written")
	}
	if len(broke) > 0 {
		sb, err := m.Create(ctx, api.CreateRequest{Template: "tiny", Name: "victim"})
		if err != nil {
			t.Fatal(err)
		}
		t.Fatalf("pooled sandbox %s, which Get says does not exist and whose id `sbx df` shows: %s; the next create (victim) was given %s",
			id, strings.Join(broke, ", "), sb.ID)
	}
}

// TestAttack25ForkOfPooled: a fork of a pooled sandbox by id goes through
// (Manager.running), and mergeMeta gives the children the parent's
// sbx.pool: the children are the pool's too, hidden from List and Get
// though the fork returned them, counted in the pool (it holds more than
// it wants, and fill never trims), and taken by later creates.
func TestAttack25ForkOfPooled(t *testing.T) {
	ctx := context.Background()
	m, _ := newTestManager(t, 0)
	warm(t, m, WarmPool{Template: "tiny", N: 1})
	ids := fillPool(t, m, "tiny", 1)
	kids, err := m.Fork(ctx, ids[0], api.ForkRequest{Count: 2}, func(api.ForkEvent) error { return nil })
	if err != nil {
		t.Logf("a fork of a pooled sandbox is refused (%v): held", err)
		return
	}
	var broke []string
	for _, k := range kids {
		if k.Meta[api.MetaPool] != "" {
			broke = append(broke, fmt.Sprintf("child %s carries %s=%s", k.ID, api.MetaPool, k.Meta[api.MetaPool]))
		}
		if _, err := m.Get(ctx, k.ID); err != nil {
			broke = append(broke, fmt.Sprintf("child %s, returned by the fork, is not found by Get (%v)", k.ID, err))
		}
	}
	m.pool.fill(ctx)
	waitFilled(t, m)
	if n := len(poolReady(t, m, "tiny")); n > 1 {
		broke = append(broke, fmt.Sprintf("the pool wants 1 and holds %d", n))
	}
	t.Fatalf("a fork by id of pooled sandbox %s was allowed: %s", ids[0], strings.Join(broke, "; "))
}

// TestAttack25PoolMetaThroughCreate: Manager.Create does not refuse the
// pool's own meta key (only api.CreateRequest.Validate does, at the HTTP
// edge; the fleet agent calls Manager.Create with a Sandbox object's
// spec.meta and no Validate). A create with sbx.pool set takes a pooled
// sandbox and leaves it pooled: the caller is given a sandbox that Get
// does not find, and that the next create takes again.
func TestAttack25PoolMetaThroughCreate(t *testing.T) {
	ctx := context.Background()
	m, _ := newTestManager(t, 0)
	warm(t, m, WarmPool{Template: "tiny", N: 1})
	fillPool(t, m, "tiny", 1)
	sb, err := m.Create(ctx, api.CreateRequest{Template: "tiny", Name: "sneaky", Meta: map[string]string{api.MetaPool: "tiny"}})
	if err != nil {
		if errors.Is(err, api.ErrInvalid) {
			return // held
		}
		t.Fatal(err)
	}
	var broke []string
	if _, err := m.Get(ctx, "sneaky"); err != nil {
		broke = append(broke, fmt.Sprintf("Get of what the create returned: %v", err))
	}
	other, err := m.Create(ctx, api.CreateRequest{Template: "tiny", Name: "next"})
	if err == nil && other.ID == sb.ID {
		broke = append(broke, "the next create was given the same sandbox "+sb.ID)
	}
	t.Fatalf("Manager.Create accepted meta %s=tiny (the fleet agent passes a Sandbox object's spec.meta straight to it): %s",
		api.MetaPool, strings.Join(broke, "; "))
}

// TestAttack25CPUsNaN: the fleet agent parses spec.cpus with
// strconv.ParseFloat, which reads "NaN"; checkCPUs's range test is false
// for NaN both ways, so the manager takes it to the store.
func TestAttack25CPUsNaN(t *testing.T) {
	ctx := context.Background()
	m, _ := newTestManager(t, 0)
	sb, err := m.Create(ctx, api.CreateRequest{Template: "tiny", CPUs: math.NaN()})
	if err != nil {
		if errors.Is(err, api.ErrInvalid) && strings.Contains(err.Error(), "cpus") {
			return // held
		}
		t.Fatalf("a create with cpus NaN: want api.ErrInvalid naming cpus, got %v (parse.go checkCPUs lets NaN through; only the store's NOT NULL stops it)", err)
	}
	_, lerr := m.List(ctx)
	t.Fatalf("a create with cpus NaN was accepted (sandbox %s, cpus %v); List after it: %v (parse.go checkCPUs lets NaN through)", sb.ID, sb.CPUs, lerr)
}

// TestAttack25OverFill: the fill reads the store, then the boots under way
// (filling). A boot that ends between the two has its sandbox in neither:
// the fill boots it again, and since fill never removes a pooled sandbox
// that is merely one too many, the pool holds more than it wants for good.
func TestAttack25OverFill(t *testing.T) {
	ctx := context.Background()
	m, _ := newTestManager(t, 0)
	real := m.pool.host
	gate := make(chan struct{})
	var boots atomic.Int32
	h := &hookHost{poolHost: real, boot: func(ctx context.Context, req api.CreateRequest) (*api.Sandbox, error) {
		if boots.Add(1) == 2 {
			<-gate // the second boot of the first fill is slow
		}
		return real.create(ctx, req)
	}}
	m.pool.host = h
	warm(t, m, WarmPool{Template: "tiny", N: 2})
	m.pool.fill(ctx) // boots 2, one after another
	deadline := time.Now().Add(5 * time.Second)
	for len(poolReady(t, m, "tiny")) < 1 {
		if time.Now().After(deadline) {
			t.Fatal("the first boot never ended")
		}
		time.Sleep(5 * time.Millisecond)
	}
	// a later fill lists (one ready, the second boot not in the store
	// yet); then the second boot ends, and its count with it
	h.sandboxes = func(ctx context.Context) ([]*store.Sandbox, error) {
		sbs, err := real.Sandboxes(ctx)
		h.sandboxes = nil
		close(gate)
		waitFilled(t, m)
		return sbs, err
	}
	m.pool.fill(ctx)
	waitFilled(t, m)
	for range 5 {
		m.pool.fill(ctx)
		waitFilled(t, m)
	}
	if n := len(poolReady(t, m, "tiny")); n != 2 {
		t.Fatalf("the pool wants 2 and holds %d ready after the fills settled (fill counts max(have, filling) from two reads, and never trims a surplus)", n)
	}
}

// countHandler counts the records logged at Warn or above.
type countHandler struct{ n *atomic.Int32 }

func (h countHandler) Enabled(_ context.Context, l slog.Level) bool { return l >= slog.LevelWarn }
func (h countHandler) Handle(context.Context, slog.Record) error    { h.n.Add(1); return nil }
func (h countHandler) WithAttrs([]slog.Attr) slog.Handler           { return h }
func (h countHandler) WithGroup(string) slog.Handler                { return h }

// goneTemplates is fakeTemplates with one template that does not exist.
type goneTemplates struct{ fakeTemplates }

func (g goneTemplates) Resolve(name string) (api.Template, error) {
	if name == "gone" {
		return api.Template{}, api.Errorf(api.ErrNotFound, "template gone not found")
	}
	return g.fakeTemplates.Resolve(name)
}

// TestAttack25MissingTemplate: a pool of a template that does not exist
// does not spin, floods no log (one warning a look at most), leaks no
// filling count, leaves no record, and a create of it says not found.
func TestAttack25MissingTemplate(t *testing.T) {
	ctx := context.Background()
	m, _ := newTestManager(t, 0)
	m.cfg.Templates = goneTemplates{m.cfg.Templates.(fakeTemplates)}
	var warns atomic.Int32
	m.pool.log = slog.New(countHandler{&warns})
	warm(t, m, WarmPool{Template: "gone", N: 3})
	const looks = 20
	for range looks {
		m.pool.fill(ctx)
	}
	waitFilled(t, m)
	if _, err := m.Create(ctx, api.CreateRequest{Template: "gone"}); !errors.Is(err, api.ErrNotFound) {
		t.Errorf("a create of a missing template with a pool: %v, want not found", err)
	}
	waitFilled(t, m)
	if n := warns.Load(); n > looks+1 {
		t.Errorf("%d warnings for %d looks at a missing template's pool", n, looks)
	}
	if sbs, _ := m.cfg.Store.Sandboxes(ctx); len(sbs) != 0 {
		t.Errorf("records left by a missing template's pool: %d", len(sbs))
	}
}

// TestAttack25DeletePooled: a pooled sandbox deleted by id (its id is in
// `sbx df`): the pool does not count it, a create does not get it, and the
// next fill boots another. (A stop by id goes through too, and answers
// "not found" once it has stopped it; it is slow under the fakes, so not
// here.)
func TestAttack25DeletePooled(t *testing.T) {
	ctx := context.Background()
	m, _ := newTestManager(t, 0)
	warm(t, m, WarmPool{Template: "tiny", N: 2})
	ids := fillPool(t, m, "tiny", 2)
	if _, err := m.Delete(ctx, ids[0], false); err != nil {
		t.Fatalf("delete of a pooled sandbox by id: %v", err)
	}
	sb, err := m.Create(ctx, api.CreateRequest{Template: "tiny", Name: "after"})
	if err != nil {
		t.Fatal(err)
	}
	if sb.ID != ids[1] {
		t.Errorf("a create after one of two pooled sandboxes was deleted got %s, want the other, %s", sb.ID, ids[1])
	}
	waitFilled(t, m)
	if now := fillPool(t, m, "tiny", 2); len(now) != 2 {
		t.Errorf("the pool holds %v, want 2", now)
	}
	waitFilled(t, m)
}

// TestAttack25LifetimeAndTake: a pooled sandbox older than the lifetime
// cap, once taken, is a new sandbox: its life counts from the take, and
// the reaper leaves it; one left in the pool past the cap is reaped.
func TestAttack25LifetimeAndTake(t *testing.T) {
	ctx := context.Background()
	m, c := newTestManager(t, time.Hour)
	warm(t, m, WarmPool{Template: "tiny", N: 2})
	ids := fillPool(t, m, "tiny", 2)
	c.add(59 * time.Minute)
	sb, err := m.Create(ctx, api.CreateRequest{Template: "tiny", Name: "late"})
	if err != nil {
		t.Fatal(err)
	}
	warm(t, m, WarmPool{Template: "tiny", N: 1}) // no refill under the count
	waitFilled(t, m)
	c.add(2 * time.Minute)
	m.reaper.once(ctx)
	if _, err := m.Get(ctx, "late"); err != nil {
		t.Errorf("a sandbox taken a minute ago from a pool where it waited 59m was reaped at the 1h cap: %v", err)
	}
	left := poolReady(t, m, "tiny")
	for _, id := range left {
		if id != sb.ID && (id == ids[0] || id == ids[1]) {
			t.Errorf("a pooled sandbox past the lifetime cap is still ready: %s", id)
		}
	}
}
