package sandbox

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"sbx.dev/sbx/api"
	"sbx.dev/sbx/internal/follow"
	"sbx.dev/sbx/internal/runsc"
	"sbx.dev/sbx/internal/store"
	"sbx.dev/sbx/internal/wire/agentwire"
)

// Every exec is started by the sandbox's init (the agent), so that its
// processes live on through stop and resume and are carried into memory
// captures: gVisor kills, on restore, whatever descends from a `runsc
// exec`. An exec'd agent only copies the output out, as frames, and can be
// replaced after a restore (a re-attach). On the host, a shim owns that
// `runsc exec` (runsc/shim.go): it keeps the output in the exec's directory
// within a budget, outlives sbxd, and writes the exit file a restarted sbxd
// reads. While sbxd runs, the shim tells it of the pid and the end at once
// (a channel per exec), so nothing polls the store for an exec.

// execOwner owns the execs and their output: starting them through init,
// the shims that copy their output out, their ends, their re-attaches after
// a resume or a restart, and the readers of their output. Its table has its
// own lock; it sees the rest of the manager only through execHost.
type execOwner struct {
	host       execHost
	log        *slog.Logger
	table      execTable
	head, tail int64 // output kept of each stream: its head and tail (0: all)
}

// execHost is what the exec owner needs of the rest of the manager.
type execHost interface {
	// the store's execs, and its sandboxes
	Sandbox(ctx context.Context, ref string) (*store.Sandbox, error)
	CreateExec(ctx context.Context, e *api.Exec, activity time.Time) error
	UpdateExec(ctx context.Context, e *api.Exec, activity time.Time) error
	Exec(ctx context.Context, sandboxID, execID string) (*api.Exec, error)
	Execs(ctx context.Context, sandboxID string) ([]*api.Exec, error)
	// the runtime's shims
	StartExec(id string, o runsc.ShimExec) (*runsc.Shim, error)
	// claims (claims.go): a start claims shared, an exec's end whole
	startClaim(ctx context.Context, id string) (release func(), err error)
	claim(ctx context.Context, id, op string) (release func(), err error)
	// the sandbox, ready or why not (running), after a create in flight (whenReady)
	running(ctx context.Context, ref string) (*store.Sandbox, error)
	whenReady(ctx context.Context, ref string) (*store.Sandbox, error)
	defaults(sb *store.Sandbox) api.TemplateDefaults
	checkRoom(what string) error
	dataDirError(err error) error
	execDir(sandboxID, execID string) string
	runtimeLog(id string) string
	channelDir(id string) string
	watchDir(dir string) (follow.Source, func(), error)
	agentCall(ctx context.Context, ref string, stdin io.Reader, stdout io.Writer, args ...string) error
	touch(ctx context.Context, id string)
	now() time.Time
	// the sandbox's own end (watch.go): whether its process ended, and
	// recording that it ended, with its execs (under the caller's claim)
	processGone(ctx context.Context, id string) bool
	recordEnd(ctx context.Context, sb *store.Sandbox)
}

// execHost, as the manager gives it.
type managerExecHost struct {
	*store.Store
	m *Manager
}

func (h managerExecHost) StartExec(id string, o runsc.ShimExec) (*runsc.Shim, error) {
	return h.m.cfg.Runtime.StartExec(id, o)
}
func (h managerExecHost) startClaim(ctx context.Context, id string) (func(), error) {
	return h.m.claims.start(ctx, id)
}
func (h managerExecHost) claim(ctx context.Context, id, op string) (func(), error) {
	return h.m.claim(ctx, id, op)
}
func (h managerExecHost) running(ctx context.Context, ref string) (*store.Sandbox, error) {
	return h.m.running(ctx, ref)
}
func (h managerExecHost) whenReady(ctx context.Context, ref string) (*store.Sandbox, error) {
	return h.m.whenReady(ctx, ref)
}
func (h managerExecHost) defaults(sb *store.Sandbox) api.TemplateDefaults { return h.m.defaults(sb) }
func (h managerExecHost) checkRoom(what string) error                     { return h.m.checkRoom(what) }
func (h managerExecHost) dataDirError(err error) error                    { return h.m.dataDirError(err) }
func (h managerExecHost) execDir(sandboxID, execID string) string {
	return h.m.execDir(sandboxID, execID)
}
func (h managerExecHost) runtimeLog(id string) string { return h.m.runtimeLog(id) }
func (h managerExecHost) channelDir(id string) string { return h.m.channelDir(id) }
func (h managerExecHost) watchDir(dir string) (follow.Source, func(), error) {
	return h.m.files.Watch(dir)
}
func (h managerExecHost) agentCall(ctx context.Context, ref string, stdin io.Reader, stdout io.Writer, args ...string) error {
	return h.m.agentCall(ctx, ref, stdin, stdout, args...)
}
func (h managerExecHost) touch(ctx context.Context, id string) { h.m.touch(ctx, id) }
func (h managerExecHost) now() time.Time                       { return h.m.now() }
func (h managerExecHost) processGone(ctx context.Context, id string) bool {
	return h.m.processGone(ctx, id)
}
func (h managerExecHost) recordEnd(ctx context.Context, sb *store.Sandbox) { h.m.recordEnd(ctx, sb) }

// The facade: what server calls, and what the manager's other parts ask.

// Exec: see execOwner.exec.
func (m *Manager) Exec(ctx context.Context, ref string, req api.ExecRequest) (*api.Exec, error) {
	return m.execs.exec(ctx, ref, req)
}

// Execs: see execOwner.list.
func (m *Manager) Execs(ctx context.Context, ref string) ([]api.Exec, error) {
	return m.execs.list(ctx, ref)
}

// GetExec: see execOwner.get.
func (m *Manager) GetExec(ctx context.Context, ref, execID string) (*api.Exec, error) {
	return m.execs.get(ctx, ref, execID)
}

// Output: see execOwner.output.
func (m *Manager) Output(ctx context.Context, ref, execID string, following bool, emit func(api.ExecEvent) error) error {
	return m.execs.output(ctx, ref, execID, following, emit)
}

// Signal: see execOwner.signal.
func (m *Manager) Signal(ctx context.Context, ref, execID string, sig int) error {
	return m.execs.signal(ctx, ref, execID, sig)
}

// execRun is an exec this sbxd is watching: running, or ended and not yet
// stored (a full disk).
type execRun struct {
	dir string
	// done is closed once the exec has ended (it may not be stored yet).
	done chan struct{}

	mu sync.Mutex
	// attaches counts copiers started for the exec by this sbxd since
	// its sandbox was last captured (a capture cuts a copy over the exec
	// channel: that is no copier failing).
	attaches int
	exec     api.Exec
	stored   bool // the end is in the store
}

func (r *execRun) snapshot() *api.Exec {
	r.mu.Lock()
	defer r.mu.Unlock()
	e := r.exec
	return &e
}

func (r *execRun) attachCount() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.attaches
}

// captured forgets the copiers of sandbox id's execs counted so far: a
// save closes the sandbox's host sockets, and with them every copy over
// the exec channel, which is attached again; a sandbox captured more
// often than copierEnded's limit would otherwise lose its running execs.
func (x *execOwner) captured(id string) {
	x.table.mu.Lock()
	defer x.table.mu.Unlock()
	for _, r := range x.table.m {
		if r.exec.SandboxID == id {
			r.mu.Lock()
			r.attaches = 0
			r.mu.Unlock()
		}
	}
}

func (r *execRun) ended() bool {
	select {
	case <-r.done:
		return true
	default:
		return false
	}
}

// execTable holds the execs this sbxd watches, and tells followers when
// any of them changes.
type execTable struct {
	mu      sync.Mutex
	m       map[string]*execRun
	changed follow.Broadcast // at every change
}

func (t *execTable) get(id string) (*execRun, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	r, ok := t.m[id]
	return r, ok
}

func (t *execTable) put(r *execRun) {
	t.mu.Lock()
	if t.m == nil {
		t.m = map[string]*execRun{}
	}
	t.m[r.exec.ID] = r
	t.mu.Unlock()
	t.broadcast()
}

// remove drops r, unless another run of the same exec replaced it.
func (t *execTable) remove(r *execRun) {
	t.mu.Lock()
	if cur, ok := t.m[r.exec.ID]; ok && cur == r {
		delete(t.m, r.exec.ID)
	}
	t.mu.Unlock()
	t.broadcast()
}

// watch returns a channel closed at the next change (a follow.Source).
func (t *execTable) watch() <-chan struct{} { return t.changed.Wait() }

func (t *execTable) broadcast() { t.changed.Notify() }

// running reports whether sandbox id has an exec running now.
func (t *execTable) running(id string) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, r := range t.m {
		if r.exec.SandboxID == id && !r.ended() {
			return true
		}
	}
	return false
}

// starting returns sandbox id's execs whose process init has not yet
// reported (their pid is unknown) and that have not ended.
func (t *execTable) starting(id string) []*execRun {
	t.mu.Lock()
	defer t.mu.Unlock()
	var out []*execRun
	for _, r := range t.m {
		r.mu.Lock()
		pid := r.exec.Pid
		r.mu.Unlock()
		if r.exec.SandboxID == id && pid == 0 && !r.ended() {
			out = append(out, r)
		}
	}
	return out
}

// forget drops the execs of a deleted sandbox.
func (t *execTable) forget(sandboxID string) {
	t.mu.Lock()
	for id, r := range t.m {
		if r.exec.SandboxID == sandboxID {
			delete(t.m, id)
		}
	}
	t.mu.Unlock()
	t.broadcast()
}

func (m *Manager) execDir(sandboxID, execID string) string {
	return filepath.Join(m.sandboxDir(sandboxID), "execs", execID)
}

// checkExecRequest checks what an exec asks for: api.ErrInvalid naming
// the field.
func checkExecRequest(req api.ExecRequest) (time.Duration, error) {
	if len(req.Cmd) == 0 || req.Cmd[0] == "" {
		return 0, api.Errorf(api.ErrInvalid, "cmd: give a command to run")
	}
	timeout := req.Timeout.D() // checked at the edge: api.ExecRequest.Validate
	for i, a := range req.Cmd {
		if strings.IndexByte(a, 0) >= 0 {
			return 0, api.Errorf(api.ErrInvalid, "cmd: argument %d holds a NUL byte, which no program can receive", i)
		}
	}
	for _, e := range req.Env {
		if k, _, ok := strings.Cut(e, "="); !ok || k == "" {
			return 0, api.Errorf(api.ErrInvalid, "env: %q is not KEY=VALUE", e)
		}
		if strings.IndexByte(e, 0) >= 0 {
			return 0, api.Errorf(api.ErrInvalid, "env: %q holds a NUL byte", strings.ReplaceAll(e, "\x00", `\0`))
		}
	}
	if strings.IndexByte(req.Cwd, 0) >= 0 {
		return 0, api.Errorf(api.ErrInvalid, "cwd: the path holds a NUL byte")
	}
	if req.Cwd != "" && !strings.HasPrefix(req.Cwd, "/") {
		return 0, api.Errorf(api.ErrInvalid, "cwd: %q is not an absolute path", req.Cwd)
	}
	if strings.IndexByte(req.User, 0) >= 0 || strings.ContainsAny(req.User, "\n/") {
		return 0, api.Errorf(api.ErrInvalid, "user: %q is not a user name or uid", req.User)
	}
	return timeout, nil
}

// Exec starts a command in a ready sandbox and returns at once with the
// exec recorded as running (a detached one once its pid is known). Use
// Output to read what it writes and when it ends.
func (x *execOwner) exec(ctx context.Context, ref string, req api.ExecRequest) (*api.Exec, error) {
	timeout, err := checkExecRequest(req)
	if err != nil {
		return nil, err
	}
	if err := x.host.checkRoom("exec"); err != nil {
		return nil, err
	}
	sb, err := x.host.whenReady(ctx, ref)
	if err != nil {
		return nil, err
	}
	// Starting is serialized with the sandbox's lifecycle (a delete or stop
	// in between would pull the ground away); running is not.
	unlock, err := x.host.startClaim(ctx, sb.ID)
	if err != nil {
		return nil, err
	}
	release := sync.OnceFunc(unlock)
	defer release()
	if sb, err = x.host.running(ctx, sb.ID); err != nil {
		return nil, err
	}
	e := api.Exec{ID: newID("ex_"), SandboxID: sb.ID, Cmd: req.Cmd, State: api.ExecRunning, StartedAt: x.host.now(), Detached: req.Detach}
	dir := x.host.execDir(sb.ID, e.ID)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, x.host.dataDirError(fmt.Errorf("exec in %s: %w", sb.ID, err))
	}
	// what the exec does not say, its template's defaults do
	def := x.host.defaults(sb)
	start := agentwire.StartRequest{ID: e.ID, Argv: req.Cmd, Env: append(slices.Clip(def.Env), req.Env...), Cwd: cmp.Or(req.Cwd, def.WorkDir), User: cmp.Or(req.User, def.User)}
	if req.User != "" && req.Cwd == "" && def.WorkDir != "" && req.User != def.User {
		start.Cwd = "" // another user's working directory is not the default one's
	}
	if timeout > 0 {
		start.Timeout = timeout.String()
	}
	request, err := json.Marshal(start)
	if err != nil {
		return nil, err
	}
	if err := x.host.CreateExec(ctx, &e, x.host.now()); err != nil {
		_ = os.RemoveAll(dir)
		return nil, x.host.dataDirError(fmt.Errorf("exec in %s: %w", sb.ID, err))
	}
	run := &execRun{dir: dir, done: make(chan struct{}), exec: e}
	if err := x.startCopier(run, []string{runsc.AgentPath, "start"}, request, [2]int64{}); err != nil {
		x.finishExec(context.WithoutCancel(ctx), run, -1)
		return nil, fmt.Errorf("exec in %s: start: %w", sb.ID, err)
	}
	if req.Detach {
		// the start is over: the wait for its pid holds no claim, or a
		// copier that ended at once would wait for it to end the exec
		// (copierEnded claims the sandbox whole); a stop meanwhile waits
		// for the pid itself (awaitStarts)
		release()
		x.waitPid(run, 5*time.Second)
	}
	return run.snapshot(), nil
}

// dataDirError says plainly that sbxd's data dir is full, when it is.
func (m *Manager) dataDirError(err error) error {
	if isNoSpace(err) {
		return api.Errorf(api.ErrUnavailable, "sbxd's data dir %s is full (no space left on device): free some space there; %v", m.cfg.DataDir, err)
	}
	return err
}

func isNoSpace(err error) bool {
	return err != nil && (errors.Is(err, errNoSpace) || strings.Contains(err.Error(), "no space left on device") ||
		strings.Contains(err.Error(), "database or disk is full") || strings.Contains(err.Error(), "SQLITE_FULL"))
}

var errNoSpace = errors.New("no space left on device")

// startCopier starts the shim of an exec: a `runsc exec` of the agent's
// argv (start, or attach after a restore), with stdin as its request and
// offsets where its output resumes. The run is watched from then on.
func (x *execOwner) startCopier(run *execRun, argv []string, stdin []byte, offsets [2]int64) error {
	sh, err := x.host.StartExec(run.exec.SandboxID, runsc.ShimExec{
		Dir: run.dir, Args: argv, Stdin: stdin, Offsets: offsets,
		RuntimeLog: x.host.runtimeLog(run.exec.SandboxID), Head: x.head, Tail: x.tail, Stall: copierStall,
		Channel: x.host.channelDir(run.exec.SandboxID),
	})
	if err != nil {
		return err
	}
	run.mu.Lock()
	run.attaches++
	run.mu.Unlock()
	x.table.put(run)
	go func() {
		lost := ""
		for ev := range sh.Events {
			switch {
			case ev.Pid > 0:
				run.mu.Lock()
				run.exec.Pid = ev.Pid
				run.mu.Unlock()
				x.table.broadcast()
			case ev.Exit != nil:
				// the end is known now; the shim may take a while longer
				// (its exit file waits for room on a full disk)
				x.finishExec(context.Background(), run, *ev.Exit)
			case ev.Lost != "":
				lost = ev.Lost
			}
		}
		if run.ended() {
			return
		}
		code := -1
		if c, ok := runsc.ReadExit(run.dir); ok {
			code = c
		}
		x.copierEnded(run, code, lost)
	}()
	return nil
}

// copierStall is how long a copier may say nothing (frame.Alive comes
// every 5 s) before its shim gives it up and a new one is attached: root
// inside can stop a copier, and its exec would wait for ever.
const copierStall = 30 * time.Second

// runtimeLog is where runsc's own messages about a sandbox go.
func (m *Manager) runtimeLog(id string) string {
	return filepath.Join(m.sandboxDir(id), "runsc.log")
}

// maxAttaches bounds the copiers one exec is given before it is lost:
// each capture of its sandbox (a snapshot, a crash's freeze) ends one.
// reattachPause, times the copiers it had, is the wait before another
// after the channel closed.
const (
	maxAttaches   = 4
	reattachPause = 150 * time.Millisecond
)

// copierEnded decides what the end of an exec's copier means: the exec
// ended (code >= 0); or its sandbox stopped, and the command is frozen in
// the hibernation image until a resume attaches again; or the copier
// failed while the command may still run, and a new one is tried once;
// else the exec is lost.
func (x *execOwner) copierEnded(run *execRun, code int, lost string) {
	ctx := context.Background()
	if code >= 0 {
		x.finishExec(ctx, run, code)
		return
	}
	// A capture closes the sandbox's connections, and a freeze from
	// inside (a crash's) holds no claim of sbxd's: a copy attached again
	// at once may take a connection that save is about to close. Wait
	// out a save (init replaces its connections within a ping) first.
	if lost == runsc.ChannelClosed {
		time.Sleep(time.Duration(run.attachCount()) * reattachPause)
	}
	// A copier also ends when its sandbox is stopped or deleted: decide
	// once that is over, from what it left.
	unlock, err := x.host.claim(ctx, run.exec.SandboxID, "exec-end")
	if err != nil {
		return
	}
	defer unlock()
	if run.ended() {
		return // ended while this waited for the claim (the sandbox's end, a boot from its disk)
	}
	sb, err := x.host.Sandbox(ctx, run.exec.SandboxID)
	switch {
	case err != nil:
		x.table.remove(run) // deleted with its sandbox
		return
	case sb.State == api.StateStopping || sb.State == api.StateStopped:
		x.table.remove(run)
		return
	case sb.State == api.StateReady && x.host.processGone(ctx, sb.ID):
		// the sandbox itself ended (the kernel stopped it at its memory
		// limit): say so now, with this exec, not when the watcher comes
		// round and a new copier has failed to attach
		x.host.recordEnd(ctx, sb)
		if !run.ended() {
			x.finishExec(ctx, run, -1)
		}
		return
	case sb.State == api.StateReady && run.attachCount() < maxAttaches:
		x.log.Warn("an exec's copier ended early; attaching again", "exec", run.exec.ID, "reason", lost)
		if err := x.reattach(ctx, run); err == nil {
			return
		}
	}
	x.log.Warn("exec lost", "exec", run.exec.ID, "sandbox", run.exec.SandboxID, "reason", lost)
	x.finishExec(ctx, run, -1)
}

// reattach starts copying an exec's output out of a ready sandbox again,
// from where the last copy stopped: after a resume, or a restart of sbxd
// that found its copier gone.
func (x *execOwner) reattach(ctx context.Context, run *execRun) error {
	run.mu.Lock()
	if run.exec.Pid == 0 {
		// the pid init gave it, as its first copy wrote it: an attach
		// sends none, and an exec with no pid is one a stop waits for as
		// still starting (every stop after a resume waited 5 s for each
		// running exec; recoverExecs does the same after a restart)
		run.exec.Pid = readPid(run.dir)
	}
	run.mu.Unlock()
	off := runsc.ReadOffsets(run.dir)
	args := []string{runsc.AgentPath, "attach", "--framed", "--id", run.exec.ID,
		"--stdout-offset", fmt.Sprint(off[0]), "--stderr-offset", fmt.Sprint(off[1])}
	return x.startCopier(run, args, nil, off)
}

// loseExecs records the running execs of a sandbox that booted from its
// disk instead of its memory, or that ended on its own: their commands are
// gone. Those a copier follows are ended through it (its end is then
// known to its followers); the copier would only attach again.
func (x *execOwner) loseExecs(ctx context.Context, sandboxID string) {
	execs, err := x.host.Execs(ctx, sandboxID)
	if err != nil {
		return
	}
	for _, e := range execs {
		if e.State != api.ExecRunning {
			continue
		}
		run, watched := x.table.get(e.ID)
		if !watched {
			run = &execRun{dir: x.host.execDir(sandboxID, e.ID), done: make(chan struct{}), exec: *e}
		}
		if !run.ended() {
			x.finishExec(ctx, run, -1)
		}
	}
}

// reattachAll re-attaches every running exec of a ready sandbox that no
// copier follows.
func (x *execOwner) reattachAll(ctx context.Context, sandboxID string) {
	execs, err := x.host.Execs(ctx, sandboxID)
	if err != nil {
		x.log.Error("list execs to re-attach", "sandbox", sandboxID, "err", err)
		return
	}
	for _, e := range execs {
		if e.State != api.ExecRunning {
			continue
		}
		if _, watched := x.table.get(e.ID); watched {
			continue
		}
		run := &execRun{dir: x.host.execDir(sandboxID, e.ID), done: make(chan struct{}), exec: *e}
		if err := x.reattach(ctx, run); err != nil {
			x.log.Error("re-attach to an exec", "exec", e.ID, "err", err)
		}
	}
}

// startWait bounds how long a stop waits for the execs being started.
const startWait = 5 * time.Second

// awaitStarts waits (bounded, by limit in all) until every exec of sandbox
// id being started has its process under init, or has ended. A stop does
// so first, holding the sandbox's claim (no exec can begin meanwhile): an
// exec's start goes through a `runsc exec`, which gVisor does not bring
// back on a restore, so an exec caught between its start and init's
// spawn would be lost ("exec not found" after the resume). Execs already
// running are not waited for; they are under init.
func (x *execOwner) awaitStarts(id string, limit time.Duration) {
	deadline := time.Now().Add(limit)
	for _, run := range x.table.starting(id) {
		left := time.Until(deadline)
		if left <= 0 {
			x.log.Warn("stop: an exec is still starting; it may be lost", "sandbox", id, "exec", run.exec.ID)
			continue
		}
		x.waitPid(run, left)
	}
}

// waitPid waits (bounded) until the exec's pid inside the sandbox is
// known, or the exec has ended.
func (x *execOwner) waitPid(run *execRun, limit time.Duration) {
	deadline := time.After(limit)
	for {
		changed := x.table.watch()
		run.mu.Lock()
		pid := run.exec.Pid
		run.mu.Unlock()
		if pid > 0 || run.ended() {
			return
		}
		select {
		case <-changed:
		case <-run.done:
			return
		case <-deadline:
			return
		}
	}
}

// finishExec records how an exec ended; code -1 means sbx cannot know.
// The end is known at once to everyone following the exec; if the store
// cannot take it (a full disk), it is kept and stored as soon as it can.
func (x *execOwner) finishExec(ctx context.Context, run *execRun, code int) {
	end := x.host.now()
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
		run.exec.TimedOut = code == agentwire.ExitTimeoutExec
	}
	e := run.exec
	run.mu.Unlock()
	select {
	case <-run.done:
	default:
		close(run.done)
	}
	x.table.put(run) // followers see the end before the store does
	if err := x.host.UpdateExec(context.WithoutCancel(ctx), &e, end); err != nil {
		x.log.Error("record exec end; keeping it until the store takes it", "exec", e.ID, "err", err)
		go x.storeExecEnd(run)
		return
	}
	x.table.remove(run)
}

// storeExecEnd retries storing an exec's end until the store takes it, or
// its sandbox is gone.
func (x *execOwner) storeExecEnd(run *execRun) {
	for {
		time.Sleep(time.Second)
		e := run.snapshot()
		err := x.host.UpdateExec(context.Background(), e, *e.EndedAt)
		if err == nil {
			x.log.Info("recorded an exec's end after a failure to", "exec", e.ID)
			x.table.remove(run)
			return
		}
		if _, serr := x.host.Sandbox(context.Background(), e.SandboxID); errors.Is(serr, api.ErrNotFound) {
			x.table.remove(run)
			return
		}
	}
}

func readPid(dir string) int {
	b, err := os.ReadFile(filepath.Join(dir, runsc.PidFile))
	if err != nil {
		return 0
	}
	var n int
	fmt.Sscan(strings.TrimSpace(string(b)), &n)
	return n
}

// recoverExecs picks up the execs a previous sbxd left running: ended ones
// are recorded from their exit file, those whose shim still runs are
// watched again, and those whose copier is gone get a new one.
func (x *execOwner) recoverExecs(ctx context.Context) error {
	execs, err := x.host.Execs(ctx, "")
	if err != nil {
		return fmt.Errorf("recover execs: %w", err)
	}
	for _, e := range execs {
		dir := x.host.execDir(e.SandboxID, e.ID)
		run := &execRun{dir: dir, done: make(chan struct{}), exec: *e}
		if run.exec.Pid == 0 {
			// the pid init gave it, if it got that far: an exec known to
			// have started is no stop's to wait for (a stop after every
			// restart waited 5 s for each running exec, as if starting)
			run.exec.Pid = readPid(dir)
		}
		shim := runsc.ReadShimPid(dir)
		if code, ok := runsc.ReadExit(dir); ok && !shim.Alive() {
			x.finishExec(ctx, run, code)
			continue
		}
		if shim.Alive() {
			// not our child: its end is seen by polling, and read from files
			x.table.put(run)
			go func() {
				for shim.Alive() {
					time.Sleep(100 * time.Millisecond)
				}
				code := -1
				if c, ok := runsc.ReadExit(dir); ok {
					code = c
				}
				x.copierEnded(run, code, "its shim ended while sbxd was away")
			}()
			continue
		}
		sb, err := x.host.Sandbox(ctx, e.SandboxID)
		switch {
		case err != nil:
			x.finishExec(ctx, run, -1)
		case sb.State == api.StateReady:
			if err := x.reattach(ctx, run); err != nil {
				x.log.Error("re-attach to an exec", "exec", e.ID, "err", err)
				x.finishExec(ctx, run, -1)
			}
		case sb.State == api.StateStopped:
			// frozen in the image; a resume attaches again
		default:
			x.finishExec(ctx, run, -1)
		}
	}
	return nil
}

// Execs lists a sandbox's execs, oldest first.
func (x *execOwner) list(ctx context.Context, ref string) ([]api.Exec, error) {
	sb, err := x.host.Sandbox(ctx, ref)
	if err != nil {
		return nil, err
	}
	execs, err := x.host.Execs(ctx, sb.ID)
	if err != nil {
		return nil, err
	}
	out := make([]api.Exec, 0, len(execs))
	for _, e := range execs {
		out = append(out, *x.liveExec(e))
	}
	return out, nil
}

// liveExec prefers the in-memory view of an exec (it knows the pid, and an
// end the store does not have yet).
func (x *execOwner) liveExec(e *api.Exec) *api.Exec {
	run, ok := x.table.get(e.ID)
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
func (x *execOwner) get(ctx context.Context, ref, execID string) (*api.Exec, error) {
	sb, err := x.host.Sandbox(ctx, ref)
	if err != nil {
		return nil, err
	}
	e, err := x.host.Exec(ctx, sb.ID, execID)
	if err != nil {
		return nil, err
	}
	return x.liveExec(e), nil
}

// execState returns an exec's current state: the watched run's, else the
// store's.
func (x *execOwner) execState(ctx context.Context, sandboxID, execID string) (*api.Exec, error) {
	if run, ok := x.table.get(execID); ok {
		return run.snapshot(), nil
	}
	return x.host.Exec(context.WithoutCancel(ctx), sandboxID, execID)
}

// Output sends an exec's output from the start: what was kept, then, with
// follow, what comes, until the exec ends; then an "exit" event. Without
// follow it returns after the output kept so far (with "exit" only if the
// exec has ended). It returns when emit fails (the client went away). It
// learns of an exec's end from the exec table, and reads only the files
// while the exec runs.
func (x *execOwner) output(ctx context.Context, ref, execID string, following bool, emit func(api.ExecEvent) error) error {
	sb, err := x.host.Sandbox(ctx, ref)
	if err != nil {
		return err
	}
	if _, err := x.host.Exec(ctx, sb.ID, execID); err != nil {
		return err
	}
	dir := x.host.execDir(sb.ID, execID)
	streams := []*tail{{name: "stdout", path: filepath.Join(dir, "stdout")}, {name: "stderr", path: filepath.Join(dir, "stderr")}}
	defer func() {
		for _, s := range streams {
			s.close()
		}
	}()
	// woken by the exec table (its end) and by the files (its output: the
	// shim writes them), never by a poll
	sources := []follow.Source{x.table.watch}
	if following {
		src, stop, err := x.host.watchDir(dir)
		if err == nil {
			defer stop()
			sources = append(sources, src)
		} else if cur, serr := x.execState(ctx, sb.ID, execID); serr != nil {
			return serr // deleted meanwhile, with its sandbox
		} else if cur.State == api.ExecRunning {
			if _, statErr := os.Stat(dir); errors.Is(statErr, os.ErrNotExist) {
				// only a delete removes a sandbox's files: its record
				// goes in a moment, and with it the exec's
				return api.Errorf(api.ErrNotFound, "exec %s: its sandbox %s is being deleted", execID, sb.ID)
			}
			return fmt.Errorf("follow the output of %s: %w", execID, err)
		} // an exec that ended long ago may have no directory left: nothing grows
	}
	return follow.Follow(ctx, func() (bool, time.Time, error) {
		cur, err := x.execState(ctx, sb.ID, execID)
		if err != nil {
			return false, time.Time{}, err
		}
		// Whatever was written before the end is in the files by then.
		ended := cur.State != api.ExecRunning
		n, err := drain(streams, emit)
		if err != nil {
			return false, time.Time{}, err
		}
		switch {
		case ended:
			return true, time.Time{}, emit(api.ExecEvent{Event: "exit", Exec: cur})
		case n > 0:
			return false, time.Now(), nil // more may be there already
		case !following:
			return true, time.Time{}, nil
		}
		return false, time.Time{}, nil
	}, sources...)
}

// tail reads a growing file from where it left off.
type tail struct {
	name string
	path string
	f    *os.File
	off  int64
}

func (t *tail) close() {
	if t.f != nil {
		t.f.Close()
	}
}

const chunkSize = 64 << 10

// drain emits whatever the streams have gained and returns how many bytes.
func drain(streams []*tail, emit func(api.ExecEvent) error) (int, error) {
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

// Signal sends signal sig (1 to 64; 0 is SIGTERM) to exec execID of a
// ready sandbox: the sandbox's init signals the exec's process group, the
// command and what it started in its group. An unknown sandbox or exec is
// api.ErrNotFound; an exec that has ended, or a sandbox that is not
// running, api.ErrConflict; a bad signal api.ErrInvalid.
func (x *execOwner) signal(ctx context.Context, ref, execID string, sig int) error {
	if sig == 0 {
		sig = 15
	}
	if sig < 1 || sig > 64 {
		return api.Errorf(api.ErrInvalid, "signal: %d is not a signal number (1 to 64)", sig)
	}
	sb, err := x.host.Sandbox(ctx, ref)
	if err != nil {
		return err
	}
	e, err := x.get(ctx, sb.ID, execID)
	if err != nil {
		return err
	}
	if e.State != api.ExecRunning {
		return execEnded(e)
	}
	ctx, cancel := context.WithTimeout(ctx, inspectTimeout)
	defer cancel()
	err = x.host.agentCall(ctx, sb.ID, nil, io.Discard, "kill", "--id", e.ID, "--signal", fmt.Sprint(sig))
	if err != nil && strings.Contains(err.Error(), "no process of it is left") {
		// it ended as the signal went; say how, once its end is known
		if cur, gerr := x.get(context.WithoutCancel(ctx), sb.ID, e.ID); gerr == nil && cur.State != api.ExecRunning {
			return execEnded(cur)
		}
		return api.Errorf(api.ErrConflict, "exec %s in %s has no process left to signal; it is ending", e.ID, sb.ID)
	}
	if err != nil {
		return fmt.Errorf("signal exec %s in %s: %w", e.ID, sb.ID, err)
	}
	x.host.touch(ctx, sb.ID)
	return nil
}

// execEnded is the error of an action on an exec that has ended.
func execEnded(e *api.Exec) error {
	how := string(e.State)
	if e.ExitCode != nil {
		how = fmt.Sprintf("exit %d", *e.ExitCode)
	}
	return api.Errorf(api.ErrConflict, "exec %s in %s has ended (%s); there is nothing to signal", e.ID, e.SandboxID, how)
}
