package agent

import (
	"errors"
	"flag"
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

const attachSyntax = "attach --id ID [--stdout-offset N] [--stderr-offset N] [--framed]"

// attachPoll is how soon a copier looks again for new output and the exit
// file after a change (outwatch.go: while the command is quiet it sleeps
// longer).
const attachPoll = 10 * time.Millisecond

// lostAfter is how long attach waits for the exit file of a command whose
// process is gone before it gives up on it (init was not there to reap it).
const lostAfter = 10 * time.Second

// runAttach follows the output of a command init started, from the given
// byte offsets, until it ends, and exits with its exit code. An unknown id
// exits 125.
func runAttach(args []string, stdout, stderr io.Writer) int {
	a, err := parseAttach(args)
	if err != nil {
		fmt.Fprintf(stderr, "sbx-agent: attach: %s; usage: sbx-agent %s\n", err, attachSyntax)
		return ExitUsageExec
	}
	if a.framed {
		return attachFramed(a.id, a.outOff, a.errOff, frame.NewWriter(stdout), stderr)
	}
	return attach(a.id, a.outOff, a.errOff, stdout, stderr)
}

// attachArgs are attach's flags.
type attachArgs struct {
	id             string
	outOff, errOff int64
	framed         bool
}

func parseAttach(args []string) (attachArgs, error) {
	fset := flag.NewFlagSet("attach", flag.ContinueOnError)
	fset.SetOutput(io.Discard)
	id := fset.String("id", "", "the exec id")
	outOff := fset.Int64("stdout-offset", 0, "bytes of stdout already read")
	errOff := fset.Int64("stderr-offset", 0, "bytes of stderr already read")
	framed := fset.Bool("framed", false, "send the output as frames (package frame), the exit code last")
	err := fset.Parse(args)
	switch {
	case err != nil:
	case fset.NArg() != 0:
		err = fmt.Errorf("unexpected argument %q", fset.Arg(0))
	case *id == "":
		err = errors.New("--id is required")
	case *outOff < 0 || *errOff < 0:
		err = errors.New("negative offset")
	}
	return attachArgs{id: *id, outOff: *outOff, errOff: *errOff, framed: *framed}, err
}

// settled makes sure exec id has started or never will (see
// supervisor.settle) before it is followed: without a pid file it may be a
// start still on its way to init, and saying "not found" then would let it
// run unseen later. Init is asked until it answers, whatever stands in the
// way (stopped, wedged, its queue of connections full): any answer means
// it has decided, as it remembers a settled id even when it cannot write
// its records.
func settled(id string) { settledOn(socketLink{}, id) }

// settledOn is settled, reaching init through link.
func settledOn(link initLink, id string) {
	if _, err := readExecPid(execsDir, id); err == nil {
		return
	}
	for n := 1; ; n++ {
		if _, err := link.call(initRequest{Op: "settle", ID: id}); err == nil {
			return
		}
		time.Sleep(backoff(n))
	}
}

// attach copies the output files of exec id, from the offsets, to stdout and
// stderr as they grow, until the exit file appears; then it copies the rest
// and returns the exit code recorded there. If stdout or stderr cannot be
// written it returns 141 (as SIGPIPE would) without a word: the command is
// init's child and goes on.
func attach(id string, outOff, errOff int64, stdout, stderr io.Writer) int {
	dir := filepath.Join(execsDir, id)
	notFound := func() int {
		fmt.Fprintf(stderr, "sbx-agent: exec %s not found\n", id)
		return ExitUsageExec
	}
	if !validExecID(id) {
		return notFound()
	}
	settled(id)
	var srcs [2]*os.File
	for i, name := range []string{"stdout", "stderr"} {
		f, err := os.Open(filepath.Join(dir, name))
		if errors.Is(err, os.ErrNotExist) {
			return notFound()
		}
		if err != nil {
			fmt.Fprintf(stderr, "sbx-agent: attach %s: %s\n", id, err)
			return ExitError
		}
		defer f.Close()
		srcs[i] = f
	}
	if _, err := srcs[0].Seek(outOff, io.SeekStart); err != nil {
		fmt.Fprintf(stderr, "sbx-agent: attach %s: %s\n", id, err)
		return ExitError
	}
	if _, err := srcs[1].Seek(errOff, io.SeekStart); err != nil {
		fmt.Fprintf(stderr, "sbx-agent: attach %s: %s\n", id, err)
		return ExitError
	}
	if stdout == io.Writer(os.Stdout) || stderr == io.Writer(os.Stderr) {
		// a closed pipe must fail the write, not kill the process mid-copy
		signal.Ignore(syscall.SIGPIPE)
	}
	dsts := [2]io.Writer{stdout, stderr}
	pid, _ := readExecPid(execsDir, id)
	buf := make([]byte, 64<<10)
	w := watchOutput(dir)
	defer w.close()
	var goneSince, checked time.Time
	for {
		// looked at before the copy: once it exists the command has
		// written all it will
		_, err := os.Stat(filepath.Join(dir, "exit"))
		ended := err == nil
		copied := false
		for i := range srcs {
			c, writeFailed, err := copyNew(dsts[i], srcs[i], buf)
			copied = copied || c
			if writeFailed {
				return 128 + int(syscall.SIGPIPE)
			}
			if err != nil {
				fmt.Fprintf(stderr, "sbx-agent: attach %s: read %s: %s\n", id, srcs[i].Name(), err)
				return ExitError
			}
		}
		if ended {
			b, err := os.ReadFile(filepath.Join(dir, "exit"))
			code, err2 := strconv.Atoi(strings.TrimSpace(string(b)))
			if err != nil || err2 != nil {
				fmt.Fprintf(stderr, "sbx-agent: attach %s: bad exit file %q\n", id, b)
				return ExitError
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
				fmt.Fprintf(stderr, "sbx-agent: exec %s: its process is gone and no exit code was recorded\n", id)
				return ExitError
			}
		}
		w.wait(copied, nil)
	}
}

// copyNew copies what src holds past its offset to dst. It tells a failed
// write, which ends attach quietly, from a failed read.
// copied says it copied anything.
func copyNew(dst io.Writer, src *os.File, buf []byte) (copied, writeFailed bool, err error) {
	for {
		n, err := src.Read(buf)
		if n > 0 {
			copied = true
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return copied, true, werr
			}
		}
		if err == io.EOF {
			return copied, false, nil
		}
		if err != nil {
			return copied, false, err
		}
	}
}

// processExists says whether pid names a process, a zombie included.
func processExists(pid int) bool {
	err := syscall.Kill(pid, 0)
	return err == nil || errors.Is(err, syscall.EPERM)
}
