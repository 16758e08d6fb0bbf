package agent

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/binary"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"path"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"sbx.dev/sbx/internal/agent/hooks"
)

// The hunt loop (`sbx-agent hunt --config FILE`), which `sbx hunt` starts
// inside the sandbox as a detached exec, so that it goes on when the client
// goes away. It runs the setup once, then the test up to Runs times, each
// with a fresh seed; processes a passing run leaves behind are killed
// before the next run, so runs do not see each other (a leaked server would
// make every later run pass). On the first failure it records, before
// anything else changes, the run, its seed and the time (HuntDir/failed),
// then the evidence: the process forest first, then at once the
// listeners, and the open files and stacks of each process the run left
// behind; a leaked process that does not listen yet is looked at again
// when it does, or ListenWait after the failure at the latest. Then the
// collected paths. The client, following the loop's stdout, does the rest
// from outside (a fork, the artifacts, a snapshot, a stop).
//
// With Freeze, the failure is frozen instead (freeze.go): a run that froze
// itself (the sbx_freeze pytest plugin, the Go helper, a crash handler)
// is the failure, kept at its own failing instant; any other failing run
// is frozen by the loop as it ends (its leftovers alive, the test itself
// gone). The evidence is then read from a copy of the frozen sandbox
// (`sbx-agent hunt --evidence`), so that it is the failing instant's.
//
// The loop writes one line per step on its stdout; the test's and the
// setup's output go to files, so that the lines cannot be mixed up.

// DefaultListenWait is how long after a failure the loop keeps looking for
// the leaked processes' listeners: a leaked server may still be starting
// (often the very reason the test failed), and its listener is the evidence.
const DefaultListenWait = 1500 * time.Millisecond

// maxStacks is how many leaked processes get a gdb stack, two at a time: a
// test that leaks a worker pool must not start a gdb per worker at once
// (each can take hundreds of MiB, and the sandbox has a memory limit).
const maxStacks = 8

// procRoot is /proc (tests use their own pid namespace, not another /proc).
var procRoot = "/proc"

type hunt struct {
	cfg     HuntConfig
	out     io.Writer
	timeout time.Duration
	wait    time.Duration
	self    int
	mu      sync.Mutex // the steps log and stdout
}

func readHuntConfig(file string) (HuntConfig, error) {
	var c HuntConfig
	b, err := os.ReadFile(file)
	if err != nil {
		return c, err
	}
	if err := json.Unmarshal(b, &c); err != nil {
		return c, fmt.Errorf("%s: %w", file, err)
	}
	switch {
	case c.Dir == "" || !filepath.IsAbs(c.Dir):
		return c, fmt.Errorf("%s: dir %q: want an absolute path", file, c.Dir)
	case len(c.Test) == 0 && c.Runs > 0:
		return c, fmt.Errorf("%s: no test command", file)
	case c.SeedEnv == "" || strings.ContainsAny(c.SeedEnv, "= "):
		return c, fmt.Errorf("%s: seedEnv %q: want a variable name", file, c.SeedEnv)
	}
	return c, nil
}

// runHunt is `sbx-agent hunt --config FILE [--evidence]`.
func runHunt(args []string, stdout, stderr io.Writer) int {
	fset := flag.NewFlagSet("hunt", flag.ContinueOnError)
	fset.SetOutput(io.Discard)
	file := fset.String("config", "", "the hunt's configuration (JSON, see HuntConfig)")
	evidence := fset.Bool("evidence", false, "read the evidence of a frozen failure, in a copy of the frozen sandbox")
	if err := fset.Parse(args); err != nil || fset.NArg() != 0 || *file == "" {
		fmt.Fprintln(stderr, "sbx-agent: hunt: usage: sbx-agent hunt --config FILE [--evidence]")
		return ExitInvalid
	}
	cfg, err := readHuntConfig(*file)
	if err != nil {
		fmt.Fprintf(stderr, "sbx-agent: hunt: %s\n", oneLine(err.Error()))
		return ExitInvalid
	}
	h := &hunt{cfg: cfg, out: stdout, self: os.Getpid(), wait: DefaultListenWait}
	if cfg.Timeout != "" {
		if h.timeout, err = time.ParseDuration(cfg.Timeout); err != nil || h.timeout <= 0 {
			fmt.Fprintf(stderr, "sbx-agent: hunt: timeout %q: want a positive duration\n", cfg.Timeout)
			return ExitInvalid
		}
	}
	if cfg.ListenWait != "" {
		if h.wait, err = time.ParseDuration(cfg.ListenWait); err != nil || h.wait < 0 {
			fmt.Fprintf(stderr, "sbx-agent: hunt: listenWait %q: want a duration\n", cfg.ListenWait)
			return ExitInvalid
		}
	}
	if err := os.MkdirAll(cfg.Dir, 0o755); err != nil {
		fmt.Fprintf(stderr, "sbx-agent: hunt: %s\n", err)
		return ExitError
	}
	if *evidence {
		return h.frozenEvidence()
	}
	// a signal a test sends its parent (kill -USR1 $PPID) must not end the
	// loop; caught, not ignored, so the runs get them as they should
	sigs := make(chan os.Signal, 8)
	signal.Notify(sigs, syscall.SIGUSR1, syscall.SIGUSR2, syscall.SIGHUP, syscall.SIGPIPE)
	go func() {
		for range sigs {
		}
	}()
	return h.loop()
}

func (h *hunt) say(format string, args ...any) {
	h.mu.Lock()
	defer h.mu.Unlock()
	fmt.Fprintf(h.out, format+"\n", args...)
}

func (h *hunt) file(name string) string { return filepath.Join(h.cfg.Dir, name) }

// step notes a step, with the time, in steps.log.
func (h *hunt) step(what string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	f, err := os.OpenFile(h.file("steps.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return
	}
	defer f.Close()
	fmt.Fprintf(f, "%s %s\n", epoch(time.Now()), what)
}

// epoch is t in seconds since the epoch, with nanoseconds.
func epoch(t time.Time) string { return fmt.Sprintf("%d.%09d", t.Unix(), t.Nanosecond()) }

func (h *hunt) loop() int {
	work := cmp.Or(h.cfg.Work, "/")
	if fi, err := os.Stat(work); err != nil || !fi.IsDir() {
		work = "/"
	}
	if h.cfg.Setup != "" {
		h.say("sbx-hunt: setup")
		code, _, err := h.run(work, []string{"/bin/sh", "-c", h.cfg.Setup}, nil, h.file("setup.out"), 0)
		if err != nil {
			appendFile(h.file("setup.out"), "sbx: "+err.Error()+"\n")
		}
		if code != 0 {
			h.say("sbx-hunt: setup failed exit %d", code)
			return HuntSetupFailed
		}
	}
	env := []string(nil)
	if h.cfg.Freeze {
		env = freezeEnv(os.Environ())
	}
	i := 0
	for i < h.cfg.Runs {
		i++
		seed := newSeed()
		before := pids()
		writePids(h.file("pids.before"), before)
		_ = os.WriteFile(h.file("current"), []byte(strconv.Itoa(i)+"\n"), 0o644)
		_ = os.WriteFile(h.file("seed"), []byte(seed+"\n"), 0o644)
		argv := h.cfg.Test
		crashesBefore := crashCount(h.cfg.CrashCount)
		runEnv := append(slices.Clone(env), h.cfg.SeedEnv+"="+seed)
		started := time.Now()
		code, timedOut, err := h.run(work, argv, runEnv, h.file("run.out"), h.timeout)
		if err != nil {
			appendFile(h.file("run.out"), "sbx: "+err.Error()+"\n")
		}
		crashed := false
		if h.cfg.OnCrash && code == 0 && crashCount(h.cfg.CrashCount) > crashesBefore {
			// a process of the run crashed, though the run passed: the
			// boot's one capture is that crash's, so the hunt ends here
			appendFile(h.file("run.out"), "sbx: a process of this run crashed (see sbx crashes); the run passed, but --on-crash ends the hunt at a crash\n")
			crashed = true
		}
		var froze *FreezeRecord
		if h.cfg.Freeze {
			if r, ok := freezeStatus(); ok {
				if r.State == FreezeCopy || r.State == FreezeInterrupted {
					hold() // a copy of the frozen sandbox: the hunt is the original's
				}
				if (r.State == FreezeFrozen || r.State == FreezeFailed || r.State == FreezeUnconfirmed) && r.Triggered.After(started) {
					froze = &r // the run froze itself
				}
			}
		}
		if code == 0 && froze == nil && !crashed {
			h.say("%s %d seed %s exit 0", HuntLineRun, i, seed)
			// each run starts clean: what a passing run left behind goes
			killAll(h.leftovers(before, pids()))
			continue
		}
		return h.failed(i, seed, code, timedOut, before, froze)
	}
	_ = os.WriteFile(h.file("nofailure"), nil, 0o644)
	h.say("sbx-hunt: no failure in %d runs", i)
	return HuntNoFailure
}

// freezeEnv is the environment of runs under --freeze: the pytest plugin
// importable and loaded, and the hooks told to freeze.
func freezeEnv(env []string) []string {
	get := func(k string) string {
		for _, kv := range env {
			if v, ok := strings.CutPrefix(kv, k+"="); ok {
				return v
			}
		}
		return ""
	}
	pp := hooks.PythonDir
	if old := get("PYTHONPATH"); slices.Contains(strings.Split(old, ":"), hooks.PythonDir) {
		pp = old // every command has it already (hooks.Env)
	} else if old != "" {
		pp += ":" + old
	}
	addopts := "-p sbx_freeze"
	if old := get("PYTEST_ADDOPTS"); old != "" {
		if strings.Contains(old, "sbx_freeze") {
			addopts = old
		} else {
			addopts += " " + old
		}
	}
	return []string{"PYTHONPATH=" + pp, "PYTEST_ADDOPTS=" + addopts, "SBX_FREEZE=1"}
}

// crashCount is the sandbox's count of crashes since it started (0 if
// unknown), from file ("": CrashDir/count).
func crashCount(file string) int {
	if file == "" {
		file = filepath.Join(CrashDir, CrashCountFile)
	}
	b, err := os.ReadFile(file)
	if err != nil {
		return 0
	}
	n, _ := strconv.Atoi(strings.TrimSpace(string(b)))
	return n
}

// freezeStatus asks init for the last freeze's record.
func freezeStatus() (FreezeRecord, bool) {
	rep, err := callInit(initRequest{Op: "freeze-status"})
	if err != nil || rep.Freeze == nil {
		return FreezeRecord{}, false
	}
	return *rep.Freeze, true
}

// failed records run i's failure and its evidence (or its freeze).
func (h *hunt) failed(i int, seed string, code int, timedOut bool, before map[int]bool, froze *FreezeRecord) int {
	t := time.Now()
	switch {
	case froze == nil:
	case !froze.FailedAt.IsZero():
		t = froze.FailedAt // the run's own word on when it failed
	case !froze.Triggered.IsZero():
		t = froze.Triggered // it froze at its failure, and said no more
	}
	rec := fmt.Sprintf("run=%d\nseed=%s\nexit=%d\ntime=%s\n", i, seed, code, epoch(t))
	if timedOut {
		rec += "timedout=1\n"
	}
	_ = os.WriteFile(h.file("failed"), []byte(rec), 0o644)
	h.say("%s %d seed %s exit %d time %s", HuntLineFailed, i, seed, code, epoch(t))
	if h.cfg.Freeze {
		if froze == nil {
			// any other command: frozen as it ends, its leftovers alive
			rep, err := callInitFreeze(initRequest{Op: "freeze", Reason: fmt.Sprintf("hunt run %d exited %d", i, code), FailedAt: epoch(t), Self: true})
			switch {
			case err != nil:
				froze = &FreezeRecord{State: FreezeFailed, Error: err.Error()}
			case rep.Freeze == nil:
				froze = &FreezeRecord{State: FreezeFailed, Error: rep.Error}
			default:
				froze = rep.Freeze
			}
			if froze.State == FreezeCopy {
				hold() // this is the copy: its evidence is read from outside
			}
		}
		if froze.State == FreezeFrozen {
			b, _ := json.MarshalIndent(froze, "", "  ")
			_ = os.WriteFile(h.file("frozen"), append(b, '\n'), 0o644)
			h.say("%s %s", HuntLineFrozen, froze.Name)
			return HuntFrozen
		}
		// the freeze could not be had: the evidence is read here and now
		h.say("sbx-hunt: freeze failed: %s", oneLine(cmp.Or(froze.Error, froze.State)))
	}
	after := pids()
	writePids(h.file("pids.after"), after)
	_ = copyFile(h.file("run.out"), h.file("test-output.txt"))
	leaked := h.leftovers(before, after)
	writePids(h.file("leaked-pids.txt"), setOf(leaked))
	h.evidence(t, leaked, "")
	h.collect()
	h.step("captured")
	_ = os.WriteFile(h.file("captured"), nil, 0o644)
	h.say("%s", HuntLineCaptured)
	return HuntFailed
}

// frozenEvidence reads, in a copy of a frozen sandbox, the evidence of the
// failing instant: the same as a failure's, of the run's processes alive
// at the freeze (the failing test itself, if it froze itself), with the
// Python stacks and locals of those that are Python.
func (h *hunt) frozenEvidence() int {
	r, ok := freezeStatus()
	if !ok {
		h.say("sbx-hunt: no freeze is known here (init does not answer)")
		return ExitError
	}
	if r.State != FreezeCopy && r.State != FreezeFrozen {
		h.say("sbx-hunt: this sandbox is not a frozen hunt's copy (its freeze: %s)", r.State)
		return ExitError
	}
	b, _ := json.MarshalIndent(r, "", "  ")
	_ = os.WriteFile(h.file("frozen"), append(b, '\n'), 0o644)
	before := readPids(h.file("pids.before"))
	// the processes at the freeze still there: not those started since
	// to look at it (this one, its exec's)
	now := pids()
	at := setOf(r.Pids)
	if len(at) == 0 {
		at = now
	}
	frozen := map[int]bool{}
	for p := range at {
		if now[p] {
			frozen[p] = true
		}
	}
	writePids(h.file("pids.frozen"), frozen)
	_ = copyFile(h.file("run.out"), h.file("test-output.txt"))
	alive := newPids(before, frozen, h.self)
	// the frozen caller first: it is the failure itself
	if r.Pid > 0 && slices.Contains(alive, r.Pid) {
		alive = append([]int{r.Pid}, slices.DeleteFunc(alive, func(p int) bool { return p == r.Pid })...)
	}
	writePids(h.file("leaked-pids.txt"), setOf(alive))
	// the copy's processes went on from the freeze just now: a leaked
	// server not listening yet gets its wait from now
	h.evidence(time.Now(), alive, "(frozen)")
	if r.Pid > 0 {
		// the pid alone, for `--pid $(cat frozen-pid.txt)`; its command beside
		_ = os.WriteFile(h.file("frozen-pid.txt"), []byte(fmt.Sprintf("%d\n", r.Pid)), 0o644)
		_ = os.WriteFile(h.file("frozen-cmd.txt"), []byte(cmdline(r.Pid)+"\n"), 0o644)
	}
	// Python stacks, with locals: the reason to freeze a Python test
	h.step("python stacks")
	n := 0
	for _, p := range alive {
		if n >= maxStacks || !isPython(p) {
			continue
		}
		n++
		s, err := pyStack(context.Background(), p)
		if err != nil {
			s = "sbx: " + err.Error() + "\n"
		}
		_ = os.WriteFile(h.file(fmt.Sprintf("py-stack-%d.txt", p)), []byte(s), 0o644)
	}
	h.collect()
	h.step("captured")
	_ = os.WriteFile(h.file("captured"), nil, 0o644)
	h.say("%s", HuntLineCaptured)
	return HuntFailed
}

func isPython(pid int) bool {
	exe, err := os.Readlink(procRoot + "/" + strconv.Itoa(pid) + "/exe")
	return err == nil && strings.HasPrefix(filepath.Base(exe), "python")
}

// evidence reads what the leaked processes are doing, t being the
// failure: the forest first, then at once the listeners, each process's
// open files and the gdb stacks; then a second look at the listeners if a
// leaked process did not listen yet.
func (h *hunt) evidence(t time.Time, leaked []int, note string) {
	h.step("processes")
	_ = os.WriteFile(h.file("processes.txt"), []byte(processForest()), 0o644)
	h.step("evidence")
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		_ = os.WriteFile(h.file("listening.txt"), []byte(listeners(strings.TrimSpace("at the failure "+note))), 0o644)
	}()
	var lines strings.Builder
	for _, p := range leaked {
		if !procAlive(p) {
			continue
		}
		fmt.Fprintf(&lines, "%d %s\n", p, cmdline(p))
		wg.Add(1)
		go func() {
			defer wg.Done()
			_ = os.WriteFile(h.file(fmt.Sprintf("files-%d.txt", p)), []byte(openFiles(p)), 0o644)
		}()
	}
	_ = os.WriteFile(h.file("leaked.txt"), []byte(lines.String()), 0o644)
	// gdb stacks, two lanes
	stackable := leaked[:min(len(leaked), maxStacks)]
	if _, err := exec.LookPath("gdb"); err == nil {
		for lane := range 2 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for n, p := range stackable {
					if n%2 == lane && procAlive(p) {
						_ = os.WriteFile(h.file(fmt.Sprintf("stack-%d.txt", p)), []byte(gdbStack(p)), 0o644)
					}
				}
			}()
		}
	}
	wg.Wait()
	h.step("evidence read")
	if len(leaked) == 0 {
		return
	}
	first, _ := os.ReadFile(h.file("listening.txt"))
	if allListen(leaked, string(first)) {
		return
	}
	deadline := t.Add(h.wait)
	for !allListen(leaked, "") && time.Now().Before(deadline) {
		time.Sleep(100 * time.Millisecond)
	}
	appendFile(h.file("listening.txt"), listeners("again at "+epoch(time.Now())+", waiting for the leaked processes to listen"))
	h.step("listeners again")
}

// collect copies the --collect paths, each under collected/ by its
// absolute path, so that two paths with one base name do not collide.
func (h *hunt) collect() {
	for _, c := range h.cfg.Collect {
		dst := filepath.Join(h.file("collected"), c)
		if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
			appendFile(h.file("collect.log"), fmt.Sprintf("collect %s failed: %s\n", c, err))
			continue
		}
		out, err := exec.Command("cp", "-a", c, dst).CombinedOutput()
		if len(out) > 0 {
			appendFile(h.file("collect.log"), string(out))
		}
		if err != nil {
			appendFile(h.file("collect.log"), fmt.Sprintf("collect %s failed\n", c))
		}
	}
}

// run runs argv in dir as the hunt's user, with extra environment, its
// output (both streams) going to file, and returns its exit code; with a
// timeout, a run that outlives it is left running and reported as 124,
// timed out. err says why a command could not start (code 126 or 127, as
// a shell says).
func (h *hunt) run(dir string, argv, env []string, file string, timeout time.Duration) (code int, timedOut bool, err error) {
	out, err := os.OpenFile(file, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o644)
	if err != nil {
		return ExitError, false, err
	}
	defer out.Close()
	base := os.Environ()
	pathEnv := cmp.Or(os.Getenv("PATH"), defaultPath)
	prog, code, msg := lookProgIn(argv[0], pathEnv, dir)
	if code != 0 {
		return code, false, errors.New(argv[0] + ": " + msg)
	}
	cmd := &exec.Cmd{Path: prog, Args: argv, Dir: dir, Stdout: out, Stderr: out}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if h.cfg.User != "" {
		u, err := lookupUser(h.cfg.User)
		if err != nil {
			return ExitUsageExec, false, fmt.Errorf("user %s: %w", h.cfg.User, err)
		}
		cred := &syscall.Credential{Uid: uint32(u.uid), Gid: uint32(u.gid)}
		for _, g := range u.groups {
			cred.Groups = append(cred.Groups, uint32(g))
		}
		cmd.SysProcAttr.Credential = cred
		base = mergeEnv(base, []string{"HOME=" + cmp.Or(u.home, "/"), "USER=" + u.name, "LOGNAME=" + u.name})
	}
	cmd.Env = mergeEnv(base, env)
	if err := cmd.Start(); err != nil {
		c, msg := startFailure(err)
		return c, false, errors.New(argv[0] + ": " + msg)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	var deadline <-chan time.Time
	if timeout > 0 {
		timer := time.NewTimer(timeout)
		defer timer.Stop()
		deadline = timer.C
	}
	select {
	case err := <-done:
		return waitCode(err), false, nil
	case <-deadline:
		select {
		case err := <-done: // it ended as the timer fired: its own code
			return waitCode(err), false, nil
		default:
		}
		return ExitTimeoutExec, true, nil // left running: its hang is the evidence
	}
}

// waitCode is a finished command's code as a shell says it.
func waitCode(err error) int {
	if err == nil {
		return 0
	}
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			return 128 + int(ws.Signal())
		}
		return ee.ExitCode()
	}
	return ExitError
}

// killAll kills pids and waits, bounded, until they are gone (reaped by
// init; by this process if it is the first of its pid namespace).
func killAll(ps []int) {
	for _, p := range ps {
		_ = syscall.Kill(p, syscall.SIGKILL)
	}
	for deadline := time.Now().Add(2 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		if os.Getpid() == 1 {
			var ws syscall.WaitStatus
			for {
				if p, err := syscall.Wait4(-1, &ws, syscall.WNOHANG, nil); err != nil || p <= 0 {
					break
				}
			}
		}
		left := false
		for _, p := range ps {
			if _, err := os.Stat(procRoot + "/" + strconv.Itoa(p)); err == nil {
				left = true
			}
		}
		if !left {
			return
		}
	}
}

// newSeed is a random seed, a decimal uint32.
func newSeed() string {
	var b [4]byte
	_, _ = rand.Read(b[:])
	return strconv.FormatUint(uint64(binary.LittleEndian.Uint32(b[:])), 10)
}

// pids is the set of processes now.
func pids() map[int]bool {
	ents, _ := os.ReadDir(procRoot)
	out := map[int]bool{}
	for _, e := range ents {
		if p, err := strconv.Atoi(e.Name()); err == nil {
			out[p] = true
		}
	}
	return out
}

// newPids are the processes of after not in before, but self, in order.
func newPids(before, after map[int]bool, self int) []int {
	var out []int
	for p := range after {
		if !before[p] && p != self {
			out = append(out, p)
		}
	}
	sort.Ints(out)
	return out
}

// leftovers are the processes of now not in before, but those that are
// not the runs': the loop itself, init, what runsc exec started from
// outside (sbx's copiers, which have no parent in the sandbox), and the
// processes of other execs, found by the group init gave each (someone's
// `sbx exec -it` into the hunting sandbox must outlive the next run).
func (h *hunt) leftovers(before, now map[int]bool) []int {
	fresh := newPids(before, now, h.self)
	if len(fresh) == 0 {
		return nil
	}
	others := execGroups(h.self)
	var out []int
	for _, p := range fresh {
		if p == 1 {
			continue
		}
		if ppid, _, ok := procStat(p); !ok || ppid == 0 {
			continue // gone, or started from outside
		}
		if g, err := syscall.Getpgid(p); err != nil || others[g] {
			continue
		}
		out = append(out, p)
	}
	return out
}

// execGroups are the process groups of the execs init runs, but self's:
// init starts each command as the leader of a group of its own and keeps
// its pid in its directory until its exit file says it ended.
func execGroups(self int) map[int]bool {
	out := map[int]bool{}
	ents, _ := os.ReadDir(execsDir)
	for _, e := range ents {
		if _, err := os.Lstat(filepath.Join(execsDir, e.Name(), "exit")); err == nil {
			continue
		}
		if pid, err := readExecPid(execsDir, e.Name()); err == nil && pid != self {
			out[pid] = true
		}
	}
	return out
}

func setOf(ps []int) map[int]bool {
	m := map[int]bool{}
	for _, p := range ps {
		m[p] = true
	}
	return m
}

func writePids(file string, ps map[int]bool) {
	var l []int
	for p := range ps {
		l = append(l, p)
	}
	sort.Ints(l)
	var b strings.Builder
	for _, p := range l {
		fmt.Fprintln(&b, p)
	}
	_ = os.WriteFile(file, []byte(b.String()), 0o644)
}

func readPids(file string) map[int]bool {
	out := map[int]bool{}
	b, err := os.ReadFile(file)
	if err != nil {
		return out
	}
	for _, f := range strings.Fields(string(b)) {
		if p, err := strconv.Atoi(f); err == nil {
			out[p] = true
		}
	}
	return out
}

func procAlive(pid int) bool {
	_, state, ok := procStatIn(procRoot, pid)
	return ok && state != 'Z' && state != 'X'
}

// procStatIn is procStat under another /proc.
func procStatIn(proc string, pid int) (int, byte, bool) {
	if proc == "/proc" {
		return procStat(pid)
	}
	b, err := os.ReadFile(proc + "/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, 0, false
	}
	i := strings.LastIndexByte(string(b), ')')
	f := strings.Fields(string(b[i+1:]))
	if i < 0 || len(f) < 2 || len(f[0]) != 1 {
		return 0, 0, false
	}
	ppid, _ := strconv.Atoi(f[1])
	return ppid, f[0][0], true
}

func appendFile(file, s string) {
	f, err := os.OpenFile(file, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return
	}
	defer f.Close()
	_, _ = f.WriteString(s)
}

func copyFile(from, to string) error {
	b, err := os.ReadFile(from)
	if err != nil {
		return err
	}
	return os.WriteFile(to, b, 0o644)
}

// tool runs a read-only tool, bounded in time, and returns its output
// with a header; "" when the tool is not there.
func tool(header string, limit time.Duration, argv ...string) string {
	if _, err := exec.LookPath(argv[0]); err != nil {
		return ""
	}
	ctx, cancel := context.WithTimeout(context.Background(), limit)
	defer cancel()
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	cmd.Env = append(os.Environ(), "DEBUGINFOD_URLS=")
	out, _ := cmd.CombinedOutput()
	return "# " + header + "\n" + string(out)
}

// processForest is ps's forest with elapsed times, else one from /proc.
func processForest() string {
	if s := tool("ps -eo pid,ppid,etime,args --forest", 10*time.Second, "ps", "-eo", "pid,ppid,etime,args", "--forest"); strings.Count(s, "\n") > 2 {
		return s
	}
	return nativeForest()
}

// nativeForest is the process forest from /proc: pid, ppid, command.
func nativeForest() string {
	children := map[int][]int{}
	var all []int
	for p := range pids() {
		ppid, state, ok := procStatIn(procRoot, p)
		if !ok || state == 'Z' {
			continue
		}
		children[ppid] = append(children[ppid], p)
		all = append(all, p)
	}
	var b strings.Builder
	b.WriteString("# processes (from /proc): PID PPID COMMAND\n")
	seen := map[int]bool{}
	var walk func(p, ppid, depth int)
	walk = func(p, ppid, depth int) {
		if seen[p] {
			return
		}
		seen[p] = true
		fmt.Fprintf(&b, "%6d %6d %s%s\n", p, ppid, strings.Repeat("  ", depth), cmdline(p))
		kids := children[p]
		sort.Ints(kids)
		for _, k := range kids {
			walk(k, p, depth+1)
		}
	}
	sort.Ints(all)
	for _, p := range all {
		if ppid, _, _ := procStatIn(procRoot, p); !slices.Contains(all, ppid) {
			walk(p, ppid, 0)
		}
	}
	return b.String()
}

// listeners is the listening TCP sockets with their owners, as the agent
// reads them, then as ss and lsof say (where they are).
func listeners(header string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "# %s: listening TCP sockets (pid=PID,COMMAND)\n", header)
	ports, err := listeningPorts(procRoot)
	if err != nil {
		fmt.Fprintf(&b, "sbx: %s\n", err)
	}
	for _, p := range ports {
		fmt.Fprintf(&b, "LISTEN %s:%d pid=%d,%s\n", p.Address, p.Port, p.Pid, p.Command)
	}
	b.WriteString(tool("ss -ltnp", 10*time.Second, "ss", "-ltnp"))
	b.WriteString(tool("lsof -iTCP -sTCP:LISTEN -P -n", 10*time.Second, "lsof", "-b", "-w", "-iTCP", "-sTCP:LISTEN", "-P", "-n"))
	return b.String()
}

// allListen reports whether every leaked process still alive holds a
// listening socket: in text (a listeners output) if given, else now.
func allListen(leaked []int, text string) bool {
	if text == "" {
		ports, err := listeningPorts(procRoot)
		if err != nil {
			return true // cannot tell: do not wait
		}
		var b strings.Builder
		for _, p := range ports {
			fmt.Fprintf(&b, "pid=%d,\n", p.Pid)
		}
		text = b.String()
	}
	for _, p := range leaked {
		if procAlive(p) && !strings.Contains(text, "pid="+strconv.Itoa(p)+",") {
			return false
		}
	}
	return true
}

// openFiles is a process's open files: its fds, and lsof's view.
func openFiles(pid int) string {
	var b strings.Builder
	dir := procRoot + "/" + strconv.Itoa(pid) + "/fd"
	fmt.Fprintf(&b, "# ls -l %s\n", dir)
	ents, err := os.ReadDir(dir)
	if err != nil {
		fmt.Fprintf(&b, "sbx: %s\n", err)
	}
	for _, e := range ents {
		target, _ := os.Readlink(path.Join(dir, e.Name()))
		fmt.Fprintf(&b, "%s/%s -> %s\n", dir, e.Name(), target)
	}
	b.WriteString(tool("lsof -b -w -n -P -p "+strconv.Itoa(pid), 10*time.Second, "lsof", "-b", "-w", "-n", "-P", "-p", strconv.Itoa(pid)))
	return b.String()
}

// gdbStack is gdb's stack of every thread of pid.
func gdbStack(pid int) string {
	return tool("gdb -p "+strconv.Itoa(pid)+" thread apply all bt", 30*time.Second,
		"gdb", "-batch", "-nx", "-iex", "set debuginfod enabled off", "-p", strconv.Itoa(pid), "-ex", "thread apply all bt")
}
