package e2e

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"sbx.dev/sbx/api"
)

// Attacks on the crash hold (third_party/gvisor/patches/04-kernel-crash-held-at-its-fault.patch,
// internal/agent/crash.go) and the debug fixes around it (hostname
// following on every request, SBX_AGENT_EXEC_ARGS).

// sbxWithin runs the CLI against d, killed after limit; timedOut says it
// was.
func sbxWithin(t *testing.T, d *daemon, limit time.Duration, args ...string) (result, bool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), limit)
	defer cancel()
	cmd := exec.CommandContext(ctx, filepath.Join(binDir, "sbx"), args...)
	cmd.Env = append(cmd.Environ(), "SBX_HOST=unix://"+d.socket)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	}
	return result{stdout: out.String(), stderr: errb.String(), code: code}, ctx.Err() != nil
}

// TestAttack27UsernsCrashDirWritesAsRoot: the sentry looks for
// /run/sbx/crashes in the crashing task's mount namespace and writes there
// with root credentials of the root user namespace, following symlinks in
// the directories. The default user (uid 1000, no sudo used for the attack)
// makes a user+mount namespace of its own (unshare -Urm, allowed to anyone),
// mounts a tmpfs on /run, points /run/sbx/crashes at /root, and crashes:
// the sentry creates a root-owned /root/PID.json (and would replace any
// existing N.json in any directory of the sandbox). Want: nothing written
// outside init's own directory, and the process dies.
func TestAttack27UsernsCrashDirWritesAsRoot(t *testing.T) {
	d := shared
	id := d.newSandbox(t, "--template", "base")
	script := `unshare -Urm sh -c 'mount -t tmpfs t /run && mkdir -p /run/sbx && ln -s /root /run/sbx/crashes && sh -c "kill -SEGV \$\$" & w=$!; sleep 8; echo "stat=$(ps -o stat= -p $w)"; kill -9 $w 2>/dev/null; wait' ; echo "root:$(sudo sh -c 'ls /root/*.json 2>/dev/null')"`
	o, e, _ := execOut(t, d, id, "", "90s", script)
	if strings.Contains(o, "root:/root/") {
		t.Errorf("uid 1000 in a user namespace of its own made the sentry write a root-owned file in /root (mode 0700): %q %q", o, e)
	}
	if !strings.Contains(o, "stat=\n") && strings.Contains(o, "stat=T") {
		t.Errorf("the crashing process is held stopped for ever (nobody watches the directory it was told in): %q", o)
	}
	if r, hung := sbxWithin(t, d, 60*time.Second, "exec", id, "--", "true"); hung || r.code != 0 {
		t.Errorf("the sandbox no longer answers: %+v hung=%v", r, hung)
	}
}

// TestAttack27UsernsCrashHeldForever: the same without a symlink — a
// /run/sbx/crashes of the user's own in its mount namespace. The sentry
// holds the crash and tells a directory init does not watch: the process
// stays stopped (T) for ever, its parent (a test runner) waits for ever
// instead of seeing SIGSEGV. Want: it dies as it would have.
func TestAttack27UsernsCrashHeldForever(t *testing.T) {
	d := shared
	id := d.newSandbox(t, "--template", "base")
	script := `unshare -Urm sh -c 'mount -t tmpfs t /run && mkdir -p /run/sbx/crashes && sh -c "kill -SEGV \$\$" & w=$!; sleep 10; echo "stat=$(ps -o stat= -p $w)"; ls -la /run/sbx/crashes; kill -9 $w 2>/dev/null; wait'`
	o, e, _ := execOut(t, d, id, "", "90s", script)
	if strings.Contains(o, "stat=T") {
		t.Errorf("a crash in a mount namespace with a /run/sbx/crashes of its own is held for ever (state T after 10 s): %q %q", o, e)
	}
}

// TestAttack27HostnameFifoHangsExec: every request to init and every
// agent exec reads /etc/hostname first (followHostname). Root in the
// sandbox replaces it with a FIFO: every later exec hangs, past its own
// --timeout, and the sandbox takes no command any more. Want: an exec
// still runs (the hostname follow is best-effort, not a read that blocks).
func TestAttack27HostnameFifoHangsExec(t *testing.T) {
	d := shared
	id := d.newSandbox(t, "--template", "base")
	if _, e, code := execOut(t, d, id, "root", "30s", `mv /etc/hostname /etc/hostname.orig && mkfifo /etc/hostname`); code != 0 {
		t.Fatalf("mkfifo: %d %s", code, e)
	}
	r, hung := sbxWithin(t, d, 45*time.Second, "exec", "--timeout", "10", id, "--", "echo", "alive")
	if hung || !strings.Contains(r.stdout, "alive") {
		t.Errorf("after root made /etc/hostname a FIFO, `sbx exec --timeout 10 echo alive`: hung=%v (45 s) %+v; want alive", hung, r)
	}
}

// TestAttack27HostnameDevZero: /etc/hostname a symlink to /dev/zero; the
// follow's os.ReadFile reads for ever, growing init's memory. Want: execs
// still run and the sandbox stays ready.
func TestAttack27HostnameDevZero(t *testing.T) {
	d := shared
	id := d.newSandbox(t, "--template", "base", "--memory", "512M")
	if _, e, code := execOut(t, d, id, "root", "30s", `mv /etc/hostname /etc/hostname.orig && ln -s /dev/zero /etc/hostname`); code != 0 {
		t.Fatalf("ln: %d %s", code, e)
	}
	r, hung := sbxWithin(t, d, 45*time.Second, "exec", "--timeout", "10", id, "--", "echo", "alive")
	if hung || !strings.Contains(r.stdout, "alive") {
		t.Errorf("after root linked /etc/hostname to /dev/zero, `sbx exec echo alive`: hung=%v %+v; want alive", hung, r)
	}
	if st := d.info(t, id).State; st != "ready" {
		ev := d.sbx(t, "events", id)
		t.Errorf("the sandbox is %s; want ready; events:\n%s", st, tail(ev.stdout))
	}
}

// TestAttack27ForgedCrashFiles: root inside forges init's directory: bad
// JSON, a 10 MB file, a file naming another pid, a FIFO renamed to N.json,
// a symlink to /dev/zero, 2000 files at once. Then a real crash must still
// end with SIGSEGV, and the sandbox answers.
func TestAttack27ForgedCrashFiles(t *testing.T) {
	d := shared
	id := d.newSandbox(t, "--template", "base")
	t.Cleanup(func() {
		var snaps struct {
			Snapshots []api.Snapshot `json:"snapshots"`
		}
		d.jsonOut(t, &snaps, "snapshot", "ls")
		for _, sn := range snaps.Snapshots {
			if sn.SandboxID == id {
				d.sbx(t, "snapshot", "rm", sn.Name)
			}
		}
	})
	forge := `cd /run/sbx/crashes || exit 9
echo '{not json' > .a && mv .a 900001.json
head -c 10000000 /dev/zero | tr '\0' '{' > .b && mv .b 900002.json
echo '{"pid":1,"signal":11}' > .c && mv .c 900003.json
mkfifo .d && mv .d 900004.json
ln -s /dev/zero 900005.json; echo x > .e; mv .e 900005.json.x
ln -s /dev/zero .f && mv .f 900006.json
i=0; while [ $i -lt 2000 ]; do echo "{\"pid\":$((910000+i)),\"signal\":11}" > .g$i; mv .g$i $((910000+i)).json; i=$((i+1)); done
echo forged`
	if o, e, code := execOut(t, d, id, "root", "3m", forge); code != 0 || !strings.Contains(o, "forged") {
		t.Fatalf("forging: %d %q %q", code, o, e)
	}
	time.Sleep(3 * time.Second) // tested: sbxd meets the forgeries meanwhile; a real crash after them is still told
	o, e, code := execOut(t, d, id, "", "60s", `sh -c 'kill -SEGV $$'; echo rc=$?`)
	if code != 0 || !strings.Contains(o, "rc=139") {
		t.Errorf("a real crash after the forgeries: %d %q %q; want rc=139", code, o, e)
	}
	if o, _, _ := execOut(t, d, id, "root", "30s", `ls /run/sbx/crashes | wc -l; ps -eo stat= | grep -c T`); strings.TrimSpace(o) == "" {
		t.Errorf("sandbox does not answer")
	}
}

// TestAttack27CopyLetGoDies: in a copy resumed from a crash's freeze, the
// held process let go with kill -CONT dies of its signal (it is not held
// again); a new crash in the copy ends too, and the copy answers.
func TestAttack27CopyLetGoDies(t *testing.T) {
	d := shared
	id := d.newSandbox(t, "--template", "base")
	buildC(t, d, id, "#include <unistd.h>\nint main(void) { usleep(100000); return *(volatile int *)0; }\n", "/tmp/segv")
	if _, err := sdk(d.client).ExecDetached(context.Background(), id, api.ExecRequest{Cmd: []string{"/tmp/segv"}, Detach: true}); err != nil {
		t.Fatal(err)
	}
	cr := crashesOf(t, d, id, 1)[0]
	t.Cleanup(func() { d.sbx(t, "snapshot", "rm", cr.Snapshot) })
	cp := d.newSandbox(t, "--from", cr.Snapshot)
	pid := strconv.Itoa(cr.Pid)
	o, e, _ := execOut(t, d, cp, "", "90s", `echo "before=$(ps -o stat= -p `+pid+`)"; kill -CONT `+pid+`; i=0; while [ $i -lt 50 ] && ps -p `+pid+` >/dev/null; do sleep 0.2; i=$((i+1)); done; echo "after=$(ps -o stat= -p `+pid+`)"; /tmp/segv; echo rc=$?`)
	if !strings.Contains(o, "before=T") {
		t.Errorf("the copy %s: %q %q; want the crash held (T) before kill -CONT", cp, o, e)
	}
	if !strings.Contains(o, "after=\n") {
		t.Errorf("the copy's held process let go with kill -CONT: %q; want it gone (it dies of its SIGSEGV)", o)
	}
	if !strings.Contains(o, "rc=139") {
		t.Errorf("a new crash in the copy: %q; want it to end with 139", o)
	}
}

// TestAttack27CrashStormDuringStop: crashes go on while sbxd stops the
// sandbox; after the resume, no process is left held (T) for ever and the
// storm's command ends.
func TestAttack27CrashStormDuringStop(t *testing.T) {
	d := shared
	id := d.newSandbox(t, "--template", "base")
	t.Cleanup(func() {
		var snaps struct {
			Snapshots []api.Snapshot `json:"snapshots"`
		}
		d.jsonOut(t, &snaps, "snapshot", "ls")
		for _, sn := range snaps.Snapshots {
			if sn.SandboxID == id {
				d.sbx(t, "snapshot", "rm", sn.Name)
			}
		}
	})
	x, err := sdk(d.client).ExecDetached(context.Background(), id, api.ExecRequest{Cmd: []string{"sh", "-c", `i=0; while [ $i -lt 100000 ] && [ ! -e /tmp/storm-stop ]; do sh -c 'kill -SEGV $$'; i=$((i+1)); done; echo storm-done $i`}, Detach: true})
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(1500 * time.Millisecond) // tested: the storm runs a while before the stop
	if r := d.sbx(t, "stop", id); r.code != 0 {
		t.Fatalf("stop: %+v", r)
	}
	waitFor(t, id+" stopped", 2*time.Minute, func() bool { return d.info(t, id).State == "stopped" })
	if r := d.sbx(t, "resume", id); r.code != 0 {
		t.Fatalf("resume: %+v", r)
	}
	waitFor(t, id+" ready", 2*time.Minute, func() bool { return d.info(t, id).State == "ready" })
	time.Sleep(2 * time.Second) // tested: the storm runs on a while after the resume
	if o, e, code := execOut(t, d, id, "root", "30s", `touch /tmp/storm-stop`); code != 0 {
		t.Fatalf("after the resume, an exec: %d %q %q", code, o, e)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	res, err := d.client.Sandbox(id).Process(x.ID).Wait(ctx)
	if err != nil {
		o, _, _ := execOut(t, d, id, "root", "30s", `ps -eo pid,stat,args; ls -la /run/sbx/crashes`)
		t.Fatalf("the storm's command did not end 2 min after the resume: %v\n%s", err, o)
	}
	_ = res
	o, _, _ := execOut(t, d, id, "root", "30s", `ps -eo pid=,stat=,args= | awk '$2 ~ /^T/'`)
	if strings.TrimSpace(o) != "" {
		t.Errorf("processes held after the resume: %q", o)
	}
}

// TestAttack27ExecArgsEnv: SBX_AGENT_EXEC_ARGS set by a user in an exec's
// env, or in the environment of an agent the user runs, neither changes
// the command run nor its user.
func TestAttack27ExecArgsEnv(t *testing.T) {
	d := shared
	evil := `["--as","0:0","--","sh","-c","echo PWNED; id -u"]`
	id := d.newSandbox(t, "--template", "base")
	r, hung := sbxWithin(t, d, 60*time.Second, "exec", "--timeout", "20", "--env", "SBX_AGENT_EXEC_ARGS="+evil, id, "--", "id", "-u")
	if hung || strings.Contains(r.stdout, "PWNED") || strings.TrimSpace(r.stdout) != "1000" {
		t.Errorf("exec --env SBX_AGENT_EXEC_ARGS with a timeout: %+v hung=%v; want uid 1000", r, hung)
	}
	// through the API: an exec asked as nobody, with a timeout and an env
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var out, errb strings.Builder
	if _, err := sdk(d.client).Exec(ctx, id, api.ExecRequest{Cmd: []string{"id", "-u"}, User: "nobody", Timeout: api.Duration(20 * time.Second),
		Env: []string{"SBX_AGENT_EXEC_ARGS=" + evil}}, &out, &errb); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(out.String(), "PWNED") || strings.TrimSpace(out.String()) != "65534" {
		t.Errorf("API exec of `id -u` as nobody with env SBX_AGENT_EXEC_ARGS: %q %q; want 65534 (the env var picks the agent's arguments: another command, as root)", out.String(), errb.String())
	}
	o, e, _ := execOut(t, d, id, "", "30s", `SBX_AGENT_EXEC_ARGS='`+evil+`' /.sbx/sbx-agent exec 2>&1; echo rc=$?`)
	if strings.Contains(o, "PWNED\n0") {
		t.Errorf("the agent run by the user with SBX_AGENT_EXEC_ARGS ran as root: %q %q", o, e)
	}
}

// TestAttack27CrashStormDuringMemoryFork: crashes go on while sbxd forks
// the sandbox with its memory; in the fork (which carries on the storm)
// and in the parent, nothing stays held and the storm's loop ends when
// told.
func TestAttack27CrashStormDuringMemoryFork(t *testing.T) {
	d := shared
	id := d.newSandbox(t, "--template", "base")
	t.Cleanup(func() {
		var snaps struct {
			Snapshots []api.Snapshot `json:"snapshots"`
		}
		d.jsonOut(t, &snaps, "snapshot", "ls")
		for _, sn := range snaps.Snapshots {
			if sn.SandboxID == id {
				d.sbx(t, "snapshot", "rm", sn.Name)
			}
		}
	})
	if _, err := sdk(d.client).ExecDetached(context.Background(), id, api.ExecRequest{Cmd: []string{"sh", "-c", `i=0; while [ $i -lt 100000 ] && [ ! -e /tmp/storm-stop ]; do sh -c 'kill -SEGV $$'; i=$((i+1)); done; echo storm-done $i > /tmp/storm-done`}, Detach: true}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(1500 * time.Millisecond) // tested: the storm runs a while before the fork
	r := d.sbx(t, "fork", id, "--memory", "--wait")
	if r.code != 0 {
		t.Fatalf("fork --memory: %+v", r)
	}
	f := strings.Fields(r.stdout)
	if len(f) == 0 || !idRE.MatchString(f[len(f)-1]) {
		t.Fatalf("fork --memory --wait printed %q", r.stdout)
	}
	child := f[len(f)-1]
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		_ = deleteSandbox(ctx, d.client, child)
	})
	for _, sb := range []string{id, child} {
		// up to 40 s for the storm's end: a loaded machine's fork took
		// that long to freeze the crash it caught mid-capture
		o, e, code := execOut(t, d, sb, "root", "90s", `sleep 2; touch /tmp/storm-stop; i=0; while [ $i -lt 200 ] && [ ! -e /tmp/storm-done ]; do sleep 0.2; i=$((i+1)); done; cat /tmp/storm-done; sleep 1; ps -eo pid=,stat=,args= | awk '$2 ~ /^T/ {print "HELD", $0}'`)
		if code != 0 || !strings.Contains(o, "storm-done") || strings.Contains(o, "HELD") {
			t.Errorf("%s (parent %s): %d %q %q; want the storm ended and nothing held", sb, id, code, o, e)
		}
	}
}

// TestAttack27TwoThreadsCrash: two threads of one process fault at the
// same instant; the process dies of SIGSEGV (its parent sees 139), once
// caught, and nothing stays held.
func TestAttack27TwoThreadsCrash(t *testing.T) {
	d := shared
	id := d.newSandbox(t, "--template", "base")
	src := `#include <pthread.h>
#include <unistd.h>
static pthread_barrier_t b;
static void *f(void *a) { pthread_barrier_wait(&b); return (void *)(long)*(volatile int *)a; }
int main(void) {
	pthread_t t[4];
	pthread_barrier_init(&b, 0, 4);
	for (int i = 0; i < 4; i++) pthread_create(&t[i], 0, f, (void *)(long)(8 * i));
	for (int i = 0; i < 4; i++) pthread_join(t[i], 0);
	return 0;
}
`
	buildC(t, d, id, src, "/tmp/threads")
	o, e, code := execOut(t, d, id, "", "60s", `/tmp/threads; echo rc=$?; /tmp/threads; echo rc=$?; sleep 1; ps -eo pid=,stat=,args= | awk '$2 ~ /^T/ {print "HELD", $0}'`)
	if code != 0 || strings.Count(o, "rc=139") != 2 || strings.Contains(o, "HELD") {
		t.Errorf("four threads faulting at once, twice: %d %q %q; want rc=139 twice and nothing held", code, o, e)
	}
	crs := crashesOf(t, d, id, 1)
	for _, cr := range crs {
		t.Cleanup(func() { d.sbx(t, "snapshot", "rm", cr.Snapshot) })
	}
}

// TestAttack27CrashWhileInitStopped: root sends SIGSTOP to init (pid 1)
// and crashes a process; init must not be stoppable from inside, so the
// crash ends, and the sandbox answers after.
func TestAttack27CrashWhileInitStopped(t *testing.T) {
	d := shared
	id := d.newSandbox(t, "--template", "base")
	t.Cleanup(func() {
		var snaps struct {
			Snapshots []api.Snapshot `json:"snapshots"`
		}
		d.jsonOut(t, &snaps, "snapshot", "ls")
		for _, sn := range snaps.Snapshots {
			if sn.SandboxID == id {
				d.sbx(t, "snapshot", "rm", sn.Name)
			}
		}
	})
	r, hung := sbxWithin(t, d, 60*time.Second, "exec", "--user", "root", "--timeout", "30", id, "--", "sh", "-c", `kill -STOP 1; sh -c 'kill -SEGV $$'; echo rc=$?; kill -CONT 1`)
	if hung || !strings.Contains(r.stdout, "rc=139") {
		t.Errorf("a crash after root's kill -STOP 1: hung=%v %+v; want rc=139", hung, r)
		d.logAbout(t, append(regexp.MustCompile(`ex_[a-z0-9]+`).FindAllString(r.stderr, -1), id)...)
		if b, err := os.ReadFile(filepath.Join(d.dir, "sandboxes", id, "runsc.log")); err == nil {
			t.Logf("runsc.log's end:\n%s", tailLines(string(b), 40))
		}
	}
	_, _ = sbxWithin(t, d, 30*time.Second, "exec", "--user", "root", id, "--", "kill", "-CONT", "1")
	if r, hung := sbxWithin(t, d, 60*time.Second, "exec", id, "--", "true"); hung || r.code != 0 {
		t.Errorf("the sandbox after: hung=%v %+v", hung, r)
	}
}

// TestAttack27KillSegvFaultAddr: a SIGSEGV sent with kill(2) has no fault
// address; `sbx crashes` must not show the sender's pid and uid (the
// si_pid/si_uid of the siginfo union) as one.
func TestAttack27KillSegvFaultAddr(t *testing.T) {
	d := shared
	id := d.newSandbox(t, "--template", "base")
	o, _, _ := execOut(t, d, id, "", "60s", `sh -c 'kill -SEGV $$'; echo rc=$?`)
	if !strings.Contains(o, "rc=139") {
		t.Fatalf("kill -SEGV $$: %q", o)
	}
	cr := crashesOf(t, d, id, 1)[0]
	t.Cleanup(func() { d.sbx(t, "snapshot", "rm", cr.Snapshot) })
	if cr.FaultAddr != "" && cr.FaultAddr != "0x0" {
		t.Errorf("a SIGSEGV sent by kill(2) (pid %d, uid 1000) is listed with fault address %s (si_uid<<32|si_pid); want none", cr.Pid, cr.FaultAddr)
	}
}

// TestAttack27CrashesHostileGdb: root in the sandbox replaces gdb with a
// program that floods its output, ignores SIGTERM and leaves a daemon
// behind, then a process crashes. `sbx crashes` (which runs gdb in a copy
// from the freeze) must end in bounded time with bounded output, and the
// copies it made must be gone.
func TestAttack27CrashesHostileGdb(t *testing.T) {
	d := shared
	id := d.newSandbox(t, "--template", "base")
	hostile := `cat > /usr/bin/gdb <<'X'
#!/bin/sh
trap '' TERM HUP INT
setsid sh -c 'trap "" TERM HUP; while :; do sleep 1; done' </dev/null >/dev/null 2>&1 &
yes "#0  0x0 in flood () from /flood"
X
chmod 755 /usr/bin/gdb`
	if _, e, code := execOut(t, d, id, "root", "30s", hostile); code != 0 {
		t.Fatalf("hostile gdb: %d %s", code, e)
	}
	o, _, _ := execOut(t, d, id, "", "60s", `sh -c 'kill -SEGV $$'; echo rc=$?`)
	if !strings.Contains(o, "rc=139") {
		t.Fatalf("crash: %q", o)
	}
	cr := crashesOf(t, d, id, 1)[0]
	t.Cleanup(func() { d.sbx(t, "snapshot", "rm", cr.Snapshot) })
	start := time.Now()
	r, hung := sbxWithin(t, d, 4*time.Minute, "crashes", id)
	if hung {
		t.Errorf("sbx crashes against a hostile gdb hung for 4 min")
	}
	if len(r.stdout) > 1<<20 {
		t.Errorf("sbx crashes printed %d bytes of a flooding gdb; want it bounded", len(r.stdout))
	}
	t.Logf("sbx crashes: exit %d in %s, %d bytes out, stderr %q", r.code, time.Since(start).Round(time.Second), len(r.stdout), tail(r.stderr))
	dir := t.TempDir()
	r2, hung2 := sbxWithin(t, d, 7*time.Minute, "crashes", id, "--bundle", dir, "--no-backtrace")
	if hung2 {
		t.Errorf("sbx crashes --bundle against a hostile gdb hung for 7 min")
	}
	t.Logf("sbx crashes --bundle: exit %d, stderr %q", r2.code, tail(r2.stderr))
	waitFor(t, "the copies of sbx crashes gone", 2*time.Minute, func() bool {
		var sbs struct {
			Sandboxes []api.Sandbox `json:"sandboxes"`
		}
		d.jsonOut(t, &sbs, "list")
		for _, sb := range sbs.Sandboxes {
			if sb.Meta["sbx.crash.of"] == id {
				return false
			}
		}
		return true
	})
}

// TestAttack27CrashWhileSbxdKilled: a process crashes (a big sandbox, so
// the freeze takes a while) and sbxd is SIGKILLed during the freeze, then
// started again. The crashed process ends (its parent sees 139), the
// sandbox answers, and a later crash ends too.
func TestAttack27CrashWhileSbxdKilled(t *testing.T) {
	d, err := startDaemon(nil)
	if err != nil {
		t.Fatal(err)
	}
	defer d.stop(true)
	id := d.newSandbox(t, "--template", "base", "--memory", "1G")
	if _, e, code := execOut(t, d, id, "", "60s", `python3 -c 'import os; open("/dev/shm/big","wb").write(os.urandom(300<<20))'`); code != 0 {
		t.Fatalf("fill memory: %d %s", code, e)
	}
	x, err := sdk(d.client).ExecDetached(context.Background(), id, api.ExecRequest{Cmd: []string{"sh", "-c", `sh -c 'kill -SEGV $$'; echo rc=$?`}, Detach: true})
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(700 * time.Millisecond) // tested: sbxd killed while the crash is told
	d.kill(syscall.SIGKILL)
	if err := d.start(nil); err != nil {
		t.Fatal(err)
	}
	waitFor(t, id+" ready after sbxd came back", 2*time.Minute, func() bool { return d.info(t, id).State == api.StateReady })
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if _, err := d.client.Sandbox(id).Process(x.ID).Wait(ctx); err != nil {
		o, _, _ := execOut(t, d, id, "root", "30s", `ps -eo pid,stat,args; ls -la /run/sbx/crashes`)
		t.Errorf("the crash's exec did not end 2 min after sbxd came back: %v\n%s", err, o)
	}
	if logs := d.sbx(t, "logs", id, "--exec", x.ID); !strings.Contains(logs.stdout, "rc=139") {
		t.Errorf("the crash's exec: %q; want rc=139", logs.stdout)
	}
	if o, _, _ := execOut(t, d, id, "", "60s", `sh -c 'kill -SEGV $$'; echo rc=$?`); !strings.Contains(o, "rc=139") {
		t.Errorf("a later crash: %q; want rc=139", o)
	}
	var snaps struct {
		Snapshots []api.Snapshot `json:"snapshots"`
	}
	d.jsonOut(t, &snaps, "snapshot", "ls")
	for _, sn := range snaps.Snapshots {
		d.sbx(t, "snapshot", "rm", sn.Name)
	}
}

// TestInitIgnoresTheSandbox: what root inside sends init (pid 1) without
// a handler to take it is dropped, as Linux's init drops it (sbx_init.go
// in third_party/gvisor): SIGSTOP, SIGTSTP and SIGKILL, to the process
// and to each of its threads; and what it has a handler for it ignores.
// kill(2)
// succeeds, as on Linux, init goes on, and so does the sandbox: an exec,
// a memory stop and resume, and the delete (runsc's own signals still
// reach init).
func TestInitIgnoresTheSandbox(t *testing.T) {
	d := shared
	id := d.newSandbox(t, "--template", "tiny")
	// every signal but SIGTERM and SIGINT, which end the sandbox (its
	// poweroff): those init has no handler for are dropped; those Go's
	// runtime handles (SIGHUP, SIGQUIT, SIGSEGV sent by kill, ...) init
	// takes and ignores
	hits := `for s in $(seq 1 64); do case $s in 2|15) continue;; esac; kill -$s 1 2>/dev/null || echo "kill -$s 1: rc=$?"; done
for tid in $(ls /proc/1/task); do kill -STOP $tid; kill -KILL $tid; kill -HUP $tid; kill -SEGV $tid; done
sleep 1; kill -0 1 && echo init-alive`
	r, hung := sbxWithin(t, d, 60*time.Second, "exec", "--user", "root", id, "--", "sh", "-c", hits)
	if hung || r.code != 0 || !strings.Contains(r.stdout, "init-alive") || strings.Contains(r.stdout, "rc=") {
		t.Fatalf("signals to init from root inside: hung=%v %+v; want each kill to succeed and init alive", hung, r)
	}
	state := func() string {
		o, _, _ := execOut(t, d, id, "", "30s", "awk '/^State/ {print $2}' /proc/1/status")
		return strings.TrimSpace(o)
	}
	if s := state(); s == "T" || s == "" {
		t.Fatalf("init's state after the signals: %q, want it running", s)
	}
	if r, hung := sbxWithin(t, d, 60*time.Second, "exec", id, "--", "echo", "answered"); hung || r.code != 0 || r.stdout != "answered\n" {
		t.Fatalf("an exec after the signals: hung=%v %+v", hung, r)
	}
	d.must(t, "stop", "--wait", id)
	d.must(t, "resume", "--require-memory", id)
	if r, hung := sbxWithin(t, d, 60*time.Second, "exec", "--user", "root", id, "--", "sh", "-c", "kill -KILL 1; kill -STOP 1; echo again"); hung || r.code != 0 || r.stdout != "again\n" {
		t.Fatalf("signals to init after a resume: hung=%v %+v", hung, r)
	}
	if s := state(); s == "T" || s == "" {
		t.Fatalf("init's state after a resume and the signals: %q, want it running", s)
	}
}
