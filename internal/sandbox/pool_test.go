package sandbox

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"sbx.dev/sbx/api"
	"sbx.dev/sbx/internal/store"
)

// TestWarmPool: a pool fills to its size with sandboxes nobody sees; a
// create of its template with nothing a boot fixes takes one (its name,
// ttl and meta, a "created" event saying pooled), and the pool fills
// again; a create that asks a limit boots; a taken name is refused and
// leaves the pooled sandbox pooled.
func TestWarmPool(t *testing.T) {
	ctx := context.Background()
	m, _ := newTestManager(t, 0)
	warm(t, m, WarmPool{Template: "tiny", N: 2})
	pooledIDs := func() []string {
		sbs, err := m.cfg.Store.Sandboxes(ctx)
		if err != nil {
			t.Fatal(err)
		}
		var ids []string
		for _, sb := range sbs {
			if pooled(sb) && sb.State == api.StateReady {
				ids = append(ids, sb.ID)
			}
		}
		return ids
	}
	fillTo := func(n int) []string {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for {
			m.pool.fill(ctx)
			if ids := pooledIDs(); len(ids) == n {
				return ids
			} else if time.Now().After(deadline) {
				t.Fatalf("the pool holds %d ready, want %d", len(ids), n)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	ids := fillTo(2)
	if l, err := m.List(ctx); err != nil || len(l) != 0 {
		t.Errorf("List shows the pool's sandboxes: %d, %v", len(l), err)
	}
	if _, err := m.Get(ctx, ids[0]); !errors.Is(err, api.ErrNotFound) {
		t.Errorf("Get of a pooled sandbox: %v, want not found", err)
	}
	if p, _ := m.Pools(ctx); p["tiny"] != [2]int{2, 2} {
		t.Errorf("Pools = %v, want tiny keeping 2 with 2 ready", p)
	}

	sb, err := m.Create(ctx, api.CreateRequest{Template: "tiny", Name: "w1", TTL: api.Duration(10 * time.Minute), Meta: map[string]string{"team": "a"}})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(ids, sb.ID) || sb.Name != "w1" || sb.TTL.D() != 10*time.Minute || sb.Meta["team"] != "a" || sb.Meta[api.MetaPool] != "" || sb.State != api.StateReady {
		t.Errorf("the create from the pool: %+v (pooled were %v)", sb, ids)
	}
	got, err := m.Get(ctx, "w1")
	if err != nil || got.ID != sb.ID {
		t.Fatalf("Get w1: %+v, %v", got, err)
	}
	evs, err := m.cfg.Store.Events(ctx, sb.ID, 0)
	if err != nil {
		t.Fatal(err)
	}
	var created []api.Event
	for _, e := range evs {
		if e.Type == "created" {
			created = append(created, e)
		}
	}
	if len(created) != 1 || created[0].Detail["pooled"] != true {
		t.Errorf("the taken sandbox's created events: %+v, want one, pooled", created)
	}
	after := fillTo(2)
	if slices.Contains(after, sb.ID) {
		t.Error("the taken sandbox is still in the pool")
	}

	// a limit is a boot's: not from the pool
	cold, err := m.Create(ctx, api.CreateRequest{Template: "tiny", Memory: "512M"})
	if err != nil {
		t.Fatal(err)
	}
	if slices.Contains(after, cold.ID) {
		t.Error("a create with a memory limit was served from the pool")
	}
	// a name taken: refused, the pool keeps its sandboxes
	if _, err := m.Create(ctx, api.CreateRequest{Template: "tiny", Name: "w1"}); !errors.Is(err, api.ErrConflict) {
		t.Errorf("a create of a taken name from the pool: %v, want a conflict", err)
	}
	if now := pooledIDs(); !slices.Equal(now, after) {
		t.Errorf("after a refused create the pool holds %v, want %v", now, after)
	}
	// another template: a boot
	other, err := m.Create(ctx, api.CreateRequest{Template: "base"})
	if err != nil || slices.Contains(after, other.ID) {
		t.Errorf("a create of another template: %+v, %v", other, err)
	}
	// no longer wanted: the pool empties
	warm(t, m)
	waitEmptied(t, m)
}

// warm sets m's warm pools, as sbxd's --warm does.
func warm(t *testing.T, m *Manager, pools ...WarmPool) {
	t.Helper()
	if err := m.setWarm(pools); err != nil {
		t.Fatal(err)
	}
}

// TestWarmPoolLimits: a pool with limits of its own boots its sandboxes with
// them and serves the creates that ask for them, however they write them;
// a create with other limits, or with the defaults, is not served from it;
// a limit asked as the default is the plain pool's.
func TestWarmPoolLimits(t *testing.T) {
	ctx := context.Background()
	m, _ := newTestManager(t, 0)
	warm(t, m, WarmPool{Template: "tiny", N: 1, Memory: "512M", CPUs: 1}, WarmPool{Template: "tiny", N: 1})
	keys := func() map[string][]string {
		sbs, err := m.cfg.Store.Sandboxes(ctx)
		if err != nil {
			t.Fatal(err)
		}
		out := map[string][]string{}
		for _, sb := range sbs {
			if pooled(sb) && sb.State == api.StateReady {
				out[sb.Meta[api.MetaPool]] = append(out[sb.Meta[api.MetaPool]], sb.ID)
			}
		}
		return out
	}
	const limited = "tiny:cpus=1,memory=512MiB"
	fill := func() map[string][]string {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for {
			m.pool.fill(ctx)
			if k := keys(); len(k[limited]) == 1 && len(k["tiny"]) == 1 {
				return k
			} else if time.Now().After(deadline) {
				t.Fatalf("the pools hold %v, want one in %s and one in tiny", k, limited)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	k := fill()
	if p, _ := m.Pools(ctx); p[limited] != [2]int{1, 1} || p["tiny"] != [2]int{1, 1} {
		t.Errorf("Pools = %v, want %s and tiny, each keeping 1 with 1 ready", p, limited)
	}
	pooledSb, err := m.cfg.Store.Sandbox(ctx, k[limited][0])
	if err != nil {
		t.Fatal(err)
	}
	if pooledSb.Memory != 512<<20 || pooledSb.CPUs != 1 {
		t.Errorf("the limited pool's sandbox booted with memory %d, cpus %v; want 512 MiB, 1", pooledSb.Memory, pooledSb.CPUs)
	}

	// the same limits, written another way: from the pool
	sb, err := m.Create(ctx, api.CreateRequest{Template: "tiny", Memory: "0.5GiB", CPUs: 1, Name: "lim"})
	if err != nil {
		t.Fatal(err)
	}
	if sb.ID != k[limited][0] || sb.Memory != 512<<20 || sb.Name != "lim" {
		t.Errorf("a create asking the pool's limits: %s (memory %d), want the pooled %s", sb.ID, sb.Memory, k[limited][0])
	}
	k = fill()
	// other limits: a boot; the pools keep theirs
	for _, req := range []api.CreateRequest{
		{Template: "tiny", Memory: "512M"},          // no cpus
		{Template: "tiny", Memory: "256M", CPUs: 1}, // less memory
		{Template: "tiny", CPUs: 1},                 // the default memory
	} {
		cold, err := m.Create(ctx, req)
		if err != nil {
			t.Fatal(err)
		}
		if cold.ID == k[limited][0] || cold.ID == k["tiny"][0] {
			t.Errorf("a create of %+v was served from a pool", req)
		}
	}
	if now := keys(); !slices.Equal(now[limited], k[limited]) || !slices.Equal(now["tiny"], k["tiny"]) {
		t.Errorf("creates with other limits took from the pools: %v, then %v", k, now)
	}
	// the default memory asked outright: the plain pool's
	plain, err := m.Create(ctx, api.CreateRequest{Template: "tiny", Memory: "2G"})
	if err != nil {
		t.Fatal(err)
	}
	if plain.ID != k["tiny"][0] {
		t.Errorf("a create asking memory=2G (the default) booted %s, want the plain pool's %s", plain.ID, k["tiny"][0])
	}

	// a pool whose limits no boot would take is refused at the start
	if err := m.setWarm([]WarmPool{{Template: "tiny", N: 1, Memory: "1K"}}); err == nil || !strings.Contains(err.Error(), "memory") {
		t.Errorf("a pool of memory=1K: %v, want refused naming memory", err)
	}
	warm(t, m)
	waitEmptied(t, m)
}

// waitEmptied fills m's pools until no sandbox of any is left, as once no
// pool wants them.
func waitEmptied(t *testing.T, m *Manager) {
	t.Helper()
	ctx := context.Background()
	left := func() (ids []string) {
		sbs, err := m.cfg.Store.Sandboxes(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for _, sb := range sbs {
			if pooled(sb) {
				ids = append(ids, sb.ID)
			}
		}
		return ids
	}
	deadline := time.Now().Add(10 * time.Second)
	for len(left()) > 0 {
		m.pool.fill(ctx)
		if time.Now().After(deadline) {
			t.Fatalf("pools no longer wanted still hold %v", left())
		}
		time.Sleep(20 * time.Millisecond) // fill's removals run in the background
	}
}

// TestWarmPoolTakeDuringBoot: a boot records its sandbox ready before it
// returns, so a take in that moment finds the pool busy and starts no
// boot. The boot's end has the loop look again: the pool is full long
// before the loop's own next look (poolEvery). `make bench-quick` waited
// 9 s for each refill before.
func TestWarmPoolTakeDuringBoot(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	m, _ := newTestManager(t, 0)
	real := m.pool.host
	booted, gate := make(chan struct{}), make(chan struct{})
	var boots atomic.Int32
	m.pool.host = &hookHost{poolHost: real, boot: func(ctx context.Context, req api.CreateRequest) (*api.Sandbox, error) {
		sb, err := real.create(ctx, req)
		if boots.Add(1) == 1 {
			close(booted) // ready in the store, the boot not yet returned
			<-gate
		}
		return sb, err
	}}
	warm(t, m, WarmPool{Template: "tiny", N: 1})
	go m.pool.loop(ctx)
	<-booted
	sb, err := m.Create(ctx, api.CreateRequest{Template: "tiny"})
	if err != nil {
		t.Fatal(err)
	}
	if sb.Meta[api.MetaPool] != "" || boots.Load() != 1 {
		t.Fatalf("the create did not take the pooled sandbox: %+v, %d boots", sb, boots.Load())
	}
	time.Sleep(50 * time.Millisecond) // the take's look, which finds the boot under way
	close(gate)
	deadline := time.Now().Add(poolEvery / 2)
	for len(poolReady(t, m, "tiny")) != 1 {
		if time.Now().After(deadline) {
			t.Fatalf("the pool is still empty %v after a take during its boot (%d boots): it waits for the loop's next look", poolEvery/2, boots.Load())
		}
		time.Sleep(10 * time.Millisecond)
	}
	cancel()
	waitFilled(t, m)
}

// TestWarmPoolBootNoTake: a boot that nobody took from meanwhile does not
// have the loop look again (a template whose sandboxes die once ready
// would be booted again and again, not every poolEvery).
func TestWarmPoolBootNoTake(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	m, _ := newTestManager(t, 0)
	real := m.pool.host
	var looks atomic.Int32
	m.pool.host = &hookHost{poolHost: real, sandboxes: func(ctx context.Context) ([]*store.Sandbox, error) {
		looks.Add(1)
		return real.Sandboxes(ctx)
	}}
	warm(t, m, WarmPool{Template: "tiny", N: 2})
	go m.pool.loop(ctx)
	deadline := time.Now().Add(5 * time.Second)
	for len(poolReady(t, m, "tiny")) != 2 {
		if time.Now().After(deadline) {
			t.Fatal("the pool did not fill")
		}
		time.Sleep(10 * time.Millisecond)
	}
	waitFilled(t, m)
	time.Sleep(200 * time.Millisecond) // a look the boot's end asked would be done
	if n := looks.Load(); n != 1 {
		t.Errorf("the fill loop looked %d times for one fill and no take, want 1", n)
	}
	cancel()
}
