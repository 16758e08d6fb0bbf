package e2e

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"sbx.dev/sbx/api"
)

// TestReaperEndToEnd: with a real short ttl, an idle sandbox is reaped (its
// snapshot stays, the event says why), a running exec keeps another alive
// past its ttl, and inspection does not count as activity.
func TestReaperEndToEnd(t *testing.T) {
	d, err := startDaemon([]string{"--max-lifetime", "0"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.stop(true) })
	ctx := context.Background()
	// busy's exec starts before its ttl is set: a loaded machine may take
	// longer than 3 s between two commands
	busy := d.newSandbox(t, "--template", "tiny")
	d.must(t, "exec", busy, "--detach", "--", "sleep", "20")
	d.must(t, "ttl", busy, "3s")
	idle := d.newSandbox(t, "--template", "tiny")
	d.must(t, "snapshot", idle, "reaper-evidence")
	d.must(t, "ttl", idle, "3s")
	start := time.Now()
	waitFor(t, "the idle sandbox to be reaped", 30*time.Second, func() bool {
		// Inspection all the while: it must not keep the sandbox alive.
		d.sbx(t, "info", idle)
		_, err := d.client.Sandbox(idle).Info(ctx)
		return errors.Is(err, api.ErrNotFound)
	})
	if time.Since(start) < 3*time.Second {
		t.Errorf("reaped after %s, before its 3 s ttl", time.Since(start))
	}
	if _, err := d.client.GetSnapshot(ctx, "reaper-evidence"); err != nil {
		t.Errorf("reaping deleted the snapshot: %v", err)
	}
	out := d.must(t, "--json", "events", idle)
	if !strings.Contains(out, `"reaped"`) || !strings.Contains(out, "longer than its ttl") {
		t.Errorf("no reaped event with its reason:\n%s", out)
	}
	// busy's exec (20 s) outlives its 3 s ttl: it is still there.
	if time.Since(start) < 10*time.Second {
		time.Sleep(10*time.Second - time.Since(start)) // tested: the ttl has long passed, and busy is still there
	}
	var sb api.Sandbox
	sb = d.info(t, busy)
	if sb.State != api.StateReady {
		t.Errorf("a sandbox was reaped while its exec ran: %+v", sb)
	}
	// persist, ttl: the controls, and info says what the reaper will do.
	sb = api.Sandbox{}
	d.jsonOut(t, &sb, "persist", busy)
	if !sb.Persistent || sb.ReapAt != nil {
		t.Errorf("after persist: %+v", sb)
	}
	var off, ttl api.Sandbox
	d.jsonOut(t, &off, "persist", busy, "--off")
	if off.Persistent {
		t.Errorf("after persist --off: %+v", off)
	}
	d.jsonOut(t, &ttl, "ttl", busy, "1h")
	if ttl.TTL != api.Duration(time.Hour) || ttl.ReapReason == "" {
		t.Errorf("after ttl 1h: %+v", ttl)
	}
	// a usage error: sbx reads the duration before it asks sbxd
	if r := d.sbx(t, "ttl", busy, "soon"); r.code != 2 || !strings.Contains(r.stderr, "ttl") {
		t.Errorf("ttl soon: exit %d %q", r.code, r.stderr)
	}
}

// TestLifetimeCap: where sbxd caps lifetimes, persist is refused with 403
// and a message that says why.
func TestLifetimeCap(t *testing.T) {
	d, err := startDaemon([]string{"--max-lifetime", "1h"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.stop(true) })
	id := d.newSandbox(t, "--template", "tiny")
	_, err = d.client.Sandbox(id).SetPersistent(context.Background(), true)
	var ae *api.Error
	if !errors.As(err, &ae) || ae.Status != 403 || !strings.Contains(ae.Message, "max_lifetime") {
		t.Errorf("persist under a lifetime cap: %v, want 403 saying why", err)
	}
	var sb api.Sandbox
	sb = d.info(t, id)
	if sb.ReapAt == nil || !strings.Contains(sb.ReapReason, "lifetime") {
		t.Errorf("info under a lifetime cap: reapAt %v reason %q", sb.ReapAt, sb.ReapReason)
	}
}
