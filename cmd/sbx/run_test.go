package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"sbx.dev/sbx/api"
	"sbx.dev/sbx/internal/safetar/tartest"
)

// fake is the state of fakeDaemon: where it listens and what it was asked.
type fake struct {
	host    string
	uploads map[string][]byte

	mu    sync.Mutex
	execs []api.ExecRequest
	stats []string // the paths stat was asked for
}

// lastExec is the last exec request the fake got.
func (f *fake) lastExec(t *testing.T) api.ExecRequest {
	t.Helper()
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.execs) == 0 {
		t.Fatal("no exec request")
	}
	return f.execs[len(f.execs)-1]
}

// fakeDaemon answers the few routes the run tests use. The exec prints its
// argv on stdout and exits with the number its last word is; "sleep" runs
// until the client leaves, "timeout" ends as a timed-out exec does.
func fakeDaemon(t *testing.T) (host string, uploads map[string][]byte) {
	f := newFake(t)
	return f.host, f.uploads
}

func newFake(t *testing.T) *fake {
	t.Helper()
	f := &fake{uploads: map[string][]byte{}}
	uploads := f.uploads
	mux := http.NewServeMux()
	writeErr := func(w http.ResponseWriter, kind error, msg string) {
		status, code := api.StatusOf(kind)
		w.WriteHeader(status)
		json.NewEncoder(w).Encode(api.ErrorBody{Error: &api.ErrorDetail{Code: code, Message: msg}})
	}
	known := func(w http.ResponseWriter, r *http.Request) bool {
		if id := r.PathValue("id"); id != "sb_1" {
			writeErr(w, api.ErrNotFound, fmt.Sprintf("sandbox %s not found", id))
			return false
		}
		return true
	}
	mux.HandleFunc("POST /v1/sandboxes", func(w http.ResponseWriter, r *http.Request) {
		var req api.CreateRequest
		json.NewDecoder(r.Body).Decode(&req)
		w.WriteHeader(http.StatusCreated)
		json.NewEncoder(w).Encode(api.Sandbox{ID: "sb_1", Template: req.Template, Meta: req.Meta})
	})
	mux.HandleFunc("GET /v1/sandboxes/{id}", func(w http.ResponseWriter, r *http.Request) {
		if known(w, r) {
			json.NewEncoder(w).Encode(api.Sandbox{ID: "sb_1", State: api.StateReady})
		}
	})
	mux.HandleFunc("DELETE /v1/sandboxes/{id}", func(w http.ResponseWriter, r *http.Request) {
		if known(w, r) {
			json.NewEncoder(w).Encode(api.DeleteResult{ID: "sb_1"})
		}
	})
	mux.HandleFunc("GET /v1/sandboxes/{id}/execs/{exec}", func(w http.ResponseWriter, r *http.Request) {
		if !known(w, r) {
			return
		}
		json.NewEncoder(w).Encode(api.Exec{ID: r.PathValue("exec"), SandboxID: r.PathValue("id"), Pid: 7, State: api.ExecRunning, Detached: true})
	})
	mux.HandleFunc("POST /v1/sandboxes/{id}/exec", func(w http.ResponseWriter, r *http.Request) {
		if !known(w, r) {
			return
		}
		var req api.ExecRequest
		json.NewDecoder(r.Body).Decode(&req)
		f.mu.Lock()
		f.execs = append(f.execs, req)
		f.mu.Unlock()
		if req.Detach {
			w.WriteHeader(http.StatusCreated)
			json.NewEncoder(w).Encode(api.Exec{ID: "ex_1", Pid: 7, State: api.ExecRunning})
			return
		}
		code := 0
		fmt.Sscan(req.Cmd[len(req.Cmd)-1], &code)
		switch req.Cmd[0] {
		case "sleep":
			b, _ := json.Marshal(api.ExecEvent{Event: "started", Exec: &api.Exec{ID: "ex_9", State: api.ExecRunning}})
			fmt.Fprintf(w, "event: started\ndata: %s\n\n", b)
			w.(http.Flusher).Flush()
			<-r.Context().Done()
			return
		case "timeout":
			b, _ := json.Marshal(api.ExecEvent{Event: "stderr", Data: []byte("sbx: command timed out after " + req.Timeout.String() + "\n")})
			fmt.Fprintf(w, "event: stderr\ndata: %s\n\n", b)
			code := 124
			b, _ = json.Marshal(api.ExecEvent{Event: "exit", Exec: &api.Exec{ID: "ex_1", State: api.ExecExited, ExitCode: &code, TimedOut: true}})
			fmt.Fprintf(w, "event: exit\ndata: %s\n\n", b)
			return
		}
		for _, ev := range []api.ExecEvent{
			{Event: "stdout", Data: []byte(strings.Join(req.Cmd, " ") + "\n")},
			{Event: "stderr", Data: []byte("warn\n")},
			{Event: "exit", Exec: &api.Exec{ID: "ex_1", State: api.ExecExited, ExitCode: &code}},
		} {
			b, _ := json.Marshal(ev)
			fmt.Fprintf(w, "event: %s\ndata: %s\n\n", ev.Event, b)
		}
	})
	mux.HandleFunc("POST /v1/sandboxes/{id}/ttl", func(w http.ResponseWriter, r *http.Request) {
		var req api.TTLRequest
		json.NewDecoder(r.Body).Decode(&req)
		if known(w, r) {
			json.NewEncoder(w).Encode(api.Sandbox{ID: "sb_1", TTL: req.TTL})
		}
	})
	mux.HandleFunc("GET /v1/sandboxes", func(w http.ResponseWriter, r *http.Request) {
		json.NewEncoder(w).Encode([]api.Sandbox{{ID: "sb_1", Name: "web", State: api.StateReady}})
	})
	mux.HandleFunc("GET /v1/sandboxes/{id}/fs/stat", func(w http.ResponseWriter, r *http.Request) {
		f.mu.Lock()
		f.stats = append(f.stats, r.URL.Query().Get("path"))
		f.mu.Unlock()
		switch p := r.URL.Query().Get("path"); p {
		case "/dir":
			json.NewEncoder(w).Encode(api.FileInfo{Name: "dir", IsDir: true, Mode: "drwxr-xr-x"})
		case "/file", "/dies":
			json.NewEncoder(w).Encode(api.FileInfo{Name: p[1:], Size: 10, Mode: "-rw-r-----"})
		case "~/notes.txt":
			json.NewEncoder(w).Encode(api.FileInfo{Name: "notes.txt", Path: "/root/notes.txt", Size: 5, Mode: "-rw-r--r--"})
		default:
			writeErr(w, api.ErrNotFound, p+" not found")
		}
	})
	mux.HandleFunc("PUT /v1/sandboxes/{id}/files", func(w http.ResponseWriter, r *http.Request) {
		if r.ContentLength < 0 && r.URL.Query().Get("tar") == "" {
			writeErr(w, api.ErrInvalid, "Content-Length required")
			return
		}
		b, _ := io.ReadAll(r.Body)
		uploads[r.URL.Query().Get("path")+" mode="+r.URL.Query().Get("mode")] = b
		w.WriteHeader(http.StatusNoContent)
	})
	mux.HandleFunc("GET /v1/sandboxes/{id}/files", func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Query().Get("path") {
		case "/file":
			io.WriteString(w, "0123456789")
		case "~/notes.txt":
			io.WriteString(w, "notes")
		case "/dies":
			// promise 10 bytes, send 4, and vanish
			w.Header().Set("Content-Length", "10")
			w.WriteHeader(http.StatusOK)
			io.WriteString(w, "0123")
			w.(http.Flusher).Flush()
			conn, _, _ := w.(http.Hijacker).Hijack()
			conn.Close()
		case "/dir":
			w.Write(tartest.Tar(t, [][2]string{{"dir/", ""}, {"dir/a", "A"}, {"dir/sub/b", "B"}}))
		}
	})
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	f.host = "tcp://" + srv.Listener.Addr().(*net.TCPAddr).String()
	return f
}

func TestRun(t *testing.T) {
	host, _ := fakeDaemon(t)
	tests := []struct {
		name       string
		args       []string
		wantCode   int
		wantOut    string // substring of stdout
		wantErrOut string // substring of stderr
	}{
		{"no args", nil, 2, "", "usage: sbx"},
		{"help", []string{"help"}, 0, "Sandboxes:", ""},
		{"unknown verb", []string{"frob"}, 2, "", `unknown command "frob"`},
		{"new", []string{"new", "--template", "tiny"}, 0, "sb_1\n", ""},
		{"new json before verb", []string{"--json", "new", "--meta", "a=1"}, 0, `"id": "sb_1"`, ""},
		{"new json after verb", []string{"new", "--json"}, 0, `"id": "sb_1"`, ""},
		{"new bad ttl", []string{"new", "--ttl", "soon"}, 2, "", `invalid argument "soon" for "--ttl" flag: "soon" is not a duration (use seconds, like 90, or a number with a unit`},
		{"new bad meta", []string{"new", "--meta", "novalue"}, 2, "", "key=value"},
		{"new stray arg", []string{"new", "x"}, 2, "", "usage: sbx new"},
		{"info", []string{"info", "sb_1"}, 0, "state: ready", ""},
		{"info missing", []string{"info", "sb_x"}, 1, "", "sbx: sandbox sb_x not found\n"},
		{"info missing json", []string{"info", "sb_x", "--json"}, 1, "", `{"error":{"code":"not_found","message":"sandbox sb_x not found"}}`},
		{"delete some fail", []string{"rm", "sb_1", "sb_x", "--yes"}, 1, "sb_1\n", "sbx: sandbox sb_x not found"},
		{"delete", []string{"delete", "sb_1"}, 0, "sb_1\n", ""},
		{"exec ok", []string{"exec", "sb_1", "--", "true", "0"}, 0, "true 0\n", "warn\n"},
		{"exec remote code", []string{"exec", "sb_1", "--timeout", "5s", "--", "false", "7"}, 7, "false 7\n", ""},
		{"exec shell", []string{"exec", "sb_1", "exit 3"}, 0, "/bin/sh -c exit 3\n", ""},
		{"exec json", []string{"exec", "--json", "sb_1", "--", "x", "4"}, 4, `{"event":"exit"`, ""},
		{"exec detach", []string{"exec", "sb_1", "--detach", "--", "sleep", "9"}, 0, "ex_1 7\n", ""},
		{"exec no command", []string{"exec", "sb_1"}, 2, "", "usage: sbx exec"},
		{"exec missing sandbox", []string{"exec", "sb_x", "--", "ls"}, 1, "", "sbx: sandbox sb_x not found"},
		{"logs unknown stream", []string{"logs", "sb_1", "--stream", "nosuch"}, 2, "", "console, events, runtime"},
		{"scp dir without -r", []string{"scp", "sb_1:/dir", t.TempDir()}, 2, "", "use -r"},
		{"scp both local", []string{"scp", "a", "b"}, 2, "", "ID:/path"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			code := run(append([]string{"--host", host}, tc.args...), strings.NewReader(""), &stdout, &stderr)
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

func TestScp(t *testing.T) {
	host, uploads := fakeDaemon(t)
	dir := t.TempDir()
	local := filepath.Join(dir, "local.txt")
	os.WriteFile(local, []byte("hello sandbox"), 0o640)
	os.MkdirAll(filepath.Join(dir, "tree", "sub"), 0o755)
	os.WriteFile(filepath.Join(dir, "tree", "sub", "f"), []byte("F"), 0o644)
	sbx := func(args ...string) (int, string) {
		var stdout, stderr bytes.Buffer
		code := run(append([]string{"--host", host}, args...), strings.NewReader(""), &stdout, &stderr)
		return code, stderr.String()
	}

	t.Run("upload into existing dir", func(t *testing.T) {
		if code, errOut := sbx("scp", local, "sb_1:/dir"); code != 0 {
			t.Fatalf("exit %d: %s", code, errOut)
		}
		if got := string(uploads["/dir/local.txt mode=0640"]); got != "hello sandbox" {
			t.Errorf("got %q in %v", got, uploads)
		}
	})
	t.Run("upload to new name", func(t *testing.T) {
		if code, errOut := sbx("scp", local, "sb_1:/new.txt"); code != 0 {
			t.Fatalf("exit %d: %s", code, errOut)
		}
		if _, ok := uploads["/new.txt mode=0640"]; !ok {
			t.Errorf("no upload to /new.txt in %v", uploads)
		}
	})
	t.Run("upload -r", func(t *testing.T) {
		if code, errOut := sbx("scp", "-r", filepath.Join(dir, "tree"), "sb_1:/dir"); code != 0 {
			t.Fatalf("exit %d: %s", code, errOut)
		}
		if _, ok := uploads["/dir/tree mode="]; !ok {
			t.Errorf("no tar upload to /dir/tree in %v", uploads)
		}
	})
	t.Run("download file", func(t *testing.T) {
		target := filepath.Join(dir, "got")
		if code, errOut := sbx("scp", "sb_1:/file", target); code != 0 {
			t.Fatalf("exit %d: %s", code, errOut)
		}
		fi, err := os.Stat(target)
		if b, _ := os.ReadFile(target); err != nil || string(b) != "0123456789" || fi.Mode().Perm() != 0o640 {
			t.Errorf("got %q mode %v, %v", b, fi.Mode(), err)
		}
	})
	t.Run("download dies midway", func(t *testing.T) {
		out := t.TempDir()
		code, errOut := sbx("scp", "sb_1:/dies", out)
		if code != 1 {
			t.Errorf("got exit %d, want 1 (%s)", code, errOut)
		}
		if ents, _ := os.ReadDir(out); len(ents) != 0 {
			t.Errorf("left %v behind", ents)
		}
	})
	t.Run("download -r", func(t *testing.T) {
		out := t.TempDir()
		if code, errOut := sbx("scp", "-r", "sb_1:/dir", filepath.Join(out, "copy")); code != 0 {
			t.Fatalf("exit %d: %s", code, errOut)
		}
		if b, err := os.ReadFile(filepath.Join(out, "copy", "sub", "b")); err != nil || string(b) != "B" {
			t.Errorf("got %q, %v", b, err)
		}
		// into an existing directory: as cp -r, below its base name
		if code, errOut := sbx("scp", "-r", "sb_1:/dir", out); code != 0 {
			t.Fatalf("exit %d: %s", code, errOut)
		}
		if b, err := os.ReadFile(filepath.Join(out, "dir", "a")); err != nil || string(b) != "A" {
			t.Errorf("got %q, %v", b, err)
		}
	})
}
