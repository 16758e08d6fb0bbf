package agent

import (
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/signal"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"sbx.dev/sbx/internal/agent/hooks"
	"sbx.dev/sbx/internal/atomicfile"
	"sbx.dev/sbx/internal/procfs"
	"sbx.dev/sbx/internal/wire/agentwire"
	"sbx.dev/sbx/internal/wire/freezewire"
)

// InitSocket is the abstract unix socket on which init takes requests to
// start and signal commands. Each connection carries one JSON request line
// and gets one JSON reply line.
const InitSocket = "@sbx-agent"

// ExecsDir holds one directory per command init has started, named by its
// id: stdout and stderr (the command's output), pid, and exit (its exit
// code, 128+N for signal N, written once it has ended).
const ExecsDir = "/run/sbx/execs"

// Where init listens and keeps its commands. Variables so that tests can
// use their own, in-process and in the test binary (-ldflags -X).
var (
	initSocket = InitSocket
	execsDir   = ExecsDir
)

// initRequest is one request to init.
//
//	{"op":"spawn","id":"ex_1","argv":["sh","-c","..."],"env":["K=V"],"cwd":"/x","timeout":"5s"}
//	{"op":"kill","id":"ex_1","signal":15}
type initRequest struct {
	Op      string   `json:"op"`
	ID      string   `json:"id"`
	Argv    []string `json:"argv,omitempty"`
	Env     []string `json:"env,omitempty"`
	Cwd     string   `json:"cwd,omitempty"`
	Timeout string   `json:"timeout,omitempty"`
	Signal  *int     `json:"signal,omitempty"`
	// User runs the command as this user: a name or uid, optionally with
	// ":group" (resolved from the sandbox's /etc/passwd and /etc/group).
	User string `json:"user,omitempty"`
	// Again makes a spawn of an id that has started answer with its pid
	// rather than fail: the request may have been sent again (sbxd sends
	// a start again when a capture closed its connection before any
	// answer, not knowing whether init read it), and the command started
	// is the one to follow. An id spawns once all the same.
	Again bool `json:"again,omitempty"`
	// A freeze's (see freeze.go): what failed, when, and whether the
	// process asking is the one to keep (else its parent is).
	Reason   string `json:"reason,omitempty"`
	FailedAt string `json:"failedAt,omitempty"`
	Self     bool   `json:"self,omitempty"`
	// Crash is set by init itself for a crash's freeze (crash.go); no
	// request can carry it.
	Crash *freezewire.Crash `json:"-"`
	// written, set by init itself for a crash's freeze, runs once gVisor
	// has written the checkpoint in this boot (it answered "resume"),
	// before sbxd's word on it is waited for.
	written func() `json:"-"`
}

// initReply is init's answer: {"pid":N} for a started command, {} for a
// delivered signal, or an exit code and a message fit for a user.
type initReply struct {
	Pid   int    `json:"pid,omitempty"`
	Code  int    `json:"code,omitempty"`
	Error string `json:"error,omitempty"`
	// Exit answers a "wait": the exit code of the command once it ended.
	Exit *int `json:"exit,omitempty"`
	// Freeze answers a "freeze" or "freeze-status".
	Freeze *FreezeRecord `json:"freeze,omitempty"`
}

// maxRequest bounds a request: argv and env together, with room to spare
// over the kernel's own limit on them.
const maxRequest = 8 << 20

// clientTimeout bounds one connection, so a stuck client cannot pin a
// goroutine of init forever.
const clientTimeout = 30 * time.Second

// runInit is the first process of every sandbox. It holds the sandbox open,
// reaps the orphans the sandbox's processes leave (they are re-parented to
// it), starts the commands asked for on InitSocket, and ends on SIGTERM or
// SIGINT, which ends the sandbox.
//
// Commands that must outlive a checkpoint are started by init because gVisor
// kills, on restore, every process that descends from a `runsc exec`.
func runInit(stderr io.Writer) int {
	// init is pid 1 in a sandbox already; elsewhere (tests) this makes the
	// orphans come to it all the same
	_ = unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
	sigs := make(chan os.Signal, 2)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT)
	ignoreOtherSignals()
	// the boot's freeze environment is the first boot's in init's own;
	// the current one is read from gVisor when needed
	for _, k := range freezewire.Envs {
		_ = os.Unsetenv(k)
	}
	if err := serveConsole(consolePath, os.Stdout); err != nil {
		fmt.Fprintf(stderr, "sbx-agent: init: /dev/console: %v\n", err)
	}
	if err := installEtc(etcSource, "/etc"); err != nil {
		fmt.Fprintf(stderr, "sbx-agent: init: /etc: %v\n", err)
	}
	if err := debuggable(); err != nil {
		fmt.Fprintf(stderr, "sbx-agent: init: %v\n", err)
	}
	s := newSupervisor(initSocket, execsDir, true, stderr)
	s.freezer = newFreezer(os.Stdout)
	if os.Getenv(CrashesEnv) != "off" {
		if _, err := startCrashes(CrashDir, s.freezer, os.Stdout); err != nil {
			fmt.Fprintf(stderr, "sbx-agent: init: crashes will not be caught: %v\n", err)
		}
	}
	_ = os.Unsetenv(CrashesEnv)
	// Threads for init's own work, made now: the process limit is per
	// user and init is root, so a root command that forks up to it left
	// init's Go runtime no thread to make ("failed to create new OS
	// thread", a fatal error that ended the sandbox) in the middle of the
	// very sweep that kills that command at its timeout
	// (TestAttackCopierStormAsRootKillsInit). The runtime keeps the
	// threads it made.
	spareThreads(initSpareThreads())
	s.start()
	if channelAvailable() {
		serveChannel(agentwire.ChannelSocket, inProcess{s})
	}
	<-sigs
	return 0
}

// initSpareThreads is how many idle threads init makes at its start: 24,
// or an eighth of the process limit where that is less (its threads
// count against root's limit as its commands do; the least a sandbox may
// have is 16).
func initSpareThreads() int {
	var r unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_NPROC, &r); err != nil || r.Cur == unix.RLIM_INFINITY {
		return 24
	}
	return int(min(24, r.Cur/8))
}

// supervisor is init's work: it starts commands, reaps children, and
// records how each command ended.
type supervisor struct {
	socket string
	dir    string
	// reapAll reaps every child, as init must. Tests running a supervisor
	// in-process reap only its commands, not the test's own children.
	reapAll bool
	log     io.Writer

	mu      sync.Mutex // held across fork and record, so no exit is reaped unrecorded
	running map[int]*spawned
	// noReaper has a timeout enforced by the agent's exec even where
	// sbx-reaper is installed (tests of that way).
	noReaper bool
	// waiters are told the exit code of a command once it is recorded.
	waiters map[string][]chan int
	// settled holds the ids settled before they started (see settle):
	// spawn refuses them, whatever became of their records on disk.
	settled map[string]bool
	// pruned holds how the commands prune removed the records of ended
	// (the newest maxPruned, oldest first in prunedOrder): a copier
	// attached again later (after sbxd restarted, or a capture cut the
	// last one) learns the real end, not that the exec never ran.
	pruned      map[string]prunedExec
	prunedOrder []string
	ln          *os.File // the listening socket
	stopped     bool
	// userConns counts, by uid, the open connections of peers that are
	// not root (admit).
	userConns map[int]int

	sigs chan os.Signal
	done chan struct{}

	// freezer does the sandbox's freezes (nil: none, as in tests that do
	// not need them).
	freezer *freezer

	// pruning is set while a prune runs (pruneSoon); lastPrune is when
	// the last one began, under mu.
	pruning   atomic.Bool
	lastPrune time.Time

	// null is /dev/null, once a spawn opened it (devNull)
	nullMu sync.Mutex
	null   uintptr
	nullOK bool
}

// spawned is a command init started and has not yet recorded the end of.
type spawned struct {
	id  string
	pid int // also its process group
	dir string
	// reaped is set under supervisor.mu once the command has been reaped.
	reaped bool
	// timer ends the command at its deadline when init enforces it
	// (sbx-reaper); expired, under supervisor.mu, is the timeout once it
	// has.
	timer   *time.Timer
	expired time.Duration
}

// reaperName is sbx-reaper's name beside the agent (/.sbx in a sandbox).
const reaperName = "sbx-reaper"

// reaperPath is sbx-reaper beside the agent, "" when there is none (an
// sbxd that installs none, or noReaper): a timeout is then the agent's.
func (s *supervisor) reaperPath() string {
	if s.noReaper {
		return ""
	}
	self, err := agentExe()
	if err != nil {
		return ""
	}
	p := filepath.Join(filepath.Dir(self), reaperName)
	if fi, err := os.Stat(p); err != nil || !fi.Mode().IsRegular() || fi.Mode().Perm()&0o001 == 0 {
		return "" // every user's commands go through it: it must be theirs to run
	}
	return p
}

// expire ends command e at its deadline, after: it and every process it
// started, found as its descendants (it is their subreaper), those that
// left its group or session included. Its end is then recorded as a
// timeout (reap).
func (s *supervisor) expire(e *spawned, after time.Duration) {
	s.mu.Lock()
	if e.reaped {
		s.mu.Unlock()
		return
	}
	e.expired = after
	// stopped under mu: reaped it cannot be (its pid then someone else's),
	// and stopped it cannot end, while its tree is killed
	_ = syscall.Kill(e.pid, syscall.SIGSTOP)
	s.mu.Unlock()
	// last: its orphans come to it (the subreaper) for as long as it
	// lives, so it outlives them all; it itself may have left its group
	killUnder(e.pid)
	_ = syscall.Kill(e.pid, syscall.SIGKILL)
}

func newSupervisor(socket, dir string, reapAll bool, log io.Writer) *supervisor {
	return &supervisor{
		socket:  socket,
		dir:     dir,
		reapAll: reapAll,
		log:     log,
		running: map[int]*spawned{},
		waiters: map[string][]chan int{},
		settled: map[string]bool{},
		pruned:  map[string]prunedExec{},
		sigs:    make(chan os.Signal, 8),
		done:    make(chan struct{}),
	}
}

// start runs the reaper and the listener in the background. A listener that
// cannot be opened is reported and retried; reaping goes on regardless.
func (s *supervisor) start() {
	signal.Notify(s.sigs, syscall.SIGCHLD)
	go func() {
		for {
			select {
			case <-s.sigs:
				s.reap()
			case <-s.done:
				return
			}
		}
	}()
	// children may have ended before SIGCHLD was being caught
	s.reap()
	go s.serve()
}

// stop ends the supervisor (tests): it closes the listener, and kills and
// reaps the commands still running. init itself never stops.
func (s *supervisor) stop() {
	signal.Stop(s.sigs)
	close(s.done)
	s.mu.Lock()
	defer s.mu.Unlock()
	s.stopped = true
	if s.ln != nil {
		s.ln.Close()
	}
	for pid, e := range s.running {
		e.reaped = true
		killTree(pid, pid)
		var ws syscall.WaitStatus
		_, _ = syscall.Wait4(pid, &ws, 0, nil)
		delete(s.running, pid)
	}
}

// serve accepts connections until stop. Accept errors are transient as far
// as init knows (a restore, a full file table): it backs off, and after a run
// of them listens afresh.
func (s *supervisor) serve() {
	var ln *os.File
	failures := 0
	for {
		if ln == nil {
			l, err := listenUnix(s.socket)
			s.mu.Lock()
			if s.stopped {
				if l != nil {
					l.Close()
				}
				s.mu.Unlock()
				return
			}
			s.ln = l
			s.mu.Unlock()
			if err != nil {
				if failures == 0 {
					fmt.Fprintf(s.log, "sbx-agent: init: listen on %s: %s; retrying\n", s.socket, err)
				}
				failures++
				time.Sleep(backoff(failures))
				continue
			}
			ln = l
		}
		conn, err := acceptUnix(ln)
		if err == nil {
			failures = 0
			s.admit(conn)
			continue
		}
		s.mu.Lock()
		stopped := s.stopped
		s.mu.Unlock()
		if stopped {
			return
		}
		failures++
		if failures == 1 {
			fmt.Fprintf(s.log, "sbx-agent: init: accept on %s: %s\n", s.socket, err)
		}
		if failures%10 == 0 {
			ln.Close()
			ln = nil
		}
		time.Sleep(backoff(failures))
	}
}

// backoff is the pause after n consecutive failures: 10ms doubling to 1s.
func backoff(n int) time.Duration {
	return min(10*time.Millisecond<<min(n, 10), time.Second)
}

// maxUserConns bounds the connections to init from the processes of one
// uid that is not root that are open at once (one uid's flood of waits
// must not starve another's): anyone inside may connect (a freeze is
// anyone's), and a flood of idle connections must not take the file table
// that sbx's own requests (root's) need.
const maxUserConns = 32

// admit answers conn in its own goroutine, once it knows who asks: root
// (sbx's helpers, which runsc exec runs as uid 0) always; others while
// fewer than maxUserConns of theirs are open, else the connection is
// closed at once.
func (s *supervisor) admit(conn *os.File) {
	p, err := peerOf(conn)
	if err != nil {
		conn.Close()
		return
	}
	if p.uid == 0 {
		// a copier `runsc exec` started: its exec found no live channel
		// connection (a capture closed them); replace them now
		pacer.kick()
	}
	if p.uid != 0 {
		s.mu.Lock()
		if s.userConns == nil {
			s.userConns = map[int]int{}
		}
		full := s.userConns[p.uid] >= maxUserConns
		if !full {
			s.userConns[p.uid]++
		}
		s.mu.Unlock()
		if full {
			conn.Close()
			return
		}
	}
	go func() {
		if p.uid != 0 {
			defer func() {
				s.mu.Lock()
				if s.userConns[p.uid]--; s.userConns[p.uid] == 0 {
					delete(s.userConns, p.uid)
				}
				s.mu.Unlock()
			}()
		}
		s.handle(conn, p)
	}()
}

// handle answers the one request on conn, from p.
func (s *supervisor) handle(conn *os.File, p peer) {
	defer conn.Close()
	// init must outlive any request, however malformed
	defer func() {
		if r := recover(); r != nil {
			fmt.Fprintf(s.log, "sbx-agent: init: request failed: %v\n", r)
		}
	}()
	_ = conn.SetDeadline(time.Now().Add(clientTimeout))
	followHostname()
	var req initRequest
	var rep initReply
	if err := json.NewDecoder(io.LimitReader(conn, maxRequest)).Decode(&req); err != nil {
		rep = initReply{Code: ExitUsageExec, Error: "bad request: " + err.Error()}
	} else {
		switch req.Op {
		case "spawn":
			if rep = asAsker(&req, p); rep.Code == 0 {
				rep = s.spawn(req)
			}
		case "kill":
			rep = s.kill(req, p)
		case "settle":
			if p.uid != 0 {
				rep = initReply{Code: ExitError, Error: "settle: only root may settle an exec"}
				break
			}
			rep = s.settle(req)
		case "wait":
			// answered when the command ends, however long that is
			_ = conn.SetDeadline(time.Time{})
			rep = s.waitExec(req)
		case "freeze", "freeze-status":
			rep = s.freezeOp(conn, req, p)
		default:
			rep = initReply{Code: ExitUsageExec, Error: fmt.Sprintf("unknown op %q", req.Op)}
		}
	}
	_ = json.NewEncoder(conn).Encode(rep)
}

// freezeOp answers the freeze requests (freeze.go).
func (s *supervisor) freezeOp(conn *os.File, req initRequest, p peer) initReply {
	if s.freezer == nil {
		return initReply{Code: ExitError, Error: "this init does no freezes"}
	}
	switch req.Op {
	case "freeze":
		// answered once gVisor has written the whole sandbox
		_ = conn.SetDeadline(time.Time{})
		r := s.freezer.freeze(req, p)
		return initReply{Freeze: &r}
	default: // freeze-status
		r := s.freezer.status(2 * time.Second)
		return initReply{Freeze: &r}
	}
}

// asAsker makes a spawn asked by p run with p's own rights: root's helpers
// may run a command as any user; anyone else only as themselves (init is
// root, and must not lend that to whoever reaches its socket).
func asAsker(req *initRequest, p peer) initReply {
	if p.uid == 0 {
		return initReply{}
	}
	if req.User != "" {
		u, err := lookupUser(req.User)
		if err != nil || u.uid != p.uid || strings.Contains(req.User, ":") {
			return initReply{Code: ExitUsageExec, Error: fmt.Sprintf("spawn as %s: uid %d may run commands only as itself", req.User, p.uid)}
		}
	}
	req.User = strconv.Itoa(p.uid)
	return initReply{}
}

// validExecID says whether id can name an exec directory: letters, digits,
// '_', '-' and '.', not leading with '.'.
func validExecID(id string) bool {
	if id == "" || len(id) > 128 || id[0] == '.' {
		return false
	}
	for _, c := range id {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '-' || c == '.') {
			return false
		}
	}
	return true
}

// mergeEnv returns base with each KEY=VALUE of over set, the later winning.
func mergeEnv(base, over []string) []string {
	out := make([]string, 0, len(base)+len(over))
	index := map[string]int{}
	for _, kv := range append(base[:len(base):len(base)], over...) {
		k, _, _ := strings.Cut(kv, "=")
		if i, ok := index[k]; ok {
			out[i] = kv
			continue
		}
		index[k] = len(out)
		out = append(out, kv)
	}
	return out
}

// spawn starts a command as a child of init, its output going to files in
// its exec directory.
func (s *supervisor) spawn(req initRequest) initReply {
	fail := func(code int, format string, args ...any) initReply {
		return initReply{Code: code, Error: fmt.Sprintf(format, args...)}
	}
	if !validExecID(req.ID) {
		return fail(ExitUsageExec, "spawn: bad exec id %q; use letters, digits, '_', '-' and '.'", req.ID)
	}
	if len(req.Argv) == 0 || req.Argv[0] == "" {
		return fail(ExitUsageExec, "spawn: no command given")
	}
	var timeout time.Duration
	if req.Timeout != "" {
		d, err := time.ParseDuration(req.Timeout)
		if err != nil || d < 0 {
			return fail(ExitUsageExec, "spawn: bad timeout %q", req.Timeout)
		}
		timeout = d
	}
	for _, kv := range req.Env {
		if k, _, ok := strings.Cut(kv, "="); !ok || k == "" {
			return fail(ExitUsageExec, "spawn: --env %q is not KEY=VALUE", kv)
		}
	}
	env := mergeEnv(os.Environ(), nil)
	var cred *syscall.Credential
	if req.User != "" {
		u, err := lookupUser(req.User)
		if err != nil {
			return fail(ExitUsageExec, "user %s: %s", req.User, err)
		}
		cred = &syscall.Credential{Uid: uint32(u.uid), Gid: uint32(u.gid)}
		for _, g := range u.groups {
			cred.Groups = append(cred.Groups, uint32(g))
		}
		env = mergeEnv(env, []string{"HOME=" + cmp.Or(u.home, "/"), "USER=" + u.name, "LOGNAME=" + u.name})
	}
	// the freeze hooks importable by every command (the pytest plugin)
	env = hooks.Env(mergeEnv(env, req.Env))
	if req.Cwd != "" {
		fi, err := os.Stat(req.Cwd)
		if err != nil {
			return fail(ExitError, "cwd %s: %s", req.Cwd, cwdReason(err))
		}
		if !fi.IsDir() {
			return fail(ExitError, "cwd %s: not a directory", req.Cwd)
		}
	}
	pathEnv := defaultPath
	for _, kv := range env {
		if v, ok := strings.CutPrefix(kv, "PATH="); ok {
			pathEnv = v
		}
	}
	prog, code, msg := lookProgIn(req.Argv[0], pathEnv, req.Cwd)
	if code != 0 {
		return fail(code, "%s: %s", req.Argv[0], msg)
	}
	argv := req.Argv
	var deadline time.Duration // init's to enforce (expire)
	reaper := s.reaperPath()
	switch {
	case timeout > 0 && reaper != "":
		// The command is its own subreaper (sbx-reaper sets the flag and
		// becomes it), so that at the deadline init finds every process
		// it started among its descendants, those that left its session
		// included (under init, an orphan would be lost among all of
		// init's); and init keeps the clock. No process of sbx's stands
		// between, and it runs as the user from its first instruction.
		argv = append([]string{reaper, prog}, req.Argv...)
		prog, deadline = reaper, timeout
	case timeout > 0:
		// Without sbx-reaper (an sbxd that installs none): the agent's
		// exec enforces it, a subreaper of its own, at the price of a Go
		// program's start.
		self, err := agentExe()
		if err != nil {
			return fail(ExitError, "spawn %s: %s", req.ID, err)
		}
		argv = []string{self, "exec", "--timeout", timeout.String()}
		if cred != nil {
			// the agent stays root, the command is the user: at the user's
			// process limit (a fork bomb), an agent of theirs could not get
			// a thread to enforce the timeout with
			argv = append(argv, "--as", formatCred(cred))
			if req.Cwd != "" {
				argv = append(argv, "--cwd", req.Cwd) // entered as the user
			}
			cred = nil
		}
		args, err := json.Marshal(append(append(argv[2:], "--"), req.Argv...))
		if err != nil {
			return fail(ExitError, "spawn %s: %s", req.ID, err)
		}
		prog, argv = self, argv[:2]
		// init's alone: one the request's env has is replaced, not
		// shadowed (the first of two copies is the one a getenv finds)
		env = mergeEnv(env, []string{execArgsEnv + "=" + string(args)})
	}

	dir := filepath.Join(s.dir, req.ID)
	s.mu.Lock()
	defer s.mu.Unlock()
	s.pruneSoon()
	// the pid file is written under mu, so two spawns of one id cannot both pass
	if _, err := os.Lstat(filepath.Join(dir, "pid")); err == nil {
		if pid, err := readExecPid(s.dir, req.ID); err == nil && req.Again {
			return initReply{Pid: pid}
		}
		return fail(ExitUsageExec, "spawn: exec %s already exists", req.ID)
	}
	if s.settled[req.ID] {
		return fail(ExitUsageExec, "spawn: exec %s was given up before it started (settle)", req.ID)
	}
	if p, ok := s.pruned[req.ID]; ok {
		// it ran and ended, and its records were pruned: a start sent
		// again follows that end, and never runs the command twice
		if req.Again && restoreEnd(dir, req.ID, p) == nil {
			return initReply{Pid: p.pid}
		}
		return fail(ExitUsageExec, "spawn: exec %s already ran (exit %d)", req.ID, p.code)
	}
	// nothing of sbx's is there: whatever is (put there by hand) is not
	// this command's, and its followers must not read it as such
	_ = os.RemoveAll(dir)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fail(ExitError, "spawn %s: %s", req.ID, err)
	}
	var files []*os.File
	defer func() {
		for _, f := range files {
			f.Close()
		}
	}()
	// opened as plain descriptors: an *os.File of each would be offered
	// to Go's poller (more syscalls, each a trip through the sentry) for
	// files only the command writes
	var fds [2]int
	for i, name := range []string{"stdout", "stderr"} {
		fd, err := syscall.Open(filepath.Join(dir, name), syscall.O_CREAT|syscall.O_WRONLY|syscall.O_APPEND|syscall.O_CLOEXEC, 0o600)
		if err != nil {
			return fail(ExitError, "spawn %s: %s", req.ID, &os.PathError{Op: "open", Path: filepath.Join(dir, name), Err: err})
		}
		files = append(files, os.NewFile(uintptr(fd), name))
		fds[i] = fd
	}
	null, own, err := s.devNull()
	if err != nil {
		return fail(ExitError, "spawn %s: %s", req.ID, err)
	}
	if own {
		files = append(files, os.NewFile(null, os.DevNull))
	}
	pid, err := syscall.ForkExec(prog, argv, &syscall.ProcAttr{
		Dir:   req.Cwd,
		Env:   env,
		Files: []uintptr{null, uintptr(fds[0]), uintptr(fds[1])},
		Sys:   &syscall.SysProcAttr{Setpgid: true, Credential: cred},
	})
	if err != nil {
		code, msg := startFailure(&os.PathError{Op: "fork/exec", Path: prog, Err: err})
		return fail(code, "%s: %s", req.Argv[0], msg)
	}
	e := &spawned{id: req.ID, pid: pid, dir: dir}
	s.running[pid] = e
	if deadline > 0 {
		e.timer = time.AfterFunc(deadline, func() { s.expire(e, deadline) })
	}
	if err := writeRecord(filepath.Join(dir, "pid"), strconv.Itoa(pid)+"\n"); err != nil {
		// kill and attach find the command by this file: without it the
		// command could never be reached, so it must not run
		_ = syscall.Kill(-pid, syscall.SIGKILL)
		return fail(ExitError, "spawn %s: %s", req.ID, err)
	}
	return initReply{Pid: pid}
}

// reap collects every child that has ended and records the exit of those
// that were commands.
func (s *supervisor) reap() {
	type ended struct {
		e    *spawned
		code int
	}
	var done []ended
	s.mu.Lock()
	for {
		pid, ws, ok := s.wait()
		if !ok {
			break
		}
		e := s.running[pid]
		if e == nil {
			continue // an orphan
		}
		delete(s.running, pid)
		e.reaped = true
		if e.timer != nil {
			e.timer.Stop()
		}
		code := ws.ExitStatus()
		if ws.Signaled() {
			code = 128 + int(ws.Signal())
		}
		if e.expired > 0 {
			code = ExitTimeoutExec
		}
		done = append(done, ended{e, code})
	}
	s.mu.Unlock()
	for _, d := range done {
		if d.e.expired > 0 {
			// what the agent's exec says at its deadline, last on stderr
			appendStderr(d.e.dir, fmt.Sprintf("sbx: command timed out after %s\n", d.e.expired))
		}
		s.recordExit(d.e, d.code)
	}
}

// wait reaps one ended child: any child when reapAll, else one of the
// supervisor's commands. Called with mu held.
func (s *supervisor) wait() (int, syscall.WaitStatus, bool) {
	var ws syscall.WaitStatus
	if s.reapAll {
		pid, err := syscall.Wait4(-1, &ws, syscall.WNOHANG, nil)
		return pid, ws, err == nil && pid > 0
	}
	for pid := range s.running {
		if got, err := syscall.Wait4(pid, &ws, syscall.WNOHANG, nil); err == nil && got == pid {
			return pid, ws, true
		}
	}
	return 0, 0, false
}

// Ended commands' directories are kept for re-attaching (their output, and
// their exit code) until there are more than keepEnded of them or they
// hold more than keepEndedBytes; then the oldest go. The host has long
// had what it needs of them by then.
const (
	keepEnded      = 256
	keepEndedBytes = 128 << 20
)

// pruneEvery is how often, at most, a spawn starts a prune.
const pruneEvery = 250 * time.Millisecond

// pruneSoon starts a prune in the background, unless one runs or began
// within pruneEvery: it reads every ended command's directory, up to
// keepEnded of them, which a spawn need not wait for. Called with mu held.
func (s *supervisor) pruneSoon() {
	if time.Since(s.lastPrune) < pruneEvery || !s.pruning.CompareAndSwap(false, true) {
		return
	}
	s.lastPrune = time.Now()
	go func() {
		defer s.pruning.Store(false)
		s.prune()
	}()
}

// prune removes the oldest ended commands' directories past the budget.
func (s *supervisor) prune() {
	ents, err := os.ReadDir(s.dir)
	if err != nil {
		return
	}
	type ended struct {
		dir  string
		at   time.Time
		size int64
	}
	var all []ended
	var total int64
	for _, e := range ents {
		dir := filepath.Join(s.dir, e.Name())
		fi, err := os.Stat(filepath.Join(dir, "exit"))
		if err != nil {
			continue // running, or not a command
		}
		var size int64
		for _, f := range []string{"stdout", "stderr"} {
			if fi, err := os.Stat(filepath.Join(dir, f)); err == nil {
				size += fi.Size()
			}
		}
		all = append(all, ended{dir, fi.ModTime(), size})
		total += size
	}
	if len(all) <= keepEnded && total <= keepEndedBytes {
		return
	}
	sort.Slice(all, func(i, j int) bool { return all[i].at.Before(all[j].at) })
	for i := 0; i < len(all) && (len(all)-i > keepEnded || total > keepEndedBytes); i++ {
		id := filepath.Base(all[i].dir)
		b, err := os.ReadFile(filepath.Join(all[i].dir, "exit"))
		code, cerr := strconv.Atoi(strings.TrimSpace(string(b)))
		pid, _ := readExecPid(s.dir, id)
		if os.RemoveAll(all[i].dir) == nil {
			total -= all[i].size
			if err == nil && cerr == nil && validExecID(id) {
				s.rememberPruned(id, prunedExec{pid: pid, code: code})
			}
		}
	}
}

// prunedExec is what is kept of a command whose records prune removed.
type prunedExec struct{ pid, code int }

// maxPruned bounds the pruned commands init remembers.
const maxPruned = 4096

func (s *supervisor) rememberPruned(id string, p prunedExec) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.pruned[id]; !ok {
		s.prunedOrder = append(s.prunedOrder, id)
	}
	s.pruned[id] = p
	for len(s.prunedOrder) > maxPruned {
		delete(s.pruned, s.prunedOrder[0])
		s.prunedOrder = s.prunedOrder[1:]
	}
}

// prunedNote is what an exec whose records were pruned says on its
// stderr when a copier attaches to it again.
const prunedNote = "sbx: exec %s ended (exit %d) and its output was pruned inside the sandbox before sbx could copy the rest (init keeps the newest 256 ended execs, 128 MiB of output)\n"

// recordExit writes the exit file of a command that has ended, and tells
// those waiting for it.
// appendStderr adds line to the stderr file in an exec's directory.
func appendStderr(dir, line string) {
	f, err := os.OpenFile(filepath.Join(dir, "stderr"), os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		return
	}
	defer f.Close()
	_, _ = f.WriteString(line)
}

func (s *supervisor) recordExit(e *spawned, code int) {
	if err := writeRecord(filepath.Join(e.dir, "exit"), strconv.Itoa(code)+"\n"); err != nil {
		fmt.Fprintf(s.log, "sbx-agent: init: exec %s: record exit: %s\n", e.id, err)
	}
	s.mu.Lock()
	ws := s.waiters[e.id]
	delete(s.waiters, e.id)
	s.mu.Unlock()
	for _, w := range ws {
		w <- code
	}
}

// waitExec answers once command req.ID has ended, with its exit code.
func (s *supervisor) waitExec(req initRequest) initReply {
	if !validExecID(req.ID) {
		return initReply{Code: ExitInvalid, Error: fmt.Sprintf("wait: bad exec id %q", req.ID)}
	}
	exitFile := filepath.Join(s.dir, req.ID, "exit")
	s.mu.Lock()
	known := false
	for _, e := range s.running {
		if e.id == req.ID {
			known = true
		}
	}
	var ch chan int
	if known {
		ch = make(chan int, 1)
		s.waiters[req.ID] = append(s.waiters[req.ID], ch)
	}
	s.mu.Unlock()
	if !known {
		b, err := os.ReadFile(exitFile)
		if err != nil {
			return initReply{Code: ExitNotFound, Error: fmt.Sprintf("wait: exec %s is not running here", req.ID)}
		}
		code, err := strconv.Atoi(strings.TrimSpace(string(b)))
		if err != nil {
			return initReply{Code: ExitError, Error: fmt.Sprintf("wait: exec %s: bad exit file %q", req.ID, b)}
		}
		return initReply{Exit: &code}
	}
	code := <-ch
	return initReply{Exit: &code}
}

// cutOff is what an exec settled before it started says on its stderr.
const cutOff = "sbx: exec %s never reached init (its start was cut off on its way: a stop, a restart, or its connection to init lost); it did not run, and will not\n"

// settle answers whether command req.ID has started; if it has not, it
// never will: init remembers it (in memory, which a stop and resume keep)
// and records it as ended, with exit 125 and a word on its stderr, and a
// spawn of it still on its way (a start cut off by a stop, its request
// left with an init that was wedged or stopped) is refused. Under mu, as
// spawn's decision is: the two cannot cross. Whoever follows
// an exec that init does not know settles it before saying so, so that an
// exec reported lost never runs afterwards.
func (s *supervisor) settle(req initRequest) initReply {
	if !validExecID(req.ID) {
		return initReply{Code: ExitInvalid, Error: fmt.Sprintf("settle: bad exec id %q", req.ID)}
	}
	dir := filepath.Join(s.dir, req.ID)
	s.mu.Lock()
	defer s.mu.Unlock()
	for pid, e := range s.running {
		if e.id == req.ID {
			// started, and running: its records are put back if something
			// removed them (its output so far is lost with them)
			if _, err := readExecPid(s.dir, req.ID); err != nil {
				restoreRecords(dir, pid)
			}
			return initReply{Pid: pid}
		}
	}
	if pid, err := readExecPid(s.dir, req.ID); err == nil {
		return initReply{Pid: pid} // started, and ended
	}
	if p, ok := s.pruned[req.ID]; ok {
		// started, ended, and its records pruned: put back its end (its
		// output is gone), so that it is followed to its real code
		if err := restoreEnd(dir, req.ID, p); err != nil {
			return initReply{Code: ExitError, Error: fmt.Sprintf("settle %s: %s", req.ID, err)}
		}
		return initReply{Pid: p.pid}
	}
	if s.settled[req.ID] {
		return initReply{}
	}
	// in memory first: it cannot fail, and outlives the records on disk
	// (pruned, or removed by hand), so the refusal holds whatever happens
	s.settled[req.ID] = true
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return initReply{Code: ExitError, Error: fmt.Sprintf("settle %s: %s (it will not run)", req.ID, err)}
	}
	for name, content := range map[string]string{"stdout": "", "stderr": fmt.Sprintf(cutOff, req.ID)} {
		if err := writeFileAtomic(filepath.Join(dir, name), content); err != nil {
			return initReply{Code: ExitError, Error: fmt.Sprintf("settle %s: %s (it will not run)", req.ID, err)}
		}
	}
	// the exit file last: it is what makes the exec ended for its followers
	if err := writeFileAtomic(filepath.Join(dir, "exit"), strconv.Itoa(ExitUsageExec)+"\n"); err != nil {
		return initReply{Code: ExitError, Error: fmt.Sprintf("settle %s: %s (it will not run)", req.ID, err)}
	}
	return initReply{}
}

// restoreEnd puts back the records of pruned command id at dir: empty
// output but a note on stderr, its pid and its exit code (last).
func restoreEnd(dir, id string, p prunedExec) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	if err := writeFileAtomic(filepath.Join(dir, "stdout"), ""); err != nil {
		return err
	}
	if err := writeFileAtomic(filepath.Join(dir, "stderr"), fmt.Sprintf(prunedNote, id, p.code)); err != nil {
		return err
	}
	if p.pid > 0 {
		if err := writeFileAtomic(filepath.Join(dir, "pid"), strconv.Itoa(p.pid)+"\n"); err != nil {
			return err
		}
	}
	return writeFileAtomic(filepath.Join(dir, "exit"), strconv.Itoa(p.code)+"\n")
}

// restoreRecords puts back the records of a running command at dir: its
// pid, and empty output files where they are gone.
func restoreRecords(dir string, pid int) {
	if os.MkdirAll(dir, 0o700) != nil {
		return
	}
	for _, name := range []string{"stdout", "stderr"} {
		if f, err := os.OpenFile(filepath.Join(dir, name), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600); err == nil {
			f.Close()
		}
	}
	_ = writeFileAtomic(filepath.Join(dir, "pid"), strconv.Itoa(pid)+"\n")
}

// kill signals the process group of a command.
func (s *supervisor) kill(req initRequest, p peer) initReply {
	if !validExecID(req.ID) {
		return initReply{Code: ExitInvalid, Error: fmt.Sprintf("kill: bad exec id %q", req.ID)}
	}
	sig := int(syscall.SIGTERM)
	if req.Signal != nil {
		sig = *req.Signal
	}
	if sig < 0 || sig > 64 {
		return initReply{Code: ExitInvalid, Error: fmt.Sprintf("kill: bad signal %d", sig)}
	}
	pid, err := readExecPid(s.dir, req.ID)
	if err != nil {
		return initReply{Code: ExitNotFound, Error: err.Error()}
	}
	if p.uid != 0 {
		// as kill(2) would: only one's own commands
		if owner, err := procfs.UID(pid); err != nil || owner != p.uid {
			return initReply{Code: ExitError, Error: fmt.Sprintf("kill %s: uid %d may signal only its own commands", req.ID, p.uid)}
		}
	}
	// the group outlives its leader while processes the command left
	// behind are in it, and they are the command's too; but for another
	// than root only those of the group that are the asker's, as kill(2)
	// would: root's command may have become the user's and left a process
	// of root's in its group
	if p.uid != 0 {
		return signalOwnMembers(req.ID, pid, sig, p.uid)
	}
	if err := syscall.Kill(-pid, syscall.Signal(sig)); err != nil {
		if errors.Is(err, syscall.ESRCH) {
			return initReply{Code: ExitError, Error: fmt.Sprintf("kill %s: no process of it is left", req.ID)}
		}
		return initReply{Code: ExitError, Error: fmt.Sprintf("kill %s: %s", req.ID, err)}
	}
	return initReply{}
}

// signalOwnMembers sends sig to each process of group pgid whose real uid
// is uid.
func signalOwnMembers(id string, pgid, sig, uid int) initReply {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return initReply{Code: ExitError, Error: fmt.Sprintf("kill %s: %s", id, err)}
	}
	sent := 0
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid <= 0 {
			continue
		}
		if g, err := syscall.Getpgid(pid); err != nil || g != pgid {
			continue
		}
		if owner, err := procfs.UID(pid); err != nil || owner != uid {
			continue
		}
		if syscall.Kill(pid, syscall.Signal(sig)) == nil {
			sent++
		}
	}
	if sent == 0 {
		return initReply{Code: ExitError, Error: fmt.Sprintf("kill %s: no process of it is left", id)}
	}
	return initReply{}
}

// readExecPid returns the pid of the command id, from its exec directory.
func readExecPid(dir, id string) (int, error) {
	b, err := os.ReadFile(filepath.Join(dir, id, "pid"))
	if err != nil {
		return 0, fmt.Errorf("exec %s not found", id)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || pid <= 0 {
		return 0, fmt.Errorf("exec %s: bad pid file %q", id, b)
	}
	return pid, nil
}

// writeFileAtomic replaces path with content, root's alone (0600), so a
// reader sees all of it or nothing.
func writeFileAtomic(path, content string) error {
	return atomicfile.WriteString(path, content, 0o600)
}

// writeRecord writes one of an exec's records (its pid, its exit code)
// whole or not at all, unsynced: they live in /run/sbx, a tmpfs in the
// sandbox's memory, where a sync buys nothing (a capture keeps them as
// memory; a crash of the sandbox takes them with the commands).
func writeRecord(path, content string) error {
	return atomicfile.WriteBytesUnsynced(path, []byte(content), 0o600)
}

// devNull is the descriptor of /dev/null every command's stdin is, kept
// for init's life once it is opened and is the null device. A failed open
// (init out of descriptors, /dev/null gone) fails this spawn alone, and
// what is not a character device (root inside replaced it) is this
// spawn's alone (own: the caller closes it), as when each spawn opened it.
func (s *supervisor) devNull() (fd uintptr, own bool, err error) {
	s.nullMu.Lock()
	defer s.nullMu.Unlock()
	if s.nullOK {
		return s.null, false, nil
	}
	n, err := syscall.Open(os.DevNull, syscall.O_RDONLY|syscall.O_CLOEXEC, 0)
	if err != nil {
		return 0, false, &os.PathError{Op: "open", Path: os.DevNull, Err: err}
	}
	var st syscall.Stat_t
	if syscall.Fstat(n, &st) == nil && st.Mode&syscall.S_IFMT == syscall.S_IFCHR {
		s.null, s.nullOK = uintptr(n), true
		return s.null, false, nil
	}
	return uintptr(n), true, nil
}

// errUnreachable is callInit's error when no request was sent.
var errUnreachable = errors.New("cannot reach init")

// initBootWait is how long a request waits for an init that does not
// listen yet (one booting).
var initBootWait = 5 * time.Second

// callInit sends one request to init and returns its reply.
func callInit(req initRequest) (initReply, error) {
	conn, err := dialUnix(initSocket)
	// sbxd calls a sandbox ready once runsc has started its init, which
	// may not listen yet: a command asked for right then found nobody
	// ("connection refused", exit 125; 1 in 30 creates at load 16). Nobody
	// listening means nothing was asked, so asking again is safe.
	for start := time.Now(); err != nil && errors.Is(err, syscall.ECONNREFUSED) && time.Since(start) < initBootWait; {
		time.Sleep(20 * time.Millisecond)
		conn, err = dialUnix(initSocket)
	}
	if err != nil {
		return initReply{}, fmt.Errorf("%w on %s (is the sandbox's first process `sbx-agent init`?): %w", errUnreachable, initSocket, err)
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(clientTimeout))
	if err := json.NewEncoder(conn).Encode(req); err != nil {
		return initReply{}, fmt.Errorf("send to init: %w", err)
	}
	var rep initReply
	if err := json.NewDecoder(conn).Decode(&rep); err != nil {
		return initReply{}, fmt.Errorf("read reply from init: %w", err)
	}
	return rep, nil
}

// The socket is handled through x/sys and os.File rather than package net,
// which would add a quarter to the size of the binary.

// listenUnix listens on the unix socket name, abstract if it starts with '@'.
func listenUnix(name string) (*os.File, error) {
	fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, os.NewSyscallError("socket", err)
	}
	if err := unix.Bind(fd, &unix.SockaddrUnix{Name: name}); err != nil {
		unix.Close(fd)
		return nil, os.NewSyscallError("bind", err)
	}
	if err := unix.Listen(fd, 128); err != nil {
		unix.Close(fd)
		return nil, os.NewSyscallError("listen", err)
	}
	// non-blocking, so the runtime's poller waits for it and Close wakes it
	return os.NewFile(uintptr(fd), name), nil
}

// acceptUnix waits for a connection on ln and returns it.
func acceptUnix(ln *os.File) (*os.File, error) {
	rc, err := ln.SyscallConn()
	if err != nil {
		return nil, err
	}
	nfd, aerr := -1, error(nil)
	err = rc.Read(func(fd uintptr) bool {
		nfd, _, aerr = unix.Accept4(int(fd), unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC)
		return aerr != unix.EAGAIN
	})
	if err != nil {
		return nil, err
	}
	if aerr != nil {
		return nil, os.NewSyscallError("accept", aerr)
	}
	return os.NewFile(uintptr(nfd), "init-conn"), nil
}

// dialUnix connects to the unix socket name.
func dialUnix(name string) (*os.File, error) {
	fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, os.NewSyscallError("socket", err)
	}
	if err := unix.Connect(fd, &unix.SockaddrUnix{Name: name}); err != nil {
		unix.Close(fd)
		return nil, os.NewSyscallError("connect", err)
	}
	if err := unix.SetNonblock(fd, true); err != nil {
		unix.Close(fd)
		return nil, os.NewSyscallError("fcntl", err)
	}
	return os.NewFile(uintptr(fd), name), nil
}

// etcSource is where sbx puts a sandbox's resolv.conf, hosts and hostname
// (a read-only bind) for init to copy into /etc at boot.
var etcSource = "/run/sbx/etc"

// installEtc copies the sandbox's resolv.conf, hosts and hostname from src
// into dst, replacing the template's (a symlink included). They are then
// the sandbox's own files, on its disk and within its disk limit, free to
// change. A copy restored from a capture keeps what it had: init does not
// run again.
func installEtc(src, dst string) error {
	if _, err := os.Stat(src); err != nil {
		return nil // not given (an older sbx binds them itself)
	}
	if err := os.MkdirAll(dst, 0o755); err != nil {
		return err
	}
	var errs []error
	for _, name := range []string{"resolv.conf", "hosts", "hostname"} {
		b, err := os.ReadFile(filepath.Join(src, name))
		if err != nil {
			continue
		}
		target := filepath.Join(dst, name)
		if fi, err := os.Lstat(target); err == nil && !fi.Mode().IsRegular() {
			_ = os.RemoveAll(target) // a symlink, or a template's directory there
		}
		if err := writeFileAtomic(target, string(b)); err != nil {
			errs = append(errs, err)
			continue
		}
		_ = os.Chmod(target, 0o644)
	}
	return errors.Join(errs...)
}

// ptraceScope is Yama's switch: 1 (gVisor's default) lets a user trace
// only its own descendants, so `gdb -p`, `strace -p` and `gcore` of a
// process the user left running fail with EPERM.
var ptraceScope = "/proc/sys/kernel/yama/ptrace_scope"

// debuggable makes the sandbox a developer's box for debugging: the
// sandbox is its user's own kernel, so a user may trace any process of
// its own (ptrace_scope 0, the classic ptrace rules), as on a desktop
// distribution with Yama off.
func debuggable() error {
	if err := os.WriteFile(ptraceScope, []byte("0\n"), 0); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("ptrace_scope: %w", err)
	}
	return nil
}

// followHostname keeps /etc's hostname and hosts naming the sandbox it is
// in. A copy restored from a capture (a memory fork, `new --from`, a
// freeze's copy) gets its own hostname from gVisor but keeps the files of
// the sandbox it was taken from: sudo said "unable to resolve host". So
// when the hostname is not the one /etc/hostname names, the files are made
// to name it: /etc/hostname, and in /etc/hosts each name that was the old
// one (what else a user wrote there stays). Only inside gVisor: on the host
// (tests) the files are the host's. Cheap enough for every request.
func followHostname() {
	if !inGVisor() {
		return
	}
	var u unix.Utsname
	if err := unix.Uname(&u); err != nil {
		return
	}
	host := unix.ByteSliceToString(u.Nodename[:])
	// The files change only when the hostname does: a restore gives the
	// copy its own (this process's memory, and so followed, came with
	// the capture). Checked once per name, not on every request: each
	// check opened /etc/hostname, about a millisecond of every exec.
	followed.Lock()
	defer followed.Unlock()
	if followed.host == host {
		return
	}
	// cached only once the files agree: a rename that gave up (no
	// hostname file, one read in the middle of a rewrite, a FIFO root put
	// there) is tried again at the next request, as before the cache
	if renameHost("/etc", host) == nil && hostnameIs("/etc", host) {
		followed.host = host
	}
}

// hostnameIs says whether etc/hostname is a regular file that names host.
func hostnameIs(etc, host string) bool {
	b, err := readRegular(filepath.Join(etc, "hostname"), 4<<10)
	return err == nil && strings.TrimSpace(string(b)) == host
}

// followed is the hostname followHostname last made /etc name.
var followed struct {
	sync.Mutex
	host string
}

// inGVisor says whether this process runs in gVisor (/proc/gvisor is its).
var inGVisor = sync.OnceValue(func() bool {
	_, err := os.Stat("/proc/gvisor")
	return err == nil
})

// renameHost makes etc's hostname and hosts name host instead of the name
// etc/hostname holds. It does nothing when they agree, or when there is no
// hostname file to say what the old name was. Only regular files are read,
// and only so much of them: root inside may put a FIFO or /dev/zero there.
func renameHost(etc, host string) error {
	b, err := readRegular(filepath.Join(etc, "hostname"), 4<<10)
	if err != nil {
		return nil
	}
	old := strings.TrimSpace(string(b))
	if host == "" || old == host || old == "" || strings.ContainsAny(host, " \t\n#") {
		return nil
	}
	if hosts, err := readRegular(filepath.Join(etc, "hosts"), 1<<20); err == nil {
		lines := strings.SplitAfter(string(hosts), "\n")
		changed := false
		for i, line := range lines {
			body, nl := strings.CutSuffix(line, "\n")
			text, comment, hasComment := strings.Cut(body, "#")
			f := strings.Fields(text)
			hit := false
			for j := 1; j < len(f); j++ {
				if f[j] == old {
					f[j], hit = host, true
				}
			}
			if !hit {
				continue
			}
			body = f[0] + "\t" + strings.Join(f[1:], " ")
			if hasComment {
				body += " #" + comment
			}
			if nl {
				body += "\n"
			}
			lines[i], changed = body, true
		}
		if changed {
			if err := writeFileAtomic(filepath.Join(etc, "hosts"), strings.Join(lines, "")); err != nil {
				return err
			}
			_ = os.Chmod(filepath.Join(etc, "hosts"), 0o644)
		}
	}
	if err := writeFileAtomic(filepath.Join(etc, "hostname"), host+"\n"); err != nil {
		return err
	}
	return os.Chmod(filepath.Join(etc, "hostname"), 0o644)
}

// readRegular reads path if it is a regular file of at most max bytes; it
// never blocks on a FIFO or a device.
func readRegular(path string, max int64) ([]byte, error) {
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NONBLOCK, 0)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if !fi.Mode().IsRegular() || fi.Size() > max {
		return nil, fmt.Errorf("%s: not a regular file of at most %d bytes", path, max)
	}
	return io.ReadAll(io.LimitReader(f, max))
}

// selfExe is the agent binary (tests use one they built).
var selfExe = ""

func agentExe() (string, error) {
	if selfExe != "" {
		return selfExe, nil
	}
	return os.Executable()
}

// consolePath is where init provides the console device.
var consolePath = "/dev/console"

// serveConsole provides a console device: gVisor has none, and a write to
// /dev/console would silently create a plain file in the sandbox's /dev,
// each `echo > /dev/console` wiping the last. So init makes it a FIFO, keeps
// it open (read and write, so it never sees the end), and copies what is
// written to it to its own output: the sandbox's console log. A FIFO
// ignores O_TRUNC, lives inside the sandbox (checkpoints carry it), and
// whatever writes it needs no access to any process's stdout.
func serveConsole(path string, out io.Writer) error {
	if fi, err := os.Lstat(path); err == nil && fi.Mode()&os.ModeNamedPipe == 0 {
		if err := os.Remove(path); err != nil {
			return err
		}
	}
	if err := unix.Mkfifo(path, 0o622); err != nil && !errors.Is(err, os.ErrExist) {
		return err
	}
	// every user writes the console, as a terminal's; only init reads it
	// (the umask took the others' write bits, and a FIFO left by an image
	// has whatever mode it had)
	if err := os.Chmod(path, 0o622); err != nil {
		return err
	}
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		return err
	}
	go func() {
		buf := make([]byte, 32<<10)
		for {
			n, err := f.Read(buf)
			if n > 0 {
				// a control line on the console is init's alone
				for i, c := range buf[:n] {
					if c == freezewire.ControlByte {
						buf[i] = '?'
					}
				}
				_, _ = out.Write(buf[:n])
			}
			if err != nil {
				return
			}
		}
	}()
	return nil
}

// ignoreOtherSignals takes, and drops, every signal init does not act on,
// so that none sent from inside ends it: Go's runtime dies of a SIGHUP,
// SIGQUIT, SIGUSR1 or SIGPIPE it was not asked to take, and of a SIGSEGV,
// SIGBUS or SIGABRT that kill(2) sent (a real fault of init's own still
// crashes it). What init has no handler for at all the sandbox's kernel
// drops, SIGKILL and SIGSTOP among them (third_party/gvisor, patch 05),
// as Linux drops what a namespace sends its init. SIGTERM and SIGINT still
// end init, and the sandbox with it; SIGCHLD is the supervisor's. A caught
// signal goes back to its default in what init starts.
func ignoreOtherSignals() {
	var sigs []os.Signal
	for s := syscall.Signal(1); s < 32; s++ {
		switch s {
		case syscall.SIGKILL, syscall.SIGSTOP, syscall.SIGTERM, syscall.SIGINT, syscall.SIGCHLD, syscall.SIGURG, syscall.SIGPROF:
			continue
		}
		sigs = append(sigs, s)
	}
	c := make(chan os.Signal, 8)
	signal.Notify(c, sigs...)
	go func() {
		for range c {
		}
	}()
}
