package runsc

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"sync"
	"syscall"
	"time"

	"github.com/creack/pty"
	specs "github.com/opencontainers/runtime-spec/specs-go"
)

// A terminal is a host pty whose replica is the stdio and controlling
// terminal of `runsc exec`. runsc then treats its stdio as a terminal
// (process.json's Terminal): the sandbox's process uses the host pty, whose
// line discipline turns ^C into a SIGINT for runsc, which forwards it to the
// sandbox's foreground process group; a window size set on the master is
// what the process reads. This is what runsc's own --console-socket does,
// except that runsc honours --console-socket only with --detach, and a
// detached runsc exec's exit code is out of reach: owning the pty keeps it.

// TerminalHangupGrace is how long a terminal's command has to end after
// its hang-up before runsc exec is killed.
const TerminalHangupGrace = 3 * time.Second

// Terminal is a command running in a sandbox on a terminal.
type Terminal struct {
	// Master is the pty's master: what the command writes is read here,
	// what is written here is its input.
	Master *os.File

	cmd     *exec.Cmd
	process string
	once    sync.Once
	code    int
	err     error
}

// Wait waits for the command to end and returns its exit code; ending the
// context StartTerminal was given hangs the terminal up first.
func (t *Terminal) Wait() (int, error) {
	t.once.Do(func() {
		err := t.cmd.Wait()
		os.Remove(t.process)
		var ee *exec.ExitError
		switch {
		case err == nil:
		case errors.As(err, &ee) && ee.Exited():
			t.code = ee.ExitCode()
		default:
			t.code, t.err = -1, &Error{Verb: "exec", ID: "", Err: err}
		}
	})
	return t.code, t.err
}

// StartTerminal starts process p in sandbox id on a new terminal of cols x
// rows. The process (its environment, often secrets) goes to runsc in the
// file processFile, never in argv; the file is removed once the command
// ends. Ending ctx hangs the terminal up (SIGHUP, then SIGKILL to runsc
// after TerminalHangupGrace).
func (d *Driver) StartTerminal(ctx context.Context, id string, p *specs.Process, processFile string, cols, rows int) (*Terminal, error) {
	p.Terminal = true
	if err := WriteProcess(processFile, p); err != nil {
		return nil, &Error{Verb: "exec", ID: id, Err: err}
	}
	master, tty, err := pty.Open()
	if err != nil {
		os.Remove(processFile)
		return nil, &Error{Verb: "exec", ID: id, Err: fmt.Errorf("open a pty: %w", err)}
	}
	// the replica is runsc's alone once it has started: the master reads
	// EOF (EIO) when the last holder closes it
	defer tty.Close()
	if err := pty.Setsize(master, &pty.Winsize{Cols: uint16(cols), Rows: uint16(rows)}); err != nil {
		master.Close()
		os.Remove(processFile)
		return nil, &Error{Verb: "exec", ID: id, Err: fmt.Errorf("set the terminal's size: %w", err)}
	}
	c := d.ExecCommand(ctx, id, ExecOptions{Process: processFile})
	c.Stdin, c.Stdout, c.Stderr = tty, tty, tty
	c.SysProcAttr = &syscall.SysProcAttr{Setsid: true, Setctty: true, Ctty: 0}
	// a hang-up, as a terminal closed: runsc forwards it to the command
	c.Cancel = func() error { return c.Process.Signal(syscall.SIGHUP) }
	c.WaitDelay = TerminalHangupGrace
	if err := c.Start(); err != nil {
		master.Close()
		os.Remove(processFile)
		return nil, &Error{Verb: "exec", ID: id, Err: err}
	}
	return &Terminal{Master: master, cmd: c, process: processFile}, nil
}
