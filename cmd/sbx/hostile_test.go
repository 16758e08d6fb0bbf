package main

import (
	"archive/tar"
	"bytes"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"sbx.dev/sbx/api"
	"sbx.dev/sbx/client"
	"sbx.dev/sbx/internal/flaky"
)

// A hostile sandbox feeding the CLI: what it names (files, processes,
// commands, a crash's signal and backtrace) reaches the terminal quoted, so
// it can neither move the cursor, retitle the window, clear the screen nor
// forge a row.

// pwn is what a hostile sandbox puts in a name: an OSC retitle, a screen
// clear, a carriage return and a newline that forge a row, a bidi override.
const pwn = "\x1b]0;pwned\x07\x1b[2J\rok\nMODE\tSIZE fake-row \u202eexe.txt\x9b"

// inert fails the test if s holds anything a terminal acts on.
func inert(t *testing.T, what, s string) {
	t.Helper()
	for _, bad := range []string{"\x1b", "\x07", "\r", "\u202e", "\x9b", "\xc2\x9b"} {
		if strings.Contains(s, bad) {
			t.Errorf("%s prints %q raw:\n%s", what, bad, s)
		}
	}
}

// hostileDaemon answers ls, stat, ports, ps and info with pwn in every name.
func hostileDaemon(t *testing.T, mux *http.ServeMux) string {
	t.Helper()
	now := time.Now()
	reply := func(v any) http.HandlerFunc {
		return func(w http.ResponseWriter, r *http.Request) { json.NewEncoder(w).Encode(v) }
	}
	mux.HandleFunc("GET /v1/sandboxes/sb_1/fs/ls", reply([]api.FileInfo{
		{Name: pwn, Mode: "-rw-r--r--" + pwn, ModTime: now},
		{Name: "link" + pwn, Link: pwn, Mode: "Lrwxrwxrwx", ModTime: now},
	}))
	mux.HandleFunc("GET /v1/sandboxes/sb_1/fs/stat", reply(api.FileInfo{Name: pwn, Path: "/" + pwn, Link: pwn, Mode: pwn, ModTime: now}))
	mux.HandleFunc("GET /v1/sandboxes/sb_1/ports", reply([]api.Port{{Proto: "tcp", Address: "0.0.0.0", Port: 80, Pid: 7, Command: pwn}}))
	mux.HandleFunc("GET /v1/sandboxes/sb_1/execs", reply([]api.Exec{{ID: "ex_1", State: api.ExecRunning, Pid: 7, Cmd: []string{"sh", "-c", pwn}, StartedAt: now}}))
	mux.HandleFunc("GET /v1/sandboxes/sb_1", reply(api.Sandbox{ID: "sb_1", Name: "web", State: api.StateReady, Meta: map[string]string{pwn: pwn}, CreatedAt: now}))
	mux.HandleFunc("GET /v1/sandboxes", reply([]api.Sandbox{{ID: "sb_1", Name: pwn, Template: pwn, State: api.StateReady, CreatedAt: now}}))
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	return "tcp://" + srv.Listener.Addr().(*net.TCPAddr).String()
}

// TestHostileNames: fs ls, fs stat, ports, ps, info and ls print names
// with control characters quoted, one row per entry.
func TestHostileNames(t *testing.T) {
	host := hostileDaemon(t, http.NewServeMux())
	for _, tc := range []struct {
		args []string
		rows int // lines printed, header included; 0: not counted
	}{
		{[]string{"fs", "ls", "sb_1", "/"}, 3},
		{[]string{"fs", "stat", "sb_1", "/x"}, 0},
		{[]string{"ports", "sb_1"}, 2},
		{[]string{"ps", "sb_1"}, 2},
		{[]string{"info", "sb_1"}, 0},
		{[]string{"ls"}, 2},
	} {
		code, out, errOut := sbx(host, tc.args...)
		what := "sbx " + strings.Join(tc.args, " ")
		if code != 0 {
			t.Errorf("%s: exit %d: %s", what, code, errOut)
			continue
		}
		inert(t, what, out+errOut)
		if !strings.Contains(out, `\x1b]0;pwned\a`) && !strings.Contains(out, `\x1b]0;pwned\x07`) {
			t.Errorf("%s: the name is not shown quoted:\n%s", what, out)
		}
		if n := strings.Count(out, "\n"); tc.rows > 0 && n != tc.rows {
			t.Errorf("%s: %d lines, want %d (a name forged a row):\n%s", what, n, tc.rows, out)
		}
	}
}

// TestHostileCrash: the sandbox reports a crash with escapes in its signal
// name, program and backtrace, a build-id of a megabyte and a backtrace of
// megabytes. The CLI prints it quoted, bounded, and as the sandbox's word;
// the bundle is saved.
func TestHostileCrash(t *testing.T) {
	mux := http.NewServeMux()
	var mu sync.Mutex
	ran := false
	now := time.Now().UTC()
	mux.HandleFunc("POST /v1/sandboxes/sb_1/exec", func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		ran = true
		mu.Unlock()
		code := 139
		for _, ev := range []api.ExecEvent{
			{Event: "started", Exec: &api.Exec{ID: "ex_1", State: api.ExecRunning, Pid: 7}},
			{Event: "exit", Exec: &api.Exec{ID: "ex_1", State: api.ExecExited, ExitCode: &code, Pid: 7}},
		} {
			b, _ := json.Marshal(ev)
			fmt.Fprintf(w, "event: %s\ndata: %s\n\n", ev.Event, b)
		}
	})
	crash := map[string]any{"signal": "SIGSEGV", "exe": "/work/prog" + pwn, "pgid": 7, "ancestors": []int{7, 1}}
	mux.HandleFunc("GET /v1/sandboxes/sb_1/files", func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		defer mu.Unlock()
		switch r.URL.Query().Get("path") {
		case "/run/sbx/crashes/count":
			if ran {
				fmt.Fprint(w, "1\n")
			} else {
				fmt.Fprint(w, "0\n")
			}
		case "/run/sbx/freeze/record.json":
			json.NewEncoder(w).Encode(map[string]any{"state": "frozen", "name": "crash-1", "pid": 9, "failedAt": now, "crash": crash})
		default:
			http.Error(w, `{"error":{"code":"not_found","message":"no"}}`, http.StatusNotFound)
		}
	})
	mux.HandleFunc("GET /v1/sandboxes/sb_1/events", func(w http.ResponseWriter, r *http.Request) {
		ev := api.Event{Seq: 1, Type: "frozen", Time: now, Detail: map[string]any{"outcome": "ok", "name": "crash-1", "pid": 9, "failedAt": now, "crash": crash}}
		b, _ := json.Marshal(ev)
		fmt.Fprintf(w, "event: event\ndata: %s\n\n", b)
		w.(http.Flusher).Flush()
		<-r.Context().Done()
	})
	// the copy the bundle is made in
	mux.HandleFunc("POST /v1/sandboxes", func(w http.ResponseWriter, r *http.Request) {
		json.NewEncoder(w).Encode(api.Sandbox{ID: "sb_2", State: api.StateReady})
	})
	mux.HandleFunc("DELETE /v1/sandboxes/sb_2", func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusNoContent) })
	mux.HandleFunc("PUT /v1/sandboxes/sb_2/files", func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusNoContent) })
	mux.HandleFunc("POST /v1/sandboxes/sb_2/exec", func(w http.ResponseWriter, r *http.Request) {
		code := 0
		ev := api.ExecEvent{Event: "exit", Exec: &api.Exec{ID: "ex_2", State: api.ExecExited, ExitCode: &code}}
		b, _ := json.Marshal(ev)
		fmt.Fprintf(w, "event: exit\ndata: %s\n\n", b)
	})
	mux.HandleFunc("GET /v1/sandboxes/sb_2/files", func(w http.ResponseWriter, r *http.Request) {
		if !strings.HasSuffix(r.URL.Query().Get("path"), "/bundle") || r.URL.Query().Get("tar") == "" {
			http.Error(w, `{"error":{"code":"not_found","message":"no"}}`, http.StatusNotFound)
			return
		}
		tw := tar.NewWriter(w)
		add := func(name string, body []byte) {
			tw.WriteHeader(&tar.Header{Name: name, Typeflag: tar.TypeReg, Mode: 0o644, Size: int64(len(body))})
			tw.Write(body)
		}
		tw.WriteHeader(&tar.Header{Name: "bundle/", Typeflag: tar.TypeDir, Mode: 0o755})
		add("bundle/backtrace.txt", []byte("#0 main () at fix.c:1\n"+pwn+"\n"+strings.Repeat("#1 ?? ()\n", 300000)))
		add("bundle/buildids.txt", []byte(strings.Repeat("ab", 1<<19)+" /work/prog\n"))
		add("bundle/files/work/prog", []byte("\x7fELF not really"))
		tw.Close()
	})
	host := hostileDaemon(t, mux)
	dir := t.TempDir()
	code, out, errOut := sbx(host, "exec", "--on-crash", "--crash-dir", dir, "sb_1", "--", "./prog")
	if code != 139 {
		t.Fatalf("exit %d, want 139: %.2000s", code, errOut)
	}
	inert(t, "exec --on-crash", out+errOut)
	if !strings.Contains(errOut, "as the sandbox reports it") {
		t.Errorf("the verdict is not shown as the sandbox's word:\n%.500s", errOut)
	}
	if len(errOut) > 2<<20 {
		t.Errorf("printed %d bytes of a hostile backtrace", len(errOut))
	}
	if _, err := os.Stat(filepath.Join(dir, "crash.tar")); err != nil {
		t.Errorf("no bundle: %v", err)
	}

	// --json: one line of the crash, with its capture and its bundle
	dir = t.TempDir()
	code, out, errOut = sbx(host, "--json", "exec", "--on-crash", "--crash-dir", dir, "sb_1", "--", "./prog")
	if code != 139 {
		t.Fatalf("--json: exit %d, want 139: %.2000s", code, errOut)
	}
	var crashLine struct {
		Event  string       `json:"event"`
		Crash  client.Crash `json:"crash"`
		Bundle struct {
			Tar string `json:"tar"`
		} `json:"bundle"`
	}
	for _, l := range strings.Split(out, "\n") {
		if strings.Contains(l, `"event":"crash"`) {
			if err := json.Unmarshal([]byte(l), &crashLine); err != nil {
				t.Fatal(err)
			}
		}
	}
	if crashLine.Crash.Snapshot != "crash-1" || crashLine.Bundle.Tar != filepath.Join(dir, "crash.tar") {
		t.Errorf("--json crash line %+v; want crash-1 and its bundle in %s\n%s", crashLine, dir, out)
	}
}

// TestHostileHuntSummary: the summary of a hunt whose sandbox wrote escapes
// in its seed, signal and backtrace prints them quoted.
func TestHostileHuntSummary(t *testing.T) {
	var out bytes.Buffer
	e := &env{stdout: &out, stderr: &out}
	s := &flaky.HuntSummary{Failed: true, Run: 3, Seed: pwn, Sandbox: "sb_1", Name: "hunt-1", FailedAt: time.Now(),
		Crash:    &flaky.Crash{SignalName: pwn, Tar: "crash.tar", Backtrace: pwn, Truncated: "3 entries left out"},
		Commands: []string{"sbx resume hunt-1", pwn}}
	if err := printHunt(e, s); err != nil {
		t.Fatal(err)
	}
	inert(t, "the hunt summary", out.String())
	if !strings.Contains(out.String(), "as the sandbox reports it") || !strings.Contains(out.String(), "cut short") {
		t.Errorf("summary:\n%s", out.String())
	}
}

// TestSafe: what safe and safeText keep and what they quote.
func TestSafe(t *testing.T) {
	for in, want := range map[string]string{
		"plain name.txt":       "plain name.txt",
		"café ☕":               "café ☕",
		"a\x1b[2Jb":            `a\x1b[2Jb`,
		"t\tn\nr\r":            `t\tn\nr\r`,
		"bidi\u202eevil":       `bidi\u202eevil`,
		"c1\u009b":             `c1\u009b`,
		"bad\xffutf8":          `bad\xffutf8`,
		"del\x7f":              `del\x7f`,
		"bell\a":               `bell\a`,
		"zero-width\u200bjoin": "zero-width\u200bjoin",
	} {
		if got := safe(in); got != want {
			t.Errorf("safe(%q) = %q, want %q", in, got, want)
		}
	}
	if got := safeText("line one\n\tline two\x1b]0;x\x07"); got != "line one\n\tline two\\x1b]0;x\\a" {
		t.Errorf("safeText = %q", got)
	}
}
