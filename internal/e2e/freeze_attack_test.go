package e2e

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"sbx.dev/sbx/api"
	"sbx.dev/sbx/internal/agent"
	"sbx.dev/sbx/internal/wire/freezewire"
)

// Attacks on the freeze: a sandbox that freezes in a loop, a freeze racing
// a stop, freezes by a user who is not root (and gVisor's file written
// directly), a freeze onto a full disk, sbxd killed in the middle of one.

// memorySnapshots are the snapshots with memory of sandbox id.
func memorySnapshots(t *testing.T, d *daemon, id string) []api.Snapshot {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	sns, err := d.client.Snapshots(ctx)
	if err != nil {
		t.Fatalf("snapshots: %v", err)
	}
	var out []api.Snapshot
	for _, sn := range sns {
		if sn.SandboxID == id && sn.Memory {
			out = append(out, sn)
		}
	}
	return out
}

// frozenEvents are the details of sandbox id's "frozen" events.
func frozenEvents(t *testing.T, d *daemon, id string) []map[string]any {
	t.Helper()
	var out []map[string]any
	_ = sdk(d.client).Events(context.Background(), id, false, func(ev api.Event) error {
		if ev.Type == "frozen" {
			out = append(out, ev.Detail)
		}
		return nil
	})
	return out
}

// slotsLeft are the freeze slots sandbox id has on the host.
func slotsLeft(d *daemon, id string) []string {
	m, _ := filepath.Glob(filepath.Join(d.dir, "freeze", id, "im_*"))
	return m
}

func ownDaemon(t testing.TB) *daemon {
	t.Helper()
	d, err := startDaemon(nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.stop(true) })
	t.Cleanup(func() { keepLogs(t, d) })
	return d
}

// keepLogs, when t failed, copies d's sbxd log and its sandboxes' runsc
// logs to the test's output dir (SBX_E2E_LOGS, if set) and logs sbxd's
// last lines: the daemon's dir goes with it.
func keepLogs(t testing.TB, d *daemon) {
	if !t.Failed() {
		return
	}
	log, _ := os.ReadFile(d.logPath)
	lines := strings.Split(strings.TrimSpace(string(log)), "\n")
	t.Logf("sbxd's last log lines:\n%s", strings.Join(lines[max(0, len(lines)-40):], "\n"))
	dst := os.Getenv("SBX_E2E_LOGS")
	if dst == "" {
		return
	}
	dst = filepath.Join(dst, t.Name())
	_ = os.MkdirAll(dst, 0o755)
	_ = exec.Command("cp", d.logPath, dst).Run()
	runscLogs, _ := filepath.Glob(filepath.Join(d.dir, "sandboxes", "*", "runsc.log"))
	for _, l := range runscLogs {
		_ = exec.Command("cp", l, filepath.Join(dst, filepath.Base(filepath.Dir(l))+".runsc.log")).Run()
	}
}

// TestFreezeAttackLoop: a sandbox freezes in a loop, one after another
// and all at once: one freeze per boot is taken, the others say why and
// record nothing; each new boot (a resume, a copy) takes one more.
func TestFreezeAttackLoop(t *testing.T) {
	d := ownDaemon(t)
	id := d.newSandbox(t)
	h := startHolderTiny(t, d, id)
	r := d.sbx(t, "exec", id, "--", "sh", "-c",
		`for i in 1 2 3 4 5 6 7 8 9 10; do /.sbx/freeze --reason loop; echo "exit $?"; done
		 for i in 1 2 3 4 5 6; do /.sbx/freeze --reason burst & done; wait`)
	if n := strings.Count(r.stdout, "exit 0"); n != 1 || strings.Count(r.stdout, "exit 1") != 9 {
		t.Errorf("ten freezes in a row: %q, want one exit 0 and nine exit 1", r.stdout)
	}
	if n := strings.Count(r.stderr, "froze sandbox"); n != 1 {
		t.Errorf("%d freezes said they froze, want 1:\n%s", n, r.stderr)
	}
	if n := strings.Count(r.stderr, "froze already"); n != 15 {
		t.Errorf("%d freezes said the boot froze already, want 15:\n%s", n, r.stderr)
	}
	waitFor(t, "the freeze to be recorded", 10*time.Second, func() bool { return len(memorySnapshots(t, d, id)) > 0 })
	time.Sleep(time.Second) // tested: the window in which a stray record would show
	sns := memorySnapshots(t, d, id)
	if len(sns) != 1 {
		t.Fatalf("%d snapshots with memory of %s, want the one freeze: %+v", len(sns), id, sns)
	}
	checkMemory(t, d, id, h)

	// each boot freezes once more
	names := map[string]bool{sns[0].Name: true}
	for i := 0; i < 2; i++ {
		d.must(t, "stop", id, "--wait")
		d.must(t, "resume", id)
		checkMemory(t, d, id, h)
		n := freezeIn(t, d, id, "", "--reason", "after a resume")
		if names[n] {
			t.Errorf("boot %d froze as %s, a name taken before", i+2, n)
		}
		names[n] = true
		waitSnapshot(t, d, n, 10*time.Second)
	}
	if got := len(memorySnapshots(t, d, id)); got != 3 {
		t.Errorf("%d freezes recorded after three boots, want 3", got)
	}
	if left := slotsLeft(d, id); len(left) != 0 {
		t.Errorf("slots left for %s: %q, want none (the running boot's became its freeze's image)", id, left)
	}
	checkConsistent(t, d)
	deleteEverything(t, d)
	checkNoLeaks(t, d)
}

// TestFreezeAttackDuringStop: a freeze races a stop, at a few offsets.
// Whatever wins, the stop is done, nothing is left of the slots, a freeze
// recorded before it is whole, and the sandbox resumes with its memory; a
// freeze command the stop caught in flight returns after the resume (it
// froze then, or says why not), and a freeze that said it froze is
// recorded, once.
func TestFreezeAttackDuringStop(t *testing.T) {
	d := ownDaemon(t)
	for _, delay := range []time.Duration{0, 400 * time.Millisecond} {
		id := d.newSandbox(t)
		h := startHolderTiny(t, d, id)
		frz := make(chan result, 1)
		go func() { frz <- d.sbx(t, "exec", id, "--", agent.FreezeCommand, "--reason", "stop-race") }()
		time.Sleep(delay) // tested: a random instant into the freeze
		stop := d.sbx(t, "stop", id, "--wait")
		if stop.code != 0 {
			// a stop refused while a capture runs says so; once more
			if stop = d.sbx(t, "stop", id, "--wait"); stop.code != 0 {
				t.Fatalf("stop %s: exit %d %q", id, stop.code, stop.stderr)
			}
		}
		if st := d.info(t, id).State; st != api.StateStopped {
			t.Fatalf("%s is %s after the stop, want stopped", id, st)
		}
		if left := slotsLeft(d, id); len(left) != 0 {
			t.Errorf("slots left for the stopped %s: %q", id, left)
		}
		before := memorySnapshots(t, d, id)
		for _, sn := range before {
			cp := d.newSandbox(t, "--from", sn.Name)
			checkMemory(t, d, cp, h)
			d.must(t, "rm", cp)
		}
		d.must(t, "resume", id)
		checkMemory(t, d, id, h)
		var fr result
		select {
		case fr = <-frz:
		case <-time.After(3 * time.Minute):
			t.Fatalf("delay %s: the freeze command never returned", delay)
		}
		t.Logf("delay %s: %d freezes recorded before the stop; the freeze: exit %d %s", delay, len(before), fr.code, strings.TrimSpace(fr.stderr))
		sns := before
		if fr.code == 0 {
			m := frozeAs.FindStringSubmatch(fr.stderr)
			if m == nil {
				t.Fatalf("the freeze said %q", fr.stderr)
			}
			waitSnapshot(t, d, m[1], 10*time.Second)
			sns = memorySnapshots(t, d, id)
			if len(sns) != 1 {
				t.Errorf("the freeze said it froze as %s; %d freezes recorded, want 1: %+v", m[1], len(sns), sns)
			}
		} else if len(before) != 0 {
			t.Errorf("a freeze is recorded (%+v) but its command said %q", before, fr.stderr)
		}
		// the boot after the resume freezes (or froze, above) once
		r := d.sbx(t, "exec", id, "--", agent.FreezeCommand, "--reason", "after the race")
		if r.code != 0 && !(fr.code == 0 && strings.Contains(r.stderr, "froze already")) {
			t.Errorf("a freeze after the resume: exit %d %q", r.code, r.stderr)
		}
		checkMemory(t, d, id, h)
	}

	// the freeze started inside, on a timer, so that the stop comes while
	// gVisor writes it
	for _, delay := range []time.Duration{1100 * time.Millisecond} {
		id := d.newSandbox(t)
		h := startHolderTiny(t, d, id)
		d.must(t, "exec", "-d", id, "--", "sh", "-c", "touch /tmp/armed; sleep 1; exec "+agent.FreezeCommand+" --reason timer")
		waitFor(t, "the timer to start", 20*time.Second, func() bool { return d.sbx(t, "exec", id, "--", "test", "-e", "/tmp/armed").code == 0 })
		time.Sleep(delay) // tested: a random instant into the timer's freeze
		if stop := d.sbx(t, "stop", id, "--wait"); stop.code != 0 {
			if stop = d.sbx(t, "stop", id, "--wait"); stop.code != 0 {
				t.Fatalf("stop %s: exit %d %q", id, stop.code, stop.stderr)
			}
		}
		if left := slotsLeft(d, id); len(left) != 0 {
			t.Errorf("slots left for the stopped %s: %q", id, left)
		}
		before := memorySnapshots(t, d, id)
		for _, sn := range before {
			cp := d.newSandbox(t, "--from", sn.Name)
			checkMemory(t, d, cp, h)
			d.must(t, "rm", cp)
		}
		d.must(t, "resume", id)
		checkMemory(t, d, id, h)
		rec := freezeRecord(t, d, id)
		var evs []string
		for _, ev := range frozenEvents(t, d, id) {
			evs = append(evs, fmt.Sprintf("%v %v", ev["outcome"], ev["error"]))
		}
		t.Logf("timer, stop after %s: %d freezes recorded before the stop; the record after the resume: %s %s; events %q", delay, len(before), rec.State, rec.Error, evs)
		r := d.sbx(t, "exec", id, "--", agent.FreezeCommand, "--reason", "after the race")
		if r.code != 0 && !strings.Contains(r.stderr, "froze already") && !strings.Contains(r.stderr, "under way") {
			t.Errorf("a freeze after the resume: exit %d %q", r.code, r.stderr)
		}
		checkMemory(t, d, id, h)
	}
	checkConsistent(t, d)
	deleteEverything(t, d)
	checkNoLeaks(t, d)
}

// TestFreezeStaleFileAfterResume: the race TestFreezeAttackDuringStop hits
// by chance, made certain. A process opens gVisor's checkpoint file, the
// sandbox is stopped with its memory and resumed, and only then does the
// process write to the file it opened before. That write must trigger
// nothing (gVisor patch 06: ESTALE): before, it checkpointed the resumed
// boot, whose one freeze was then used by a write sbx never saw, and the
// freeze the agent asked for in the same race read "restore" at once and
// said it was interrupted.
func TestFreezeStaleFileAfterResume(t *testing.T) {
	d := ownDaemon(t)
	id := d.newSandbox(t)
	h := startHolderTiny(t, d, id)
	d.must(t, "exec", "-d", id, "--", "sh", "-c",
		"exec 3>/proc/gvisor/checkpoint; touch /tmp/opened; while [ ! -e /tmp/go ]; do sleep 0.05; done; echo 1 >&3; echo $? > /tmp/rc")
	waitFor(t, "the checkpoint file to be opened", 20*time.Second, func() bool {
		return d.sbx(t, "exec", id, "--", "test", "-e", "/tmp/opened").code == 0
	})
	d.must(t, "stop", id, "--wait")
	d.must(t, "resume", id)
	checkMemory(t, d, id, h)
	d.must(t, "exec", id, "--", "touch", "/tmp/go")
	var rc string
	waitFor(t, "the write on the file opened before the stop", 20*time.Second, func() bool {
		r := d.sbx(t, "exec", id, "--", "cat", "/tmp/rc")
		rc = strings.TrimSpace(r.stdout)
		return r.code == 0 && rc != ""
	})
	if rc == "0" {
		t.Errorf("a write on the checkpoint file opened before the stop was taken after the resume, want refused")
	}
	time.Sleep(time.Second) // had it triggered a checkpoint, gVisor writes it in the background
	// the resumed boot's one freeze is still there, for the freeze command
	name := freezeIn(t, d, id, "root", "--reason", "after the stale write")
	waitSnapshot(t, d, name, 10*time.Second)
	checkMemory(t, d, id, h)
	checkConsistent(t, d)
	deleteEverything(t, d)
	checkNoLeaks(t, d)
}

// TestFreezeAttackNonRoot: a user who is not root freezes like anyone (the
// event names them), but nobody inside can write sbxd's word on it; gVisor's
// file written directly, past /.sbx/freeze, uses the boot's freeze: the
// freeze command says so, and the stop drops the image nobody vouched for.
func TestFreezeAttackNonRoot(t *testing.T) {
	d := ownDaemon(t)
	id := d.newSandbox(t)
	name := freezeIn(t, d, id, "1000", "--reason", "as 1000")
	waitSnapshot(t, d, name, 10*time.Second)
	if ev := frozenEvent(t, d, id); ev["uid"] != float64(1000) || ev["outcome"] != "ok" {
		t.Errorf("frozen event %v, want uid 1000, ok", ev)
	}
	// sbxd's word on freezes is in a dir nothing inside can write, root
	// included (a read-only bind)
	for _, user := range []string{"1000", "root"} {
		r := d.sbx(t, "exec", "-u", user, id, "--", "sh", "-c", "mkdir -p "+freezewire.ConfirmDir+"; echo '{\"result\":\"frozen\",\"name\":\"lie\"}' > "+freezewire.ConfirmDir+"/im_aaaaaaaaaa && echo wrote")
		if r.code == 0 || strings.Contains(r.stdout, "wrote") {
			t.Errorf("a confirmation written as %s: exit %d %q %q, want refused", user, r.code, r.stdout, r.stderr)
		}
	}

	id2 := d.newSandbox(t)
	h := startHolderTiny(t, d, id2)
	direct := d.sbx(t, "exec", "-u", "1000", id2, "--", "sh", "-c", "echo 1 > /proc/gvisor/checkpoint")
	t.Logf("a direct write as 1000: exit %d %q", direct.code, direct.stderr)
	if direct.code == 0 {
		time.Sleep(2 * time.Second) // gVisor writes it in the background
		r := d.sbx(t, "exec", id2, "--", agent.FreezeCommand)
		if r.code != 1 || !strings.Contains(r.stderr, "did not go through") {
			t.Errorf("a freeze after a direct write: exit %d %q, want 1 saying the freeze was used past it", r.code, r.stderr)
		}
		checkMemory(t, d, id2, h)
		d.must(t, "stop", id2, "--wait")
		if sns := memorySnapshots(t, d, id2); len(sns) != 0 {
			t.Errorf("a direct write was recorded: %+v", sns)
		}
		dropped := false
		for _, ev := range frozenEvents(t, d, id2) {
			if e, _ := ev["error"].(string); strings.Contains(e, "freeze dropped") {
				dropped = true
			}
		}
		if !dropped {
			t.Errorf("no event says the unvouched image was dropped: %v", frozenEvents(t, d, id2))
		}
		if left := slotsLeft(d, id2); len(left) != 0 {
			t.Errorf("slots left: %q", left)
		}
		d.must(t, "resume", id2)
		checkMemory(t, d, id2, h)
	}
	freezeIn(t, d, id2, "1000")
	checkConsistent(t, d)
	deleteEverything(t, d)
	checkNoLeaks(t, d)
}

// TestFreezeAttackDiskFull: the disk the freeze slots are on is full: the
// freeze fails, says why inside and in the events, records nothing, leaves
// no partial image, and the sandbox runs on with its memory and network.
func TestFreezeAttackDiskFull(t *testing.T) {
	d := ownDaemon(t)
	root := filepath.Join(d.dir, "freeze")
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size=2m,mode=0700", "sbx-e2e-full", root).CombinedOutput(); err != nil {
		t.Fatalf("mount a small tmpfs on %s: %v %s", root, err, out)
	}
	t.Cleanup(func() { _ = syscall.Unmount(root, syscall.MNT_DETACH) }) // before the daemon's cleanup
	id := d.newSandbox(t)
	h := startHolderTiny(t, d, id)
	r := d.sbx(t, "exec", id, "--", agent.FreezeCommand, "--reason", "full")
	if r.code != 1 || !strings.Contains(r.stderr, "no space left") || !strings.Contains(r.stderr, "nothing was lost") {
		t.Errorf("a freeze onto a full disk: exit %d %q, want 1 saying no space left and nothing lost", r.code, r.stderr)
	}
	var ev map[string]any
	waitFor(t, "the failed freeze's event", 10*time.Second, func() bool {
		evs := frozenEvents(t, d, id)
		if len(evs) > 0 {
			ev = evs[len(evs)-1]
		}
		return ev != nil
	})
	if e, _ := ev["error"].(string); ev["outcome"] != "error" || !strings.Contains(e, "no space left") {
		t.Errorf("frozen event %v, want an error saying no space left", ev)
	}
	if sns := memorySnapshots(t, d, id); len(sns) != 0 {
		t.Errorf("a failed freeze was recorded: %+v", sns)
	}
	if left := slotsLeft(d, id); len(left) != 0 {
		t.Errorf("the failed slot is left: %q", left)
	}
	if rec := freezeRecord(t, d, id); rec.State != agent.FreezeFailed {
		t.Errorf("the sandbox's record %+v, want failed", rec)
	}
	checkMemory(t, d, id, h)
	checkNetwork(t, d, id, false)
	r = d.sbx(t, "exec", id, "--", agent.FreezeCommand)
	if r.code != 1 || !strings.Contains(r.stderr, "tried to freeze already, and failed") {
		t.Errorf("a second freeze in the boot: exit %d %q", r.code, r.stderr)
	}
	checkConsistent(t, d)
	deleteEverything(t, d)
	if err := syscall.Unmount(root, 0); err != nil { // the test's own, not a leak
		t.Errorf("unmount the full disk: %v", err)
	}
	checkNoLeaks(t, d)
}

// TestFreezeSbxdKilled: sbxd dies while a freeze is recorded (after the
// journal entry, after the image is moved) or is down when a sandbox
// freezes: the next sbxd records the freeze, whole, once.
func TestFreezeSbxdKilled(t *testing.T) {
	if testing.Short() {
		t.Skip("long")
	}
	bin := sbxdTestBuild(t)
	for _, point := range []string{"freeze:journaled", "freeze:moved", "down"} {
		t.Run(point, func(t *testing.T) {
			d := ownDaemon(t)
			id := d.newSandbox(t)
			h := startHolderTiny(t, d, id)
			if point == "down" {
				d.must(t, "exec", "-d", id, "--", "sh", "-c", "sleep 1; "+agent.FreezeCommand+" --reason down")
				d.kill(syscall.SIGKILL)
				time.Sleep(4 * time.Second) // it freezes meanwhile
			} else {
				d.kill(syscall.SIGTERM)
				d.bin, d.env = bin, []string{"SBX_TEST_CRASH_AT=" + point}
				if err := d.start(nil); err != nil {
					t.Fatal(err)
				}
				r := d.sbx(t, "exec", id, "--", agent.FreezeCommand, "--reason", point)
				t.Logf("the freeze as sbxd dies: exit %d %q", r.code, r.stderr)
				d.waitExit(t, 60*time.Second)
				d.env = nil
			}
			if err := d.start(nil); err != nil {
				t.Fatal(err)
			}
			if point != "down" {
				if ev := reconciledEvent(t, d, id); ev == nil {
					t.Errorf("no reconciled event after the crash at %s", point)
				} else {
					t.Logf("%s: %v: %v", point, ev["decision"], ev["reason"])
				}
			}
			waitFor(t, "the freeze to be recorded", 20*time.Second, func() bool { return len(memorySnapshots(t, d, id)) > 0 })
			time.Sleep(time.Second) // tested: the window in which a stray record would show
			sns := memorySnapshots(t, d, id)
			if len(sns) != 1 {
				t.Fatalf("%d freezes recorded, want 1: %+v", len(sns), sns)
			}
			if rec := freezeRecord(t, d, id); rec.State != agent.FreezeFrozen || rec.Name != sns[0].Name {
				t.Errorf("the sandbox's record %+v, want frozen as %s", rec, sns[0].Name)
			}
			cp := d.newSandbox(t, "--from", sns[0].Name)
			checkMemory(t, d, cp, h)
			checkMemory(t, d, id, h)
			checkConsistent(t, d)
			deleteEverything(t, d)
			checkNoLeaks(t, d)
		})
	}
}

// TestFreezeAttackStopSweep: a freeze asked from inside at every instant
// of a stop, from before its capture to after it, on a sandbox with 64 MB
// of data to write. However the two meet, the stop succeeds, the sandbox
// resumes whole, and the freeze happens once: before the stop (recorded,
// even when the stop caught init before it told), or, held while sbxd
// captured, after the resume, as a freeze of the new boot. Its command says
// which snapshot, and that snapshot is there; no freeze is dropped.
func TestFreezeAttackStopSweep(t *testing.T) {
	d := ownDaemon(t)
	for delay := time.Duration(0); delay <= 600*time.Millisecond; delay += 50 * time.Millisecond {
		id := d.newSandbox(t)
		h := startHolderTiny(t, d, id)
		d.must(t, "exec", id, "--", "sh", "-c", "head -c 64000000 /dev/urandom > /tmp/big")
		d.must(t, "exec", "-d", id, "--", "sh", "-c", fmt.Sprintf(
			"while ! test -e /tmp/go; do usleep 1000; done; usleep %d; exec %s --reason sweep > /tmp/fr.out 2>&1",
			delay.Microseconds(), agent.FreezeCommand))
		d.must(t, "exec", id, "--", "touch", "/tmp/go")
		if stop := d.sbx(t, "stop", id, "--wait"); stop.code != 0 {
			t.Fatalf("delay %s: stop: exit %d %q", delay, stop.code, stop.stderr)
		}
		if st := d.info(t, id); st.State != api.StateStopped {
			t.Fatalf("delay %s: %s is %s after the stop (%s)", delay, id, st.State, st.Reason)
		}
		d.must(t, "resume", id)
		checkMemory(t, d, id, h)
		var said string
		waitFor(t, "the freeze command to answer", time.Minute, func() bool {
			said = d.sbx(t, "exec", id, "--", "cat", "/tmp/fr.out").stdout
			return strings.TrimSpace(said) != ""
		})
		m := frozeAs.FindStringSubmatch(said)
		if m == nil {
			t.Fatalf("delay %s: the freeze said %q", delay, said)
		}
		if sn, _ := sdk(d.client).GetSnapshot(context.Background(), m[1]); sn == nil {
			// not yet: say what it said, and what sbxd recorded, if it never is
			t.Logf("delay %s: the freeze said %q; its record %s; events:\n%s", delay, said,
				d.sbx(t, "exec", id, "--", "cat", agent.FreezeRecordFile).stdout, d.sbx(t, "events", id).stdout)
		}
		waitSnapshot(t, d, m[1], 10*time.Second)
		if sns := memorySnapshots(t, d, id); len(sns) != 1 || sns[0].Name != m[1] {
			t.Errorf("delay %s: freezes recorded %+v, want %s alone", delay, sns, m[1])
		}
		for _, ev := range frozenEvents(t, d, id) {
			if ev["outcome"] != "ok" {
				t.Errorf("delay %s: a freeze event %v", delay, ev)
			}
		}
		t.Logf("delay %s: %s", delay, strings.TrimSpace(said))
		d.must(t, "rm", "-f", id)
		for _, sn := range memorySnapshots(t, d, id) {
			d.sbx(t, "snapshot", "rm", sn.Name)
		}
	}
}

// TestFreezeAttackSnapshotSweep: a freeze asked from inside at every
// instant of a memory snapshot. The original freezes once and says so;
// gVisor, taking one checkpoint at a time, never writes the two at once,
// and a freeze refused while the snapshot is written is asked again. A
// copy from the snapshot is whole and, a clone of a machine that asked to
// freeze, either tells of the original's freeze or freezes itself, once.
func TestFreezeAttackSnapshotSweep(t *testing.T) {
	d := ownDaemon(t)
	for delay := time.Duration(0); delay <= 500*time.Millisecond; delay += 100 * time.Millisecond {
		id := d.newSandbox(t)
		h := startHolderTiny(t, d, id)
		d.must(t, "exec", id, "--", "sh", "-c", "head -c 64000000 /dev/urandom > /tmp/big")
		d.must(t, "exec", "-d", id, "--", "sh", "-c", fmt.Sprintf(
			"while ! test -e /tmp/go; do usleep 1000; done; usleep %d; exec %s --reason sweep > /tmp/fr.out 2>&1",
			delay.Microseconds(), agent.FreezeCommand))
		snap := fmt.Sprintf("sweep-%d", delay.Milliseconds())
		d.must(t, "exec", id, "--", "touch", "/tmp/go")
		d.must(t, "snapshot", "--memory", id, snap)
		said := func(sb string) string {
			var out string
			waitFor(t, "the freeze command to answer in "+sb, time.Minute, func() bool {
				out = d.sbx(t, "exec", sb, "--", "cat", "/tmp/fr.out").stdout
				return strings.TrimSpace(out) != ""
			})
			return out
		}
		orig := said(id)
		m := frozeAs.FindStringSubmatch(orig)
		if m == nil || !strings.Contains(orig, "froze sandbox "+id) {
			t.Fatalf("delay %s: the original's freeze said %q", delay, orig)
		}
		waitSnapshot(t, d, m[1], 10*time.Second)
		if sns := freezesOf(t, d, id); len(sns) != 1 || sns[0].Name != m[1] {
			t.Errorf("delay %s: the original's freezes %+v, want %s alone", delay, sns, m[1])
		}
		checkMemory(t, d, id, h)

		cp := d.newSandbox(t, "--from", snap)
		checkMemory(t, d, cp, h)
		copySaid := said(cp)
		switch cm := frozeAs.FindStringSubmatch(copySaid); {
		case cm == nil && strings.Contains(copySaid, "the freeze is the original's") && strings.Contains(copySaid, m[1]):
			// taken as the original's freeze ended: it says so, naming it
		case cm == nil:
			t.Errorf("delay %s: the copy's freeze said %q", delay, copySaid)
		case strings.Contains(copySaid, "froze sandbox "+cp):
			waitSnapshot(t, d, cm[1], 10*time.Second)
		case cm[1] != m[1]:
			t.Errorf("delay %s: the copy tells of freeze %s, the original froze as %s", delay, cm[1], m[1])
		}
		if sns := freezesOf(t, d, cp); len(sns) > 1 {
			t.Errorf("delay %s: the copy froze %d times: %+v", delay, len(sns), sns)
		}
		for _, sb := range []string{id, cp} {
			for _, ev := range frozenEvents(t, d, sb) {
				if ev["outcome"] != "ok" {
					t.Errorf("delay %s: a freeze event of %s: %v", delay, sb, ev)
				}
			}
		}
		t.Logf("delay %s: original: %s; copy: %s", delay, strings.TrimSpace(orig), strings.TrimSpace(copySaid))
		for _, sb := range []string{cp, id} {
			sns := memorySnapshots(t, d, sb)
			d.must(t, "rm", "-f", sb)
			for _, sn := range sns {
				d.sbx(t, "snapshot", "rm", sn.Name)
			}
		}
		d.sbx(t, "snapshot", "rm", snap)
	}
}

// freezesOf are the freezes of sandbox id recorded (its memory snapshots
// named by a freeze).
func freezesOf(t *testing.T, d *daemon, id string) []api.Snapshot {
	var out []api.Snapshot
	for _, sn := range memorySnapshots(t, d, id) {
		if strings.HasPrefix(sn.Name, "freeze-") {
			out = append(out, sn)
		}
	}
	return out
}
