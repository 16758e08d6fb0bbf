package e2e

import (
	"context"
	"encoding/json"
	"regexp"
	"strings"
	"testing"
	"time"

	"sbx.dev/sbx/api"
	"sbx.dev/sbx/internal/agent"
)

// frozeAs is the snapshot a freeze command's message names.
var frozeAs = regexp.MustCompile(`as snapshot (freeze-[A-Za-z0-9._-]+)`)

// freezeIn runs the freeze command in sandbox id (as user, "" for the
// template's) and returns the snapshot it names; it fails the test unless
// the freeze worked.
func freezeIn(t *testing.T, d *daemon, id, user string, args ...string) string {
	t.Helper()
	cmd := []string{"exec"}
	if user != "" {
		cmd = append(cmd, "-u", user)
	}
	cmd = append(append(cmd, id, "--", agent.FreezeCommand), args...)
	r := d.sbx(t, cmd...)
	m := frozeAs.FindStringSubmatch(r.stderr)
	if r.code != 0 || m == nil {
		t.Fatalf("freeze in %s: exit %d, stdout %q, stderr %q", id, r.code, r.stdout, r.stderr)
	}
	return m[1]
}

// waitSnapshot waits for sbxd to record snapshot name: at once, after a
// freeze.
func waitSnapshot(t *testing.T, d *daemon, name string, limit time.Duration) *api.Snapshot {
	t.Helper()
	var sn *api.Snapshot
	waitFor(t, "snapshot "+name+" to be recorded", limit, func() bool {
		var err error
		sn, err = sdk(d.client).GetSnapshot(context.Background(), name)
		return err == nil
	})
	return sn
}

// freezeRecord is the sandbox's own record of its last freeze.
func freezeRecord(t *testing.T, d *daemon, id string) agent.FreezeRecord {
	t.Helper()
	r := d.sbx(t, "exec", id, "--", agent.FreezeCommand, "--status")
	var rec agent.FreezeRecord
	if r.code != 0 || json.Unmarshal([]byte(r.stdout), &rec) != nil {
		t.Fatalf("freeze --status in %s: exit %d %q %q", id, r.code, r.stdout, r.stderr)
	}
	return rec
}

// frozenEvent is sandbox id's last "frozen" event.
func frozenEvent(t *testing.T, d *daemon, id string) map[string]any {
	t.Helper()
	var last map[string]any
	waitFor(t, "a frozen event of "+id, 10*time.Second, func() bool {
		_ = sdk(d.client).Events(context.Background(), id, false, func(ev api.Event) error {
			if ev.Type == "frozen" {
				last = ev.Detail
			}
			return nil
		})
		return last != nil
	})
	return last
}

// TestFreeze: a program inside freezes its sandbox: at once a named
// snapshot with memory; the original runs on with its memory and network;
// a copy made from it carries on the same processes and memory, in a
// network of its own, knows it is the copy, and can freeze in turn; the
// original cannot freeze twice in one boot, and says why; nothing leaks.
func TestFreeze(t *testing.T) {
	d, err := startDaemon(nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.stop(true) })
	id := d.newSandbox(t)
	h := startHolderTiny(t, d, id)

	name := freezeIn(t, d, id, "", "--reason", "e2e")
	sn := waitSnapshot(t, d, name, 5*time.Second)
	if !sn.Memory || sn.SandboxID != id || sn.Size == 0 {
		t.Errorf("the freeze's snapshot %+v, want one with memory of %s", sn, id)
	}
	ev := frozenEvent(t, d, id)
	if ev["outcome"] != "ok" || ev["name"] != name || ev["reason"] != "e2e" {
		t.Errorf("frozen event %v, want ok, naming %s and the reason", ev, name)
	}
	if rec := freezeRecord(t, d, id); rec.State != agent.FreezeFrozen || rec.Name != name || rec.PausedMs <= 0 {
		t.Errorf("the original's record %+v, want frozen as %s", rec, name)
	}
	// the original runs on, with its memory and network
	checkMemory(t, d, id, h)
	checkNetwork(t, d, id, false)

	// one freeze per boot: the second says so and names the first
	r := d.sbx(t, "exec", id, "--", agent.FreezeCommand)
	if r.code != 1 || !strings.Contains(r.stderr, "froze already, as "+name) {
		t.Errorf("a second freeze: exit %d %q, want 1 naming %s", r.code, r.stderr, name)
	}

	// a copy: the same processes and memory, in its own network
	cp := d.newSandbox(t, "--from", name)
	checkMemory(t, d, cp, h)
	checkNetwork(t, d, cp, false)
	if rec := freezeRecord(t, d, cp); rec.State != agent.FreezeCopy || rec.Copy != cp || rec.Sandbox != id {
		t.Errorf("the copy's record %+v, want the copy %s of %s", rec, cp, id)
	}
	// the copy's boot has a freeze of its own
	name2 := freezeIn(t, d, cp, "")
	if name2 == name {
		t.Errorf("the copy froze as %s, the original's name", name2)
	}
	waitSnapshot(t, d, name2, 5*time.Second)
	checkMemory(t, d, cp, h)

	checkConsistent(t, d)
	deleteEverything(t, d)
	checkNoLeaks(t, d)
}
