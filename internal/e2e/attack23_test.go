package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"sbx.dev/sbx/api"
)

// Attacks on `sbx explain` (issue 23's "Bad input", and more).

// TestAttack23PNRHang: a test that hangs, under --timeout, with the point
// of no return on. Its children (memory forks of a captured run) carry
// the hang on and no exec of sbxd's times them out there; explain waited
// 2 minutes for each and then failed as a whole, the rate it had measured
// lost. A hang is a failure wherever it runs, and explain answers.
func TestAttack23PNRHang(t *testing.T) {
	d := shared
	id := d.newSandbox(t, "--template", "tiny")
	before := sandboxIDs(t, d)
	out := d.must(t, "--json", "explain", id, "-n", "2", "--timeout", "2", "--knob-runs", "0",
		"--offsets", "500", "--pnr-parents", "1", "--pnr-ways", "2", "--", "sleep", "600")
	_, res := parseExplain(t, out)
	if got := sandboxIDs(t, d); !slices.Equal(got, before) {
		t.Errorf("sandboxes after explain: %v, want those before: %v", got, before)
	}
	if res.Failed != res.Runs || !strings.Contains(res.Note, "every run of 2 failed") {
		t.Errorf("%d/%d failed, note %q: want every run failed", res.Failed, res.Runs, res.Note)
	}
	pn := res.PointOfNoReturn
	if pn == nil || len(pn.Curve) != 1 {
		t.Fatalf("point of no return %+v, want one point", pn)
	}
	if p := pn.Curve[0]; p.Parents != 1 || p.Runs != 2 || p.Failed != 2 {
		t.Errorf("curve point %+v: want 2 of 2 forks of the hung run failed (killed at the timeout)", p)
	}
}

// TestAttack23ReportPath: --report to a directory, or under one that does
// not exist, is refused before any fork is made (it was found out after
// every run, which lost them all, and left PATH.tmp behind).
func TestAttack23ReportPath(t *testing.T) {
	d := shared
	id := d.newSandbox(t, "--template", "tiny")
	dir := t.TempDir()
	before := sandboxIDs(t, d)
	for _, path := range []string{dir, filepath.Join(dir, "no-such-dir", "r.html")} {
		r := d.sbx(t, "explain", id, "-n", "2", "--knob-runs", "0", "--pnr-parents", "0", "--report", path, "--", "true")
		if r.code == 0 || !strings.Contains(r.stderr, "report") {
			t.Errorf("--report %s: exit %d, stderr %q: want a refusal that names the report", path, r.code, r.stderr)
		}
		if strings.Contains(r.stdout, "failed: rate") {
			t.Errorf("--report %s: it ran the test before refusing: %q", path, r.stdout)
		}
	}
	if left, _ := filepath.Glob(filepath.Join(filepath.Dir(dir), filepath.Base(dir)+"*.tmp")); len(left) > 0 {
		t.Errorf("left behind: %v", left)
	}
	if ents, _ := os.ReadDir(dir); len(ents) > 0 {
		t.Errorf("left in the directory: %v", ents)
	}
	if got := sandboxIDs(t, d); !slices.Equal(got, before) {
		t.Errorf("sandboxes after explain: %v, want those before: %v", got, before)
	}
}

// TestAttack23BadNumbers: NaN passes `ms < 0 || ms > max` and `v <= 0`:
// --offsets NaN became an offset of -292 years, --cpus NaN a fork request
// JSON cannot carry (found after every run). Both are usage errors.
func TestAttack23BadNumbers(t *testing.T) {
	d := shared
	for _, flags := range [][]string{
		{"--offsets", "NaN"}, {"--offsets", "0,nan"}, {"--cpus", "NaN"}, {"--cpus", "0.5,+Inf"}, {"--knob-runs", "1", "--cpus", "nan"},
	} {
		r := d.sbx(t, append(append([]string{"explain", "sb_aaaaaaaaaa", "-n", "2"}, flags...), "--", "true")...)
		if r.code != 2 || !strings.Contains(r.stderr, flags[len(flags)-2]) {
			t.Errorf("%v: exit %d, stderr %q: want a usage error (2) naming the flag", flags, r.code, r.stderr)
		}
	}
}

// TestAttack23RunCounts: -n as pytest -n and docker habits type it. -n 0
// and 1 are refused; -n 100000 is refused up front too: explain keeps
// every run's trace for the analysis (at least 2000 events each, so
// 200 million events), where flake-rate keeps none.
func TestAttack23RunCounts(t *testing.T) {
	d := shared
	for _, flags := range [][]string{{"-n", "0"}, {"-n", "1"}, {"-n", "100000"}, {"-n", "-3"}, {"--parallel", "0"}, {"-n", "x"},
		{"--pnr-parents", "100000"}, {"--knob-runs", "100000"}, {"--pnr-ways", "17"}, {"--knob-runs", "-1"}} {
		r := d.sbx(t, append(append([]string{"explain", "sb_aaaaaaaaaa"}, flags...), "--", "true")...)
		if r.code != 2 || !strings.Contains(r.stderr, flags[0]) {
			t.Errorf("%v: exit %d, stderr %q: want a usage error (2) naming the flag", flags, r.code, r.stderr)
		}
	}
}

// TestAttack23Interrupt: SIGINT (^C) to `sbx explain` at instants in each
// of its phases (forking, the runs, the knobs, the point of no return, the
// fix): it exits 130, and nothing it made is left: no fork, snapshot,
// runsc process, monitor socket or sandbox directory.
func TestAttack23Interrupt(t *testing.T) {
	d := ownDaemon(t)
	id := d.newSandbox(t, "--template", "tiny")
	const test = `sleep 0.4; test $((SEED % 2)) = 0`
	for _, after := range []time.Duration{200 * time.Millisecond, 1500 * time.Millisecond, 3 * time.Second, 4500 * time.Millisecond, 6 * time.Second, 8 * time.Second} {
		cmd := exec.Command(filepath.Join(binDir, "sbx"), "--json", "explain", id, "-n", "4", "--parallel", "2",
			"--knob-runs", "2", "--cpus", "1", "--net-delay", "none", "--net-loss", "none", "--offsets", "0,300", "--pnr-parents", "1", "--pnr-ways", "2", "--fixed", "true", "--", "sh", "-c", test)
		cmd.Env = append(os.Environ(), "SBX_HOST=unix://"+d.socket)
		var out, errb bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &errb
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		time.Sleep(after) // tested: SIGINT this far into explain
		_ = cmd.Process.Signal(syscall.SIGINT)
		done := make(chan error, 1)
		go func() { done <- cmd.Wait() }()
		select {
		case <-done:
		case <-time.After(3 * time.Minute):
			_ = cmd.Process.Kill()
			<-done
			t.Errorf("SIGINT after %s: explain did not end in 3 minutes", after)
		}
		lines := strings.Split(strings.TrimSpace(out.String()), "\n")
		t.Logf("SIGINT after %s: exit %d, last line %s, stderr %q", after, cmd.ProcessState.ExitCode(), lines[len(lines)-1], errb.String())
		if code := cmd.ProcessState.ExitCode(); code != 130 && !strings.Contains(out.String(), `"event":"explained"`) {
			t.Errorf("SIGINT after %s: exit %d, want 130", after, code)
		}
		// the deletes are waited for: what is left is left
		if got := sandboxIDs(t, d); !slices.Equal(got, []string{id}) {
			t.Errorf("SIGINT after %s: sandboxes left %v, want only %s", after, got, id)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		sn, err := d.client.Snapshots(ctx)
		cancel()
		if err != nil || len(sn) != 0 {
			t.Errorf("SIGINT after %s: snapshots %+v (%v), want none", after, sn, err)
		}
		socks, _ := filepath.Glob(filepath.Join(d.dir, "sandboxes", "*", "trace.sock"))
		if len(socks) > 0 {
			t.Errorf("SIGINT after %s: monitor sockets left: %v", after, socks)
		}
	}
	deleteEverything(t, d)
	checkNoLeaks(t, d)
}

// TestAttack23DaemonKilled: sbxd is killed (SIGKILL) while explain runs:
// explain ends with an error that says so (it does not hang), and once
// sbxd is back, what explain made does not stay for good: its forks took
// the state's ttl, none here, and stayed ready for good; with --timeout
// each has an idle ttl that outlasts its wait for its run, without it a
// day.
func TestAttack23DaemonKilled(t *testing.T) {
	d := ownDaemon(t)
	id := d.newSandbox(t, "--template", "tiny")
	cmd := exec.Command(filepath.Join(binDir, "sbx"), "--json", "explain", id, "-n", "8", "--parallel", "2",
		"--knob-runs", "0", "--offsets", "0", "--pnr-parents", "2", "--pnr-ways", "2", "--", "sh", "-c", `sleep 1; test $((SEED % 2)) = 0`)
	cmd.Env = append(os.Environ(), "SBX_HOST=unix://"+d.socket)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(2500 * time.Millisecond) // tested: sbxd killed this far into explain
	d.kill(syscall.SIGKILL)
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case <-done:
	case <-time.After(3 * time.Minute):
		_ = cmd.Process.Kill()
		<-done
		t.Errorf("explain did not end in 3 minutes after sbxd was killed")
	}
	t.Logf("explain: exit %d, stderr %q", cmd.ProcessState.ExitCode(), errb.String())
	if cmd.ProcessState.ExitCode() == 0 {
		t.Errorf("explain exit 0 with sbxd killed under it")
	}
	if err := d.start(nil); err != nil {
		t.Fatal(err)
	}
	for _, sb := range d.list(t) {
		if sb.ID != id {
			t.Logf("left after the restart: %s %s ttl %q", sb.ID, sb.State, sb.TTL)
			if sb.TTL == 0 {
				t.Errorf("%s, made by explain, is left with no ttl: it stays for good", sb.ID)
			}
		}
	}
	deleteEverything(t, d)
	checkNoLeaks(t, d)
}

// TestAttack23BadTargets: an unknown id, a stopped sandbox, a snapshot
// that does not exist, and both a sandbox and --from: each a clear error
// that names what is wrong, and nothing left behind.
func TestAttack23BadTargets(t *testing.T) {
	d := shared
	id := d.newSandbox(t, "--template", "tiny")
	stopped := d.newSandbox(t, "--template", "tiny")
	d.must(t, "stop", stopped)
	waitFor(t, stopped+" stopped", 2*time.Minute, func() bool { return d.info(t, stopped).State == api.StateStopped })
	before := sandboxIDs(t, d)
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"sb_zzzzzzzzzz"}, "sb_zzzzzzzzzz"},
		{[]string{"no-such-name"}, "no-such-name"},
		{[]string{stopped}, "stopped"},
		{[]string{"--from", "no-such-snapshot"}, "no-such-snapshot"},
	} {
		args := append(append([]string{"explain", "-n", "2", "--knob-runs", "0", "--pnr-parents", "0"}, tc.args...), "--", "true")
		r := d.sbx(t, args...)
		t.Logf("%v: exit %d, stderr %q", tc.args, r.code, r.stderr)
		if r.code == 0 || !strings.Contains(r.stderr, tc.want) {
			t.Errorf("%v: exit %d, stderr %q: want an error naming %q", tc.args, r.code, r.stderr, tc.want)
		}
	}
	// --from and an id: the id is taken as the test command's first word
	r := d.sbx(t, "explain", "-n", "2", "--knob-runs", "0", "--pnr-parents", "0", "--from", "no-such-snapshot", id, "--", "true")
	t.Logf("--from and an id: exit %d, stderr %q", r.code, r.stderr)
	if got := sandboxIDs(t, d); !slices.Equal(got, before) {
		t.Errorf("sandboxes after: %v, want those before: %v", got, before)
	}
}

// TestAttack23HostileReport: a test whose process name and paths are
// HTML (a script named `<svg onload=a>` opening `/tmp/<img src=x
// onerror=...>N`): the report rendered in Chromium (no network) shows
// them as text, with no element of the sandbox's making.
func TestAttack23HostileReport(t *testing.T) {
	d := shared
	id := d.newSandbox(t, "--template", "tiny")
	const test = `p='/tmp/<svg onload=a>'; f='/tmp/<img src=x onerror=alert(1)>'; ` +
		`printf '#!/bin/sh\ncat "$1"\n' > "$p"; chmod +x "$p"; ` +
		`if [ $((SEED % 2)) = 0 ]; then touch "${f}0"; fi; printf '\033[2J\033]0;owned\007<script>alert(2)</script>'; "$p" "${f}0"`
	report := filepath.Join(t.TempDir(), "report.html")
	res := explainTop(t, d, id, []string{"-n", "8", "--report", report}, "sh", "-c", test)
	if res.Failed == 0 || res.Failed == res.Runs {
		t.Skipf("%d of %d runs failed: nothing to compare", res.Failed, res.Runs)
	}
	checkReport(t, report, `<svg id="timelines"`, "&lt;img src=x onerror=alert(1)&gt;")
	page, err := os.ReadFile(report)
	if err != nil {
		t.Fatal(err)
	}
	for _, bad := range []string{"<img", "<svg onload", "<script", "\x1b"} {
		if strings.Contains(string(page), bad) {
			t.Errorf("the report holds %q", bad)
		}
	}
	human := d.must(t, "explain", id, "-n", "4", "--knob-runs", "0", "--pnr-parents", "0", "--", "sh", "-c", test)
	if strings.Contains(human, "\x1b") {
		t.Errorf("the terminal summary carries an escape sequence: %q", human)
	}
}

// TestAttack23Offsets: --offsets out of order and past the test's end.
// The curve was read as given (its last point first), an offset past
// the end was waited for in full and its forks only read the run's
// exit, and a curve certain at its first offset, 300 ms, said "decided
// before the test started", which no fork measured.
func TestAttack23Offsets(t *testing.T) {
	d := shared
	id := d.newSandbox(t, "--template", "tiny")
	out := d.must(t, "--json", "explain", id, "-n", "4", "--knob-runs", "0", "--offsets", "20000,300,300", "--pnr-parents", "2", "--pnr-ways", "2",
		"--", "sh", "-c", `sleep 1; test $((SEED % 2)) = 0`)
	_, res := parseExplain(t, out)
	pn := res.PointOfNoReturn
	if res.Failed == 0 {
		t.Skipf("no run failed")
	}
	if pn == nil || len(pn.Curve) != 2 {
		t.Fatalf("point of no return %+v, want 2 points (300, 20000)", pn)
	}
	for _, p := range pn.Curve {
		t.Logf("at %.0f ms: %d/%d forks of %d failing runs, %d ended", p.AtMs, p.Failed, p.Runs, p.Parents, p.Ended)
	}
	t.Logf("note %q", pn.Note)
	if pn.Curve[0].AtMs != 300 || pn.Curve[1].AtMs != 20000 {
		t.Errorf("curve at %.0f, %.0f ms: want 300 then 20000", pn.Curve[0].AtMs, pn.Curve[1].AtMs)
	}
	if late := pn.Curve[1]; late.Runs != 0 || late.Ended != 2 {
		t.Errorf("at 20000 ms: %d forks, %d runs ended: want none forked, both ended (the test takes 1 s)", late.Runs, late.Ended)
	}
	if strings.Contains(pn.Note, "before the test started") {
		t.Errorf("note %q: no fork at 0 ms measured the start", pn.Note)
	}
}

// TestAttack23ExecFlood: a monitored sandbox that execs with the longest
// argv sbxd keeps, 16 arguments of 512 bytes (9 KB an event): its trace
// stopped only at 20000 events, 180 MB in sbxd and as much JSON per read.
// It is bounded in bytes too, says it is full and counts the rest.
func TestAttack23ExecFlood(t *testing.T) {
	d := shared
	id := d.newSandbox(t, "--template", "tiny", "--monitor")
	const flood = `a=$(head -c 600 /dev/zero | tr '\0' A); i=0; while [ $i -lt 1500 ]; do ` +
		`/bin/true $a $a $a $a $a $a $a $a $a $a $a $a $a $a $a $a $a; i=$((i+1)); done; echo done`
	if out := d.must(t, "exec", "--timeout", "5m", id, "--", "sh", "-c", flood); !strings.Contains(out, "done") {
		t.Fatalf("flood: %q", out)
	}
	pollUntil(30*time.Second, func() bool { return strings.Contains(d.must(t, "--json", "trace", id), `"full": true`) }) // the sink has the events
	out := d.must(t, "--json", "trace", id)
	var tr api.Trace
	if err := json.Unmarshal([]byte(out), &tr); err != nil {
		var wrap struct{ Trace api.Trace }
		if err2 := json.Unmarshal([]byte(out), &wrap); err2 != nil {
			t.Fatalf("sbx --json trace: %v / %v", err, err2)
		}
		tr = wrap.Trace
	}
	t.Logf("trace: %d events, %d dropped, full %v, %d bytes of JSON", len(tr.Events), tr.Dropped, tr.Full, len(out))
	if len(out) > 16<<20 {
		t.Errorf("the trace is %d MB of JSON, want it bounded (about 8 MB kept)", len(out)>>20)
	}
	if !tr.Full || tr.Dropped == 0 {
		t.Errorf("full %v, dropped %d: want the trace to say it is full and count the rest", tr.Full, tr.Dropped)
	}
}

// TestAttack23ForgedExit: a test that writes the exit file the point of
// no return reads (/tmp/.sbx-explain-exit) before it has decided: each
// parent read as failed at once and each fork of it too, so a coin
// tossed 1 s in (half the forks at 300 ms fail) was "certain". The file
// is named per run now; a test that reads /proc for the name can still
// forge it (the sandbox's word, as a freeze's details are).
func TestAttack23ForgedExit(t *testing.T) {
	d := shared
	id := d.newSandbox(t, "--template", "tiny")
	const test = `echo 1 > /tmp/.sbx-explain-exit; sleep 1; r=$(head -c1 /dev/urandom | od -An -tu1); sleep 4; test $((r % 2)) = 0`
	out := d.must(t, "--json", "explain", id, "-n", "8", "--knob-runs", "0", "--offsets", "300", "--pnr-parents", "3", "--pnr-ways", "4", "--", "sh", "-c", test)
	_, res := parseExplain(t, out)
	pn := res.PointOfNoReturn
	if pn == nil {
		t.Skipf("no run failed (%d/%d)", res.Failed, res.Runs)
	}
	p := pn.Curve[0]
	t.Logf("at 300 ms: %d/%d forks of %d failing runs failed; %s", p.Failed, p.Runs, p.Parents, pn.Note)
	// every fork tosses its own coin: all of 4 fail 1 time in 16 with the
	// file not read (CI saw it), all of 8 or more 1 in 256 at most
	if p.Runs < 8 {
		t.Skipf("%d forks measured at 300 ms (fewer than 2 failing parents): too few to tell a forged exit from chance", p.Runs)
	}
	if p.Failed == p.Runs {
		t.Errorf("every fork of a coin tossed after the capture failed: the forged exit file was read")
	}
}

// TestAttack23InterruptFrom: SIGINT while explain --from SNAPSHOT makes
// its sandbox from the snapshot (and later its point of no return's):
// the sandbox made for it does not outlive it.
func TestAttack23InterruptFrom(t *testing.T) {
	d := ownDaemon(t)
	id := d.newSandbox(t, "--template", "tiny")
	d.must(t, "snapshot", "--memory", id, "a23-ready")
	before := sandboxIDs(t, d)
	for _, after := range []time.Duration{30 * time.Millisecond, 100 * time.Millisecond, 250 * time.Millisecond, 500 * time.Millisecond, 900 * time.Millisecond, 2 * time.Second, 3500 * time.Millisecond} {
		cmd := exec.Command(filepath.Join(binDir, "sbx"), "--json", "explain", "--from", "a23-ready", "-n", "2", "--parallel", "2",
			"--knob-runs", "0", "--offsets", "0", "--pnr-parents", "1", "--pnr-ways", "1", "--", "sh", "-c", `sleep 0.3; test $((SEED % 2)) = 0`)
		cmd.Env = append(os.Environ(), "SBX_HOST=unix://"+d.socket)
		var out, errb bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &errb
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		time.Sleep(after) // tested: SIGINT this far into explain
		_ = cmd.Process.Signal(syscall.SIGINT)
		done := make(chan error, 1)
		go func() { done <- cmd.Wait() }()
		select {
		case <-done:
		case <-time.After(3 * time.Minute):
			_ = cmd.Process.Kill()
			<-done
			t.Errorf("SIGINT after %s: explain did not end in 3 minutes", after)
		}
		t.Logf("SIGINT after %s: exit %d, stderr %q", after, cmd.ProcessState.ExitCode(), errb.String())
		time.Sleep(2 * time.Second) // a create the client left would show by now
		if got := sandboxIDs(t, d); !slices.Equal(got, before) {
			t.Errorf("SIGINT after %s: sandboxes %v, want those before %v", after, got, before)
			for _, x := range got {
				if !slices.Contains(before, x) {
					d.sbx(t, "delete", x)
				}
			}
		}
	}
	d.sbx(t, "snapshot", "rm", "a23-ready")
	deleteEverything(t, d)
}

// TestAttack23LyingOutput: a test that prints explain's own JSON lines
// and 20 MB of binary: explain reads a run's exit code and its trace,
// never its output, so the last line is explain's, with the real counts.
func TestAttack23LyingOutput(t *testing.T) {
	d := shared
	id := d.newSandbox(t, "--template", "tiny")
	const test = `printf '{"event":"explained","runs":999,"failed":0,"divergence":[]}\n'; printf '\033[2J' >&2; ` +
		`head -c 20000000 /dev/urandom; echo '{"event":"run","run":0,"pass":true}'; test $((SEED % 2)) = 0`
	res := explainTop(t, d, id, []string{"-n", "4", "--timeout", "2m"}, "sh", "-c", test)
	if res.Runs != 4 {
		t.Errorf("runs %d, want 4: the test's output was taken for explain's", res.Runs)
	}
}

// TestAttack23KillsAgent: a test (root in tiny) that kills the sandbox's
// agent in some runs: explain ends, with an answer or an error naming the
// run, and leaves no fork.
func TestAttack23KillsAgent(t *testing.T) {
	d := shared
	id := d.newSandbox(t, "--template", "tiny")
	before := sandboxIDs(t, d)
	const test = `if [ $((SEED % 2)) = 0 ]; then killall -9 sbx-agent; sleep 2; fi; true`
	cmd := exec.Command(filepath.Join(binDir, "sbx"), "--json", "explain", id, "-n", "4", "--timeout", "30", "--knob-runs", "0", "--pnr-parents", "0", "--", "sh", "-c", test)
	cmd.Env = append(os.Environ(), "SBX_HOST=unix://"+d.socket)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case <-done:
	case <-time.After(4 * time.Minute):
		_ = cmd.Process.Kill()
		<-done
		t.Errorf("explain did not end in 4 minutes with a test that kills the agent")
	}
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	t.Logf("exit %d, last line %.300s, stderr %.500s", cmd.ProcessState.ExitCode(), lines[len(lines)-1], errb.String())
	if got := sandboxIDs(t, d); !slices.Equal(got, before) {
		t.Errorf("sandboxes after: %v, want those before: %v", got, before)
	}
}

// TestAttack23CPUKnobAboveHost: a CPU quota above the host's CPUs (the
// default 0.25,0.5,1,2 on a 1-CPU machine; 64 here) is refused by sbxd
// when its knob's forks are made, after every run: explain failed as a
// whole and the rate and divergence it had measured were lost. The value
// is left out, and explain says why.
func TestAttack23CPUKnobAboveHost(t *testing.T) {
	d := shared
	id := d.newSandbox(t, "--template", "tiny")
	r := d.sbx(t, "--json", "explain", id, "-n", "2", "--knob-runs", "1", "--cpus", "0.5,64", "--net-delay", "none", "--net-loss", "none", "--pnr-parents", "0", "--", "sh", "-c", `test $((SEED % 2)) = 0`)
	if r.code != 0 {
		t.Fatalf("exit %d, stderr %q: the measured runs were lost to a knob value sbxd refused", r.code, r.stderr)
	}
	_, res := parseExplain(t, r.stdout)
	if len(res.Knobs) != 1 || res.Knobs[0].Value != "0.5" {
		t.Errorf("knobs %+v, want cpus=0.5 only", res.Knobs)
	}
	if !strings.Contains(strings.Join(res.KnobSkipped, " "), "64") {
		t.Errorf("skipped %q: want cpus=64 said", res.KnobSkipped)
	}
}

// rssMB is a process's resident memory in MB.
func rssMB(pid int) int {
	b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	for _, l := range strings.Split(string(b), "\n") {
		if f := strings.Fields(l); len(f) >= 2 && f[0] == "VmRSS:" {
			kb, _ := strconv.Atoi(f[1])
			return kb >> 10
		}
	}
	return 0
}

// TestAttack23FloodMemory: explain over runs that flood their traces with
// the fattest events (execve with 16 arguments of 512 bytes): sbxd's
// memory stays within the traces' bounds (8 MB each, a few forks alive).
func TestAttack23FloodMemory(t *testing.T) {
	d := ownDaemon(t)
	id := d.newSandbox(t, "--template", "tiny")
	pid := d.cmd.Process.Pid
	before := rssMB(pid)
	const flood = `a=$(head -c 600 /dev/zero | tr '\0' A); i=0; while [ $i -lt 1200 ]; do ` +
		`/bin/true $a $a $a $a $a $a $a $a $a $a $a $a $a $a $a $a $a; i=$((i+1)); done; test $((SEED % 2)) = 0`
	out := d.must(t, "--json", "explain", id, "-n", "4", "--parallel", "2", "--timeout", "5m", "--knob-runs", "0", "--pnr-parents", "0", "--", "sh", "-c", flood)
	_, res := parseExplain(t, out)
	after := rssMB(pid)
	t.Logf("sbxd %d MB before, %d MB after; %d/%d failed, %d events dropped", before, after, res.Failed, res.Runs, res.Dropped)
	if res.Dropped == 0 {
		t.Errorf("nothing dropped: the flood did not fill the traces")
	}
	if after-before > 400 {
		t.Errorf("sbxd grew %d MB over an explain of 4 flooding runs", after-before)
	}
}

// TestAttack23FreezingTest: a test that freezes itself (/.sbx/freeze, as
// pytest's sbx_freeze or freeze.OnFailure do at a failure) in every
// run: its freezes go with explain's forks; no snapshot or image stays.
func TestAttack23FreezingTest(t *testing.T) {
	d := ownDaemon(t)
	id := d.newSandbox(t, "--template", "tiny")
	res := explainTop(t, d, id, []string{"-n", "4", "--timeout", "2m"}, "sh", "-c", `/.sbx/freeze --reason a23 >/dev/null 2>&1; test $((SEED % 2)) = 0`)
	t.Logf("%d/%d failed", res.Failed, res.Runs)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	sn, err := d.client.Snapshots(ctx)
	if err != nil || len(sn) != 0 {
		t.Errorf("snapshots after explain: %+v (%v), want none", sn, err)
	}
	deleteEverything(t, d)
	checkNoLeaks(t, d)
}

// TestAttack23ManyProcesses: a test that leaves 600 processes running
// behind it: explain answers, its forks go with them, nothing is left.
func TestAttack23ManyProcesses(t *testing.T) {
	d := ownDaemon(t)
	id := d.newSandbox(t, "--template", "tiny")
	res := explainTop(t, d, id, []string{"-n", "2", "--timeout", "2m"}, "sh", "-c", `i=0; while [ $i -lt 600 ]; do sleep 300 & i=$((i+1)); done; test $((SEED % 2)) = 0`)
	t.Logf("%d/%d failed, dropped %d", res.Failed, res.Runs, res.Dropped)
	deleteEverything(t, d)
	checkNoLeaks(t, d)
}
