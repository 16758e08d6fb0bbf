package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"sbx.dev/sbx/api"
)

// viaChannel reports whether exec ex of sandbox id went over the exec
// channel: the host's own record (its directory holds no shim's spec),
// not anything the sandbox says.
func viaChannel(d *daemon, id, ex string) bool {
	dir := filepath.Join(d.dir, "sandboxes", id, "execs", ex)
	if _, err := os.Stat(dir); err != nil {
		return false
	}
	_, err := os.Stat(filepath.Join(dir, "shim.json"))
	return os.IsNotExist(err)
}

// lastExec is the newest exec of sandbox id.
func lastExec(t *testing.T, d *daemon, id string) api.Exec {
	t.Helper()
	var listed struct{ Execs []api.Exec }
	d.jsonOut(t, &listed, "ps", id)
	if len(listed.Execs) == 0 {
		t.Fatalf("no execs in %s", id)
	}
	return listed.Execs[len(listed.Execs)-1]
}

// channelReady waits until an exec in id goes over the channel (init dials
// at its start, and after a capture or a restart of sbxd).
func channelReady(t *testing.T, d *daemon, id string) {
	t.Helper()
	waitFor(t, "an exec over the channel in "+id, 20*time.Second, func() bool {
		if out := d.must(t, "exec", id, "--", "true"); out != "" {
			t.Fatalf("true said %q", out)
		}
		return viaChannel(d, id, lastExec(t, d, id).ID)
	})
}

// TestExecChannel: with sbxd --exec-channel, execs are messages on a
// connection init keeps open, and every exec behaviour holds: output, exit
// codes, signals, timeouts, detach and logs, users; a running command
// through a stop and resume, a memory fork and a kill of sbxd; nothing
// leaks once the sandboxes are gone.
func TestExecChannel(t *testing.T) {
	d, err := startDaemon([]string{"--exec-channel"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.stop(true) })
	ctx := context.Background()

	t.Run("over the channel", func(t *testing.T) {
		id := d.newSandbox(t, "--template", "tiny")
		channelReady(t, d, id)
		n := 0
		for i := 0; i < 5; i++ {
			if out := d.must(t, "exec", id, "--", "echo", fmt.Sprint(i)); out != fmt.Sprintf("%d\n", i) {
				t.Errorf("exec %d: %q", i, out)
			}
			if viaChannel(d, id, lastExec(t, d, id).ID) {
				n++
			}
		}
		if n < 5 {
			t.Errorf("%d of 5 execs went over a ready channel; want all", n)
		}
	})
	t.Run("exec", func(t *testing.T) { testExec(t, d) })
	t.Run("timeout", func(t *testing.T) { testExecTimeout(t, d) })
	t.Run("detach and logs", func(t *testing.T) { testExecDetachAndLogs(t, d) })

	t.Run("user and signal", func(t *testing.T) {
		id := d.newSandbox(t, "--template", "tiny")
		channelReady(t, d, id)
		if out := d.must(t, "exec", "--user", "1000", id, "--", "id", "-u"); out != "1000\n" {
			t.Errorf("--user 1000: %q", out)
		}
		// the channel is root's alone: uid 1000 cannot reach its socket
		r := d.sbx(t, "exec", "--user", "1000", id, "--", "ls", "/run/sbx/chan")
		if r.code == 0 || !strings.Contains(r.stderr, "ermission denied") {
			t.Errorf("uid 1000 lists the channel's directory: exit %d, %q %q", r.code, r.stdout, r.stderr)
		}
		var e api.Exec
		d.jsonOut(t, &e, "exec", id, "--detach", "--", "sleep", "300")
		d.must(t, "kill", "-s", "KILL", id, e.ID)
		waitFor(t, "the killed exec's end", 20*time.Second, func() bool {
			x, err := sdk(d.client).GetExec(ctx, id, e.ID)
			return err == nil && x.State == api.ExecExited && x.ExitCode != nil && *x.ExitCode == 137
		})
		if !viaChannel(d, id, e.ID) {
			t.Error("the detached exec did not go over the channel")
		}
	})

	// init serves the channel in its own process: nothing of that may
	// reach a command (an ignored SIGPIPE survives exec), however many
	// requests came before it. --timeout 0: init starts the command
	// itself (under a timeout it starts an agent, which starts the
	// command with Go's defaults, whatever it inherited)
	t.Run("signals at their default", func(t *testing.T) {
		id := d.newSandbox(t, "--template", "tiny")
		channelReady(t, d, id)
		upload(t, d, id, buildAttackInit(t), "/a")
		for i := 0; i < 3; i++ {
			r := d.sbx(t, "exec", "--timeout", "0", "--user", "root", id, "--", "/a", "sigs")
			if !strings.Contains(r.stdout, "sigs-not-default=0") || !viaChannel(d, id, lastExec(t, d, id).ID) {
				t.Errorf("exec %d over the channel: %+v; want every signal at its default, none blocked", i+1, r)
			}
		}
	})

	// a counter printing 1..N, which must come out whole and in order
	const counter = `i=0; while [ $i -lt 40 ]; do i=$((i+1)); echo $i; sleep 0.1; done`
	wantCount := func(t *testing.T, id, ex string) {
		t.Helper()
		r := d.sbx(t, "logs", id, "--exec", ex, "--follow")
		var want strings.Builder
		for i := 1; i <= 40; i++ {
			fmt.Fprintf(&want, "%d\n", i)
		}
		if r.stdout != want.String() {
			t.Errorf("the counter's output: %q; want 1..40, whole and in order", r.stdout)
		}
		x, err := sdk(d.client).GetExec(ctx, id, ex)
		if err != nil || x.State != api.ExecExited || x.ExitCode == nil || *x.ExitCode != 0 {
			t.Errorf("the counter's end: %+v, %v; want exited 0", x, err)
		}
	}

	// startCounter starts the counter, detached, in a new sandbox whose
	// channel is ready, and lets it run a second
	startCounter := func(t *testing.T) (string, api.Exec) {
		t.Helper()
		id := d.newSandbox(t, "--template", "tiny")
		channelReady(t, d, id)
		var e api.Exec
		d.jsonOut(t, &e, "exec", id, "--detach", "--", "sh", "-c", counter)
		time.Sleep(time.Second)
		return id, e
	}

	t.Run("stop and resume", func(t *testing.T) {
		id, e := startCounter(t)
		d.must(t, "stop", id, "--wait")
		d.must(t, "resume", id)
		wantCount(t, id, e.ID)
		channelReady(t, d, id) // the restored init dials again
	})

	t.Run("memory fork", func(t *testing.T) {
		id, e := startCounter(t)
		kids := forkMemory(t, d, id, 1)
		wantCount(t, id, e.ID) // the parent's copy was cut by the save, and attached again
		channelReady(t, d, kids[0])
		channelReady(t, d, id)
	})

	t.Run("sbxd killed mid-exec", func(t *testing.T) {
		id, e := startCounter(t)
		d.kill(syscall.SIGKILL)
		d.waitExit(t, 30*time.Second)
		if err := d.start([]string{"--exec-channel"}); err != nil {
			t.Fatal(err)
		}
		wantCount(t, id, e.ID)
		channelReady(t, d, id) // init dials the restarted sbxd
	})

	t.Run("nothing leaks", func(t *testing.T) {
		for _, sb := range d.list(t) {
			d.must(t, "rm", "--force", sb.ID)
		}
		checkNoLeaks(t, d)
		matches, _ := filepath.Glob(filepath.Join(d.dir, "sandboxes", "*", "chan"))
		if len(matches) > 0 {
			t.Errorf("channel directories left: %v", matches)
		}
	})
}

// TestChannelCapturesBackToBack: a sandbox whose detached command is quiet
// (its output's connection over the channel idle between alive frames) is
// captured twice within a second, the original running on: a memory
// snapshot, then a freeze from inside. The first save closes the sandbox's
// host sockets and leaves the closed connection held by init until its
// next frame; gVisor's second save then failed on it ("encoding error: ...
// nil pointer dereference" in SCMConnectedEndpoint.beforeSave, patch 08).
// Both captures restore, and the command goes on in the original.
func TestChannelCapturesBackToBack(t *testing.T) {
	d := shared
	id := d.newSandbox(t, "--template", "tiny")
	channelReady(t, d, id)
	quiet := strings.Fields(d.must(t, "exec", "-d", id, "--", "sh", "-c", "while :; do date +%s%N > /tmp/now.t && mv /tmp/now.t /tmp/now; sleep 0.2; done"))[0]
	waitFor(t, "the quiet command over the channel", 20*time.Second, func() bool { return viaChannel(d, id, quiet) })
	snap := "b2b-" + randHex(3)
	d.must(t, "snapshot", id, snap, "--memory")
	t.Cleanup(func() { d.sbx(t, "snapshot", "rm", snap) })
	r := d.sbx(t, "exec", id, "--", "sh", "-c", "/.sbx/freeze --reason back-to-back 2>&1")
	m := regexp.MustCompile(`as snapshot (freeze-[A-Za-z0-9._-]+)`).FindStringSubmatch(r.stdout)
	if m == nil {
		t.Fatalf("a freeze right after a memory snapshot, a quiet command's connection open over the channel: %q %q", r.stdout, r.stderr)
	}
	t.Cleanup(func() { d.sbx(t, "snapshot", "rm", m[1]) })
	for _, from := range []string{snap, m[1]} {
		c := d.newSandbox(t, "--from", from)
		if out := d.must(t, "exec", c, "--", "sh", "-c", "test -s /tmp/now && echo ok"); out != "ok\n" {
			t.Errorf("a copy from %s: %q", from, out)
		}
		d.must(t, "rm", c, "--yes")
	}
	before := d.must(t, "exec", id, "--", "cat", "/tmp/now")
	waitFor(t, "the quiet command going on in the original", 10*time.Second, func() bool {
		return d.must(t, "exec", id, "--", "cat", "/tmp/now") != before
	})
	for _, e := range mustExecs(t, d, id) {
		if e.ID == quiet && e.State != api.ExecRunning {
			t.Errorf("the quiet command is %s after the two captures", e.State)
		}
	}
}
