package e2e

import (
	"context"
	"encoding/json"
	"strconv"
	"strings"
	"testing"
	"time"

	"sbx.dev/sbx/api"
)

// serverPy holds a random token and a hit counter in memory and answers
// each GET with both and its pid.
const serverPy = `import http.server, json, os, secrets, sys
TOKEN = secrets.token_hex(8)
HITS = 0
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        global HITS
        HITS += 1
        body = json.dumps({"token": TOKEN, "hits": HITS, "pid": os.getpid()}).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *a):
        pass
http.server.HTTPServer(("0.0.0.0", int(sys.argv[1])), H).serve_forever()
`

type hit struct {
	Token string `json:"token"`
	Hits  int    `json:"hits"`
	Pid   int    `json:"pid"`
}

// get asks the server in sandbox id for one hit, from inside the sandbox.
func get(t *testing.T, d *daemon, id string) (hit, bool) {
	t.Helper()
	r := d.sbx(t, "exec", id, "--timeout", "10s", "--", "curl", "-s", "--max-time", "5", "http://127.0.0.1:8080/")
	var h hit
	if r.code != 0 || json.Unmarshal([]byte(r.stdout), &h) != nil {
		return hit{}, false
	}
	return h, true
}

func mustGet(t *testing.T, d *daemon, id string) hit {
	t.Helper()
	h, ok := get(t, d, id)
	if !ok {
		t.Fatalf("the server in %s does not answer", id)
	}
	return h
}

// startServer starts the token server detached in sandbox id.
func startServer(t *testing.T, d *daemon, id string) hit {
	t.Helper()
	d.must(t, "exec", id, "--", "sh", "-c", "mkdir -p /tmp/srv && cat > /tmp/srv/server.py <<'EOF'\n"+serverPy+"EOF")
	d.must(t, "exec", id, "--detach", "--", "python3", "/tmp/srv/server.py", "8080")
	var h hit
	waitFor(t, "the server to answer", 20*time.Second, func() bool {
		var ok bool
		h, ok = get(t, d, id)
		return ok
	})
	return h
}

// TestCaptureAcceptance is the acceptance scenario of "Capture": a server
// holding a token and a counter in memory survives stop and resume, is
// carried on by memory forks and memory snapshots, and not by disk ones.
func TestCaptureAcceptance(t *testing.T) {
	d := shared
	id := d.newSandbox(t, "--template", "base")
	first := startServer(t, d, id)

	t.Run("stop and resume", func(t *testing.T) {
		before := mustGet(t, d, id)
		var sb api.Sandbox
		d.jsonOut(t, &sb, "stop", id, "--wait")
		if sb.State != api.StateStopped {
			t.Fatalf("after stop --wait: state %s", sb.State)
		}
		r := d.sbx(t, "exec", id, "--", "true")
		if r.code != 1 || !strings.Contains(r.stderr, "sbx resume") {
			t.Errorf("exec in a stopped sandbox: exit %d %q, want a hint to resume", r.code, r.stderr)
		}
		time.Sleep(3 * time.Second) // so the clock check below can tell
		d.jsonOut(t, &sb, "resume", id)
		if sb.State != api.StateReady || !sb.MemoryRestored {
			t.Fatalf("after resume: %+v, want running with memory restored", sb)
		}
		after := mustGet(t, d, id)
		if after.Token != before.Token || after.Pid != before.Pid || after.Hits != before.Hits+1 {
			t.Errorf("after stop and resume: %+v, want token %s pid %d hits %d", after, before.Token, before.Pid, before.Hits+1)
		}
		checkNetwork(t, d, id, true)
		// The wall clock inside reads the real time, not the capture's.
		out := d.must(t, "exec", id, "--", "date", "+%s")
		inside, _ := strconv.ParseInt(strings.TrimSpace(out), 10, 64)
		if diff := time.Now().Unix() - inside; diff < -2 || diff > 2 {
			t.Errorf("clock inside is %d s off the host's after a resume", diff)
		}
		var info api.Sandbox
		info = d.info(t, id)
		if !info.MemoryRestored {
			t.Errorf("info --json: memoryRestored = false after a resume")
		}
	})

	t.Run("memory fork", func(t *testing.T) {
		base := mustGet(t, d, id)
		kids := forkMemory(t, d, id, 4)
		// Each child carries on the parent: same token, same next count.
		for _, k := range kids {
			checkNetwork(t, d, k, true)
			h := mustGet(t, d, k)
			if h.Token != first.Token || h.Hits != base.Hits+1 {
				t.Errorf("child %s: %+v, want token %s hits %d", k, h, first.Token, base.Hits+1)
			}
		}
		// Then the five counters move independently.
		all := append([]string{id}, kids...)
		for i, sb := range all {
			for j := 0; j < i; j++ {
				mustGet(t, d, sb)
			}
		}
		for i, sb := range all {
			h := mustGet(t, d, sb)
			want := base.Hits + 1 + i + 1
			if i == 0 {
				want = base.Hits + 1
			}
			if h.Hits != want {
				t.Errorf("sandbox %d (%s): hits %d, want %d", i, sb, h.Hits, want)
			}
		}
		// Randomness differs between children.
		seen := map[string]string{}
		for _, k := range kids {
			out := d.must(t, "exec", k, "--", "python3", "-c", "import os; print(os.urandom(16).hex(), open('/dev/urandom','rb').read(16).hex())")
			if other, ok := seen[out]; ok {
				t.Errorf("children %s and %s read the same random bytes", other, k)
			}
			seen[out] = k
		}
	})

	t.Run("snapshots", func(t *testing.T) {
		d.must(t, "exec", id, "--", "sh", "-c", "echo evidence > /tmp/marker")
		disk, mem := "acc-disk-"+randHex(3), "acc-mem-"+randHex(3)
		d.must(t, "snapshot", id, disk)
		t.Cleanup(func() { d.sbx(t, "snapshot", "rm", disk) })
		var sn api.Snapshot
		d.jsonOut(t, &sn, "snapshot", id, mem, "--memory")
		t.Cleanup(func() { d.sbx(t, "snapshot", "rm", mem) })
		if !sn.Memory || sn.Paused == nil {
			t.Errorf("memory snapshot = %+v, want memory and a paused time", sn)
		}
		// The source keeps running, server and all.
		mustGet(t, d, id)

		fromDisk := d.newSandbox(t, "--from", disk)
		if out := d.must(t, "exec", fromDisk, "--", "cat", "/tmp/marker"); out != "evidence\n" {
			t.Errorf("disk snapshot: /tmp/marker = %q", out)
		}
		if _, ok := get(t, d, fromDisk); ok {
			t.Errorf("disk snapshot: the server answers, but processes are not carried over")
		}
		fromMem := d.newSandbox(t, "--from", mem)
		h := mustGet(t, d, fromMem)
		if h.Token != first.Token {
			t.Errorf("memory snapshot: token %s, want %s", h.Token, first.Token)
		}
		var sb api.Sandbox
		sb = d.info(t, fromMem)
		if !sb.MemoryRestored || sb.From != mem {
			t.Errorf("sandbox from a memory snapshot: %+v", sb)
		}
		if out := d.must(t, "exec", fromMem, "--", "cat", "/tmp/marker"); out != "evidence\n" {
			t.Errorf("memory snapshot: /tmp/marker = %q", out)
		}
	})
}

// forkMemory makes n memory forks of id and schedules their deletion.
func forkMemory(t *testing.T, d *daemon, id string, n int) []string {
	t.Helper()
	out := d.must(t, "--json", "fork", id, "--memory", "--count", strconv.Itoa(n), "--wait")
	var ids []string
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		var ev struct {
			Event string `json:"event"`
			ID    string `json:"id"`
		}
		if err := json.Unmarshal([]byte(line), &ev); err != nil {
			t.Fatalf("fork --json printed %q: %v", line, err)
		}
		if ev.Event == "sandbox.forking" {
			ids = append(ids, ev.ID)
		}
	}
	for _, k := range ids {
		t.Cleanup(func() { deleteSandbox(context.Background(), d.client, k) })
	}
	if len(ids) != n {
		t.Fatalf("fork --count %d made %d: %q", n, len(ids), out)
	}
	return ids
}
