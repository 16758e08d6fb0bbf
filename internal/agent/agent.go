// Package agent is the helper sbxd runs inside each sandbox: it runs commands
// with a platform-enforced timeout, moves files and reports on files and
// listening ports, with every path resolved inside the sandbox.
//
// The daemon mounts the sbx-agent binary read-only at /.sbx/sbx-agent and
// starts it as root through `runsc exec`. It is a one-shot process: Main runs
// one subcommand and returns the process exit code. The exception is init,
// the sandbox's first process, which starts the commands that must survive a
// checkpoint (spawn) and keeps their output for attach. It uses the standard
// library and x/sys only, so it starts quickly and builds as a static binary.
package agent

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"math/rand/v2"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

const usage = `usage:
  sbx-agent init
  sbx-agent gcore --pid PID [--tid TID] [--signal N] --out DIR
  sbx-agent exec [--timeout DURATION] [--cwd DIR] [--env K=V]... -- PROG [ARGS...]
  sbx-agent spawn --id ID [--timeout DURATION] [--cwd DIR] [--env K=V]... [--pid-fd N] -- PROG [ARGS...]
  sbx-agent attach --id ID [--stdout-offset N] [--stderr-offset N]
  sbx-agent kill --id ID [--signal N]
  sbx-agent get [--tar] [--user U] PATH
  sbx-agent put --size N [--mode 0644] [--user U] PATH
  sbx-agent untar [--user U] PATH
  sbx-agent stat [--user U] PATH
  sbx-agent ls [--user U] PATH
  sbx-agent mkdir [--mode 0755] [--user U] PATH
  sbx-agent rm [-r] [--user U] PATH
  sbx-agent mv [--user U] FROM TO

A PATH of ~ or ~/... starts at the home of U (default root), ~NAME/... at
NAME's, from the sandbox's /etc/passwd.
  sbx-agent ports
  sbx-agent now
  sbx-agent sigdfl -- PROG [ARGS...]
  sbx-agent freeze [--reason TEXT] [--failed-at TIME] [--no-hold] [--json] | freeze --status
  sbx-agent pystack --pid PID        (a Python process's stacks and locals)
  sbx-agent hunt --config FILE [--evidence]   (sbx hunt's loop; see HuntConfig)

Called as freeze (the link /.sbx/freeze), it is sbx-agent freeze.`

// Main runs the subcommand named by args[0] and returns the exit code. It
// reads file contents and tars from stdin, writes results to stdout and
// writes one line, "sbx-agent: <message>", to stderr when it fails; the
// message is fit to show a user as it is.
//
// exec is meant to be the whole life of the process: on timeout it kills
// every descendant of the calling process.
func Main(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprintln(stderr, usage)
		return ExitInvalid
	}
	cmd, args := args[0], args[1:]
	switch cmd {
	case "exec":
		return runExec(args, stdin, stdout, stderr)
	case "spawn":
		return runSpawn(args, stdout, stderr)
	case "start":
		return runStart(stdin, stdout, stderr)
	case "attach":
		return runAttach(args, stdout, stderr)
	case "init":
		return runInit(stderr)
	case "sigdfl":
		return runSigDfl(args, stderr)
	case "freeze":
		return runFreeze(args, stdout, stderr)
	case "hunt":
		return runHunt(args, stdout, stderr)
	}
	var err error
	switch cmd {
	case "get":
		err = runGet(args, stdout)
	case "put":
		err = runPut(args, stdin)
	case "untar":
		err = runUntar(args, stdin)
	case "stat":
		err = runStat(args, stdout)
	case "ls":
		err = runLs(args, stdout)
	case "ports":
		err = runPorts(args, stdout)
	case "kill":
		err = runKill(args)
	case "mkdir":
		err = runMkdir(args)
	case "rm":
		err = runRm(args)
	case "mv":
		err = runMv(args)
	case "pystack":
		err = runPyStack(args, stdout)
	case "gcore":
		err = runGcore(args, stdout)
	case "now":
		// the clock in seconds with nanoseconds, for shells whose date has no %N
		t := time.Now()
		fmt.Fprintf(stdout, "%d.%09d\n", t.Unix(), t.Nanosecond())
	case "help", "-h", "--help":
		fmt.Fprintln(stdout, usage)
		return ExitOK
	default:
		err = invalidf("unknown subcommand %q; run `sbx-agent help`", cmd)
	}
	if err == nil {
		return ExitOK
	}
	fmt.Fprintf(stderr, "sbx-agent: %s\n", oneLine(err.Error()))
	var ee *exitError
	if errors.As(err, &ee) {
		return ee.code
	}
	return ExitError
}

// exitError is a failure with the exit code that reports it.
type exitError struct {
	code int
	msg  string
}

func (e *exitError) Error() string { return e.msg }

func failf(code int, format string, args ...any) error {
	return &exitError{code: code, msg: fmt.Sprintf(format, args...)}
}

func invalidf(format string, args ...any) error {
	return failf(ExitInvalid, format, args...)
}

// pathError turns an error from the file system about path into a message a
// user can read and the exit code that goes with it.
func pathError(path string, err error) error {
	var ee *exitError
	if errors.As(err, &ee) {
		return err
	}
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return failf(ExitNotFound, "%s does not exist", path)
	case errors.Is(err, syscall.ENOTDIR):
		return invalidf("%s: a parent of it is not a directory", path)
	case errors.Is(err, syscall.EISDIR):
		return invalidf("%s is a directory", path)
	case errors.Is(err, syscall.ELOOP):
		return invalidf("%s: too many levels of symbolic links", path)
	case errors.Is(err, fs.ErrExist):
		return failf(ExitExists, "%s already exists", path)
	case errors.Is(err, fs.ErrPermission):
		return failf(ExitError, "%s: permission denied", path)
	case errors.Is(err, syscall.ENOSPC):
		return failf(ExitError, "%s: no space left on device", path)
	}
	var pe *fs.PathError
	if errors.As(err, &pe) {
		return failf(ExitError, "%s %s: %s", pe.Op, pe.Path, pe.Err)
	}
	return failf(ExitError, "%s: %s", path, err)
}

// absPath checks that p is an absolute path and returns it cleaned.
func absPath(p string) (string, error) {
	if p == "" {
		return "", invalidf("empty path; give an absolute path")
	}
	if !filepath.IsAbs(p) {
		return "", invalidf("path %s is not absolute; give an absolute path", p)
	}
	if strings.IndexByte(p, 0) >= 0 {
		return "", invalidf("path %q contains a NUL byte", p)
	}
	return filepath.Clean(p), nil
}

// parseFlags parses the flags of subcommand cmd and checks that exactly
// npos positional arguments follow them.
func parseFlags(fset *flag.FlagSet, args []string, npos int, syntax string) ([]string, error) {
	fset.SetOutput(io.Discard)
	if err := fset.Parse(args); err != nil {
		return nil, invalidf("%s: %s; usage: sbx-agent %s", fset.Name(), err, syntax)
	}
	if fset.NArg() != npos {
		return nil, invalidf("%s: want %d argument(s), got %d; usage: sbx-agent %s", fset.Name(), npos, fset.NArg(), syntax)
	}
	return fset.Args(), nil
}

// tempName returns the name of a temporary sibling of path:
// "<dir>/.<base>.sbx-tmp-<random>".
func tempName(path string) string {
	dir, base := filepath.Split(path)
	return filepath.Join(dir, "."+base+".sbx-tmp-"+strconv.FormatUint(rand.Uint64(), 36))
}

func oneLine(s string) string {
	return strings.NewReplacer("\n", " ", "\r", " ").Replace(s)
}
