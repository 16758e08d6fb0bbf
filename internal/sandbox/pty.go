package sandbox

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/creack/pty"

	"sbx.dev/sbx/api"
	"sbx.dev/sbx/internal/runsc"
)

// A terminal is a host pty whose replica is the stdio and controlling
// terminal of `runsc exec`. runsc then treats its stdio as a terminal
// (process.json's Terminal): the sandbox's process uses the host pty, whose
// line discipline turns ^C into a SIGINT for runsc, which forwards it to the
// sandbox's foreground process group; a window size set on the master is
// what the process reads. This is what runsc's own --console-socket does,
// except that runsc honours --console-socket only with --detach, and a
// detached runsc exec's exit code is out of reach: owning the pty keeps it.

// DefaultShell is what a terminal runs when given no command: bash where the
// sandbox has it, else sh.
var DefaultShell = []string{"/bin/sh", "-c", "if [ -x /bin/bash ]; then exec /bin/bash; fi; exec /bin/sh"}

// ptyHangupGrace is how long a terminal's command has to end after its
// hang-up before runsc exec is killed.
const ptyHangupGrace = 3 * time.Second

// PTY starts cmd (DefaultShell when empty) in running sandbox ref with a
// terminal of cols x rows (80x24 for 0) and returns the terminal's master
// and a wait function that returns the command's exit code once it has
// ended. Ending ctx hangs the terminal up (SIGHUP, then SIGKILL to runsc
// after a grace). The sandbox is leased, so counts as active, until wait
// returns: the caller must call wait. It returns api.ErrNotFound for an
// unknown sandbox, api.ErrConflict for one not running, api.ErrInvalid for a
// bad env, cwd or size.
func (m *Manager) PTY(ctx context.Context, ref string, cmd, env []string, cwd string, cols, rows int) (*os.File, func() (int, error), error) {
	for _, e := range env {
		if k, _, ok := strings.Cut(e, "="); !ok || k == "" {
			return nil, nil, api.Errorf(api.ErrInvalid, "env: %q is not KEY=VALUE", e)
		}
	}
	if cwd != "" && !strings.HasPrefix(cwd, "/") {
		return nil, nil, api.Errorf(api.ErrInvalid, "cwd: %q is not an absolute path", cwd)
	}
	if cols < 0 || rows < 0 || cols > 0xffff || rows > 0xffff {
		return nil, nil, api.Errorf(api.ErrInvalid, "terminal size %dx%d is out of range", cols, rows)
	}
	if cols == 0 {
		cols = 80
	}
	if rows == 0 {
		rows = 24
	}
	if len(cmd) == 0 {
		cmd = DefaultShell
	}
	if cmd[0] == "" {
		return nil, nil, api.Errorf(api.ErrInvalid, "cmd: give a command to run")
	}
	sb, err := m.running(ctx, ref)
	if err != nil {
		return nil, nil, err
	}
	release, err := m.Lease(ctx, sb.ID)
	if err != nil {
		return nil, nil, err
	}
	master, c, process, err := m.startPTY(ctx, sb.ID, cmd, env, cwd, cols, rows)
	if err != nil {
		release()
		return nil, nil, err
	}
	var (
		once sync.Once
		code int
		werr error
	)
	wait := func() (int, error) {
		once.Do(func() {
			err := c.Wait()
			os.Remove(process)
			release()
			var ee *exec.ExitError
			switch {
			case err == nil:
				code = 0
			case errors.As(err, &ee) && ee.Exited():
				code = ee.ExitCode()
			default:
				code, werr = -1, fmt.Errorf("pty in %s: %w", sb.ID, err)
			}
		})
		return code, werr
	}
	return master, wait, nil
}

// startPTY starts runsc exec on a new pty; starting is serialized with the
// sandbox's lifecycle, as an exec's is.
func (m *Manager) startPTY(ctx context.Context, id string, cmd, env []string, cwd string, cols, rows int) (*os.File, *exec.Cmd, string, error) {
	unlock := m.lock(id)
	defer unlock()
	if _, err := m.running(ctx, id); err != nil {
		return nil, nil, "", err
	}
	dir := filepath.Join(m.sandboxDir(id), "ptys")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, nil, "", fmt.Errorf("pty in %s: %w", id, err)
	}
	process := filepath.Join(dir, newID("pt_")+".json")
	p := runsc.Process(cmd, env, cwd)
	p.Terminal = true
	if err := runsc.WriteProcess(process, p); err != nil {
		return nil, nil, "", fmt.Errorf("pty in %s: %w", id, err)
	}
	master, tty, err := pty.Open()
	if err != nil {
		os.Remove(process)
		return nil, nil, "", fmt.Errorf("pty in %s: open: %w", id, err)
	}
	// the replica is runsc's alone once it has started: the master reads
	// EOF (EIO) when the last holder closes it
	defer tty.Close()
	if err := pty.Setsize(master, &pty.Winsize{Cols: uint16(cols), Rows: uint16(rows)}); err != nil {
		master.Close()
		os.Remove(process)
		return nil, nil, "", fmt.Errorf("pty in %s: set size: %w", id, err)
	}
	c := m.cfg.Runtime.ExecCommand(ctx, id, runsc.ExecOptions{Process: process})
	c.Stdin, c.Stdout, c.Stderr = tty, tty, tty
	c.SysProcAttr = &syscall.SysProcAttr{Setsid: true, Setctty: true, Ctty: 0}
	// a hang-up, as a terminal closed: runsc forwards it to the command
	c.Cancel = func() error { return c.Process.Signal(syscall.SIGHUP) }
	c.WaitDelay = ptyHangupGrace
	if err := c.Start(); err != nil {
		master.Close()
		os.Remove(process)
		return nil, nil, "", fmt.Errorf("pty in %s: start runsc exec: %w", id, err)
	}
	return master, c, process, nil
}
