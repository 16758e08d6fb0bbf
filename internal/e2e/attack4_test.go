package e2e

// Attacks on f068f95: init's "settle" of an exec whose start was cut off
// (an exec reported lost never runs afterwards), hunt --keep-ttl 0 and its
// meta for --attach, a hunt refusing an earlier hunt's leftovers, and
// fork --ttl 0.

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"sbx.dev/sbx/api"
	"sbx.dev/sbx/internal/flaky"
)

// a4Ghost is the command an exec caught in its start runs: it leaves a
// mark each time it runs.
const a4Ghost = "echo ran >> /tmp/ghost; echo ghost-ran"

// a4Cont continues init (SIGSTOPped) from a terminal, which does not go
// through init.
func a4Cont(t *testing.T, d *daemon, id string) {
	t.Helper()
	r := a3Sbx(t, d, time.Minute, "kill -CONT 1; exit\n", "shell", "-u", "root", id)
	t.Logf("kill -CONT 1 from a terminal: exit %d %q", r.code, r.stderr)
}

// a4GhostRuns counts the marks a4Ghost left, 3 s after init was continued
// (time for a start still queued at init to run).
func a4GhostRuns(t *testing.T, d *daemon, id string) (int, string) {
	t.Helper()
	time.Sleep(3 * time.Second) // tested: the window in which a queued start would run after all
	g := a3Sbx(t, d, time.Minute, "", "exec", id, "--", "cat", "/tmp/ghost")
	return strings.Count(g.stdout, "ran"), g.stdout
}

// a4Exec waits (bounded) until exec execID of id is no longer running and
// returns it (nil if it still runs).
func a4Exec(t *testing.T, d *daemon, id, execID string, limit time.Duration) *api.Exec {
	t.Helper()
	deadline := time.Now().Add(limit)
	for {
		x, err := sdk(d.client).GetExec(context.Background(), id, execID)
		if err == nil && x.State != api.ExecRunning {
			return x
		}
		if time.Now().After(deadline) {
			return nil
		}
		time.Sleep(200 * time.Millisecond)
	}
}

func a4Code(x *api.Exec) int {
	if x == nil || x.ExitCode == nil {
		return -1
	}
	return *x.ExitCode
}

// TestAttack4StartTimeoutGhost: root inside SIGSTOPs init for longer than
// an exec's start waits for init's answer (30 s). sbx then reports the
// exec failed (exit 125, "start ...: read reply from init: i/o timeout").
// Expectation: an exec sbx reports failed without running never runs
// afterwards; once init is continued, the command must not run (or, if
// it does, sbx must have reported it running, and its real exit).
func TestAttack4StartTimeoutGhost(t *testing.T) {
	d := shared
	id := d.newSandbox(t, "--template", "tiny")
	if r := a3Sbx(t, d, 30*time.Second, "", "exec", "--detach", id, "--", "sh", "-c", "sleep 0.5; kill -STOP 1"); r.code != 0 {
		t.Fatalf("kill -STOP 1: exit %d %q %q", r.code, r.stdout, r.stderr)
	}
	time.Sleep(1500 * time.Millisecond) // init is stopped by now (0.5 s into the exec): nothing outside shows it
	r := a3Sbx(t, d, time.Minute, "", "exec", "--detach", id, "--", "sh", "-c", a4Ghost)
	f := strings.Fields(r.stdout)
	if r.code != 0 || len(f) == 0 {
		a4Cont(t, d, id)
		t.Fatalf("exec --detach with init stopped: exit %d %q %q", r.code, r.stdout, r.stderr)
	}
	ghost := f[0]
	x := a4Exec(t, d, id, ghost, 90*time.Second)
	if x != nil && x.EndedAt != nil {
		t.Logf("the exec whose start init did not answer: state %s exit %d, ended %s after it started", x.State, a4Code(x), x.EndedAt.Sub(x.StartedAt).Round(time.Millisecond))
	}
	logs := d.sbx(t, "logs", id, "--exec", ghost)
	t.Logf("its output: %q %q", logs.stdout, logs.stderr)
	a4Cont(t, d, id)
	if x == nil {
		x = a4Exec(t, d, id, ghost, time.Minute)
	}
	ran, marks := a4GhostRuns(t, d, id)
	switch {
	case x != nil && a4Code(x) == 0 && ran == 1:
	case x != nil && a4Code(x) != 0 && ran == 0:
	default:
		t.Errorf("exec %s, its start not answered by init for 30 s: sbx reported exit %d (output %q %q), and the command ran %d times after init was continued (/tmp/ghost %q): want it failed and never run, or run once and reported so",
			ghost, a4Code(x), logs.stdout, logs.stderr, ran, marks)
	}
	if r := a3Sbx(t, d, time.Minute, "", "exec", id, "--", "echo", "after"); r.code != 0 || r.stdout != "after\n" {
		t.Errorf("an exec after init was continued: exit %d %q %q", r.code, r.stdout, r.stderr)
	}
}

// a4Flooder, run as a detached exec before the stop, SIGSTOPs init, waits
// for the next exec's start (a new `sbx-agent start`) to queue its request
// at init, then fills init's accept queue (any process can: connecting
// needs no privilege) and holds the connections. It says how many it made
// in /tmp/flood.
const a4Flooder = `
import os, signal, socket, time
def copiers():
    out = set()
    for p in os.listdir('/proc'):
        if not p.isdigit():
            continue
        try:
            c = open('/proc/%s/cmdline' % p, 'rb').read().split(b'\0')
        except Exception:
            continue
        if len(c) > 1 and c[0].endswith(b'sbx-agent') and c[1] == b'start':
            out.add(p)
    return out
time.sleep(0.5)
known = copiers()
os.kill(1, signal.SIGSTOP)
while not (copiers() - known):
    time.sleep(0.02)
time.sleep(1.5)
socks = []
err = ''
while len(socks) < 5000:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        s.connect('\0sbx-agent')
    except OSError as e:
        err = str(e)
        break
    socks.append(s)
open('/tmp/flood', 'w').write('flooded %d %s\n' % (len(socks), err))
while True:
    time.sleep(3600)
`

// TestAttack4SettleBacklogGhost: settle asks init again only when the ask
// times out. With init SIGSTOPped and its accept queue full (any process
// in the sandbox can fill it), the ask fails at once (EAGAIN), and the
// exec caught at the stop is followed without being settled. Expectation:
// the exec caught at the stop gets a true answer after the resume: told
// it failed (not found, lost), the command must never run, even once
// init is continued; told it ran, it ran once. Without the exec channel:
// the queue is that of init's socket for copier processes (over the
// channel, init's own goroutine serves the start: TestAttack4StartTimeoutGhost).
func TestAttack4SettleBacklogGhost(t *testing.T) {
	d := shimShared(t)
	id := d.newSandbox(t, "--template", "base")
	if r := a3Sbx(t, d, time.Minute, "", "exec", "--detach", "-u", "0", id, "--", "python3", "-c", a4Flooder); r.code != 0 {
		t.Fatalf("the flooder: exit %d %q %q", r.code, r.stdout, r.stderr)
	}
	time.Sleep(2 * time.Second) // init is stopped by now
	wedged := make(chan result, 1)
	go func() {
		wedged <- a3Sbx(t, d, 5*time.Minute, "", "exec", "--timeout", "0", id, "--", "sh", "-c", a4Ghost)
	}()
	flood := ""
	deadline := time.Now().Add(90 * time.Second)
	for time.Now().Before(deadline) {
		r := a3Sbx(t, d, time.Minute, "cat /tmp/flood; exit\n", "shell", "-u", "root", id)
		if m := regexp.MustCompile(`flooded (\d+)[^\r\n]*`).FindString(r.stdout); m != "" {
			flood = m
			break
		}
		time.Sleep(time.Second)
	}
	t.Logf("the flooder: %q", flood)
	if flood == "" {
		a4Cont(t, d, id)
		t.Fatal("the flooder did not fill init's queue in 90 s")
	}
	t0 := time.Now()
	r := a3Sbx(t, d, 2*time.Minute, "", "stop", "--wait", id)
	t.Logf("the stop took %s: exit %d %q", time.Since(t0).Round(time.Millisecond), r.code, r.stderr)
	if r.code != 0 {
		a4Cont(t, d, id)
		t.Fatalf("stop with init stopped and its queue full: exit %d %q %q", r.code, r.stdout, r.stderr)
	}
	if r := a3Sbx(t, d, 2*time.Minute, "", "resume", "--require-memory", id); r.code != 0 {
		t.Fatalf("resume: exit %d %q", r.code, r.stderr)
	}
	var w result
	answered := false
	select {
	case w = <-wedged:
		answered = true
		t.Logf("the exec caught at the stop, before init was continued: exit %d %q %q", w.code, w.stdout, w.stderr)
	case <-time.After(45 * time.Second):
		t.Logf("the exec caught at the stop has no answer 45 s after the resume (init still stopped)")
	}
	a4Cont(t, d, id)
	if !answered {
		select {
		case w = <-wedged:
		case <-time.After(3 * time.Minute):
			t.Fatalf("the client of the exec caught at the stop has no answer 3 min after init was continued")
		}
		t.Logf("the exec caught at the stop: exit %d %q %q", w.code, w.stdout, w.stderr)
	}
	ran, marks := a4GhostRuns(t, d, id)
	switch {
	case w.code == 0 && w.stdout == "ghost-ran\n" && ran == 1:
	case w.code != 0 && ran == 0:
	default:
		t.Errorf("the exec caught at the stop (init SIGSTOPped, its queue full): its client got exit %d %q %q, and the command ran %d times once init was continued (/tmp/ghost %q): want it failed and never run, or run once and reported so",
			w.code, w.stdout, w.stderr, ran, marks)
	}
	if r := a3Sbx(t, d, time.Minute, "", "exec", id, "--", "echo", "after"); r.code != 0 || r.stdout != "after\n" {
		t.Errorf("an exec after init was continued: exit %d %q %q", r.code, r.stdout, r.stderr)
	}
}

// TestAttack4SettleRunningWiped: a command init started and still runs,
// whose records under /run/sbx/execs are gone (a cleanup of /run, as
// entrypoints and tmpfiles do), is caught by a stop; after the resume sbxd
// re-attaches, and settle finds no pid file. Expectation: a command that
// init started and that runs is never reported "never reached init ... it
// did not run, and will not": init knows it (its table of running
// commands); its real exit code (7), or lost, is the truth.
func TestAttack4SettleRunningWiped(t *testing.T) {
	d := shared
	id := d.newSandbox(t, "--template", "tiny")
	f := strings.Fields(d.must(t, "exec", "--detach", id, "--", "sh", "-c", "sleep 8; echo ran > /tmp/marker; exit 7"))
	if len(f) == 0 {
		t.Fatal("no exec id")
	}
	x := f[0]
	d.must(t, "exec", id, "--", "rm", "-rf", "/run/sbx/execs/"+x)
	d.must(t, "stop", "--wait", id)
	d.must(t, "resume", "--require-memory", id)
	e := a4Exec(t, d, id, x, time.Minute)
	if e == nil {
		t.Fatalf("exec %s still running a minute after the resume", x)
	}
	// the command sleeps 8 s: wait for it to have ended before looking
	marker := ""
	for end := time.Now().Add(30 * time.Second); time.Now().Before(end) && marker == ""; time.Sleep(time.Second) {
		marker = d.sbx(t, "exec", id, "--", "cat", "/tmp/marker").stdout
	}
	logs := d.sbx(t, "logs", id, "--exec", x)
	t.Logf("the exec: state %s exit %d; output %q %q; /tmp/marker %q", e.State, a4Code(e), logs.stdout, logs.stderr, marker)
	said := logs.stdout + logs.stderr
	if marker == "ran\n" && (strings.Contains(said, "never reached init") || a4Code(e) == 125) {
		t.Errorf("exec %s, started by init and running at the stop (its records removed): reported exit %d %q, though it ran (and exited 7): want exit 7, or lost", x, a4Code(e), said)
	}
}

// a4Fork forks id with args and returns the child's ttl, deleting it when
// the test ends.
func a4Fork(t *testing.T, d *daemon, id string, args ...string) (string, result) {
	t.Helper()
	r := d.sbx(t, append([]string{"--json", "fork", id, "--wait"}, args...)...)
	var child string
	sc := bufio.NewScanner(strings.NewReader(r.stdout))
	for sc.Scan() {
		var l struct{ Event, ID string }
		if json.Unmarshal(sc.Bytes(), &l) == nil && l.ID != "" {
			child = l.ID
		}
	}
	if child == "" {
		return "", r
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		_ = deleteSandbox(ctx, d.client, child)
	})
	if r.code != 0 {
		return "", r
	}
	if ttl := d.info(t, child).TTL; ttl != 0 {
		return ttl.String(), r
	}
	return "", r
}

// TestAttack4ForkTTL: `sbx fork --ttl` as users write it. Expectation: not
// given is the parent's; 0 in any spelling (0, 0s, 0.0, 0m) is no ttl, for
// disk and memory forks alike; bare seconds are seconds; a negative one is
// refused (usage, exit 2) and makes nothing.
func TestAttack4ForkTTL(t *testing.T) {
	d := shared
	id := d.newSandbox(t, "--template", "tiny", "--ttl", "1h")
	for _, c := range []struct {
		args []string
		want string
	}{
		{nil, "1h0m0s"},
		{[]string{"--ttl", "0"}, ""},
		{[]string{"--ttl", "0s"}, ""},
		{[]string{"--ttl", "0.0"}, ""},
		{[]string{"--ttl", "0m"}, ""},
		{[]string{"--ttl", "90"}, "1m30s"},
		{[]string{"--memory", "--ttl", "0"}, ""},
		{[]string{"--memory"}, "1h0m0s"},
	} {
		ttl, r := a4Fork(t, d, id, c.args...)
		if r.code != 0 || ttl != c.want {
			t.Errorf("fork %v of a sandbox with a 1h ttl: exit %d, the child's ttl %q, want %q (%q)", c.args, r.code, ttl, c.want, r.stderr)
		}
	}
	before := len(d.list(t))
	for _, v := range []string{"-5", "-1s", "soon"} {
		if r := d.sbx(t, "fork", id, "--ttl", v); r.code != 2 {
			t.Errorf("fork --ttl %s: exit %d %q %q, want 2 (a bad flag value)", v, r.code, r.stdout, r.stderr)
		}
	}
	if after := len(d.list(t)); after != before {
		t.Errorf("refused forks made sandboxes (%d, then %d)", before, after)
	}
}

// TestAttack4HuntNameTaken: the name of a hunt is that of a snapshot the
// user has (unrelated), or NAME-fork is a sandbox of theirs. Expectation:
// the hunt is refused before it makes anything (exit 1, naming what is in
// the way), and what the user had is untouched.
func TestAttack4HuntNameTaken(t *testing.T) {
	d := shared
	ctx := context.Background()
	id := d.newSandbox(t, "--template", "tiny")
	name := "a4-taken-" + randHex(2)
	d.must(t, "snapshot", id, name)
	t.Cleanup(func() { _ = d.client.DeleteSnapshot(context.Background(), name) })
	other := "a4-other-" + randHex(2)
	d.newSandbox(t, "--template", "tiny", "--name", other+"-fork")
	for _, c := range []struct{ name, inWay string }{{name, "snapshot " + name}, {other, other + "-fork"}} {
		before := len(d.list(t))
		r := d.sbxDir(t, t.TempDir(), "hunt", "--template", "tiny", "--runs", "1", "--name", c.name, "--", "false")
		if r.code != 1 || !strings.Contains(r.stderr, c.inWay) {
			t.Errorf("hunt --name %s with %s there: exit %d %q %q, want exit 1 naming it", c.name, c.inWay, r.code, r.stdout, r.stderr)
		}
		if after := len(d.list(t)); after != before {
			t.Errorf("the refused hunt %s made a sandbox (%d, then %d)", c.name, before, after)
			_ = sdk(d.client).Delete(ctx, c.name)
		}
	}
	if sn, err := sdk(d.client).GetSnapshot(ctx, name); err != nil || sn.SandboxID != id {
		t.Errorf("the user's snapshot %s after the refused hunt: %+v %v, want it of %s", name, sn, err, id)
	}
	if sb, err := sdk(d.client).Get(ctx, other+"-fork"); err != nil || sb.State != api.StateReady {
		t.Errorf("the user's sandbox %s-fork after the refused hunt: %+v %v, want it ready", other, sb, err)
	}
}

// TestAttack4FlakeRateKeepForever: flake-rate --keep-failures --keep-ttl 0
// of a sandbox with a 1h ttl. Expectation: the failures kept have no ttl
// at all (not 2h, not the parent's 1h), are ready and carry the failure's
// memory; the passing forks are gone.
func TestAttack4FlakeRateKeepForever(t *testing.T) {
	d := shared
	parent := d.newSandbox(t, "--template", "tiny", "--ttl", "1h")
	before := sandboxIDs(t, d)
	r := d.sbx(t, "--json", "flake-rate", parent, "-n", "8", "--parallel", "4", "--keep-failures", "--keep-ttl", "0", "--", "sh", "-c", seedTest)
	if r.code != 0 {
		t.Fatalf("flake-rate: exit %d %q", r.code, r.stderr)
	}
	f := parseFlakeRate(t, r.stdout)
	t.Cleanup(func() {
		for _, id := range f.summary.Kept {
			_ = deleteSandbox(context.Background(), d.client, id)
		}
	})
	if len(f.summary.Kept) == 0 {
		t.Skipf("no run failed in 8 (%d failures); nothing kept to look at", f.summary.Failures)
	}
	for _, k := range f.summary.Kept {
		sb := d.info(t, k)
		if sb.TTL != 0 || sb.State != api.StateReady || !sb.MemoryRestored {
			t.Errorf("kept %s (--keep-ttl 0): ttl %q state %s memory %v, want no ttl, ready, with the failure's memory", k, sb.TTL, sb.State, sb.MemoryRestored)
		}
	}
	if got := len(sandboxIDs(t, d)); got != len(before)+len(f.summary.Kept) {
		t.Errorf("sandboxes after: %d, want the %d before and the %d kept", got, len(before), len(f.summary.Kept))
	}
}

// TestAttack4HuntAttachMetaKeepTTL: `sbx hunt --attach` reads the frozen
// copy's ttl from the sandbox's meta sbx.hunt.keepTTL, which users can set
// (`sbx new --meta`) and forks inherit. A hunt is laid out by hand (its
// records, a memory snapshot as its freeze, a loop that says frozen) with
// odd values there. Expectation: a value hunt cannot use as a ttl
// (negative, not a duration) is ignored (the default 2h), or none; never
// the reason the frozen copy cannot be made (the capture would never
// finish); a huge one is kept as it is.
func TestAttack4HuntAttachMetaKeepTTL(t *testing.T) {
	d := shared
	ctx := context.Background()
	for _, c := range []struct {
		meta string
		want []string // acceptable ttls of the copy
	}{
		{"-5s", []string{"2h0m0s", ""}},
		{"soon", []string{"2h0m0s"}},
		{"-1ns", []string{"2h0m0s", ""}},
		{"2000000h", []string{"2000000h0m0s"}},
	} {
		t.Run(c.meta, func(t *testing.T) {
			name := "a4-meta-" + randHex(2)
			frozen := "freeze-" + name + "-a4"
			frozenHuntCleanup(t, d, name, &frozen)
			d.must(t, "new", "--template", "tiny", "--name", name, "--meta", "sbx.hunt.keepTTL="+c.meta)
			rec := fmt.Sprintf(`{"state":"frozen","name":%q}`, frozen)
			d.must(t, "exec", name, "--", "sh", "-c", fmt.Sprintf("mkdir -p %s && printf 'run=1\\nseed=1\\nexit=1\\ntime=1700000000.5\\n' > %s/failed && echo '%s' > %s/frozen", flaky.HuntDir, flaky.HuntDir, rec, flaky.HuntDir))
			d.must(t, "snapshot", name, frozen, "--memory")
			if r := d.sbx(t, "exec", name, "--", "sh", "-c", fmt.Sprintf("echo 'sbx-hunt: frozen %s'; exit 6", frozen), "loop", flaky.HuntDir+"/hunt.json"); r.code != 6 {
				t.Fatalf("the loop, laid out: exit %d %q %q", r.code, r.stdout, r.stderr)
			}
			dir := t.TempDir()
			r := d.sbxDir(t, dir, "--json", "hunt", "--attach", name, "--out", filepath.Join(dir, "out"))
			t.Logf("hunt --attach: exit %d\n%s\n%s", r.code, r.stdout, r.stderr)
			sb, err := sdk(d.client).Get(ctx, name+"-frozen")
			if err != nil {
				t.Errorf("meta sbx.hunt.keepTTL=%s: hunt --attach made no copy (%v): exit %d %q; want the meta ignored if unusable", c.meta, err, r.code, strings.TrimSpace(r.stderr))
				return
			}
			ttl := ""
			if sb.TTL != 0 {
				ttl = sb.TTL.String()
			}
			if !slicesContain(c.want, ttl) {
				t.Errorf("meta sbx.hunt.keepTTL=%s: the copy's ttl %q, want one of %q", c.meta, sb.TTL, c.want)
			}
		})
	}
}

// TestAttack4SettlePrunedGhost: init's answer to a settle is a record on
// disk (an exit file) that a late spawn of the id refuses on. But init
// prunes ended execs' records past 256, oldest first, and that record is
// an ended exec's. An exec whose start is wedged at init (its user lookup
// reads a FIFO) is caught by a stop; after the resume it is settled and
// reported "did not run, and will not"; the sandbox then runs 300 short
// execs (a test suite would); then init is unwedged. Expectation: the
// exec reported never to run never runs.
func TestAttack4SettlePrunedGhost(t *testing.T) {
	d := shared
	ctx := context.Background()
	id := d.newSandbox(t, "--template", "tiny")
	a3Wedge(t, d, id)
	unwedged := false
	t.Cleanup(func() {
		if !unwedged {
			a3Unwedge(t, d, id)
		}
	})
	wedged := make(chan result, 1)
	go func() {
		wedged <- a3Sbx(t, d, 4*time.Minute, "", "exec", "--timeout", "0", "-u", "0", id, "--", "sh", "-c", a4Ghost)
	}()
	time.Sleep(1500 * time.Millisecond) // the exec has reached init's queue: with init stopped nothing shows when
	d.must(t, "stop", "--wait", id)
	d.must(t, "resume", "--require-memory", id)
	var w result
	select {
	case w = <-wedged:
	case <-time.After(90 * time.Second):
		t.Fatal("the exec caught at the stop has no answer 90 s after the resume")
	}
	t.Logf("the exec caught at the stop: exit %d %q %q", w.code, w.stdout, w.stderr)
	// 300 execs, 4 at a time
	sem := make(chan struct{}, 4)
	errs := make(chan error, 300)
	for i := 0; i < 300; i++ {
		sem <- struct{}{}
		go func() {
			defer func() { <-sem }()
			x, err := sdk(d.client).Exec(ctx, id, api.ExecRequest{Cmd: []string{"true"}}, io.Discard, io.Discard)
			if err == nil && (x.ExitCode == nil || *x.ExitCode != 0) {
				err = fmt.Errorf("exit %v", exitOf(x))
			}
			errs <- err
		}()
	}
	failed := 0
	for i := 0; i < 300; i++ {
		if err := <-errs; err != nil {
			failed++
			if failed == 1 {
				t.Logf("an exec of the 300: %v", err)
			}
		}
	}
	t.Logf("%d of the 300 execs failed", failed)
	a3Unwedge(t, d, id)
	unwedged = true
	ran, marks := a4GhostRuns(t, d, id)
	switch {
	case w.code == 0 && w.stdout == "ghost-ran\n" && ran == 1:
	case w.code != 0 && ran == 0:
	default:
		t.Errorf("the exec wedged at init at the stop: its client got exit %d %q %q, and after 300 more execs and init unwedged the command ran %d times (/tmp/ghost %q): want it failed and never run, or run once and reported so",
			w.code, w.stdout, w.stderr, ran, marks)
	}
}
