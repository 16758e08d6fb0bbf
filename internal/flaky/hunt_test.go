package flaky

import (
	"archive/tar"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"sbx.dev/sbx/api"
	"sbx.dev/sbx/client"
	"sbx.dev/sbx/internal/wire/agentwire"
)

// fakeHunt is an in-memory sbxd for Hunt: the loop's output and exit code
// are given, and it records each call by name, in order.
type fakeHunt struct {
	loopOut  string
	loopErr  string // what the loop says on stderr
	loopExit int
	failed   string // the marker file's content
	frozen   string // the freeze's record (HuntDir/frozen)
	// evidenceExit is the exit code of the evidence read in a copy.
	evidenceExit int

	mu        sync.Mutex
	calls     []string
	created   api.CreateRequest
	script    string
	state     api.State
	snapshots map[string]bool
	sandboxes map[string]bool
	// snapOf, parentOf and fromOf are a snapshot's sandbox, a fork's
	// parent and a copy's snapshot, by name.
	snapOf, parentOf, fromOf map[string]string
	stopErr                  error
	// forkErr fails the fork: before its state is taken, or with
	// forkErrLate after (a child that did not boot).
	forkErr     error
	forkErrLate bool
}

var _ HuntClient = (*fakeHunt)(nil)

func newFakeHunt(out string, exit int) *fakeHunt {
	return &fakeHunt{loopOut: out, loopExit: exit, state: api.StateReady,
		snapshots: map[string]bool{}, sandboxes: map[string]bool{},
		snapOf: map[string]string{}, parentOf: map[string]string{}, fromOf: map[string]string{},
		failed: "run=3\nseed=4242\nexit=1\ntime=1700000000.5\n"}
}

func (f *fakeHunt) call(s string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls = append(f.calls, s)
}

func (f *fakeHunt) Create(ctx context.Context, opts ...client.CreateOption) (*api.Sandbox, error) {
	req := client.CreateRequest(opts...)
	if req.From != "" {
		f.call("create " + req.Name + " from " + req.From + " ttl " + req.TTL.String()) // 0s: none
		f.sandboxes[req.Name] = true
		f.fromOf[req.Name] = req.From
		return &api.Sandbox{ID: "sb_copy", Name: req.Name, State: api.StateReady, From: req.From}, nil
	}
	f.call("create")
	f.created = req
	f.sandboxes[f.created.Name] = true
	return &api.Sandbox{ID: "sb_hunt", Name: f.created.Name, State: api.StateReady}, nil
}

func (f *fakeHunt) Get(ctx context.Context, id string) (*api.Sandbox, error) {
	f.call("get " + id)
	if !f.sandboxes[id] {
		return nil, api.Errorf(api.ErrNotFound, "no sandbox %s", id)
	}
	sb := &api.Sandbox{ID: "sb_hunt", Name: id, State: f.state, Parent: f.parentOf[id], From: f.fromOf[id]}
	if id == f.created.Name {
		sb.Meta = f.created.Meta
	}
	return sb, nil
}

func (f *fakeHunt) Delete(ctx context.Context, id string) error {
	f.call("delete " + id)
	return nil
}

func (f *fakeHunt) Exec(ctx context.Context, id string, req api.ExecRequest, stdout, stderr io.Writer) (*api.Exec, error) {
	f.call("exec " + asUser(req.User) + strings.Join(req.Cmd, " "))
	code := 0
	if slices.Contains(req.Cmd, "--evidence") {
		code = f.evidenceExit
	}
	return &api.Exec{ID: "x_mk", ExitCode: &code, State: api.ExecExited}, nil
}

func (f *fakeHunt) ExecDetached(ctx context.Context, id string, req api.ExecRequest) (*api.Exec, error) {
	f.call("detach " + asUser(req.User) + strings.Join(req.Cmd, " "))
	return &api.Exec{ID: "x_loop", Cmd: req.Cmd, State: api.ExecRunning, Detached: true}, nil
}

func (f *fakeHunt) Execs(ctx context.Context, id string) ([]api.Exec, error) {
	f.call("execs")
	return []api.Exec{{ID: "x_other", Cmd: []string{"true"}}, {ID: "x_loop", Cmd: []string{"/.sbx/sbx-agent", "hunt", "--config", huntConfig}}}, nil
}

func (f *fakeHunt) ExecOutput(ctx context.Context, id, execID string, follow bool, stdout, stderr io.Writer) (*api.Exec, error) {
	f.call("follow " + execID)
	io.WriteString(stdout, f.loopOut)
	io.WriteString(stderr, f.loopErr)
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
	if path == HuntDir+"/frozen" {
		return io.NopCloser(strings.NewReader(f.frozen)), nil
	}
	return io.NopCloser(strings.NewReader(f.failed)), nil
}

func (f *fakeHunt) ForkEvents(ctx context.Context, id string, req api.ForkRequest, fn func(api.ForkEvent) error) error {
	f.call(fmt.Sprintf("fork %s memory=%v", req.Name, req.Memory))
	f.mu.Lock()
	f.sandboxes[req.Name] = true
	f.parentOf[req.Name] = id
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
	f.snapOf[name] = id
	return &api.Snapshot{Name: name, SandboxID: id}, nil
}

func (f *fakeHunt) GetSnapshot(ctx context.Context, name string) (*api.Snapshot, error) {
	if !f.snapshots[name] {
		return nil, api.Errorf(api.ErrNotFound, "no snapshot %s", name)
	}
	return &api.Snapshot{Name: name, SandboxID: f.snapOf[name]}, nil
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
	wantSetup := []string{"get hunt-a-fork", "get hunt-a-frozen", "create", "exec sh -c echo $(id -u):$(id -g)", "exec (as 0) mkdir -p " + HuntDir, "writetar /work", "write " + huntConfig, "detach (as 0) /.sbx/sbx-agent hunt --config " + huntConfig, "follow x_loop"}
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
		{"loop killed", HuntOptions{Name: "h", Cmd: []string{"x"}}, 137, "exit 137, killed by SIGKILL (the sandbox is kept for a look): sbx-hunt: setup failed exit 2; the loop's own word"},
		{"collect /work", HuntOptions{Name: "h", Cmd: []string{"x"}, Collect: []string{"."}}, 0, "evidence folder"},
		{"collect /", HuntOptions{Name: "h", Cmd: []string{"x"}, Collect: []string{"logs", "/"}}, 0, "--collect /:"},
		{"collect inside the evidence", HuntOptions{Name: "h", Cmd: []string{"x"}, Collect: []string{HuntDir + "/steps.log"}}, 0, "evidence folder"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			out := "sbx-hunt: setup failed exit 2\n"
			f := newFakeHunt(out, tc.exit)
			f.loopErr = "the loop's own word\n"
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
		f.parentOf["h-fork"] = "sb_hunt"
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
	t.Run("frozen and captured", func(t *testing.T) {
		f := newFakeHunt("", 0)
		f.sandboxes["h-frozen"] = true // the original was deleted at the end
		f.snapshots["h"] = true
		dir := t.TempDir()
		if err := os.WriteFile(filepath.Join(dir, "failed"), []byte("run=2\nseed=77\nexit=1\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, "frozen"), []byte(`{"state":"copy","name":"freeze-h-abcd","pausedMs":40}`), 0o644); err != nil {
			t.Fatal(err)
		}
		s, err := Attach(context.Background(), f, AttachOptions{Name: "h", OutDir: dir})
		if err != nil {
			t.Fatal(err)
		}
		if !s.Failed || s.Copy != "h-frozen" || s.Frozen != "freeze-h-abcd" || s.Snapshot != "h" || s.Seed != "77" || s.Artifacts != dir {
			t.Errorf("summary %+v, want the frozen hunt's", s)
		}
	})
	t.Run("unknown", func(t *testing.T) {
		f := newFakeHunt("", 0)
		if _, err := Attach(context.Background(), f, AttachOptions{Name: "nope"}); !errors.Is(err, api.ErrNotFound) {
			t.Fatalf("got %v, want api.ErrNotFound", err)
		}
	})
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
	want := []string{"get hunt-u-fork", "get hunt-u-frozen", "create", "exec (as 0) mkdir -p " + HuntDir, "writetar /work", "exec (as 0) chown -R -- user /work",
		"write " + huntConfig, "detach (as 0) /.sbx/sbx-agent hunt --config " + huntConfig, "follow x_loop"}
	if diff := cmp.Diff(want, f.calls[:len(want)]); diff != "" {
		t.Errorf("calls before the loop ended (-want +got):\n%s", diff)
	}
	var cfg agentwire.HuntConfig
	if err := json.Unmarshal([]byte(f.script), &cfg); err != nil || cfg.User != "user" || cfg.SeedEnv != "SEED" || cfg.Runs != 20 || cfg.Dir != HuntDir {
		t.Errorf("the loop's configuration %+v (%v), want the test run as user, 20 runs, seed in SEED:\n%s", cfg, err, f.script)
	}
}

const frozenLoop = "sbx-hunt: run 1 seed 11 exit 0\nsbx-hunt: failed 2 seed 4242 exit 1 time 1700000000.5\nsbx-hunt: frozen freeze-hunt-a-abcd\n"

// TestHuntFrozen: under --freeze, a frozen failure's outside steps, in
// order: the freeze's record, a copy resumed from it, the evidence read in
// the copy and copied out, a disk snapshot of the original, the original
// deleted; the summary says where each is.
func TestHuntFrozen(t *testing.T) {
	f := newFakeHunt(frozenLoop, loopFrozen)
	f.evidenceExit = loopFailed
	f.failed = "run=2\nseed=4242\nexit=1\ntime=1700000000.5\n"
	f.frozen = `{"state":"frozen","name":"freeze-hunt-a-abcd","pid":42,"failedAt":"2023-11-14T22:13:20.5Z","done":"2023-11-14T22:13:20.62Z","pausedMs":90}`
	f.snapshots["freeze-hunt-a-abcd"] = true // recorded by sbxd
	dir := t.TempDir()
	var events []string
	s, err := Hunt(context.Background(), f, HuntOptions{
		Name: "hunt-a", Template: "base", Source: strings.NewReader(""), Runs: 20, Freeze: true,
		Cmd: []string{"python3", "-m", "pytest"}, OutDir: filepath.Join(dir, "out"),
		Event: func(ev HuntEvent) { events = append(events, ev.Event) },
	})
	if err != nil {
		t.Fatal(err)
	}
	var cfg agentwire.HuntConfig
	if err := json.Unmarshal([]byte(f.script), &cfg); err != nil || !cfg.Freeze {
		t.Errorf("the loop's configuration %s (%v), want freeze on", f.script, err)
	}
	want := []string{"read " + HuntDir + "/failed", "read " + HuntDir + "/frozen", "create hunt-a-frozen from freeze-hunt-a-abcd ttl 2h0m0s",
		"exec (as 0) /.sbx/sbx-agent hunt --evidence --config " + huntConfig, "readtar " + HuntDir,
		"snapshot hunt-a memory=false", "delete sb_hunt"}
	if diff := cmp.Diff(want, outside(f.calls)); diff != "" {
		t.Errorf("outside steps (-want +got):\n%s", diff)
	}
	wantEvents := []string{"sandbox", "started", "run", "failed", "frozen", "recorded", "copy", "artifacts", "snapshot", "deleted"}
	if diff := cmp.Diff(wantEvents, events); diff != "" {
		t.Errorf("events (-want +got):\n%s", diff)
	}
	if !s.Failed || s.Run != 2 || s.Seed != "4242" || s.Frozen != "freeze-hunt-a-abcd" || s.Copy != "hunt-a-frozen" ||
		s.FrozenMs != 120 || s.PausedMs != 90 || s.Snapshot != "hunt-a" || s.Stopped {
		t.Errorf("summary %+v", s)
	}
	if len(s.Commands) != 3 || s.Commands[0] != "sbx shell hunt-a-frozen" || s.Commands[1] != "sbx new --from freeze-hunt-a-abcd" {
		t.Errorf("commands %q", s.Commands)
	}
	if b, err := os.ReadFile(filepath.Join(dir, "out", "failed")); err != nil || !strings.Contains(string(b), "run=2\n") {
		t.Errorf("artifacts' failed %q (%v), want the failing run's record", b, err)
	}
}

// TestHuntFrozenEvidenceFails: evidence that cannot be read in the copy is
// an error that says so; the freeze and its copy are kept.
func TestHuntFrozenEvidenceFails(t *testing.T) {
	f := newFakeHunt(frozenLoop, loopFrozen)
	f.evidenceExit = 1
	f.frozen = `{"state":"frozen","name":"freeze-hunt-a-abcd"}`
	f.snapshots["freeze-hunt-a-abcd"] = true
	_, err := Hunt(context.Background(), f, HuntOptions{Name: "hunt-a", Source: strings.NewReader(""), Runs: 2, Freeze: true,
		Cmd: []string{"./t"}, OutDir: filepath.Join(t.TempDir(), "out")})
	if err == nil || !strings.Contains(err.Error(), "reading the evidence in hunt-a-frozen failed") {
		t.Fatalf("got %v, want the evidence's failure", err)
	}
	if slices.Contains(f.calls, "delete sb_hunt") {
		t.Error("the original was deleted although the capture did not finish")
	}
}

func TestHuntFreezeOptions(t *testing.T) {
	f := newFakeHunt(frozenLoop, loopFrozen)
	_, err := Hunt(context.Background(), f, HuntOptions{Name: "h", Freeze: true, OnCrash: true, Cmd: []string{"./t"}})
	if !errors.Is(err, api.ErrInvalid) || !strings.Contains(err.Error(), "--freeze and --on-crash") {
		t.Errorf("--freeze with --on-crash: %v, want an invalid-argument error", err)
	}
	_, err = Hunt(context.Background(), f, HuntOptions{Name: "h", Freeze: true, KeepTTL: -time.Second, Cmd: []string{"./t"}})
	if !errors.Is(err, api.ErrInvalid) || !strings.Contains(err.Error(), "negative") {
		t.Errorf("a negative ttl of the copy: %v, want an invalid-argument error", err)
	}
}

// TestHuntFrozenCopyTTL: the frozen machine's copy has the idle ttl asked
// for (0: the default; KeepForever, `--keep-ttl 0`: none), so a forgotten
// one is reaped (the freeze stays), and the sandbox's meta keeps it for an
// --attach.
func TestHuntFrozenCopyTTL(t *testing.T) {
	for _, c := range []struct {
		keep time.Duration
		want string
	}{
		{30 * time.Minute, "30m0s"},
		{0, "2h0m0s"},
		{KeepForever, "0s"},
	} {
		f := newFrozenHunt()
		_, err := Hunt(context.Background(), f, HuntOptions{Name: "hunt-a", Source: strings.NewReader(""), Runs: 2, Freeze: true,
			KeepTTL: c.keep, Cmd: []string{"./t"}, OutDir: filepath.Join(t.TempDir(), "out")})
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Contains(f.calls, "create hunt-a-frozen from freeze-hunt-a-abcd ttl "+c.want) {
			t.Errorf("KeepTTL %s: calls %q, want the copy made with the ttl %s", c.keep, f.calls, c.want)
		}
		if got := f.created.Meta[metaKeepTTL]; got != c.want {
			t.Errorf("KeepTTL %s: the sandbox's meta %s = %q, want %q", c.keep, metaKeepTTL, got, c.want)
		}
	}
}

// newFrozenHunt is a fake whose loop froze at its failure.
func newFrozenHunt() *fakeHunt {
	f := newFakeHunt(frozenLoop, loopFrozen)
	f.evidenceExit = loopFailed
	f.failed = "run=1\nseed=1\nexit=1\ntime=1700000000.5\n"
	f.frozen = `{"state":"frozen","name":"freeze-hunt-a-abcd"}`
	f.snapshots["freeze-hunt-a-abcd"] = true
	return f
}

// TestAttachFrozenKeepTTL: --attach of a hunt --freeze whose client went
// away makes the copy with the hunt's own --keep-ttl (kept in its meta).
func TestAttachFrozenKeepTTL(t *testing.T) {
	for _, c := range []struct{ meta, want string }{{"45s", "45s"}, {"0s", "0s"}, {"", "2h0m0s"},
		{"-5s", "2h0m0s"}, {"-1ns", "2h0m0s"}, {"soon", "2h0m0s"}} {
		f := newFrozenHunt()
		f.sandboxes["hunt-a"] = true
		f.created = api.CreateRequest{Name: "hunt-a", Meta: map[string]string{}}
		if c.meta != "" {
			f.created.Meta[metaKeepTTL] = c.meta
		}
		if _, err := Attach(context.Background(), f, AttachOptions{Name: "hunt-a", OutDir: t.TempDir()}); err != nil {
			t.Fatal(err)
		}
		if !slices.Contains(f.calls, "create hunt-a-frozen from freeze-hunt-a-abcd ttl "+c.want) {
			t.Errorf("meta %q: calls %q, want the copy made with the ttl %s", c.meta, f.calls, c.want)
		}
	}
}

// TestHuntEarlierLeftovers: what an earlier hunt of a name left (its
// snapshot, fork or frozen copy) would be taken for a new hunt's: the new
// hunt is refused before it starts, naming them. A capture taken up again
// that finds another's in its way refuses too, rather than keep the wrong
// evidence.
func TestHuntEarlierLeftovers(t *testing.T) {
	for _, left := range []string{"snapshot", "hunt-a-fork", "hunt-a-frozen"} {
		f := newFrozenHunt()
		if left == "snapshot" {
			f.snapshots["hunt-a"], f.snapOf["hunt-a"] = true, "sb_old"
		} else {
			f.sandboxes[left] = true
		}
		_, err := Hunt(context.Background(), f, HuntOptions{Name: "hunt-a", Source: strings.NewReader(""), Runs: 2, Freeze: true,
			Cmd: []string{"./t"}, OutDir: filepath.Join(t.TempDir(), "out")})
		want := "the sandbox " + left
		if left == "snapshot" {
			want = "the snapshot hunt-a"
		}
		if !errors.Is(err, api.ErrConflict) || !strings.Contains(err.Error(), want) {
			t.Errorf("%s left: %v, want a conflict naming it", left, err)
		}
		if slices.Contains(f.calls, "create") {
			t.Errorf("%s left: the hunt's sandbox was made (calls %q)", left, f.calls)
		}
	}

	// taken up again: another freeze's copy, another sandbox's snapshot
	f := newFrozenHunt()
	f.sandboxes["hunt-a"] = true
	f.sandboxes["hunt-a-frozen"], f.fromOf["hunt-a-frozen"] = true, "freeze-hunt-a-0000"
	_, err := Attach(context.Background(), f, AttachOptions{Name: "hunt-a", OutDir: t.TempDir()})
	if !errors.Is(err, api.ErrConflict) || !strings.Contains(err.Error(), "hunt-a-frozen is in the way") {
		t.Errorf("attach, another freeze's copy there: %v, want a conflict", err)
	}
	f = newFrozenHunt()
	f.sandboxes["hunt-a"] = true
	f.snapshots["hunt-a"], f.snapOf["hunt-a"] = true, "sb_old"
	_, err = Attach(context.Background(), f, AttachOptions{Name: "hunt-a", OutDir: t.TempDir()})
	if !errors.Is(err, api.ErrConflict) || !strings.Contains(err.Error(), "snapshot hunt-a is in the way") {
		t.Errorf("attach, another sandbox's snapshot there: %v, want a conflict", err)
	}
	if slices.Contains(f.calls, "delete sb_hunt") {
		t.Error("the original was deleted although its snapshot was not taken")
	}
}
