package agent

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"sbx.dev/sbx/internal/wire/frame"
)

// maxStartRequest bounds the request read from stdin.
const maxStartRequest = 8 << 20

// runStart asks init to start the command stdin describes, then sends its
// output out as frames on stdout (package frame): its pid, stdout and
// stderr as they come, and its exit code last. It exits with that code.
// The command is init's child: it survives this process, and a checkpoint
// and restore of the sandbox, which kills every process `runsc exec`
// started; `sbx-agent attach --framed` follows it again after one.
//
// Failures to start are an stderr frame "sbx: <message>" and an exit frame
// with the code a shell would use (127 not found, 126 not executable).
func runStart(stdin io.Reader, stdout, stderr io.Writer) int {
	return startOn(socketLink{}, stdin, stdout, stderr)
}

// initLink is how a copier reaches init: over init's socket, from a process
// of its own (`sbx-agent start` or `attach --framed`, started by `runsc
// exec`), or in init's own process (inProcess: the exec channel, whose
// requests init's goroutines serve).
type initLink interface {
	// call asks init for a spawn or a settle.
	call(req initRequest) (initReply, error)
	// wait answers once exec id has ended.
	wait(id string) (initReply, error)
	// ownProcess says the copier is a process of its own, which may
	// change its signal dispositions: init's are its children's.
	ownProcess() bool
}

// socketLink reaches init over its socket.
type socketLink struct{}

func (socketLink) call(req initRequest) (initReply, error) { return callInit(req) }
func (socketLink) wait(id string) (initReply, error)       { return callInitWait(id) }
func (socketLink) ownProcess() bool                        { return true }

// inProcess is init's supervisor, called in its own process: no socket,
// no JSON, no connection per request. Its caller is sbxd (the channel is
// root's alone), so a spawn runs with root's rights, as a copier's does.
type inProcess struct{ s *supervisor }

func (l inProcess) call(req initRequest) (initReply, error) {
	followHostname()
	switch req.Op {
	case "spawn":
		return l.s.spawn(req), nil
	case "settle":
		return l.s.settle(req), nil
	}
	return initReply{Code: ExitUsageExec, Error: fmt.Sprintf("unknown op %q", req.Op)}, nil
}

func (l inProcess) wait(id string) (initReply, error) {
	return l.s.waitExec(initRequest{Op: "wait", ID: id}), nil
}

func (inProcess) ownProcess() bool { return false }

// startOn is runStart, reaching init through link.
func startOn(link initLink, stdin io.Reader, stdout, stderr io.Writer) int {
	fw := frame.NewWriter(stdout)
	fail := func(code int, format string, args ...any) int {
		_ = fw.Write(frame.Stderr, []byte("sbx: "+fmt.Sprintf(format, args...)+"\n"))
		_ = fw.WriteCode(frame.Exit, code)
		return code
	}
	b, err := io.ReadAll(io.LimitReader(stdin, maxStartRequest+1))
	if err != nil {
		return fail(ExitUsageExec, "start: read the request: %s", err)
	}
	if len(b) > maxStartRequest {
		return fail(ExitUsageExec, "start: the request is larger than %d bytes", maxStartRequest)
	}
	var req StartRequest
	if err := json.Unmarshal(b, &req); err != nil {
		return fail(ExitUsageExec, "start: bad request: %s", err)
	}
	if !validExecID(req.ID) {
		return fail(ExitUsageExec, "start: bad exec id %q", req.ID)
	}
	// Again: sbxd may send this start twice (channelExec), the
	// second following what the first started
	rep, err := link.call(initRequest{Op: "spawn", ID: req.ID, Argv: req.Argv, Env: req.Env, Cwd: req.Cwd, User: req.User, Timeout: req.Timeout, Again: true})
	switch {
	case errors.Is(err, errUnreachable):
		return fail(ExitUsageExec, "start %s: %s", req.ID, oneLine(err.Error()))
	case err != nil:
		// The request may be with init, to be spawned later (an init
		// stopped or wedged past the timeout): following the exec settles
		// it, so that it ends now or is the command's, never both.
		return attachOn(link, req.ID, 0, 0, fw, stderr)
	case rep.Code != 0 || rep.Error != "":
		code := rep.Code
		if code == 0 {
			code = ExitError
		}
		return fail(code, "%s", oneLine(rep.Error))
	}
	if err := fw.WriteCode(frame.Pid, rep.Pid); err != nil {
		return 128 + int(syscall.SIGPIPE)
	}
	// spawned just now: nothing to settle, and its pid is known
	return followOn(link, req.ID, rep.Pid, 0, 0, fw, stderr)
}

// aliveEvery is how often a copier says it is there (frame.Alive).
var aliveEvery = frame.AliveEvery

// attachFramed follows exec id's output files from the given offsets and
// sends what they gain as frames, until the command has ended; then the
// rest, and its exit code. It learns of the end from init at once (a
// "wait" request), or, if init cannot say (it does not know the id), from
// the exit file. If stdout cannot be written it returns 141 (as SIGPIPE
// would): the command is init's child and goes on.
func attachFramed(id string, outOff, errOff int64, fw *frame.Writer, stderr io.Writer) int {
	return attachOn(socketLink{}, id, outOff, errOff, fw, stderr)
}

// attachOn is attachFramed, reaching init through link.
func attachOn(link initLink, id string, outOff, errOff int64, fw *frame.Writer, stderr io.Writer) int {
	if validExecID(id) {
		settledOn(link, id)
	}
	return followOn(link, id, 0, outOff, errOff, fw, stderr)
}

// followOn is attachOn once exec id is settled (spawned, or given up):
// pid is its process if known (0: read from its records).
func followOn(link initLink, id string, pid int, outOff, errOff int64, fw *frame.Writer, stderr io.Writer) int {
	dir := filepath.Join(execsDir, id)
	fail := func(code int, format string, args ...any) int {
		_ = fw.Write(frame.Stderr, []byte("sbx: "+fmt.Sprintf(format, args...)+"\n"))
		_ = fw.WriteCode(frame.Exit, code)
		return code
	}
	if !validExecID(id) {
		return fail(ExitUsageExec, "exec %s not found", id)
	}
	var srcs [2]*os.File
	for i, name := range []string{"stdout", "stderr"} {
		f, err := os.Open(filepath.Join(dir, name))
		if errors.Is(err, os.ErrNotExist) {
			return fail(ExitUsageExec, "exec %s not found", id)
		}
		if err != nil {
			return fail(ExitError, "attach %s: %s", id, err)
		}
		defer f.Close()
		srcs[i] = f
	}
	for i, off := range []int64{outOff, errOff} {
		if _, err := srcs[i].Seek(off, io.SeekStart); err != nil {
			return fail(ExitError, "attach %s: %s", id, err)
		}
	}
	if link.ownProcess() {
		// a closed pipe must fail the write, not kill the copy. Not in
		// init: an ignored signal stays ignored across exec, in every
		// command init starts after (init catches SIGPIPE, and a write
		// to a closed socket fails with EPIPE there all the same)
		signal.Ignore(syscall.SIGPIPE)
	}
	// still here, says the copier, however quiet the command (the shim
	// gives up on a copier that stops saying so: root inside can stop it)
	// A failed write there means no one reads any more (a capture closed
	// the connection): gone ends the copy at once, rather than when the
	// quiet command next writes or ends (each capture left a copier per
	// quiet exec behind, its watch, files and timers with it).
	stopAlive, aliveDone, gone := make(chan struct{}), make(chan struct{}), make(chan struct{})
	go func() {
		defer close(aliveDone)
		tick := time.NewTicker(aliveEvery)
		defer tick.Stop()
		for {
			select {
			case <-stopAlive:
				return
			case <-tick.C:
				if fw.Write(frame.Alive, nil) != nil {
					close(gone)
					return
				}
			}
		}
	}()
	defer func() { close(stopAlive); <-aliveDone }()
	ended := make(chan int, 1)
	go func() {
		if rep, err := link.wait(id); err == nil && rep.Error == "" && rep.Exit != nil {
			ended <- *rep.Exit
		}
	}()
	streams := [2]io.Writer{fw.Stream(frame.Stdout), fw.Stream(frame.Stderr)}
	buf := make([]byte, frame.MaxPayload)
	if pid <= 0 {
		pid, _ = readExecPid(execsDir, id)
	}
	w := watchOutput(dir)
	defer w.close()
	w.abort = gone
	var goneSince, checked time.Time
	code := -1
	for {
		// looked at before the copy: once it is known the command has
		// written all it will
		if code < 0 {
			select {
			case code = <-ended:
			default:
				if b, err := os.ReadFile(filepath.Join(dir, "exit")); err == nil {
					if n, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil {
						code = n
					} else {
						return fail(ExitError, "attach %s: bad exit file %q", id, b)
					}
				}
			}
		}
		copied := false
		for i := range srcs {
			c, writeFailed, err := copyNew(streams[i], srcs[i], buf)
			copied = copied || c
			if writeFailed {
				return 128 + int(syscall.SIGPIPE)
			}
			if err != nil {
				return fail(ExitError, "attach %s: read %s: %s", id, srcs[i].Name(), err)
			}
		}
		if code >= 0 {
			if err := fw.WriteCode(frame.Exit, code); err != nil {
				return 128 + int(syscall.SIGPIPE)
			}
			return code
		}
		if pid > 0 && time.Since(checked) >= aliveCheckEvery {
			// a command whose process is gone with no exit recorded was
			// not reaped by this init (a sandbox restarted from scratch)
			checked = time.Now()
			switch {
			case processExists(pid):
				goneSince = time.Time{}
			case goneSince.IsZero():
				goneSince = time.Now()
			case time.Since(goneSince) > lostAfter:
				return fail(ExitError, "exec %s: its process is gone and no exit code was recorded", id)
			}
		}
		if c, ok := w.wait(copied, ended); ok {
			code = c
		}
		select {
		case <-gone:
			return 128 + int(syscall.SIGPIPE)
		default:
		}
	}
}

// callInitWait asks init to answer when exec id has ended; the connection
// stays open until then.
func callInitWait(id string) (initReply, error) {
	conn, err := dialUnix(initSocket)
	if err != nil {
		return initReply{}, err
	}
	defer conn.Close()
	_ = conn.SetWriteDeadline(time.Now().Add(clientTimeout))
	if err := json.NewEncoder(conn).Encode(initRequest{Op: "wait", ID: id}); err != nil {
		return initReply{}, err
	}
	var rep initReply
	if err := json.NewDecoder(conn).Decode(&rep); err != nil {
		return initReply{}, err
	}
	return rep, nil
}
