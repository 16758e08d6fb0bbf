package e2e

import (
	"bytes"
	"encoding/json"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"sbx.dev/sbx/api"
)

// The command line as people type it, and as the scripts of sbx's users
// (and docker's) have it: through the real sbx binary, on a real sbxd.

// TestCLIRemoteCommandOwnsItsFlags: after the sandbox id, the command owns
// every word from its first one, flags that sbx also has included.
func TestCLIRemoteCommandOwnsItsFlags(t *testing.T) {
	d := shared
	id := d.newSandbox(t, "--template", "tiny")
	tests := []struct {
		name   string
		args   []string
		code   int
		stdout string
	}{
		{"the command's flags", []string{"exec", id, "ls", "-d", "/tmp"}, 0, "/tmp\n"},
		{"sbx's flag names go to the command", []string{"exec", id, "echo", "--timeout", "5s", "--json", "-d"}, 0, "--timeout 5s --json -d\n"},
		{"-- and sh -c", []string{"exec", id, "--", "sh", "-c", `printf '%s|' "$@"`, "_", "a b", `c"d`, "e'f", "$HOME"}, 0, `a b|c"d|e'f|$HOME|`},
		{"one string of shell", []string{"exec", id, `echo "$((6*7))" | tr 4 x`}, 0, "x2\n"},
		{"sbx's flags between the id and the command", []string{"exec", id, "-e", "A=1", "-w", "/tmp", "sh", "-c", "echo $A $(pwd)"}, 0, "1 /tmp\n"},
		{"the remote exit code", []string{"exec", id, "sh", "-c", "exit 7"}, 7, ""},
		{"a bare number of seconds", []string{"exec", "--timeout", "1", id, "sleep", "5"}, 124, ""},
		{"docker's -it, without a terminal", []string{"exec", "-it", id, "sh", "-c", "echo in-a-pty; exit 3"}, 3, "in-a-pty\r\n"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := d.sbx(t, tc.args...)
			if r.code != tc.code || r.stdout != tc.stdout {
				t.Errorf("exit %d stdout %q (stderr %q); want %d %q", r.code, r.stdout, r.stderr, tc.code, tc.stdout)
			}
		})
	}
}

// TestCLIJSONThroughJq: scripts pipe --json to jq, as the did.
func TestCLIJSONThroughJq(t *testing.T) {
	d := shared
	name := "jq-" + randHex(3)
	id := d.newSandbox(t, "--template", "tiny", "--name", name, "--ttl", "3600")
	jq := func(filter string, args ...string) string {
		t.Helper()
		cmd := exec.Command("bash", append([]string{"-c", `"$0" --json "$@" | jq -r '` + filter + `'`, filepath.Join(binDir, "sbx")}, args...)...)
		cmd.Env = append(os.Environ(), "SBX_HOST=unix://"+d.socket)
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("sbx --json %v | jq %s: %v\n%s", args, filter, err, out)
		}
		return strings.TrimSpace(string(out))
	}
	if got := jq(".sandbox.state", "info", name); got != "ready" {
		t.Errorf(".sandbox.state = %q, want ready", got)
	}
	if got := jq(".sandbox.ttl", "info", id); got != "1h0m0s" {
		t.Errorf("--ttl 3600: .sandbox.ttl = %q, want 1h0m0s", got)
	}
	if got := jq(`.sandboxes[] | select(.name == "`+name+`") | .id`, "list"); got != id {
		t.Errorf("list: got %q, want %s", got, id)
	}
	if got := jq(`select(.event == "exit") | .exec.exitCode`, "exec", id, "sh", "-c", "exit 5"); got != "5" {
		t.Errorf("exec exit code through jq: %q", got)
	}
	if got := jq(".execs | length", "ps", id); got == "0" || got == "" {
		t.Errorf("ps: %q execs", got)
	}
	if got := jq(".files[].name", "fs", "ls", id, "/etc"); !strings.Contains(got, "passwd") {
		t.Errorf("fs ls: %q", got)
	}
	if got := jq(".metrics | map(select(.name == \"sbx_sandboxes\")) | length", "metrics"); got == "0" {
		t.Errorf("metrics: no sbx_sandboxes samples")
	}
	if got := jq(".templates[].name", "template", "ls"); !strings.Contains(got, "tiny") {
		t.Errorf("template ls: %q", got)
	}
}

// TestCLIBareSeconds: durations as scripts write them, on the CLI and on
// the API.
func TestCLIBareSeconds(t *testing.T) {
	d := shared
	id := d.newSandbox(t, "--template", "tiny", "--ttl", "600")
	if sb := d.info(t, id); sb.TTL != api.Duration(10*time.Minute) {
		t.Errorf("--ttl 600: ttl %q", sb.TTL)
	}
	d.must(t, "ttl", id, "7200")
	if sb := d.info(t, id); sb.TTL != api.Duration(2*time.Hour) {
		t.Errorf("ttl 7200: ttl %q", sb.TTL)
	}
	// the API takes them too
	status, body := d.rawAPI(t, "POST", "/v1/sandboxes/"+id+"/ttl", map[string]any{"ttl": "90"}) // bare seconds, as a script sends them
	if status != 200 || !strings.Contains(string(body), `"ttl":"1m30s"`) {
		t.Errorf("API ttl \"90\": %d %s", status, body)
	}
	status, body = d.rawAPI(t, "POST", "/v1/sandboxes/"+id+"/exec", map[string]any{"cmd": []string{"sleep", "5"}, "timeout": "1", "detach": true})
	var x api.Exec
	if status != 201 || json.Unmarshal(body, &x) != nil {
		t.Fatalf("API exec timeout \"1\": %d %s", status, body)
	}
	res, err := d.client.Sandbox(id).Process(x.ID).Wait(t.Context())
	if err != nil || res.ExitCode != 124 || !res.TimedOut {
		t.Errorf("API exec timeout \"1\": %+v, %v", res, err)
	}
	if status, body := d.rawAPI(t, "POST", "/v1/sandboxes/"+id+"/ttl", map[string]any{"ttl": "-5"}); status != 400 || !strings.Contains(string(body), `ttl: \"-5\" is not a duration`) {
		t.Errorf("API ttl \"-5\": %d %s, want 400", status, body)
	}
}

// TestCLIDefaultExecTimeout: a foreground exec gets 30 s and says how to
// lift it; --timeout 0 lifts it.
func TestCLIDefaultExecTimeout(t *testing.T) {
	d := shared
	id := d.newSandbox(t, "--template", "tiny")
	var wg sync.WaitGroup
	var def, none result
	wg.Go(func() { def = d.sbx(t, "exec", id, "sleep", "45") })
	wg.Go(func() { none = d.sbx(t, "exec", "--timeout", "0", id, "sh", "-c", "sleep 32; echo done") })
	wg.Wait()
	if def.code != 124 || !strings.Contains(def.stderr, "timed out after 30s") || !strings.Contains(def.stderr, "--timeout 0") {
		t.Errorf("default: exit %d, stderr %q; want 124 and how to lift it", def.code, def.stderr)
	}
	if none.code != 0 || none.stdout != "done\n" {
		t.Errorf("--timeout 0: exit %d, stdout %q, stderr %q", none.code, none.stdout, none.stderr)
	}
}

// startSbx starts sbx in the background against d.
func startSbx(t *testing.T, d *daemon, args ...string) (*exec.Cmd, *bytes.Buffer, *bytes.Buffer) {
	t.Helper()
	cmd := exec.Command(filepath.Join(binDir, "sbx"), args...)
	cmd.Env = append(os.Environ(), "SBX_HOST=unix://"+d.socket)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	return cmd, &stdout, &stderr
}

// TestCLISignals: Ctrl-C on a follow or an attach exits 130 and says
// nothing; SIGTERM with --json prints nothing that looks like a failure.
func TestCLISignals(t *testing.T) {
	d := shared
	id := d.newSandbox(t, "--template", "tiny")
	x := strings.Fields(d.must(t, "exec", "-d", id, "sh", "-c", "while :; do echo tick; sleep 0.2; done"))[0]
	tests := []struct {
		name string
		args []string
		sig  syscall.Signal
		code int
	}{
		{"logs --follow, Ctrl-C", []string{"logs", id, "--follow"}, syscall.SIGINT, 130},
		{"logs of an exec, Ctrl-C", []string{"logs", id, "--exec", x, "-f"}, syscall.SIGINT, 130},
		{"events --follow, Ctrl-C", []string{"events", id, "--follow"}, syscall.SIGINT, 130},
		{"attach, Ctrl-C", []string{"attach", id, x}, syscall.SIGINT, 130},
		{"--json events --follow, SIGTERM", []string{"--json", "events", id, "--follow"}, syscall.SIGTERM, 143},
		{"--json logs --follow, SIGTERM", []string{"--json", "logs", id, "--exec", x, "--follow"}, syscall.SIGTERM, 143},
		{"--json attach, SIGTERM", []string{"--json", "attach", id, x}, syscall.SIGTERM, 143},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cmd, stdout, stderr := startSbx(t, d, tc.args...)
			time.Sleep(1500 * time.Millisecond) // following by now
			cmd.Process.Signal(tc.sig)
			done := make(chan error, 1)
			go func() { done <- cmd.Wait() }()
			select {
			case <-done:
			case <-time.After(15 * time.Second):
				t.Fatal("sbx did not end after the signal")
			}
			if got := cmd.ProcessState.ExitCode(); got != tc.code {
				t.Errorf("exit %d, want %d", got, tc.code)
			}
			if stderr.Len() != 0 {
				t.Errorf("stderr %q, want nothing", stderr.String())
			}
			if strings.Contains(stdout.String(), `"error"`) || strings.Contains(stdout.String(), "context canceled") {
				t.Errorf("stdout reads as a failure: %q", stdout.String())
			}
			if strings.HasPrefix(tc.args[0], "--json") {
				for _, line := range strings.Split(strings.TrimSpace(stdout.String()), "\n") {
					if line != "" && !json.Valid([]byte(line)) {
						t.Errorf("a line of --json output is not JSON: %q", line)
					}
				}
			}
		})
	}
}

// TestCLIHomePaths: ~ in a sandbox path is the user's home (root's in
// tiny), ~name another user's, both from the sandbox's /etc/passwd.
func TestCLIHomePaths(t *testing.T) {
	d := shared
	id := d.newSandbox(t, "--template", "tiny")
	d.must(t, "exec", id, "sh", "-c", "echo 'bob:x:1000:1000::/home/bob:/bin/sh' >> /etc/passwd && mkdir -p /home/bob")
	dir := t.TempDir()
	local := filepath.Join(dir, "notes.txt")
	os.WriteFile(local, []byte("remember\n"), 0o644)

	d.must(t, "scp", local, id+":~/notes.txt")
	if out := d.must(t, "exec", id, "cat", "/root/notes.txt"); out != "remember\n" {
		t.Errorf("scp to ~/: /root/notes.txt has %q", out)
	}
	d.must(t, "scp", local, id+":~")
	d.must(t, "scp", local, id+":~bob/")
	if out := d.must(t, "exec", id, "cat", "/home/bob/notes.txt"); out != "remember\n" {
		t.Errorf("scp to ~bob/: /home/bob/notes.txt has %q", out)
	}
	back := filepath.Join(dir, "back.txt")
	d.must(t, "scp", id+":~/notes.txt", back)
	if b, _ := os.ReadFile(back); string(b) != "remember\n" {
		t.Errorf("scp from ~/: got %q", b)
	}
	var fi api.FileInfo
	d.jsonOut(t, &fi, "fs", "stat", id, "~/notes.txt")
	if fi.Path != "/root/notes.txt" {
		t.Errorf("fs stat ~/notes.txt: path %q", fi.Path)
	}
	if out := d.must(t, "fs", "ls", id, "~bob"); !strings.Contains(out, "notes.txt") {
		t.Errorf("fs ls ~bob: %q", out)
	}
	r := d.sbx(t, "fs", "stat", id, "~ghost/x")
	if r.code != 1 || !strings.Contains(r.stderr, "~ghost/x") || !strings.Contains(r.stderr, "no such user") {
		t.Errorf("~ghost: exit %d, %q", r.code, r.stderr)
	}
	// the path is resolved inside: a home that climbs out is still the sandbox's
	r = d.sbx(t, "scp", id+":~/../etc/passwd", filepath.Join(dir, "passwd"))
	if b, _ := os.ReadFile(filepath.Join(dir, "passwd")); r.code != 0 || !strings.Contains(string(b), "bob:x:1000") {
		t.Errorf("~/../etc/passwd: exit %d %q, got %q", r.code, r.stderr, b)
	}
}

// TestCLIChecks: item 7's refusals, through the real binary.
func TestCLIChecks(t *testing.T) {
	d := shared
	id := d.newSandbox(t, "--template", "tiny")
	tests := []struct {
		name string
		args []string
		code int
		want string
	}{
		{"memory beyond the host", []string{"new", "--template", "tiny", "--memory", "100T"}, 1, "more than this host has ("},
		{"template with from", []string{"new", "--template", "tiny", "--from", "x"}, 2, "give --template or --from, not both"},
		{"fork count 0", []string{"fork", id, "--count", "0"}, 2, "--count 0"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := d.sbx(t, tc.args...)
			if r.code != tc.code || !strings.Contains(r.stderr, tc.want) {
				t.Errorf("exit %d, stderr %q; want %d and %q", r.code, r.stderr, tc.code, tc.want)
			}
		})
	}
	if n := len(d.list(t)); n == 0 {
		t.Fatal("no sandbox listed")
	}
	for _, sb := range d.list(t) {
		if sb.Parent == id {
			t.Errorf("fork --count 0 made %s", sb.ID)
		}
	}
}

// TestCLIRuntimeLogLines: the runtime stream is lines, one per runsc
// message, so --tail counts them.
func TestCLIRuntimeLogLines(t *testing.T) {
	// copiers of `runsc exec`: without the exec channel, whose copies
	// are init's goroutines (no runsc, nothing on its stderr)
	d := shimShared(t)
	id := d.newSandbox(t, "--template", "tiny")
	// a stop ends the copiers of running execs, and runsc says so on its
	// stderr, which goes to the runtime log (never the execs' output)
	for range 3 {
		d.must(t, "exec", "--detach", id, "sleep", "1000")
	}
	d.must(t, "stop", "--wait", id)
	d.must(t, "resume", id)
	out := d.must(t, "logs", id, "--stream", "runtime")
	lines := strings.Split(strings.TrimSuffix(out, "\n"), "\n")
	if len(lines) < 3 || !strings.HasSuffix(out, "\n") {
		t.Fatalf("runtime log: %d lines, want one per exec the stop cut off (3):\n%s", len(lines), out)
	}
	for _, l := range lines {
		if strings.HasPrefix(l, "{") && !json.Valid([]byte(l)) {
			t.Errorf("line %q is not one JSON object", l)
		}
	}
	tail := d.must(t, "logs", id, "--stream", "runtime", "--tail", "1")
	if strings.Count(tail, "\n") != 1 || tail != lines[len(lines)-1]+"\n" {
		t.Errorf("--tail 1: %q, want the last line %q", tail, lines[len(lines)-1])
	}
}

// TestCLIDeleteMany: many ids at once, and --all, on a daemon of its own.
func TestCLIDeleteMany(t *testing.T) {
	d, err := startDaemon(nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.stop(true) })
	var ids []string
	for range 6 {
		ids = append(ids, d.newSandbox(t, "--template", "tiny"))
	}
	r := d.sbx(t, append([]string{"rm", "-f"}, append(ids[:3], "sb_nosuchbox0")...)...)
	if r.code != 1 || !strings.Contains(r.stderr, "sb_nosuchbox0 not found") {
		t.Errorf("delete with one unknown: exit %d, %q", r.code, r.stderr)
	}
	for _, id := range ids[:3] {
		if !strings.Contains(r.stdout, id) {
			t.Errorf("delete did not report %s: %q", id, r.stdout)
		}
	}
	var res struct{ Deleted []api.DeleteResult }
	d.jsonOut(t, &res, "delete", "--all", "--yes")
	if len(res.Deleted) != 3 {
		t.Errorf("--all deleted %+v, want the 3 left", res.Deleted)
	}
	if left := d.list(t); len(left) != 0 {
		t.Errorf("after --all: %+v", left)
	}
}

// TestCLIDockerHabits: what a docker user types gets a clear answer.
func TestCLIDockerHabits(t *testing.T) {
	d := shared
	id := d.newSandbox(t, "--template", "tiny")
	tests := []struct {
		name string
		args []string
		code int
		want string // in stderr
	}{
		{"docker run", []string{"run", "--rm", "-it", "tiny", "sh"}, 2, `unknown command "run"`},
		{"--rm", []string{"new", "--rm", "--template", "tiny"}, 2, "sbx has no --rm"},
		{"-i without -t", []string{"exec", "-i", id, "cat"}, 2, "an exec has no stdin"},
		{"ps -a", []string{"ps", "-a"}, 2, "`sbx list` lists every sandbox"},
		{"cp", []string{"cp", "f", id + ":/tmp"}, 2, `"scp"`},
		{"inspect", []string{"inspect", id}, 2, `"info"`},
		{"a typo of a flag", []string{"exec", "--enviroment", "A=1", id, "true"}, 2, "unknown flag: --enviroment"},
		{"-e from here", []string{"exec", "-e", "SBX_E2E_HABIT", id, "sh", "-c", "test \"$SBX_E2E_HABIT\" = 'a b'"}, 0, ""},
		{"stop -t (docker's grace time) is no sbx flag", []string{"stop", "-t", "5", id}, 2, "unknown shorthand flag: 't'"},
	}
	t.Setenv("SBX_E2E_HABIT", "a b")
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := d.sbx(t, tc.args...)
			if r.code != tc.code || !strings.Contains(r.stderr, tc.want) {
				t.Errorf("exit %d, stderr %q; want %d and %q", r.code, r.stderr, tc.code, tc.want)
			}
		})
	}
	if sb := d.info(t, id); sb.State != api.StateReady {
		t.Errorf("after it all the sandbox is %s", sb.State)
	}
}

// TestCLIHelpAndCompletion: help from the flags, through the binary.
func TestCLIHelpAndCompletion(t *testing.T) {
	d := shared
	r := d.sbx(t, "help", "exec")
	if r.code != 0 || !strings.Contains(r.stdout, "--timeout duration") || !strings.Contains(r.stdout, "--user string") {
		t.Errorf("help exec: exit %d\n%s", r.code, r.stdout)
	}
	if r := d.sbx(t, "help", "nosuch"); r.code != 2 {
		t.Errorf("help nosuch: exit %d", r.code)
	}
	r = d.sbx(t, "completion", "bash")
	if r.code != 0 || !strings.Contains(r.stdout, "__start_sbx") {
		t.Errorf("completion bash: exit %d", r.code)
	}
	// the script completes against the daemon: a sandbox's id, for exec
	id := d.newSandbox(t, "--template", "tiny")
	r = d.sbx(t, "__complete", "exec", id[:6])
	if r.code != 0 || !strings.Contains(r.stdout, id) {
		t.Errorf("completing an id: %q", r.stdout)
	}
}

// TestSbxdListeners: sbxd refuses to start on a listener it cannot have,
// and moves a taken default preview address to a free port.
func TestSbxdListeners(t *testing.T) {
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	run := func(args ...string) (int, string) {
		dir := t.TempDir()
		base := []string{"--data-dir", dir, "--socket", filepath.Join(dir, "s.sock"), "--tag", randHex(2),
			"--runsc", filepath.Join(binDir, "runsc"), "--agent", filepath.Join(binDir, "sbx-agent")}
		cmd := exec.Command(filepath.Join(binDir, "sbxd"), append(base, args...)...)
		var out bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &out
		done := make(chan error, 1)
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		go func() { done <- cmd.Wait() }()
		select {
		case <-done:
		case <-time.After(30 * time.Second):
			cmd.Process.Signal(syscall.SIGTERM)
			<-done
			t.Fatalf("sbxd %v did not refuse to start:\n%s", args, out.String())
		}
		return cmd.ProcessState.ExitCode(), out.String()
	}
	tests := []struct {
		name string
		args []string
		want string
	}{
		{"--listen taken", []string{"--listen", taken.Addr().String()}, "--listen " + taken.Addr().String() + ": "},
		{"--preview-listen taken", []string{"--preview-listen", taken.Addr().String()}, "--preview-listen " + taken.Addr().String() + ": "},
		{"--socket of a serving sbxd", []string{"--socket", shared.socket}, "another sbxd is serving it"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			code, out := run(tc.args...)
			if code != 1 || !strings.Contains(out, tc.want) || strings.Contains(out, "panic") {
				t.Errorf("exit %d, output %q; want 1 naming %q", code, out, tc.want)
			}
		})
	}
	if _, err := shared.client.Health(t.Context()); err != nil {
		t.Errorf("the sbxd serving the socket: %v", err)
	}

	t.Run("default preview address taken", func(t *testing.T) {
		// hold the default address, unless someone else already does
		if l, err := net.Listen("tcp", "127.0.0.1:8181"); err == nil {
			defer l.Close()
		}
		d, err := startDaemon(nil)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { d.stop(true) })
		log, _ := os.ReadFile(d.logPath)
		if !strings.Contains(string(log), "the default preview address is taken") {
			t.Fatalf("sbxd log does not say where previews went:\n%s", log)
		}
		id := d.newSandbox(t, "--template", "tiny")
		u, err := url.Parse(strings.TrimSpace(d.must(t, "preview", id, "8080")))
		if err != nil || u.Port() == "8181" || u.Port() == "" {
			t.Fatalf("preview URL %v (%v): want another port than the taken default", u, err)
		}
		if !strings.Contains(string(log), "127.0.0.1:"+u.Port()) {
			t.Errorf("the log does not name the port previews use (%s):\n%s", u.Port(), log)
		}
		conn, err := net.Dial("tcp", "127.0.0.1:"+u.Port())
		if err != nil {
			t.Errorf("nothing serves previews on %s: %v", u.Port(), err)
		} else {
			conn.Close()
		}
	})
}

// repoRoot is the worktree the tests run in.
func repoRoot() string { return filepath.Join(binDir, "..") }

// TestMakeDepsWaitsForAptLock: make deps waits for apt's lock, says so,
// and gives up after its bound (apt itself is a fake that is locked while
// a file exists).
func TestMakeDepsWaitsForAptLock(t *testing.T) {
	dir := t.TempDir()
	lock := filepath.Join(dir, "locked")
	fake := filepath.Join(dir, "apt-get")
	os.WriteFile(fake, []byte("#!/bin/sh\n"+
		"if [ -e "+lock+" ]; then echo 'E: Could not get lock /var/lib/apt/lists/lock. It is held by process 4242 (apt-get)'; exit 100; fi\n"+
		"echo \"$*\" >> "+filepath.Join(dir, "calls")+"\n"), 0o755)
	make := func(wait string) (int, string, time.Duration) {
		cmd := exec.Command("make", "-C", repoRoot(), "deps", "DEBS=sbx-test-no-such-package", "APT_GET="+fake, "APT_LOCK_WAIT="+wait)
		start := time.Now()
		out, _ := cmd.CombinedOutput()
		return cmd.ProcessState.ExitCode(), string(out), time.Since(start)
	}
	os.WriteFile(lock, nil, 0o644)
	time.AfterFunc(3*time.Second, func() { os.Remove(lock) })
	code, out, took := make("60")
	if code != 0 || !strings.Contains(out, "apt is busy (held by process 4242 (apt-get)); waiting for its lock, up to 60s") || took < 3*time.Second {
		t.Errorf("lock released after 3s: exit %d after %s:\n%s", code, took, out)
	}
	calls, _ := os.ReadFile(filepath.Join(dir, "calls"))
	if !strings.Contains(string(calls), "update") || !strings.Contains(string(calls), "install -y -qq sbx-test-no-such-package") {
		t.Errorf("apt-get was called %q", calls)
	}
	os.WriteFile(lock, nil, 0o644)
	code, out, took = make("3")
	if code == 0 || !strings.Contains(out, "apt is still locked after 3s") || took > 30*time.Second {
		t.Errorf("lock held: exit %d after %s:\n%s", code, took, out)
	}
}

// TestMakeInstall: make install puts the binaries on PATH, and the
// sbxd there finds runsc and the agent beside it.
func TestMakeInstall(t *testing.T) {
	dest := t.TempDir()
	out, err := exec.Command("make", "-C", repoRoot(), "install", "DESTDIR="+dest).CombinedOutput()
	if err != nil {
		t.Fatalf("make install: %v\n%s", err, out)
	}
	bin := filepath.Join(dest, "usr", "local", "bin")
	for _, b := range []string{"sbx", "sbxd", "sbx-shim", "sbx-agent", "runsc"} {
		fi, err := os.Stat(filepath.Join(bin, b))
		if err != nil || fi.Mode()&0o111 == 0 {
			t.Errorf("%s: %v, mode %v", b, err, fi)
		}
	}
	// found on PATH, as the README's `sbx ...` after `make install`
	cmd := exec.Command("/bin/sh", "-c", "command -v sbx && sbx --json info sb_nosuchbox0")
	cmd.Env = append(os.Environ(), "PATH="+bin+":/usr/bin:/bin", "SBX_HOST=unix://"+shared.socket)
	o, _ := cmd.CombinedOutput()
	if cmd.ProcessState.ExitCode() != 1 || !strings.Contains(string(o), bin+"/sbx\n") || !strings.Contains(string(o), "not_found") {
		t.Errorf("the installed sbx: %s", o)
	}
	// an installed sbxd finds runsc beside it (its own check comes before any listener)
	dir := t.TempDir()
	cmd = exec.Command(filepath.Join(bin, "sbxd"), "--data-dir", dir, "--socket", shared.socket)
	o, _ = cmd.CombinedOutput()
	if strings.Contains(string(o), "runsc:") || !strings.Contains(string(o), "another sbxd is serving it") {
		t.Errorf("the installed sbxd: %s", o)
	}
}
