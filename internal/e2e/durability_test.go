package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"sbx.dev/sbx/api"
	"sbx.dev/sbx/client"
	"sbx.dev/sbx/internal/store"
)

// memHolderPy holds ~512 MiB and a random marker in memory and serves the
// marker: a marker only a live process with its memory can answer with.
const memHolderPy = `import http.server, json, os, secrets, sys
BALLAST = bytearray(512 << 20)
for i in range(0, len(BALLAST), 4096):
    BALLAST[i] = 7
MARKER = secrets.token_hex(8)
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = json.dumps({"token": MARKER, "hits": 0, "pid": os.getpid()}).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *a):
        pass
http.server.HTTPServer(("0.0.0.0", 8080), H).serve_forever()
`

// startHolder starts the 512 MiB marker holder in a new base sandbox.
func startHolder(t *testing.T, d *daemon) (string, hit) {
	t.Helper()
	id := d.newSandbox(t, "--template", "base", "--memory", "1G")
	d.must(t, "exec", id, "--", "sh", "-c", "cat > /tmp/holder.py <<'EOF'\n"+memHolderPy+"EOF")
	d.must(t, "exec", id, "--detach", "--", "python3", "/tmp/holder.py")
	var h hit
	waitFor(t, "the marker holder to answer", 60*time.Second, func() bool {
		var ok bool
		h, ok = get(t, d, id)
		return ok
	})
	return id, h
}

// checkAfterRestart: the sandbox is running or stopped with a complete
// image; after a resume (if stopped) the marker is back from memory; and
// the restart said what it decided.
func checkAfterRestart(t *testing.T, d *daemon, id string, want hit) {
	t.Helper()
	var sb api.Sandbox
	sb = d.info(t, id)
	switch sb.State {
	case api.StateReady:
	case api.StateStopped:
		d.jsonOut(t, &sb, "resume", id, "--require-memory")
		if !sb.MemoryRestored {
			t.Fatalf("resume after the restart: memoryRestored false (%s)", sb.ResumeReason)
		}
	default:
		t.Fatalf("after the restart the sandbox is %s (%s), want ready or stopped", sb.State, sb.Reason)
	}
	got := mustGet(t, d, id)
	if got.Token != want.Token || got.Pid != want.Pid {
		t.Errorf("marker after the restart: %+v, want token %s pid %d (a cold boot would have lost it)", got, want.Token, want.Pid)
	}
	checkNetwork(t, d, id, false)
	intents := countIntents(t, d)
	if intents != 0 {
		t.Errorf("%d journal entries left after the restart", intents)
	}
}

// countIntents reads the daemon's journal (SQLite in WAL mode lets a
// second reader in while sbxd runs).
func countIntents(t testing.TB, d *daemon) int {
	t.Helper()
	st, err := store.Open(filepath.Join(d.dir, "state.db"))
	if err != nil {
		t.Fatalf("open the daemon's store: %v", err)
	}
	defer st.Close()
	in, err := st.Intents(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return len(in)
}

func reconciledEvent(t *testing.T, d *daemon, id string) map[string]any {
	t.Helper()
	out := d.must(t, "--json", "events", id)
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		var ev api.Event
		if json.Unmarshal([]byte(line), &ev) == nil && ev.Type == "reconciled" {
			return ev.Detail
		}
	}
	return nil
}

// TestStopCrash kills sbxd (SIGKILL, through the test-only hook) at each
// step of a stop of a sandbox holding 512 MiB, restarts it, and checks that
// nothing was lost and nothing silently cold-booted.
func TestStopCrash(t *testing.T) {
	if testing.Short() {
		t.Skip("long")
	}
	bin := sbxdTestBuild(t)
	for _, point := range []string{"stop:before-image", "stop:writing-memory+300ms", "stop:after-sync", "stop:after-destroy"} {
		t.Run(point, func(t *testing.T) {
			d, err := startDaemon(nil)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { d.stop(true) })
			id, marker := startHolder(t, d)
			// Restart on the hooked binary, armed at this point.
			d.kill(syscall.SIGTERM)
			d.bin, d.env = bin, []string{"SBX_TEST_CRASH_AT=" + point}
			if err := d.start(nil); err != nil {
				t.Fatal(err)
			}
			r := d.sbx(t, "stop", id, "--wait")
			if r.code == 0 {
				t.Fatalf("stop succeeded: the crash hook %s did not fire", point)
			}
			d.waitExit(t, 60*time.Second)
			d.env = nil
			if err := d.start(nil); err != nil {
				t.Fatal(err)
			}
			if ev := reconciledEvent(t, d, id); ev == nil {
				t.Errorf("no reconciled event after the crash at %s", point)
			} else {
				t.Logf("%s: %v: %v", point, ev["decision"], ev["reason"])
			}
			checkAfterRestart(t, d, id, marker)
		})
	}
}

// TestRestartDuringReconcile: sbxd dies during a stop, then twice more while
// it reconciles (waiting for the checkpoint it left running); the third
// start finishes the job, harmlessly.
func TestRestartDuringReconcile(t *testing.T) {
	if testing.Short() {
		t.Skip("long")
	}
	bin := sbxdTestBuild(t)
	d, err := startDaemon(nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.stop(true) })
	id, marker := startHolder(t, d)
	d.kill(syscall.SIGTERM)
	d.bin, d.env = bin, []string{"SBX_TEST_CRASH_AT=stop:writing-memory+200ms"}
	if err := d.start(nil); err != nil {
		t.Fatal(err)
	}
	d.sbx(t, "stop", id, "--wait")
	d.waitExit(t, 60*time.Second)
	d.env = nil
	for i := 0; i < 2; i++ {
		// Start it and kill it before it can serve (or right after).
		d.startNoWait(t)
		time.Sleep(150 * time.Millisecond) // tested: killed this early in its start
		d.kill(syscall.SIGKILL)
	}
	if err := d.start(nil); err != nil {
		t.Fatal(err)
	}
	checkAfterRestart(t, d, id, marker)
}

// TestCheckpointKilled: the runsc checkpoint process dies mid-capture: the
// source runs on with its memory and the error is returned.
func TestCheckpointKilled(t *testing.T) {
	d := shared
	id, marker := startHolder(t, d)
	done := make(chan result, 1)
	go func() { done <- d.sbx(t, "stop", id, "--wait") }()
	killed := false
	deadline := time.Now().Add(30 * time.Second)
	for !killed && time.Now().Before(deadline) {
		for _, pid := range pidsWith("checkpoint", id) {
			syscall.Kill(pid, syscall.SIGKILL)
			killed = true
		}
		time.Sleep(5 * time.Millisecond)
	}
	r := <-done
	if !killed {
		t.Skip("the checkpoint ended before it could be killed")
	}
	if r.code != 1 || !strings.Contains(r.stderr, "checkpoint") {
		t.Errorf("stop with its checkpoint killed: exit %d %q, want an error naming the checkpoint", r.code, r.stderr)
	}
	var sb api.Sandbox
	sb = d.info(t, id)
	if sb.State != api.StateReady {
		t.Errorf("after a killed checkpoint: state %s", sb.State)
	}
	if got := mustGet(t, d, id); got.Token != marker.Token || got.Pid != marker.Pid {
		t.Errorf("after a killed checkpoint: %+v, want %+v", got, marker)
	}
	if n := countIntents(t, d); n != 0 {
		t.Errorf("%d journal entries left", n)
	}
}

// pidsWith returns the pids whose command line holds every word.
func pidsWith(words ...string) []int {
	var pids []int
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		var pid int
		if _, err := fmt.Sscan(e.Name(), &pid); err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil {
			continue
		}
		cmd := strings.ReplaceAll(string(b), "\x00", " ")
		all := true
		for _, w := range words {
			all = all && strings.Contains(cmd, w)
		}
		if all && strings.Contains(cmd, "runsc") {
			pids = append(pids, pid)
		}
	}
	return pids
}

// TestCleanShutdown: SIGTERM during a stop waits for it; after a restart the
// sandbox is stopped with a complete image, nothing to reconcile.
func TestCleanShutdown(t *testing.T) {
	d, err := startDaemon(nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.stop(true) })
	id, marker := startHolder(t, d)
	other := d.newSandbox(t, "--template", "tiny")
	if _, err := d.client.Sandbox(id).Stop(context.Background(), client.NoWait()); err != nil {
		t.Fatal(err)
	}
	d.kill(syscall.SIGTERM)
	if err := d.start(nil); err != nil {
		t.Fatal(err)
	}
	if ev := reconciledEvent(t, d, id); ev != nil {
		t.Errorf("a clean shutdown left a capture to reconcile: %v", ev)
	}
	var sb api.Sandbox
	sb = d.info(t, id)
	if sb.State != api.StateStopped {
		t.Fatalf("after a clean shutdown during a stop: %s", sb.State)
	}
	checkAfterRestart(t, d, id, marker)
	if out := d.must(t, "exec", other, "--", "echo", "still here"); out != "still here\n" {
		t.Errorf("a running sandbox did not survive the clean shutdown: %q", out)
	}
}
