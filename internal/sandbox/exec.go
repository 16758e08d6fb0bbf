package sandbox

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"sbx.dev/sbx/api"
	"sbx.dev/sbx/internal/runsc"
)

// An exec runs under a host-side shim: `sh -c` that runs `runsc exec` and
// then writes its exit code to a file. The shim has its own session, so an
// exec outlives the client and sbxd itself; its output goes straight from
// the sandbox into files, and the exit file tells a restarted sbxd how it
// ended. Inside the sandbox the agent enforces the timeout.
//
// The exit file is read only once the shim has ended (by sbxd's Wait, or
// by a restarted sbxd that saw the shim's process gone), so it needs no
// rename: an exec of mv would be on every exec's critical path.
const shimScript = `"$@"; echo $? > "$0"`

// execRun is an exec this sbxd is watching.
type execRun struct {
	dir  string
	done chan struct{} // closed once the exec has ended and is recorded

	mu   sync.Mutex
	exec api.Exec
}

func (r *execRun) snapshot() *api.Exec {
	r.mu.Lock()
	defer r.mu.Unlock()
	e := r.exec
	return &e
}

func (m *Manager) execDir(sandboxID, execID string) string {
	return filepath.Join(m.sandboxDir(sandboxID), "execs", execID)
}

// Exec starts a command in a running sandbox and returns at once with the
// exec recorded as running. Use Output to read what it writes and when it ends.
func (m *Manager) Exec(ctx context.Context, ref string, req api.ExecRequest) (*api.Exec, error) {
	if len(req.Cmd) == 0 || req.Cmd[0] == "" {
		return nil, api.Errorf(api.ErrInvalid, "cmd: give a command to run")
	}
	timeout, err := ParseDuration("timeout", req.Timeout)
	if err != nil {
		return nil, err
	}
	for _, e := range req.Env {
		if k, _, ok := strings.Cut(e, "="); !ok || k == "" {
			return nil, api.Errorf(api.ErrInvalid, "env: %q is not KEY=VALUE", e)
		}
	}
	if req.Cwd != "" && !strings.HasPrefix(req.Cwd, "/") {
		return nil, api.Errorf(api.ErrInvalid, "cwd: %q is not an absolute path", req.Cwd)
	}
	sb, err := m.running(ctx, ref)
	if err != nil {
		return nil, err
	}
	// Starting is serialized with the sandbox's lifecycle (a delete or stop
	// in between would pull the ground away); running is not.
	unlock := m.lock(sb.ID)
	defer unlock()
	if sb, err = m.running(ctx, sb.ID); err != nil {
		return nil, err
	}
	e := api.Exec{ID: newID("ex_"), SandboxID: sb.ID, Cmd: req.Cmd, State: api.ExecRunning, StartedAt: m.now(), Detached: req.Detach}
	dir := m.execDir(sb.ID, e.ID)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("exec in %s: %w", sb.ID, err)
	}
	var opts runsc.ExecOptions
	switch {
	case req.Detach:
		// The sandbox's init starts the command, so that it lives on
		// through stop and resume and is carried into memory captures
		// (gVisor kills what descends from a runsc exec on restore). The
		// exec'd agent only copies its output out, and can be replaced.
		args := append([]string{runsc.AgentPath, "spawn", "--id", e.ID, "--pid-fd", "3"}, agentFlags(timeout, req)...)
		opts = runsc.ExecOptions{Args: append(append(args, "--"), req.Cmd...), PassFDs: []int{3}}
	case timeout > 0:
		// The agent enforces the timeout inside the sandbox: it kills the
		// command's whole tree and exits 124.
		args := append([]string{runsc.AgentPath, "exec"}, agentFlags(timeout, req)...)
		opts = runsc.ExecOptions{Args: append(append(args, "--"), req.Cmd...), InternalPidFile: filepath.Join(dir, "pid")}
	default:
		// Without a timeout runsc starts the command itself: a second
		// execve inside gVisor would cost a third of the exec's time.
		opts = runsc.ExecOptions{Process: filepath.Join(dir, "process.json"), InternalPidFile: filepath.Join(dir, "pid")}
		if err := runsc.WriteProcess(opts.Process, runsc.Process(req.Cmd, req.Env, req.Cwd)); err != nil {
			return nil, fmt.Errorf("exec in %s: %w", sb.ID, err)
		}
	}
	if err := m.cfg.Store.CreateExec(ctx, &e, m.now()); err != nil {
		return nil, err
	}
	run := &execRun{dir: dir, done: make(chan struct{}), exec: e}
	if err := m.startShim(sb.ID, run, opts); err != nil {
		m.finishExec(context.WithoutCancel(ctx), run, -1)
		return nil, fmt.Errorf("exec in %s: start: %w", sb.ID, err)
	}
	if req.Detach {
		m.waitPid(run, 5*time.Second)
	}
	return run.snapshot(), nil
}

// agentFlags are the agent's flags for an exec's timeout, cwd and env.
func agentFlags(timeout time.Duration, req api.ExecRequest) []string {
	var args []string
	if timeout > 0 {
		args = append(args, "--timeout", timeout.String())
	}
	if req.Cwd != "" {
		args = append(args, "--cwd", req.Cwd)
	}
	for _, kv := range req.Env {
		args = append(args, "--env", kv)
	}
	return args
}

// startShim starts the host-side shim of an exec (or of a re-attach to a
// detached one) and watches it: its output goes to the exec's files, its
// end is recorded by finishExec.
func (m *Manager) startShim(sandboxID string, run *execRun, opts runsc.ExecOptions) error {
	dir := run.dir
	stdout, err := os.OpenFile(filepath.Join(dir, "stdout"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	defer stdout.Close()
	stderr, err := os.OpenFile(filepath.Join(dir, "stderr"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	defer stderr.Close()
	devnull, err := os.Open(os.DevNull)
	if err != nil {
		return err
	}
	defer devnull.Close()
	_ = os.Remove(filepath.Join(dir, "exit"))
	rc := m.cfg.Runtime.ExecCommand(context.Background(), sandboxID, opts)
	shim := newShim(filepath.Join(dir, "exit"), rc.Args)
	shim.Stdin, shim.Stdout, shim.Stderr = devnull, stdout, stderr
	if len(opts.PassFDs) > 0 {
		// fd 3 of the shim, and so of runsc, receives the command's pid.
		pid, err := os.OpenFile(filepath.Join(dir, "pid"), os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o600)
		if err != nil {
			return err
		}
		defer pid.Close()
		shim.ExtraFiles = []*os.File{pid}
	}
	if err := shim.Start(); err != nil {
		return err
	}
	_ = os.WriteFile(filepath.Join(dir, "shim.pid"), []byte(strconv.Itoa(shim.Process.Pid)), 0o600)
	m.mu.Lock()
	m.execs[run.exec.ID] = run
	m.mu.Unlock()
	go func() {
		_ = shim.Wait()
		m.shimEnded(run)
	}()
	return nil
}

// shimEnded records how an exec ended when its shim does. A detached exec
// whose sandbox is stopping or stopped has not ended: its command is frozen
// in the hibernation image, and a resume attaches to it again.
func (m *Manager) shimEnded(run *execRun) {
	ctx := context.Background()
	code := startFailure(run.dir, readExit(run.dir))
	if run.exec.Detached {
		sb, err := m.cfg.Store.Sandbox(ctx, run.exec.SandboxID)
		if err == nil && (sb.State == api.StateStopping || sb.State == api.StateStopped) {
			m.mu.Lock()
			delete(m.execs, run.exec.ID)
			m.mu.Unlock()
			close(run.done)
			return
		}
	}
	m.finishExec(ctx, run, code)
}

// reattach starts copying a detached exec's output out of a running sandbox
// again, from where the copy stopped: after a resume, or a restart of sbxd
// that found its copier gone.
func (m *Manager) reattach(ctx context.Context, e *api.Exec) error {
	dir := m.execDir(e.SandboxID, e.ID)
	size := func(name string) int64 {
		fi, err := os.Stat(filepath.Join(dir, name))
		if err != nil {
			return 0
		}
		return fi.Size()
	}
	args := []string{runsc.AgentPath, "attach", "--id", e.ID,
		"--stdout-offset", strconv.FormatInt(size("stdout"), 10), "--stderr-offset", strconv.FormatInt(size("stderr"), 10)}
	run := &execRun{dir: dir, done: make(chan struct{}), exec: *e}
	return m.startShim(e.SandboxID, run, runsc.ExecOptions{Args: args})
}

// loseDetached records the detached execs of a sandbox that booted from its
// disk instead of its memory: their commands are gone.
func (m *Manager) loseDetached(ctx context.Context, sandboxID string) {
	execs, err := m.cfg.Store.Execs(ctx, sandboxID)
	if err != nil {
		return
	}
	for _, e := range execs {
		if e.State == api.ExecRunning && e.Detached {
			m.finishExec(ctx, &execRun{dir: m.execDir(sandboxID, e.ID), done: make(chan struct{}), exec: *e}, -1)
		}
	}
}

// reattachAll re-attaches every detached exec of a sandbox still running.
func (m *Manager) reattachAll(ctx context.Context, sandboxID string) {
	execs, err := m.cfg.Store.Execs(ctx, sandboxID)
	if err != nil {
		m.log.Error("list execs to re-attach", "sandbox", sandboxID, "err", err)
		return
	}
	for _, e := range execs {
		if e.State != api.ExecRunning || !e.Detached {
			continue
		}
		m.mu.Lock()
		_, watched := m.execs[e.ID]
		m.mu.Unlock()
		if watched {
			continue
		}
		if err := m.reattach(ctx, e); err != nil {
			m.log.Error("re-attach to a detached exec", "exec", e.ID, "err", err)
		}
	}
}

func newShim(exitFile string, runscArgs []string) *exec.Cmd {
	args := append([]string{"-c", shimScript, exitFile}, runscArgs...)
	c := &exec.Cmd{}
	c.Path = "/bin/sh"
	c.Args = append([]string{"sh"}, args...)
	// Its own session: neither a signal to sbxd's group nor sbxd's death ends it.
	c.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	return c
}

// runscStartError is how runsc begins the one line it writes when it could
// not start the process at all.
const runscStartError = "executing processes for container: executing command "

// startFailure turns runsc's failure to start a command (exit 128 with its
// message as the exec's only stderr) into what a shell would say and exit
// with: 127 for a program not found, 126 for one that cannot be run, 1 for a
// missing working directory. Any other code passes through.
func startFailure(dir string, code int) int {
	if code != 128 {
		return code
	}
	path := filepath.Join(dir, "stderr")
	b, err := os.ReadFile(path)
	msg := strings.TrimSpace(string(b))
	if err != nil || !strings.HasPrefix(msg, runscStartError) || strings.Contains(msg, "\n") {
		return code
	}
	prog, _, _ := strings.Cut(strings.TrimPrefix(msg, runscStartError), " in sandbox")
	prog = strings.Trim(prog, `"`)
	var say string
	switch {
	case strings.Contains(msg, "initial working directory"):
		code, say = 1, "sbx: cwd: no such directory"
		if _, dir, ok := strings.Cut(msg, "initial working directory "); ok {
			d, _, _ := strings.Cut(dir, ":")
			say = "sbx: cwd " + strings.Trim(d, `"`) + ": no such directory"
		}
	case strings.Contains(msg, "error finding executable"), strings.Contains(msg, "no such file or directory"):
		code, say = 127, "sbx: "+prog+": command not found"
	case strings.Contains(msg, "permission denied"):
		code, say = 126, "sbx: "+prog+": permission denied"
	case strings.Contains(msg, "exec format error"):
		code, say = 126, "sbx: "+prog+": cannot execute: exec format error"
	default:
		return code
	}
	_ = os.WriteFile(path, []byte(say+"\n"), 0o600)
	return code
}

// readExit returns the exit code the shim recorded, or -1.
func readExit(dir string) int {
	b, err := os.ReadFile(filepath.Join(dir, "exit"))
	if err != nil {
		return -1
	}
	n, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		return -1
	}
	return n
}

func readPid(dir string) int {
	b, err := os.ReadFile(filepath.Join(dir, "pid"))
	if err != nil {
		return 0
	}
	n, _ := strconv.Atoi(strings.TrimSpace(string(b)))
	return n
}

// waitPid waits (bounded) until runsc has written the exec's pid inside the
// sandbox, or the exec has ended.
func (m *Manager) waitPid(run *execRun, limit time.Duration) {
	deadline := time.Now().Add(limit)
	for time.Now().Before(deadline) {
		if pid := readPid(run.dir); pid > 0 {
			run.mu.Lock()
			run.exec.Pid = pid
			run.mu.Unlock()
			return
		}
		select {
		case <-run.done:
			return
		case <-time.After(5 * time.Millisecond):
		}
	}
}

// finishExec records how an exec ended; code -1 means sbx cannot know.
func (m *Manager) finishExec(ctx context.Context, run *execRun, code int) {
	end := m.now()
	run.mu.Lock()
	if run.exec.Pid == 0 && run.dir != "" {
		run.exec.Pid = readPid(run.dir)
	}
	run.exec.EndedAt = &end
	if code < 0 {
		run.exec.State = api.ExecLost
	} else {
		run.exec.State = api.ExecExited
		run.exec.ExitCode = &code
		run.exec.TimedOut = code == 124
	}
	e := run.exec
	run.mu.Unlock()
	if err := m.cfg.Store.UpdateExec(ctx, &e, end); err != nil {
		m.log.Error("record exec end", "exec", e.ID, "err", err)
	}
	m.mu.Lock()
	delete(m.execs, e.ID)
	m.mu.Unlock()
	close(run.done)
}

// recoverExecs picks up the execs a previous sbxd left running: ended ones
// are recorded from their exit file, live ones are watched again, and
// detached ones whose copier is gone get a new one.
func (m *Manager) recoverExecs(ctx context.Context) error {
	execs, err := m.cfg.Store.Execs(ctx, "")
	if err != nil {
		return fmt.Errorf("recover execs: %w", err)
	}
	for _, e := range execs {
		dir := m.execDir(e.SandboxID, e.ID)
		run := &execRun{dir: dir, done: make(chan struct{}), exec: *e}
		b, _ := os.ReadFile(filepath.Join(dir, "shim.pid"))
		pid, _ := strconv.Atoi(strings.TrimSpace(string(b)))
		switch {
		case processAlive(pid, e.ID):
			m.mu.Lock()
			m.execs[e.ID] = run
			m.mu.Unlock()
			go func() {
				for processAlive(pid, e.ID) {
					time.Sleep(100 * time.Millisecond)
				}
				m.shimEnded(run)
			}()
		case e.Detached:
			sb, err := m.cfg.Store.Sandbox(ctx, e.SandboxID)
			if err != nil {
				m.finishExec(ctx, run, -1)
			} else if sb.State == api.StateReady {
				if err := m.reattach(ctx, e); err != nil {
					m.log.Error("re-attach to a detached exec", "exec", e.ID, "err", err)
				}
			}
			// stopped: frozen in the image; a resume attaches again.
		default:
			m.finishExec(ctx, run, startFailure(dir, readExit(dir)))
		}
	}
	return nil
}

// forgetExecs drops the watchers of a deleted sandbox's execs.
func (m *Manager) forgetExecs(sandboxID string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for id, run := range m.execs {
		if run.exec.SandboxID == sandboxID {
			delete(m.execs, id)
		}
	}
}

// Execs lists a sandbox's execs, oldest first.
func (m *Manager) Execs(ctx context.Context, ref string) ([]api.Exec, error) {
	sb, err := m.cfg.Store.Sandbox(ctx, ref)
	if err != nil {
		return nil, err
	}
	execs, err := m.cfg.Store.Execs(ctx, sb.ID)
	if err != nil {
		return nil, err
	}
	out := make([]api.Exec, 0, len(execs))
	for _, e := range execs {
		out = append(out, *m.liveExec(e))
	}
	return out, nil
}

// liveExec prefers the in-memory view of a running exec (it knows the pid).
func (m *Manager) liveExec(e *api.Exec) *api.Exec {
	m.mu.Lock()
	run, ok := m.execs[e.ID]
	m.mu.Unlock()
	if !ok {
		return e
	}
	s := run.snapshot()
	if s.Pid == 0 {
		s.Pid = readPid(run.dir)
	}
	return s
}

// GetExec returns one exec of a sandbox.
func (m *Manager) GetExec(ctx context.Context, ref, execID string) (*api.Exec, error) {
	sb, err := m.cfg.Store.Sandbox(ctx, ref)
	if err != nil {
		return nil, err
	}
	e, err := m.cfg.Store.Exec(ctx, sb.ID, execID)
	if err != nil {
		return nil, err
	}
	return m.liveExec(e), nil
}

// Output sends an exec's output from the start: what was kept, then, with
// follow, what comes, until the exec ends; then an "exit" event. Without
// follow it returns after the output kept so far (with "exit" only if the
// exec has ended). It returns when emit fails (the client went away).
func (m *Manager) Output(ctx context.Context, ref, execID string, follow bool, emit func(api.ExecEvent) error) error {
	sb, err := m.cfg.Store.Sandbox(ctx, ref)
	if err != nil {
		return err
	}
	if _, err := m.cfg.Store.Exec(ctx, sb.ID, execID); err != nil {
		return err
	}
	dir := m.execDir(sb.ID, execID)
	streams := []*tail{{name: "stdout", path: filepath.Join(dir, "stdout")}, {name: "stderr", path: filepath.Join(dir, "stderr")}}
	defer func() {
		for _, s := range streams {
			s.close()
		}
	}()
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		// The store says whether the exec has ended; the watcher's done
		// channel only wakes us early. Whatever was written before the end
		// is in the files by then.
		var done <-chan struct{}
		m.mu.Lock()
		if run, ok := m.execs[execID]; ok {
			done = run.done
		}
		m.mu.Unlock()
		cur, err := m.cfg.Store.Exec(context.WithoutCancel(ctx), sb.ID, execID)
		if err != nil {
			return err
		}
		ended := cur.State != api.ExecRunning
		n, err := drain(streams, ended, emit)
		if err != nil {
			return err
		}
		if ended {
			return emit(api.ExecEvent{Event: "exit", Exec: cur})
		}
		if n > 0 {
			continue
		}
		if !follow {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-done:
		case <-tick.C:
		}
	}
}

// tail reads a growing file from where it left off.
type tail struct {
	name string
	path string
	f    *os.File
	off  int64
}

// mayBeStartFailure reports whether b is, or begins, runsc's start failure.
func mayBeStartFailure(b []byte) bool {
	if len(b) < len(runscStartError) {
		return strings.HasPrefix(runscStartError, string(b))
	}
	return strings.HasPrefix(string(b), runscStartError)
}

func (t *tail) close() {
	if t.f != nil {
		t.f.Close()
	}
}

const chunkSize = 64 << 10

// drain emits whatever the streams have gained and returns how many bytes.
// Until the exec has ended it holds back a stderr that begins like runsc's
// own start failure: startFailure rewrites that one when the exec ends.
func drain(streams []*tail, ended bool, emit func(api.ExecEvent) error) (int, error) {
	total := 0
	buf := make([]byte, chunkSize)
	for _, s := range streams {
		if s.f == nil {
			f, err := os.Open(s.path)
			if errors.Is(err, os.ErrNotExist) {
				continue
			}
			if err != nil {
				return total, err
			}
			s.f = f
		}
		for {
			n, err := s.f.Read(buf)
			if n > 0 && !ended && s.name == "stderr" && s.off == 0 && mayBeStartFailure(buf[:n]) {
				_, serr := s.f.Seek(0, io.SeekStart)
				if serr != nil {
					return total, serr
				}
				break
			}
			s.off += int64(n)
			if n > 0 {
				total += n
				if eerr := emit(api.ExecEvent{Event: s.name, Data: append([]byte(nil), buf[:n]...)}); eerr != nil {
					return total, eerr
				}
			}
			if err == io.EOF || n == 0 {
				break
			}
			if err != nil {
				return total, err
			}
		}
	}
	return total, nil
}
