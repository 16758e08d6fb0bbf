package e2e

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"sbx.dev/sbx/api"
)

// Attacks on the exec channel (on by default) through captures: every save
// closes a sandbox's host sockets, init's connections among them, while
// execs stream over them.

// slowSeq prints exactly `seq 1 N*step` in N bursts, a pause between: a
// chatty exec whose output can be compared byte for byte.
func slowSeq(n, step int, pause string) string {
	return fmt.Sprintf(`i=0; while [ $i -lt %d ]; do seq $((i*%d+1)) $((i*%d+%d)); i=$((i+1)); sleep %s; done`, n, step, step, step, pause)
}

func seqText(n int) string {
	var b strings.Builder
	for i := 1; i <= n; i++ {
		fmt.Fprintf(&b, "%d\n", i)
	}
	return b.String()
}

// detach starts argv detached in id and returns the exec's id.
func detach(t *testing.T, d *daemon, id string, args ...string) string {
	t.Helper()
	var e api.Exec
	d.jsonOut(t, &e, append([]string{"exec", id, "--detach", "--"}, args...)...)
	return e.ID
}

// wantExecOutput waits for exec ex of id to end and checks its stdout is
// want, whole, and its exit code 0.
func wantExecOutput(t *testing.T, d *daemon, id, ex, what, want string) {
	t.Helper()
	r, hung := sbxWithin(t, d, 3*time.Minute, "logs", id, "--exec", ex, "--follow")
	if hung {
		t.Errorf("%s: logs --follow did not end in 3 min", what)
	}
	if r.stdout != want {
		t.Errorf("%s: output of %d bytes, want %d (the same bytes: %v); first difference at %d", what, len(r.stdout), len(want), r.stdout == want, firstDiff(r.stdout, want))
	}
	x, err := sdk(d.client).GetExec(context.Background(), id, ex)
	if err != nil || x.State != api.ExecExited || x.ExitCode == nil || *x.ExitCode != 0 {
		t.Errorf("%s: its end: %+v, %v; want exited 0", what, x, err)
	}
}

func firstDiff(a, b string) int {
	for i := 0; i < len(a) && i < len(b); i++ {
		if a[i] != b[i] {
			return i
		}
	}
	if len(a) == len(b) {
		return -1
	}
	return min(len(a), len(b))
}

// channelSoon is channelReady with a limit, reporting instead of failing.
func channelSoon(t *testing.T, d *daemon, id string, limit time.Duration) bool {
	t.Helper()
	deadline := time.Now().Add(limit)
	for time.Now().Before(deadline) {
		if out := d.must(t, "exec", id, "--", "true"); out != "" {
			t.Fatalf("true said %q", out)
		}
		if viaChannel(d, id, lastExec(t, d, id).ID) {
			return true
		}
		time.Sleep(100 * time.Millisecond)
	}
	return false
}

// answers checks id answers an exec, and that the running exec ex (if
// any) is still running.
func answers(t *testing.T, d *daemon, id, what string, running ...string) {
	t.Helper()
	r, hung := sbxWithin(t, d, time.Minute, "exec", id, "--", "echo", "ok")
	if hung || r.code != 0 || r.stdout != "ok\n" {
		t.Errorf("%s: an exec in %s: hung=%v %+v", what, id, hung, r)
	}
	for _, e := range mustExecs(t, d, id) {
		for _, want := range running {
			if e.ID == want && e.State != api.ExecRunning {
				t.Errorf("%s: exec %s is %s, want running", what, e.ID, e.State)
			}
		}
	}
}

// channelEvidence logs what sbxd said of sandbox id, and init's sockets.
func channelEvidence(t *testing.T, d *daemon, id string) {
	t.Helper()
	r := d.sbx(t, "exec", "--user", "root", id, "--", "sh", "-c", "ls -l /proc/1/fd | grep -c socket; ls /proc/1/task | wc -l")
	t.Logf("%s: init's sockets, then threads: %q", id, r.stdout)
	b, _ := os.ReadFile(d.logPath)
	var lines []string
	for _, l := range strings.Split(string(b), "\n") {
		if strings.Contains(l, id) && (!strings.Contains(l, "msg=request")) {
			lines = append(lines, l)
		}
	}
	if len(lines) > 40 {
		lines = lines[len(lines)-40:]
	}
	t.Logf("sbxd about %s:\n%s", id, strings.Join(lines, "\n"))
}

// noRunscOf checks no runsc process of a sandbox not in d's list remains.
func noRunscOf(t *testing.T, d *daemon) {
	t.Helper()
	live := map[string]bool{}
	for _, sb := range d.list(t) {
		live[sb.ID] = true
	}
	waitFor(t, "no runsc of a deleted sandbox", 15*time.Second, func() bool {
		for _, id := range runscIDs(d) {
			if !live[id] {
				return false
			}
		}
		return true
	})
}

// TestAttackChanChattyCapturesKeepChannel: a chatty exec (init's copy
// blocked writing to the host socket, its buffer full) while the sandbox
// is captured twice, running on (memory snapshots). Its copy's write is
// never woken after the save closed the socket; the copy is served by one
// of init's two channel loops, which would then be gone for good.
// Want: a byte-exact exec through the captures, and the channel again
// within a few seconds after.
func TestAttackChanChattyCapturesKeepChannel(t *testing.T) {
	d := shared
	id := d.newSandbox(t, "--template", "tiny")
	channelReady(t, d, id)
	chatty := detach(t, d, id, "sh", "-c", "while :; do seq 1 100000; done")
	exact := detach(t, d, id, "sh", "-c", slowSeq(100, 2000, "0.05"))
	time.Sleep(500 * time.Millisecond)
	for i := 0; i < 2; i++ {
		snap := fmt.Sprintf("chatty%d-%s", i, randHex(3))
		d.must(t, "snapshot", id, snap, "--memory")
		t.Cleanup(func() { d.sbx(t, "snapshot", "rm", snap) })
	}
	answers(t, d, id, "after two snapshots with a chatty exec", chatty)
	d.must(t, "kill", "-s", "KILL", id, chatty)
	wantExecOutput(t, d, id, exact, "the byte-exact exec through two snapshots", seqText(200000))
	if !channelSoon(t, d, id, 10*time.Second) {
		t.Errorf("no exec went over the channel in 10 s after two memory snapshots with a chatty exec: init's channel loops are stuck (see its goroutines)")
	}
	noRunscOf(t, d)
}

// TestAttackChanManySnapshotsKeepExec: a quiet detached exec runs through
// four memory snapshots of its sandbox (running on). Each cuts its copy
// over the channel; sbxd attaches again, but only while attaches < 3.
// Want: the exec still running after, and its output whole.
func TestAttackChanManySnapshotsKeepExec(t *testing.T) {
	d := shared
	id := d.newSandbox(t, "--template", "tiny")
	channelReady(t, d, id)
	ex := detach(t, d, id, "sh", "-c", slowSeq(60, 1, "0.5"))
	waitFor(t, "the exec over the channel", 10*time.Second, func() bool { return viaChannel(d, id, ex) })
	for i := 0; i < 4; i++ {
		snap := fmt.Sprintf("many%d-%s", i, randHex(3))
		d.must(t, "snapshot", id, snap, "--memory")
		t.Cleanup(func() { d.sbx(t, "snapshot", "rm", snap) })
		time.Sleep(time.Second) // its copy attached again
		for _, e := range mustExecs(t, d, id) {
			if e.ID == ex && e.State != api.ExecRunning {
				t.Errorf("after memory snapshot %d the quiet exec is %s, want running", i+1, e.State)
			}
		}
	}
	wantExecOutput(t, d, id, ex, "a quiet exec through four memory snapshots", seqText(60))
	noRunscOf(t, d)
}

// TestAttackChanFreezeThenSnapshotsKeepExec: as ManySnapshotsKeepExec,
// a freeze from inside first (gVisor's own checkpoint, of which sbxd
// learns only afterwards; one per boot), then three memory snapshots.
// (It passed before the snapshots reset the count too: the freeze's cut
// did not use up an attach there; a guard, not a break.)
func TestAttackChanFreezeThenSnapshotsKeepExec(t *testing.T) {
	d := shared
	id := d.newSandbox(t, "--template", "tiny")
	channelReady(t, d, id)
	ex := detach(t, d, id, "sh", "-c", slowSeq(80, 1, "0.5"))
	waitFor(t, "the exec over the channel", 10*time.Second, func() bool { return viaChannel(d, id, ex) })
	r, hung := sbxWithin(t, d, 90*time.Second, "exec", "--user", "root", id, "--", "sh", "-c", "/.sbx/freeze --reason many 2>&1")
	m := regexp.MustCompile(`as snapshot (freeze-[A-Za-z0-9._-]+)`).FindStringSubmatch(r.stdout)
	if m == nil {
		t.Fatalf("freeze: hung=%v %+v", hung, r)
	}
	t.Cleanup(func() { d.sbx(t, "snapshot", "rm", m[1]) })
	for i := 0; i < 3; i++ {
		time.Sleep(time.Second)
		snap := fmt.Sprintf("fz%d-%s", i, randHex(3))
		d.must(t, "snapshot", id, snap, "--memory")
		t.Cleanup(func() { d.sbx(t, "snapshot", "rm", snap) })
	}
	time.Sleep(time.Second)
	for _, e := range mustExecs(t, d, id) {
		if e.ID == ex && e.State != api.ExecRunning {
			t.Errorf("after a freeze and three snapshots the quiet exec is %s, want running", e.State)
		}
	}
	wantExecOutput(t, d, id, ex, "a quiet exec through a freeze and three snapshots", seqText(80))
	noRunscOf(t, d)
}

// TestAttackChanBackToBack: memory snapshot, then memory fork, then stop
// and resume, all within a second of each other, an exact exec streaming
// over the channel; then a snapshot right after the resume, and a freeze
// from inside the fork. It failed (twice of two) before init served each
// request in a goroutine of its own: with a quiet exec running for good
// and copies cut by each capture, neither the original nor the fork had
// an exec over the channel within 10 s of the captures.
func TestAttackChanBackToBack(t *testing.T) {
	d := shared
	id := d.newSandbox(t, "--template", "tiny")
	channelReady(t, d, id)
	quiet := detach(t, d, id, "sh", "-c", "while :; do date +%s%N > /tmp/now.t && mv /tmp/now.t /tmp/now; sleep 0.2; done")
	exact := detach(t, d, id, "sh", "-c", slowSeq(200, 1000, "0.05"))
	time.Sleep(300 * time.Millisecond)
	snap := "b2b-" + randHex(3)
	d.must(t, "snapshot", id, snap, "--memory")
	t.Cleanup(func() { d.sbx(t, "snapshot", "rm", snap) })
	kids := forkMemory(t, d, id, 1)
	d.must(t, "stop", id, "--wait")
	d.must(t, "resume", id)
	snap2 := "b2b2-" + randHex(3)
	d.must(t, "snapshot", id, snap2, "--memory")
	t.Cleanup(func() { d.sbx(t, "snapshot", "rm", snap2) })
	answers(t, d, id, "the original after snapshot, fork, stop, resume, snapshot", quiet)
	wantExecOutput(t, d, id, exact, "the exact exec through five captures", seqText(200000))

	// the fork: a freeze from inside, then another capture of it
	k := kids[0]
	if !channelSoon(t, d, k, 10*time.Second) {
		t.Errorf("the memory fork: no exec over the channel in 10 s")
	}
	r := d.sbx(t, "exec", k, "--", "sh", "-c", "/.sbx/freeze --reason attack-chan 2>&1")
	m := regexp.MustCompile(`as snapshot (freeze-[A-Za-z0-9._-]+)`).FindStringSubmatch(r.stdout)
	if m == nil {
		t.Errorf("a freeze in a memory fork: %+v", r)
	} else {
		t.Cleanup(func() { d.sbx(t, "snapshot", "rm", m[1]) })
		c := d.newSandbox(t, "--from", m[1])
		answers(t, d, c, "a copy of the fork's freeze")
	}
	snap3 := "b2b3-" + randHex(3)
	d.must(t, "snapshot", k, snap3, "--memory")
	t.Cleanup(func() { d.sbx(t, "snapshot", "rm", snap3) })
	answers(t, d, k, "the fork after a freeze and a snapshot")
	for _, s := range []struct{ id, what string }{{id, "the original"}, {k, "the fork"}} {
		if !channelSoon(t, d, s.id, 10*time.Second) {
			t.Errorf("%s %s: no exec over the channel in 10 s after the captures", s.what, s.id)
			channelEvidence(t, d, s.id)
		}
	}
	noRunscOf(t, d)
}

// TestAttackChanForkWhileStreaming: fork --memory 3 ways while two exact
// execs stream; then again. The original's execs end whole; every fork
// answers over the channel.
func TestAttackChanForkWhileStreaming(t *testing.T) {
	d := shared
	id := d.newSandbox(t, "--template", "tiny")
	channelReady(t, d, id)
	a := detach(t, d, id, "sh", "-c", slowSeq(150, 1000, "0.05"))
	b := detach(t, d, id, "sh", "-c", slowSeq(150, 1000, "0.03"))
	time.Sleep(300 * time.Millisecond)
	kids := forkMemory(t, d, id, 3)
	kids = append(kids, forkMemory(t, d, id, 2)...)
	wantExecOutput(t, d, id, a, "exec a through two memory forks", seqText(150000))
	wantExecOutput(t, d, id, b, "exec b through two memory forks", seqText(150000))
	for _, k := range kids {
		answers(t, d, k, "a memory fork")
		if !channelSoon(t, d, k, 10*time.Second) {
			t.Errorf("fork %s: no exec over the channel in 10 s", k)
		}
	}
	if !channelSoon(t, d, id, 10*time.Second) {
		t.Errorf("the original: no exec over the channel in 10 s after two forks")
	}
	noRunscOf(t, d)
}

// TestAttackChanStopChattyQuiet: stop with memory while a chatty and a
// quiet exec run; resume and at once snapshot again; both run on, the
// exact one ends whole.
func TestAttackChanStopChattyQuiet(t *testing.T) {
	d := shared
	id := d.newSandbox(t, "--template", "tiny")
	channelReady(t, d, id)
	chatty := detach(t, d, id, "sh", "-c", "while :; do seq 1 100000; done")
	quiet := detach(t, d, id, "sleep", "600")
	exact := detach(t, d, id, "sh", "-c", slowSeq(100, 2000, "0.05"))
	time.Sleep(500 * time.Millisecond)
	d.must(t, "stop", id, "--wait")
	d.must(t, "resume", id)
	snap := "stopchat-" + randHex(3)
	d.must(t, "snapshot", id, snap, "--memory")
	t.Cleanup(func() { d.sbx(t, "snapshot", "rm", snap) })
	answers(t, d, id, "after stop, resume, snapshot with a chatty and a quiet exec", chatty, quiet)
	d.must(t, "kill", "-s", "KILL", id, chatty)
	wantExecOutput(t, d, id, exact, "the exact exec through stop, resume and snapshot", seqText(200000))
	if !channelSoon(t, d, id, 10*time.Second) {
		t.Errorf("no exec over the channel in 10 s after stop, resume and snapshot with a chatty exec")
	}
	noRunscOf(t, d)
}

// TestAttackChanTwoLongExecs: two detached long execs, then more execs:
// init serves each exec in one of its two channel loops until it ends, so
// two long ones leave no connection for the rest.
func TestAttackChanTwoLongExecs(t *testing.T) {
	d := shared
	id := d.newSandbox(t, "--template", "tiny")
	channelReady(t, d, id)
	detach(t, d, id, "sleep", "600")
	detach(t, d, id, "sleep", "600")
	time.Sleep(time.Second)
	n := 0
	for i := 0; i < 5; i++ {
		d.must(t, "exec", id, "--", "true")
		if viaChannel(d, id, lastExec(t, d, id).ID) {
			n++
		}
	}
	if n < 5 {
		t.Errorf("with two detached execs running, %d of 5 later execs went over the channel; want all (init keeps two loops, each held by the exec it serves)", n)
	}
}

// TestAttackChanSbxdKilledChatty: sbxd is SIGKILLed while a chatty and an
// exact exec stream over the channel, restarted; both re-attach, the exact
// one ends whole, and the channel serves again.
func TestAttackChanSbxdKilledChatty(t *testing.T) {
	d, err := startDaemon(nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.stop(true) })
	id := d.newSandbox(t, "--template", "tiny")
	channelReady(t, d, id)
	chatty := detach(t, d, id, "sh", "-c", "while :; do seq 1 100000; done")
	exact := detach(t, d, id, "sh", "-c", slowSeq(100, 2000, "0.05"))
	time.Sleep(700 * time.Millisecond)
	d.kill(syscall.SIGKILL)
	if err := d.start(nil); err != nil {
		t.Fatal(err)
	}
	answers(t, d, id, "after sbxd was killed", chatty)
	d.must(t, "kill", "-s", "KILL", id, chatty)
	wantExecOutput(t, d, id, exact, "the exact exec through a kill of sbxd", seqText(200000))
	if !channelSoon(t, d, id, 15*time.Second) {
		t.Errorf("no exec over the channel in 15 s after sbxd was killed mid-stream")
	}
	// killed again, this time during a capture's aftermath
	snap := "killed-" + randHex(3)
	d.must(t, "snapshot", id, snap, "--memory")
	d.kill(syscall.SIGKILL)
	if err := d.start(nil); err != nil {
		t.Fatal(err)
	}
	answers(t, d, id, "after a snapshot and a second kill")
	d.must(t, "snapshot", "rm", snap)
	for _, sb := range d.list(t) {
		d.must(t, "rm", "--force", sb.ID)
	}
	checkNoLeaks(t, d)
}

const holderSrc = `package main

import (
	"net"
	"os"
	"strconv"
	"time"
)

// hold N SECS: keep N connections to the channel, pinging as init does,
// redialing, for SECS seconds; a connection given anything is closed
// (unless ping-on, which pings on regardless and reads nothing).
// churn N SECS: N goroutines dialing and closing as fast as they can.
func main() {
	mode := os.Args[1]
	n, _ := strconv.Atoi(os.Args[2])
	secs, _ := strconv.Atoi(os.Args[3])
	for i := 0; i < n; i++ {
		go func() {
			for {
				c, err := net.Dial("unix", "/run/sbx/chan/agent.sock")
				if err != nil {
					time.Sleep(5 * time.Millisecond)
					continue
				}
				if mode == "churn" {
					c.Close()
					continue
				}
				if mode == "hold" {
					go func() {
						var b [1]byte
						c.Read(b[:])
						c.Close()
					}()
				}
				for {
					c.SetWriteDeadline(time.Now().Add(time.Second))
					if _, err := c.Write([]byte{0}); err != nil {
						break
					}
					time.Sleep(300 * time.Millisecond)
				}
				c.Close()
			}
		}()
	}
	os.WriteFile("/tmp/holder-"+mode, []byte("up\n"), 0o644)
	time.Sleep(time.Duration(secs) * time.Second)
}
`

func buildHolder(t *testing.T) string {
	return buildGoProgram(t, "holder", holderSrc)
}

// buildGoProgram builds src, a main package of the standard library only,
// into a static binary called name for a sandbox, and returns its path.
func buildGoProgram(t *testing.T, name, src string) string {
	t.Helper()
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "main.go"), []byte(src), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "go.mod"), []byte("module "+name+"\n\ngo 1.21\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("go", "build", "-o", name, ".")
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOFLAGS=-mod=mod")
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("build the %s: %v %s", name, err, b)
	}
	return filepath.Join(dir, name)
}

// TestAttackChanPingingHolderHangsExec: root inside holds connections to
// the channel's socket that ping as init's idle ones do, and go on pinging
// after a request comes. sbxd takes the newest idle connection for an
// exec, and skips any number of pings before the first frame, each one
// resetting its 30 s stall: the exec hangs for as long as root pings,
// where a stall of 30 s should lose the copy and attach again.
// Want: the exec ends (answered, or lost) within 75 s.
func TestAttackChanPingingHolderHangsExec(t *testing.T) {
	d := shared
	id := d.newSandbox(t, "--template", "tiny")
	channelReady(t, d, id)
	upload(t, d, id, buildHolder(t), "/h")
	detach(t, d, id, "/h", "ping-on", "12", "600")
	time.Sleep(2 * time.Second)
	r, hung := sbxWithin(t, d, 75*time.Second, "exec", id, "--", "echo", "ok")
	// it may be lost (root took every copy of it): that is root's to do;
	// hanging past the stall is not
	if hung {
		t.Errorf("an exec with root's pinging connections on the channel: hung for 75 s %+v; want an end (ok, or lost) within the 30 s stall and the attaches", r)
	}
}

// TestAttackChanRootHoldsSockets: root inside holds many connections to
// the channel's socket (closing any that is given a request) and churns
// others (dial, close), for a few seconds, while the sandbox is captured
// back to back (two memory snapshots, a 2-way memory fork); then a stop
// and resume and a freeze. Every capture succeeds; the sandbox and every
// copy answer; nothing leaks.
func TestAttackChanRootHoldsSockets(t *testing.T) {
	d := shared
	id := d.newSandbox(t, "--template", "tiny")
	channelReady(t, d, id)
	upload(t, d, id, buildHolder(t), "/h")
	detach(t, d, id, "sh", "-c", "/h hold 20 8 & /h churn 4 8 & wait")
	began := time.Now()
	time.Sleep(1500 * time.Millisecond)
	var snaps []string
	for i := 0; i < 2; i++ {
		s := fmt.Sprintf("hold%d-%s", i, randHex(3))
		d.must(t, "snapshot", id, s, "--memory")
		snaps = append(snaps, s)
		t.Cleanup(func() { d.sbx(t, "snapshot", "rm", s) })
	}
	kids := forkMemory(t, d, id, 2)
	if el := time.Since(began); el > 8*time.Second {
		t.Logf("the captures took until %s after the holders began: some after they ended", el)
	}
	time.Sleep(time.Until(began.Add(10 * time.Second)))
	d.must(t, "stop", id, "--wait")
	d.must(t, "resume", id)
	r, hung := sbxWithin(t, d, 90*time.Second, "exec", "--user", "root", id, "--", "sh", "-c", "/.sbx/freeze --reason holders 2>&1")
	if m := regexp.MustCompile(`as snapshot (freeze-[A-Za-z0-9._-]+)`).FindStringSubmatch(r.stdout); m == nil {
		t.Errorf("a freeze after root held the channel's sockets: hung=%v %+v", hung, r)
	} else {
		snaps = append(snaps, m[1])
		t.Cleanup(func() { d.sbx(t, "snapshot", "rm", m[1]) })
	}
	answers(t, d, id, "the original after captures with root holding sockets")
	for _, s := range snaps {
		c := d.newSandbox(t, "--from", s)
		answers(t, d, c, "a copy from "+s)
		d.must(t, "rm", c, "--yes")
	}
	for _, k := range kids {
		answers(t, d, k, "a memory fork with holders")
	}
	noRunscOf(t, d)
}
