package sandbox

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"sbx.dev/sbx/api"
)

// TestWarmPool: a pool fills to its size with sandboxes nobody sees; a
// create of its template with nothing a boot fixes takes one (its name,
// ttl and meta, a "created" event saying pooled), and the pool fills
// again; a create that asks a limit boots; a taken name is refused and
// leaves the pooled sandbox pooled.
func TestWarmPool(t *testing.T) {
	ctx := context.Background()
	m, _ := newTestManager(t, 0)
	m.pool.want = map[string]int{"tiny": 2}
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
	m.pool.want = map[string]int{}
	deadline := time.Now().Add(10 * time.Second)
	for len(pooledIDs()) > 0 {
		m.pool.fill(ctx)
		if time.Now().After(deadline) {
			t.Fatalf("a pool no longer wanted still holds %v", pooledIDs())
		}
		time.Sleep(20 * time.Millisecond)
	}
}
