// Package runsc is the only package that runs runsc: bundles, specs and every
// runsc call go through it.
//
// The runsc command line is the engine's only stable contract, so every call
// goes through one function (Driver.run) that sets the timeout, captures
// stderr and names the verb and the sandbox in its error.
package runsc

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"sbx.dev/sbx/internal/procfs"
)

// DefaultTimeout bounds every runsc call that is not a long-running process.
const DefaultTimeout = 60 * time.Second

// Driver runs one runsc binary against one state root.
type Driver struct {
	// Path is the runsc binary.
	Path string
	// Root is runsc's state directory (--root); one per sbxd.
	Root string
	// Flags are extra global flags given to every call (tests add --debug).
	Flags []string
	// LogFile, if set, names the file where runsc writes its own errors for
	// a sandbox (--log), appended to by every call about that sandbox; ""
	// for none (for instance once the sandbox's directory is gone).
	LogFile func(id string) string
	// ShimBinary is the program run as a shim with ShimArg (default: this
	// process's own binary, whose main must call ShimMain); ShimEnv is
	// added to its environment.
	ShimBinary string
	ShimEnv    []string
	// ExecChannel sends execs over the channel each sandbox's init keeps
	// open (channel.go), and gives runsc --host-uds=open so that it can.
	ExecChannel bool

	channels channelTable
}

// logFlag is --log for calls about sandbox id.
func (d *Driver) logFlag(id string) []string {
	if d.LogFile == nil || id == "" {
		return nil
	}
	if f := d.LogFile(id); f != "" {
		return []string{"--log", f}
	}
	return nil
}

// Error is a failed runsc call. It unwraps to the underlying exec error.
type Error struct {
	Verb   string
	ID     string
	Err    error
	Stderr string
}

func (e *Error) Error() string {
	if e.Stderr == "" {
		return fmt.Sprintf("runsc %s %s: %v", e.Verb, e.ID, e.Err)
	}
	return fmt.Sprintf("runsc %s %s: %v: %s", e.Verb, e.ID, e.Err, e.Stderr)
}

func (e *Error) Unwrap() error { return e.Err }

// ErrNotExist is wrapped by errors of calls on a sandbox runsc does not know.
var ErrNotExist = errors.New("sandbox does not exist in runsc")

// gone reports whether runsc's stderr says the sandbox is not there: never
// made, deleted, or half deleted (its state file gone while a delete was
// cut short).
func gone(stderr string) bool {
	s := strings.ToLower(stderr)
	switch {
	case strings.Contains(s, "does not exist"), strings.Contains(s, "no such container"), strings.Contains(s, "cannot find"):
		return true
	case strings.Contains(s, "loading container") && strings.Contains(s, "no such file or directory"):
		// "FetchSpec failed: loading container: open .../<id>_sandbox:<id>.state: no such file or directory"
		return true
	}
	return false
}

// Proc names one runsc process: its pid and its start time (in clock
// ticks since boot, from /proc), so that a reused pid is not taken for it.
type Proc struct {
	Pid   int    `json:"pid"`
	Start string `json:"start"`
}

// Alive reports whether the process still runs (a zombie does not).
func (p Proc) Alive() bool {
	return p.Pid > 0 && p.Start != "" && ProcessStart(p.Pid) == p.Start
}

// ProcessStart returns the start time of pid from /proc, or "" if it is
// gone or a zombie.
func ProcessStart(pid int) string {
	st, err := procfs.ReadStat(pid)
	if err != nil || st.Gone() {
		return ""
	}
	return st.Start
}

type startedKey struct{}

// WithStarted returns a context whose runsc calls report each runsc process
// they start to fn, before waiting for it: a journal records capture
// processes so that a restarted sbxd waits for its own and nobody else's.
func WithStarted(ctx context.Context, fn func(Proc)) context.Context {
	return context.WithValue(ctx, startedKey{}, fn)
}

type timeoutKey struct{}

// WithTimeout returns a context whose short runsc calls may each run for
// d instead of DefaultTimeout: a checkpoint's time grows with the memory
// it writes, and a capture killed by a timeout is a capture lost.
func WithTimeout(ctx context.Context, d time.Duration) context.Context {
	return context.WithValue(ctx, timeoutKey{}, d)
}

// CallTimeout is how long one short runsc call under ctx may run.
func CallTimeout(ctx context.Context) time.Duration {
	if d, ok := ctx.Value(timeoutKey{}).(time.Duration); ok && d > 0 {
		return d
	}
	return DefaultTimeout
}

func (d *Driver) globalArgs() []string {
	args := []string{"--root", d.Root}
	if d.ExecChannel {
		// init may connect to the host's unix sockets in its mounts: the
		// channel's, the only one there (its directory is root's alone)
		args = append(args, "--host-uds=open")
	}
	return append(args, d.Flags...)
}

// Command returns the exec.Cmd for `runsc [global] verb args...` for callers
// that manage a long-running runsc process themselves (exec). Its stdio is
// the caller's to set.
func (d *Driver) Command(ctx context.Context, verb string, global []string, args ...string) *exec.Cmd {
	all := append(d.globalArgs(), global...)
	all = append(all, verb)
	all = append(all, args...)
	cmd := exec.CommandContext(ctx, d.Path, all...)
	cmd.WaitDelay = 5 * time.Second
	return cmd
}

// run runs one short runsc call and returns its stdout. It is the chokepoint
// for every short call: a timeout, stderr captured, verb and id in the error.
func (d *Driver) run(ctx context.Context, global []string, verb, id string, args ...string) ([]byte, error) {
	return d.runFiles(ctx, global, nil, verb, id, args...)
}

// runFiles is run with files given to runsc as fds 3 and up, closed in this
// process once runsc has them.
func (d *Driver) runFiles(ctx context.Context, global []string, files []*os.File, verb, id string, args ...string) ([]byte, error) {
	timeout := CallTimeout(ctx)
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	cmd := d.Command(ctx, verb, append(d.logFlag(id), global...), args...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout = &stdout
	cmd.Stderr = &stderr
	cmd.ExtraFiles = files
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	err := cmd.Start()
	for _, f := range files {
		f.Close()
	}
	if err != nil {
		return nil, &Error{Verb: verb, ID: id, Err: err, Stderr: tail(stderr.Bytes())}
	}
	if started, ok := ctx.Value(startedKey{}).(func(Proc)); ok {
		started(Proc{Pid: cmd.Process.Pid, Start: ProcessStart(cmd.Process.Pid)})
	}
	if err := cmd.Wait(); err != nil {
		if ctx.Err() != nil {
			err = fmt.Errorf("%w (timed out after %s)", err, timeout)
		}
		msg := tail(stderr.Bytes())
		if gone(stderr.String()) {
			err = fmt.Errorf("%w: %w", ErrNotExist, err)
		}
		return stdout.Bytes(), &Error{Verb: verb, ID: id, Err: err, Stderr: msg}
	}
	return stdout.Bytes(), nil
}

// tail returns what runsc's stderr says about why it failed: its own
// messages, without the stack traces a crash prints, the lines that name a
// failure first.
func tail(b []byte) string {
	var all, failures []string
	for _, line := range strings.Split(string(b), "\n") {
		t := strings.TrimSpace(line)
		switch {
		case t == "", strings.HasPrefix(line, "\t"), strings.HasPrefix(t, "goroutine "),
			strings.HasPrefix(t, "created by "), strings.Contains(t, ".go:"), isFrame(t):
			continue
		}
		all = append(all, t)
		l := strings.ToLower(t)
		if strings.Contains(l, "fail") || strings.Contains(l, "error") || strings.Contains(l, "panic") || strings.Contains(l, "no space") {
			failures = append(failures, t)
		}
	}
	// The first failure is the cause; what follows is its consequences.
	pick := failures
	if len(pick) > 2 {
		pick = pick[:2]
	}
	if len(pick) == 0 {
		pick = all
		if len(pick) > 3 {
			pick = pick[len(pick)-3:]
		}
	}
	s := strings.Join(pick, "; ")
	const max = 600
	if len(s) > max {
		s = "..." + s[len(s)-max:]
	}
	return s
}

// isFrame reports whether a line is a Go stack frame ("pkg.F(0x1, ...)").
func isFrame(t string) bool {
	i := strings.IndexByte(t, '(')
	return i > 0 && strings.HasSuffix(t, ")") && !strings.ContainsAny(t[:i], " :")
}

// RunOptions says how to start a sandbox.
type RunOptions struct {
	// Bundle is the OCI bundle directory holding config.json.
	Bundle string
	// Console is the file that keeps the first process's stdout and stderr
	// (and runsc's own messages at start), through a console shim that
	// keeps ConsoleHead bytes and then the last ConsoleTail (0: the
	// default output budget).
	Console                  string
	ConsoleHead, ConsoleTail int64
	// Overlay is the directory backing the root overlay's upper layer.
	Overlay string
	// OverlaySize caps the upper layer, in bytes: past it the sandbox's
	// writes fail with ENOSPC (0: no cap).
	OverlaySize int64
	// Network is "" (the interfaces of the spec's network namespace) or
	// NetworkNone (loopback only, in a namespace of runsc's own).
	Network string
	// FreezeDir holds the sandbox's freeze slots; the console shim writes
	// the verdicts of freezes there (see package freezewire).
	FreezeDir string
	// PodInitConfig, if set, is runsc's --pod-init-config: the runtime
	// monitoring session (points and sink) the sandbox starts with.
	PodInitConfig string
	// Channel is the host directory bound at agentwire.ChannelDir (the
	// spec's SpecOptions.ChannelDir): with ExecChannel, the driver listens
	// there for the sandbox's init before it starts.
	Channel string
	// PIDFile, if set, is where runsc writes the sandbox process's pid
	// once it runs: read by BootedProcess, it spares a `runsc state`
	// (a process start, tens of milliseconds) after every boot.
	PIDFile string
}

// NetworkNone is a sandbox without a network: loopback only.
const NetworkNone = "none"

// sandboxFlags are the global flags that shape a sandbox when it is created
// or restored. The rootfs tar annotation (a disk snapshot as the starting
// upper layer) is only honoured with its flag.
func sandboxFlags(o RunOptions) []string {
	network := "--network=sandbox"
	if o.Network == NetworkNone {
		network = "--network=none"
	}
	overlay := "--overlay2=root:dir=" + o.Overlay
	if o.OverlaySize > 0 {
		overlay += fmt.Sprintf(",size=%d", o.OverlaySize)
	}
	flags := []string{
		network,
		overlay,
		"--allow-rootfs-tar-annotation",
		// sudo inside works (the sandbox, not its users, is the boundary)
		"--allow-suid",
	}
	if o.PodInitConfig != "" {
		flags = append(flags, "--pod-init-config="+o.PodInitConfig)
	}
	return flags
}

// Run creates and starts sandbox id detached. The first process's stdio is
// a pipe to a console shim (never a pipe that sbxd waits on: a detached
// runsc keeps what it was given, and outlives sbxd).
func (d *Driver) Run(ctx context.Context, id string, o RunOptions) error {
	return d.start(ctx, "run", id, o, nil, []string{"--detach", "--bundle", o.Bundle, id})
}

// start runs `runsc run` or `runsc restore` of a detached sandbox, its
// console going to a console shim.
func (d *Driver) start(ctx context.Context, verb, id string, o RunOptions, global, args []string) error {
	ctx, cancel := context.WithTimeout(ctx, CallTimeout(ctx))
	defer cancel()
	// init dials as soon as it runs: listen first. A channel that cannot
	// be opened leaves the execs to shims, as without one.
	_ = d.OpenChannel(id, o.Channel)
	if o.PIDFile != "" {
		// an earlier boot's must not name this one's process
		if err := os.Remove(o.PIDFile); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return &Error{Verb: verb, ID: id, Err: err}
		}
		args = append([]string{"--pid-file", o.PIDFile}, args...)
	}
	cmd := d.Command(ctx, verb, append(append(d.logFlag(id), sandboxFlags(o)...), global...), args...)
	devnull, err := os.Open(os.DevNull)
	if err != nil {
		return err
	}
	defer devnull.Close()
	pr, pw, err := os.Pipe()
	if err != nil {
		return &Error{Verb: verb, ID: id, Err: err}
	}
	defer pw.Close()
	head, tailN := o.ConsoleHead, o.ConsoleTail
	if head == 0 {
		head, tailN = DefaultOutputHead, DefaultOutputTail
	}
	var before int64
	if fi, err := os.Stat(o.Console); err == nil {
		before = fi.Size()
	}
	shim, err := d.StartShim(ShimSpec{Kind: "console", Dir: filepath.Dir(o.Console), Console: o.Console, Head: head, Tail: tailN, FreezeDir: o.FreezeDir}, nil, pr)
	pr.Close()
	if err != nil {
		return &Error{Verb: verb, ID: id, Err: err}
	}
	go func() {
		for range shim.Events {
		}
	}()
	cmd.Stdin = devnull
	// stderr of runsc itself and of the first process share the console.
	cmd.Stdout, cmd.Stderr = pw, pw
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		return &Error{Verb: verb, ID: id, Err: err}
	}
	if started, ok := ctx.Value(startedKey{}).(func(Proc)); ok {
		started(Proc{Pid: cmd.Process.Pid, Start: ProcessStart(cmd.Process.Pid)})
	}
	if err := cmd.Wait(); err != nil {
		pw.Close()
		return &Error{Verb: verb, ID: id, Err: err, Stderr: consoleTail(o.Console, before)}
	}
	if verb == "restore" {
		d.expectDial(id) // its init redials now
	}
	return nil
}

// BootedProcess is the sandbox process of sandbox id whose pid runsc wrote
// to pidFile at its run or restore (RunOptions.PIDFile), if that process
// still runs and is runsc's sandbox process of id; ok is false otherwise
// (no file, a process gone, a pid reused), and `runsc state` must say.
func BootedProcess(pidFile, id string) (p Proc, ok bool) {
	b, err := os.ReadFile(pidFile)
	if err != nil {
		return Proc{}, false
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || pid <= 0 {
		return Proc{}, false
	}
	start := ProcessStart(pid)
	cmdline, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	if err != nil || start == "" {
		return Proc{}, false
	}
	// runsc-sandbox [flags] boot [flags] ID: its name, and id last
	args := strings.Split(strings.TrimSuffix(string(cmdline), "\x00"), "\x00")
	if args[0] != "runsc-sandbox" || args[len(args)-1] != id {
		return Proc{}, false
	}
	p = Proc{Pid: pid, Start: start}
	return p, p.Alive() // the same process still: read before the cmdline
}

// consoleTail returns what runsc wrote to the console after offset from,
// once the console shim has caught up with it.
func consoleTail(path string, from int64) string {
	var last int64 = -1
	for deadline := time.Now().Add(time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		fi, err := os.Stat(path)
		if err != nil {
			break
		}
		if fi.Size() == last {
			break
		}
		last = fi.Size()
	}
	f, err := os.Open(path)
	if err != nil {
		return ""
	}
	defer f.Close()
	return readTail(f, from)
}

// Checkpoint writes sandbox id's processes, memory and disk changes into
// imageDir, uncompressed (so a restore can load pages in the background).
// The sandbox is paused meanwhile; with leaveRunning it carries on after,
// else it ends once the image is written.
func (d *Driver) Checkpoint(ctx context.Context, id, imageDir string, leaveRunning bool) error {
	args := []string{"--image-path", imageDir, "--compression=none"}
	if leaveRunning {
		args = append(args, "--leave-running")
	}
	_, err := d.run(ctx, nil, "checkpoint", id, append(args, id)...)
	return err
}

// RestoreOptions says how to restore a sandbox from a checkpoint image.
type RestoreOptions struct {
	RunOptions
	ImageDir string
	// Background lets runsc return before every page is loaded.
	Background bool
	// PagesOnDemand loads each page of memory only when the sandbox uses
	// it (gVisor patch 10): what it never touches stays in the image,
	// which runsc reads for the sandbox's whole life, or until a capture
	// of it has loaded every page. Sandboxes restored from one image this
	// way hold only the memory each of them touched.
	PagesOnDemand bool
}

// Restore creates sandbox id from a checkpoint image, detached, and lets it
// carry on. The bundle's spec must match the checkpointed one in its mounts;
// the network namespace may be another one with the same addresses.
func (d *Driver) Restore(ctx context.Context, id string, o RestoreOptions) error {
	if err := keepImageCapabilities(o.Bundle, o.ImageDir); err != nil {
		return &Error{Verb: "restore", ID: id, Err: err}
	}
	args := []string{"--detach", "--bundle", o.Bundle, "--image-path", o.ImageDir}
	if o.Background {
		args = append(args, "--background")
	}
	var global []string
	if o.PagesOnDemand {
		global = append(global, "--restore-pages-on-demand")
	}
	return d.start(ctx, "restore", id, o.RunOptions, global, append(args, id))
}

// TarUpper writes sandbox id's disk changes (its root overlay's upper
// layer) as a tar to file, and at most max bytes of it (0: no bound): past
// them runsc's tar is cut off and the error wraps ErrTarTooBig, so that
// nothing a sandbox holds makes sbxd write more than its disk limit allows.
// runsc writes into a pipe that sbxd copies to the file.
func (d *Driver) TarUpper(ctx context.Context, id, file string, max int64) error {
	out, err := os.OpenFile(file, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o600)
	if err != nil {
		return &Error{Verb: "tar", ID: id, Err: err}
	}
	defer out.Close()
	pr, pw, err := os.Pipe()
	if err != nil {
		return &Error{Verb: "tar", ID: id, Err: err}
	}
	copied := make(chan error, 1)
	go func() {
		defer pr.Close() // a writer past the bound gets EPIPE
		copied <- copyAtMost(out, pr, max)
	}()
	_, err = d.runFiles(ctx, nil, []*os.File{pw}, "tar", id, "rootfs-upper", "--file", "/proc/self/fd/3", id)
	var cerr error
	select {
	case cerr = <-copied:
	case <-time.After(5 * time.Second):
		// runsc ended and the sandbox holds the pipe still: what it wrote is
		// not known to be whole
		pr.Close()
		cerr = <-copied
		if cerr == nil && err == nil {
			cerr = fmt.Errorf("the sandbox kept the tar's pipe open after runsc's tar ended")
		}
	}
	if errors.Is(cerr, ErrTarTooBig) {
		return &Error{Verb: "tar", ID: id, Err: cerr}
	}
	if err != nil {
		return err
	}
	if cerr != nil {
		return &Error{Verb: "tar", ID: id, Err: cerr}
	}
	return out.Sync()
}

// ErrTarTooBig is a disk tar that passed the bound it was given.
var ErrTarTooBig = errors.New("the disk's tar is larger than its bound")

// copyAtMost copies r to w, at most max bytes (0: any); more is ErrTarTooBig.
func copyAtMost(w io.Writer, r io.Reader, max int64) error {
	if max <= 0 {
		_, err := io.Copy(w, r)
		return err
	}
	n, err := io.Copy(w, io.LimitReader(r, max+1))
	if err != nil {
		return err
	}
	if n > max {
		return fmt.Errorf("%w (%d bytes)", ErrTarTooBig, max)
	}
	return nil
}

// Status is the state runsc reports a sandbox in.
type Status string

// The statuses of runsc's `state` (runsc/container/status.go).
const (
	StatusCreating Status = "creating"
	StatusCreated  Status = "created"
	StatusRunning  Status = "running"
	StatusPaused   Status = "paused"
	StatusStopped  Status = "stopped"
)

// State is what runsc reports of a sandbox.
type State struct {
	ID     string `json:"id"`
	Pid    int    `json:"pid"`
	Status Status `json:"status"`
}

// Live reports whether the sandbox's processes exist (running or paused).
func (s State) Live() bool { return s.Status == StatusRunning || s.Status == StatusPaused }

// State returns runsc's view of sandbox id; the error wraps ErrNotExist when
// runsc does not know it.
func (d *Driver) State(ctx context.Context, id string) (State, error) {
	out, err := d.run(ctx, nil, "state", id, id)
	if err != nil {
		return State{}, err
	}
	var s State
	if err := json.Unmarshal(out, &s); err != nil {
		return State{}, fmt.Errorf("runsc state %s: decode: %w", id, err)
	}
	return s, nil
}

// List returns every sandbox in this root.
func (d *Driver) List(ctx context.Context) ([]State, error) {
	out, err := d.run(ctx, nil, "list", "", "--format", "json")
	if err != nil {
		return nil, err
	}
	var l []State
	if len(bytes.TrimSpace(out)) == 0 || bytes.Equal(bytes.TrimSpace(out), []byte("null")) {
		return nil, nil
	}
	if err := json.Unmarshal(out, &l); err != nil {
		return nil, fmt.Errorf("runsc list: decode: %w", err)
	}
	return l, nil
}

// Kill sends sig to every process of sandbox id.
func (d *Driver) Kill(ctx context.Context, id string, sig syscall.Signal) error {
	_, err := d.run(ctx, nil, "kill", id, "--all", id, fmt.Sprint(int(sig)))
	return err
}

// Pause stops every process of sandbox id where it is, until Resume.
func (d *Driver) Pause(ctx context.Context, id string) error {
	_, err := d.run(ctx, nil, "pause", id, id)
	return err
}

// Resume lets a paused sandbox run again.
func (d *Driver) Resume(ctx context.Context, id string) error {
	_, err := d.run(ctx, nil, "resume", id, id)
	return err
}

// Delete forcibly removes sandbox id; a sandbox runsc does not know is not an error.
func (d *Driver) Delete(ctx context.Context, id string) error {
	d.CloseChannel(id)
	_, err := d.run(ctx, nil, "delete", id, "--force", id)
	if errors.Is(err, ErrNotExist) {
		return nil
	}
	return err
}

// ExecOptions says how to run a process in a sandbox.
type ExecOptions struct {
	// Process is a process.json (see WriteProcess) that says everything
	// about the process; when set, Args, Env and Cwd are not used.
	Process string
	Args    []string
	Env     []string
	Cwd     string
	// InternalPidFile receives the process's pid inside the sandbox.
	InternalPidFile string
	// PassFDs are descriptors of the runsc process passed on, under the
	// same numbers, to the process in the sandbox.
	PassFDs []int
}

// ExecArgv is the command line of `runsc exec` of o in sandbox id, for a
// shim to run.
func (d *Driver) ExecArgv(id string, o ExecOptions) []string {
	return d.ExecCommand(context.Background(), id, o).Args
}

// ExecCommand returns the command that runs o.Args in sandbox id and exits
// with its exit code. The caller sets stdio (files or pipes) and waits.
func (d *Driver) ExecCommand(ctx context.Context, id string, o ExecOptions) *exec.Cmd {
	var args []string
	if o.Cwd != "" {
		args = append(args, "--cwd", o.Cwd)
	}
	for _, e := range o.Env {
		args = append(args, "--env", e)
	}
	if o.InternalPidFile != "" {
		args = append(args, "--internal-pid-file", o.InternalPidFile)
	}
	for _, fd := range o.PassFDs {
		args = append(args, "--pass-fd", fmt.Sprintf("%d:%d", fd, fd))
	}
	// No --log: runsc makes the log's directory if it is missing, and an
	// exec may run while its sandbox is deleted (execs are not serialized
	// with deletes); its own errors reach its caller on stderr.
	if o.Process != "" {
		args = append(args, "--process", o.Process, id)
		return d.Command(ctx, "exec", nil, args...)
	}
	args = append(args, id)
	args = append(args, o.Args...)
	return d.Command(ctx, "exec", nil, args...)
}

// Exec runs o.Args in sandbox id with the given stdio and returns its exit
// code. A runsc failure that is not the process's own exit is an *Error.
func (d *Driver) Exec(ctx context.Context, id string, o ExecOptions, stdin io.Reader, stdout, stderr io.Writer) (int, error) {
	cmd := d.ExecCommand(ctx, id, o)
	cmd.Stdin = stdin
	cmd.Stdout = stdout
	var errTail bytes.Buffer
	if stderr == nil {
		cmd.Stderr = &errTail
	} else {
		cmd.Stderr = io.MultiWriter(stderr, &limitedBuffer{b: &errTail, max: 4096})
	}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		return -1, &Error{Verb: "exec", ID: id, Err: err}
	}
	err := cmd.Wait()
	var ee *exec.ExitError
	if errors.As(err, &ee) && ee.Exited() && ctx.Err() == nil {
		return ee.ExitCode(), nil
	}
	if err != nil {
		if ctx.Err() != nil {
			err = fmt.Errorf("%w: %w", ctx.Err(), err)
		}
		return -1, &Error{Verb: "exec", ID: id, Err: err, Stderr: tail(errTail.Bytes())}
	}
	return 0, nil
}

type limitedBuffer struct {
	b   *bytes.Buffer
	max int
}

func (l *limitedBuffer) Write(p []byte) (int, error) {
	if room := l.max - l.b.Len(); room > 0 {
		if len(p) > room {
			l.b.Write(p[:room])
		} else {
			l.b.Write(p)
		}
	}
	return len(p), nil
}

// readTail returns runsc's failure from what f holds past offset from.
func readTail(f *os.File, from int64) string {
	end, err := f.Seek(0, io.SeekEnd)
	if err != nil || end <= from {
		return ""
	}
	if end-from > 4096 {
		from = end - 4096
	}
	b := make([]byte, end-from)
	n, _ := f.ReadAt(b, from)
	return tail(b[:n])
}
