package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"sbx.dev/sbx/api"
	"sbx.dev/sbx/client"
)

// Attacks on the warm pools (issue 25) through sbxd: what a user reaches of
// a pooled sandbox by its id, and many creates at once.

// pooledIDs is the ids `GET /v1/storage` (sbx df) shows as a warm pool's.
func pooledIDs(t *testing.T, d *daemon) []string {
	t.Helper()
	code, b := d.rawAPI(t, "GET", "/v1/storage", nil)
	if code != 200 {
		t.Fatalf("GET /v1/storage: %d %s", code, b)
	}
	var st api.Storage
	if err := json.Unmarshal(b, &st); err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, it := range st.Sandboxes {
		if strings.HasPrefix(it.Name, "(warm pool") {
			ids = append(ids, it.ID)
		}
	}
	return ids
}

// TestAttack25PoolExecByIDE2E: a pooled sandbox's id is in `sbx df`; `sbx
// info` of it says not found, but `sbx exec` of it runs. What it leaves is
// in the sandbox the next `sbx new --template tiny` is given.
func TestAttack25PoolExecByIDE2E(t *testing.T) {
	d, err := startDaemon([]string{"--warm", "tiny=1"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.stop(true) })
	waitFor(t, "the pool's sandbox ready", 2*time.Minute, func() bool { return poolReady(t, d, "tiny") == 1 })
	ids := pooledIDs(t, d)
	if len(ids) != 1 {
		t.Fatalf("sbx df shows %d pooled sandboxes, want 1", len(ids))
	}
	if r := d.sbx(t, "info", ids[0]); r.code == 0 {
		t.Errorf("sbx info of a pooled sandbox: exit 0, want not found")
	}
	r := d.sbx(t, "exec", ids[0], "--", "sh", "-c", "echo planted > /tmp/planted")
	id := d.newSandbox(t, "--template", "tiny")
	planted := d.sbx(t, "exec", id, "--", "test", "-e", "/tmp/planted").code == 0
	if r.code == 0 || planted {
		t.Fatalf("sbx exec into pooled sandbox %s (which info says does not exist): exit %d; the next create got %s, which holds /tmp/planted: %v",
			ids[0], r.code, id, planted)
	}
	if !strings.Contains(r.stderr, "not found") {
		t.Errorf("sbx exec into a pooled sandbox: %q, want not found", r.stderr)
	}
}

// TestAttack25PoolForkByIDE2E: a fork of a pooled sandbox by id: refused,
// or children the fork's caller can see (not the pool's).
func TestAttack25PoolForkByIDE2E(t *testing.T) {
	d, err := startDaemon([]string{"--warm", "tiny=1"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.stop(true) })
	waitFor(t, "the pool's sandbox ready", 2*time.Minute, func() bool { return poolReady(t, d, "tiny") == 1 })
	ids := pooledIDs(t, d)
	if len(ids) != 1 {
		t.Fatalf("sbx df shows %d pooled sandboxes, want 1", len(ids))
	}
	ctx := context.Background()
	kids, err := d.client.Sandbox(ids[0]).Fork(ctx, client.WithCount(2))
	if err != nil {
		return // refused: held
	}
	var hidden []string
	for _, k := range kids {
		if r := d.sbx(t, "info", k.ID); r.code != 0 {
			hidden = append(hidden, k.ID)
		}
	}
	if len(hidden) > 0 {
		t.Errorf("a fork of pooled sandbox %s made children that sbx info does not find: %v; the pool now has %d ready (wants 1)",
			ids[0], hidden, poolReady(t, d, "tiny"))
	}
}

// TestAttack25PoolConcurrentCreatesE2E: 16 creates at once over a pool of
// 3: none fails, each gets its own sandbox under its own name.
func TestAttack25PoolConcurrentCreatesE2E(t *testing.T) {
	d, err := startDaemon([]string{"--warm", "tiny=3"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.stop(true) })
	waitFor(t, "the pool's 3 sandboxes ready", 2*time.Minute, func() bool { return poolReady(t, d, "tiny") == 3 })
	const n = 16
	ctx := context.Background()
	ids := make([]string, n)
	errs := make([]error, n)
	names := make([]string, n)
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range n {
		names[i] = fmt.Sprintf("c%d-%s", i, randHex(2))
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			sb, err := d.client.Create(ctx, client.WithTemplate("tiny"), client.WithName(names[i]))
			errs[i] = err
			if err == nil {
				ids[i] = sb.ID
			}
		}()
	}
	close(start)
	wg.Wait()
	t.Cleanup(func() {
		for _, id := range ids {
			if id != "" {
				_ = deleteSandbox(context.Background(), d.client, id)
			}
		}
	})
	seen := map[string]int{}
	for i := range n {
		if errs[i] != nil {
			t.Errorf("create %d failed: %v", i, errs[i])
			continue
		}
		if j, ok := seen[ids[i]]; ok {
			t.Errorf("creates %d and %d were both given %s", j, i, ids[i])
		}
		seen[ids[i]] = i
		if sb := d.info(t, names[i]); sb.ID != ids[i] {
			t.Errorf("create %d was given %s, but its name %s is %s", i, ids[i], names[i], sb.ID)
		}
	}
}
