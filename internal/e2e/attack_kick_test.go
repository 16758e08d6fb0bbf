package e2e

import (
	"fmt"
	"regexp"
	"strings"
	"testing"
	"time"
)

// Attacks on init's kick at the end of each checkpoint (it waits on
// /proc/gvisor/checkpoint) and sbxd's wait for a restored init's first
// connection (expectDial).

// freezeOnce consumes the one freeze gVisor arms per boot of id (from
// inside, as /.sbx/freeze does), so that a later write of "1" to
// /proc/gvisor/checkpoint fails at once (ENXIO) and ends a checkpoint
// attempt, waking every reader of the file.
func freezeOnce(t *testing.T, d *daemon, id string) {
	t.Helper()
	r, hung := sbxWithin(t, d, 90*time.Second, "exec", "--user", "root", id, "--", "sh", "-c", "/.sbx/freeze --reason kick 2>&1")
	m := regexp.MustCompile(`as snapshot (freeze-[A-Za-z0-9._-]+)`).FindStringSubmatch(r.stdout)
	if m == nil {
		t.Fatalf("freeze: hung=%v %+v", hung, r)
	}
	t.Cleanup(func() { d.sbx(t, "snapshot", "rm", m[1]) })
}

// TestAttackKickFailedSavesFlood: once the boot's freeze is used, uid 1000
// inside (the file is 0666 while freezes are armed) writes "1" to
// /proc/gvisor/checkpoint in four loops at once: each write is a
// checkpoint attempt that fails at once (ENXIO) and wakes the file's
// readers, init's kick watcher among them, which opens the file again at
// once (and each `echo 1 >` opens it too). gVisor's Register (an open)
// took CheckpointWaitable.mu then Kernel.checkpointMu; OnCheckpointAttempt
// took them the other way round: the loop hung for good, and so did every
// later save of the sandbox (sbx snapshot; runsc tar killed after 1 min).
// Fixed by gVisor patch 15. Want: the loop ends, execs still work over the
// channel, and a memory snapshot of the sandbox still completes.
func TestAttackKickFailedSavesFlood(t *testing.T) {
	d := shared
	id := d.newSandbox(t, "--template", "tiny")
	channelReady(t, d, id)
	mode := d.must(t, "exec", "--user", "root", id, "--", "ls", "-l", "/proc/gvisor/checkpoint")
	t.Logf("the file: %s", strings.TrimSpace(mode))
	freezeOnce(t, d, id)
	// four writers at once, as uid 1000 (the file is 0666 once freezes
	// are armed)
	const loop = `w() { i=0; while [ $i -lt 15000 ]; do echo 1 2>/dev/null >/proc/gvisor/checkpoint; i=$((i+1)); done; }; w & w & w & w & wait; echo "done"`
	start := time.Now()
	r, hung := sbxWithin(t, d, 2*time.Minute, "exec", "--user", "1000", "--timeout", "0", id, "--", "sh", "-c", loop)
	t.Logf("the loop: hung=%v after %s: %+v", hung, time.Since(start).Round(time.Millisecond), r)
	if hung || r.stdout != "done\n" {
		t.Errorf("60000 failed checkpoint writes did not end in 2 min (hung=%v): %+v", hung, r)
	}
	answers(t, d, id, "after a flood of failed checkpoint writes")
	if !channelSoon(t, d, id, 10*time.Second) {
		t.Error("no exec over the channel within 10 s after the flood")
	}
	snap := "kickflood-" + randHex(3)
	sr, shung := sbxWithin(t, d, 2*time.Minute, "snapshot", id, snap, "--memory")
	t.Cleanup(func() { d.sbx(t, "snapshot", "rm", snap) })
	if shung || sr.code != 0 {
		t.Errorf("a memory snapshot after the flood: hung=%v %+v", shung, sr)
	}
	if t.Failed() {
		channelEvidence(t, d, id)
	}
}

// TestAttackKickSnapshotOfIdleSandbox: the kick is meant for "the first
// exec after a resume, a fork or a snapshot", but gVisor (patch 03) wakes
// /proc/gvisor/checkpoint's readers only for the application's own saves
// and for restores: a control-server save (sbx snapshot, the source of a
// fork) ends with no kick. In an idle sandbox (no exec for channelWarm,
// 30 s) init pings every 2 s, so its connections the save closed are
// replaced only then. Want: the first exec after a memory snapshot of an
// idle sandbox goes over the channel, and within 500 ms.
func TestAttackKickSnapshotOfIdleSandbox(t *testing.T) {
	d := shared
	id := d.newSandbox(t, "--template", "tiny")
	channelReady(t, d, id)
	time.Sleep(32 * time.Second) // the channel cools: pings every 2 s
	snap := "kickidle-" + randHex(3)
	d.must(t, "snapshot", id, snap, "--memory")
	t.Cleanup(func() { d.sbx(t, "snapshot", "rm", snap) })
	start := time.Now()
	if out := d.must(t, "exec", id, "--", "echo", "ok"); out != "ok\n" {
		t.Fatalf("the first exec after the snapshot said %q", out)
	}
	took := time.Since(start)
	via := viaChannel(d, id, lastExec(t, d, id).ID)
	t.Logf("the first exec after a memory snapshot of an idle sandbox: %s, over the channel: %v", took.Round(time.Millisecond), via)
	if !via || took > 500*time.Millisecond {
		t.Errorf("the first exec after a memory snapshot of an idle sandbox took %s, over the channel: %v; want the channel, within 500 ms (no kick: a control-server save wakes no reader of /proc/gvisor/checkpoint)", took.Round(time.Millisecond), via)
	}
}

// initCPU is init's user+system CPU time in clock ticks, read inside id.
func initCPU(t *testing.T, d *daemon, id string) int {
	t.Helper()
	out := d.must(t, "exec", "--user", "root", id, "--", "sh", "-c", "cat /proc/1/stat")
	f := strings.Fields(out[strings.LastIndex(out, ")")+1:])
	if len(f) < 13 {
		t.Fatalf("/proc/1/stat: %q", out)
	}
	var u, s int
	fmt.Sscan(f[11], &u)
	fmt.Sscan(f[12], &s)
	return u + s
}

// TestAttackKickResumeThenExec: the first exec right after a resume goes
// over the channel (init kicks it as the restore ends, sbxd waits for its
// first connection); then root inside binds a file of its own over
// /proc/gvisor/checkpoint, so that init's watcher, reopening it after the
// next restore, reads at once (no wait). Want: the first exec after each
// resume right, over the channel, in under a second; init not spinning on
// the file (a few % of a CPU at most).
func TestAttackKickResumeThenExec(t *testing.T) {
	d := shared
	id := d.newSandbox(t, "--template", "tiny")
	channelReady(t, d, id)
	cycle := func(what string) {
		t.Helper()
		d.must(t, "stop", id, "--wait")
		d.must(t, "resume", id)
		start := time.Now()
		r, hung := sbxWithin(t, d, time.Minute, "exec", id, "--", "sh", "-c", "echo ok; exit 7")
		took := time.Since(start)
		via := viaChannel(d, id, lastExec(t, d, id).ID)
		t.Logf("%s: the first exec after the resume: %s, over the channel: %v", what, took.Round(time.Millisecond), via)
		if hung || r.stdout != "ok\n" || r.code != 7 {
			t.Errorf("%s: the first exec after the resume: hung=%v %+v; want ok, exit 7", what, hung, r)
		}
		if !via || took > time.Second {
			t.Errorf("%s: the first exec after the resume took %s, over the channel: %v; want the channel, under 1 s", what, took.Round(time.Millisecond), via)
		}
	}
	cycle("plain")
	// root cannot bind anything over the file in init's view (no
	// CAP_SYS_ADMIN in the sandbox): the watcher's file stays gVisor's
	if r := d.sbx(t, "exec", "--user", "root", id, "--", "sh", "-c", "echo restore > /tmp/ck && mount --bind /tmp/ck /proc/gvisor/checkpoint"); r.code == 0 {
		t.Errorf("root bound a file over /proc/gvisor/checkpoint: %+v", r)
	}
	// fifty readers of the file wait through the next stop and resume
	// beside init's watcher
	readers := detach(t, d, id, "sh", "-c", `for i in $(seq 50); do cat /proc/gvisor/checkpoint > /tmp/r$i & done; wait; cat /tmp/r* | sort | uniq -c`)
	time.Sleep(time.Second)
	cycle("fifty other readers")
	wantExecOutput(t, d, id, readers, "fifty readers of the checkpoint file through a stop and resume", "     50 restore\n")
	before := initCPU(t, d, id)
	time.Sleep(5 * time.Second)
	used := initCPU(t, d, id) - before
	t.Logf("init's CPU over 5 s after: %d ticks", used)
	// a watcher spinning on a file that does not wait takes most of a
	// CPU (500 ticks in 5 s); the channel's warm pings and the readers'
	// exec, 11-19 ticks on a quiet machine, took 29 under a CI run's load
	if used > 100 { // 20% of a CPU at 100 ticks a second
		t.Errorf("init used %d ticks of CPU in 5 s after the resumes: it spins", used)
	}
	cycle("again")
}

// TestAttackKickFreezeThenExec: a freeze's save closes init's channel
// connections as any save does, the connection its own exec is copied on
// among them. init's read-only watch of /proc/gvisor/checkpoint is told of
// the application's own saves as of sbx's (gVisor patches 03 and 16), and
// kicks the channel; init's pings alone (every second while warm) came
// too late for the freeze's own copy, attached again after the save, which
// then went by `runsc exec`. Want: the freeze's exec ends over the channel,
// and so does the first exec after it.
func TestAttackKickFreezeThenExec(t *testing.T) {
	d := shared
	id := d.newSandbox(t, "--template", "tiny")
	channelReady(t, d, id)
	name := freezeIn(t, d, id, "")
	t.Cleanup(func() { d.sbx(t, "snapshot", "rm", name) })
	if fx := lastExec(t, d, id); !viaChannel(d, id, fx.ID) {
		t.Errorf("the freeze's exec %s was attached again by `runsc exec` after its save: init's connections were not replaced as the freeze ended", fx.ID)
	}
	start := time.Now()
	r, hung := sbxWithin(t, d, time.Minute, "exec", id, "--", "echo", "ok")
	took := time.Since(start)
	via := viaChannel(d, id, lastExec(t, d, id).ID)
	t.Logf("the first exec after a freeze: %s, over the channel: %v", took.Round(time.Millisecond), via)
	if hung || r.code != 0 || r.stdout != "ok\n" {
		t.Fatalf("the first exec after a freeze: hung=%v %+v", hung, r)
	}
	if !via {
		t.Errorf("the first exec after a freeze went by `runsc exec` (%s)", took.Round(time.Millisecond))
	}
}
