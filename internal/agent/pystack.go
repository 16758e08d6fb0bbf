package agent

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"sbx.dev/sbx/internal/agent/hooks"
)

// Reading a Python process's stack from outside. py-spy is not packaged by
// Debian bookworm, and gdb's own Python extensions (py-bt) need the
// interpreter's debug symbols, which Debian ships only in its debug archive.
// What every Debian python3 has is the C API, exported: gdb attaches, calls
// PyGILState_Ensure and PyRun_SimpleString in the process to run
// sbx_pystack.py there (every thread's frames and locals, written to a
// file), and lets it go. The process is stopped meanwhile (a fraction of a
// second) and goes on as it was.
//
// One thing gVisor does not do as Linux does: a thread stopped by ptrace in
// a system call (a sleep, a wait, an accept) and whose registers are written
// back comes out of the call with gVisor's internal "restart" errno
// (ERESTARTNOHAND, 514) instead of restarting it; Python raises it as
// OSError. The gdb script restarts the call itself, as Linux would: the
// system call number back in rax and the pc back on the syscall
// instruction.

// pystackGDB is the gdb script; %[1]s is the Python statement to run.
const pystackGDB = `set debuginfod enabled off
set pagination off
set confirm off
set $sbx_rax = $rax
set $sbx_orig = $orig_rax
set $sbx_pc = $pc
call (int)PyGILState_Ensure()
set $sbx_gil = $
call (int)PyRun_SimpleString("%[1]s")
call (void)PyGILState_Release($sbx_gil)
if $sbx_rax == -512 || $sbx_rax == -513 || $sbx_rax == -514 || $sbx_rax == -516
  set $rax = $sbx_orig
  set $pc = $sbx_pc - 2
end
detach
`

// pyStack returns the stacks of every thread of Python process pid, with
// their locals. It needs gdb in the sandbox and the right to trace pid.
func pyStack(ctx context.Context, pid int) (string, error) {
	exe, err := os.Readlink("/proc/" + strconv.Itoa(pid) + "/exe")
	if err != nil {
		return "", fmt.Errorf("process %d: %w", pid, err)
	}
	if !strings.HasPrefix(filepath.Base(exe), "python") {
		return "", fmt.Errorf("process %d runs %s, not python", pid, exe)
	}
	gdb, err := exec.LookPath("gdb")
	if err != nil {
		return "", errors.New("no gdb in the sandbox (the base template has it)")
	}
	dir, err := os.MkdirTemp("", "sbx-pystack-")
	if err != nil {
		return "", err
	}
	defer os.RemoveAll(dir)
	// the process writes its stack itself, as whichever user it runs as
	if err := os.Chmod(dir, 0o777); err != nil {
		return "", err
	}
	out := filepath.Join(dir, "stack.txt")
	stmt := fmt.Sprintf("exec(compile(open('%[1]s').read(), '%[1]s', 'exec'), {'OUT': '%[2]s', '__file__': '%[1]s', '__name__': 'sbx_pystack'})",
		hooks.PyStackScript, out)
	script := filepath.Join(dir, "pystack.gdb")
	if err := os.WriteFile(script, []byte(fmt.Sprintf(pystackGDB, stmt)), 0o644); err != nil {
		return "", err
	}
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, gdb, "-batch", "-nx", "-p", strconv.Itoa(pid), "-x", script)
	cmd.Env = append(os.Environ(), "DEBUGINFOD_URLS=")
	log, err := cmd.CombinedOutput()
	b, rerr := os.ReadFile(out)
	if rerr != nil || len(b) == 0 {
		why := strings.TrimSpace(string(log))
		if len(why) > 2000 {
			why = why[len(why)-2000:]
		}
		if err == nil {
			err = errors.New("the process wrote no stack")
		}
		return "", fmt.Errorf("read the Python stack of %d: %w: %s", pid, err, why)
	}
	return string(b), nil
}

// runPyStack is `sbx-agent pystack --pid N`: the Python stacks of a
// process, with their locals, on stdout.
func runPyStack(args []string, stdout io.Writer) error {
	fset := flag.NewFlagSet("pystack", flag.ContinueOnError)
	pid := fset.Int("pid", 0, "the Python process")
	if _, err := parseFlags(fset, args, 0, "pystack --pid PID"); err != nil {
		return err
	}
	if *pid <= 0 {
		return invalidf("pystack: --pid is required; usage: sbx-agent pystack --pid PID")
	}
	s, err := pyStack(context.Background(), *pid)
	if err != nil {
		return failf(ExitError, "%s", err)
	}
	_, err = io.WriteString(stdout, s)
	return err
}
