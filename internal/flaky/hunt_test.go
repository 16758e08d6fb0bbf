package flaky

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/google/go-cmp/cmp"

	"sbx.dev/sbx/api"
	"sbx.dev/sbx/client"
)

// fakeHunt is an in-memory sbxd for Hunt: the loop's output and exit code
// are given, and it records each call by name, in order.
type fakeHunt struct {
	loopOut  string
	loopExit int
	failed   string // the marker file's content

	mu        sync.Mutex
	calls     []string
	created   api.CreateRequest
	script    string
	state     api.State
	snapshots map[string]bool
	sandboxes map[string]bool
	stopErr   error
	// forkErr fails the fork: before its state is taken, or with
	// forkErrLate after (a child that did not boot).
	forkErr     error
	forkErrLate bool
}

var _ HuntClient = (*fakeHunt)(nil)

func newFakeHunt(out string, exit int) *fakeHunt {
	return &fakeHunt{loopOut: out, loopExit: exit, state: api.StateReady,
		snapshots: map[string]bool{}, sandboxes: map[string]bool{},
		failed: "run=3\nseed=4242\nexit=1\ntime=1700000000.5\n"}
}

func (f *fakeHunt) call(s string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls = append(f.calls, s)
}

func (f *fakeHunt) Create(ctx context.Context, opts ...client.CreateOption) (*api.Sandbox, error) {
	f.call("create")
	f.created = client.CreateRequest(opts...)
	f.sandboxes[f.created.Name] = true
	return &api.Sandbox{ID: "sb_hunt", Name: f.created.Name, State: api.StateReady}, nil
}

func (f *fakeHunt) Get(ctx context.Context, id string) (*api.Sandbox, error) {
	f.call("get " + id)
	if !f.sandboxes[id] {
		return nil, api.Errorf(api.ErrNotFound, "no sandbox %s", id)
	}
	return &api.Sandbox{ID: "sb_hunt", Name: id, State: f.state}, nil
}

func (f *fakeHunt) Delete(ctx context.Context, id string) error {
	f.call("delete " + id)
	return nil
}

func (f *fakeHunt) Exec(ctx context.Context, id string, req api.ExecRequest, stdout, stderr io.Writer) (*api.Exec, error) {
	f.call("exec " + asUser(req.User) + strings.Join(req.Cmd, " "))
	zero := 0
	return &api.Exec{ID: "x_mk", ExitCode: &zero, State: api.ExecExited}, nil
}

func (f *fakeHunt) ExecDetached(ctx context.Context, id string, req api.ExecRequest) (*api.Exec, error) {
	f.call("detach " + asUser(req.User) + strings.Join(req.Cmd, " "))
	return &api.Exec{ID: "x_loop", Cmd: req.Cmd, State: api.ExecRunning, Detached: true}, nil
}

func (f *fakeHunt) Execs(ctx context.Context, id string) ([]api.Exec, error) {
	f.call("execs")
	return []api.Exec{{ID: "x_other", Cmd: []string{"true"}}, {ID: "x_loop", Cmd: []string{"/bin/sh", huntLoop}}}, nil
}

func (f *fakeHunt) ExecOutput(ctx context.Context, id, execID string, follow bool, stdout, stderr io.Writer) (*api.Exec, error) {
	f.call("follow " + execID)
	io.WriteString(stdout, f.loopOut)
	code := f.loopExit
	return &api.Exec{ID: execID, ExitCode: &code, State: api.ExecExited}, nil
}

func (f *fakeHunt) WriteFile(ctx context.Context, id, path string, r io.Reader, size int64, mode fs.FileMode) error {
	f.call("write " + path)
	b, _ := io.ReadAll(r)
	f.script = string(b)
	return nil
}

func (f *fakeHunt) WriteTar(ctx context.Context, id, dir string, r io.Reader) error {
	f.call("writetar " + dir)
	_, err := io.Copy(io.Discard, r)
	return err
}

func (f *fakeHunt) ReadTar(ctx context.Context, id, path string) (io.ReadCloser, error) {
	f.call("readtar " + path)
	var b bytes.Buffer
	tw := tar.NewWriter(&b)
	tw.WriteHeader(&tar.Header{Name: ".sbx-hunt/", Typeflag: tar.TypeDir, Mode: 0o755})
	body := "curl: (7) Failed to connect: Connection refused\n"
	tw.WriteHeader(&tar.Header{Name: ".sbx-hunt/test-output.txt", Typeflag: tar.TypeReg, Mode: 0o644, Size: int64(len(body))})
	io.WriteString(tw, body)
	tw.WriteHeader(&tar.Header{Name: "../escape", Typeflag: tar.TypeReg, Mode: 0o644})
	tw.Close()
	return io.NopCloser(&b), nil
}

func (f *fakeHunt) ReadFile(ctx context.Context, id, path string) (io.ReadCloser, error) {
	f.call("read " + path)
	return io.NopCloser(strings.NewReader(f.failed)), nil
}

func (f *fakeHunt) ForkEvents(ctx context.Context, id string, req api.ForkRequest, fn func(api.ForkEvent) error) error {
	f.call(fmt.Sprintf("fork %s memory=%v", req.Name, req.Memory))
	f.mu.Lock()
	f.sandboxes[req.Name] = true
	f.mu.Unlock()
	kid := api.Sandbox{ID: "sb_fork", Name: req.Name}
	if f.forkErr != nil {
		if f.forkErrLate {
			fn(api.ForkEvent{Event: "sandbox.captured"})
		}
		return f.forkErr
	}
	for _, ev := range []api.ForkEvent{
		{Event: "sandbox.forking", IDs: []string{kid.ID}},
		{Event: "sandbox.captured"},
		{Event: "sandbox.ready", Sandbox: &kid},
		{Event: "done", Sandboxes: []api.Sandbox{kid}},
	} {
		if err := fn(ev); err != nil {
			return err
		}
	}
	return nil
}

func (f *fakeHunt) Snapshot(ctx context.Context, id, name string, memory bool) (*api.Snapshot, error) {
	f.call(fmt.Sprintf("snapshot %s memory=%v", name, memory))
	f.snapshots[name] = true
	return &api.Snapshot{Name: name}, nil
}

func (f *fakeHunt) GetSnapshot(ctx context.Context, name string) (*api.Snapshot, error) {
	if !f.snapshots[name] {
		return nil, api.Errorf(api.ErrNotFound, "no snapshot %s", name)
	}
	return &api.Snapshot{Name: name}, nil
}

func (f *fakeHunt) Stop(ctx context.Context, id string, wait bool) (*api.Sandbox, error) {
	f.call(fmt.Sprintf("stop wait=%v", wait))
	if f.stopErr != nil {
		return nil, f.stopErr
	}
	f.state = api.StateStopped
	return &api.Sandbox{ID: id, State: api.StateStopped}, nil
}

// asUser names the user an exec asks for, if any: "(as bob) ".
func asUser(u string) string {
	if u == "" {
		return ""
	}
	return "(as " + u + ") "
}

// outside keeps the calls of the steps after the loop, without the gets.
func outside(calls []string) []string {
	var out []string
	for i, c := range calls {
		if strings.HasPrefix(c, "follow ") {
			for _, d := range calls[i+1:] {
				if !strings.HasPrefix(d, "get ") {
					out = append(out, d)
				}
			}
		}
	}
	return out
}

const failingLoop = "sbx-hunt: run 1 seed 11 exit 0\nsbx-hunt: run 2 seed 12 exit 0\n" +
	"sbx-hunt: failed 3 seed 4242 exit 1 time 1700000000.5\nsbx-hunt: captured\n"

func TestHuntFailureOrder(t *testing.T) {
	f := newFakeHunt(failingLoop, loopFailed)
	dir := t.TempDir()
	var events []string
	s, err := Hunt(context.Background(), f, HuntOptions{
		Name: "hunt-a", Template: "base", Source: strings.NewReader(""), Runs: 20,
		Cmd: []string{"./test.sh"}, OutDir: filepath.Join(dir, "out"),
		Event: func(ev HuntEvent) { events = append(events, ev.Event) },
	})
	if err != nil {
		t.Fatal(err)
	}
	wantSetup := []string{"create", "exec sh -c echo $(id -u):$(id -g)", "exec (as 0) mkdir -p " + HuntDir, "writetar /work", "write " + huntLoop, "detach (as 0) /bin/sh " + huntLoop, "follow x_loop"}
	if diff := cmp.Diff(wantSetup, f.calls[:len(wantSetup)]); diff != "" {
		t.Errorf("calls before the loop ended (-want +got):\n%s", diff)
	}
	want := []string{"read " + HuntDir + "/failed", "fork hunt-a-fork memory=false", "readtar " + HuntDir,
		"snapshot hunt-a memory=false", "stop wait=true"}
	if diff := cmp.Diff(want, outside(f.calls)); diff != "" {
		t.Errorf("outside steps (-want +got):\n%s", diff)
	}
	wantEvents := []string{"sandbox", "started", "run", "run", "failed", "captured", "fork", "artifacts", "snapshot", "stopped"}
	if diff := cmp.Diff(wantEvents, events); diff != "" {
		t.Errorf("events (-want +got):\n%s", diff)
	}
	if f.created.Template != "base" || f.created.Name != "hunt-a" {
		t.Errorf("created %+v, want template base and name hunt-a", f.created)
	}
	if !s.Failed || s.Run != 3 || s.Seed != "4242" || s.ExitCode != 1 || !s.Stopped || s.Snapshot != "hunt-a" || s.Fork != "hunt-a-fork" {
		t.Errorf("summary %+v", s)
	}
	if s.FailedAt.Unix() != 1700000000 || s.FailedAt.Nanosecond() != 500000000 {
		t.Errorf("failedAt %v, want 1700000000.5", s.FailedAt)
	}
	b, err := os.ReadFile(filepath.Join(dir, "out", "test-output.txt"))
	if err != nil || !strings.Contains(string(b), "refused") {
		t.Errorf("artifact test-output.txt: %q, %v", b, err)
	}
	if _, err := os.Stat(filepath.Join(dir, "escape")); err == nil {
		t.Errorf("a tar entry escaped the artifacts folder")
	}
	if len(s.Commands) != 3 || !strings.Contains(s.Commands[2], "--seed 4242") || s.Commands[0] != "sbx resume hunt-a" {
		t.Errorf("commands %q", s.Commands)
	}
}

func TestHuntNoFailureDeletes(t *testing.T) {
	f := newFakeHunt("sbx-hunt: run 1 seed 1 exit 0\nsbx-hunt: run 2 seed 2 exit 0\nsbx-hunt: no failure in 2 runs\n", 0)
	s, err := Hunt(context.Background(), f, HuntOptions{Name: "hunt-b", Runs: 2, Cmd: []string{"true"}, OutDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]string{"delete sb_hunt"}, outside(f.calls)); diff != "" {
		t.Errorf("after the loop (-want +got):\n%s", diff)
	}
	if s.Failed || s.Runs != 2 {
		t.Errorf("summary %+v, want no failure in 2 runs", s)
	}
}

func TestHuntErrors(t *testing.T) {
	cases := []struct {
		name string
		o    HuntOptions
		exit int
		want string
	}{
		{"no name", HuntOptions{Cmd: []string{"x"}}, 0, "no name"},
		{"no command", HuntOptions{Name: "h"}, 0, "no test command"},
		{"both sources", HuntOptions{Name: "h", Cmd: []string{"x"}, Template: "a", From: "b"}, 0, "not both"},
		{"setup fails", HuntOptions{Name: "h", Cmd: []string{"x"}}, loopSetupFailed, "setup failed"},
		{"loop breaks", HuntOptions{Name: "h", Cmd: []string{"x"}}, 9, "exit 9"},
		{"on-crash without gdb", HuntOptions{Name: "h", Cmd: []string{"x"}}, loopCrashWrapper, "needs gdb"},
		{"collect /work", HuntOptions{Name: "h", Cmd: []string{"x"}, Collect: []string{"."}}, 0, "evidence folder"},
		{"collect /", HuntOptions{Name: "h", Cmd: []string{"x"}, Collect: []string{"logs", "/"}}, 0, "--collect /:"},
		{"collect inside the evidence", HuntOptions{Name: "h", Cmd: []string{"x"}, Collect: []string{HuntDir + "/steps.log"}}, 0, "evidence folder"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			out := "sbx-hunt: setup failed exit 2\n"
			if tc.exit == loopCrashWrapper {
				out = "sbx-hunt: --on-crash needs gdb and python3 in the sandbox (the base template has them)\n"
			}
			f := newFakeHunt(out, tc.exit)
			_, err := Hunt(context.Background(), f, tc.o)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("got %v, want an error with %q", err, tc.want)
			}
		})
	}
}

// TestHuntOutDirTaken: a hunt does not write its evidence among another's.
func TestHuntOutDirTaken(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "failed"), []byte("run=1\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	f := newFakeHunt(failingLoop, loopFailed)
	_, err := Hunt(context.Background(), f, HuntOptions{Name: "h", Cmd: []string{"x"}, OutDir: dir})
	if !errors.Is(err, api.ErrConflict) || !strings.Contains(err.Error(), "--out") {
		t.Fatalf("got %v, want a conflict naming --out", err)
	}
	if len(f.calls) != 0 {
		t.Errorf("calls %q, want none: nothing may be made", f.calls)
	}
}

func TestHuntStopFails(t *testing.T) {
	f := newFakeHunt(failingLoop, loopFailed)
	f.stopErr = api.Errorf(api.ErrUnavailable, "disk full")
	_, err := Hunt(context.Background(), f, HuntOptions{Name: "h", Cmd: []string{"x"}, OutDir: t.TempDir()})
	if !errors.Is(err, api.ErrUnavailable) {
		t.Fatalf("got %v, want the stop's error", err)
	}
}

// TestHuntForkFails: a fork that fails before its state is taken stops the
// capture there; one whose child fails after is reported once the snapshot
// and the stop are done.
func TestHuntForkFails(t *testing.T) {
	for _, tc := range []struct {
		name string
		late bool
		want []string
	}{
		{"before the capture", false, []string{"read " + HuntDir + "/failed", "fork h-fork memory=false"}},
		{"after the capture", true, []string{"read " + HuntDir + "/failed", "fork h-fork memory=false", "readtar " + HuntDir,
			"snapshot h memory=false", "stop wait=true"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFakeHunt(failingLoop, loopFailed)
			f.forkErr, f.forkErrLate = api.Errorf(api.ErrUnavailable, "no room"), tc.late
			_, err := Hunt(context.Background(), f, HuntOptions{Name: "h", Cmd: []string{"x"}, OutDir: t.TempDir()})
			if !errors.Is(err, api.ErrUnavailable) {
				t.Fatalf("got %v, want the fork's error", err)
			}
			if diff := cmp.Diff(tc.want, outside(f.calls)); diff != "" {
				t.Errorf("outside steps (-want +got):\n%s", diff)
			}
		})
	}
}

func TestAttach(t *testing.T) {
	t.Run("running loop, steps partly done", func(t *testing.T) {
		f := newFakeHunt(failingLoop, loopFailed)
		f.sandboxes["h"] = true
		f.sandboxes["h-fork"] = true // the fork was made before the client went away
		s, err := Attach(context.Background(), f, AttachOptions{Name: "h", OutDir: t.TempDir()})
		if err != nil {
			t.Fatal(err)
		}
		want := []string{"read " + HuntDir + "/failed", "readtar " + HuntDir, "snapshot h memory=false", "stop wait=true"}
		if diff := cmp.Diff(want, outside(f.calls)); diff != "" {
			t.Errorf("outside steps (-want +got):\n%s", diff)
		}
		if !strings.Contains(strings.Join(f.calls, "\n"), "follow x_loop") {
			t.Errorf("attach did not follow the loop's exec: %q", f.calls)
		}
		if !s.Stopped || s.Fork != "h-fork" {
			t.Errorf("summary %+v", s)
		}
	})
	t.Run("already stopped", func(t *testing.T) {
		f := newFakeHunt("", 0)
		f.sandboxes["h"] = true
		f.state = api.StateStopped
		s, err := Attach(context.Background(), f, AttachOptions{Name: "h"})
		if err != nil {
			t.Fatal(err)
		}
		if diff := cmp.Diff([]string{"get h", "get h-fork"}, f.calls); diff != "" {
			t.Errorf("calls (-want +got):\n%s", diff)
		}
		// no h-fork: its boot failed after its state was taken
		if !s.Stopped || s.Fork != "" {
			t.Errorf("summary %+v, want stopped and no fork", s)
		}
	})
	t.Run("unknown", func(t *testing.T) {
		f := newFakeHunt("", 0)
		if _, err := Attach(context.Background(), f, AttachOptions{Name: "nope"}); !errors.Is(err, api.ErrNotFound) {
			t.Fatalf("got %v, want api.ErrNotFound", err)
		}
	})
}

// runLoop runs the loop script with a host shell in dir, a scratch /work
// stand-in, and returns its output and exit code. It runs in a pid
// namespace of its own with its own /proc: the loop kills the processes a
// passing run leaves behind and reads those of a failing one, and on the
// host those would be anyone's. Leaked processes die with the namespace.
func runLoop(t *testing.T, dir string, c loopConfig) (string, int) {
	t.Helper()
	if os.Getuid() != 0 {
		t.Skip("needs root for a pid namespace")
	}
	if _, err := exec.LookPath("unshare"); err != nil {
		t.Skip("no unshare")
	}
	hunt := filepath.Join(dir, ".sbx-hunt")
	script := loopScript(c)
	script = strings.ReplaceAll(script, "H="+shellQuote(HuntDir)+"\n", "H="+shellQuote(hunt)+"\n")
	script = strings.ReplaceAll(script, "cd /work 2>/dev/null || cd /", "cd "+shellQuote(dir))
	if !strings.Contains(script, "H="+shellQuote(hunt)+"\n") || strings.Contains(script, "cd /work") {
		t.Fatalf("the script still points at the real %s:\n%s", HuntDir, script)
	}
	cmd := exec.Command("unshare", "--pid", "--fork", "--mount-proc", "--kill-child", "sh", "-c", script)
	out, err := cmd.Output()
	var ee *exec.ExitError
	if err != nil && !errors.As(err, &ee) {
		t.Fatalf("loop: %v", err)
	}
	return string(out), cmd.ProcessState.ExitCode()
}

// TestLoopScript: the seeds reach the test, setup runs once, and a failure
// leaves the marker and the evidence.
func TestLoopScript(t *testing.T) {
	dir := t.TempDir()
	hunt := filepath.Join(dir, ".sbx-hunt")
	out, code := runLoop(t, dir, loopConfig{setup: "echo set >>setup-ran", runs: 10, seedEnv: "MYSEED", collect: []string{filepath.Join(dir, "n")},
		test: []string{"sh", "-c", `echo "seed $MYSEED"; test -e fail-now && exit 7; n=$(cat n 2>/dev/null || echo 0); echo $((n+1)) >n; [ $n -lt 2 ] || touch fail-now; exit 0`}})
	if code != loopFailed {
		t.Fatalf("loop exit %d, want %d\n%s", code, loopFailed, out)
	}
	if !strings.Contains(out, "sbx-hunt: failed 4 seed ") || !strings.Contains(out, lineCaptured) {
		t.Errorf("loop output:\n%s", out)
	}
	marker, err := os.ReadFile(filepath.Join(hunt, "failed"))
	if err != nil || !strings.Contains(string(marker), "run=4\n") || !strings.Contains(string(marker), "exit=7\n") {
		t.Errorf("marker %q, %v", marker, err)
	}
	for _, name := range []string{"test-output.txt", "processes.txt", "listening.txt", "collected" + dir + "/n", "captured"} {
		if _, err := os.Stat(filepath.Join(hunt, name)); err != nil {
			t.Errorf("evidence: %v", err)
		}
	}
	if b, _ := os.ReadFile(filepath.Join(hunt, "test-output.txt")); !strings.HasPrefix(string(b), "seed ") {
		t.Errorf("test output %q, want the seed line", b)
	}
	if b, err := os.ReadFile(filepath.Join(dir, "setup-ran")); string(b) != "set\n" {
		t.Errorf("setup-ran %q (%v), want the setup run once", b, err)
	}
}

// TestLoopScriptLeak: a failing run's leaked processes are named with their
// open files; one that never listens is looked at again until listenWait
// after the failure, and the loop still ends.
func TestLoopScriptLeak(t *testing.T) {
	if _, err := exec.LookPath("ss"); err != nil {
		t.Skip("no ss")
	}
	dir := t.TempDir()
	hunt := filepath.Join(dir, ".sbx-hunt")
	out, code := runLoop(t, dir, loopConfig{runs: 3, seedEnv: "SEED",
		test: []string{"sh", "-c", "sleep 300 & echo leaked $!; exit 1"}})
	if code != loopFailed {
		t.Fatalf("loop exit %d, want %d\n%s", code, loopFailed, out)
	}
	read := func(name string) string {
		b, err := os.ReadFile(filepath.Join(hunt, name))
		if err != nil {
			t.Errorf("evidence: %v", err)
		}
		return string(b)
	}
	pid := strings.TrimSpace(strings.TrimPrefix(read("test-output.txt"), "leaked "))
	if leaked := read("leaked.txt"); !strings.HasPrefix(leaked, pid+" sleep 300") {
		t.Errorf("leaked.txt %q, want %s sleep 300", leaked, pid)
	}
	if files := read("files-" + pid + ".txt"); !strings.Contains(files, "/proc/"+pid+"/fd") {
		t.Errorf("files-%s.txt %q, want its fds", pid, files)
	}
	if l := read("listening.txt"); !strings.Contains(l, "# at the failure") || !strings.Contains(l, "waiting for the leaked processes to listen") {
		t.Errorf("listening.txt lacks the first or the second look:\n%s", l)
	}
	if steps := read("steps.log"); !strings.Contains(steps, "listeners again") {
		t.Errorf("steps.log lacks the second look:\n%s", steps)
	}
}

// TestLoopScriptLateListener: a leaked server that starts listening after
// the first look at the listeners is in the second look.
func TestLoopScriptLateListener(t *testing.T) {
	for _, tool := range []string{"ss", "python3"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skip("no " + tool)
		}
	}
	dir := t.TempDir()
	hunt := filepath.Join(dir, ".sbx-hunt")
	// the server listens once the evidence has been read, after the first
	// look, whatever the machine's speed; the deadline is far
	server := `import os, socket, time
while "evidence read" not in open(os.environ["H"] + "/steps.log").read(): time.sleep(0.05)
s = socket.socket(); s.bind(("127.0.0.1", 0)); s.listen(); time.sleep(300)`
	out, code := runLoop(t, dir, loopConfig{runs: 1, seedEnv: "SEED", listenWait: "60",
		test: []string{"sh", "-c", "H=" + shellQuote(hunt) + " python3 -c '" + server + "' & echo leaked $!; exit 1"}})
	if code != loopFailed {
		t.Fatalf("loop exit %d, want %d\n%s", code, loopFailed, out)
	}
	b, err := os.ReadFile(filepath.Join(hunt, "test-output.txt"))
	if err != nil {
		t.Fatal(err)
	}
	pid := strings.TrimSpace(strings.TrimPrefix(string(b), "leaked "))
	l, err := os.ReadFile(filepath.Join(hunt, "listening.txt"))
	if err != nil {
		t.Fatal(err)
	}
	first, again, ok := strings.Cut(string(l), "# again at")
	if !ok {
		t.Fatalf("no second look at the listeners:\n%s", l)
	}
	if strings.Contains(first, "pid="+pid+",") {
		t.Errorf("the server was in the first look, before it listened:\n%s", l)
	}
	if !strings.Contains(again, "pid="+pid+",") {
		t.Errorf("the second look lacks the leaked server %s:\n%s", pid, l)
	}
}

// TestLoopScriptTimeout: a run that outlives the timeout is a failure with
// exit 124, recorded as timed out, and its processes are left running for
// the evidence; runs that end in time are not touched by their watchdogs.
func TestLoopScriptTimeout(t *testing.T) {
	dir := t.TempDir()
	hunt := filepath.Join(dir, ".sbx-hunt")
	// runs 1-3 pass at once, run 4 hangs
	test := `n=$(cat n 2>/dev/null || echo 0); n=$((n+1)); echo $n >n; grep SigIgn /proc/self/status; echo "run $n pid $$"; [ $n -lt 4 ] || exec sleep 300`
	out, code := runLoop(t, dir, loopConfig{runs: 10, seedEnv: "SEED", timeout: "0.5", listenWait: "0.1",
		test: []string{"sh", "-c", test}})
	if code != loopFailed {
		t.Fatalf("loop exit %d, want %d\n%s", code, loopFailed, out)
	}
	if !strings.Contains(out, "sbx-hunt: failed 4 seed ") || !strings.Contains(out, " exit 124 ") {
		t.Errorf("loop output, want run 4 failed with exit 124:\n%s", out)
	}
	marker, _ := os.ReadFile(filepath.Join(hunt, "failed"))
	var s HuntSummary
	parseFailed(strings.NewReader(string(marker)), &s)
	if s.Run != 4 || s.ExitCode != 124 || !s.TimedOut {
		t.Errorf("marker %q: run %d exit %d timedOut %v, want 4, 124, true", marker, s.Run, s.ExitCode, s.TimedOut)
	}
	b, _ := os.ReadFile(filepath.Join(hunt, "test-output.txt"))
	pid := strings.TrimSpace(string(b)[strings.LastIndex(string(b), "pid ")+4:])
	// run in the background, the test still has SIGINT and SIGQUIT (bits 2, 3)
	var ign uint64
	if _, err := fmt.Sscanf(string(b), "SigIgn:\t%x", &ign); err != nil || ign&0x6 != 0 {
		t.Errorf("the test's SigIgn %#x (%v), want SIGINT and SIGQUIT not ignored:\n%s", ign, err, b)
	}
	leaked, _ := os.ReadFile(filepath.Join(hunt, "leaked.txt"))
	if !strings.HasPrefix(string(leaked), pid+" sleep 300") {
		t.Errorf("leaked.txt %q, want the hung run's process %s alive (sleep 300)", leaked, pid)
	}
}

// TestLoopScriptStraySignal: under --timeout, a USR1 that is not this run's
// watchdog's (here the test's own, sent to the loop) does not turn a run
// into a failure.
func TestLoopScriptStraySignal(t *testing.T) {
	dir := t.TempDir()
	out, code := runLoop(t, dir, loopConfig{runs: 20, seedEnv: "SEED", timeout: "5",
		test: []string{"sh", "-c", "kill -USR1 $PPID; exit 0"}})
	if code != 0 || !strings.Contains(out, "no failure in 20 runs") {
		t.Fatalf("loop exit %d, want 0 and no failure:\n%s", code, out)
	}
}

// TestHuntUser: with --user, /work is made as root and given to the user;
// the loop runs as root (its evidence reads any process) and the setup and
// every run as the user.
func TestHuntUser(t *testing.T) {
	f := newFakeHunt(failingLoop, loopFailed)
	_, err := Hunt(context.Background(), f, HuntOptions{
		Name: "hunt-u", Template: "base", Source: strings.NewReader(""), Runs: 20, User: "user",
		Cmd: []string{"./test.sh"}, OutDir: filepath.Join(t.TempDir(), "out"),
	})
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"create", "exec (as 0) mkdir -p " + HuntDir, "writetar /work", "exec (as 0) chown -R -- user /work",
		"write " + huntLoop, "detach (as 0) /bin/sh " + huntLoop, "follow x_loop"}
	if diff := cmp.Diff(want, f.calls[:len(want)]); diff != "" {
		t.Errorf("calls before the loop ended (-want +got):\n%s", diff)
	}
	if !strings.Contains(f.script, "/.sbx/sbx-agent exec --user user -- env SEED=") {
		t.Errorf("the loop does not run the test as the user:\n%s", f.script)
	}
}
