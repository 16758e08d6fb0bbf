package runsc

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"sbx.dev/sbx/internal/atomicfile"
	"sbx.dev/sbx/internal/wire/frame"
	"sbx.dev/sbx/internal/wire/freezewire"
)

// A shim is the host-side process that owns one `runsc exec` (or one
// sandbox's console) for as long as it runs, as containerd's shims own a
// container's stdio. It is sbxd's own binary started again (ShimArg), in
// its own session: it outlives sbxd, keeps the output in files within a
// budget (cappedFile), and records how the command ended in an exit file a
// restarted sbxd reads. Nothing of what it is given (the environment of a
// command, often secrets) is in its argv or runsc's: the request reaches
// runsc's stdin from a file the shim removes once read.
//
// The shim tells its parent what happens, when the parent is still there,
// on fd 3: "pid N", "exit N" (the command's code) or "lost REASON" lines.

// ShimArg is the argument that makes sbxd's main run ShimMain.
const ShimArg = "__shim"

// The files of a shim's directory.
const (
	shimSpecFile = "shim.json"
	shimStdin    = "stdin"
	// ShimPidFile holds the shim's pid and start time ("PID START").
	ShimPidFile = "shim.pid"
	// ExitFile holds the command's exit code, written once it is known.
	ExitFile = "exit"
	// PidFile holds the command's pid inside the sandbox.
	PidFile = "pid"
	// OffsetsFile holds how far into the command's output (inside the
	// sandbox) this shim got: "STDOUT STDERR", for a re-attach.
	OffsetsFile = "offsets"
)

// ShimSpec is what one shim does; sbxd writes it as shim.json.
type ShimSpec struct {
	// Kind is "exec" (run Argv, keep its output) or "console" (keep what
	// arrives on stdin, a sandbox's console).
	Kind string `json:"kind"`
	Dir  string `json:"dir"`
	// Argv is the runsc command line of an exec.
	Argv []string `json:"argv,omitempty"`
	// Framed says the process in the sandbox speaks package frame on its
	// stdout; runsc's own stderr then goes to RuntimeLog.
	Framed     bool   `json:"framed,omitempty"`
	RuntimeLog string `json:"runtimeLog,omitempty"`
	// Head and Tail are each stream's budget: the first Head bytes are
	// kept, then only the last Tail.
	Head int64 `json:"head"`
	Tail int64 `json:"tail"`
	// Offsets are where, in the command's output inside the sandbox, this
	// shim starts (a re-attach).
	Offsets [2]int64 `json:"offsets,omitempty"`
	// Stall, if set, is how long a framed copier may send nothing at all
	// (not even frame.Alive) before the shim takes it for stopped or
	// wedged in the sandbox: it ends runsc exec and reports the copy lost,
	// and sbxd attaches a new copier.
	Stall time.Duration `json:"stall,omitempty"`
	// Console is the file a console shim appends to.
	Console string `json:"console,omitempty"`
	// FreezeDir holds the sandbox's freeze slots: a console shim writes
	// the verdict of a freeze init tells of into its slot there
	// (package freezewire).
	FreezeDir string `json:"freezeDir,omitempty"`
}

// Output budgets, unless sbxd says otherwise.
const (
	DefaultOutputHead = 32 << 20
	DefaultOutputTail = 1 << 20
)

// ShimEvent is what a running shim reports: the command's pid, or its end
// (Exit set: its exit code; else Lost says why no code is known).
type ShimEvent struct {
	Pid  int
	Exit *int
	Lost string
}

// Shim is a started shim.
type Shim struct {
	Proc
	// Events has the shim's reports and is closed when the shim ends.
	Events <-chan ShimEvent
}

// StartShim starts a shim for spec, with stdin (if not nil) as what the
// command reads first, and returns at once. The caller must read Events
// until it is closed.
func (d *Driver) StartShim(spec ShimSpec, stdin []byte, console *os.File) (*Shim, error) {
	bin := d.ShimBinary
	if bin == "" {
		var err error
		if bin, err = os.Executable(); err != nil {
			return nil, fmt.Errorf("shim: %w", err)
		}
	}
	b, err := json.Marshal(spec)
	if err != nil {
		return nil, err
	}
	if err := writeFile0600(filepath.Join(spec.Dir, shimSpecFile), b); err != nil {
		return nil, fmt.Errorf("shim: %w", err)
	}
	if stdin != nil {
		if err := writeFile0600(filepath.Join(spec.Dir, shimStdin), stdin); err != nil {
			return nil, fmt.Errorf("shim: %w", err)
		}
	}
	_ = os.Remove(filepath.Join(spec.Dir, ExitFile))
	r, w, err := os.Pipe()
	if err != nil {
		return nil, fmt.Errorf("shim: %w", err)
	}
	defer w.Close()
	cmd := exec.Command(bin, ShimArg, spec.Dir)
	cmd.Env = append(os.Environ(), d.ShimEnv...)
	devnull, err := os.OpenFile(os.DevNull, os.O_RDWR, 0)
	if err != nil {
		r.Close()
		return nil, err
	}
	defer devnull.Close()
	cmd.Stdin, cmd.Stdout, cmd.Stderr = devnull, devnull, devnull
	if console != nil {
		cmd.Stdin = console
	}
	cmd.ExtraFiles = []*os.File{w}
	// its own session: neither a signal to sbxd's group nor sbxd's death ends it
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		r.Close()
		return nil, fmt.Errorf("shim: %w", err)
	}
	p := Proc{Pid: cmd.Process.Pid, Start: ProcessStart(cmd.Process.Pid)}
	_ = writeFile0600(filepath.Join(spec.Dir, ShimPidFile), []byte(fmt.Sprintf("%d %s\n", p.Pid, p.Start)))
	events := make(chan ShimEvent, 4)
	go func() {
		defer close(events)
		defer r.Close()
		sc := bufio.NewScanner(io.LimitReader(r, 1<<20))
		for sc.Scan() {
			if ev, ok := parseShimLine(sc.Text()); ok {
				events <- ev
			}
		}
		_ = cmd.Wait()
	}()
	return &Shim{Proc: p, Events: events}, nil
}

func parseShimLine(line string) (ShimEvent, bool) {
	verb, arg, _ := strings.Cut(line, " ")
	switch verb {
	case "pid":
		if n, err := strconv.Atoi(arg); err == nil {
			return ShimEvent{Pid: n}, true
		}
	case "exit":
		if n, err := strconv.Atoi(arg); err == nil {
			return ShimEvent{Exit: &n}, true
		}
	case "lost":
		return ShimEvent{Lost: arg}, true
	}
	return ShimEvent{}, false
}

// ReadShimPid returns the shim process recorded in dir.
func ReadShimPid(dir string) Proc {
	b, err := os.ReadFile(filepath.Join(dir, ShimPidFile))
	if err != nil {
		return Proc{}
	}
	var p Proc
	f := strings.Fields(string(b))
	if len(f) == 2 {
		p.Pid, _ = strconv.Atoi(f[0])
		p.Start = f[1]
	}
	return p
}

// ReadExit returns the exit code a shim recorded in dir, if any.
func ReadExit(dir string) (int, bool) {
	b, err := os.ReadFile(filepath.Join(dir, ExitFile))
	if err != nil {
		return 0, false
	}
	n, err := strconv.Atoi(strings.TrimSpace(string(b)))
	return n, err == nil
}

// ReadOffsets returns how far into the command's output a shim got (its
// file sizes, if it did not say).
func ReadOffsets(dir string) [2]int64 {
	var o [2]int64
	if b, err := os.ReadFile(filepath.Join(dir, OffsetsFile)); err == nil {
		f := strings.Fields(string(b))
		if len(f) == 2 {
			o[0], _ = strconv.ParseInt(f[0], 10, 64)
			o[1], _ = strconv.ParseInt(f[1], 10, 64)
			return o
		}
	}
	for i, name := range []string{"stdout", "stderr"} {
		if fi, err := os.Stat(filepath.Join(dir, name)); err == nil {
			o[i] = fi.Size()
		}
	}
	return o
}

func writeFile0600(path string, b []byte) error {
	return atomicfile.WriteBytes(path, b, 0o600)
}

// writeRecord0600 writes one of an exec's records (its pid, offsets, exit
// code), which need not survive the host: see WriteBytesUnsynced.
func writeRecord0600(path string, b []byte) error {
	return atomicfile.WriteBytesUnsynced(path, b, 0o600)
}

// ShimMain is the shim process: sbxd's main calls it for ShimArg. It
// returns the process's exit code.
func ShimMain(args []string) int {
	if len(args) != 1 {
		fmt.Fprintln(os.Stderr, "usage: sbxd "+ShimArg+" DIR")
		return 2
	}
	signal.Ignore(syscall.SIGPIPE, syscall.SIGHUP, syscall.SIGINT, syscall.SIGTERM)
	dir := args[0]
	b, err := os.ReadFile(filepath.Join(dir, shimSpecFile))
	if err != nil {
		fmt.Fprintln(os.Stderr, "shim:", err)
		return 1
	}
	var spec ShimSpec
	if err := json.Unmarshal(b, &spec); err != nil {
		fmt.Fprintln(os.Stderr, "shim:", err)
		return 1
	}
	// not inherited by runsc, nor by what runsc leaves behind: the report's
	// end is the shim's
	syscall.CloseOnExec(3)
	report := os.NewFile(3, "report")
	say := func(format string, args ...any) {
		if report != nil {
			if _, err := fmt.Fprintf(report, format+"\n", args...); err != nil {
				report = nil // sbxd is gone; the files will tell the next one
			}
		}
	}
	switch spec.Kind {
	case "console":
		return shimConsole(spec)
	case "exec":
		return shimExec(spec, say)
	}
	fmt.Fprintln(os.Stderr, "shim: unknown kind", spec.Kind)
	return 1
}

func shimConsole(spec ShimSpec) int {
	f, err := os.OpenFile(spec.Console, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return 1
	}
	var used int64
	if fi, err := f.Stat(); err == nil {
		used = fi.Size()
	}
	out := newCappedFile(f, "the console", spec.Head, spec.Tail, used)
	cf := &controlFilter{out: out, freezeDir: spec.FreezeDir}
	buf := make([]byte, 32<<10)
	for {
		n, err := os.Stdin.Read(buf)
		if n > 0 {
			cf.Write(buf[:n])
		}
		if err != nil {
			break
		}
	}
	cf.flush()
	_ = out.Close()
	return 0
}

// controlFilter passes the console through, but for init's control lines
// (package freezewire): each starts with freezewire.ControlByte, which
// nothing else on the console has, and ends at a newline. A freeze's is
// written into its slot as the verdict (the latest line stands) and shown
// as a readable line. It is a hint: sbxd looks at the slot itself, and
// nothing here removes or changes what gVisor wrote (root inside can write
// such a line too).
type controlFilter struct {
	out       io.Writer
	freezeDir string
	line      []byte // a control line being read
	in        bool
	last      map[string]string // the verdict last written, by slot
}

func (c *controlFilter) Write(p []byte) {
	for len(p) > 0 {
		if !c.in {
			i := bytes.IndexByte(p, freezewire.ControlByte)
			if i < 0 {
				_, _ = c.out.Write(p)
				return
			}
			_, _ = c.out.Write(p[:i])
			p = p[i:]
			c.in, c.line = true, c.line[:0]
		}
		i := bytes.IndexByte(p, '\n')
		if i < 0 {
			c.line = append(c.line, p...)
			if len(c.line) > freezewire.MaxLine {
				c.flush() // not a line of init's: keep it as text
			}
			return
		}
		c.line = append(c.line, p[:i+1]...)
		p = p[i+1:]
		c.control(c.line)
		c.in = false
	}
}

// flush writes a control line cut short as text.
func (c *controlFilter) flush() {
	if c.in {
		_, _ = c.out.Write(bytes.ReplaceAll(c.line, []byte{freezewire.ControlByte}, []byte("?")))
		c.in, c.line = false, c.line[:0]
	}
}

// maxSlotsTold bounds the slots the filter remembers a verdict for.
const maxSlotsTold = 64

func (c *controlFilter) control(line []byte) {
	v, err := freezewire.Parse(line)
	if err != nil {
		fmt.Fprintf(c.out, "sbx: a control line from init that is not understood (%s)\n", err)
		return
	}
	what := "the sandbox says it froze"
	if v.Result == freezewire.Failed {
		what = "the sandbox says a freeze failed"
	}
	fmt.Fprintf(c.out, "sbx: %s (slot %s, %d ms)\n", what, v.Slot, v.Done.Sub(v.Triggered).Milliseconds())
	if c.freezeDir == "" {
		return
	}
	dir := filepath.Join(c.freezeDir, v.Slot)
	if fi, err := os.Lstat(dir); err != nil || !fi.IsDir() {
		return // not a slot of this sandbox's (a copy telling of its original's)
	}
	body := string(bytes.TrimSuffix(line[len(freezewire.Prefix):], []byte("\n")))
	if c.last[v.Slot] == body {
		return // told already: a flood of one line is one write
	}
	if c.last == nil || len(c.last) >= maxSlotsTold {
		c.last = map[string]string{}
	}
	c.last[v.Slot] = body
	// a rename (writeFile0600), so that sbxd never reads half a verdict
	_ = writeFile0600(filepath.Join(dir, freezewire.VerdictFile), []byte(body))
}

func shimExec(spec ShimSpec, say func(string, ...any)) int {
	dir := spec.Dir
	// The kernel's OOM killer must never pick the copier: its runsc exec
	// (a child, which inherits this) joins the sandbox's memory cgroup,
	// and killing it frees nothing, the memory being the sentry's, but
	// loses the exec, again at every reattach while the cgroup stays at
	// its limit. At the limit the kernel stops the sandbox itself, as
	// DESIGN says. (TestLimits, in CI: a ready sandbox whose execs were
	// lost; its cgroup's oom_kill counted a kill in every run.)
	_ = os.WriteFile("/proc/self/oom_score_adj", []byte("-1000"), 0) // root's; otherwise as before
	out, err := openOutputs(dir, spec.Head, spec.Tail, spec.Offsets)
	if err != nil {
		say("lost %s", err)
		return 1
	}
	stdout, stderr := out.stdout, out.stderr
	// the request is read once, then gone from the disk
	stdinPath := filepath.Join(dir, shimStdin)
	var stdin io.Reader = nil
	if b, err := os.ReadFile(stdinPath); err == nil {
		stdin = strings.NewReader(string(b))
		_ = os.Remove(stdinPath)
	}
	cmd := exec.Command(spec.Argv[0], spec.Argv[1:]...)
	cmd.Stdin = stdin
	var runscErr tailBuffer
	cmd.Stderr = stderr
	var outPipe io.ReadCloser
	if spec.Framed {
		rl := io.Discard
		if spec.RuntimeLog != "" {
			if f, err := os.OpenFile(spec.RuntimeLog, os.O_CREATE|os.O_RDWR|os.O_APPEND, 0o600); err == nil {
				defer f.Close()
				p := &prefixed{w: &limitWriter{w: f, n: 64 << 10}, prefix: "runsc exec " + filepath.Base(dir) + ": "}
				// runsc's own log lines may lack their last newline
				p.lead = !endsWithNewline(f)
				rl = p
			}
		}
		cmd.Stderr = io.MultiWriter(rl, &runscErr)
		// runsc exec's stderr is copied by a goroutine Wait waits for, and
		// runsc hands the pipe to the process in the sandbox: a copier
		// stopped there (or anything that holds its stderr) would hold
		// Wait for ever after runsc exec has gone
		cmd.WaitDelay = drainGrace
		r, w, err := os.Pipe()
		if err != nil {
			say("lost %s", err)
			return 1
		}
		defer r.Close()
		defer w.Close()
		cmd.Stdout = w
		outPipe = r
	} else {
		cmd.Stdout = stdout
	}
	if err := cmd.Start(); err != nil {
		stdout.Close()
		stderr.Close()
		say("lost runsc: %s", err)
		return 1
	}
	code, known, lost := -1, false, ""
	waited := make(chan error, 1)
	if spec.Framed {
		// Our copy of the pipe's write end goes, so that its end is runsc
		// exec's. But a process in the sandbox can hold the copier's
		// output open after it ends (root there reopens /proc/PID/fd/1):
		// the pipe never ends then. So the frames are read until the exit
		// frame, or until a grace after runsc exec has ended.
		_ = cmd.Stdout.(*os.File).Close()
		var exited atomic.Bool
		go func() {
			err := cmd.Wait()
			exited.Store(true)
			_ = outPipe.(*os.File).SetReadDeadline(time.Now().Add(drainGrace))
			waited <- err
		}()
		buf := make([]byte, frame.MaxPayload)
	frames:
		for {
			if spec.Stall > 0 && !exited.Load() {
				_ = outPipe.(*os.File).SetReadDeadline(time.Now().Add(spec.Stall))
			}
			typ, p, err := frame.Read(outPipe, buf)
			if err != nil {
				switch {
				case errors.Is(err, os.ErrDeadlineExceeded) && spec.Stall > 0 && !exited.Load():
					lost = fmt.Sprintf("the copier in the sandbox sent nothing for %s (stopped, or wedged)", spec.Stall)
					_ = cmd.Process.Kill() // runsc exec: a new copier is attached
				case errors.Is(err, os.ErrDeadlineExceeded):
					lost = "the copier's output did not end with it (something in the sandbox holds it open)"
				case !errors.Is(err, io.EOF):
					lost = err.Error()
				}
				break
			}
			if c, ok := out.take(typ, p, say); ok {
				code, known = c, true
				break frames // the copier's last word
			}
		}
		_ = outPipe.(*os.File).SetReadDeadline(time.Now().Add(drainGrace))
		_, _ = io.Copy(io.Discard, outPipe)
	} else {
		go func() { waited <- cmd.Wait() }()
	}
	werr := <-waited
	if !spec.Framed {
		code, known = exitCode(werr)
	} else if !known && lost == "" {
		lost = "the copier ended without an exit code"
		if s := strings.TrimSpace(runscErr.String()); s != "" {
			lost = "runsc: " + tail([]byte(s))
		}
	}
	out.close()
	if !known {
		say("lost %s", lost)
		return 0
	}
	say("exit %d", code)
	writeExitFile(dir, code)
	return 0
}

// outputs are an exec's streams as the host keeps them (within a budget),
// and how far into the command's output inside the sandbox a copy got.
type outputs struct {
	dir            string
	stdout, stderr *cappedFile
	offsets        [2]int64
	pid            bool // a pid frame was kept
}

// openOutputs opens dir's stdout and stderr to append to, a copy starting
// at offsets of the command's output.
func openOutputs(dir string, head, tail int64, offsets [2]int64) (*outputs, error) {
	open := func(name string) (*cappedFile, error) {
		f, err := os.OpenFile(filepath.Join(dir, name), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
		if err != nil {
			return nil, err
		}
		var used int64
		if fi, err := f.Stat(); err == nil {
			used = fi.Size()
		}
		return newCappedFile(f, name, head, tail, used), nil
	}
	stdout, err := open("stdout")
	if err != nil {
		return nil, err
	}
	stderr, err := open("stderr")
	if err != nil {
		stdout.Close()
		return nil, err
	}
	return &outputs{dir: dir, stdout: stdout, stderr: stderr, offsets: offsets}, nil
}

// take keeps one frame of a copier's; it returns the exit code when the
// frame is the last one, the exit frame.
func (o *outputs) take(typ byte, p []byte, say func(string, ...any)) (int, bool) {
	switch typ {
	case frame.Stdout:
		_, _ = o.stdout.Write(p)
		o.offsets[0] += int64(len(p))
	case frame.Stderr:
		_, _ = o.stderr.Write(p)
		o.offsets[1] += int64(len(p))
	case frame.Pid:
		// A copy follows one command, whose pid start sends once: only
		// the first is kept. Root inside can send pid frames without end,
		// and each would be a synced write of the pid file and an event,
		// in sbxd's own process over the exec channel.
		if n, err := frame.Code(p); err == nil && !o.pid {
			o.pid = true
			_ = writeRecord0600(filepath.Join(o.dir, PidFile), []byte(strconv.Itoa(n)+"\n"))
			say("pid %d", n)
		}
	case frame.Exit:
		if n, err := frame.Code(p); err == nil {
			return n, true
		}
	}
	return 0, false
}

// close closes the streams and records the offsets reached, for the next
// copy (a re-attach).
func (o *outputs) close() {
	_ = o.stdout.Close()
	_ = o.stderr.Close()
	_ = writeRecord0600(filepath.Join(o.dir, OffsetsFile), []byte(fmt.Sprintf("%d %d\n", o.offsets[0], o.offsets[1])))
}

// writeExitFile records an exec's exit code: the exit file is how a
// restarted sbxd learns the end, written as soon as there is room for it
// (a full disk frees up), for a day.
func writeExitFile(dir string, code int) {
	for deadline := time.Now().Add(24 * time.Hour); ; {
		err := writeRecord0600(filepath.Join(dir, ExitFile), []byte(strconv.Itoa(code)+"\n"))
		if err == nil || !errors.Is(err, syscall.ENOSPC) || time.Now().After(deadline) {
			return
		}
		time.Sleep(time.Second)
	}
}

// drainGrace is how long the shim reads a copier's output after runsc exec
// has ended (what is left in the pipe), or after the exit frame.
var drainGrace = 2 * time.Second

// exitCode is the code of a finished command, if it exited.
func exitCode(err error) (int, bool) {
	if err == nil {
		return 0, true
	}
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		if ee.Exited() {
			return ee.ExitCode(), true
		}
		if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			return 128 + int(ws.Signal()), true
		}
	}
	return -1, false
}

// tailBuffer keeps the last 4 KiB written to it.
type tailBuffer struct{ b []byte }

func (t *tailBuffer) Write(p []byte) (int, error) {
	t.b = append(t.b, p...)
	if len(t.b) > 4096 {
		t.b = t.b[len(t.b)-4096:]
	}
	return len(p), nil
}

func (t *tailBuffer) String() string { return string(t.b) }

// limitWriter writes the first n bytes and drops the rest.
type limitWriter struct {
	w io.Writer
	n int64
}

func (l *limitWriter) Write(p []byte) (int, error) {
	if l.n > 0 {
		k := min(int64(len(p)), l.n)
		_, _ = l.w.Write(p[:k])
		l.n -= k
	}
	return len(p), nil
}

// prefixed starts every line it writes with prefix.
type prefixed struct {
	w      io.Writer
	prefix string
	mid    bool // in the middle of a line
	lead   bool // start with a newline
}

func endsWithNewline(f *os.File) bool {
	fi, err := f.Stat()
	if err != nil || fi.Size() == 0 {
		return true
	}
	var b [1]byte
	_, err = f.ReadAt(b[:], fi.Size()-1)
	return err != nil || b[0] == '\n'
}

func (p *prefixed) Write(b []byte) (int, error) {
	n := len(b)
	if p.lead && len(b) > 0 {
		_, _ = io.WriteString(p.w, "\n")
		p.lead = false
	}
	for len(b) > 0 {
		if !p.mid {
			_, _ = io.WriteString(p.w, p.prefix)
			p.mid = true
		}
		i := strings.IndexByte(string(b), '\n')
		if i < 0 {
			_, _ = p.w.Write(b)
			break
		}
		_, _ = p.w.Write(b[:i+1])
		b = b[i+1:]
		p.mid = false
	}
	return n, nil
}

// ShimExec says how to run one exec under a shim.
type ShimExec struct {
	// Dir is the exec's directory: its output, pid, exit and the shim's files.
	Dir string
	// Args run in the sandbox; they speak package frame on stdout (the
	// agent's start and attach --framed).
	Args []string
	// Stdin is what the command reads first (a start request).
	Stdin []byte
	// Offsets are where, in the command's output, this copy starts.
	Offsets [2]int64
	// RuntimeLog gets runsc's own messages.
	RuntimeLog string
	// Head and Tail are each stream's budget (0: the defaults).
	Head, Tail int64
	// Stall: see ShimSpec.Stall.
	Stall time.Duration
	// Channel is the sandbox's exec channel directory (channel.go): with
	// Driver.ExecChannel the exec goes over a connection there when init
	// has one open, through a shim and `runsc exec` when not.
	Channel string
}

// StartExec starts a shim that runs o.Args in sandbox id through `runsc
// exec` and keeps their framed output in o.Dir. It returns at once.
func (d *Driver) StartExec(id string, o ShimExec) (*Shim, error) {
	head, tailN := o.Head, o.Tail
	if head == 0 {
		head, tailN = DefaultOutputHead, DefaultOutputTail
	}
	if d.ExecChannel && o.Channel != "" {
		ch := d.channel(id)
		if ch == nil {
			// an sbxd restarted: listen again, for the execs that follow
			if err := d.OpenChannel(id, o.Channel); err != nil {
				return nil, &Error{Verb: "exec", ID: id, Err: err}
			}
		} else if c := ch.take(); c != nil {
			if sh, err := d.channelExec(ch, c, o, head, tailN); err == nil {
				return sh, nil
			}
			// the connection failed: a shim, as without a channel
		}
	}
	argv := d.ExecArgv(id, ExecOptions{Args: o.Args})
	sh, err := d.StartShim(ShimSpec{Kind: "exec", Dir: o.Dir, Argv: argv, Framed: true, RuntimeLog: o.RuntimeLog, Head: head, Tail: tailN, Offsets: o.Offsets, Stall: o.Stall}, o.Stdin, nil)
	if err != nil {
		return nil, &Error{Verb: "exec", ID: id, Err: err}
	}
	return sh, nil
}
