package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"sbx.dev/sbx/api"
	"sbx.dev/sbx/internal/flaky"
)

// sbx runs the CLI against host and returns its exit code, stdout and stderr.
func sbx(host string, args ...string) (int, string, string) {
	var stdout, stderr bytes.Buffer
	code := run(append([]string{"--host", host}, args...), strings.NewReader(""), &stdout, &stderr)
	return code, stdout.String(), stderr.String()
}

// TestRemoteCommandOwnsItsFlags: after the sandbox id, what is not one of
// exec's own flags starts the command, and everything from there is the
// command's, as docker users and sbx's own scripts write it.
func TestRemoteCommandOwnsItsFlags(t *testing.T) {
	t.Setenv("SBX_TEST_FROM_HERE", "a b")
	f := newFake(t)
	def := api.Duration(defaultExecTimeout)
	tests := []struct {
		name string
		args []string
		want api.ExecRequest
	}{
		{"flags of the command", []string{"exec", "sb_1", "ls", "-la"}, api.ExecRequest{Cmd: []string{"ls", "-la"}, Timeout: def}},
		{"sbx's flag name after the command", []string{"exec", "sb_1", "ls", "--timeout", "0"}, api.ExecRequest{Cmd: []string{"ls", "--timeout", "0"}, Timeout: def}},
		{"flag before the id", []string{"exec", "--timeout", "5s", "sb_1", "ls"}, api.ExecRequest{Cmd: []string{"ls"}, Timeout: api.Duration(5 * time.Second)}},
		{"flag after the id, then --", []string{"exec", "sb_1", "--timeout", "5", "--", "ls"}, api.ExecRequest{Cmd: []string{"ls"}, Timeout: api.Duration(5 * time.Second)}},
		{"flag after the id, no --", []string{"exec", "sb_1", "--timeout", "300", "ls", "-l"}, api.ExecRequest{Cmd: []string{"ls", "-l"}, Timeout: api.Duration(5 * time.Minute)}},
		{"-- then sh -c", []string{"exec", "sb_1", "--", "sh", "-c", "echo \"$1\" | wc -c", "x y"}, api.ExecRequest{Cmd: []string{"sh", "-c", "echo \"$1\" | wc -c", "x y"}, Timeout: def}},
		{"-- before the id", []string{"exec", "--", "sb_1", "ls"}, api.ExecRequest{Cmd: []string{"ls"}, Timeout: def}},
		{"a command that starts with dashes", []string{"exec", "sb_1", "--", "--weird", "-x"}, api.ExecRequest{Cmd: []string{"--weird", "-x"}, Timeout: def}},
		{"the command's own --", []string{"exec", "sb_1", "grep", "--", "-v", "f"}, api.ExecRequest{Cmd: []string{"grep", "--", "-v", "f"}, Timeout: def}},
		{"docker short flags", []string{"exec", "-e", "A=1", "-w", "/srv", "-u", "bob", "sb_1", "env"}, api.ExecRequest{Cmd: []string{"env"}, Env: []string{"A=1"}, Cwd: "/srv", User: "bob", Timeout: def}},
		{"-e NAME takes the value from here", []string{"exec", "-e", "SBX_TEST_FROM_HERE", "sb_1", "env"}, api.ExecRequest{Cmd: []string{"env"}, Env: []string{"SBX_TEST_FROM_HERE=a b"}, Timeout: def}},
		{"long flags after the id", []string{"exec", "sb_1", "--env", "A=1,2", "--env=B=x y", "--cwd=/tmp", "--user", "1000:1000", "id"},
			api.ExecRequest{Cmd: []string{"id"}, Env: []string{"A=1,2", "B=x y"}, Cwd: "/tmp", User: "1000:1000", Timeout: def}},
		{"--timeout 0 is no limit", []string{"exec", "--timeout", "0", "sb_1", "true"}, api.ExecRequest{Cmd: []string{"true"}}}, // no timeout
		{"detached: no default timeout", []string{"exec", "-d", "sb_1", "sleep", "9"}, api.ExecRequest{Cmd: []string{"sleep", "9"}, Detach: true}},
		{"one string of shell", []string{"exec", "sb_1", "ls | wc -l"}, api.ExecRequest{Cmd: []string{"/bin/sh", "-c", "ls | wc -l"}, Timeout: def}},
		{"--json after the id is sbx's", []string{"exec", "sb_1", "--json", "echo", "0"}, api.ExecRequest{Cmd: []string{"echo", "0"}, Timeout: def}},
		{"--json after the command is the command's", []string{"exec", "sb_1", "echo", "--json", "0"}, api.ExecRequest{Cmd: []string{"echo", "--json", "0"}, Timeout: def}},
		{"--help after the command is the command's", []string{"exec", "sb_1", "echo", "--help", "0"}, api.ExecRequest{Cmd: []string{"echo", "--help", "0"}, Timeout: def}},
		{"quoting kept", []string{"exec", "sb_1", "printf", "%s\n", "a 'b' \"c\"", "$HOME"}, api.ExecRequest{Cmd: []string{"printf", "%s\n", "a 'b' \"c\"", "$HOME"}, Timeout: def}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			code, stdout, stderr := sbx(f.host, tc.args...)
			if code != 0 {
				t.Fatalf("exit %d: %s", code, stderr)
			}
			if diff := cmp.Diff(tc.want, f.lastExec(t)); diff != "" {
				t.Errorf("exec request (-want +got):\n%s", diff)
			}
			if strings.Contains(tc.name, "--json after the id") && !strings.HasPrefix(stdout, `{"event":`) {
				t.Errorf("stdout %q: want JSON lines", stdout)
			}
		})
	}
}

// TestUsageErrors: every mistake in the command line exits 2, says what is
// wrong, and where it can what was meant.
func TestUsageErrors(t *testing.T) {
	f := newFake(t)
	tests := []struct {
		name string
		args []string
		want string // in stderr
	}{
		{"no command", nil, "no command given"},
		{"unknown command", []string{"frob"}, `unknown command "frob"`},
		{"typo of a command", []string{"exce", "sb_1", "ls"}, `did you mean "exec"?`},
		{"typo of list", []string{"lst"}, `"list"`},
		{"unknown flag", []string{"exec", "--nope", "sb_1", "ls"}, "unknown flag: --nope"},
		{"typo of a flag", []string{"exec", "--tmeout", "5s", "sb_1", "ls"}, "did you mean --timeout?"},
		{"typo of a flag after the id", []string{"exec", "sb_1", "--detatch", "ls"}, "did you mean --detach?"},
		{"one dash long flag", []string{"info", "-json", "sb_1"}, "did you mean --json?"},
		{"docker's --rm", []string{"new", "--rm"}, "sbx has no --rm"},
		{"docker's -v", []string{"new", "-v", "/src:/src"}, "sbx scp"},
		{"docker's -p", []string{"new", "-p", "8080:80"}, "sbx preview"},
		{"exec without a command", []string{"exec", "sb_1"}, "exec takes a sandbox id and a command"},
		{"exec without anything", []string{"exec"}, "exec takes a sandbox id and a command"},
		{"exec -- without a command", []string{"exec", "sb_1", "--"}, "exec takes a sandbox id and a command"},
		{"exec -i without -t", []string{"exec", "-i", "sb_1", "cat"}, "an exec has no stdin"},
		{"exec -it with --detach", []string{"exec", "-it", "-d", "sb_1", "sh"}, "-t runs a terminal"},
		{"exec -t with --timeout", []string{"exec", "-t", "--timeout", "5", "sb_1", "sh"}, "no --timeout"},
		{"bad env", []string{"exec", "-e", "=x", "sb_1", "ls"}, `--env "=x": want K=V`},
		{"env not set here", []string{"exec", "-e", "SBX_TEST_SURELY_UNSET", "sb_1", "ls"}, "SBX_TEST_SURELY_UNSET is not set here"},
		{"docker run", []string{"run", "-it", "base"}, `unknown command "run" (did you mean one of "exec", "hunt", "new", "prune"?)`},
		{"docker cp", []string{"cp", "a", "sb_1:/b"}, `"scp"?)`},
		{"docker ps -a", []string{"ps", "-a"}, "`sbx list` lists every sandbox"},
		{"ps without an id", []string{"ps"}, "`sbx list` lists the sandboxes"},
		{"bad duration", []string{"exec", "--timeout", "soon", "sb_1", "ls"}, `"soon" is not a duration`},
		{"negative duration", []string{"exec", "--timeout", "-5s", "sb_1", "ls"}, "is negative"},
		{"bare negative seconds", []string{"exec", "--timeout", "-5", "sb_1", "ls"}, "not a duration"},
		{"missing flag value", []string{"exec", "sb_1", "--timeout"}, "flag needs an argument: --timeout"},
		{"ttl not a duration", []string{"ttl", "sb_1", "forever"}, `ttl: "forever" is not a duration`},
		{"new with an argument", []string{"new", "base"}, "new takes no arguments"},
		{"new template and from", []string{"new", "--template", "base", "--from", "s"}, "give --template or --from, not both"},
		{"info two ids", []string{"info", "a", "b"}, "info takes one sandbox id"},
		{"delete nothing", []string{"delete"}, "at least one sandbox id (or --all)"},
		{"delete ids and --all", []string{"delete", "--all", "sb_1"}, "ids or --all, not both"},
		{"help of nothing", []string{"help", "nosuch"}, `unknown help topic "nosuch"`},
		{"help of a typo", []string{"help", "exce"}, `did you mean "exec"?`},
		{"help of a subcommand typo", []string{"help", "snapshot", "lss"}, `unknown snapshot command "lss"`},
		{"template without a command", []string{"template"}, "template takes one of: build, import, ls, rm"},
		{"template typo", []string{"template", "bild", "base"}, `did you mean "build"?`},
		{"fs typo", []string{"fs", "sta", "sb_1", "/"}, `did you mean "stat"?`},
		{"completion of an unknown shell", []string{"completion", "tcsh"}, "tcsh"},
		{"shell with --json", []string{"--json", "shell", "sb_1"}, "prints no JSON"},
		{"exec -t with --json", []string{"--json", "exec", "-it", "sb_1", "sh"}, "prints no JSON"},
		{"logs bad tail", []string{"logs", "sb_1", "--tail", "-3"}, "--tail -3"},
		{"fork count 0", []string{"fork", "sb_1", "--count", "0"}, "--count 0"},
		{"flake-rate no runs", []string{"flake-rate", "sb_1", "--", "./t"}, "-n 0: want at least 1 run"},
		{"flake-rate no command", []string{"flake-rate", "-n", "3", "sb_1"}, "a test command"},
		{"flake-rate keep-ttl alone", []string{"flake-rate", "-n", "3", "--keep-ttl", "1h", "sb_1", "./t"}, "--keep-ttl goes with --keep-failures"},
		// the seed after the command is the command's: sbx got none
		{"replay seed after the command", []string{"replay", "snap", "-n", "2", "./t", "--seed", "9"}, "replay needs --seed S"},
		{"hunt runs 0", []string{"hunt", "--runs", "0", "./t"}, "--runs 0"},
		{"hunt template and from", []string{"hunt", "--template", "a", "--from", "b", "./t"}, "give --template or --from"},
		{"hunt attach with a command", []string{"hunt", "--attach", "h", "./t"}, "hunt --attach takes only a name"},
		{"hunt keep-ttl without freeze", []string{"hunt", "--keep-ttl", "1h", "./t"}, "--keep-ttl goes with --freeze"},
		{"hunt keep-ttl bad", []string{"hunt", "--freeze", "--keep-ttl", "soon", "./t"}, "keep-ttl"},
		{"hunt keep-ttl negative", []string{"hunt", "--freeze", "--keep-ttl", "-5m", "./t"}, "keep-ttl"},
		{"hunt attach with keep-ttl", []string{"hunt", "--attach", "h", "--keep-ttl", "1h"}, "hunt --attach takes only a name"},
		{"preview bad port", []string{"preview", "sb_1", "http"}, `port "http"`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			code, stdout, stderr := sbx(f.host, tc.args...)
			if code != 2 {
				t.Errorf("exit %d, want 2 (stdout %q, stderr %q)", code, stdout, stderr)
			}
			if !strings.Contains(stderr, tc.want) {
				t.Errorf("stderr %q does not contain %q", stderr, tc.want)
			}
			if (len(tc.args) == 0 || tc.args[0] != "--json") && !strings.Contains(stderr, "usage: sbx") {
				t.Errorf("stderr %q does not show the usage", stderr)
			}
		})
	}
	t.Run("json", func(t *testing.T) {
		code, _, stderr := sbx(f.host, "--json", "exec", "--tmeout", "5", "sb_1", "ls")
		var body api.ErrorBody
		if err := json.Unmarshal([]byte(stderr), &body); code != 2 || err != nil || body.Error.Code != "invalid" || !strings.Contains(body.Error.Message, "--timeout") {
			t.Errorf("exit %d, stderr %q (%v): want 2 and one JSON error of code invalid", code, stderr, err)
		}
	})
}

// TestFlagsAfterTheCommandAreNotSbxs: where the command's flags share a
// name with sbx's, sbx does not take them, for every verb that runs one.
func TestFlagsAfterTheCommandAreNotSbxs(t *testing.T) {
	// nothing listens here: a command line sbx accepts fails to connect (1)
	host := "tcp://127.0.0.1:1"
	tests := []struct {
		name string
		args []string
		code int
		want string
	}{
		{"flake-rate -n after the command", []string{"flake-rate", "sb_1", "./t", "-n", "5"}, 2, "-n 0"},
		{"flake-rate -n before it", []string{"flake-rate", "sb_1", "-n", "5", "./t", "-n", "x"}, 1, "cannot reach sbxd"},
		{"flake-rate --from", []string{"flake-rate", "--from", "snap", "-n", "5", "--", "./t"}, 1, "cannot reach sbxd"},
		{"replay --seed before the command", []string{"replay", "snap", "--seed", "9", "./t", "--seed", "x"}, 1, "cannot reach sbxd"},
		{"hunt --runs after the command", []string{"hunt", "--from", "s", "./t", "--runs", "0"}, 1, "cannot reach sbxd"},
		{"shell -u after the command", []string{"shell", "sb_1", "id", "-u"}, 1, "cannot reach sbxd"},
		{"shell -u before it", []string{"shell", "sb_1", "-u", "x"}, 1, "cannot reach sbxd"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			code, _, stderr := sbx(host, tc.args...)
			if code != tc.code || !strings.Contains(stderr, tc.want) {
				t.Errorf("exit %d, stderr %q; want %d and %q", code, stderr, tc.code, tc.want)
			}
		})
	}
}

func TestHelp(t *testing.T) {
	f := newFake(t)
	tests := []struct {
		name string
		args []string
		want []string // in stdout
	}{
		{"sbx help", []string{"help"}, []string{"Sandboxes:", "Flaky tests:", "exec", "completion"}},
		{"sbx --help", []string{"--help"}, []string{"Sandboxes:"}},
		{"help of a verb", []string{"help", "exec"}, []string{"sbx exec [flags] ID [--] CMD [ARGS...]", "--timeout duration", "-u, --user string", "--timeout 0: no limit"}},
		{"a verb's --help", []string{"exec", "--help"}, []string{"--timeout duration"}},
		{"--help after the id", []string{"exec", "sb_1", "--help"}, []string{"--timeout duration"}},
		{"-h", []string{"fork", "-h"}, []string{"--count int", "(default 1)"}},
		{"defaults", []string{"help", "flake-rate"}, []string{"--parallel int", "(default 4)", "--seed-env string", `(default "SEED")`}},
		{"version", []string{"--version"}, []string{"sbx version dev"}},
		{"an alias", []string{"help", "rm"}, []string{"sbx delete [flags] ID... | --all", "--all"}},
		{"a subcommand", []string{"help", "snapshot", "ls"}, []string{"sbx snapshot ls [flags]"}},
		{"a noun", []string{"help", "template"}, []string{"build", "import"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			code, stdout, stderr := sbx(f.host, tc.args...)
			if code != 0 {
				t.Fatalf("exit %d: %s", code, stderr)
			}
			for _, w := range tc.want {
				if !strings.Contains(stdout, w) {
					t.Errorf("help does not contain %q:\n%s", w, stdout)
				}
			}
		})
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.execs) != 0 {
		t.Errorf("--help ran %d execs, want none", len(f.execs))
	}
}

func TestCompletion(t *testing.T) {
	f := newFake(t)
	for shell, want := range map[string]string{"bash": "bash completion", "zsh": "#compdef sbx", "fish": "complete -c sbx"} {
		t.Run(shell, func(t *testing.T) {
			code, stdout, stderr := sbx(f.host, "completion", shell)
			if code != 0 || !strings.Contains(stdout, want) {
				t.Errorf("exit %d, stderr %q; stdout does not contain %q", code, stderr, want)
			}
		})
	}
	t.Run("sandbox ids", func(t *testing.T) {
		code, stdout, _ := sbx(f.host, "__complete", "exec", "")
		if code != 0 || !strings.Contains(stdout, "sb_1\tready") || !strings.Contains(stdout, "web\tready") {
			t.Errorf("exit %d, got %q: want the sandboxes", code, stdout)
		}
	})
	t.Run("commands", func(t *testing.T) {
		_, stdout, _ := sbx(f.host, "__complete", "fla")
		if !strings.Contains(stdout, "flake-rate") {
			t.Errorf("got %q, want flake-rate", stdout)
		}
	})
}

func TestDefaultTimeoutMessage(t *testing.T) {
	f := newFake(t)
	code, _, stderr := sbx(f.host, "exec", "sb_1", "timeout")
	if code != 124 {
		t.Errorf("exit %d, want 124", code)
	}
	if !strings.Contains(stderr, "command timed out after 30s") || !strings.Contains(stderr, "--timeout 0") {
		t.Errorf("stderr %q: want the timeout and how to lift it (--timeout 0)", stderr)
	}
	// a timeout asked for needs no lesson
	code, _, stderr = sbx(f.host, "exec", "--timeout", "2s", "sb_1", "timeout")
	if code != 124 || strings.Contains(stderr, "--timeout 0") {
		t.Errorf("exit %d, stderr %q: want 124 without the hint", code, stderr)
	}
}

func TestBareSeconds(t *testing.T) {
	tests := []struct {
		in   string
		want time.Duration
		ok   bool
	}{
		{"3600", time.Hour, true},
		{"300", 5 * time.Minute, true},
		{"1.5", 1500 * time.Millisecond, true},
		{"0", 0, true},
		{"90s", 90 * time.Second, true},
		{"2h30m", 150 * time.Minute, true},
		{"-1", 0, false},
		{"-1s", 0, false},
		{"1e3", 0, false},
		{"soon", 0, false},
		{"", 0, false},
		{"99999999999999999999", 0, false},
	}
	for _, tc := range tests {
		got, err := parseDuration(tc.in)
		if (err == nil) != tc.ok || got != tc.want {
			t.Errorf("parseDuration(%q) = %v, %v; want %v ok=%v", tc.in, got, err, tc.want, tc.ok)
		}
	}
	// --keep-ttl: not given is the default, 0 is none
	for in, want := range map[string]time.Duration{"": 0, "0": flaky.KeepForever, "45": 45 * time.Second} {
		var f durationFlag
		if in != "" {
			f.Set(in)
		}
		if got := f.keep(); got != want {
			t.Errorf("--keep-ttl %q: %v, want %v", in, got, want)
		}
	}
	f := newFake(t)
	code, stdout, stderr := sbx(f.host, "--json", "ttl", "sb_1", "3600")
	if code != 0 || !strings.Contains(stdout, `"ttl": "1h0m0s"`) {
		t.Errorf("ttl 3600: exit %d, %s %s", code, stdout, stderr)
	}
}

// TestJSONShapes: each --json output is one object (or JSON lines), as
// DESIGN §3 says, and info wraps its sandbox as scripts read it.
func TestJSONShapes(t *testing.T) {
	f := newFake(t)
	tests := []struct {
		args []string
		key  string // the object's one key, "" for an object of fields
	}{
		{[]string{"info", "sb_1"}, "sandbox"},
		{[]string{"list"}, "sandboxes"},
		{[]string{"delete", "sb_1"}, "deleted"},
		{[]string{"new"}, ""},
		{[]string{"exec", "-d", "sb_1", "x"}, ""},
		{[]string{"scp", "sb_1:/file", filepath.Join(t.TempDir(), "f")}, ""},
	}
	for _, tc := range tests {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			code, stdout, stderr := sbx(f.host, append([]string{"--json"}, tc.args...)...)
			if code != 0 {
				t.Fatalf("exit %d: %s", code, stderr)
			}
			var obj map[string]json.RawMessage
			if err := json.Unmarshal([]byte(stdout), &obj); err != nil {
				t.Fatalf("stdout is not one JSON object: %v\n%s", err, stdout)
			}
			if tc.key != "" && (len(obj) != 1 || obj[tc.key] == nil) {
				t.Errorf("got keys %v, want {%q: ...}", keys(obj), tc.key)
			}
		})
	}
	t.Run("info state", func(t *testing.T) {
		_, stdout, _ := sbx(f.host, "--json", "info", "sb_1")
		var got struct{ Sandbox api.Sandbox }
		json.Unmarshal([]byte(stdout), &got)
		if got.Sandbox.State != "ready" || got.Sandbox.ID != "sb_1" {
			t.Errorf("got %+v from %s", got, stdout)
		}
	})
	t.Run("exec lines", func(t *testing.T) {
		_, stdout, _ := sbx(f.host, "--json", "exec", "sb_1", "echo", "3")
		for _, line := range strings.Split(strings.TrimSpace(stdout), "\n") {
			var ev api.ExecEvent
			if err := json.Unmarshal([]byte(line), &ev); err != nil || ev.Event == "" {
				t.Errorf("line %q is not an event: %v", line, err)
			}
		}
	})
}

func keys(m map[string]json.RawMessage) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}

func TestScpHome(t *testing.T) {
	f := newFake(t)
	target := filepath.Join(t.TempDir(), "notes.txt")
	if code, _, stderr := sbx(f.host, "scp", "sb_1:~/notes.txt", target); code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	if b, _ := os.ReadFile(target); string(b) != "notes" {
		t.Errorf("got %q", b)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.stats) == 0 || f.stats[0] != "~/notes.txt" {
		t.Errorf("stat asked for %q, want ~/notes.txt passed as it is", f.stats)
	}
}

// TestDeleteParallel: many sandboxes are deleted at once, not one by one,
// and each is reported.
func TestDeleteParallel(t *testing.T) {
	const n, each = 12, 150 * time.Millisecond
	var mu sync.Mutex
	running, most := 0, 0
	mux := http.NewServeMux()
	ids := make([]api.Sandbox, n)
	for i := range ids {
		ids[i] = api.Sandbox{ID: fmt.Sprintf("sb_%d", i)}
	}
	mux.HandleFunc("GET /v1/sandboxes", func(w http.ResponseWriter, r *http.Request) { json.NewEncoder(w).Encode(ids) })
	mux.HandleFunc("DELETE /v1/sandboxes/{id}", func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		running++
		most = max(most, running)
		mu.Unlock()
		time.Sleep(each) // a delete takes this long: the overlap counted is the thing tested
		mu.Lock()
		running--
		mu.Unlock()
		if r.PathValue("id") == "sb_3" {
			w.WriteHeader(http.StatusNotFound)
			json.NewEncoder(w).Encode(api.ErrorBody{Error: &api.ErrorDetail{Code: "not_found", Message: "sandbox sb_3 not found"}})
			return
		}
		json.NewEncoder(w).Encode(api.DeleteResult{ID: r.PathValue("id")})
	})
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	host := "tcp://" + srv.Listener.Addr().(*net.TCPAddr).String()
	for _, args := range [][]string{{"delete", "--all", "--yes"}, append([]string{"rm", "-f"}, idsOf(ids)...)} {
		t.Run(args[0], func(t *testing.T) {
			most = 0
			start := time.Now()
			code, stdout, stderr := sbx(host, args...)
			el := time.Since(start)
			if code != 1 || !strings.Contains(stderr, "sb_3 not found") {
				t.Errorf("exit %d, stderr %q: want 1 naming the one that failed", code, stderr)
			}
			if got := len(strings.Fields(stdout)); got != n-1 {
				t.Errorf("reported %d deleted, want %d: %q", got, n-1, stdout)
			}
			if most < 2 || el > n*each/2 {
				t.Errorf("%d at once, %s for %d: want them deleted in parallel", most, el, n)
			}
			if most > deleteParallel {
				t.Errorf("%d at once, want at most %d", most, deleteParallel)
			}
		})
	}
}

func idsOf(sbs []api.Sandbox) []string {
	var out []string
	for _, sb := range sbs {
		out = append(out, sb.ID)
	}
	return out
}

func TestParseProm(t *testing.T) {
	text := "# HELP sbx_sandboxes Sandboxes by state.\n# TYPE sbx_sandboxes gauge\n" +
		"sbx_sandboxes{state=\"ready\"} 3\n" +
		"sbx_api_requests_total{route=\"GET /v1/x\",status=\"200\",note=\"a \\\"b\\\"\"} 12\n" +
		"sbx_up 1\n" +
		"sbx_odd NaN\n" +
		"garbage line\n"
	got := parseProm(text)
	want := []promSample{
		{Name: "sbx_sandboxes", Labels: map[string]string{"state": "ready"}, Value: 3.0},
		{Name: "sbx_api_requests_total", Labels: map[string]string{"route": "GET /v1/x", "status": "200", "note": `a "b"`}, Value: 12.0},
		{Name: "sbx_up", Value: 1.0},
		{Name: "sbx_odd", Value: "NaN"},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("(-want +got):\n%s", diff)
	}
}

// TestSignals drives sbx with real signals: Ctrl-C on a follow exits 130
// and says nothing; SIGTERM with --json prints nothing that reads as a
// failure and exits 143.
func TestSignals(t *testing.T) {
	if os.Getenv("SBX_TEST_MAIN") != "" {
		t.Skip("the child")
	}
	f := newFake(t)
	tests := []struct {
		name string
		args []string
		sig  syscall.Signal
		code int
		// what stderr may say
		stderrOK func(string) bool
	}{
		{"Ctrl-C on a foreground exec", []string{"exec", "sb_1", "sleep"}, syscall.SIGINT, 130,
			func(s string) bool {
				return strings.Contains(s, "ex_9 goes on in the sandbox") && !strings.Contains(s, "context canceled")
			}},
		{"SIGTERM with --json", []string{"--json", "exec", "sb_1", "sleep"}, syscall.SIGTERM, 143,
			func(s string) bool { return s == "" }},
		{"Ctrl-C with --json", []string{"--json", "exec", "sb_1", "sleep"}, syscall.SIGINT, 130,
			func(s string) bool { return s == "" }},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cmd := exec.Command(os.Args[0], "-test.run=^TestMainChild$")
			cmd.Env = append(os.Environ(), "SBX_TEST_MAIN="+strings.Join(append([]string{"--host", f.host}, tc.args...), "\x1f"))
			var stdout, stderr bytes.Buffer
			cmd.Stdout, cmd.Stderr = &stdout, &stderr
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { cmd.Process.Kill() })
			// wait until the exec has started
			deadline := time.Now().Add(10 * time.Second)
			for time.Now().Before(deadline) && f.nExecs() == 0 {
				time.Sleep(10 * time.Millisecond)
			}
			// and its "started" event has reached the CLI: nothing the CLI
			// does shows when it has read it, so a margin it is
			time.Sleep(100 * time.Millisecond)
			f.mu.Lock()
			f.execs = nil
			f.mu.Unlock()
			cmd.Process.Signal(tc.sig)
			done := make(chan error, 1)
			go func() { done <- cmd.Wait() }()
			select {
			case <-done:
			case <-time.After(10 * time.Second):
				t.Fatal("sbx did not exit after the signal")
			}
			if got := cmd.ProcessState.ExitCode(); got != tc.code {
				t.Errorf("exit %d, want %d (stderr %q)", got, tc.code, stderr.String())
			}
			if !tc.stderrOK(stderr.String()) {
				t.Errorf("stderr %q", stderr.String())
			}
			if strings.Contains(stdout.String(), `"error"`) {
				t.Errorf("stdout %q reads as a failure", stdout.String())
			}
		})
	}
}

// TestMainChild is sbx's main when SBX_TEST_MAIN holds its arguments.
func TestMainChild(t *testing.T) {
	args := os.Getenv("SBX_TEST_MAIN")
	if args == "" {
		t.Skip("run by TestSignals")
	}
	os.Args = append([]string{"sbx"}, strings.Split(args, "\x1f")...)
	main()
}

func (f *fake) nExecs() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.execs)
}
