package main

import (
	"strconv"
	"strings"
	"syscall"

	"github.com/spf13/cobra"
)

// killJSON is what `sbx --json kill` prints.
type killJSON struct {
	Sandbox string `json:"sandbox"`
	Exec    string `json:"exec"`
	Signal  int    `json:"signal"`
}

func newKillCmd(e *env) *cobra.Command {
	var sig string
	cmd := &cobra.Command{
		Use:   "kill [flags] ID EXEC_ID",
		Short: "send a signal to an exec (default SIGTERM): the command and what it started in its group",
		Long: "kill sends a signal to an exec's process group inside the sandbox: the command and\n" +
			"the processes it started that stayed in its group (one that made its own session is\n" +
			"not reached). EXEC_ID is what `sbx exec -d` printed, or `sbx ps ID` lists.",
		Example:           "  sbx kill web ex_abc            # SIGTERM\n  sbx kill web ex_abc -s KILL\n  sbx kill web ex_abc -s 2",
		Args:              exactArgs(2, "a sandbox id and an exec id"),
		ValidArgsFunction: completeSandboxes(e),
	}
	cmd.Flags().StringVarP(&sig, "signal", "s", "TERM", "the signal: a name (TERM, KILL, INT, HUP, SIGUSR1, ...) or a number")
	cmd.RunE = func(cmd *cobra.Command, args []string) error {
		n, err := parseSignal(sig)
		if err != nil {
			return err
		}
		c, err := e.client()
		if err != nil {
			return err
		}
		if err := c.Sandbox(args[0]).Process(args[1]).Signal(e.ctx, n); err != nil {
			return err
		}
		if e.json {
			return e.printJSON(killJSON{Sandbox: args[0], Exec: args[1], Signal: int(n)})
		}
		return nil
	}
	return cmd
}

// signalNames are the signals kill takes by name.
var signalNames = map[string]syscall.Signal{
	"HUP": syscall.SIGHUP, "INT": syscall.SIGINT, "QUIT": syscall.SIGQUIT, "ILL": syscall.SIGILL,
	"TRAP": syscall.SIGTRAP, "ABRT": syscall.SIGABRT, "BUS": syscall.SIGBUS, "FPE": syscall.SIGFPE,
	"KILL": syscall.SIGKILL, "USR1": syscall.SIGUSR1, "SEGV": syscall.SIGSEGV, "USR2": syscall.SIGUSR2,
	"PIPE": syscall.SIGPIPE, "ALRM": syscall.SIGALRM, "TERM": syscall.SIGTERM, "CHLD": syscall.SIGCHLD,
	"CONT": syscall.SIGCONT, "STOP": syscall.SIGSTOP, "TSTP": syscall.SIGTSTP, "TTIN": syscall.SIGTTIN,
	"TTOU": syscall.SIGTTOU, "URG": syscall.SIGURG, "XCPU": syscall.SIGXCPU, "XFSZ": syscall.SIGXFSZ,
	"VTALRM": syscall.SIGVTALRM, "PROF": syscall.SIGPROF, "WINCH": syscall.SIGWINCH, "IO": syscall.SIGIO,
	"PWR": syscall.SIGPWR, "SYS": syscall.SIGSYS,
}

// parseSignal reads a signal as kill(1) takes it: TERM, SIGTERM, term, 15.
func parseSignal(s string) (syscall.Signal, error) {
	if n, err := strconv.Atoi(s); err == nil {
		if n < 1 || n > 64 {
			return 0, usagef("--signal %d: want a signal number from 1 to 64", n)
		}
		return syscall.Signal(n), nil
	}
	name := strings.TrimPrefix(strings.ToUpper(s), "SIG")
	if n, ok := signalNames[name]; ok {
		return n, nil
	}
	return 0, usagef("--signal %q: not a signal; give a name (TERM, KILL, INT, HUP, ...) or a number", s)
}
