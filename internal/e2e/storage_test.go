package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"sbx.dev/sbx/api"
	"sbx.dev/sbx/internal/agent"
)

// Issue 22, parts 5 and 6: freezes pile up, and nothing bounds what sbx
// stores. Each attack is played against real runsc.

// storageDaemon is a daemon of the test's own, with flags.
func storageDaemon(t *testing.T, flags ...string) *daemon {
	t.Helper()
	d, err := startDaemon(flags)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.stop(true) })
	t.Cleanup(func() { keepLogs(t, d) })
	return d
}

// dfFreezes are the freeze snapshots of sandbox id, as sbx df says.
func dfFreezes(t *testing.T, d *daemon, id string) []api.StorageItem {
	t.Helper()
	var st api.Storage
	d.jsonOut(t, &st, "df")
	var out []api.StorageItem
	for _, it := range st.Freezes {
		if id == "" || it.SandboxID == id {
			out = append(out, it)
		}
	}
	return out
}

// freezeLoop is the attack: a user inside (uid 1000) asks for freezes in
// a loop, never held.
const freezeLoop = `for i in 1 2 3 4; do ` + agent.FreezeCommand + ` --no-hold --reason loop >/dev/null 2>&1; done; echo looped`

// TestStorageFreezeLoopQuota: uid 1000 loops /.sbx/freeze --no-hold across
// stop/resume and a fork: each sandbox keeps at most --freeze-max-count
// freezes, the one past it is not recorded and its event says why, no slot
// or image of it is left; `sbx delete` takes a sandbox's freezes, save one
// promoted with `sbx snapshot keep`, and `--keep-freezes` keeps them all.
func TestStorageFreezeLoopQuota(t *testing.T) {
	const max = 2
	d := storageDaemon(t, "--freeze-max-count", "2", "--freeze-min-interval", "0")
	id := d.newSandbox(t)
	loop := func(sb string) {
		t.Helper()
		r := d.sbx(t, "exec", "-u", "1000", sb, "--", "sh", "-c", freezeLoop)
		if r.code != 0 || !strings.Contains(r.stdout, "looped") {
			t.Fatalf("the freeze loop in %s: exit %d %q %q", sb, r.code, r.stdout, r.stderr)
		}
	}
	// boots 1..4 of id: the loop, then a stop and a resume
	for boot := 1; boot <= 4; boot++ {
		loop(id)
		want := min(boot, max)
		waitFor(t, "the freezes to be recorded", 20*time.Second, func() bool { return len(dfFreezes(t, d, id)) >= want })
		d.must(t, "stop", id, "--wait")
		d.must(t, "resume", id)
	}
	if got := dfFreezes(t, d, id); len(got) != max {
		t.Errorf("%d freezes of %s after 4 boots of freeze loops, want the quota, %d: %+v", len(got), id, max, got)
	}
	// the freeze command, past the quota, says so, and claims nothing
	if r := d.sbx(t, "exec", "-u", "1000", id, "--", agent.FreezeCommand, "--no-hold"); r.code != 1 ||
		!strings.Contains(r.stderr, "freeze quota") || strings.Contains(r.stderr, "froze sandbox") {
		t.Errorf("a freeze past the quota: exit %d %q, want 1 saying the quota is used", r.code, r.stderr)
	}
	// the freezes past the quota: an event each, saying why
	var refused, slots []string
	waitFor(t, "the refused freezes' events", 20*time.Second, func() bool {
		refused, slots = nil, nil
		_ = sdk(d.client).Events(context.Background(), id, false, func(ev api.Event) error {
			if e, _ := ev.Detail["error"].(string); ev.Type == "frozen" && strings.Contains(e, "freeze quota") {
				refused = append(refused, e)
				slot, _ := ev.Detail["slot"].(string)
				slots = append(slots, slot)
			}
			return nil
		})
		return len(refused) >= 2
	})
	if len(refused) < 2 || !strings.Contains(refused[0], "sbxd --freeze-max-count 2") || !strings.Contains(refused[0], "sbx snapshot keep NAME") {
		t.Errorf("the refused freezes' events: %q, want two or more naming --freeze-max-count and what to do", refused)
	}
	// a refused freeze leaves neither its slot nor an image
	for _, slot := range slots {
		for _, p := range []string{filepath.Join(d.dir, "images", slot), filepath.Join(d.dir, "freeze", id, slot)} {
			if _, err := os.Stat(p); slot == "" || err == nil {
				t.Errorf("a refused freeze (slot %q) left %s", slot, p)
			}
		}
	}

	// a fork has a quota of its own, and its loop stays within it too
	fork := strings.TrimSpace(d.must(t, "fork", id, "--memory"))
	if !idRE.MatchString(fork) {
		t.Fatalf("fork printed %q", fork)
	}
	t.Cleanup(func() { _ = deleteSandbox(context.Background(), d.client, fork) })
	waitFor(t, "the fork to be ready", 60*time.Second, func() bool { return d.info(t, fork).State == api.StateReady })
	loop(fork)
	waitFor(t, "the fork's freeze", 20*time.Second, func() bool { return len(dfFreezes(t, d, fork)) == 1 })

	// promoted, a freeze outlives its sandbox; the others go with it
	kept := dfFreezes(t, d, id)[0].Name
	if out := d.must(t, "snapshot", "keep", kept); !strings.Contains(out, "kept "+kept) {
		t.Errorf("snapshot keep said %q", out)
	}
	r := d.sbx(t, "delete", id)
	if r.code != 0 || !strings.Contains(r.stderr, "removed the freezes of "+id) {
		t.Errorf("delete %s: exit %d %q %q, want it to name the freezes it removed", id, r.code, r.stdout, r.stderr)
	}
	if got := dfFreezes(t, d, id); len(got) != 1 || got[0].Name != kept || !got[0].Kept {
		t.Errorf("freezes of the deleted %s: %+v, want only the kept %s", id, got, kept)
	}
	// --keep-freezes keeps them, marked kept
	d.must(t, "delete", "--keep-freezes", fork)
	if got := dfFreezes(t, d, fork); len(got) != 1 || !got[0].Kept {
		t.Errorf("freezes of %s deleted with --keep-freezes: %+v, want its one, kept", fork, got)
	}
	// a kept freeze still restores
	cp := d.newSandbox(t, "--from", kept)
	d.must(t, "exec", cp, "--", "true")
	d.must(t, "delete", cp)
	if left := slotsLeft(d, id); len(left) != 0 {
		t.Errorf("slots left of %s: %q", id, left)
	}
	deleteEverything(t, d)
	checkNoLeaks(t, d)
}

// TestStorageDeleteLeavesNoFreeze: a sandbox that froze (as uid 1000) and
// crashed-captured nothing else leaves no freeze once deleted, with
// `sbx delete --all` too.
func TestStorageDeleteLeavesNoFreeze(t *testing.T) {
	d := storageDaemon(t)
	var ids []string
	for range 2 {
		id := d.newSandbox(t)
		r := d.sbx(t, "exec", "-u", "1000", id, "--", agent.FreezeCommand, "--no-hold", "--reason", "mine")
		if r.code != 0 {
			t.Fatalf("freeze in %s: exit %d %q", id, r.code, r.stderr)
		}
		ids = append(ids, id)
	}
	waitFor(t, "both freezes", 20*time.Second, func() bool { return len(dfFreezes(t, d, "")) == 2 })
	var out struct {
		Deleted []api.DeleteResult `json:"deleted"`
	}
	d.jsonOut(t, &out, "delete", "--all", "--yes")
	n := 0
	for _, res := range out.Deleted {
		n += len(res.Freezes)
	}
	if len(out.Deleted) != 2 || n != 2 {
		t.Errorf("delete --all: %+v, want 2 sandboxes, naming their 2 freezes", out.Deleted)
	}
	if left := dfFreezes(t, d, ""); len(left) != 0 {
		t.Errorf("freezes after delete --all: %+v, want none", left)
	}
	if sns, _ := d.client.Snapshots(context.Background()); len(sns) != 0 {
		t.Errorf("snapshots after delete --all: %+v, want none", sns)
	}
	// bad input: a clear error, nothing changed
	if r := d.sbx(t, "snapshot", "keep", "nosuch"); r.code != 1 || !strings.Contains(r.stderr, "snapshot nosuch not found") {
		t.Errorf("snapshot keep nosuch: exit %d %q, want 1 saying it is not found", r.code, r.stderr)
	}
	if r := d.sbx(t, "snapshot", "keep"); r.code != 2 {
		t.Errorf("snapshot keep with no name: exit %d %q, want a usage error", r.code, r.stderr)
	}
	for _, body := range []any{map[string]any{"olderThan": "soon"}, map[string]any{"orphans": "yes"}, map[string]any{"nosuch": true}} {
		if code, b := d.rawAPI(t, "POST", "/v1/storage/prune", body); code != 400 {
			t.Errorf("POST /v1/storage/prune %v: %d %s, want 400", body, code, b)
		}
	}
	checkNoLeaks(t, d)
}

// TestStoragePruneOrphans: after everything is deleted, the stopped
// sandbox's hibernation image stays as an orphan (its 7-day grace); `sbx
// df` shows it, `sbx prune --orphans` removes it, says so, and leaves no
// image: the data dir holds only sbxd's own files.
func TestStoragePruneOrphans(t *testing.T) {
	d := storageDaemon(t)
	id := d.newSandbox(t)
	d.must(t, "exec", id, "--", "sh", "-c", "head -c 20000000 /dev/urandom > /tmp/blob")
	d.must(t, "stop", id, "--wait")
	d.must(t, "delete", id)
	var st api.Storage
	d.jsonOut(t, &st, "df")
	if len(st.Orphans) != 1 || st.Orphans[0].SandboxID != id || st.Orphans[0].Bytes < 1<<20 {
		t.Fatalf("df after deleting a stopped sandbox: orphans %+v, want its image", st.Orphans)
	}
	if out := d.must(t, "df"); !strings.Contains(out, "orphan") || !strings.Contains(out, st.Orphans[0].ID) {
		t.Errorf("sbx df does not show the orphan:\n%s", out)
	}
	var dry api.PruneResult
	d.jsonOut(t, &dry, "prune", "--orphans", "--dry-run")
	if len(dry.Removed) != 1 || !dry.DryRun {
		t.Errorf("prune --dry-run: %+v, want the orphan named", dry)
	}
	if r := d.sbx(t, "prune", "--older-than", "soon"); r.code != 2 || !strings.Contains(r.stderr, "--older-than") {
		t.Errorf("prune --older-than soon: exit %d %q, want a usage error", r.code, r.stderr)
	}
	out := d.must(t, "prune", "--orphans")
	if !strings.Contains(out, "removed orphan "+st.Orphans[0].ID+" of "+id) || !strings.Contains(out, "removed 1,") {
		t.Errorf("prune --orphans said %q, want the orphan named", out)
	}
	imgs, _ := os.ReadDir(filepath.Join(d.dir, "images"))
	if len(imgs) != 0 {
		t.Errorf("images after the prune: %v, want none", imgs)
	}
	var after api.Storage
	d.jsonOut(t, &after, "df")
	for _, k := range []string{api.StorageSandbox, api.StorageSnapshot, api.StorageFreeze, api.StorageOrphan} {
		if after.Totals[k] != 0 {
			t.Errorf("df after the prune: %s hold %d bytes, want 0", k, after.Totals[k])
		}
	}
	// the templates, and sbxd's own: the database, its 32 MiB reserve, the agent
	if own := after.Used - after.Totals[api.StorageTemplate]; own > 64<<20 || after.Totals[api.StorageOther] != own {
		t.Errorf("the data dir holds %d bytes besides the templates after the prune, want only sbxd's own (< 64 MiB): %v", own, after.Totals)
	}
	ev := lastEvent(t, d, id)
	if ev.Type != "pruned" {
		t.Errorf("the last event of %s is %q, want pruned", id, ev.Type)
	}
	checkNoLeaks(t, d)
}

// duOf is what du says of dir: the blocks its files hold.
func duOf(dir string) int64 {
	var n int64
	_ = filepath.WalkDir(dir, func(_ string, de fs.DirEntry, err error) error {
		if err != nil {
			return nil
		}
		if fi, err := de.Info(); err == nil {
			if st, ok := fi.Sys().(*syscall.Stat_t); ok {
				n += st.Blocks * 512
			}
		}
		return nil
	})
	return n
}

func lastEvent(t *testing.T, d *daemon, id string) api.Event {
	t.Helper()
	var last api.Event
	_ = sdk(d.client).Events(context.Background(), id, false, func(ev api.Event) error { last = ev; return nil })
	return last
}

// TestStorageMaxRefusesCapture: with --storage-max, a capture that would
// pass it is refused (409) saying why and what to do, nothing is kept, the
// sandbox runs on with its files; room made, the capture works.
func TestStorageMaxRefusesCapture(t *testing.T) {
	// the budget: sbxd's own (its database, 32 MiB reserve, agent) and the
	// templates, and room for one snapshot of the 80 MB file, not two
	base := duOf(templateCache()+"/") + 40<<20
	d := storageDaemon(t, "--storage-max", fmt.Sprint(base+120<<20))
	id := d.newSandbox(t)
	d.must(t, "exec", id, "--", "sh", "-c", "head -c 80000000 /dev/urandom > /tmp/blob && sha256sum /tmp/blob > /tmp/sum")
	d.must(t, "snapshot", id, "s1")
	t.Logf("after s1:\n%s", d.must(t, "df"))
	imgs := func() int { e, _ := os.ReadDir(filepath.Join(d.dir, "images")); return len(e) }
	before := imgs()
	for _, c := range [][]string{{"snapshot", id, "s2"}, {"stop", id, "--wait"}, {"fork", id}, {"fork", id, "--memory", "--wait"}} {
		r := d.sbx(t, c...)
		if r.code == 0 || !strings.Contains(r.stderr, "storage budget is full") || !strings.Contains(r.stderr, "sbxd --storage-max") || !strings.Contains(r.stderr, "sbx prune") {
			t.Errorf("sbx %s at the budget: exit %d %q, want refused naming the budget and what to do", strings.Join(c, " "), r.code, r.stderr)
		}
	}
	code, body := d.rawAPI(t, "POST", "/v1/sandboxes/"+id+"/snapshots", api.SnapshotRequest{Name: "s3"})
	var eb api.ErrorBody
	_ = json.Unmarshal(body, &eb)
	if code != 409 || eb.Error.Code != "conflict" {
		t.Errorf("POST snapshots at the budget: %d %s, want 409 conflict", code, body)
	}
	if n := imgs(); n != before {
		t.Errorf("images after the refused captures: %d, want %d", n, before)
	}
	if st := d.info(t, id).State; st != api.StateReady {
		t.Errorf("%s after the refused captures: %s, want ready", id, st)
	}
	d.must(t, "exec", id, "--", "sha256sum", "-c", "/tmp/sum")
	// room made, the capture works
	d.must(t, "snapshot", "rm", "s1")
	d.must(t, "snapshot", id, "s2")
	cp := d.newSandbox(t, "--from", "s2")
	d.must(t, "exec", cp, "--", "sha256sum", "-c", "/tmp/sum")
	deleteEverything(t, d)
	checkNoLeaks(t, d)
}

// TestStorageCrashCaptureGoesWithSandbox: a crash capture is a freeze: it
// counts in its sandbox's freezes (sbx df), and goes with the sandbox.
func TestStorageCrashCaptureGoesWithSandbox(t *testing.T) {
	d := storageDaemon(t)
	id := d.newSandbox(t, "--template", "base")
	buildC(t, d, id, "int main(void) { return *(volatile int *)0; }\n", "/tmp/segv")
	if _, _, code := execOut(t, d, id, "", "60s", `/tmp/segv`); code != 139 {
		t.Fatalf("the segfault: exit %d, want 139", code)
	}
	cr := crashesOf(t, d, id, 1)[0]
	if got := dfFreezes(t, d, id); len(got) != 1 || got[0].Name != cr.Snapshot {
		t.Errorf("df freezes of %s: %+v, want its crash capture %s", id, got, cr.Snapshot)
	}
	var res api.DeleteResult
	if err := func() error {
		r, err := d.client.Sandbox(id).Delete(context.Background())
		if err == nil {
			res = *r
		}
		return err
	}(); err != nil {
		t.Fatal(err)
	}
	if len(res.Freezes) != 1 || res.Freezes[0] != cr.Snapshot {
		t.Errorf("delete %s: %+v, want its crash capture %s removed", id, res, cr.Snapshot)
	}
	if _, err := d.client.GetSnapshot(context.Background(), cr.Snapshot); err == nil {
		t.Errorf("the crash capture %s outlived its sandbox", cr.Snapshot)
	}
	checkNoLeaks(t, d)
}

// TestStorageHuntKeepsItsFreeze: `sbx hunt --freeze` deletes the original
// once its failing run is frozen; the freeze is the hunt's catch, so it is
// kept (a freeze otherwise goes with its sandbox) and still restores.
func TestStorageHuntKeepsItsFreeze(t *testing.T) {
	d := shared
	name := "hkf-" + randHex(4)
	var frozen string
	_, s := frozenHunt(t, d, t.TempDir(), name, &frozen, "--runs", "3", "--", "sh", "-c", "exit 1")
	sn, err := d.client.GetSnapshot(context.Background(), s.Frozen)
	if err != nil || !sn.Kept {
		t.Fatalf("the hunt's freeze %s after the original's delete: %+v %v, want kept", s.Frozen, sn, err)
	}
	cp := d.newSandbox(t, "--from", s.Frozen)
	d.must(t, "exec", cp, "--", "true")
}

// TestStorageOrphanMax: orphans past --orphan-max are collected before
// their grace ends, with a swept event in their sandbox's stream.
func TestStorageOrphanMax(t *testing.T) {
	d := storageDaemon(t, "--orphan-max", "1M")
	id := d.newSandbox(t)
	d.must(t, "exec", id, "--", "sh", "-c", "head -c 8000000 /dev/urandom > /tmp/blob")
	d.must(t, "stop", id, "--wait")
	d.must(t, "delete", id)
	// the image goes first, then its event is recorded: wait for both
	waitFor(t, "the orphan past --orphan-max to be swept", 30*time.Second, func() bool {
		e, _ := os.ReadDir(filepath.Join(d.dir, "images"))
		return len(e) == 0 && lastEvent(t, d, id).Type == "swept"
	})
	ev := lastEvent(t, d, id)
	if r, _ := ev.Detail["reason"].(string); ev.Type != "swept" || !strings.Contains(r, "sbxd --orphan-max 1.0 MiB") {
		t.Errorf("the last event of %s: %s %v, want swept naming --orphan-max", id, ev.Type, ev.Detail)
	}
	var st api.Storage
	d.jsonOut(t, &st, "df")
	if len(st.Orphans) != 0 || st.OrphanMax != 1<<20 {
		t.Errorf("df after the sweep: orphans %+v, orphanMax %d; want none, 1 MiB", st.Orphans, st.OrphanMax)
	}
	checkNoLeaks(t, d)
}
