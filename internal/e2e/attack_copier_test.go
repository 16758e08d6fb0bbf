package e2e

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"sbx.dev/sbx/api"
)

// Attacks on the exec copier that sleeps on an inotify watch of its exec's
// directory (internal/agent/outwatch.go), on the kill sweep at a timeout
// that now kills what it stopped at its 5 s deadline (killUnder), and on
// the exec channel's paced pings: output lost, late, duplicated or
// reordered, exit codes wrong, timed-out processes left, execs hung.

// copierLine is one line of an exec's output and when the client got it.
type copierLine struct {
	stream, text string
	at           time.Time
}

// copierExec runs req in id in the foreground, noting when each line of
// its output reaches the client, and when its end does.
// copierRun is what copierExec returned, from copierExecAsync.
type copierRun struct {
	lines []copierLine
	x     *api.Exec
	err   error
}

// copierExecAsync runs copierExec in the background, for a test that
// attacks the sandbox meanwhile; its one result comes on the channel.
func copierExecAsync(t *testing.T, d *daemon, id string, req api.ExecRequest, limit time.Duration) <-chan copierRun {
	done := make(chan copierRun, 1)
	go func() {
		lines, x, _, err := copierExec(t, d, id, req, limit)
		done <- copierRun{lines, x, err}
	}()
	return done
}

func copierExec(t *testing.T, d *daemon, id string, req api.ExecRequest, limit time.Duration) ([]copierLine, *api.Exec, time.Time, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), limit)
	defer cancel()
	var mu sync.Mutex
	var lines []copierLine
	var exitAt time.Time
	partial := map[string]string{}
	x, err := sdk(d.client).ExecEvents(ctx, id, req, func(ev api.ExecEvent) error {
		now := time.Now()
		mu.Lock()
		defer mu.Unlock()
		switch ev.Event {
		case "stdout", "stderr":
			s := partial[ev.Event] + string(ev.Data)
			for {
				i := strings.IndexByte(s, '\n')
				if i < 0 {
					break
				}
				lines = append(lines, copierLine{ev.Event, s[:i], now})
				s = s[i+1:]
			}
			partial[ev.Event] = s
		case "exit":
			exitAt = now
		}
		return nil
	})
	mu.Lock()
	defer mu.Unlock()
	if exitAt.IsZero() {
		exitAt = time.Now()
	}
	for stream, s := range partial {
		if s != "" {
			lines = append(lines, copierLine{stream, s, exitAt})
		}
	}
	return lines, x, exitAt, err
}

// stampLatency is how late a line holding a UnixNano stamp (date +%s%N
// inside: the sandbox reads the host's clock) reached the client.
func stampLatency(l copierLine) (time.Duration, time.Time, bool) {
	ns, err := strconv.ParseInt(strings.TrimSpace(l.text), 10, 64)
	if err != nil {
		return 0, time.Time{}, false
	}
	ts := time.Unix(0, ns)
	return l.at.Sub(ts), ts, true
}

func exitCodeOf(x *api.Exec) int {
	if x == nil || x.ExitCode == nil {
		return -1
	}
	return *x.ExitCode
}

// TestAttackCopierLatencyQuiet: a command quiet for 0.8 s between lines
// (long enough for the copier's sleeps to back off to their 500 ms bound)
// prints a time stamp each time, then one on stderr, and exits 5. Over the
// exec channel (init's copier) and through a copier process (sbxd
// --exec-channel=false). Want: every line once, in order, none more than
// a second late, and the exit at once; and, as the copier is said to be
// woken by inotify at each write, most lines well under the backed-off
// 500 ms (a copier that only woke on its timer would average 250 ms).
func TestAttackCopierLatencyQuiet(t *testing.T) {
	for _, c := range []struct {
		name string
		d    func(t *testing.T) *daemon
	}{
		{"channel", func(*testing.T) *daemon { return shared }},
		{"copier-process", func(t *testing.T) *daemon { return shimShared(t) }},
	} {
		t.Run(c.name, func(t *testing.T) {
			d := c.d(t)
			id := d.newSandbox(t, "--template", "base")
			if c.name == "channel" {
				channelReady(t, d, id)
			}
			script := `for i in 1 2 3 4 5 6 7 8; do sleep 0.8; date +%s%N; done; sleep 0.8; date +%s%N >&2; exit 5`
			lines, x, exitAt, err := copierExec(t, d, id, api.ExecRequest{Cmd: []string{"sh", "-c", script}, Timeout: api.Duration(time.Minute)}, 90*time.Second)
			if err != nil {
				t.Fatalf("exec: %v", err)
			}
			if code := exitCodeOf(x); code != 5 {
				t.Errorf("exit %d, want 5", code)
			}
			var lats []time.Duration
			var last time.Time
			nOut, nErr := 0, 0
			var lastErrStamp time.Time
			for _, l := range lines {
				lat, ts, ok := stampLatency(l)
				if !ok {
					t.Errorf("a %s line that is no stamp: %q", l.stream, l.text)
					continue
				}
				if ts.Before(last) {
					t.Errorf("stamps out of order: %v after %v", ts, last)
				}
				last = ts
				if l.stream == "stdout" {
					nOut++
				} else {
					nErr++
					lastErrStamp = ts
				}
				lats = append(lats, lat)
				if lat > time.Second {
					t.Errorf("a %s line written at %s reached the client %v later (more than a second)", l.stream, ts.Format("15:04:05.000"), lat.Round(time.Millisecond))
				}
			}
			if nOut != 8 || nErr != 1 {
				t.Errorf("%d stdout and %d stderr lines, want 8 and 1: %+v", nOut, nErr, lines)
			}
			if !lastErrStamp.IsZero() {
				if late := exitAt.Sub(lastErrStamp); late > time.Second {
					t.Errorf("the exit reached the client %v after the command's last line", late.Round(time.Millisecond))
				}
			}
			sorted := append([]time.Duration(nil), lats...)
			sort.Slice(sorted, func(i, j int) bool { return sorted[i] < sorted[j] })
			t.Logf("latencies: %v", lats)
			if len(sorted) > 0 {
				if med := sorted[len(sorted)/2]; med > 300*time.Millisecond {
					t.Errorf("median latency of a line after 0.8 s of quiet is %v: the copier is not woken by the write (its watch), only by its timer", med.Round(time.Millisecond))
				}
			}
		})
	}
}

// TestAttackCopierFloodThenExit: commands that write fast and end at once,
// their last bytes written in the instant before the end: a flood of
// stdout then exit; stdout and stderr interleaved and a SIGKILL of
// itself after an unterminated last write; one write of a megabyte then
// _exit. Foreground and detached (then read with logs and attach), over
// the channel and through a copier process. Want every byte once, in
// order, and the exit code.
func TestAttackCopierFloodThenExit(t *testing.T) {
	var outB, errB strings.Builder
	for i := 0; i < 3000; i++ {
		fmt.Fprintf(&outB, "o%d\n", i)
		fmt.Fprintf(&errB, "e%d\n", i)
	}
	outB.WriteString("last")
	cases := []struct {
		name      string
		cmd       []string
		out, errs string
		code      int
	}{
		{"seq then exit", []string{"sh", "-c", "seq 1 300000; exit 3"}, seqText(300000), "", 3},
		{"interleaved then SIGKILL", []string{"sh", "-c", `i=0; while [ $i -lt 3000 ]; do echo o$i; echo e$i >&2; i=$((i+1)); done; printf last; kill -9 $$`}, outB.String(), errB.String(), 137},
		{"one write then _exit", []string{"python3", "-c", `import os; os.write(1, b"x"*1000000); os.write(2, b"y"*7); os._exit(9)`}, strings.Repeat("x", 1000000), "yyyyyyy", 9},
	}
	for _, c := range []struct {
		name string
		d    func(t *testing.T) *daemon
	}{
		{"channel", func(*testing.T) *daemon { return shared }},
		{"copier-process", func(t *testing.T) *daemon { return shimShared(t) }},
	} {
		t.Run(c.name, func(t *testing.T) {
			d := c.d(t)
			id := d.newSandbox(t, "--template", "base")
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
			defer cancel()
			for _, k := range cases {
				var out, errs bytes.Buffer
				x, err := sdk(d.client).Exec(ctx, id, api.ExecRequest{Cmd: k.cmd, Timeout: api.Duration(time.Minute)}, &out, &errs)
				if err != nil {
					t.Errorf("%s: %v", k.name, err)
					continue
				}
				if code := exitCodeOf(x); code != k.code || out.String() != k.out || errs.String() != k.errs {
					t.Errorf("%s (foreground): exit %d (want %d), stdout %d bytes (want %d, equal %v, first difference at %d), stderr %d bytes (want %d, equal %v, tail %q)",
						k.name, code, k.code, out.Len(), len(k.out), out.String() == k.out, firstDiff(out.String(), k.out), errs.Len(), len(k.errs), errs.String() == k.errs, tail(errs.String()))
				}
				// detached: the same bytes kept with the sandbox
				dx, err := sdk(d.client).ExecDetached(ctx, id, api.ExecRequest{Cmd: k.cmd, Detach: true})
				if err != nil {
					t.Errorf("%s detached: %v", k.name, err)
					continue
				}
				out.Reset()
				errs.Reset()
				e, err := sdk(d.client).ExecOutput(ctx, id, dx.ID, true, &out, &errs)
				if err != nil || exitCodeOf(e) != k.code || out.String() != k.out || errs.String() != k.errs {
					t.Errorf("%s (detached, followed): err %v, exit %d (want %d), stdout %d bytes (want %d, first difference at %d), stderr %d bytes (want %d)",
						k.name, err, exitCodeOf(e), k.code, out.Len(), len(k.out), firstDiff(out.String(), k.out), errs.Len(), len(k.errs))
				}
				// attach shows stdout and stderr together, as a terminal would
				r, hung := sbxWithin(t, d, time.Minute, "attach", id, dx.ID, "--from", "start")
				if hung || r.code != k.code || len(r.stdout) != len(k.out)+len(k.errs) || (k.errs == "" && r.stdout != k.out) {
					t.Errorf("%s: sbx attach --from start after its end: hung=%v exit %d (want %d), output %d bytes (want %d), stderr %q",
						k.name, hung, r.code, k.code, len(r.stdout), len(k.out)+len(k.errs), tail(r.stderr))
				}
			}
		})
	}
}

// initInotify counts the inotify descriptors init (the agent, pid 1) holds:
// one for crashes, and one for each copier it runs over the exec channel
// (the counting exec's own included: it is counted over the channel).
func initInotify(t *testing.T, d *daemon, id string) int {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for {
		r := d.sbx(t, "exec", "--user", "root", id, "--", "sh", "-c", "ls -l /proc/1/fd | grep -c inotify")
		n, err := strconv.Atoi(strings.TrimSpace(r.stdout))
		if err != nil {
			t.Fatalf("counting init's inotify descriptors: %+v", r)
		}
		if viaChannel(d, id, lastExec(t, d, id).ID) || time.Now().After(deadline) {
			return n
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// TestAttackCopierStaleAfterCaptures: a quiet detached command runs while
// its sandbox is captured four times with its memory, running on. Each
// capture closes the channel connection init's copier writes to, and sbxd
// attaches a new copier; the old one, whose command says nothing, never
// wrote, so never learned its connection was gone: it kept its watch, its
// descriptors and its timer (it looks every 500 ms and checks the process
// every second) until the command ended, however long that was. Now its
// failed alive frame ends it. Want: within 8 s of the captures, init
// copies the quiet exec once (as many watches as before them), and the
// exec still runs and ends whole.
func TestAttackCopierStaleAfterCaptures(t *testing.T) {
	d := shared
	id := d.newSandbox(t, "--template", "tiny")
	channelReady(t, d, id)
	ex := detach(t, d, id, "sh", "-c", "while [ ! -e /tmp/wake ]; do sleep 0.2; done; echo woke; exit 4")
	waitFor(t, "the quiet exec over the channel", 10*time.Second, func() bool { return viaChannel(d, id, ex) })
	before := initInotify(t, d, id)
	for i := 0; i < 4; i++ {
		snap := fmt.Sprintf("stale%d-%s", i, randHex(3))
		d.must(t, "snapshot", id, snap, "--memory")
		t.Cleanup(func() { d.sbx(t, "snapshot", "rm", snap) })
		time.Sleep(time.Second)
	}
	channelSoon(t, d, id, 10*time.Second)
	// a cut-off copier learns it is cut off at its next alive frame (every
	// 5 s, frame.AliveEvery), whose write fails, and ends then
	var after int
	pollUntil(8*time.Second, func() bool {
		after = initInotify(t, d, id)
		return after <= before
	})
	t.Logf("init's inotify descriptors: %d before the captures, %d after four", before, after)
	if after > before {
		t.Errorf("after four memory snapshots init holds %d inotify watches, %d before (its crash watch, the quiet exec's copier, the counting exec's): "+
			"the copiers the captures cut off still run, each waking every 500 ms until the command ends", after, before)
	}
	d.must(t, "exec", id, "--", "touch", "/tmp/wake")
	var out, errs bytes.Buffer
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	e, err := sdk(d.client).ExecOutput(ctx, id, ex, true, &out, &errs)
	if err != nil || exitCodeOf(e) != 4 || out.String() != "woke\n" {
		t.Errorf("the quiet exec after four captures: err %v, exit %d, stdout %q stderr %q; want exit 4 and \"woke\"", err, exitCodeOf(e), out.String(), errs.String())
	}
}

// TestAttackCopierPrunedBeforeReattach: sbxd is killed while a detached
// command runs over the exec channel (its copier, in init, goes with the
// connection). Meanwhile the command writes 150 MB and exits 7, and then
// another command makes init start one more (any spawn prunes ended execs'
// records past 128 MiB), which removes the first's records inside the
// sandbox (runsc exec, from the test, says when that is done). The
// restarted sbxd attaches to the exec again; init, finding no record,
// settles it as one that "never reached init" and says it "did not run,
// and will not": exit 125 for a command that ran and exited 7. The same
// holds for any re-attach after a prune: a capture's (the exec ended
// while a snapshot cut its copy) as well as a restart's. Want: its exit
// code, or lost (sbx cannot know), never a false word that it never ran.
func TestAttackCopierPrunedBeforeReattach(t *testing.T) {
	d := ownDaemon(t)
	id := d.newSandbox(t, "--template", "tiny")
	channelReady(t, d, id)
	ex := detach(t, d, id, "sh", "-c", "sleep 5; head -c 150000000 /dev/zero; echo ran >&2; touch /tmp/e-done; exit 7")
	// once the first has ended (and init recorded it), one spawn
	trigger := detach(t, d, id, "sh", "-c", "while [ ! -e /tmp/e-done ]; do sleep 0.2; done; sleep 1; /.sbx/sbx-agent spawn --id prune-trigger-1 true; sleep 1; touch /tmp/pruned; sleep 600")
	waitFor(t, "both execs over the channel", 10*time.Second, func() bool { return viaChannel(d, id, ex) && viaChannel(d, id, trigger) })
	time.Sleep(500 * time.Millisecond)
	d.kill(syscall.SIGKILL)
	// sbxd is away: ask runsc itself whether the spawn has been made
	runscRoot := filepath.Join(d.dir, "runsc")
	pruned := pollUntil(90*time.Second, func() bool {
		return exec.Command(filepath.Join(binDir, "runsc"), "--root", runscRoot, "exec", id, "test", "-e", "/tmp/pruned").Run() == nil
	})
	if err := d.start(nil); err != nil {
		t.Fatal(err)
	}
	if !pruned {
		t.Fatalf("the command did not end, or the spawn after it was not made, in 90 s")
	}
	var e *api.Exec
	waitFor(t, "the exec's end after the restart", time.Minute, func() bool {
		x, err := sdk(d.client).GetExec(context.Background(), id, ex)
		e = x
		return err == nil && x.State != api.ExecRunning
	})
	var out, errs bytes.Buffer
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	_, _ = sdk(d.client).ExecOutput(ctx, id, ex, false, &out, &errs)
	t.Logf("the exec after the restart: state %s exit %d, stdout %d bytes, stderr %q", e.State, exitCodeOf(e), out.Len(), tail(errs.String()))
	if exitCodeOf(e) == 125 || strings.Contains(errs.String(), "never reached init") {
		t.Errorf("a command that ran (it wrote 150 MB and exited 7 while sbxd was away) is recorded as exit %d with stderr %q: "+
			"init pruned its records, and the re-attach settled it as one that never started", exitCodeOf(e), lastBytes(errs.String(), 200))
	}
	d.sbx(t, "kill", "-s", "KILL", id, trigger)
}

// runscPs lists sandbox id's processes as runsc sees them (COMM only).
func runscPs(d *daemon, id string) string {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	out, _ := exec.CommandContext(ctx, filepath.Join(binDir, "runsc"), "--root", filepath.Join(d.dir, "runsc"), "ps", id).CombinedOutput()
	return string(out)
}

// stormScript copies dash to /tmp/storm7311 (a name to count its
// processes by) and starts four runners of runner ($0) in sessions of
// their own, then waits as sleep.
const stormScript = `cp /bin/dash /tmp/storm7311 && chmod 755 /tmp/storm7311 || exit 99
for i in 1 2 3 4; do setsid /tmp/storm7311 -c "$0" "$0" & done
exec sleep 600`

// stormRun runs runner as user in a fresh sandbox under --timeout 2s and
// reports the exec, how long it took, what the storm looked like, and
// the processes of the storm left 10 s after the end (runsc ps, from the
// host: an exec inside may not get a process).
func stormRun(t *testing.T, d *daemon, user, runner string, alongside int) (id string, x *api.Exec, took time.Duration, left int, ps string) {
	t.Helper()
	id = d.newSandbox(t, "--template", "base", "--pids", "256")
	start := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	// other timed commands of the same user, whose deadline is the
	// storm's: init sweeps for each at once
	var others sync.WaitGroup
	for range alongside {
		others.Add(1)
		go func() {
			defer others.Done()
			_, _ = sdk(d.client).Exec(ctx, id, api.ExecRequest{Cmd: []string{"sleep", "600"}, User: user, Timeout: api.Duration(2 * time.Second)}, io.Discard, io.Discard)
		}()
	}
	defer others.Wait()
	// how big the storm is before the deadline and during the sweep
	sampled := make(chan string, 1)
	go func() {
		var b strings.Builder
		for _, at := range []time.Duration{1500 * time.Millisecond, 3 * time.Second, 5 * time.Second, 7 * time.Second} {
			time.Sleep(time.Until(start.Add(at)))
			fmt.Fprintf(&b, "%s: %d; ", at, strings.Count(runscPs(d, id), "storm7311"))
		}
		sampled <- b.String()
	}()
	var errs strings.Builder
	x, err := sdk(d.client).Exec(ctx, id, api.ExecRequest{Cmd: []string{"sh", "-c", stormScript, runner}, User: user, Timeout: api.Duration(2 * time.Second)}, io.Discard, &errs)
	took = time.Since(start)
	if err != nil {
		t.Errorf("as %s: exec: %v", user, err)
	}
	t.Logf("as %s: the exec ended after %s: exit %d, stderr %q; storm processes at %s", user, took.Round(time.Millisecond), exitCodeOf(x), lastBytes(errs.String(), 120), <-sampled)
	pollUntil(10*time.Second, func() bool {
		ps = runscPs(d, id)
		left = strings.Count(ps, "storm7311")
		return left == 0
	})
	return id, x, took, left, ps
}

// stormTries is how many storms each storm test runs: each was lost about
// half the time before the fixes; one keeps the suite's time (SBX_SOAK
// runs three).
var stormTries = map[bool]int{false: 1, true: 3}[os.Getenv("SBX_SOAK") != ""]

// TestAttackCopierRunnerStormOutlivesTimeout: a timed command (as the
// sandbox's user) starts four runners, each of which continues every
// process it may signal (kill -CONT -1), starts two setsid'd copies of
// itself and exits at once: a storm that leaves the command's group,
// changes its pids all the time, continues what the sweep stops, and is
// held at the sandbox's process limit. The sweep (killUnder) gives up
// after its round past 5 s and kills the command, the anchor; whatever a
// runner started after that round's last scan is orphaned to init, out of
// any sweep's sight, and storms on for ever. Two tries (it is a race; it
// was lost in about half of the tries here). Want: nothing of the exec
// left 10 s after it ended, and exit 124.
func TestAttackCopierRunnerStormOutlivesTimeout(t *testing.T) {
	runner := `kill -CONT -1 2>/dev/null; setsid /tmp/storm7311 -c "$0" "$0" & setsid /tmp/storm7311 -c "$0" "$0" & exit 0`
	d := shared
	for try := 1; try <= stormTries; try++ {
		id, x, took, left, ps := stormRun(t, d, "user", runner, 0)
		if exitCodeOf(x) != 124 {
			t.Errorf("try %d: the storm under --timeout 2s ended %d after %s; want 124", try, exitCodeOf(x), took.Round(time.Millisecond))
		}
		if left > 0 {
			lines := strings.Split(ps, "\n")
			t.Errorf("try %d: %d processes of the exec (timed out at 2 s, ended after %s) still run 10 s after its end: the storm outlived the sweep; runsc ps:\n%s",
				try, left, took.Round(time.Millisecond), strings.Join(lines[:min(6, len(lines))], "\n"))
			return
		}
		_ = deleteSandbox(context.Background(), d.client, id)
	}
}

// TestAttackCopierStormAsRootKillsInit: the same kind of storm as root,
// each runner looping (continue everything, start a setsid'd copy of
// itself) at the sandbox's process limit (RLIMIT_NPROC, which gVisor
// counts per user for every task, threads included). init is root too,
// and its sweep keeps its Go runtime busy in system calls: when the
// runtime wants one more thread, clone fails with EAGAIN and the runtime
// throws ("failed to create new OS thread"), init exits 2, and the whole
// sandbox ends: the exec is lost and the sandbox "ended on its own". The
// README says init enforces the timeout "root, running already, its
// threads made long before, so it can still kill the whole tree". Three
// timed sleeps of root's share the deadline (init sweeps for each at
// once, wanting more threads); seen: "runtime: failed to create new OS
// thread (have 10 already; errno=11) ... fatal error: newosproc" on the
// console, in about half of the tries. In tiny every exec is root's, so
// any runaway fork under a timeout there can do it. Two tries. Want:
// exit 124, the sandbox ready after, and nothing of the storm left.
func TestAttackCopierStormAsRootKillsInit(t *testing.T) {
	runner := `while :; do kill -CONT -1 2>/dev/null; setsid /tmp/storm7311 -c "$0" "$0" & done`
	d := shared
	for try := 1; try <= stormTries; try++ {
		id, x, took, left, _ := stormRun(t, d, "root", runner, 3)
		sb := d.info(t, id)
		if exitCodeOf(x) != 124 || sb.State != api.StateReady {
			t.Errorf("try %d: a root storm under --timeout 2s (--pids 256): exec %s exit %d after %s; the sandbox is %s (%s); want exit 124 and the sandbox ready",
				try, execState(x), exitCodeOf(x), took.Round(time.Millisecond), sb.State, sb.Reason)
			d.logAbout(t, id)
			r := d.sbx(t, "logs", id, "--stream", "console")
			var why []string
			for _, l := range strings.Split(r.stdout, "\n") {
				if strings.HasPrefix(l, "runtime:") || strings.HasPrefix(l, "fatal error") || strings.HasPrefix(l, "panic") || strings.HasPrefix(l, "goroutine ") && len(why) < 12 {
					why = append(why, l)
				}
			}
			t.Logf("its console (init's stderr), what ended it:\n%s\n...\n%s", strings.Join(why[:min(8, len(why))], "\n"), lastBytes(r.stdout, 600))
			return
		}
		if left > 0 {
			t.Errorf("try %d: %d processes of the root storm still run 10 s after its exec ended", try, left)
			return
		}
		_ = deleteSandbox(context.Background(), d.client, id)
	}
}

func execState(x *api.Exec) api.ExecState {
	if x == nil {
		return "unknown"
	}
	return x.State
}

// TestAttackCopierBackgroundOutputAfterExit: what docker taught: a command
// that leaves a child writing to its output after it exits
// (`docker exec c sh -c '(sleep 1; echo late) & echo early'` prints both:
// docker waits until the output is closed). Want at least the output kept
// with the sandbox (`sbx logs --exec`) to hold what the exec's own
// processes wrote to its stdout: "late" is in the exec's output file
// inside the sandbox, but the copier stopped at the command's exit.
func TestAttackCopierBackgroundOutputAfterExit(t *testing.T) {
	t.Skip("known limit (README Known limits): an exec's copy ends at its command's exit; what its background children write after that stays in the sandbox")
	d := shared
	id := d.newSandbox(t, "--template", "tiny")
	var out bytes.Buffer
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	x, err := sdk(d.client).Exec(ctx, id, api.ExecRequest{Cmd: []string{"sh", "-c", "(sleep 1; echo late) & echo early"}, Timeout: api.Duration(30 * time.Second)}, &out, io.Discard)
	if err != nil || exitCodeOf(x) != 0 {
		t.Fatalf("exec: %v %+v", err, x)
	}
	time.Sleep(2 * time.Second)
	inside := d.sbx(t, "exec", id, "--", "cat", "/run/sbx/execs/"+x.ID+"/stdout").stdout
	var kept bytes.Buffer
	_, _ = sdk(d.client).ExecOutput(ctx, id, x.ID, false, &kept, io.Discard)
	t.Logf("foreground stdout %q; the exec's file inside %q; kept by sbx %q", out.String(), inside, kept.String())
	if strings.Contains(inside, "late") && !strings.Contains(kept.String(), "late") {
		t.Errorf("the exec's output file inside holds %q, sbx keeps %q: what the exec's child wrote after the command's exit is lost (docker exec shows it)", inside, kept.String())
	}
}

// TestAttackCopierRootChurnsExecDir: root inside, while a quiet command
// prints a stamp every 0.6 s, floods the command's exec directory
// (/run/sbx/execs/ID, the one its copier watches) with thousands of
// files created, chmodded and removed, and chmods its output files 000.
// Want: every line once, none more than a second late, and its exit code.
func TestAttackCopierRootChurnsExecDir(t *testing.T) {
	d := shared
	id := d.newSandbox(t, "--template", "base")
	channelReady(t, d, id)
	done := copierExecAsync(t, d, id, api.ExecRequest{Cmd: []string{"sh", "-c", "for i in $(seq 1 12); do sleep 0.6; date +%s%N; done; exit 6"}, Timeout: api.Duration(time.Minute)}, 2*time.Minute)
	var target string
	waitFor(t, "the quiet exec", 10*time.Second, func() bool {
		for _, e := range mustExecs(t, d, id) {
			if e.State == api.ExecRunning && len(e.Cmd) > 2 && strings.Contains(e.Cmd[2], "seq 1 12") {
				target = e.ID
				return true
			}
		}
		return false
	})
	churn := `d=/run/sbx/execs/` + target + `; chmod 000 $d/stdout $d/stderr
end=$(( $(date +%s) + 5 )); n=0
while [ $(date +%s) -lt $end ]; do
  i=0; while [ $i -lt 500 ]; do : > $d/junk$i; i=$((i+1)); done
  chmod 644 $d/junk* ; rm -f $d/junk*; n=$((n+1))
done; echo rounds $n`
	r, hung := sbxWithin(t, d, time.Minute, "exec", "--user", "root", id, "--", "sh", "-c", churn)
	t.Logf("churn: hung=%v %q %q", hung, r.stdout, tail(r.stderr))
	got := <-done
	if got.err != nil || exitCodeOf(got.x) != 6 {
		t.Errorf("the watched exec: err %v exit %d, want 6", got.err, exitCodeOf(got.x))
	}
	n := 0
	for _, l := range got.lines {
		lat, ts, ok := stampLatency(l)
		if !ok || l.stream != "stdout" {
			t.Errorf("unexpected line %+v", l)
			continue
		}
		n++
		if lat > time.Second {
			t.Errorf("a line written at %s reached the client %v later, while root churned its exec directory", ts.Format("15:04:05.000"), lat.Round(time.Millisecond))
		}
	}
	if n != 12 {
		t.Errorf("%d lines, want 12", n)
	}
}

// TestAttackCopierClosedOutputTimeout: a command that closes its stdout
// and stderr and runs on, quiet, past its timeout; and one that does so
// after a burst. Want 124 within a few seconds of the deadline, the burst
// whole and the timeout's message on stderr.
func TestAttackCopierClosedOutputTimeout(t *testing.T) {
	d := shared
	id := d.newSandbox(t, "--template", "tiny")
	for _, k := range []struct{ script, out string }{
		{"exec >&- 2>&-; sleep 600", ""},
		{"seq 1 20000; exec >&- 2>&-; sleep 600", seqText(20000)},
	} {
		var out, errs bytes.Buffer
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		start := time.Now()
		x, err := sdk(d.client).Exec(ctx, id, api.ExecRequest{Cmd: []string{"sh", "-c", k.script}, Timeout: api.Duration(2 * time.Second)}, &out, &errs)
		cancel()
		took := time.Since(start)
		if err != nil || exitCodeOf(x) != 124 || took > 10*time.Second || out.String() != k.out || !strings.Contains(errs.String(), "timed out after 2s") {
			t.Errorf("%q under --timeout 2s: err %v exit %d after %s, stdout %d bytes (want %d), stderr %q", k.script, err, exitCodeOf(x), took.Round(time.Millisecond), out.Len(), len(k.out), errs.String())
		}
	}
}

// TestAttackCopierForegroundAcrossCaptures: a foreground exec prints a
// stamp every 0.5 s while its sandbox is stopped and resumed, then forked
// with its memory. Want every line once and in order, those written after
// the resume (a fresh copier, a fresh watch) and after the fork no more
// than a second late, and the exit code.
func TestAttackCopierForegroundAcrossCaptures(t *testing.T) {
	d := shared
	id := d.newSandbox(t, "--template", "base")
	channelReady(t, d, id)
	done := copierExecAsync(t, d, id, api.ExecRequest{Cmd: []string{"sh", "-c", "for i in $(seq 1 24); do sleep 0.5; date +%s%N; done; exit 6"}, Timeout: api.Duration(2 * time.Minute)}, 3*time.Minute)
	time.Sleep(2500 * time.Millisecond)
	d.must(t, "stop", id, "--wait")
	d.must(t, "resume", id)
	resumed := time.Now()
	time.Sleep(2 * time.Second)
	forking := time.Now()
	forkMemory(t, d, id, 1)
	forked := time.Now()
	got := <-done
	if got.err != nil || exitCodeOf(got.x) != 6 {
		t.Errorf("the exec across a stop, a resume and a fork: err %v exit %d, want 6", got.err, exitCodeOf(got.x))
	}
	var last time.Time
	n := 0
	for _, l := range got.lines {
		lat, ts, ok := stampLatency(l)
		if !ok || l.stream != "stdout" {
			t.Errorf("unexpected line %+v", l)
			continue
		}
		n++
		if !ts.After(last) {
			t.Errorf("line %d (%s) not after the one before (%s): duplicated or reordered", n, ts.Format("15:04:05.000"), last.Format("15:04:05.000"))
		}
		last = ts
		// a line written as a capture paused the sandbox comes after it:
		// only those written well after the resume and the fork are timed
		afterResume := ts.After(resumed.Add(500*time.Millisecond)) && ts.Before(forking.Add(-600*time.Millisecond))
		afterFork := ts.After(forked.Add(500 * time.Millisecond))
		if (afterResume || afterFork) && lat > time.Second {
			t.Errorf("a line written at %s (resumed %s, forked %s-%s) reached the client %v later", ts.Format("15:04:05.000"), resumed.Format("15:04:05.000"), forking.Format("15:04:05.000"), forked.Format("15:04:05.000"), lat.Round(time.Millisecond))
		}
	}
	if n != 24 {
		t.Errorf("%d lines, want 24", n)
	}
}
