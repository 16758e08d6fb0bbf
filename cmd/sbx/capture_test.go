package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"sbx.dev/sbx/api"
)

// captureFake is a fake sbxd for the capture verbs: snapshots, forks, stop,
// resume, events. sb_1 is a running sandbox, sb_cold a stopped one whose
// memory is gone, sb_err one whose forks fail, sb_hold one whose forks hold
// their stream open after "sandbox.forking" until released.
type captureFake struct {
	host    string
	release chan struct{}
	once    sync.Once

	mu        sync.Mutex
	forkReqs  []api.ForkRequest
	createReq api.CreateRequest
}

func newCaptureFake(t *testing.T) *captureFake {
	t.Helper()
	f := &captureFake{release: make(chan struct{})}
	mux := http.NewServeMux()
	writeErr := func(w http.ResponseWriter, kind error, msg string) {
		status, code := api.StatusOf(kind)
		w.WriteHeader(status)
		json.NewEncoder(w).Encode(api.ErrorBody{Error: &api.ErrorDetail{Code: code, Message: msg}})
	}
	sse := func(w http.ResponseWriter, name string, v any) {
		b, _ := json.Marshal(v)
		fmt.Fprintf(w, "event: %s\ndata: %s\n\n", name, b)
		w.(http.Flusher).Flush()
	}
	known := func(w http.ResponseWriter, r *http.Request) bool {
		switch id := r.PathValue("id"); id {
		case "sb_1", "sb_cold", "sb_far", "sb_err", "sb_hold", "sb_c1": // sb_c1: a child, forked again in a tree
			return true
		default:
			writeErr(w, api.ErrNotFound, fmt.Sprintf("sandbox %s not found", id))
			return false
		}
	}
	created := time.Now().Add(-3 * time.Minute)
	mux.HandleFunc("POST /v1/sandboxes", func(w http.ResponseWriter, r *http.Request) {
		var req api.CreateRequest
		json.NewDecoder(r.Body).Decode(&req)
		f.mu.Lock()
		f.createReq = req
		f.mu.Unlock()
		if req.From == "nosuch" {
			writeErr(w, api.ErrNotFound, "snapshot nosuch not found")
			return
		}
		w.WriteHeader(http.StatusCreated)
		json.NewEncoder(w).Encode(api.Sandbox{ID: "sb_new", From: req.From, MemoryRestored: true})
	})
	mux.HandleFunc("GET /v1/sandboxes/{id}", func(w http.ResponseWriter, r *http.Request) {
		if known(w, r) {
			json.NewEncoder(w).Encode(api.Sandbox{ID: r.PathValue("id"), State: api.StateReady, From: "s1",
				Parent: "sb_0", ResumeReason: "memory image incomplete"})
		}
	})
	mux.HandleFunc("DELETE /v1/sandboxes/{id}", func(w http.ResponseWriter, r *http.Request) {
		if !known(w, r) {
			return
		}
		res := api.DeleteResult{ID: r.PathValue("id")}
		if r.URL.Query().Get("withSnapshots") == "1" {
			res.Snapshots = []string{"a", "b"}
		}
		json.NewEncoder(w).Encode(res)
	})
	mux.HandleFunc("POST /v1/sandboxes/{id}/snapshots", func(w http.ResponseWriter, r *http.Request) {
		if !known(w, r) {
			return
		}
		var req api.SnapshotRequest
		json.NewDecoder(r.Body).Decode(&req)
		if req.Name == "taken" {
			writeErr(w, api.ErrConflict, "snapshot taken exists")
			return
		}
		s := api.Snapshot{Name: req.Name, SandboxID: r.PathValue("id"), Memory: req.Memory, Size: 3355443, CreatedAt: created}
		if req.Memory {
			s.Paused = api.DurationOf(120 * time.Millisecond)
		}
		w.WriteHeader(http.StatusCreated)
		json.NewEncoder(w).Encode(s)
	})
	mux.HandleFunc("GET /v1/snapshots", func(w http.ResponseWriter, r *http.Request) {
		json.NewEncoder(w).Encode([]api.Snapshot{
			{Name: "s1", SandboxID: "sb_1", Template: "tiny", Memory: true, Size: 2048, CreatedAt: created},
			{Name: "s2", Template: "base", Size: 100},
		})
	})
	mux.HandleFunc("GET /v1/snapshots/{name}", func(w http.ResponseWriter, r *http.Request) {
		if r.PathValue("name") != "s1" {
			writeErr(w, api.ErrNotFound, "snapshot "+r.PathValue("name")+" not found")
			return
		}
		json.NewEncoder(w).Encode(api.Snapshot{Name: "s1", SandboxID: "sb_1", Template: "tiny", Memory: true, Paused: api.DurationOf(80 * time.Millisecond), Size: 2048})
	})
	mux.HandleFunc("DELETE /v1/snapshots/{name}", func(w http.ResponseWriter, r *http.Request) {
		if n := r.PathValue("name"); n != "s1" && n != "s2" {
			writeErr(w, api.ErrNotFound, "snapshot "+n+" not found")
			return
		}
		w.WriteHeader(http.StatusNoContent)
	})
	mux.HandleFunc("POST /v1/sandboxes/{id}/fork", func(w http.ResponseWriter, r *http.Request) {
		if !known(w, r) {
			return
		}
		var req api.ForkRequest
		json.NewDecoder(r.Body).Decode(&req)
		f.mu.Lock()
		f.forkReqs = append(f.forkReqs, req)
		f.mu.Unlock()
		n := max(req.Count, 1)
		if n > api.MaxForks {
			writeErr(w, api.ErrInvalid, fmt.Sprintf("count %d: at most %d forks per call", n, api.MaxForks))
			return
		}
		var ids []string
		for i := range n {
			ids = append(ids, fmt.Sprintf("sb_c%d", i+1))
		}
		sse(w, "sandbox.forking", api.ForkEvent{Event: "sandbox.forking", IDs: ids})
		switch r.PathValue("id") {
		case "sb_err":
			sse(w, "error", api.ForkEvent{Event: "error", ErrorBody: api.ErrorBody{Error: &api.ErrorDetail{Message: "checkpoint: no space left"}}})
			return
		case "sb_hold":
			select {
			case <-f.release:
			case <-r.Context().Done():
				return
			}
		}
		var sbs []api.Sandbox
		for _, id := range ids {
			sb := api.Sandbox{ID: id, State: api.StateReady, Parent: r.PathValue("id"), MemoryRestored: req.Memory}
			sbs = append(sbs, sb)
			sse(w, "sandbox.ready", api.ForkEvent{Event: "sandbox.ready", Sandbox: &sb})
		}
		sse(w, "done", api.ForkEvent{Event: "done", Sandboxes: sbs})
	})
	mux.HandleFunc("POST /v1/sandboxes/{id}/stop", func(w http.ResponseWriter, r *http.Request) {
		if !known(w, r) {
			return
		}
		if r.URL.Query().Get("wait") == "1" {
			json.NewEncoder(w).Encode(api.Sandbox{ID: r.PathValue("id"), State: api.StateStopped})
			return
		}
		w.WriteHeader(http.StatusAccepted)
		json.NewEncoder(w).Encode(api.Sandbox{ID: r.PathValue("id"), State: api.StateStopping})
	})
	mux.HandleFunc("POST /v1/sandboxes/{id}/resume", func(w http.ResponseWriter, r *http.Request) {
		if !known(w, r) {
			return
		}
		var req api.ResumeRequest
		json.NewDecoder(r.Body).Decode(&req)
		sb := api.Sandbox{ID: r.PathValue("id"), State: api.StateReady, MemoryRestored: true}
		if sb.ID == "sb_far" && r.Header.Get(api.HeaderProgress) == "102" { // a fleet's wait for a node
			w.Header().Set(api.HeaderWaiting, "waiting up to 2m0s for a node where its memory restores: n2: lacks CPU features avx512f")
			w.WriteHeader(http.StatusProcessing)
			w.Header().Del(api.HeaderWaiting)
		}
		if sb.ID == "sb_cold" {
			if req.RequireMemory {
				writeErr(w, api.ErrConflict, "sandbox sb_cold: memory image unreadable; it is kept")
				return
			}
			sb.MemoryRestored, sb.ResumeReason = false, "memory image unreadable"
		}
		json.NewEncoder(w).Encode(sb)
	})
	mux.HandleFunc("GET /v1/sandboxes/{id}/events", func(w http.ResponseWriter, r *http.Request) {
		if !known(w, r) {
			return
		}
		t0 := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
		sse(w, "event", api.Event{Seq: 1, SandboxID: "sb_1", Time: t0, Type: "created"})
		sse(w, "event", api.Event{Seq: 2, SandboxID: "sb_1", Time: t0, Type: "snapshotted",
			Detail: map[string]any{"sizeBytes": 3355443, "outcome": "ok", "durationMs": 120}})
		if r.URL.Query().Get("follow") == "1" {
			sse(w, "event", api.Event{Seq: 3, SandboxID: "sb_1", Time: t0, Type: "stopped", Detail: map[string]any{"reason": "asked by user"}})
		}
		sse(w, "eof", map[string]string{})
	})
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	t.Cleanup(f.releaseForks) // runs before srv.Close: no handler is left waiting
	f.host = "tcp://" + srv.Listener.Addr().(*net.TCPAddr).String()
	return f
}

// releaseForks lets held fork streams go on.
func (f *captureFake) releaseForks() { f.once.Do(func() { close(f.release) }) }

func TestRunCapture(t *testing.T) {
	f := newCaptureFake(t)
	tests := []struct {
		name       string
		args       []string
		wantCode   int
		wantOut    string // substring of stdout
		wantErrOut string // substring of stderr
	}{
		{"snapshot memory", []string{"snapshot", "sb_1", "s9", "--memory"}, 0, "snapshot s9 of sb_1 (memory, paused 120ms, 3.2 MiB)\n", ""},
		{"snapshot disk", []string{"snapshot", "--memory=false", "sb_1", "s9"}, 0, "snapshot s9 of sb_1 (disk, 3.2 MiB)\n", ""},
		{"snapshot json", []string{"snapshot", "sb_1", "s9", "--json", "--memory"}, 0, `"paused": "120ms"`, ""},
		{"snapshot taken", []string{"snapshot", "sb_1", "taken"}, 1, "", "sbx: snapshot taken exists"},
		{"snapshot missing sandbox", []string{"snapshot", "sb_x", "s9"}, 1, "", "sandbox sb_x not found"},
		{"snapshot one arg", []string{"snapshot", "sb_1"}, 2, "", "usage: sbx snapshot"},
		{"snapshot no args", []string{"snapshot"}, 2, "", "usage: sbx snapshot"},
		{"snapshot ls", []string{"snapshot", "ls"}, 0, "NAME  SANDBOX  TEMPLATE  MEMORY  SIZE  AGE\ns1    sb_1     tiny      yes     2.0K  3m\ns2    -        base      no      100B  -\n", ""},
		{"snapshots", []string{"snapshots"}, 0, "s1    sb_1", ""},
		{"snapshots json", []string{"snapshots", "--json"}, 0, `"name": "s2"`, ""},
		{"snapshots stray arg", []string{"snapshots", "sb_1"}, 2, "", "snapshots takes no arguments"},
		{"snapshot ls memory", []string{"snapshot", "ls", "--memory"}, 2, "", "unknown flag: --memory"},
		{"snapshots memory", []string{"snapshots", "--memory"}, 2, "", "--memory is for taking"},
		{"snapshot info", []string{"snapshot", "info", "s1"}, 0, "name: s1\nsandbox: sb_1\ntemplate: tiny\nmemory: yes\npaused: 80ms\nsize: 2.0 KiB\n", ""},
		{"snapshot info missing", []string{"snapshot", "info", "nope"}, 1, "", "snapshot nope not found"},
		{"snapshot rm", []string{"snapshot", "rm", "s1", "s2"}, 0, "s1\ns2\n", ""},
		{"snapshot rm some fail", []string{"snapshot", "rm", "s1", "nope", "s2"}, 1, "s1\ns2\n", "sbx: snapshot nope not found\n"},
		{"snapshot rm json", []string{"snapshot", "rm", "s1", "--json"}, 0, "{\n  \"removed\": [\n    \"s1\"\n  ]\n}\n", ""},
		{"snapshot info json", []string{"snapshot", "info", "s1", "--json"}, 0, "{\n  \"snapshot\": {\n    \"name\": \"s1\"", ""},
		{"snapshot ls json", []string{"snapshot", "ls", "--json"}, 0, "{\n  \"snapshots\": [", ""},
		{"new from", []string{"new", "--from", "s1"}, 0, "sb_new\n", ""},
		{"new from missing", []string{"new", "--from", "nosuch"}, 1, "", "snapshot nosuch not found"},
		{"stop", []string{"stop", "sb_1"}, 0, "stopping sb_1\n", ""},
		{"stop wait", []string{"stop", "--wait", "sb_1"}, 0, "stopped sb_1\n", ""},
		{"stop json", []string{"stop", "sb_1", "--wait", "--json"}, 0, `"state": "stopped"`, ""},
		{"stop missing", []string{"stop", "sb_x"}, 1, "", "sandbox sb_x not found"},
		{"stop no id", []string{"stop"}, 2, "", "usage: sbx stop"},
		{"resume", []string{"resume", "sb_1"}, 0, "resumed sb_1 (memory restored)\n", ""},
		{"resume cold", []string{"resume", "sb_cold"}, 0, "resumed sb_cold from its disk: memory image unreadable\n", ""},
		{"resume require memory", []string{"resume", "sb_cold", "--require-memory"}, 1, "", "memory image unreadable; it is kept"},
		{"resume json", []string{"resume", "sb_cold", "--json"}, 0, `"resumeReason": "memory image unreadable"`, ""},
		{"resume says why it waits", []string{"resume", "sb_far", "--require-memory"}, 0, "resumed sb_far (memory restored)\n",
			"sbx: resume sb_far: waiting up to 2m0s for a node where its memory restores: n2: lacks CPU features avx512f\n"},
		{"resume two ids", []string{"resume", "sb_1", "sb_cold"}, 2, "", "usage: sbx resume"},
		{"events", []string{"events", "sb_1"}, 0, " snapshotted durationMs=120 outcome=ok sizeBytes=3355443\n", ""},
		{"events follow", []string{"events", "sb_1", "-f"}, 0, ` stopped reason="asked by user"` + "\n", ""},
		{"events json", []string{"events", "sb_1", "--json"}, 0, `{"seq":1,"sandboxId":"sb_1","time":"2026-01-02T03:04:05Z","type":"created"}` + "\n", ""},
		{"events missing", []string{"events", "sb_x"}, 1, "", "sandbox sb_x not found"},
		{"delete with snapshots", []string{"delete", "sb_1", "--with-snapshots"}, 0, "deleted sb_1 (snapshots: a, b)\n", ""},
		{"delete with snapshots json", []string{"delete", "sb_1", "--with-snapshots", "--json"}, 0, `"snapshots": [`, ""},
		{"info capture fields", []string{"info", "sb_1"}, 0, "from: s1\nparent: sb_0\nmemory restored: no\nresume reason: memory image incomplete\n", ""},
		{"fork", []string{"fork", "sb_1"}, 0, "sb_c1\n", ""},
		{"fork wait", []string{"fork", "sb_1", "--count", "2", "--wait"}, 0, "sb_c1\nsb_c2\nready sb_c1\nready sb_c2\n", ""},
		{"fork error event", []string{"fork", "sb_err", "--wait"}, 1, "sb_c1\n", "sbx: fork sb_err: checkpoint: no space left\n"},
		{"fork error event json", []string{"fork", "sb_err", "--wait", "--json"}, 1, `{"event":"sandbox.forking","id":"sb_c1"}`, "checkpoint: no space left"},
		{"fork over the limit", []string{"fork", "sb_1", "--count", "17"}, 1, "", "a fork makes 1 to 16 sandboxes per call"},
		{"fork bad count", []string{"fork", "sb_1", "--count", "many"}, 2, "", "usage: sbx fork"},
		{"fork no id", []string{"fork"}, 2, "", "usage: sbx fork"},
		{"fork missing", []string{"fork", "sb_x"}, 1, "", "sandbox sb_x not found"},
		{"fork count 0", []string{"fork", "sb_1", "--count", "0"}, 2, "", "--count 0 is out of range: a fork makes 1 to 16 sandboxes per call"},
		{"fork count negative", []string{"fork", "sb_1", "--count", "-1"}, 2, "", "--count -1"},
		{"fork name with a count", []string{"fork", "sb_1", "--count", "3", "--name", "x"}, 2, "", "--name names one child"},
		{"new template and from", []string{"new", "--template", "tiny", "--from", "s1"}, 2, "", "give --template or --from, not both"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			code := run(append([]string{"--host", f.host}, tc.args...), strings.NewReader(""), &stdout, &stderr)
			if code != tc.wantCode {
				t.Errorf("got exit %d, want %d (stderr %q)", code, tc.wantCode, stderr.String())
			}
			if !strings.Contains(stdout.String(), tc.wantOut) {
				t.Errorf("stdout %q does not contain %q", stdout.String(), tc.wantOut)
			}
			if !strings.Contains(stderr.String(), tc.wantErrOut) {
				t.Errorf("stderr %q does not contain %q", stderr.String(), tc.wantErrOut)
			}
		})
	}
}

func TestForkRequest(t *testing.T) {
	tests := []struct {
		name string
		args []string
		want api.ForkRequest
	}{
		{"defaults", []string{"fork", "sb_1"}, api.ForkRequest{Count: 1}},
		{"all flags", []string{"fork", "--memory", "sb_1", "--name", "kid", "--count", "1", "--ttl", "5m", "--wait"},
			api.ForkRequest{Name: "kid", Memory: true, Count: 1, TTL: api.DurationOf(5 * time.Minute)}},
		{"ttl in seconds", []string{"fork", "sb_1", "--ttl", "3600"}, api.ForkRequest{Count: 1, TTL: api.DurationOf(time.Hour)}},
		// refused here, naming the limit: a fork is never split or cut
		{"over the limit", []string{"fork", "sb_1", "--count", "40"}, api.ForkRequest{}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := newCaptureFake(t)
			var stdout, stderr bytes.Buffer
			run(append([]string{"--host", f.host}, tc.args...), strings.NewReader(""), &stdout, &stderr)
			f.mu.Lock()
			defer f.mu.Unlock()
			want := []api.ForkRequest{tc.want}
			if tc.want.Count == 0 {
				want = nil
			}
			if diff := cmp.Diff(want, f.forkReqs); diff != "" {
				t.Errorf("fork requests (-want +got):\n%s", diff)
			}
		})
	}
}

// TestForkTree: past api.MaxForks, `sbx fork --wait` does what the client
// does, a tree (16 from the parent, the rest from its first child); without
// --wait it refuses, saying why (api.CheckForkCount).
func TestForkTree(t *testing.T) {
	f := newCaptureFake(t)
	var stdout, stderr bytes.Buffer
	if code := run([]string{"--host", f.host, "fork", "sb_1", "--count", "17", "--wait"}, strings.NewReader(""), &stdout, &stderr); code != 0 {
		t.Fatalf("fork --count 17 --wait: exit %d, stderr %q", code, stderr.String())
	}
	if n := strings.Count(stdout.String(), "ready "); n != 17 {
		t.Errorf("fork --count 17 --wait: %d ready, want 17:\n%s", n, stdout.String())
	}
	f.mu.Lock()
	got := f.forkReqs
	f.forkReqs = nil
	f.mu.Unlock()
	if diff := cmp.Diff([]api.ForkRequest{{Count: 16}, {Count: 1}}, got); diff != "" {
		t.Errorf("fork requests (-want +got):\n%s", diff)
	}
	stdout.Reset()
	stderr.Reset()
	code := run([]string{"--host", f.host, "fork", "sb_1", "--count", "17"}, strings.NewReader(""), &stdout, &stderr)
	if want := "--count 17 is out of range: a fork makes 1 to 16 sandboxes per call; more grow a tree from the children, which must be ready: wait for them (--wait)"; code != 1 || !strings.Contains(stderr.String(), want) {
		t.Errorf("fork --count 17: exit %d, stderr %q; want 1 and %q", code, stderr.String(), want)
	}
	if len(f.forkReqs) != 0 {
		t.Errorf("fork --count 17 without --wait sent %+v", f.forkReqs)
	}
}

func TestNewFrom(t *testing.T) {
	f := newCaptureFake(t)
	var stdout, stderr bytes.Buffer
	if code := run([]string{"--host", f.host, "new", "--from", "s1", "--name", "n", "--ttl", "1h"}, nil, &stdout, &stderr); code != 0 {
		t.Fatalf("exit %d: %s", code, stderr.String())
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if diff := cmp.Diff(api.CreateRequest{From: "s1", Name: "n", TTL: api.Duration(time.Hour)}, f.createReq); diff != "" {
		t.Errorf("create request (-want +got):\n%s", diff)
	}
}

// runAsync runs sbx in the background and returns its exit code on a channel.
func runAsync(args []string, stdout, stderr io.Writer) <-chan int {
	done := make(chan int, 1)
	go func() { done <- run(args, strings.NewReader(""), stdout, stderr) }()
	return done
}

// TestForkJSONNoWait checks that without --wait sbx prints the new ids and
// returns while the server's fork stream is still open.
func TestForkJSONNoWait(t *testing.T) {
	f := newCaptureFake(t)
	var stdout, stderr bytes.Buffer
	done := runAsync([]string{"--host", f.host, "fork", "sb_hold", "--count", "2", "--json"}, &stdout, &stderr)
	select {
	case code := <-done:
		if code != 0 {
			t.Fatalf("exit %d: %s", code, stderr.String())
		}
	case <-time.After(10 * time.Second):
		t.Fatal("sbx fork without --wait waited for the stream to end")
	}
	want := `{"event":"sandbox.forking","id":"sb_c1"}` + "\n" + `{"event":"sandbox.forking","id":"sb_c2"}` + "\n"
	if got := stdout.String(); got != want {
		t.Errorf("got %q, want %q", got, want)
	}
}

// TestForkJSONWait checks that with --wait the forking lines come out before
// the stream ends, and the ready lines after.
func TestForkJSONWait(t *testing.T) {
	f := newCaptureFake(t)
	pr, pw := io.Pipe()
	var stderr bytes.Buffer
	done := runAsync([]string{"--host", f.host, "fork", "sb_hold", "--count", "2", "--json", "--wait", "--memory"}, pw, &stderr)
	lines := make(chan string)
	go func() {
		s := bufio.NewScanner(pr)
		for s.Scan() {
			lines <- s.Text()
		}
		close(lines)
	}()
	next := func() string {
		select {
		case l := <-lines:
			return l
		case <-time.After(10 * time.Second):
			t.Fatal("no line printed")
			return ""
		}
	}
	// the server holds the stream open: these must come before it is released
	for _, id := range []string{"sb_c1", "sb_c2"} {
		if got, want := next(), `{"event":"sandbox.forking","id":"`+id+`"}`; got != want {
			t.Fatalf("got %q, want %q", got, want)
		}
	}
	f.releaseForks()
	for _, id := range []string{"sb_c1", "sb_c2"} {
		var got forkLine
		if err := json.Unmarshal([]byte(next()), &got); err != nil {
			t.Fatal(err)
		}
		want := forkLine{Event: "sandbox.ready", ID: id, Sandbox: &api.Sandbox{ID: id, State: api.StateReady, Parent: "sb_hold", MemoryRestored: true}}
		if diff := cmp.Diff(want, got); diff != "" {
			t.Errorf("ready line (-want +got):\n%s", diff)
		}
	}
	select {
	case code := <-done:
		if code != 0 {
			t.Fatalf("exit %d: %s", code, stderr.String())
		}
	case <-time.After(10 * time.Second):
		t.Fatal("sbx fork --wait did not end after done")
	}
	pw.Close()
	if l, ok := <-lines; ok {
		t.Errorf("extra line %q after the ready lines", l)
	}
}

func TestSnapshotArgs(t *testing.T) {
	f := newCaptureFake(t)
	tests := []struct {
		name string
		args []string
		code int
		want string // in stdout (exit 0) or stderr
	}{
		{"take", []string{"snapshot", "sb_1", "s1"}, 0, "snapshot s1 of sb_1"},
		{"ls", []string{"snapshot", "ls"}, 0, "s1    sb_1"},
		{"list", []string{"snapshot", "list"}, 0, "s1    sb_1"},
		{"info", []string{"snapshot", "info", "s1"}, 0, "name: s1"},
		{"rm many", []string{"snapshot", "rm", "s1", "s2"}, 0, "s1\ns2\n"},
		{"snapshots is ls", []string{"snapshots"}, 0, "s1    sb_1"},
		{"snapshots ls", []string{"snapshots", "ls"}, 0, "s1    sb_1"},
		{"none", []string{"snapshot"}, 2, "snapshot takes ID NAME, or ls, info NAME, rm NAME..."},
		{"take one arg", []string{"snapshot", "sb_1"}, 2, "a sandbox id and a snapshot name"},
		{"take three args", []string{"snapshot", "sb_1", "a", "b"}, 2, "a sandbox id and a snapshot name"},
		{"ls with arg", []string{"snapshot", "ls", "x"}, 2, "ls takes no arguments"},
		{"info without name", []string{"snapshot", "info"}, 2, "info takes one snapshot name"},
		{"info two names", []string{"snapshot", "info", "a", "b"}, 2, "info takes one snapshot name"},
		{"rm without name", []string{"snapshot", "rm"}, 2, "at least one snapshot name"},
		{"snapshots take", []string{"snapshots", "sb_1", "s1"}, 2, "snapshots takes no arguments"},
		{"typo of a subcommand", []string{"snapshot", "lst"}, 2, `did you mean "ls"?`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			code := run(append([]string{"--host", f.host}, tc.args...), strings.NewReader(""), &stdout, &stderr)
			out := stdout.String()
			if tc.code != 0 {
				out = stderr.String()
			}
			if code != tc.code || !strings.Contains(out, tc.want) {
				t.Errorf("exit %d, stdout %q, stderr %q; want exit %d with %q", code, stdout.String(), stderr.String(), tc.code, tc.want)
			}
		})
	}
}

func TestEventLine(t *testing.T) {
	t0 := time.Date(2026, 1, 2, 3, 4, 5, 6e6, time.Local)
	tests := []struct {
		name string
		ev   api.Event
		want string
	}{
		{"no detail", api.Event{Time: t0, Type: "created"}, t0.Format("2006-01-02T15:04:05.000Z07:00") + " created"},
		{"sorted, numbers whole, quoted", api.Event{Time: t0, Type: "stopped", Detail: map[string]any{
			"sizeBytes": float64(3355443), "outcome": "error", "error": "no space left", "durationMs": 12.5, "ids": []any{"a", "b"},
		}}, t0.Format("2006-01-02T15:04:05.000Z07:00") + ` stopped durationMs=12.5 error="no space left" ids=["a","b"] outcome=error sizeBytes=3355443`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := eventLine(tc.ev); got != tc.want {
				t.Errorf("got %q, want %q", got, tc.want)
			}
		})
	}
}

func TestSizeIEC(t *testing.T) {
	tests := []struct {
		n    int64
		want string
	}{{0, "0 B"}, {512, "512 B"}, {2048, "2.0 KiB"}, {3355443, "3.2 MiB"}, {5 << 30, "5.0 GiB"}}
	for _, tc := range tests {
		if got := sizeIEC(tc.n); got != tc.want {
			t.Errorf("sizeIEC(%d) got %q, want %q", tc.n, got, tc.want)
		}
	}
}
