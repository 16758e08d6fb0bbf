package e2e

// The attacker's suite: a hostile program inside a sandbox, root in there.
// Each test names what it did; a test that fails today says, in its
// failure message, what went wrong and what should have happened.

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"sbx.dev/sbx/api"
	"sbx.dev/sbx/client"
)

// putFile writes content to path in sandbox id.
func putFile(t *testing.T, d *daemon, id, path, content string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := sdk(d.client).WriteFile(ctx, id, path, strings.NewReader(content), int64(len(content)), 0o755); err != nil {
		t.Fatalf("write %s into %s: %v", path, id, err)
	}
}

// detachRoot starts cmd detached as root in sandbox id.
func detachRoot(t *testing.T, d *daemon, id string, cmd ...string) string {
	t.Helper()
	x, err := sdk(d.client).ExecDetached(context.Background(), id, api.ExecRequest{Cmd: cmd, Detach: true, User: "root"})
	if err != nil {
		t.Fatalf("start %v in %s: %v", cmd, id, err)
	}
	return x.ID
}

// TestAttackRunSbxFills: every exec's output is kept inside the sandbox in
// /run/sbx/execs, a 512 MiB tmpfs, until init prunes ended commands (past
// 256 of them or 128 MiB). A command that prints more than fits (600 MB:
// a verbose test suite, a server's log over a day) gets ENOSPC on its own
// stdout inside, although the host keeps only its head and tail; then init
// cannot even write its exit file, so the command never counts as ended,
// is never pruned, and every later exec fails with `spawn ...: no space
// left on device`: the sandbox can run nothing any more. What has been
// copied out should not fill the sandbox, and one exec's output should
// never make later execs fail.
func TestAttackRunSbxFills(t *testing.T) {
	knownGap(t, "a command's output past /run/sbx's room still fills it (README, Known limits)")
	d := shared
	id := d.newSandbox(t, "--template", "tiny")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	run := func(cmd string) (*api.Exec, string, error) {
		var out, errb strings.Builder
		e, err := sdk(d.client).Exec(ctx, id, api.ExecRequest{Cmd: []string{"sh", "-c", cmd}, Timeout: api.Duration(2 * time.Minute)}, io.Discard, &errb)
		_ = out
		return e, errb.String(), err
	}
	code := func(e *api.Exec) string {
		if e == nil || e.ExitCode == nil {
			return "none"
		}
		return fmt.Sprint(*e.ExitCode)
	}
	t.Run("many execs, 600 MB in all (held)", func(t *testing.T) {
		for i := range 6 {
			e, stderr, err := run("dd if=/dev/zero bs=1M count=100 2>/dev/null")
			if err != nil || code(e) != "0" {
				t.Fatalf("exec %d of 100 MB: err %v, exit %s, stderr %q", i, err, code(e), lastBytes(stderr, 200))
			}
		}
	})
	t.Run("one exec of 600 MB", func(t *testing.T) {
		e, stderr, err := run("dd if=/dev/zero bs=1M count=600 2>/dev/null || echo dd failed: $? >&2")
		if err != nil || code(e) != "0" || stderr != "" {
			t.Errorf("an exec printing 600 MB: err %v, exit %s, stderr %q: its writes to stdout failed inside the sandbox (the 512 MiB /run/sbx is full), though the host keeps only its head and tail", err, code(e), lastBytes(stderr, 200))
		}
		var out, errb strings.Builder
		e, err = sdk(d.client).Exec(ctx, id, api.ExecRequest{Cmd: []string{"echo", "still here"}, Timeout: api.Duration(30 * time.Second)}, &out, &errb)
		if err != nil || code(e) != "0" || out.String() != "still here\n" {
			t.Errorf("after one exec printed 600 MB, `echo still here` fails: err %v, exit %s, stdout %q, stderr %q; "+
				"the big exec's output fills the sandbox's 512 MiB /run/sbx tmpfs, its exit cannot be recorded, so it is never pruned, and every later exec fails",
				err, code(e), out.String(), lastBytes(errb.String(), 200))
		}
	})
}

// TestAttackLiveStreamPastHead: a stream's first 32 MiB go to its file as
// they come, and what comes after is kept in memory until the stream ends.
// So past 32 MiB a live stream goes silent: `echo MARKER > /dev/console`
// (the marker channel the README offers) is invisible for as long as the
// sandbox runs, and `sbx logs --exec ID --follow` of a server that has
// logged 32 MiB shows nothing new, ever, until the server ends. Any process
// in the sandbox can blind the console for everyone with one write.
func TestAttackLiveStreamPastHead(t *testing.T) {
	knownGap(t, "a stream past its head is not followed live (README, Known limits)")
	d := shared
	id := d.newSandbox(t, "--template", "tiny")
	t.Run("console", func(t *testing.T) {
		d.must(t, "exec", "--timeout", "120", id, "--", "sh", "-c", "dd if=/dev/zero bs=1M count=40 of=/dev/console 2>/dev/null; echo MARKER-CONSOLE > /dev/console")
		deadline := time.Now().Add(15 * time.Second)
		for {
			r := d.sbx(t, "logs", id, "--stream", "console", "--tail", "3")
			if strings.Contains(r.stdout, "MARKER-CONSOLE") {
				return
			}
			if time.Now().After(deadline) {
				t.Errorf("a marker written to /dev/console after 40 MiB of console output is not in `sbx logs --tail 3` 15 s later (last bytes %q): past the 32 MiB head the console keeps its tail only in the shim's memory, until the sandbox ends", lastBytes(r.stdout, 16))
				return
			}
			time.Sleep(time.Second)
		}
	})
	t.Run("detached exec", func(t *testing.T) {
		x := d.must(t, "exec", "-d", id, "--", "sh", "-c", "dd if=/dev/zero bs=1M count=40 2>/dev/null; echo MARKER-EXEC; exec sleep 600")
		ex := strings.Fields(x)[0]
		deadline := time.Now().Add(30 * time.Second)
		for {
			r := d.sbx(t, "logs", id, "--exec", ex, "--tail", "2")
			if strings.Contains(r.stdout, "MARKER-EXEC") {
				return
			}
			if time.Now().After(deadline) {
				t.Errorf("a running detached exec printed 40 MiB and then MARKER-EXEC; `sbx logs --exec %s --tail 2` does not show it after 30 s (last bytes %q): its output past 32 MiB is invisible until it ends", ex, lastBytes(r.stdout, 16))
				return
			}
			time.Sleep(time.Second)
		}
	})
}

// lastBytes is the end of s, at most n bytes.
func lastBytes(s string, n int) string {
	if len(s) > n {
		return s[len(s)-n:]
	}
	return s
}

// liarScript watches for the agent that sbxd runs for one inspection verb
// (`sbx-agent ports`, `ls`, `stat`), stops it, writes into its stdout (the
// pipe to sbxd) a JSON array of millions of empty objects, lets the agent
// add its own answer, and closes the array: a valid JSON document of less
// than sbxd's 16 MiB answer cap. Root in a sandbox can do this with
// CAP_SYS_PTRACE, which sbx keeps for gdb.
const liarScript = `import os, sys, time, signal
verb = sys.argv[1].encode()
payload = b"[" + b"{}," * int(sys.argv[2])
seen = set()
while True:
    for p in os.listdir("/proc"):
        if not p.isdigit() or p in seen:
            continue
        try:
            cl = open("/proc/%s/cmdline" % p, "rb").read().split(b"\0")
        except Exception:
            continue
        if len(cl) > 1 and cl[0].endswith(b"sbx-agent") and verb in cl[1:2]:
            seen.add(p)
            try:
                os.kill(int(p), signal.SIGSTOP)
                fd = os.open("/proc/%s/fd/1" % p, os.O_WRONLY)
                m = 0
                while m < len(payload):
                    m += os.write(fd, payload[m:])
                os.kill(int(p), signal.SIGCONT)
                for _ in range(300):
                    if not os.path.exists("/proc/%s" % p) or b"Z" in open("/proc/%s/stat" % p, "rb").read().split(b")")[1][:3]:
                        break
                    time.sleep(0.01)
                os.write(fd, b"]")
                os.close(fd)
                print("lied to", p, flush=True)
            except Exception as e:
                print("failed", p, e, flush=True)
    time.sleep(0.002)
`

// TestAttackLyingAgentAmplifies: sbxd caps an agent's answer at 16 MiB, but
// then decodes it whole: 16 MiB of `{},` is 5.5 million structs. One `sbx
// ports` against a sandbox that lies so took sbxd from ~20 MB to ~700 MB of
// resident memory, and about 50 s (the 30 s inspection bound does not cover
// the decoding); calls at once multiply it. Issue #11 wants every answer
// bounded so that sbxd's memory stays bounded: a bound on bytes is not one
// on what they decode to.
func TestAttackLyingAgentAmplifies(t *testing.T) {
	d, err := startDaemon(nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.stop(true) })
	id := d.newSandbox(t, "--template", "base")
	putFile(t, d, id, "/tmp/liar.py", liarScript)
	detachRoot(t, d, id, "python3", "/tmp/liar.py", "ports", "5500000")
	time.Sleep(2 * time.Second) // the script's watch loop runs by now: it says nothing when it does
	before := rssKB(t, d, "VmRSS")
	start := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	ports, err := sdk(d.client).Ports(ctx, id)
	took := time.Since(start)
	peak := rssKB(t, d, "VmHWM")
	t.Logf("ports: %d entries, err %v, in %s; sbxd RSS %d MB before, peak %d MB", len(ports), err, took.Round(time.Millisecond), before>>10, peak>>10)
	if peak-before > 200<<10 {
		t.Errorf("one `sbx ports` of a sandbox whose root wrote a 16 MiB JSON array of empty objects into the agent's answer grew sbxd's resident memory from %d MB to %d MB: the answer's bytes are capped, not what they decode to; cap the entries (or stream-decode) so one call costs a few MB", before>>10, peak>>10)
	}
	if took > 45*time.Second {
		t.Errorf("the lying `sbx ports` took %s: the 30 s bound of an inspection does not cover decoding its answer", took.Round(time.Second))
	}
	if err == nil && len(ports) > 100000 {
		t.Errorf("sbxd passed on %d ports from a lying agent", len(ports))
	}
}

// holdScript keeps every exec copier's stdout (its pipe to the host's
// shim) open from another process: root in the sandbox reopens
// /proc/PID/fd/1 of each `sbx-agent start` and never closes it.
const holdScript = `import os, time
seen = set(); held = []
while True:
    for p in os.listdir("/proc"):
        if not p.isdigit() or p in seen:
            continue
        try:
            cl = open("/proc/%s/cmdline" % p, "rb").read().split(b"\0")
        except Exception:
            continue
        if len(cl) > 1 and cl[0].endswith(b"sbx-agent") and cl[1] in (b"start", b"attach"):
            seen.add(p)
            try:
                held.append(os.open("/proc/%s/fd/1" % p, os.O_WRONLY))
                print("holding", p, flush=True)
            except Exception as e:
                print("failed", p, e, flush=True)
    time.sleep(0.002)
`

// TestAttackHeldCopierPipe: a process in the sandbox that holds the exec
// copiers' output pipes open makes every exec endless as sbxd sees it:
// `sbx exec ID -- echo hello` prints hello and then never returns (the
// 30 s default timeout is enforced inside the sandbox, where the command
// has long ended), the exec stays `running` for ever, which exempts the
// sandbox from the idle reaper, and its shim never ends on the host. The
// copier's exit frame says the command ended; the shim should end the exec
// there (or bound the wait for EOF after it). Without the exec channel:
// over it, the copier is init's own goroutine (TestAttackHeldCopierPipeChannel).
func TestAttackHeldCopierPipe(t *testing.T) {
	testHeldCopierPipe(t, shimShared(t))
}

// TestAttackHeldCopierPipeChannel: the same over the exec channel.
func TestAttackHeldCopierPipeChannel(t *testing.T) {
	testHeldCopierPipe(t, shared)
}

func testHeldCopierPipe(t *testing.T, d *daemon) {
	id := d.newSandbox(t, "--template", "base")
	putFile(t, d, id, "/tmp/hold.py", holdScript)
	detachRoot(t, d, id, "python3", "/tmp/hold.py")
	time.Sleep(2 * time.Second) // the script's watch loop runs by now: it says nothing when it does
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var out bytes.Buffer
	start := time.Now()
	e, err := sdk(d.client).Exec(ctx, id, api.ExecRequest{Cmd: []string{"echo", "hello"}, Timeout: api.Duration(10 * time.Second)}, &out, io.Discard)
	if err != nil {
		t.Errorf("`echo hello` (timeout 10s) in a sandbox whose root holds the copiers' pipes open: %v after %s, stdout %q; the command ended at once, and its exec never does as sbxd sees it", err, time.Since(start).Round(time.Second), out.String())
	} else if e.ExitCode == nil || *e.ExitCode != 0 {
		t.Errorf("`echo hello` exited %v", e.ExitCode)
	}
	var ex []api.Exec
	ex, err = sdk(d.client).Execs(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	for _, x := range ex {
		if len(x.Cmd) > 0 && x.Cmd[0] == "echo" && x.State == api.ExecRunning {
			t.Errorf("exec %s (`echo hello`) is still %s %s after it ended: a running exec keeps the sandbox from the idle reaper for ever", x.ID, x.State, time.Since(start).Round(time.Second))
		}
	}
}

// TestAttackKillCopiers (held): root kills every exec copier; a detached
// command goes on and its output is still followed (a new copier attaches).
// Copiers are processes without the exec channel.
func TestAttackKillCopiers(t *testing.T) {
	d := shimShared(t)
	id := d.newSandbox(t, "--template", "tiny")
	x := d.must(t, "exec", "-d", id, "--", "sh", "-c", "i=0; while :; do i=$((i+1)); echo tick $i; sleep 0.5; done")
	ex := strings.Fields(x)[0]
	waitFor(t, "the detached command's copier at work", 20*time.Second, func() bool { return strings.Contains(d.sbx(t, "logs", id, "--exec", ex).stdout, "tick 2\n") })
	d.sbx(t, "exec", id, "--", "sh", "-c", `for p in /proc/[0-9]*; do c=$(tr "\0" " " < $p/cmdline 2>/dev/null); case "$c" in *"sbx-agent start"*|*"sbx-agent attach"*) kill -9 ${p#/proc/};; esac; done`)
	last := func() int {
		r := d.sbx(t, "logs", id, "--exec", ex, "--tail", "1")
		var n int
		fmt.Sscanf(strings.TrimSpace(r.stdout), "tick %d", &n)
		return n
	}
	a := last()
	waitFor(t, "the detached command's output to go on after its copiers were killed", 20*time.Second, func() bool { return last() > a+3 })
	for _, e := range mustExecs(t, d, id) {
		if e.ID == ex && e.State != api.ExecRunning {
			t.Errorf("the detached exec is %s after its copier was killed", e.State)
		}
	}
}

func mustExecs(t *testing.T, d *daemon, id string) []api.Exec {
	t.Helper()
	ex, err := sdk(d.client).Execs(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	return ex
}

// TestAttackKillInit (held): root sends SIGTERM to init (the agent, pid
// 1). The sandbox ends; sbxd shows it as error with a reason, its execs as
// lost, its neighbours go on, and it can be deleted leaving nothing.
func TestAttackKillInit(t *testing.T) {
	d := shared
	other := d.newSandbox(t, "--template", "tiny")
	id, err := sdk(d.client).Create(context.Background(), client.WithTemplate("tiny"))
	if err != nil {
		t.Fatal(err)
	}
	d.must(t, "exec", "-d", id.ID, "--", "sleep", "1000")
	d.sbx(t, "exec", id.ID, "--", "kill", "1")
	waitFor(t, "the sandbox whose init was killed to be shown as error", 20*time.Second, func() bool {
		sb := d.info(t, id.ID)
		return sb.State == api.StateError && sb.Reason != ""
	})
	for _, e := range mustExecs(t, d, id.ID) {
		if e.State == api.ExecRunning {
			t.Errorf("exec %s is still running in a sandbox that ended", e.ID)
		}
	}
	if out := d.must(t, "exec", other, "--", "echo", "ok"); out != "ok\n" {
		t.Errorf("the neighbour printed %q", out)
	}
	if err := sdk(d.client).Delete(context.Background(), id.ID); err != nil {
		t.Errorf("delete the sandbox whose init was killed: %v", err)
	}
	if _, err := os.Stat(filepath.Join(d.dir, "sandboxes", id.ID)); err == nil {
		t.Errorf("its directory is left after the delete")
	}
}

// TestAttackPidsLimitTimeout: a command that forks until the sandbox's
// pids limit (RLIMIT_NPROC, per user) runs under `--timeout 10s`. At the
// deadline the agent that enforces the timeout (a Go program running as the
// same user) cannot get a thread: it dies with a Go runtime crash dump
// (`fatal error: newosproc`, a few hundred lines, shown to the user as the
// command's stderr), exits 2 instead of 124, and kills nothing: the forked
// processes stay. Every later exec as that user then fails with the same
// crash dump. The timeout is the platform's promise ("kills the group and
// every descendant"); it should hold at the pids limit, and no Go crash dump
// should reach a user.
func TestAttackPidsLimitTimeout(t *testing.T) {
	d := shared
	id := d.newSandbox(t, "--template", "base", "--pids", "64")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var errb strings.Builder
	e, err := sdk(d.client).Exec(ctx, id, api.ExecRequest{Cmd: []string{"bash", "-c", "for i in $(seq 1 200); do sleep 1000 & done; wait"}, Timeout: api.Duration(10 * time.Second)}, io.Discard, &errb)
	if err != nil {
		t.Fatalf("exec: %v", err)
	}
	if e.ExitCode == nil || *e.ExitCode != 124 {
		t.Errorf("a command that hit its pids limit under --timeout 10s exited %s, want 124 (timed out)", exitOf(e))
	}
	if strings.Contains(errb.String(), "goroutine ") || strings.Contains(errb.String(), "fatal error") {
		t.Errorf("the command's stderr holds a Go runtime crash of sbx's agent: %q", lastBytes(firstLine(errb.String(), "fatal error"), 200))
	}
	var out strings.Builder
	e, err = sdk(d.client).Exec(ctx, id, api.ExecRequest{Cmd: []string{"sh", "-c", "ps -e --no-headers | grep -c sleep"}, Timeout: api.Duration(10 * time.Second), User: "root"}, &out, io.Discard)
	if err == nil && strings.TrimSpace(out.String()) != "0" {
		t.Errorf("%s sleeps of the timed-out command are left: the timeout killed nothing (its agent crashed)", strings.TrimSpace(out.String()))
	}
	errb.Reset()
	out.Reset()
	e, err = sdk(d.client).Exec(ctx, id, api.ExecRequest{Cmd: []string{"echo", "ok"}, Timeout: api.Duration(10 * time.Second)}, &out, &errb)
	if err != nil || e.ExitCode == nil || *e.ExitCode != 0 || out.String() != "ok\n" {
		t.Errorf("after the timed-out command, `echo ok` as the sandbox's user: err %v, stdout %q, stderr %q", err, out.String(), lastBytes(firstLine(errb.String(), "fatal error"), 200))
	}
}

// firstLine is the line of s that holds sub, or s.
func firstLine(s, sub string) string {
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			return l
		}
	}
	return s
}

// exitOf is an exec's exit code as text, "none" if it has none.
func exitOf(e *api.Exec) string {
	if e == nil || e.ExitCode == nil {
		return "none"
	}
	return fmt.Sprint(*e.ExitCode)
}

// TestAttackDiskLimitEtcFiles: a sandbox's disk changes are capped by its
// overlay (`--disk`), but /etc/hosts and /etc/resolv.conf are bound
// read-write from files in the sandbox's directory on the host, outside
// the overlay. Root inside writes 300 MB into each with `--disk 100M`: the
// host's data dir takes 600 MB, without limit. DESIGN §3: "Past its disk
// limit a sandbox sees ENOSPC; the host's disk is not its to fill." These
// files should be read-only binds, or counted and capped.
func TestAttackDiskLimitEtcFiles(t *testing.T) {
	d := shared
	id := d.newSandbox(t, "--template", "tiny", "--disk", "100M")
	r := d.sbx(t, "exec", "--timeout", "120", id, "--", "sh", "-c", "dd if=/dev/zero of=/big bs=1M count=200 2>/dev/null; echo overlay $?; rm -f /big; for f in /etc/hosts /etc/resolv.conf /etc/hostname; do dd if=/dev/zero of=$f bs=1M count=300 2>/dev/null; echo $f $?; done")
	t.Logf("inside: %s", strings.TrimSpace(r.stdout))
	if !strings.Contains(r.stdout, "overlay 1") {
		t.Errorf("200 MB written under --disk 100M did not fail: %q", r.stdout)
	}
	var total int64
	filepath.Walk(filepath.Join(d.dir, "sandboxes", id), func(p string, fi os.FileInfo, err error) error {
		if err == nil && !fi.IsDir() && fi.Size() > 50<<20 {
			t.Errorf("the host holds %s of %d MB, written by a sandbox with --disk 100M: its /etc binds are outside the disk limit", p, fi.Size()>>20)
			total += fi.Size()
		}
		return nil
	})
	if total > 0 {
		t.Logf("%d MB on the host outside the sandbox's 100 MB disk limit", total>>20)
	}
}

// TestAttackPreviewOutlivesDelete: a request through the preview proxy to
// a sandbox whose app holds it open (a slow response, a WebSocket) stays
// open after the sandbox is deleted, with no answer: the proxy keeps the
// client's connection, a goroutine and a slot of its connection limit for
// as long as the client wishes (curl waited out its own 100 s limit). A
// delete should end the connections into the sandbox it deletes (a 502, or
// a close).
func TestAttackPreviewOutlivesDelete(t *testing.T) {
	previewAddr := freePort()
	d, err := startDaemon([]string{"--preview-listen", previewAddr})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.stop(true) })
	id := d.newSandbox(t, "--template", "tiny")
	d.must(t, "exec", "-d", id, "--", "sh", "-c", "nc -l -p 8080 -e sleep 1000")
	waitFor(t, "nc listening on 8080", 20*time.Second, listening(d, id, 8080))
	d.must(t, "preview", id, "8080")
	c, err := net.DialTimeout("tcp", previewAddr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	fmt.Fprintf(c, "GET / HTTP/1.1\r\nHost: 8080-%s.localhost\r\n\r\n", id)
	time.Sleep(2 * time.Second) // the request reaches nc through the proxy: the count below holds its descriptors
	before := fdCount(t, d.cmd.Process.Pid)
	if err := sdk(d.client).Delete(context.Background(), id); err != nil {
		t.Fatalf("delete: %v", err)
	}
	c.SetReadDeadline(time.Now().Add(15 * time.Second))
	buf := make([]byte, 4096)
	var got []byte
	var rerr error
	for rerr == nil && !bytes.Contains(got, []byte("\r\n\r\n")) {
		var n int
		n, rerr = c.Read(buf)
		got = append(got, buf[:n]...)
	}
	t.Logf("after the delete the client got %q, %v", lastBytes(string(got), 200), rerr)
	if len(got) > 0 && !bytes.HasPrefix(got, []byte("HTTP/1.1 502")) {
		t.Errorf("the request into a deleted sandbox was answered %q, want a 502", lastBytes(string(got), 100))
	}
	if ne, ok := rerr.(net.Error); ok && ne.Timeout() && len(got) == 0 {
		t.Errorf("a preview request into sandbox %s is still open, unanswered, 15 s after the sandbox was deleted (sbxd holds %d descriptors, %d before the delete): the proxy keeps the client's connection for as long as the client wants", id, fdCount(t, d.cmd.Process.Pid), before)
	}
}

// stallScript stops every agent sbxd runs for one inspection verb and
// leaves it stopped: an answer that never comes.
const stallScript = `import os, sys, time, signal
verb = sys.argv[1].encode()
seen = set()
while True:
    for p in os.listdir("/proc"):
        if not p.isdigit() or p in seen:
            continue
        try:
            cl = open("/proc/%s/cmdline" % p, "rb").read().split(b"\0")
        except Exception:
            continue
        if len(cl) > 1 and cl[0].endswith(b"sbx-agent") and verb in cl[1:2]:
            seen.add(p)
            try:
                os.kill(int(p), signal.SIGSTOP)
                print("stalled", p, flush=True)
            except Exception as e:
                print("failed", p, e, flush=True)
    time.sleep(0.002)
`

// TestAttackLyingAgentStalls (held): root stops the agent of every `fs
// stat`; the call fails within its bound (30 s, and runsc's 5 s grace)
// with a clear error, and the sandbox still runs commands.
func TestAttackLyingAgentStalls(t *testing.T) {
	d := shared
	id := d.newSandbox(t, "--template", "base")
	putFile(t, d, id, "/tmp/stall.py", stallScript)
	x := detachRoot(t, d, id, "python3", "/tmp/stall.py", "stat")
	time.Sleep(2 * time.Second) // the script's watch loop runs by now: it says nothing when it does
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	// The script polls /proc: on a loaded machine a stat's agent can end
	// before the script sees it. A stat it did not stall is no attack,
	// and is asked again; one it stalled must fail.
	const tries = 5
	var err error
	var took time.Duration
	for try := 1; try <= tries; try++ {
		start := time.Now()
		_, err = sdk(d.client).Stat(ctx, id, "/etc/hostname")
		took = time.Since(start)
		t.Logf("stat of a stalled agent (try %d): %v after %s", try, err, took.Round(time.Millisecond))
		if err != nil {
			break
		}
	}
	if err == nil {
		if stalled := strings.Count(d.sbx(t, "logs", id, "--exec", x).stdout, "stalled"); stalled >= tries {
			t.Errorf("stat answered %d times although the script stopped its agent each time", tries)
		} else {
			t.Logf("the script stalled %d of %d stats' agents in time: the machine is too loaded to play the attack", stalled, tries)
		}
	}
	if took > 45*time.Second {
		t.Errorf("stat of a stalled agent took %s, want its 30 s bound", took.Round(time.Second))
	}
	if out := d.must(t, "exec", id, "--", "echo", "ok"); out != "ok\n" {
		t.Errorf("exec after the stall printed %q", out)
	}
}

// TestAttackFsLsBigDir: a directory of 60,000 files with long names (a
// build's object files, a cache) is listed by nobody: `sbx fs ls` fails
// with "the sandbox answered more than 16 MiB; its agent may have been
// replaced from inside". The user is told an attacker may be at work, and
// has no way (a limit, paging) to list the directory at all. A legitimate
// listing past the cap should be cut with a clear note (or paged), and the
// message should not cry wolf.
func TestAttackFsLsBigDir(t *testing.T) {
	d := shared
	id := d.newSandbox(t, "--template", "base")
	d.must(t, "exec", "-u", "root", "--timeout", "300", id, "--", "python3", "-c",
		`import os
os.makedirs("/srv/many", exist_ok=True)
for i in range(60000):
    open("/srv/many/%s-%06d.o" % ("x" * 200, i), "w").close()`)
	r := d.sbx(t, "fs", "ls", id, "/srv/many")
	if r.code != 0 {
		t.Errorf("`sbx fs ls` of a directory of 60,000 files: exit %d, %q; a legitimate big listing is refused as an attack, with no way to list it", r.code, strings.TrimSpace(r.stderr))
	}
}

// knownGap skips an attack that still succeeds, whose gap the README's
// Known limits names, unless SBX_KNOWN_GAPS is set: then it runs, and fails
// for as long as the gap is open.
func knownGap(t *testing.T, why string) {
	t.Helper()
	if os.Getenv("SBX_KNOWN_GAPS") == "" {
		t.Skipf("open: %s; SBX_KNOWN_GAPS=1 runs it", why)
	}
}
