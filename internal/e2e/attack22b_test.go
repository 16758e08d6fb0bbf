package e2e

import (
	"context"
	"fmt"
	"math/rand"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"sbx.dev/sbx/internal/agent"
	"sbx.dev/sbx/internal/wire/freezewire"
)

// Hostile tests of issue 22 part 4 (round b): a freeze is recorded on
// gVisor's files alone, and the freeze command claims only what sbxd
// confirmed.

// restores checks that snapshot name is recorded and that a sandbox made
// from it boots and answers.
func restores(t *testing.T, d *daemon, name string) string {
	t.Helper()
	if _, err := sdk(d.client).GetSnapshot(context.Background(), name); err != nil {
		t.Errorf("snapshot %s is not recorded: %v", name, err)
		return ""
	}
	r := d.sbx(t, "new", "--from", name)
	id := strings.TrimSpace(r.stdout)
	if r.code != 0 || !idRE.MatchString(id) {
		t.Errorf("the recorded snapshot %s does not restore: exit %d %q %q", name, r.code, r.stdout, r.stderr)
		return ""
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		_ = deleteSandbox(ctx, d.client, id)
	})
	if r := d.sbx(t, "exec", id, "--", "echo", "alive"); r.code != 0 || !strings.Contains(r.stdout, "alive") {
		t.Errorf("the copy %s of %s does not answer: exit %d %q %q", id, name, r.code, r.stdout, r.stderr)
	}
	return id
}

// TestAttack22bDirectCheckpoint: root inside writes straight to
// /proc/gvisor/checkpoint (no init, no /.sbx/freeze), waits for gVisor to
// finish, then forges a "frozen" verdict with fake crash info and a fake
// requester. Whatever sbxd records must restore; the freeze command after
// it must not claim a snapshot sbxd lacks; the fake crash must not make a
// snapshot that is not gVisor's.
func TestAttack22bDirectCheckpoint(t *testing.T) {
	d := ownDaemon(t)
	id := d.newSandbox(t)
	h := startHolderTiny(t, d, id)
	script := forge(freezewire.Frozen) + `
exec 3<>/proc/gvisor/checkpoint || exit 9
printf 1 >&3
ans=$(head -c 64 <&3)
echo "gvisor said: $ans"
exec 3>&-
slot=$(tr '\0' '\n' < /proc/gvisor/spec_environ | sed -n 's/^SBX_FREEZE_SLOT=//p')
printf '\036sbx-freeze {"slot":"%s","result":"frozen","pid":1,"uid":0,"cmd":"/usr/bin/evil --pwn","reason":"forged","crash":{"signal":"SIGSEGV","tid":1,"faultAddr":"0xdead","ip":"0xbeef","exe":"/sbin/init","count":1}}\n' "$slot" > /proc/1/fd/1
echo forged`
	r := d.sbx(t, "exec", "-u", "root", id, "--", "sh", "-c", script)
	t.Logf("direct checkpoint: exit %d %q %q", r.code, r.stdout, r.stderr)
	if !strings.Contains(r.stdout, "forged") {
		t.Fatalf("the direct checkpoint script did not run through: %q %q", r.stdout, r.stderr)
	}
	time.Sleep(3 * time.Second) // tested: the window in which sbxd, reading verdicts as they come, would record one
	sns := memorySnapshots(t, d, id)
	t.Logf("recorded after a direct checkpoint and a forged verdict: %d snapshots; events %v", len(sns), frozenEvents(t, d, id))
	for _, sn := range sns {
		if cp := restores(t, d, sn.Name); cp != "" {
			checkMemory(t, d, cp, h)
		}
	}
	// the forged crash is the sandbox's word (README: "what the crash says
	// of itself is the sandbox's word"): sbx crashes shows it as a crash
	// caught, on a real (restorable) freeze, though no process crashed
	cr := d.sbx(t, "--json", "crashes", id, "--no-backtrace")
	t.Logf("sbx crashes after a forged crash: %q", cr.stdout)
	// the freeze command in this boot: gVisor's freeze is used
	r = d.sbx(t, "exec", id, "--", agent.FreezeCommand, "--no-hold")
	t.Logf("the freeze command after it: exit %d %q", r.code, r.stderr)
	if m := frozeAs.FindStringSubmatch(r.stderr); m != nil {
		if _, err := sdk(d.client).GetSnapshot(context.Background(), m[1]); err != nil {
			t.Errorf("the freeze command claims %s, which sbxd does not have: %v", m[1], err)
		}
	}
	checkMemory(t, d, id, h)
	if slots := slotsLeft(d, id); len(sns) == 0 && len(slots) > 0 {
		b, _ := os.ReadFile(filepath.Join(slots[0], freezewire.VerdictFile))
		t.Logf("the slot's verdict: %q", b)
	}
	// a stop and resume: the used slot is settled, and a new boot freezes
	d.must(t, "stop", id)
	d.must(t, "resume", id)
	t.Logf("events after the stop: %v", frozenEvents(t, d, id))
	name := freezeIn(t, d, id, "")
	restores(t, d, name)
	checkConsistent(t, d)
	deleteEverything(t, d)
	checkNoLeaks(t, d)
}

// TestAttack22bFakeConfirm: root inside mounts a tmpfs over /run/sbx/etc
// (where sbxd's confirmations appear) and writes a confirmation naming a
// snapshot that does not exist, then freezes. The harm must stay inside:
// sbxd records the real freeze (whole, restorable) and the host's confirm
// dir holds sbxd's word, not the fake. uid 1000, in a user namespace of
// its own, does the same: init's view is untouched, so the command must
// name only a snapshot sbxd has.
func TestAttack22bFakeConfirm(t *testing.T) {
	d := ownDaemon(t)
	id := d.newSandbox(t)
	fake := `slot=$(tr '\0' '\n' < /proc/gvisor/spec_environ | sed -n 's/^SBX_FREEZE_SLOT=//p')
mkdir -p /tmp/fakeetc/freezes && cp -a /run/sbx/etc/. /tmp/fakeetc/ 2>/dev/null
printf '{"result":"frozen","name":"freeze-bogus-0000"}' > /tmp/fakeetc/freezes/$slot
`
	// uid 1000 first: a user and mount namespace of its own
	r := d.sbx(t, "exec", "-u", "1000", id, "--", "sh", "-c", fake+
		`unshare -Urm sh -c 'mount -t tmpfs none /run/sbx/etc && cp -a /tmp/fakeetc/. /run/sbx/etc/ && cat /run/sbx/etc/freezes/*; `+agent.FreezeCommand+` --no-hold; echo "exit $?"' 2>&1`)
	t.Logf("uid 1000 in its own namespaces: exit %d %q %q", r.code, r.stdout, r.stderr)
	all := r.stdout + r.stderr
	if strings.Contains(all, "freeze-bogus-0000") && strings.Contains(all, "as snapshot freeze-bogus-0000") {
		t.Errorf("uid 1000 made the freeze command claim a fake snapshot: %q", all)
	}
	if m := frozeAs.FindStringSubmatch(all); m != nil {
		waitSnapshot(t, d, m[1], 5*time.Second)
		restores(t, d, m[1])
	}
	// root, in init's own mount namespace, in a fresh boot
	d.must(t, "stop", id)
	d.must(t, "resume", id)
	r = d.sbx(t, "exec", "-u", "root", id, "--", "sh", "-c", fake+
		`mount -t tmpfs none /run/sbx/etc && cp -a /tmp/fakeetc/. /run/sbx/etc/ && `+agent.FreezeCommand+` --no-hold; echo "exit $?"`)
	t.Logf("root over /run/sbx/etc: exit %d %q %q", r.code, r.stdout, r.stderr)
	time.Sleep(2 * time.Second) // tested: the window in which sbxd, reading verdicts as they come, would record one
	sns := memorySnapshots(t, d, id)
	for _, sn := range sns {
		restores(t, d, sn.Name)
	}
	if _, err := sdk(d.client).GetSnapshot(context.Background(), "freeze-bogus-0000"); err == nil {
		t.Errorf("sbxd has the fake snapshot freeze-bogus-0000")
	}
	// the host's confirmations are sbxd's own
	confs, _ := filepath.Glob(filepath.Join(d.dir, "sandboxes", id, "etc", freezewire.ConfirmSubdir, "*"))
	for _, c := range confs {
		b, _ := os.ReadFile(c)
		if strings.Contains(string(b), "bogus") {
			t.Errorf("the host's confirmation %s holds the sandbox's fake: %s", c, b)
		}
	}
	checkConsistent(t, d)
	deleteEverything(t, d)
	checkNoLeaks(t, d)
}

// TestAttack22bConsoleNonRoot: uid 1000 looks for any way onto init's
// console (/proc/1/fd/1, /dev/console, /dev/tty, the fds of detached
// execs) to write control lines. If it finds one, its forged lines must
// record nothing and drop no slot, and a real freeze must still work.
func TestAttack22bConsoleNonRoot(t *testing.T) {
	d := ownDaemon(t)
	id := d.newSandbox(t)
	// a detached exec by root: does its stdout reach the console?
	d.must(t, "exec", "-d", "-u", "root", id, "--", "sleep", "600")
	r := d.sbx(t, "exec", "-u", "1000", id, "--", "sh", "-c", forge(freezewire.Failed)+`
for p in /proc/1/fd/1 /proc/1/fd/2 /dev/console /dev/tty /dev/ttyS0; do
  if printf '\036sbx-freeze {"slot":"%s","result":"failed","pid":1,"uid":0}\n' "$slot" 2>/dev/null > $p; then echo "wrote $p"; fi
done
for f in /proc/[0-9]*/fd/1; do
  if printf '\036sbx-freeze {"slot":"%s","result":"failed","pid":2,"uid":0}\n' "$slot" 2>/dev/null > $f; then echo "wrote $f -> $(readlink $f)"; fi
done
echo done`)
	t.Logf("uid 1000 onto the console: %q %q", r.stdout, r.stderr)
	time.Sleep(2 * time.Second) // tested: the window in which sbxd, reading verdicts as they come, would record one
	if left := slotsLeft(d, id); len(left) == 1 {
		if b, err := os.ReadFile(filepath.Join(left[0], freezewire.VerdictFile)); err == nil {
			t.Logf("uid 1000 reached the console: the slot has a verdict %q", b)
		}
	} else {
		t.Errorf("slots after uid 1000's lines: %q, want the boot's one", left)
	}
	if n := len(memorySnapshots(t, d, id)); n != 0 {
		t.Errorf("uid 1000's lines recorded %d snapshots", n)
	}
	name := freezeIn(t, d, id, "1000")
	restores(t, d, name)
	deleteEverything(t, d)
	checkNoLeaks(t, d)
}

// procCPU is pid's user+system CPU time in clock ticks (its waited-for
// children's included: the runsc it runs), and its RSS in kB.
func procCPU(pid int) (int64, int64) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, 0
	}
	s := string(b)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+2:])
	ut, _ := strconv.ParseInt(f[11], 10, 64)
	st, _ := strconv.ParseInt(f[12], 10, 64)
	cut, _ := strconv.ParseInt(f[13], 10, 64)
	cst, _ := strconv.ParseInt(f[14], 10, 64)
	rss, _ := strconv.ParseInt(f[21], 10, 64)
	return ut + st + cut + cst, rss * 4
}

// TestAttack22bDistinctFlood: root in three sandboxes at once floods 20 s
// of distinct verdict lines (each differs, so the shim writes every one
// into the slot and inotify wakes sbxd each time, which looks at the slot:
// runsc state, /proc). sbxd (with the runsc it runs) must keep answering
// quickly, not burn the CPU of the host (2 cores), not grow, and record
// nothing; afterwards a real freeze is recorded and restores.
func TestAttack22bDistinctFlood(t *testing.T) {
	d := ownDaemon(t)
	ids := []string{d.newSandbox(t), d.newSandbox(t), d.newSandbox(t)}
	id := ids[0]
	pid := d.cmd.Process.Pid
	cpu0, rss0 := procCPU(pid)
	t0 := time.Now()
	for _, id := range ids {
		d.must(t, "exec", "-d", "-u", "root", id, "--", "sh", "-c", forge(freezewire.Frozen)+
			`end=$(( $(date +%s) + 20 )); i=0; while [ $(date +%s) -lt $end ]; do forge $i; forge $i$i; i=$((i+1)); done; echo $i > /tmp/flooded`)
	}
	var worst time.Duration
	for time.Since(t0) < 21*time.Second {
		s := time.Now()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		_, err := d.client.Health(ctx)
		cancel()
		if err != nil {
			t.Errorf("sbxd during the flood: %v", err)
		}
		worst = max(worst, time.Since(s))
		time.Sleep(500 * time.Millisecond) // pacing: a probe of sbxd every half second of the flood
	}
	waitFor(t, "the flood to end", 20*time.Second, func() bool {
		return d.sbx(t, "exec", id, "--", "test", "-f", "/tmp/flooded").code == 0
	})
	wall := time.Since(t0)
	cpu1, rss1 := procCPU(pid)
	lines := d.sbx(t, "exec", id, "--", "cat", "/tmp/flooded").stdout
	share := float64(cpu1-cpu0) / 100 / wall.Seconds()
	t.Logf("flood of %s line pairs in %s: sbxd CPU %.0f%% of one core, RSS %d -> %d kB, slowest health %s",
		strings.TrimSpace(lines), wall.Round(time.Second), 100*share, rss0, rss1, worst)
	if worst > 2*time.Second {
		t.Errorf("sbxd took %s to answer during a flood of verdicts", worst)
	}
	if share > 1 {
		t.Errorf("floods of forged verdicts in three sandboxes made sbxd (and its runsc) use %.0f%% of a core", 100*share)
	}
	if rss1-rss0 > 64<<10 {
		t.Errorf("sbxd grew by %d kB in a flood", rss1-rss0)
	}
	if n := len(memorySnapshots(t, d, id)); n != 0 {
		t.Errorf("the flood recorded %d snapshots", n)
	}
	name := freezeIn(t, d, id, "")
	restores(t, d, name)
	deleteEverything(t, d)
	checkNoLeaks(t, d)
}

// TestAttack22bKillAnyInstant: sbxd is SIGKILLed at a random instant of a
// freeze (0-2.5 s after it is asked, while forged lines race it), then
// restarted. Every freeze snapshot sbxd records restores; a freeze command
// that said "froze as X" names a recorded X; nothing leaks.
func TestAttack22bKillAnyInstant(t *testing.T) {
	d := ownDaemon(t)
	rng := rand.New(rand.NewSource(time.Now().UnixNano()))
	for i := 0; i < 4; i++ {
		id := d.newSandbox(t)
		out := "/tmp/freeze.out"
		d.must(t, "exec", "-d", "-u", "root", id, "--", "sh", "-c", forge(freezewire.Frozen)+
			`(j=0; while [ $j -lt 200 ]; do forge $j; j=$((j+1)); done) & dd if=/dev/urandom of=/dev/shm/junk bs=1M count=40 2>/dev/null; `+
			agent.FreezeCommand+` --no-hold > `+out+` 2>&1; echo "exit $?" >> `+out)
		delay := time.Duration(rng.Intn(2500)) * time.Millisecond
		time.Sleep(delay) // tested: a random instant into the freeze, sbxd killed
		d.kill(syscall.SIGKILL)
		time.Sleep(time.Duration(rng.Intn(1500)) * time.Millisecond) // tested: a random instant, sbxd down
		if err := d.start(nil); err != nil {
			t.Fatal(err)
		}
		var said string
		waitFor(t, "the freeze command to end", 60*time.Second, func() bool {
			said = d.sbx(t, "exec", id, "--", "cat", out).stdout
			return strings.Contains(said, "exit ")
		})
		time.Sleep(2 * time.Second) // tested: the window in which a stray record would show
		sns := memorySnapshots(t, d, id)
		t.Logf("round %d, killed %s in: the command said %q; recorded %d", i, delay, said, len(sns))
		if m := frozeAs.FindStringSubmatch(said); m != nil {
			if _, err := sdk(d.client).GetSnapshot(context.Background(), m[1]); err != nil {
				t.Errorf("round %d: the command said it froze as %s, sbxd has no such snapshot", i, m[1])
			}
		}
		for _, sn := range sns {
			restores(t, d, sn.Name)
		}
	}
	checkConsistent(t, d)
	deleteEverything(t, d)
	checkNoLeaks(t, d)
}

// TestAttack22bBigRaceDelete: a sandbox with 300 MB of random data in
// memory freezes while root forges "frozen" lines all along; sbx delete,
// and in other boots sbx stop, come at instants swept across the freeze.
// A delete must leave no slot; a stop must not record a partial freeze;
// every recorded freeze restores; a stopped sandbox resumes with its data.
func TestAttack22bBigRaceDelete(t *testing.T) {
	d := ownDaemon(t)
	fill := `dd if=/dev/urandom of=/dev/shm/big bs=1M count=300 2>/dev/null; du -k /dev/shm/big`
	race := forge(freezewire.Frozen) + `(while :; do forge $$; done) & ` + agent.FreezeCommand + ` --no-hold > /tmp/fr.out 2>&1; echo "exit $?" >> /tmp/fr.out; kill $!`
	newBig := func() string {
		id := d.newSandbox(t, "--memory", "1G")
		if r := d.sbx(t, "exec", "-u", "root", id, "--", "sh", "-c", fill); !strings.Contains(r.stdout, "big") {
			t.Fatalf("fill: %q %q", r.stdout, r.stderr)
		}
		return id
	}

	// a complete freeze of a big sandbox, raced by forged lines
	id := newBig()
	s := time.Now()
	r := d.sbx(t, "exec", "-u", "root", id, "--", "sh", "-c", race+"; cat /tmp/fr.out")
	t.Logf("a 300 MB freeze in %s: %q", time.Since(s).Round(time.Millisecond), r.stdout)
	if m := frozeAs.FindStringSubmatch(r.stdout); m != nil {
		sn := waitSnapshot(t, d, m[1], 5*time.Second)
		t.Logf("its size: %d MB", sn.Size>>20)
		restores(t, d, m[1])
	} else {
		t.Errorf("a big freeze raced by forged lines: %q %q, want frozen", r.stdout, r.stderr)
	}

	for i, delay := range []time.Duration{50 * time.Millisecond, 200 * time.Millisecond, 400 * time.Millisecond} {
		for _, op := range []string{"delete", "stop"} {
			id := newBig()
			d.must(t, "exec", "-d", "-u", "root", id, "--", "sh", "-c", race)
			time.Sleep(delay) // tested: a random instant into the freeze
			r := d.sbx(t, op, id)
			if r.code != 0 {
				t.Errorf("%s %s mid-freeze: exit %d %q %q", op, delay, r.code, r.stdout, r.stderr)
			}
			time.Sleep(1500 * time.Millisecond) // tested: the window in which a stray record would show
			sns := memorySnapshots(t, d, id)
			t.Logf("round %d: %s %s into a freeze: %d freezes recorded, events %v", i, op, delay, len(sns), frozenEvents(t, d, id))
			for _, sn := range sns {
				restores(t, d, sn.Name)
			}
			if op == "delete" {
				if left := slotsLeft(d, id); len(left) != 0 {
					t.Errorf("a delete mid-freeze left slots %q", left)
				}
				continue
			}
			d.must(t, "resume", id)
			if r := d.sbx(t, "exec", id, "--", "sh", "-c", "du -k /dev/shm/big; cat /tmp/fr.out"); r.code != 0 {
				t.Errorf("after a stop mid-freeze, the sandbox lost its memory: %q %q", r.stdout, r.stderr)
			} else {
				t.Logf("the resumed sandbox: %q", r.stdout)
				if m := frozeAs.FindStringSubmatch(r.stdout); m != nil {
					if _, err := sdk(d.client).GetSnapshot(context.Background(), m[1]); err != nil {
						t.Errorf("the freeze command said it froze as %s; sbxd has no such snapshot", m[1])
					}
				}
			}
			_ = deleteSandbox(context.Background(), d.client, id)
		}
	}
	checkConsistent(t, d)
	deleteEverything(t, d)
	checkNoLeaks(t, d)
}

// TestAttack22bFreezeOtherFS: DATA_DIR/freeze is its own file system (a
// tmpfs, as an operator may mount it), big enough for a small freeze but
// not a large one: the small freeze's move into its image is a copy across
// file systems (moveDir's EXDEV path); the snapshot must restore and the
// tmpfs be left empty. A large freeze then runs out of room: it must fail,
// record nothing, and leave nothing in the tmpfs. (About one run in four
// the 200 MB freeze runs out of room in gVisor's state file rather than its
// pages, and fails as TestAttack22bFreezeNoSpaceSweep does, always.)
func TestAttack22bFreezeOtherFS(t *testing.T) {
	d := ownDaemon(t)
	root := filepath.Join(d.dir, "freeze")
	_ = os.MkdirAll(root, 0o700)
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size=120m,mode=0700", "sbx-e2e-attack22b", root).CombinedOutput(); err != nil {
		t.Fatalf("mount: %v %s", err, out)
	}
	t.Cleanup(func() { _ = syscall.Unmount(root, syscall.MNT_DETACH) })
	id := d.newSandbox(t, "--memory", "1G")
	h := startHolderTiny(t, d, id)
	name := freezeIn(t, d, id, "")
	if cp := restores(t, d, name); cp != "" {
		checkMemory(t, d, cp, h)
	}
	du := func() string {
		out, _ := exec.Command("sh", "-c", "du -sk "+root+"; find "+root+" -type f | head").CombinedOutput()
		return string(out)
	}
	t.Logf("the tmpfs after a small freeze: %s", du())

	id2 := d.newSandbox(t, "--memory", "1G")
	d.must(t, "exec", "-u", "root", id2, "--", "sh", "-c", "dd if=/dev/urandom of=/dev/shm/big bs=1M count=200 2>/dev/null")
	r := d.sbx(t, "exec", id2, "--", agent.FreezeCommand, "--no-hold")
	t.Logf("a freeze bigger than its tmpfs: exit %d %q", r.code, r.stderr)
	if m := frozeAs.FindStringSubmatch(r.stderr); m != nil {
		t.Errorf("a freeze bigger than the disk said it froze as %s", m[1])
		restores(t, d, m[1])
	}
	time.Sleep(2 * time.Second) // tested: the window in which sbxd, reading verdicts as they come, would record one
	if n := len(memorySnapshots(t, d, id2)); n != 0 {
		t.Errorf("a freeze bigger than the disk recorded %d snapshots", n)
	}
	if rec := freezeRecord(t, d, id2); rec.State != agent.FreezeFailed {
		t.Errorf("the sandbox's record of a freeze bigger than its disk: %+v, want failed", rec)
	}
	evs := frozenEvents(t, d, id2)
	t.Logf("its events: %v", evs)
	if len(evs) != 1 || evs[0]["outcome"] != "error" {
		t.Errorf("a freeze bigger than its disk: events %v, want one failed freeze", evs)
	}
	for _, sl := range slotsLeft(d, id2) {
		head, _ := exec.Command("sh", "-c", "head -c 200 "+sl+"/checkpoint.img | od -c | head -5; ls -la "+sl).CombinedOutput()
		t.Errorf("the failed freeze's slot is left, %s: %s", sl, head)
		fds, _ := exec.Command("sh", "-c", "for f in /proc/[0-9]*/fd/*; do l=$(readlink $f); case $l in *"+filepath.Base(sl)+"*) p=${f#/proc/}; p=${p%%/*}; echo \"$f -> $l ($(tr '\\0' ' ' < /proc/$p/cmdline | head -c 120))\";; esac; done 2>/dev/null").CombinedOutput()
		t.Logf("processes holding it: %s", fds)
	}
	t.Logf("the tmpfs after a failed freeze: %s", du())
	if r := d.sbx(t, "exec", id2, "--", "ls", "/dev/shm/big"); r.code != 0 {
		t.Errorf("the sandbox did not run on after a failed freeze: %q", r.stderr)
	}
	deleteEverything(t, d)
	var fs syscall.Statfs_t
	if err := syscall.Statfs(root, &fs); err == nil && fs.Blocks-fs.Bfree > 16 {
		t.Errorf("the freeze tmpfs holds %d kB after everything was deleted: %s", (fs.Blocks-fs.Bfree)*uint64(fs.Bsize)/1024, du())
	}
	if err := syscall.Unmount(root, 0); err != nil {
		t.Errorf("unmount: %v", err)
	}
	checkNoLeaks(t, d)
	_ = fmt.Sprint
}

// TestAttack22bFreezeNoSpaceSweep: DATA_DIR/freeze is a small tmpfs, and
// before each freeze the host leaves it only N MB free (N swept from 0 to
// past what a tiny sandbox's freeze needs), so that gVisor runs out of
// room at every point of its write: the pages, the state file, its final
// flush. Each freeze either is recorded and restores, or fails: sbxd then
// records the failure (a frozen event with an error), confirms it to the
// sandbox (whose command says gVisor's reason), and removes the slot's
// files, all while the sandbox runs on.
func TestAttack22bFreezeNoSpaceSweep(t *testing.T) {
	d := ownDaemon(t)
	root := filepath.Join(d.dir, "freeze")
	_ = os.MkdirAll(root, 0o700)
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size=48m,mode=0700", "sbx-e2e-attack22b", root).CombinedOutput(); err != nil {
		t.Fatalf("mount: %v %s", err, out)
	}
	t.Cleanup(func() { _ = syscall.Unmount(root, syscall.MNT_DETACH) })
	filler := filepath.Join(root, "filler")
	for _, freeKB := range []int{512, 2048, 4096, 6144} {
		id := d.newSandbox(t)
		_ = os.Remove(filler)
		var fs syscall.Statfs_t
		if err := syscall.Statfs(root, &fs); err != nil {
			t.Fatal(err)
		}
		fill := int64(fs.Bavail)*fs.Bsize - int64(freeKB)<<10
		if out, err := exec.Command("fallocate", "-l", strconv.FormatInt(fill, 10), filler).CombinedOutput(); err != nil {
			t.Fatalf("fallocate: %v %s", err, out)
		}
		r := d.sbx(t, "exec", id, "--", agent.FreezeCommand, "--no-hold")
		m := frozeAs.FindStringSubmatch(r.stderr)
		t.Logf("%d kB free: exit %d %q", freeKB, r.code, r.stderr)
		_ = os.Remove(filler)
		if m != nil {
			restores(t, d, m[1])
			continue
		}
		if len(r.stderr) > 600 {
			t.Errorf("%d kB free: the freeze's error is %d bytes (%.80q...): want the cause, not gVisor's dump", freeKB, len(r.stderr), r.stderr)
		}
		if !strings.Contains(r.stderr, "no space left") {
			t.Errorf("%d kB free: the failed freeze's command does not say why (sbxd did not confirm it): %q", freeKB, r.stderr)
		}
		var evs []map[string]any
		for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(200 * time.Millisecond) {
			if evs = frozenEvents(t, d, id); len(evs) > 0 {
				break
			}
		}
		if len(evs) != 1 || evs[0]["outcome"] != "error" {
			t.Errorf("%d kB free: frozen events %v 10 s after the freeze failed, want one failure", freeKB, evs)
		}
		if left := slotsLeft(d, id); len(left) != 0 {
			held, _ := exec.Command("sh", "-c", "ls -l /proc/[0-9]*/fd/ 2>/dev/null | grep "+filepath.Base(left[0])+" | sort -u | head -3; ls -l "+left[0]+"; head -c 120 "+left[0]+"/checkpoint.img").CombinedOutput()
			t.Errorf("%d kB free: the failed freeze's slot is still there, held by the sandbox's process: %s", freeKB, held)
			if freeKB == 512 {
				// sbxd's own capture of the boot whose failed slot is held
				if r := d.sbx(t, "snapshot", id, "a22b-held", "--memory"); r.code != 0 {
					t.Errorf("a memory snapshot of a sandbox with a held failed slot: %q %q", r.stdout, r.stderr)
				} else {
					restores(t, d, "a22b-held")
				}
			}
			// what the stop makes of it
			d.must(t, "stop", id)
			time.Sleep(2 * time.Second) // the log below says what the stop made of it a while later (a log, no check)
			t.Logf("%d kB free: after a stop, the events say %v; slots %q", freeKB, frozenEvents(t, d, id), slotsLeft(d, id))
			d.must(t, "resume", id)
			t.Logf("%d kB free: after a resume, the events say %v; slots %q", freeKB, frozenEvents(t, d, id), slotsLeft(d, id))
			if freeKB == 512 {
				restores(t, d, freezeIn(t, d, id, "")) // room again: the new boot freezes
			}
		}
		if len(slotsLeft(d, id)) == 0 && len(evs) > 0 {
			if r := d.sbx(t, "exec", id, "--", "echo", "alive"); !strings.Contains(r.stdout, "alive") {
				t.Errorf("%d kB free: the sandbox did not run on: %q", freeKB, r.stderr)
			}
		}
		_ = deleteSandbox(context.Background(), d.client, id)
	}
	deleteEverything(t, d)
	if err := syscall.Unmount(root, 0); err != nil {
		t.Errorf("unmount: %v", err)
	}
	checkNoLeaks(t, d)
}

// TestAttack22bForgeEveryBoot: in every kind of boot (a fresh sandbox, a
// resume after stop, a copy from a memory snapshot, a memory fork, a disk
// fork) root forges "failed" and then "frozen" verdicts for the boot's
// armed slot before any freeze: sbxd must record nothing and drop no slot
// (gVisor's files must be seen as held in each kind of boot), and the real
// freeze after it must be recorded and restore.
func TestAttack22bForgeEveryBoot(t *testing.T) {
	d := ownDaemon(t)
	base := d.newSandbox(t)
	d.must(t, "snapshot", base, "a22b-mem", "--memory")
	boots := map[string]func() string{
		"fresh": func() string { return d.newSandbox(t) },
		"resume": func() string {
			id := d.newSandbox(t)
			d.must(t, "stop", id)
			d.must(t, "resume", id)
			return id
		},
		"from-memory-snapshot": func() string { return d.newSandbox(t, "--from", "a22b-mem") },
		"memory-fork": func() string {
			out := d.must(t, "fork", base, "--memory", "--wait")
			return strings.Fields(out)[0]
		},
		"disk-fork": func() string {
			out := d.must(t, "fork", base, "--wait")
			return strings.Fields(out)[0]
		},
	}
	for _, kind := range []string{"fresh", "resume", "from-memory-snapshot", "memory-fork", "disk-fork"} {
		id := boots[kind]()
		if !idRE.MatchString(id) {
			t.Fatalf("%s: %q is not an id", kind, id)
		}
		r := d.sbx(t, "exec", "-u", "root", id, "--", "sh", "-c", forge(freezewire.Failed)+`forge 7; sleep 1; `+forge(freezewire.Frozen)+`forge 8; echo forged`)
		if !strings.Contains(r.stdout, "forged") {
			t.Fatalf("%s: forge: %q %q", kind, r.stdout, r.stderr)
		}
		time.Sleep(1500 * time.Millisecond) // tested: the window in which sbxd, reading verdicts as they come, would record one
		if left := slotsLeft(d, id); len(left) != 1 {
			t.Errorf("%s: forged verdicts left slots %q, want the boot's armed one", kind, left)
		}
		if evs := frozenEvents(t, d, id); len(evs) != 0 {
			t.Errorf("%s: forged verdicts made events %v", kind, evs)
		}
		r = d.sbx(t, "exec", id, "--", agent.FreezeCommand, "--no-hold")
		m := frozeAs.FindStringSubmatch(r.stderr)
		if m == nil {
			t.Errorf("%s: the real freeze after forged verdicts: exit %d %q", kind, r.code, r.stderr)
			continue
		}
		restores(t, d, m[1])
		_ = deleteSandbox(context.Background(), d.client, id)
	}
	checkConsistent(t, d)
	deleteEverything(t, d)
	checkNoLeaks(t, d)
}

// TestAttack22bCaptureRace: a 150 MB sandbox freezes, with root forging
// "frozen" lines all along, while sbxd takes a memory snapshot or a memory
// fork of it at instants swept across the freeze. Whatever the meeting:
// the capture succeeds and restores, the freeze is recorded at most once
// and restores, the original's command names only a recorded snapshot,
// and the copies' freeze records claim nothing sbxd lacks.
func TestAttack22bCaptureRace(t *testing.T) {
	d := ownDaemon(t)
	race := forge(freezewire.Frozen) + `dd if=/dev/urandom of=/dev/shm/big bs=1M count=150 2>/dev/null; touch /tmp/filled; sleep 0.3; (while :; do forge $$; done) & ` +
		agent.FreezeCommand + ` --no-hold > /tmp/fr.out 2>&1; echo "exit $?" >> /tmp/fr.out; kill $!`
	claimed := func(what, out string) {
		if m := frozeAs.FindStringSubmatch(out); m != nil {
			if _, err := sdk(d.client).GetSnapshot(context.Background(), m[1]); err != nil {
				t.Errorf("%s: the freeze command said it froze as %s; sbxd has no such snapshot", what, m[1])
			}
		}
	}
	n := 0
	for _, delay := range []time.Duration{0, 150 * time.Millisecond, 350 * time.Millisecond} {
		for _, op := range []string{"snapshot", "fork"} {
			n++
			what := fmt.Sprintf("%s %s into a freeze", op, delay)
			id := d.newSandbox(t, "--memory", "1G")
			d.must(t, "exec", "-d", "-u", "root", id, "--", "sh", "-c", race)
			waitFor(t, "the fill", 30*time.Second, func() bool { return d.sbx(t, "exec", id, "--", "test", "-f", "/tmp/filled").code == 0 })
			time.Sleep(300*time.Millisecond + delay) // tested: a random instant into the freeze
			var copyID string
			if op == "snapshot" {
				name := fmt.Sprintf("a22b-race-%d", n)
				if r := d.sbx(t, "snapshot", id, name, "--memory"); r.code != 0 {
					t.Errorf("%s: the snapshot failed: %q %q", what, r.stdout, r.stderr)
					continue
				}
				copyID = restores(t, d, name)
			} else {
				r := d.sbx(t, "fork", id, "--memory", "--wait")
				if r.code != 0 {
					t.Errorf("%s: the fork failed: %q %q", what, r.stdout, r.stderr)
					continue
				}
				copyID = strings.Fields(r.stdout)[0]
			}
			var said string
			waitFor(t, "the original's freeze command", 60*time.Second, func() bool {
				said = d.sbx(t, "exec", id, "--", "cat", "/tmp/fr.out").stdout
				return strings.Contains(said, "exit ")
			})
			time.Sleep(time.Second) // tested: the window in which a stray record would show
			sns := memorySnapshots(t, d, id)
			var freezes []string
			for _, sn := range sns {
				if strings.HasPrefix(sn.Name, "freeze-") {
					freezes = append(freezes, sn.Name)
				}
			}
			t.Logf("%s: the original said %q; freezes recorded %v", what, said, freezes)
			claimed(what+" (original)", said)
			if len(freezes) > 1 {
				t.Errorf("%s: %d freezes recorded for one boot: %v", what, len(freezes), freezes)
			}
			for _, f := range freezes {
				restores(t, d, f)
			}
			if copyID != "" {
				var cs string
				for i := 0; i < 40; i++ {
					cs = d.sbx(t, "exec", copyID, "--", "sh", "-c", "cat /tmp/fr.out 2>/dev/null; "+agent.FreezeCommand+" --status").stdout
					if !strings.Contains(cs, `"freezing"`) {
						break
					}
					time.Sleep(500 * time.Millisecond) // the poll's interval
				}
				t.Logf("%s: the copy says %q", what, cs)
				claimed(what+" (copy)", cs)
				_ = deleteSandbox(context.Background(), d.client, copyID)
			}
			_ = deleteSandbox(context.Background(), d.client, id)
		}
	}
	checkConsistent(t, d)
	deleteEverything(t, d)
	checkNoLeaks(t, d)
}

// TestAttack22bRestartMidWrite: sbxd is SIGKILLed as soon as gVisor starts
// writing a 500 MB freeze (the slot's pages file growing on the host), with
// forged "frozen" lines racing it, and started again at once: the new sbxd
// must record the freeze whole, once, and confirm it. (gVisor writes 500 MB
// in ~0.3 s here, so the write ends while sbxd is down; holding gVisor
// mid-write with SIGSTOP instead made the restarted sbxd never serve, as its
// start waits on the stopped sandbox: a host-side act, not an attack from
// inside, so it is not a test here.) Also a freeze in a
// sandbox that was running across a plain sbxd restart. Each must be
// recorded, confirmed to the freeze command, and restore.
func TestAttack22bRestartMidWrite(t *testing.T) {
	d := ownDaemon(t)
	// across a restart
	id := d.newSandbox(t)
	d.kill(syscall.SIGKILL)
	if err := d.start(nil); err != nil {
		t.Fatal(err)
	}
	name := freezeIn(t, d, id, "")
	restores(t, d, name)

	id2 := d.newSandbox(t, "--memory", "1500M")
	d.must(t, "exec", "-u", "root", id2, "--", "sh", "-c", "dd if=/dev/urandom of=/dev/shm/big bs=1M count=500 2>/dev/null")
	slots := slotsLeft(d, id2)
	if len(slots) != 1 {
		t.Fatalf("slots %q", slots)
	}
	pages := filepath.Join(slots[0], freezewire.PagesFile)
	d.must(t, "exec", "-d", "-u", "root", id2, "--", "sh", "-c", forge(freezewire.Frozen)+
		`(while :; do forge $$; sleep 0.05; done) & `+agent.FreezeCommand+` --no-hold > /tmp/fr.out 2>&1; echo "exit $?" >> /tmp/fr.out; kill $!`)
	waitFor(t, "gVisor to start writing", 20*time.Second, func() bool {
		fi, err := os.Stat(pages)
		return err == nil && fi.Size() > 0
	})
	var written int64
	if fi, err := os.Stat(pages); err == nil {
		written = fi.Size()
	}
	d.kill(syscall.SIGKILL)
	s := time.Now()
	if err := d.start(nil); err != nil {
		t.Fatal(err)
	}
	fi2, _ := os.Stat(pages)
	var sz2 int64
	if fi2 != nil {
		sz2 = fi2.Size()
	}
	t.Logf("killed with %d MB of pages written; back in %s with %d MB", written>>20, time.Since(s).Round(time.Millisecond), sz2>>20)
	var said string
	waitFor(t, "the freeze command", 60*time.Second, func() bool {
		said = d.sbx(t, "exec", id2, "--", "cat", "/tmp/fr.out").stdout
		return strings.Contains(said, "exit ")
	})
	t.Logf("the freeze command said %q", said)
	m := frozeAs.FindStringSubmatch(said)
	if m == nil {
		t.Errorf("a freeze that sbxd restarted in the middle of: %q, want it confirmed", said)
		time.Sleep(5 * time.Second) // diagnosis of a failure: what 5 s settle
		t.Logf("5 s later: snapshots %v, events %v, slots %q, record %+v", memorySnapshots(t, d, id2), frozenEvents(t, d, id2), slotsLeft(d, id2), freezeRecord(t, d, id2))
	} else {
		restores(t, d, m[1])
	}
	for _, sn := range memorySnapshots(t, d, id2) {
		restores(t, d, sn.Name)
	}
	checkConsistent(t, d)
	deleteEverything(t, d)
	checkNoLeaks(t, d)
}

// TestAttack22bForgeAfterCapture: sbxd captures a running sandbox (a memory
// snapshot, a memory fork, a disk snapshot), which goes on in the same
// boot with its slot still armed; then root forges "failed" and "frozen"
// verdicts for that slot. The captures must not have made gVisor let the
// slot's files go (else a forged line reads as a finished, failed freeze
// and the slot is dropped): nothing recorded, the slot still armed, and
// the real freeze after it is recorded and restores.
func TestAttack22bForgeAfterCapture(t *testing.T) {
	d := ownDaemon(t)
	id := d.newSandbox(t)
	h := startHolderTiny(t, d, id)
	d.must(t, "snapshot", id, "a22b-cap-mem", "--memory")
	d.must(t, "fork", id, "--memory", "--wait")
	d.must(t, "snapshot", id, "a22b-cap-disk")
	r := d.sbx(t, "exec", "-u", "root", id, "--", "sh", "-c", forge(freezewire.Failed)+`forge 7; sleep 1; `+forge(freezewire.Frozen)+`forge 8; echo forged`)
	if !strings.Contains(r.stdout, "forged") {
		t.Fatalf("forge: %q %q", r.stdout, r.stderr)
	}
	time.Sleep(1500 * time.Millisecond) // tested: the window in which sbxd, reading verdicts as they come, would record one
	if left := slotsLeft(d, id); len(left) != 1 {
		t.Errorf("forged verdicts after captures left slots %q, want the boot's armed one", left)
	}
	if evs := frozenEvents(t, d, id); len(evs) != 0 {
		t.Errorf("forged verdicts after captures made events %v", evs)
	}
	r = d.sbx(t, "exec", id, "--", agent.FreezeCommand, "--no-hold")
	if m := frozeAs.FindStringSubmatch(r.stderr); m == nil {
		t.Errorf("the real freeze after captures and forged verdicts: exit %d %q", r.code, r.stderr)
	} else if cp := restores(t, d, m[1]); cp != "" {
		checkMemory(t, d, cp, h)
	}
	checkConsistent(t, d)
	deleteEverything(t, d)
	checkNoLeaks(t, d)
}

// TestAttack22bForgedTimes: root writes gVisor's checkpoint straight and
// forges the verdict with extreme times (triggered in year 1, done in year
// 9999, failedAt in year 0): sbxd records it (gVisor's image is whole),
// and everything that shows it must still work: the snapshot's info and
// list, the sandbox's events (with follow), the sandbox's info, a restore.
func TestAttack22bForgedTimes(t *testing.T) {
	d := ownDaemon(t)
	id := d.newSandbox(t)
	script := `exec 3<>/proc/gvisor/checkpoint || exit 9
printf 1 >&3
head -c 64 <&3 >/dev/null
exec 3>&-
slot=$(tr '\0' '\n' < /proc/gvisor/spec_environ | sed -n 's/^SBX_FREEZE_SLOT=//p')
printf '\036sbx-freeze {"slot":"%s","result":"frozen","pid":-5,"uid":-1,"failedAt":"0000-01-01T00:00:00Z","triggered":"0001-01-01T00:00:00Z","done":"9999-12-31T23:59:59.999999999Z"}\n' "$slot" > /proc/1/fd/1
echo forged`
	if r := d.sbx(t, "exec", "-u", "root", id, "--", "sh", "-c", script); !strings.Contains(r.stdout, "forged") {
		t.Fatalf("forge: %q %q", r.stdout, r.stderr)
	}
	time.Sleep(3 * time.Second) // tested: the window in which sbxd, reading verdicts as they come, would record one
	sns := memorySnapshots(t, d, id)
	t.Logf("recorded: %+v", sns)
	for _, args := range [][]string{{"snapshot", "ls"}, {"--json", "snapshot", "ls"}, {"events", id}, {"--json", "events", id}, {"info", id}, {"ls"}, {"--json", "crashes", id, "--no-backtrace"}} {
		r := d.sbx(t, args...)
		if r.code != 0 {
			t.Errorf("sbx %v after forged times: exit %d %q", args, r.code, r.stderr)
		}
	}
	for _, sn := range sns {
		t.Logf("snapshot %s paused %s created %s", sn.Name, sn.Paused, sn.CreatedAt)
		if r := d.sbx(t, "snapshot", "info", sn.Name); r.code != 0 {
			t.Errorf("sbx snapshot info %s: exit %d %q", sn.Name, r.code, r.stderr)
		} else {
			t.Logf("info: %s", r.stdout)
		}
		restores(t, d, sn.Name)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	if _, err := d.client.Health(ctx); err != nil {
		t.Errorf("sbxd after forged times: %v", err)
	}
	cancel()
	checkConsistent(t, d)
	deleteEverything(t, d)
	checkNoLeaks(t, d)
}
