package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"sbx.dev/sbx/internal/agent"
	"sbx.dev/sbx/internal/wire/freezewire"
)

// forgeScript writes a freeze's control line for the boot's own slot on
// init's stdout, as root inside can: what a forger of sbxd's records does.
// %s is the result, %s the pid field.
const forgeScript = `slot=$(tr '\0' '\n' < /proc/gvisor/spec_environ | sed -n 's/^SBX_FREEZE_SLOT=//p')
forge() { printf '\036sbx-freeze {"slot":"%%s","result":"%s","pid":%%s,"uid":0}\n' "$slot" "$1" > /proc/1/fd/1; }
`

func forge(result string) string { return fmt.Sprintf(forgeScript, result) }

// okFreezes are sandbox id's "frozen" events that say a freeze was kept.
func okFreezes(t *testing.T, d *daemon, id string) int {
	n := 0
	for _, ev := range frozenEvents(t, d, id) {
		if ev["outcome"] == "ok" {
			n++
		}
	}
	return n
}

// TestAttack22ForgedFreeze: root inside forges the freeze's verdict (a
// control line on /proc/1/fd/1 naming the boot's slot): sbxd records
// nothing on it, drops no slot, empties no file; a real freeze after it,
// and one with forged lines racing it, is recorded whole and restores; the
// freeze command says "froze as X" only once X is recorded; a flood of
// lines leaves sbxd answering. (Issue 22, part 4.)
func TestAttack22ForgedFreeze(t *testing.T) {
	d := ownDaemon(t)
	id := d.newSandbox(t)
	h := startHolderTiny(t, d, id)

	for _, result := range []string{freezewire.Frozen, freezewire.Failed, "frozen\",\"slot\":\"im_aaaaaaaaaa"} {
		r := d.sbx(t, "exec", "-u", "root", id, "--", "sh", "-c", forge(result)+`forge 1; echo forged`)
		if r.code != 0 || !strings.Contains(r.stdout, "forged") {
			t.Fatalf("forge a %q line: exit %d %q %q", result, r.code, r.stdout, r.stderr)
		}
	}
	time.Sleep(2 * time.Second) // sbxd has looked by now
	if sns := memorySnapshots(t, d, id); len(sns) != 0 {
		t.Errorf("forged verdicts recorded %d snapshots: %+v", len(sns), sns)
	}
	if evs := frozenEvents(t, d, id); len(evs) != 0 {
		t.Errorf("forged verdicts made frozen events: %v", evs)
	}
	left := slotsLeft(d, id)
	if len(left) != 1 {
		t.Fatalf("slots after forged verdicts: %q, want the boot's one, armed", left)
	}
	// the forgery reached sbxd (else this test proves nothing)
	if b, err := os.ReadFile(filepath.Join(left[0], freezewire.VerdictFile)); err != nil || !strings.Contains(string(b), `"result":"failed"`) {
		t.Fatalf("the forged verdict in the slot: %q %v, want the last forged line", b, err)
	}

	// the real freeze: recorded before it says so, and it restores
	name := freezeIn(t, d, id, "")
	if _, err := sdk(d.client).GetSnapshot(context.Background(), name); err != nil {
		t.Errorf("the freeze said it froze as %s, and sbxd has no such snapshot: %v", name, err)
	}
	cp := d.newSandbox(t, "--from", name)
	checkMemory(t, d, cp, h)
	checkMemory(t, d, id, h)

	// in the copy's boot, forged lines race a real freeze: what is
	// recorded is what gVisor wrote, whole
	r := d.sbx(t, "exec", "-u", "root", cp, "--", "sh", "-c", forge(freezewire.Failed)+
		`(i=0; while [ $i -lt 400 ]; do forge $i; i=$((i+1)); done) & `+agent.FreezeCommand+` --no-hold; echo "exit $?"; wait`)
	m := frozeAs.FindStringSubmatch(r.stderr)
	if !strings.Contains(r.stdout, "exit 0") || m == nil {
		t.Fatalf("a freeze raced by forged 'failed' lines: %q %q, want it frozen", r.stdout, r.stderr)
	}
	if _, err := sdk(d.client).GetSnapshot(context.Background(), m[1]); err != nil {
		t.Errorf("the raced freeze said it froze as %s, and sbxd has no such snapshot: %v", m[1], err)
	}
	cp2 := d.newSandbox(t, "--from", m[1])
	checkMemory(t, d, cp2, h)

	// a flood of distinct lines in a boot that has not frozen: sbxd
	// answers, records nothing, and the boot's freeze still works
	fl := d.newSandbox(t)
	r = d.sbx(t, "exec", "-u", "root", fl, "--", "sh", "-c", forge(freezewire.Frozen)+
		`i=0; while [ $i -lt 3000 ]; do forge $i; i=$((i+1)); done; echo flooded`)
	if !strings.Contains(r.stdout, "flooded") {
		t.Fatalf("flood: %q %q", r.stdout, r.stderr)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	if _, err := d.client.Health(ctx); err != nil {
		t.Errorf("sbxd after a flood of forged verdicts: %v", err)
	}
	cancel()
	time.Sleep(time.Second) // tested: the window in which sbxd, reading verdicts as they come, would record one
	if n := len(memorySnapshots(t, d, fl)); n != 0 {
		t.Errorf("a flood of forged verdicts recorded %d snapshots", n)
	}
	name = freezeIn(t, d, fl, "")
	waitSnapshot(t, d, name, time.Second)
	if n := okFreezes(t, d, fl); n != 1 {
		t.Errorf("%d freezes kept after the flood and one real freeze, want 1", n)
	}

	checkConsistent(t, d)
	deleteEverything(t, d)
	checkNoLeaks(t, d)
}

// TestAttack22FreezeUnconfirmed: sbxd is down while a sandbox freezes:
// the freeze command does not claim the snapshot exists; once sbxd is
// back and has recorded it, the sandbox's record says so.
func TestAttack22FreezeUnconfirmed(t *testing.T) {
	d := ownDaemon(t)
	id := d.newSandbox(t)
	out := filepath.Join("/tmp", "freeze-"+id+".out")
	d.must(t, "exec", "-d", "-u", "root", id, "--", "sh", "-c", "sleep 1; "+agent.FreezeCommand+" --reason down > "+out+" 2>&1; echo \"exit $?\" >> "+out)
	d.kill(syscall.SIGKILL)
	time.Sleep(4 * time.Second) // it freezes meanwhile
	if err := d.start(nil); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the freeze to be recorded", 30*time.Second, func() bool { return len(memorySnapshots(t, d, id)) > 0 })
	sn := memorySnapshots(t, d, id)[0]
	var rec agent.FreezeRecord
	waitFor(t, "the sandbox to learn its freeze was recorded", 10*time.Second, func() bool {
		rec = freezeRecord(t, d, id)
		return rec.State == agent.FreezeFrozen
	})
	if rec.Name != sn.Name {
		t.Errorf("the sandbox's record names %s, sbxd recorded %s", rec.Name, sn.Name)
	}
	r := d.sbx(t, "exec", id, "--", "cat", out)
	t.Logf("the freeze command, sbxd down: %s", r.stdout)
	if strings.Contains(r.stdout, "exit 0") && !strings.Contains(r.stdout, sn.Name) {
		t.Errorf("the freeze command said %q: exit 0 without naming the snapshot recorded", r.stdout)
	}
	if strings.Contains(r.stdout, "exit 1") && !strings.Contains(r.stdout, "did not confirm") {
		t.Errorf("the freeze command said %q: failing, and not because sbxd did not confirm", r.stdout)
	}
	_ = os.Remove(out)
	deleteEverything(t, d)
	checkNoLeaks(t, d)
}
