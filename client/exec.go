package client

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"syscall"
	"time"

	"sbx.dev/sbx/api"
)

// Result is what is known of an exec: how it ended, or that it still runs.
type Result struct {
	// ID names the exec in its sandbox: Sandbox.Process(ID) is a handle on it.
	ID        string
	SandboxID string
	Cmd       []string
	// State is api.ExecExited once it has ended with ExitCode, api.ExecLost
	// when sbx cannot know how it ended, api.ExecRunning while it runs.
	State api.ExecState
	// ExitCode is the command's exit code (128+N for a death by signal N);
	// -1 unless State is api.ExecExited.
	ExitCode int
	// TimedOut says the sandbox killed it at its WithTimeout (ExitCode 124).
	TimedOut bool
	// Pid is its process id inside the sandbox, once known.
	Pid       int
	StartedAt time.Time
	// EndedAt is zero while it runs.
	EndedAt time.Time
	// Crash, with WithOnCrash, is the crash of the command or of a process
	// it started, as the sandbox caught it (nil if none was caught).
	Crash *Crash
	// CrashMissed, with WithOnCrash, says why the command's death by a
	// signal that dumps core was not caught: the boot's one capture was
	// spent already (on the crash or freeze it names), or none was made.
	CrashMissed string
}

// Exited reports whether the exec has ended with an exit code.
func (r *Result) Exited() bool { return r != nil && r.State == api.ExecExited }

// API returns the exec as the API describes it (api.Exec: what sbx --json
// prints).
func (r *Result) API() *api.Exec {
	x := &api.Exec{ID: r.ID, SandboxID: r.SandboxID, Cmd: r.Cmd, State: r.State, Pid: r.Pid, TimedOut: r.TimedOut, StartedAt: r.StartedAt}
	if r.Exited() {
		code := r.ExitCode
		x.ExitCode = &code
	}
	if !r.EndedAt.IsZero() {
		end := r.EndedAt
		x.EndedAt = &end
	}
	return x
}

// resultOf converts the wire form.
func resultOf(x *api.Exec) *Result {
	r := &Result{ID: x.ID, SandboxID: x.SandboxID, Cmd: x.Cmd, State: x.State, ExitCode: -1,
		TimedOut: x.TimedOut, Pid: x.Pid, StartedAt: x.StartedAt}
	if x.ExitCode != nil {
		r.ExitCode = *x.ExitCode
	}
	if x.EndedAt != nil {
		r.EndedAt = *x.EndedAt
	}
	return r
}

// Shell returns the argv that runs line under /bin/sh -c, for shell syntax
// (pipes, &&, globs): Exec runs a command as it is given, with no shell.
func Shell(line string) []string { return []string{"/bin/sh", "-c", line} }

// Exec runs cmd in the sandbox and waits for it to end. Output goes where
// WithStdout, WithStderr and WithExecEvents say (else it is not read here;
// sbxd keeps it either way). A command that fails is no error: see
// Result.ExitCode.
//
// Cancelling ctx stops the waiting, not the command: it goes on in the
// sandbox, and Exec returns ctx's error with the Result known so far (its
// ID, State api.ExecRunning), so the command can be waited for again
// (Sandbox.Process(res.ID).Wait) or killed (Sandbox.Process(res.ID).Kill).
// For a limit the command cannot outlive, give WithTimeout: the sandbox
// enforces it.
//
// Errors before the command starts: api.ErrNotFound (no such sandbox),
// api.ErrConflict (it is not running), api.ErrInvalid (a bad option). A
// stream that breaks once it has started (sbxd went away) is a
// *StreamError naming the exec, returned with the Result known so far.
func (s *Sandbox) Exec(ctx context.Context, cmd []string, opts ...ExecOption) (*Result, error) {
	var cfg execConfig
	for _, o := range opts {
		o.applyExec(&cfg)
	}
	cfg.req.Cmd, cfg.req.Detach = cmd, false
	if err := cfg.req.Validate(); err != nil {
		return nil, err
	}
	before := -1
	if cfg.onCrash {
		n, err := s.checkCrashes(ctx, "exec")
		if err != nil {
			return nil, err
		}
		before = n
	}
	b, err := json.Marshal(&cfg.req)
	if err != nil {
		return nil, api.Errorf(api.ErrInvalid, "exec in %s: %v", s.id, err)
	}
	resp, err := s.c.send(ctx, request{
		method: http.MethodPost, path: s.path("exec"),
		body: bytes.NewReader(b), size: int64(len(b)),
		ctype: "application/json", accept: "text/event-stream",
	})
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	var started *api.Exec
	var w outputWriter
	w.cfg = cfg.out
	x, err := w.read(resp.Body, func(ev api.ExecEvent) {
		if ev.Event == api.ExecStarted && ev.Exec != nil {
			started = ev.Exec
		}
	})
	if err == nil {
		res := resultOf(x)
		if cfg.onCrash && res.Exited() {
			if err := s.findCrash(ctx, res, before); err != nil {
				return res, err
			}
		}
		return res, nil
	}
	var res *Result
	if started != nil {
		res = resultOf(started)
		res.State, res.ExitCode = api.ExecRunning, -1
	}
	return res, s.execError("exec", ctx, res, err)
}

// execError wraps the error of an exec's stream: ctx's own, a *StreamError
// naming the exec when the stream broke, else the error with the exec.
func (s *Sandbox) execError(op string, ctx context.Context, res *Result, err error) error {
	execID := ""
	if res != nil {
		execID = res.ID
	}
	switch {
	case errors.Is(err, errWriter):
		return errors.Unwrap(err)
	case ctx.Err() != nil && execID != "":
		return fmt.Errorf("%s %s in %s: stopped waiting; the command goes on: %w", op, execID, s.id, ctx.Err())
	case ctx.Err() != nil:
		return fmt.Errorf("%s in %s: %w", op, s.id, ctx.Err())
	case errors.Is(err, errNoExit) || isBroken(err) || errors.Is(err, api.ErrUnavailable):
		return &StreamError{Op: op, SandboxID: s.id, ExecID: execID, Err: brokenCause(unwrapNoExit(err))}
	case execID != "":
		return fmt.Errorf("%s %s in %s: %w", op, execID, s.id, err)
	}
	return fmt.Errorf("%s in %s: %w", op, s.id, err)
}

// errNoExit is a stream that ended before its exec's exit event.
var errNoExit = errors.New("the stream ended before the exec's exit")

func unwrapNoExit(err error) error {
	if errors.Is(err, errNoExit) {
		return io.ErrUnexpectedEOF
	}
	return err
}

// errWriter marks an error from a caller's writer or handler, which is
// returned as it is.
var errWriter = errors.New("writer")

type writerError struct{ err error }

func (e *writerError) Error() string   { return e.err.Error() }
func (e *writerError) Unwrap() error   { return e.err }
func (e *writerError) Is(t error) bool { return t == errWriter }

// outputWriter hands an exec stream's events to a caller, skipping the
// output bytes it has already handed over (skip), so a wait that starts
// again from the start delivers each byte once.
type outputWriter struct {
	cfg  outputConfig
	skip [2]int64 // bytes of stdout, stderr already delivered
	seen [2]int64 // bytes of stdout, stderr read in this stream
}

// read hands each event of the stream r to the writers (and to peek) and
// returns the Exec of its "exit" event. A stream that ends without one is
// errNoExit (or a *brokenError); an "error" event is its error; an error
// from a writer is a writerError.
func (o *outputWriter) read(r io.Reader, peek func(api.ExecEvent)) (*api.Exec, error) {
	var x *api.Exec
	end, err := readStream(r, func(name string, ev api.ExecEvent) (bool, error) {
		if name != "" {
			ev.Event = name // the SSE event name is authoritative
		}
		if peek != nil {
			peek(ev)
		}
		if ev.Event == api.ExecStdout || ev.Event == api.ExecStderr {
			i := 0
			if ev.Event == api.ExecStderr {
				i = 1
			}
			// what an earlier stream delivered is not delivered again
			from := o.seen[i]
			o.seen[i] += int64(len(ev.Data))
			if cut := o.skip[i] - from; cut > 0 {
				if cut >= int64(len(ev.Data)) {
					return false, nil
				}
				ev.Data = ev.Data[cut:]
			}
			o.skip[i] = max(o.skip[i], o.seen[i])
		}
		if err := o.deliver(ev); err != nil {
			return false, &writerError{err}
		}
		if ev.Event != api.ExecExit {
			return false, nil
		}
		if ev.Exec == nil {
			return false, errors.New("exit event without the exec")
		}
		x = ev.Exec
		return true, nil
	})
	if err != nil {
		return nil, err
	}
	if x == nil && end == streamCut {
		return nil, errNoExit
	}
	return x, nil
}

func (o *outputWriter) deliver(ev api.ExecEvent) error {
	if o.cfg.events != nil {
		if err := o.cfg.events(ev); err != nil {
			return err
		}
	}
	var w io.Writer
	switch ev.Event {
	case api.ExecStdout:
		w = o.cfg.stdout
	case api.ExecStderr:
		w = o.cfg.stderr
	}
	if w == nil {
		return nil
	}
	_, err := w.Write(ev.Data)
	return err
}

// Process is one exec in a sandbox: a command Start started, or one named
// by Sandbox.Process. Its methods are calls to sbxd; it is safe for
// concurrent use, except that Wait calls should not overlap.
type Process struct {
	// ID names the exec in its sandbox ("ex_...").
	ID        string
	SandboxID string
	// Pid is its process id inside the sandbox, when Start knew it (else 0).
	Pid int

	sb  *Sandbox
	out outputWriter
}

// Process returns a handle on exec execID of the sandbox (as Result.ID or
// Execs name it). Making one asks nothing of sbxd.
func (s *Sandbox) Process(execID string) *Process {
	return &Process{ID: execID, SandboxID: s.id, sb: s}
}

// Start starts cmd in the sandbox and returns at once, with the command's
// id (and its pid when it is known within a few seconds). The command
// outlives the client; sbxd keeps its output. WithStdout, WithStderr and
// WithExecEvents given here are where the Process's Wait sends the output.
// Errors are those of Exec before the command starts.
func (s *Sandbox) Start(ctx context.Context, cmd []string, opts ...ExecOption) (*Process, error) {
	var cfg execConfig
	for _, o := range opts {
		o.applyExec(&cfg)
	}
	cfg.req.Cmd, cfg.req.Detach = cmd, true
	if cfg.onCrash {
		if _, err := s.checkCrashes(ctx, "start"); err != nil {
			return nil, err
		}
	}
	var x api.Exec
	if err := s.c.call(ctx, http.MethodPost, s.path("exec"), nil, &cfg.req, &x); err != nil {
		return nil, err
	}
	p := s.Process(x.ID)
	p.Pid = x.Pid
	p.out.cfg = cfg.out
	return p, nil
}

// Execs lists the sandbox's execs, ended ones included, oldest first.
func (s *Sandbox) Execs(ctx context.Context) ([]api.Exec, error) {
	var xs []api.Exec
	if err := s.c.call(ctx, http.MethodGet, s.path("execs"), nil, nil, &xs); err != nil {
		return nil, err
	}
	return xs, nil
}

// path is the escaped path of the exec, plus any suffix.
func (p *Process) path(suffix ...string) string {
	return p.sb.path(append([]string{"execs", url.PathEscape(p.ID)}, suffix...)...)
}

// Info returns the exec as sbxd has it now; api.ErrNotFound if the
// sandbox or the exec is unknown.
func (p *Process) Info(ctx context.Context) (*Result, error) {
	var x api.Exec
	if err := p.sb.c.call(ctx, http.MethodGet, p.path(), nil, nil, &x); err != nil {
		return nil, err
	}
	return resultOf(&x), nil
}

// Wait waits for the exec to end and returns how it ended, sending its
// output where WithStdout, WithStderr and WithExecEvents say (here, or
// given to Start). Output from the start is sent once: a Wait after a
// broken one on the same Process goes on where it stopped. Cancelling ctx
// stops the waiting, not the command, and returns ctx's error with the
// Result known so far. A stream that breaks is a *StreamError naming the
// exec, with the Result known so far.
func (p *Process) Wait(ctx context.Context, opts ...OutputOption) (*Result, error) {
	for _, o := range opts {
		o.applyOutput(&p.out.cfg)
	}
	return p.output(ctx, "wait", true, &p.out)
}

// Output sends the output sbxd has kept of the exec so far where opts say
// (from the start, each time), without waiting, and returns what is known
// of the exec: ended, or still running.
func (p *Process) Output(ctx context.Context, opts ...OutputOption) (*Result, error) {
	var w outputWriter
	for _, o := range opts {
		o.applyOutput(&w.cfg)
	}
	return p.output(ctx, "output", false, &w)
}

// output reads the exec's output stream into w, followed or not.
func (p *Process) output(ctx context.Context, op string, follow bool, w *outputWriter) (*Result, error) {
	q := url.Values{}
	if follow {
		q.Set("follow", "1")
	}
	resp, err := p.sb.c.send(ctx, request{method: http.MethodGet, path: p.path("output"), query: q, accept: "text/event-stream"})
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	// each stream starts from the start: count afresh what it re-sends
	w.seen = [2]int64{}
	eof := false
	x, err := w.read(resp.Body, func(ev api.ExecEvent) { eof = eof || ev.Event == api.ExecEOF })
	if err == nil {
		return resultOf(x), nil
	}
	if errors.Is(err, errNoExit) && eof && !follow {
		// the kept output is sent and the exec still runs
		return p.Info(ctx)
	}
	res := &Result{ID: p.ID, SandboxID: p.SandboxID, State: api.ExecRunning, ExitCode: -1, Pid: p.Pid}
	return res, p.sb.execError(op, ctx, res, err)
}

// Signal sends sig to the exec's process group inside the sandbox: the
// command and what it started in its group. An exec that has ended, or a
// sandbox that is not running, is api.ErrConflict; an unknown exec
// api.ErrNotFound.
func (p *Process) Signal(ctx context.Context, sig syscall.Signal) error {
	if sig <= 0 || sig > 64 {
		return api.Errorf(api.ErrInvalid, "signal %s of %s: %d is not a signal number (1 to 64)", p.ID, p.SandboxID, int(sig))
	}
	return p.sb.c.call(ctx, http.MethodPost, p.path("signal"), nil, &api.SignalRequest{Signal: int(sig)}, nil)
}

// Kill sends SIGKILL to the exec's process group (see Signal).
func (p *Process) Kill(ctx context.Context) error { return p.Signal(ctx, syscall.SIGKILL) }
