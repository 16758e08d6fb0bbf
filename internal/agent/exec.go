package agent

import (
	"cmp"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"sbx.dev/sbx/internal/procfs"
)

const execSyntax = "exec [--timeout DURATION] [--cwd DIR] [--env K=V]... [--user USER] -- PROG [ARGS...]"

// execArgsEnv carries the arguments of `sbx-agent exec` when init starts a
// timed command: the agent then shows as `sbx-agent exec` alone, and no
// process of sbx's carries the user's command line (`pgrep -f server.py`
// found the agent waiting on `pgrep -f server.py`; `pkill -f` as root
// killed its own exec). The agent removes it before the command starts.
const execArgsEnv = "SBX_AGENT_EXEC_ARGS"

// defaultPath is the search path when $PATH is unset, as in a login shell.
const defaultPath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// forwarded are the signals the agent passes on to the command's process group.
var forwarded = []os.Signal{syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP, syscall.SIGQUIT}

// runExec runs a command in its own process group and returns its exit code
// (128+N if signal N killed it). Its own failures are reported on stderr as
// "sbx: <message>" with ExitUsageExec, ExitCannotExec, ExitNotFoundExec,
// ExitTimeoutExec or ExitError for a missing --cwd.
func runExec(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		if v, ok := os.LookupEnv(execArgsEnv); ok {
			// init's way of starting a timed command (see execArgsEnv)
			os.Unsetenv(execArgsEnv)
			if err := json.Unmarshal([]byte(v), &args); err != nil {
				fmt.Fprintf(stderr, "sbx: exec: %s: %s\n", execArgsEnv, err)
				return ExitUsageExec
			}
		}
	}
	followHostname() // a terminal's agent is no request to init
	fset := flag.NewFlagSet("exec", flag.ContinueOnError)
	fset.SetOutput(io.Discard)
	timeout := fset.Duration("timeout", 0, "kill the command after this long (0: never)")
	cwd := fset.String("cwd", "", "directory to run the command in")
	var env envFlag
	fset.Var(&env, "env", "KEY=VALUE to set for the command (repeatable; wins over the sandbox's own)")
	userName := fset.String("user", "", "run the command as this user: a name or uid, with :group (the sandbox's /etc/passwd)")
	as := fset.String("as", "", "run the command, not the agent, as UID:GID[:GROUP,...], its environment as given (init's)")
	if err := fset.Parse(args); err != nil {
		fmt.Fprintf(stderr, "sbx: exec: %s; usage: sbx-agent %s\n", err, execSyntax)
		return ExitUsageExec
	}
	var cred *syscall.Credential
	if *userName != "" {
		u, err := lookupUser(*userName)
		if err != nil {
			fmt.Fprintf(stderr, "sbx: user %s: %s\n", *userName, oneLine(err.Error()))
			return ExitUsageExec
		}
		cred = &syscall.Credential{Uid: uint32(u.uid), Gid: uint32(u.gid)}
		for _, g := range u.groups {
			cred.Groups = append(cred.Groups, uint32(g))
		}
		// the user's own, unless --env says otherwise (applied below)
		os.Setenv("HOME", cmp.Or(u.home, "/"))
		os.Setenv("USER", u.name)
		os.Setenv("LOGNAME", u.name)
	}
	if *as != "" {
		c, err := parseCred(*as)
		if err != nil {
			fmt.Fprintf(stderr, "sbx: exec: --as %q: %s\n", *as, err)
			return ExitUsageExec
		}
		cred = c
	}
	argv := fset.Args()
	switch {
	case len(argv) == 0 || argv[0] == "":
		fmt.Fprintf(stderr, "sbx: exec: no command given; usage: sbx-agent %s\n", execSyntax)
		return ExitUsageExec
	case *timeout < 0:
		fmt.Fprintf(stderr, "sbx: exec: negative timeout %s\n", *timeout)
		return ExitUsageExec
	}
	for _, kv := range env {
		k, v, _ := strings.Cut(kv, "=")
		if k == "" {
			fmt.Fprintf(stderr, "sbx: exec: --env %q is not KEY=VALUE\n", kv)
			return ExitUsageExec
		}
		// set before the lookup: a PATH given here is the one searched
		os.Setenv(k, v)
	}
	if *cwd != "" {
		// the agent is a one-shot process, so it simply moves there: the
		// program lookup then resolves relative names as the child will
		if err := os.Chdir(*cwd); err != nil {
			fmt.Fprintf(stderr, "sbx: cwd %s: %s\n", *cwd, cwdReason(err))
			return ExitError
		}
	}
	prog, code, msg := lookProg(argv[0])
	if code != 0 {
		fmt.Fprintf(stderr, "sbx: %s: %s\n", argv[0], msg)
		return code
	}
	if *timeout == 0 {
		if cred != nil {
			// the agent too (--as is for a timeout's agent only, which
			// stays root: at the user's process limit, a Go program of
			// theirs could not get the thread to kill them with)
			// become the user for good, then become the command
			if err := dropTo(cred); err != nil {
				fmt.Fprintf(stderr, "sbx: user %s: %s\n", *userName, err)
				return ExitError
			}
			// the command below (a terminal's, which execInPlace leaves to
			// it) is started as the user it already is: setgroups, which
			// a Credential does, is not the user's to call
			cred = nil
		}
		if code, ok := execInPlace(prog, argv, stdin, stdout, stderr); ok {
			return code
		}
	}
	// subreaper: descendants orphaned by a dying parent come to the agent
	// rather than to init, so the timeout can still find and kill them.
	// Best effort: killTree stops the whole tree before it kills any of it.
	_ = unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
	if *timeout > 0 {
		// The threads the kill at the deadline needs, made now: a command
		// that forks up to its process limit (root's is the sandbox's too)
		// leaves none to make then, and a Go program that cannot make a
		// thread dies.
		spareThreads(8)
	}

	cmd := &exec.Cmd{
		Path:        prog,
		Args:        argv,
		Stdin:       stdin,
		Stdout:      stdout,
		Stderr:      stderr,
		SysProcAttr: &syscall.SysProcAttr{Setpgid: true, Credential: cred},
		// only matters when stdio is not an *os.File (tests): do not wait
		// for background processes that keep the output pipes open
		WaitDelay: 200 * time.Millisecond,
	}
	if cred != nil && *cwd != "" {
		// the agent, root, went there; the command goes there as the
		// user, after it has become them: a directory they may not enter
		// is refused, as it is without a timeout
		cmd.Dir = *cwd
	}
	if tty, ok := stdin.(*os.File); ok && isTerminal(tty) {
		// a background process group reading the terminal would be
		// stopped by SIGTTIN, so the command gets the foreground
		cmd.SysProcAttr.Foreground = true
		cmd.SysProcAttr.Ctty = int(tty.Fd())
	}

	sigs := make(chan os.Signal, 8)
	signal.Notify(sigs, forwarded...)
	defer signal.Stop(sigs)
	// SIGTTOU would stop the agent if it wrote to the terminal from the
	// background after giving the foreground to the command. Caught, not
	// ignored: an ignored signal stays ignored in the command after exec.
	signal.Notify(make(chan os.Signal, 1), syscall.SIGTTOU)

	if err := cmd.Start(); err != nil {
		code, msg := startFailure(err)
		fmt.Fprintf(stderr, "sbx: %s: %s\n", argv[0], msg)
		return code
	}
	pgid := cmd.Process.Pid

	waited := make(chan error, 1)
	go func() { waited <- cmd.Wait() }()

	var deadline <-chan time.Time
	if *timeout > 0 {
		timer := time.NewTimer(*timeout)
		defer timer.Stop()
		deadline = timer.C
	}
	for {
		select {
		case sig := <-sigs:
			_ = syscall.Kill(-pgid, sig.(syscall.Signal))
		case err := <-waited:
			return exitCode(cmd, err, stderr)
		case <-deadline:
			// the group at once (a fork bomb's children stay in it), then
			// whatever left it
			_ = syscall.Kill(-pgid, syscall.SIGKILL)
			killTree(os.Getpid(), pgid)
			<-waited
			fmt.Fprintf(stderr, "sbx: command timed out after %s\n", *timeout)
			return ExitTimeoutExec
		}
	}
}

// parseCred parses UID:GID[:GROUP,...].
func parseCred(s string) (*syscall.Credential, error) {
	f := strings.Split(s, ":")
	if len(f) < 2 || len(f) > 3 {
		return nil, errors.New("want UID:GID[:GROUP,...]")
	}
	num := func(v string) (uint32, error) {
		n, err := strconv.ParseUint(v, 10, 32)
		if err != nil {
			return 0, fmt.Errorf("%q is not a number", v)
		}
		return uint32(n), nil
	}
	uid, err := num(f[0])
	if err != nil {
		return nil, err
	}
	gid, err := num(f[1])
	if err != nil {
		return nil, err
	}
	c := &syscall.Credential{Uid: uid, Gid: gid}
	if len(f) == 3 && f[2] != "" {
		for _, g := range strings.Split(f[2], ",") {
			n, err := num(g)
			if err != nil {
				return nil, err
			}
			c.Groups = append(c.Groups, n)
		}
	}
	return c, nil
}

// formatCred is parseCred's inverse.
func formatCred(c *syscall.Credential) string {
	gs := make([]string, len(c.Groups))
	for i, g := range c.Groups {
		gs[i] = strconv.FormatUint(uint64(g), 10)
	}
	return fmt.Sprintf("%d:%d:%s", c.Uid, c.Gid, strings.Join(gs, ","))
}

// dropTo makes this process (every thread of it) the user cred names.
func dropTo(cred *syscall.Credential) error {
	groups := make([]int, len(cred.Groups))
	for i, g := range cred.Groups {
		groups[i] = int(g)
	}
	if err := syscall.Setgroups(groups); err != nil {
		return err
	}
	if err := syscall.Setgid(int(cred.Gid)); err != nil {
		return err
	}
	return syscall.Setuid(int(cred.Uid))
}

// exitCode is the shell's view of how the command ended.
func exitCode(cmd *exec.Cmd, err error, stderr io.Writer) int {
	if cmd.ProcessState == nil {
		fmt.Fprintf(stderr, "sbx: wait: %s\n", err)
		return ExitError
	}
	if ws, ok := cmd.ProcessState.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		return 128 + int(ws.Signal())
	}
	return cmd.ProcessState.ExitCode()
}

func cwdReason(err error) string {
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return "no such directory"
	case errors.Is(err, syscall.ENOTDIR):
		return "not a directory"
	case errors.Is(err, fs.ErrPermission):
		return "permission denied"
	}
	var pe *fs.PathError
	if errors.As(err, &pe) {
		return pe.Err.Error()
	}
	return err.Error()
}

// lookProg finds the program to run as a POSIX shell does: a name with a
// slash is used as it is, any other is searched in $PATH. It returns the path,
// or an exit code (127 not found, 126 not executable) and the reason.
func lookProg(name string) (path string, code int, msg string) {
	pathEnv, ok := os.LookupEnv("PATH")
	if !ok {
		pathEnv = defaultPath
	}
	return lookProgIn(name, pathEnv, "")
}

// lookProgIn is lookProg for a process that is not the caller: it searches
// pathEnv, and resolves relative names against dir ("" for the current
// directory), returning them joined to it.
func lookProgIn(name, pathEnv, dir string) (path string, code int, msg string) {
	inDir := func(p string) string {
		if dir == "" || filepath.IsAbs(p) {
			return p
		}
		return filepath.Join(dir, p)
	}
	if strings.Contains(name, "/") {
		if code, msg := checkExecutable(inDir(name)); code != 0 {
			return "", code, msg
		}
		return inDir(name), 0, ""
	}
	var denied string
	for _, dir := range filepath.SplitList(pathEnv) {
		if dir == "" {
			dir = "."
		}
		p := filepath.Join(dir, name)
		if !strings.Contains(p, "/") {
			p = "./" + p
		}
		p = inDir(p)
		code, _ := checkExecutable(p)
		if code == 0 {
			return p, 0, ""
		}
		if code == ExitCannotExec && denied == "" {
			denied = p
		}
	}
	if denied != "" {
		// a shell runs the first match it can and reports the first match
		// it could not, when none is runnable
		_, msg := checkExecutable(denied)
		return "", ExitCannotExec, msg
	}
	return "", ExitNotFoundExec, "command not found"
}

// checkExecutable says whether the file at p can be run: 0 if so, else the
// exit code and reason.
func checkExecutable(p string) (int, string) {
	fi, err := os.Stat(p)
	switch {
	case errors.Is(err, fs.ErrNotExist), errors.Is(err, syscall.ENOTDIR):
		return ExitNotFoundExec, "command not found"
	case err != nil:
		return ExitCannotExec, cwdReason(err)
	case fi.IsDir():
		return ExitCannotExec, "is a directory"
	case !fi.Mode().IsRegular():
		return ExitCannotExec, "not a regular file"
	}
	if unix.Access(p, unix.X_OK) != nil {
		return ExitCannotExec, "permission denied"
	}
	return 0, ""
}

// startFailure maps an error from starting the command to its exit code.
func startFailure(err error) (int, string) {
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return ExitNotFoundExec, "command not found"
	case errors.Is(err, fs.ErrPermission):
		return ExitCannotExec, "permission denied"
	case errors.Is(err, syscall.ENOEXEC):
		return ExitCannotExec, "cannot execute: exec format error"
	}
	var pe *fs.PathError
	if errors.As(err, &pe) {
		return ExitCannotExec, pe.Err.Error()
	}
	return ExitCannotExec, err.Error()
}

func isTerminal(f *os.File) bool {
	_, err := unix.IoctlGetTermios(int(f.Fd()), unix.TCGETS)
	return err == nil
}

// killTree kills process group pgid and every live descendant of process
// root, including those that left the group or the session. Stopped
// processes cannot fork, so it stops the tree until a scan finds nothing new,
// then kills it all, and repeats until no descendant is left.
func killTree(root, pgid int) {
	_ = syscall.Kill(-pgid, syscall.SIGSTOP)
	stopped := map[int]bool{}
	for range 50 {
		found := false
		for _, pid := range descendants(root) {
			if !stopped[pid] {
				stopped[pid] = true
				found = true
				_ = syscall.Kill(pid, syscall.SIGSTOP)
			}
		}
		if !found {
			break
		}
	}
	_ = syscall.Kill(-pgid, syscall.SIGKILL)
	for pid := range stopped {
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
	// SIGKILL is delivered asynchronously; anything forked in between, or
	// missed by a scan racing a fork, is caught by the next round
	deadline := time.Now().Add(5 * time.Second)
	for delay := time.Millisecond; time.Now().Before(deadline); delay = min(2*delay, 50*time.Millisecond) {
		pids := descendants(root)
		if len(pids) == 0 {
			return
		}
		for _, pid := range pids {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
		time.Sleep(delay)
	}
}

// killUnder kills every process of command root but root itself: its
// process group and its descendants, those that left the group or the
// session included, and any child of a process it has seen, wherever that
// child went. root, stopped by the caller (and again each round: one of
// its own may continue it), stays alive throughout as their anchor: it is
// their subreaper (sbx-reaper), so what is orphaned meanwhile comes to it
// and is found by the next scan, never to init, where it would be lost.
// Each round first stops them all (the group at once, then whatever a
// scan finds, until a scan finds nothing new: a stopped process cannot
// fork, so a fork bomb stops growing), then kills all it found. Past
// killStopFor, processes that continue one another (kill -CONT -1) have
// beaten the stops: rounds then kill what each scan finds at once, which
// no SIGCONT undoes. It returns once three scans in a row find none, or
// after killGiveUp. The caller then kills root.
func killUnder(root int) {
	known := map[int]bool{}
	start := time.Now()
	empty := 0 // scans in a row that found none
	for delay := time.Millisecond; ; delay = min(2*delay, 50*time.Millisecond) {
		late := time.Since(start) > killStopFor
		_ = syscall.Kill(-root, syscall.SIGSTOP) // its group, root too
		_ = syscall.Kill(root, syscall.SIGSTOP)  // if it left the group
		var pids []int
		for range 50 {
			pids = treeOf(root, known)
			fresh := false
			for _, pid := range pids {
				if !known[pid] {
					known[pid] = true
					fresh = true
				}
				if late {
					_ = syscall.Kill(pid, syscall.SIGKILL)
				} else {
					_ = syscall.Kill(pid, syscall.SIGSTOP)
				}
			}
			if !fresh {
				break
			}
		}
		for _, pid := range pids {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
		// a fork in flight when its parent was killed shows up after the
		// scan: only scans that find none three times over, 50 ms
		// apart, end it (one empty scan was taken for the end, root was
		// killed, and what came next was orphaned to init for good)
		if len(pids) == 0 {
			empty++
			delay = 50 * time.Millisecond
		} else {
			empty = 0
		}
		if empty >= 3 || time.Since(start) > killGiveUp {
			return
		}
		time.Sleep(delay)
	}
}

// The phases of killUnder: stop then kill, then kill at once, then give
// up (a storm that outruns the kills: none is known).
const (
	killStopFor = 5 * time.Second
	killGiveUp  = 30 * time.Second
)

// treeOf lists the live processes of root but root: the members of its
// process group and the descendants of root and of every process in
// known, from one scan of /proc.
func treeOf(root int, known map[int]bool) []int {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	children := map[int][]int{}
	var out []int
	seen := map[int]bool{root: true}
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == root {
			continue
		}
		ppid, state, ok := procStat(pid)
		if !ok || state == 'Z' || state == 'X' {
			continue
		}
		children[ppid] = append(children[ppid], pid)
		if pg, err := syscall.Getpgid(pid); err == nil && pg == root {
			seen[pid] = true
			out = append(out, pid)
		}
	}
	queue := append([]int{root}, out...)
	for pid := range known {
		queue = append(queue, pid)
	}
	for len(queue) > 0 {
		p := queue[0]
		queue = queue[1:]
		for _, c := range children[p] {
			if !seen[c] {
				seen[c] = true
				out = append(out, c)
				queue = append(queue, c)
			}
		}
	}
	return out
}

// spareThreads has the Go runtime make n threads now and keep them idle
// (it keeps the threads it made), for work that must not need a new one.
func spareThreads(n int) {
	var wg sync.WaitGroup
	release := make(chan struct{})
	for range n {
		wg.Add(1)
		go func() {
			runtime.LockOSThread() // a thread of its own while locked
			wg.Done()
			<-release
			runtime.UnlockOSThread()
		}()
	}
	wg.Wait()
	close(release)
}

// descendants lists the live (not zombie) processes below root, from the
// parent links in /proc/*/stat.
func descendants(root int) []int {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	children := map[int][]int{}
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		ppid, state, ok := procStat(pid)
		if !ok || state == 'Z' || state == 'X' {
			continue
		}
		children[ppid] = append(children[ppid], pid)
	}
	var out []int
	queue := []int{root}
	seen := map[int]bool{root: true}
	for len(queue) > 0 {
		p := queue[0]
		queue = queue[1:]
		for _, c := range children[p] {
			if !seen[c] {
				seen[c] = true
				out = append(out, c)
				queue = append(queue, c)
			}
		}
	}
	return out
}

// procStat reads the parent pid and state of pid from /proc/PID/stat.
func procStat(pid int) (ppid int, state byte, ok bool) {
	st, err := procfs.ReadStat(pid)
	if err != nil {
		return 0, 0, false
	}
	return st.PPid, st.State, true
}

// envFlag collects repeated --env KEY=VALUE flags. They are applied by the
// agent rather than given to runsc, because runsc appends them to the
// sandbox's environment and the first of two equal keys is the one most
// programs read.
type envFlag []string

func (e *envFlag) String() string     { return strings.Join(*e, ",") }
func (e *envFlag) Set(v string) error { *e = append(*e, v); return nil }

// execInPlace replaces the agent with the command when nothing needs to
// watch it (no timeout): a fork and a wait inside gVisor cost about as much
// as the rest of an exec. The command leads its own process group, as in
// the supervised path; runsc reports its exit code, or 128+N for signal N.
// It returns ok=false, having done nothing, when it cannot be used: stdio
// that is not the process's own files (tests) or a terminal (which needs
// the supervised foreground dance). When exec itself fails it reports the
// failure as the supervised path would.
func execInPlace(prog string, argv []string, stdin io.Reader, stdout, stderr io.Writer) (int, bool) {
	if stdin != io.Reader(os.Stdin) || stdout != io.Writer(os.Stdout) || stderr != io.Writer(os.Stderr) {
		return 0, false
	}
	if isTerminal(os.Stdin) {
		return 0, false
	}
	if err := syscall.Setpgid(0, 0); err != nil {
		return 0, false
	}
	err := syscall.Exec(prog, argv, os.Environ())
	code, msg := startFailure(err)
	fmt.Fprintf(stderr, "sbx: %s: %s\n", argv[0], msg)
	return code, true
}
