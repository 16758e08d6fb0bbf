package agent

import (
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"
)

const spawnSyntax = "spawn --id ID [--timeout DURATION] [--cwd DIR] [--env K=V]... [--pid-fd N] -- PROG [ARGS...]"

// runSpawn asks init to start a command, then follows its output as attach
// does and exits with its exit code. The command is init's child, not this
// process's: it survives this process, and a checkpoint and restore of the
// sandbox, which kills every process `runsc exec` started.
//
// Its own failures, and those init reports, are written on stderr as
// "sbx: <message>" with the exit codes exec uses for them (125 when init
// cannot be reached).
func runSpawn(args []string, stdout, stderr io.Writer) int {
	fset := flag.NewFlagSet("spawn", flag.ContinueOnError)
	fset.SetOutput(io.Discard)
	id := fset.String("id", "", "the exec id, which names its directory under "+ExecsDir)
	timeout := fset.Duration("timeout", 0, "kill the command after this long (0: never)")
	cwd := fset.String("cwd", "", "directory to run the command in (default: this process's)")
	var env envFlag
	fset.Var(&env, "env", "KEY=VALUE to set for the command (repeatable; wins over the sandbox's own)")
	pidFd := fset.Int("pid-fd", -1, "file descriptor to write the command's pid to, then close")
	usageErr := func(format string, args ...any) int {
		fmt.Fprintf(stderr, "sbx: spawn: %s; usage: sbx-agent %s\n", fmt.Sprintf(format, args...), spawnSyntax)
		return ExitUsageExec
	}
	if err := fset.Parse(args); err != nil {
		return usageErr("%s", err)
	}
	argv := fset.Args()
	switch {
	case !validExecID(*id):
		return usageErr("bad --id %q; use letters, digits, '_', '-' and '.'", *id)
	case len(argv) == 0 || argv[0] == "":
		return usageErr("no command given")
	case *timeout < 0:
		return usageErr("negative timeout %s", *timeout)
	}
	for _, kv := range env {
		if k, _, ok := strings.Cut(kv, "="); !ok || k == "" {
			return usageErr("--env %q is not KEY=VALUE", kv)
		}
	}
	var pidFile *os.File
	if *pidFd >= 0 {
		// checked before the command starts, not after
		if _, err := unix.FcntlInt(uintptr(*pidFd), unix.F_GETFD, 0); err != nil {
			return usageErr("--pid-fd %d: %s", *pidFd, err)
		}
		pidFile = os.NewFile(uintptr(*pidFd), "pid-fd")
	}
	// as under exec, the command runs where this process does unless told
	// otherwise, and init's own directory may differ
	dir := *cwd
	if wd, err := os.Getwd(); err == nil && (dir == "" || !filepath.IsAbs(dir)) {
		dir = filepath.Join(wd, dir)
	}
	req := initRequest{Op: "spawn", ID: *id, Argv: argv, Env: env, Cwd: dir}
	if *timeout > 0 {
		req.Timeout = timeout.String()
	}
	rep, err := callInit(req)
	switch {
	case err != nil:
		fmt.Fprintf(stderr, "sbx: spawn %s: %s\n", *id, oneLine(err.Error()))
		return ExitUsageExec
	case rep.Code != 0 || rep.Error != "":
		fmt.Fprintf(stderr, "sbx: %s\n", oneLine(rep.Error))
		if rep.Code == 0 {
			return ExitError
		}
		return rep.Code
	}
	if pidFile != nil {
		if _, err := fmt.Fprintf(pidFile, "%d\n", rep.Pid); err != nil {
			// the command runs regardless: report, and follow it
			fmt.Fprintf(stderr, "sbx: spawn: write pid to --pid-fd %d: %s\n", *pidFd, err)
		}
		pidFile.Close()
	}
	return attach(*id, 0, 0, stdout, stderr)
}
