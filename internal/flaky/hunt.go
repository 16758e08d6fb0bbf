package flaky

import (
	"archive/tar"
	"bufio"
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"sbx.dev/sbx/api"
	"sbx.dev/sbx/client"
	"sbx.dev/sbx/internal/wire/agentwire"
)

// The sandbox's meta keys where Hunt notes the test and its seed variable.
const (
	metaTest    = "sbx.hunt.test"
	metaSeedEnv = "sbx.hunt.seedEnv"
	metaKeepTTL = "sbx.hunt.keepTTL" // with Freeze: the copy's idle ttl, for --attach
)

// HuntClient is the slice of *client.Client that Hunt uses.
type HuntClient interface {
	Create(ctx context.Context, opts ...client.CreateOption) (*api.Sandbox, error)
	Get(ctx context.Context, id string) (*api.Sandbox, error)
	Delete(ctx context.Context, id string) error
	Exec(ctx context.Context, id string, req api.ExecRequest, stdout, stderr io.Writer) (*api.Exec, error)
	ExecDetached(ctx context.Context, id string, req api.ExecRequest) (*api.Exec, error)
	Execs(ctx context.Context, id string) ([]api.Exec, error)
	ExecOutput(ctx context.Context, id, execID string, follow bool, stdout, stderr io.Writer) (*api.Exec, error)
	WriteFile(ctx context.Context, id, path string, r io.Reader, size int64, mode fs.FileMode) error
	WriteTar(ctx context.Context, id, dir string, r io.Reader) error
	ReadTar(ctx context.Context, id, path string) (io.ReadCloser, error)
	ReadFile(ctx context.Context, id, path string) (io.ReadCloser, error)
	ForkEvents(ctx context.Context, id string, req api.ForkRequest, fn func(api.ForkEvent) error) error
	Snapshot(ctx context.Context, id, name string, memory bool) (*api.Snapshot, error)
	GetSnapshot(ctx context.Context, name string) (*api.Snapshot, error)
	Stop(ctx context.Context, id string, wait bool) (*api.Sandbox, error)
}

// DefaultHuntRuns is how many runs Hunt tries unless told.
const DefaultHuntRuns = 100

// HuntOptions says where Hunt loops which test and what it keeps.
type HuntOptions struct {
	// Name names the sandbox and the snapshot; the fork is Name-fork.
	Name string
	// Template, or From (a snapshot), is what the sandbox is made from.
	Template string
	From     string
	// Source, if set, is a tar extracted into /work before the setup.
	Source io.Reader
	// Setup is a shell command run once in /work before the loop.
	Setup string
	// Runs is the most runs before giving up; 0 means DefaultHuntRuns.
	Runs int
	// Timeout, if set, makes a run that lasts longer a failure (exit 124),
	// captured while it hangs: its processes are left running, so the
	// evidence and the stop with memory keep the hang itself.
	Timeout time.Duration
	// Cmd is the test's argv, run in /work with the seed in SeedEnv.
	Cmd     []string
	SeedEnv string
	// Collect are paths (relative to /work or absolute) copied into the
	// evidence on a failure, each under collected/ by its absolute path
	// (logs is collected/work/logs).
	Collect []string
	// OutDir is the local folder the evidence is copied to; "" means
	// ./sbx-hunt-NAME.
	OutDir string
	// User, if set, runs the setup and the test as this user (a name or
	// uid[:gid] inside the sandbox); /work is then theirs. "" is the
	// template's default user.
	User string
	// Freeze freezes the sandbox at the failure (see captureFrozen): a
	// pytest run with the sbx_freeze plugin loaded, a Go test using package
	// sbx.dev/sbx/freeze, or any program calling /.sbx/freeze freezes at
	// its own failing instant; any other failing run is frozen as it ends.
	// The evidence is then read from a copy of the frozen sandbox.
	Freeze bool
	// KeepTTL is the idle ttl of the frozen machine's copy, NAME-frozen
	// (with Freeze; 0: DefaultKeepTTL): it is reaped once left alone that
	// long, and the freeze it came from stays to make another.
	KeepTTL time.Duration
	// OnCrash ends the hunt at the first run during which a process of the
	// sandbox crashed (a signal that dumps core, with no handler), whatever
	// its exit code. The sandbox caught that crash at its faulting
	// instruction (every sandbox does, one per boot; see `sbx crashes`):
	// its bundle, read in a copy of that capture, lands in OutDir/crash
	// (crash.tar and backtrace.txt) and in the summary. Nothing runs under
	// gdb (CrashBundle says how the bundle is made with or without one).
	OnCrash bool
	// Event, if set, hears of each step as it happens.
	Event func(HuntEvent)

	testLine string // the test as a shell line, for the replay command
}

// HuntEvent is one step of a hunt, as `--json` prints it: "sandbox",
// "started", "run", "failed", "captured", "fork", "artifacts", "crash" (with
// OnCrash, when the failing run crashed), "snapshot", "stopped",
// "nofailure", "deleted", then "summary". With Freeze, after "failed":
// "frozen" (the loop froze), "recorded" (sbxd has the snapshot), "copy",
// "artifacts", "snapshot", "deleted".
type HuntEvent struct {
	Event    string       `json:"event"`
	Time     time.Time    `json:"time"`
	Sandbox  string       `json:"sandbox,omitempty"`
	Exec     string       `json:"exec,omitempty"`
	Run      int          `json:"run,omitempty"`
	Seed     string       `json:"seed,omitempty"`
	ExitCode *int         `json:"exitCode,omitempty"`
	Fork     string       `json:"fork,omitempty"`
	Path     string       `json:"path,omitempty"`
	Snapshot string       `json:"snapshot,omitempty"`
	Message  string       `json:"message,omitempty"`
	Summary  *HuntSummary `json:"summary,omitempty"`
}

// HuntSummary is what a hunt found and where it left it.
type HuntSummary struct {
	Name    string `json:"name"`
	Sandbox string `json:"sandbox"`
	Failed  bool   `json:"failed"`
	// Runs is how many runs were made (the failing one included).
	Runs     int    `json:"runs"`
	Run      int    `json:"run,omitempty"`
	Seed     string `json:"seed,omitempty"`
	ExitCode int    `json:"exitCode,omitempty"`
	// TimedOut says the failing run outlived --timeout and was captured
	// while it ran.
	TimedOut bool `json:"timedOut,omitempty"`
	// FailedAt is when the run failed (the sandbox's clock, which reads the host's).
	FailedAt time.Time `json:"failedAt,omitzero"`
	// CaptureMs is the time from the failure to the sandbox being stopped.
	CaptureMs int64  `json:"captureMs,omitempty"`
	Fork      string `json:"fork,omitempty"`
	Artifacts string `json:"artifacts,omitempty"`
	Snapshot  string `json:"snapshot,omitempty"`
	Stopped   bool   `json:"stopped,omitempty"`
	// Crash is the failing run's crash bundle, with OnCrash, when its
	// process died of a fatal signal.
	Crash *Crash `json:"crash,omitempty"`
	// Frozen is the freeze's snapshot, with Freeze; Copy the sandbox
	// resumed from it (the frozen machine, running); FrozenMs the time from
	// the failure to the freeze complete; PausedMs what gVisor took.
	Frozen   string   `json:"frozen,omitempty"`
	Copy     string   `json:"copy,omitempty"`
	FrozenMs int64    `json:"frozenMs,omitempty"`
	PausedMs int64    `json:"pausedMs,omitempty"`
	Commands []string `json:"commands,omitempty"`
}

func (o *HuntOptions) defaults() error {
	if o.Runs == 0 {
		o.Runs = DefaultHuntRuns
	}
	if o.SeedEnv == "" {
		o.SeedEnv = DefaultSeedEnv
	}
	if o.OutDir == "" && o.Name != "" {
		o.OutDir = "sbx-hunt-" + o.Name
	}
	switch {
	case o.Name == "":
		return api.Errorf(api.ErrInvalid, "hunt: no name given")
	case o.Template != "" && o.From != "":
		return api.Errorf(api.ErrInvalid, "hunt: give a template or a snapshot, not both")
	case o.Runs < 1:
		return api.Errorf(api.ErrInvalid, "hunt: want at least 1 run, got %d", o.Runs)
	case o.Timeout < 0 || o.Timeout > 0 && o.Timeout < 10*time.Millisecond:
		return api.Errorf(api.ErrInvalid, "hunt: --timeout %s: want 10ms or more", o.Timeout)
	case len(o.Cmd) == 0:
		return api.Errorf(api.ErrInvalid, "hunt: no test command given")
	case o.KeepTTL < 0 && o.KeepTTL != KeepForever:
		return api.Errorf(api.ErrInvalid, "hunt: the ttl of the frozen copy is negative (%s)", o.KeepTTL)
	case o.Freeze && o.OnCrash:
		return api.Errorf(api.ErrInvalid, "hunt: --freeze and --on-crash do not go together: both use the sandbox's one freeze of a boot, and --freeze already freezes a crashing run at its crash")
	case strings.ContainsAny(o.SeedEnv, "= '\"$"):
		return api.Errorf(api.ErrInvalid, "hunt: --seed-env %q: want a variable name", o.SeedEnv)
	}
	for i, p := range collectPaths(o.Collect) {
		if p == HuntDir || strings.HasPrefix(HuntDir, strings.TrimSuffix(p, "/")+"/") || strings.HasPrefix(p, HuntDir+"/") {
			return api.Errorf(api.ErrInvalid, "hunt: --collect %s: it holds (or is in) the hunt's own evidence folder %s; collect what is inside it instead", o.Collect[i], HuntDir)
		}
	}
	return nil
}

func (o *HuntOptions) emit(ev HuntEvent) {
	if o.Event != nil {
		ev.Time = time.Now().UTC()
		o.Event(ev)
	}
}

// Hunt makes a sandbox, copies Source into /work, and starts the loop inside
// it with a detached exec, so the loop goes on if the client goes away (see
// Attach). It follows the loop; on a failure it does the outside steps in
// order — a disk fork, the evidence copied to OutDir, a disk snapshot named
// Name, a stop that keeps memory — and returns the summary. If no run fails
// it deletes the sandbox and says so. A setup that fails is an error, and the
// sandbox is kept for a look.
func Hunt(ctx context.Context, c HuntClient, o HuntOptions) (*HuntSummary, error) {
	if err := o.defaults(); err != nil {
		return nil, err
	}
	// another hunt's evidence must not mix with this one's
	if ents, err := os.ReadDir(o.OutDir); err == nil && len(ents) > 0 {
		return nil, api.Errorf(api.ErrConflict, "hunt %s: the artifacts folder %s is not empty (an earlier hunt's?); move it away or give --out DIR", o.Name, o.OutDir)
	}
	// What an earlier hunt of the name left would be taken for this one's
	// (a capture cut off and taken up again finds its own steps done).
	if in := leftBy(ctx, c, o.Name); len(in) > 0 {
		return nil, api.Errorf(api.ErrConflict, "hunt %s: an earlier hunt of this name left %s; delete %s or give another --name", o.Name, strings.Join(in, " and "), map[bool]string{true: "them", false: "it"}[len(in) > 1])
	}
	// the meta lets --attach print the replay command of a hunt it did not
	// start, and make the frozen copy this one would have
	opts := []client.CreateOption{client.WithName(o.Name), client.WithMeta(metaSeedEnv, o.SeedEnv)}
	if o.Freeze {
		opts = append(opts, client.WithMeta(metaKeepTTL, keepTTL(o.KeepTTL).String()))
	}
	if line := shellJoin(o.Cmd); len(line) <= 1024 { // the server's limit on a meta value
		opts = append(opts, client.WithMeta(metaTest, line))
	}
	if o.From != "" {
		opts = append(opts, client.WithFrom(o.From))
	} else if o.Template != "" {
		opts = append(opts, client.WithTemplate(o.Template))
	}
	sb, err := c.Create(ctx, opts...)
	if err != nil {
		return nil, fmt.Errorf("hunt %s: create the sandbox: %w", o.Name, err)
	}
	o.emit(HuntEvent{Event: "sandbox", Sandbox: sb.ID})
	x, err := startLoop(ctx, c, sb.ID, &o)
	if err != nil {
		if derr := deleteAll(ctx, c, []string{sb.ID}); derr != nil {
			err = errors.Join(err, derr)
		}
		return nil, fmt.Errorf("hunt %s: %w", o.Name, err)
	}
	o.emit(HuntEvent{Event: "started", Sandbox: sb.ID, Exec: x.ID})
	return follow(ctx, c, sb.ID, x.ID, &o)
}

// startLoop copies the source in, writes the loop script and starts it detached.
func startLoop(ctx context.Context, c HuntClient, id string, o *HuntOptions) (*api.Exec, error) {
	// made as root: the test's user (o.User, else the template's default
	// user) may not create /work; it gets it after
	const asRoot = "0"
	owner := o.User
	if owner == "" {
		var out bytes.Buffer // what the sandbox answers is bounded
		x, err := c.Exec(ctx, id, api.ExecRequest{Cmd: []string{"sh", "-c", "echo $(id -u):$(id -g)"}}, &limitedBuffer{buf: &out, max: 4 << 10}, io.Discard)
		if err != nil {
			return nil, fmt.Errorf("who runs the test in %s: %w", id, err)
		}
		if x.ExitCode != nil && *x.ExitCode == 0 {
			if u := strings.TrimSpace(out.String()); u != "0:0" && u != "" {
				owner = u
			}
		}
	}
	x, err := c.Exec(ctx, id, api.ExecRequest{Cmd: []string{"mkdir", "-p", HuntDir}, User: asRoot}, io.Discard, io.Discard)
	if err != nil {
		return nil, fmt.Errorf("make %s in %s: %w", HuntDir, id, err)
	}
	if x.ExitCode == nil || *x.ExitCode != 0 {
		return nil, fmt.Errorf("make %s in %s: mkdir failed", HuntDir, id)
	}
	if o.Source != nil {
		if err := c.WriteTar(ctx, id, "/work", o.Source); err != nil {
			return nil, fmt.Errorf("copy the source into /work of %s: %w", id, err)
		}
	}
	if owner != "" {
		var out bytes.Buffer
		lb := &limitedBuffer{buf: &out, max: 4 << 10}
		x, err := c.Exec(ctx, id, api.ExecRequest{Cmd: []string{"chown", "-R", "--", owner, "/work"}, User: asRoot}, lb, lb)
		if err != nil {
			return nil, fmt.Errorf("give /work of %s to %s: %w", id, owner, err)
		}
		if x.ExitCode == nil || *x.ExitCode != 0 {
			return nil, api.Errorf(api.ErrInvalid, "give /work of %s to user %s: %s", id, owner, strings.TrimSpace(out.String()))
		}
	}
	cfg := agentwire.HuntConfig{Dir: HuntDir, Work: "/work", Setup: o.Setup, Runs: o.Runs, SeedEnv: o.SeedEnv, Test: o.Cmd,
		Collect: collectPaths(o.Collect), OnCrash: o.OnCrash, User: owner, Freeze: o.Freeze}
	if o.Timeout > 0 {
		cfg.Timeout = o.Timeout.String()
	}
	b, err := json.MarshalIndent(cfg, "", "  ")
	if err != nil {
		return nil, err
	}
	if err := c.WriteFile(ctx, id, huntConfig, bytes.NewReader(b), int64(len(b)), 0o644); err != nil {
		return nil, fmt.Errorf("write the loop's configuration into %s: %w", id, err)
	}
	// the loop runs as root (it reads the evidence of whatever the test
	// left); the setup and the test run as owner
	x, err = c.ExecDetached(ctx, id, api.ExecRequest{Cmd: []string{agentwire.AgentPath, "hunt", "--config", huntConfig}, Cwd: "/", User: asRoot})
	if err != nil {
		return nil, fmt.Errorf("start the loop in %s: %w", id, err)
	}
	return x, nil
}

// AttachOptions says which hunt Attach picks up and where the evidence goes.
type AttachOptions struct {
	Name string
	// OutDir as in HuntOptions; "" means ./sbx-hunt-NAME.
	OutDir string
	// SeedEnv and Cmd only shape the replay command printed; they may be empty.
	SeedEnv string
	Cmd     []string
	Event   func(HuntEvent)
}

// Attach picks up the hunt in the sandbox named Name: it follows the loop's
// exec and then does the outside steps not yet done. An unknown name is
// api.ErrNotFound; a sandbox without a hunt loop api.ErrInvalid.
func Attach(ctx context.Context, c HuntClient, a AttachOptions) (*HuntSummary, error) {
	o := HuntOptions{Name: a.Name, OutDir: a.OutDir, SeedEnv: a.SeedEnv, Cmd: a.Cmd, Event: a.Event}
	if len(o.Cmd) == 0 {
		o.Cmd = []string{"TEST_CMD"}
	}
	if err := o.defaults(); err != nil {
		return nil, err
	}
	sb, err := c.Get(ctx, a.Name)
	if errors.Is(err, api.ErrNotFound) {
		if s := attachFrozen(ctx, c, &o); s != nil {
			return s, nil
		}
	}
	if err != nil {
		return nil, fmt.Errorf("hunt --attach %s: %w", a.Name, err)
	}
	o.testLine = sb.Meta[metaTest]
	if v := sb.Meta[metaSeedEnv]; v != "" && a.SeedEnv == "" {
		o.SeedEnv = v
	}
	// the meta holds the ttl itself, 0 for none; it is anyone's to set, so
	// what is not a ttl is the default
	if d, err := time.ParseDuration(sb.Meta[metaKeepTTL]); err == nil && d >= 0 {
		o.KeepTTL = cmp.Or(d, KeepForever)
	}
	if sb.State == api.StateStopped {
		// the stop is the last outside step: the rest were done before it
		s := &HuntSummary{Name: o.Name, Sandbox: sb.ID, Failed: true, Stopped: true, Snapshot: o.Name}
		if _, err := c.Get(ctx, o.Name+"-fork"); err == nil {
			s.Fork = o.Name + "-fork" // else its boot failed after its state was taken
		}
		if dir, err := filepath.Abs(o.OutDir); err == nil {
			if f, err := os.Open(filepath.Join(dir, "failed")); err == nil {
				parseFailed(io.LimitReader(f, 64<<10), s)
				f.Close()
				s.Artifacts = dir
			}
		}
		o.emit(HuntEvent{Event: "stopped", Sandbox: sb.ID, Message: "the hunt was already captured"})
		s.Commands = commands(&o, s)
		return s, nil
	}
	xs, err := c.Execs(ctx, sb.ID)
	if err != nil {
		return nil, fmt.Errorf("hunt --attach %s: %w", a.Name, err)
	}
	var loop *api.Exec
	for i := range xs {
		if n := len(xs[i].Cmd); n > 0 && (xs[i].Cmd[n-1] == huntConfig || xs[i].Cmd[n-1] == legacyLoop) {
			loop = &xs[i]
		}
	}
	if loop == nil {
		return nil, api.Errorf(api.ErrInvalid, "hunt --attach %s: sandbox %s runs no hunt loop", a.Name, sb.ID)
	}
	o.emit(HuntEvent{Event: "attached", Sandbox: sb.ID, Exec: loop.ID})
	return follow(ctx, c, sb.ID, loop.ID, &o)
}

// lineWriter hands each complete line written to it to fn.
type lineWriter struct {
	buf []byte
	fn  func(string)
}

func (w *lineWriter) Write(p []byte) (int, error) {
	w.buf = append(w.buf, p...)
	for {
		i := bytes.IndexByte(w.buf, '\n')
		if i < 0 {
			return len(p), nil
		}
		w.fn(string(w.buf[:i]))
		w.buf = w.buf[i+1:]
	}
}

// follow follows the loop's output until it ends, then acts on how it ended.
func follow(ctx context.Context, c HuntClient, id, execID string, o *HuntOptions) (*HuntSummary, error) {
	s := &HuntSummary{Name: o.Name, Sandbox: id}
	var tail []string
	frozen := ""
	lw := &lineWriter{fn: func(l string) {
		f := strings.Fields(l)
		switch {
		case strings.HasPrefix(l, lineRun) && len(f) >= 7:
			n, _ := strconv.Atoi(f[2])
			code, _ := strconv.Atoi(f[6])
			s.Runs = n
			o.emit(HuntEvent{Event: "run", Sandbox: id, Run: n, Seed: f[4], ExitCode: &code})
		case strings.HasPrefix(l, lineFailed) && len(f) >= 9:
			n, _ := strconv.Atoi(f[2])
			code, _ := strconv.Atoi(f[6])
			s.Runs = n
			o.emit(HuntEvent{Event: "failed", Sandbox: id, Run: n, Seed: f[4], ExitCode: &code})
		case strings.HasPrefix(l, lineCaptured):
			o.emit(HuntEvent{Event: "captured", Sandbox: id, Path: HuntDir})
		case strings.HasPrefix(l, lineFrozen) && len(f) >= 3:
			frozen = f[2]
			o.emit(HuntEvent{Event: "frozen", Sandbox: id, Snapshot: frozen})
		default:
			tail = append(tail, l)
		}
	}}
	// the loop's own complaints (and the runtime's about it) say why it
	// ended otherwise than by its codes: the last few lines are kept
	var errTail []string
	ew := &lineWriter{fn: func(l string) {
		if errTail = append(errTail, l); len(errTail) > 8 {
			errTail = errTail[1:]
		}
	}}
	x, err := c.ExecOutput(ctx, id, execID, true, lw, ew)
	if err == nil && x == nil {
		err = errors.New("the output stream ended before the loop did")
	}
	if err != nil {
		return nil, fmt.Errorf("hunt %s: follow the loop %s in %s (pick it up again with `sbx hunt --attach %s`): %w",
			o.Name, execID, id, o.Name, err)
	}
	code := -1
	if x.ExitCode != nil {
		code = *x.ExitCode
	}
	switch code {
	case 0:
		o.emit(HuntEvent{Event: "nofailure", Sandbox: id, Message: fmt.Sprintf("no run failed in %d runs", s.Runs)})
		if err := deleteAll(ctx, c, []string{id}); err != nil {
			return nil, fmt.Errorf("hunt %s: %w", o.Name, err)
		}
		o.emit(HuntEvent{Event: "deleted", Sandbox: id})
		return s, nil
	case loopFailed:
		return capture(ctx, c, s, o)
	case loopFrozen:
		return captureFrozen(ctx, c, s, o, frozen)
	default:
		err := fmt.Errorf("hunt %s: the loop in %s ended with exit %d%s (the sandbox is kept for a look): %s",
			o.Name, id, code, signalled(code), strings.Join(append(tail, errTail...), "; "))
		switch code {
		case loopSetupFailed:
			err = fmt.Errorf("hunt %s: the setup failed in %s (its output is %s/setup.out there; the sandbox is kept): %s",
				o.Name, id, HuntDir, strings.Join(tail, "; "))
		}
		return nil, err
	}
}

// signalled names the signal of a shell's exit code 128+N: a loop killed
// from outside, by the kernel or by the runtime, ends so.
func signalled(code int) string {
	if code <= 128 || code > 128+64 {
		return ""
	}
	name := cmp.Or(unix.SignalName(syscall.Signal(code-128)), "signal "+strconv.Itoa(code-128))
	return ", killed by " + name
}

// capture reads the failure's record and does the outside steps, in order:
// a disk fork, the evidence copied out, a disk snapshot, a stop with memory.
// Steps already done (by a hunt that was cut off) are not done again.
func capture(ctx context.Context, c HuntClient, s *HuntSummary, o *HuntOptions) (*HuntSummary, error) {
	ctx = context.WithoutCancel(ctx) // once started, finish: a half capture helps no one
	id := s.Sandbox
	s.Failed = true
	if err := readFailed(ctx, c, s); err != nil {
		return nil, fmt.Errorf("hunt %s: %w", o.Name, err)
	}

	// The fork's state is taken first; its child boots while the later
	// steps go, and is waited for at the end.
	fork := o.Name + "-fork"
	forked := func() error { return nil }
	if sb, err := c.Get(ctx, fork); err == nil {
		if sb.Parent != id {
			return nil, api.Errorf(api.ErrConflict, "hunt %s: the sandbox %s is in the way (not a fork of %s: an earlier hunt's?); delete it and run `sbx hunt --attach %s`", o.Name, fork, id, o.Name)
		}
		s.Fork = sb.Name
	} else {
		wait, err := forkCaptured(ctx, c, id, fork)
		if err != nil {
			return nil, fmt.Errorf("hunt %s: disk fork of %s: %w", o.Name, id, err)
		}
		forked = wait
		s.Fork = fork
	}
	o.emit(HuntEvent{Event: "fork", Sandbox: id, Fork: s.Fork})

	dir, err := filepath.Abs(o.OutDir)
	if err != nil {
		return nil, fmt.Errorf("hunt %s: %w", o.Name, err)
	}
	_, err = copyEvidence(ctx, c, id, dir)
	if err != nil {
		return nil, fmt.Errorf("hunt %s: copy the evidence to %s: %w", o.Name, dir, err)
	}
	s.Artifacts = dir
	o.emit(HuntEvent{Event: "artifacts", Sandbox: id, Path: dir})

	// a bundle that cannot be fetched is said, not fatal: the rest of the
	// capture matters more
	cr, err := crashOf(ctx, c, s, dir, o.OnCrash)
	switch {
	case err != nil:
		o.emit(HuntEvent{Event: "crash", Sandbox: id, Message: fmt.Sprintf("the run crashed but its bundle was not written: %v (sbx crashes %s --bundle DIR tries again)", err, id)})
	case cr != nil:
		s.Crash = cr
		o.emit(HuntEvent{Event: "crash", Sandbox: id, Path: cr.Dir, Message: cr.SignalName})
	}

	if err := snapshotOnce(ctx, c, id, o.Name); err != nil {
		return nil, fmt.Errorf("hunt %s: %w", o.Name, err)
	}
	s.Snapshot = o.Name
	o.emit(HuntEvent{Event: "snapshot", Sandbox: id, Snapshot: s.Snapshot})

	stopErr := func() error {
		_, err := c.Stop(ctx, id, true)
		return err
	}()
	forkErr := forked()
	if stopErr != nil {
		return nil, errors.Join(fmt.Errorf("hunt %s: stop %s: %w", o.Name, id, stopErr), forkErr)
	}
	s.Stopped = true
	if !s.FailedAt.IsZero() {
		s.CaptureMs = time.Since(s.FailedAt).Milliseconds()
	}
	o.emit(HuntEvent{Event: "stopped", Sandbox: id})
	if forkErr != nil {
		// the evidence, the snapshot and the stopped machine are kept
		return nil, fmt.Errorf("hunt %s: the disk fork %s failed after its state was taken (all else is captured): %w", o.Name, fork, forkErr)
	}
	s.Commands = commands(o, s)
	return s, nil
}

// leftBy lists what a hunt named name leaves behind that is there: its
// disk snapshot, its fork, its frozen copy.
func leftBy(ctx context.Context, c HuntClient, name string) []string {
	var in []string
	if _, err := c.GetSnapshot(ctx, name); err == nil {
		in = append(in, "the snapshot "+name)
	}
	for _, n := range []string{name + "-fork", name + "-frozen"} {
		if _, err := c.Get(ctx, n); err == nil {
			in = append(in, "the sandbox "+n)
		}
	}
	return in
}

// snapshotOnce takes the disk snapshot name of id, unless id's is there
// already (a capture taken up again); another sandbox's is a conflict.
func snapshotOnce(ctx context.Context, c HuntClient, id, name string) error {
	sn, err := c.GetSnapshot(ctx, name)
	if err == nil {
		if sn.SandboxID != id {
			return api.Errorf(api.ErrConflict, "the snapshot %s is in the way (of %s, not %s: an earlier hunt's?); delete it and run `sbx hunt --attach %s`", name, sn.SandboxID, id, name)
		}
		return nil
	}
	if _, err := c.Snapshot(ctx, id, name, false); err != nil {
		return fmt.Errorf("snapshot %s: %w", id, err)
	}
	return nil
}

// forkCaptured starts a disk fork of id named name and returns once the
// parent's state is taken, with a function that waits for the fork to end
// and returns its error. A fork that fails before its state is taken is
// the error.
func forkCaptured(ctx context.Context, c HuntClient, id, name string) (wait func() error, err error) {
	captured := make(chan struct{})
	done := make(chan error, 1)
	var once sync.Once
	saw := false // written before captured is closed, read after
	go func() {
		err := c.ForkEvents(ctx, id, api.ForkRequest{Name: name, Count: 1}, func(ev api.ForkEvent) error {
			if ev.Event == "sandbox.captured" {
				once.Do(func() {
					saw = true
					close(captured)
				})
			}
			return nil
		})
		done <- err
		once.Do(func() { close(captured) }) // ended first: failed, or a server without the event
	}()
	<-captured
	if !saw {
		if err := <-done; err != nil {
			return nil, err
		}
		return func() error { return nil }, nil
	}
	return func() error { return <-done }, nil
}

// crashLister is what finding a hunt's crash needs beyond HuntClient
// (SDK has it).
type crashLister interface {
	Crashes(ctx context.Context, id string) ([]client.Crash, error)
}

// crashOf writes the bundle of the crash the sandbox caught during the
// failing run into dir/crash, with onCrash: the last crash caught before
// the failure (the loop ends at the first run in which a process crashed,
// and one crash is caught per boot). Nil when none was.
func crashOf(ctx context.Context, c HuntClient, s *HuntSummary, dir string, onCrash bool) (*Crash, error) {
	if !onCrash {
		return nil, nil
	}
	cl, ok := c.(crashLister)
	cc, ok2 := c.(CopyClient)
	if !ok || !ok2 {
		return nil, errors.New("this client cannot list crashes")
	}
	crs, err := cl.Crashes(ctx, s.Sandbox)
	if err != nil {
		return nil, err
	}
	cr, ok := huntCrash(crs, s.FailedAt)
	if !ok {
		return nil, nil
	}
	b, err := CrashBundle(ctx, cc, cr, filepath.Join(dir, "crash"))
	if err != nil {
		return nil, fmt.Errorf("the bundle of the crash of %d (%s): %w", cr.Pid, cr.Snapshot, err)
	}
	return b, nil
}

// huntCrash picks the failing run's crash: the last one caught at or
// before failedAt (with a little slack for two clocks), any if failedAt is
// unknown.
func huntCrash(crs []client.Crash, failedAt time.Time) (client.Crash, bool) {
	for i := len(crs) - 1; i >= 0; i-- {
		if failedAt.IsZero() || !crs[i].At.After(failedAt.Add(2*time.Second)) {
			return crs[i], true
		}
	}
	return client.Crash{}, false
}

// commands are what to type next: resume, fork, replay.
func commands(o *HuntOptions, s *HuntSummary) []string {
	seed := "SEED"
	if s != nil && s.Seed != "" {
		seed = s.Seed
	}
	line := o.testLine
	if line == "" {
		line = shellJoin(o.Cmd)
	}
	test := "cd /work && " + line
	return []string{
		"sbx resume " + o.Name,
		"sbx new --from " + o.Name,
		fmt.Sprintf("sbx replay %s --seed %s --seed-env %s -- %s", o.Name, seed, o.SeedEnv, shellQuote(test)),
	}
}

// readFailed fills s from the loop's marker file HuntDir/failed.
func readFailed(ctx context.Context, c HuntClient, s *HuntSummary) error {
	rc, err := c.ReadFile(ctx, s.Sandbox, HuntDir+"/failed")
	if err != nil {
		return fmt.Errorf("read %s/failed in %s: %w", HuntDir, s.Sandbox, err)
	}
	defer rc.Close()
	return parseFailed(io.LimitReader(rc, 64<<10), s)
}

// parseFailed reads the marker file's key=value lines into s.
func parseFailed(r io.Reader, s *HuntSummary) error {
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		k, v, _ := strings.Cut(sc.Text(), "=")
		switch k {
		case "run":
			s.Run, _ = strconv.Atoi(v)
			s.Runs = s.Run
		case "seed":
			s.Seed = v
		case "exit":
			s.ExitCode, _ = strconv.Atoi(v)
		case "time":
			s.FailedAt = parseEpoch(v)
		case "timedout":
			s.TimedOut = v == "1"
		}
	}
	return sc.Err()
}

// parseEpoch reads "1700000000.123456789" or "1700000000"; zero if neither.
func parseEpoch(v string) time.Time {
	sec, frac, _ := strings.Cut(strings.TrimSpace(v), ".")
	n, err := strconv.ParseInt(sec, 10, 64)
	if err != nil {
		return time.Time{}
	}
	var ns int64
	if frac != "" {
		frac = (frac + "000000000")[:9]
		ns, _ = strconv.ParseInt(frac, 10, 64)
	}
	return time.Unix(n, ns).UTC()
}

// What the evidence may bring out of the sandbox, which may be hostile or
// running away: all files together, one file, and how many.
var (
	maxEvidenceBytes int64 = 2 << 30
	maxEvidenceFile  int64 = 512 << 20
	maxEvidenceFiles       = 10000
)

// maxCutNoted bounds the lines of TRUNCATED.txt (the rest are counted),
// and maxNotedName the bytes of a name on one: what a sandbox leaves out
// must not cost the host its names, however many and long.
const (
	maxCutNoted  = 1000
	maxNotedName = 256
)

// shortName is name as TRUNCATED.txt gives it: at most maxNotedName bytes.
func shortName(name string) string {
	if len(name) <= maxNotedName {
		return name
	}
	return name[:maxNotedName] + "..."
}

// readHead reads at most max bytes of the local file p: a file the
// sandbox made may be sparse and huge.
func readHead(p string, max int64) ([]byte, error) {
	f, err := os.Open(p)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return io.ReadAll(io.LimitReader(f, max))
}

// copyEvidence extracts a tar of HuntDir into dir (made if missing),
// dropping the tar's top directory, and returns the names of the files it
// wrote (slash-separated, relative to dir). It holds to maxEvidenceFiles
// files, maxEvidenceFile bytes each and maxEvidenceBytes in all: what goes
// past is left out (a file cut short is noted), and TRUNCATED.txt in dir
// says what.
func copyEvidence(ctx context.Context, c HuntClient, id, dir string) (map[string]bool, error) {
	rc, err := c.ReadTar(ctx, id, HuntDir)
	if err != nil {
		return nil, err
	}
	defer rc.Close()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	// Every write goes through an os.Root of dir: whatever the sandbox's tar
	// names, nothing lands outside it, even through a symlink in dir.
	root, err := os.OpenRoot(dir)
	if err != nil {
		return nil, err
	}
	defer root.Close()
	copied := map[string]bool{}
	var total int64
	var cut []string
	more := 0 // cut short or left out past maxCutNoted: only counted
	note := func(line string) {
		if len(cut) >= maxCutNoted {
			more++
			return
		}
		cut = append(cut, line)
	}
	tr := tar.NewReader(rc)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return nil, err
		}
		name := strings.TrimPrefix(filepath.ToSlash(filepath.Clean(h.Name)), "/")
		if _, rest, ok := strings.Cut(name, "/"); ok {
			name = rest
		} else {
			continue // the top directory itself
		}
		if name == "" || name == ".." || strings.HasPrefix(name, "../") {
			continue
		}
		target := filepath.FromSlash(name)
		switch h.Typeflag {
		case tar.TypeDir:
			if err := root.MkdirAll(target, 0o755); err != nil {
				return nil, err
			}
		case tar.TypeReg:
			if len(copied) >= maxEvidenceFiles || total >= maxEvidenceBytes {
				note(shortName(name) + " (left out)")
				continue
			}
			if err := root.MkdirAll(filepath.Dir(target), 0o755); err != nil {
				return nil, err
			}
			if copied[name] {
				continue // named twice: the first is the evidence
			}
			f, err := root.OpenFile(target, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o644)
			if err != nil {
				return nil, err
			}
			keep := min(h.Size, maxEvidenceFile, maxEvidenceBytes-total)
			n, err := io.Copy(f, io.LimitReader(tr, keep))
			total += n
			if cerr := f.Close(); err == nil {
				err = cerr
			}
			if err != nil {
				return nil, err
			}
			if h.Size > n {
				note(fmt.Sprintf("%s (%d of %d bytes kept)", shortName(name), n, h.Size))
			}
			copied[name] = true
		}
	}
	if len(cut) > 0 {
		text := fmt.Sprintf("The evidence holds at most %d files, %d MiB each and %d MiB in all; left out or cut short:\n%s\n",
			maxEvidenceFiles, maxEvidenceFile>>20, maxEvidenceBytes>>20, strings.Join(cut, "\n"))
		if more > 0 {
			text += fmt.Sprintf("and %d more\n", more)
		}
		if err := root.WriteFile("TRUNCATED.txt", []byte(text), 0o644); err != nil {
			return nil, err
		}
	}
	return copied, nil
}
