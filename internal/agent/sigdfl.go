package agent

import (
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"syscall"
)

// runSigDfl execs PROG with SIGINT and SIGQUIT at their default actions.
// A POSIX shell starts a background command (cmd &) with both ignored, and
// exec keeps ignored signals ignored; sbx hunt runs a test in the
// background under --timeout, and the test must see the signals as it
// would in the foreground. Handled signals are reset by exec, so handling
// them here (Notify) is what puts them back to their defaults.
func runSigDfl(args []string, stderr io.Writer) int {
	if len(args) > 0 && args[0] == "--" {
		args = args[1:]
	}
	if len(args) == 0 {
		fmt.Fprintln(stderr, "sbx-agent: usage: sbx-agent sigdfl -- PROG [ARGS...]")
		return ExitUsageExec
	}
	signal.Notify(make(chan os.Signal, 1), syscall.SIGINT, syscall.SIGQUIT)
	path, err := exec.LookPath(args[0])
	if err != nil {
		fmt.Fprintf(stderr, "sbx-agent: %s: command not found\n", args[0])
		return ExitNotFoundExec
	}
	err = syscall.Exec(path, args, os.Environ())
	fmt.Fprintf(stderr, "sbx-agent: %s: %v\n", args[0], err)
	return ExitCannotExec
}
