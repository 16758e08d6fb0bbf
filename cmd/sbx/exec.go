package main

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"golang.org/x/sys/unix"

	"sbx.dev/sbx/api"
	"sbx.dev/sbx/client"
	"sbx.dev/sbx/internal/flaky"
)

// defaultExecTimeout bounds a foreground exec given no --timeout: a
// forgotten `sbx exec ID sleep infinity` in a script must not hang it.
const defaultExecTimeout = 30 * time.Second

// execOptions are the flags of exec (and, in part, of shell).
type execOptions struct {
	envs                        []string
	cwd, user, crashDir         string
	detach, onCrash, tty, stdin bool
	timeout                     *durationFlag
}

func newExecCmd(e *env) *cobra.Command {
	var o execOptions
	cmd := &cobra.Command{
		Use:        "exec [flags] ID [--] CMD [ARGS...]",
		SuggestFor: []string{"run"},
		Short:      "run a command in a sandbox; exits with its exit code",
		Long: "exec runs CMD in the sandbox and exits with its exit code. Everything after the\n" +
			"sandbox id that is not one of exec's flags starts the command, which owns the rest:\n" +
			"`sbx exec ID ls -la` runs `ls -la`, and `sbx exec ID ls --timeout 5s` gives --timeout\n" +
			"to ls. exec's own flags go before the id or right after it; `--` is accepted, not\n" +
			"needed. A single argument with shell syntax runs under /bin/sh -c.\n\n" +
			"In the foreground a command gets " + defaultExecTimeout.String() + " unless --timeout says otherwise\n" +
			"(--timeout 0: no limit); --detach has none.\n\n" +
			"--on-crash: every sandbox holds a process that gets a signal whose default action\n" +
			"dumps core (SIGSEGV, SIGABRT, SIGBUS, SIGFPE, SIGILL, SIGTRAP, SIGSYS, SIGQUIT)\n" +
			"with no handler at its faulting instruction and freezes itself (sbx crashes ID).\n" +
			"CMD runs as a plain exec: no gdb, no wrapper, any template. When CMD or any\n" +
			"process it started crashed, sbx waits for that capture, prints the backtrace on\n" +
			"stderr and writes the bundle into ./sbx-crash-EXECID/ (or --crash-dir DIR) as\n" +
			"`sbx crashes ID --bundle DIR` does: crash.tar (a core written by gcore in a\n" +
			"copy of the capture, the exact program and its libraries matched by build-id,\n" +
			"/usr/lib/debug files, the mappings) and backtrace.txt. It exits with 128+signal\n" +
			"(139 for SIGSEGV), also when the crash was a child's and CMD itself exited.\n" +
			"A sandbox catches one crash per boot: when that capture was spent already (on\n" +
			"an earlier crash or a freeze), sbx says which and exits with CMD's code. A\n" +
			"sandbox made with --no-crash-capture is refused before CMD runs.\n\n" +
			"-d --on-crash starts CMD as -d does (it prints EXEC_ID PID); its crash, or its\n" +
			"children's, is read later: sbx crashes ID [--bundle DIR].",
		Example: "  sbx exec web ls -la /srv\n" +
			"  sbx exec web -- python3 -c 'print(6*7)'\n" +
			"  sbx exec web 'cd /srv && ls | wc -l'          # one string runs under /bin/sh -c\n" +
			"  sbx exec --timeout 10m -e SEED=7 -w /srv web ./flaky-test\n" +
			"  sbx exec -it web bash                         # a terminal, as sbx shell\n" +
			"  sbx exec -d web ./server                      # prints EXEC_ID PID at once\n" +
			"  sbx exec --on-crash web ./segfaulter          # the backtrace, ./sbx-crash-EXECID/",
		Args:              cobra.ArbitraryArgs,
		ValidArgsFunction: completeSandboxes(e),
	}
	cmd.Flags().SetInterspersed(false)
	fs := cmd.Flags()
	o.timeout = durationVar(fs, "timeout", "kill the command after this long, e.g. 5m or 300 (seconds); 0: no limit (default "+defaultExecTimeout.String()+" in the foreground, none with --detach)")
	fs.StringArrayVarP(&o.envs, "env", "e", nil, "environment variable K=V (repeatable)")
	fs.StringVarP(&o.cwd, "cwd", "w", "", "working directory")
	fs.StringVarP(&o.user, "user", "u", "", "run as this user: a name or uid[:gid] (default: the template's user)")
	fs.BoolVarP(&o.detach, "detach", "d", false, "start the command and print EXEC_ID PID; it outlives sbx")
	fs.BoolVarP(&o.tty, "tty", "t", false, "run the command in a terminal, as sbx shell does")
	fs.BoolVarP(&o.stdin, "interactive", "i", false, "with -t: keep the terminal's input (an exec without -t has no stdin)")
	fs.BoolVar(&o.onCrash, "on-crash", false, "if CMD or a process it started crashes, print the backtrace of the sandbox's capture and save its bundle (with -d: read it later with sbx crashes)")
	fs.StringVar(&o.crashDir, "crash-dir", "", "with --on-crash: the folder for the bundle (default ./sbx-crash-EXECID)")
	cmd.RunE = remote(func(cmd *cobra.Command, args []string) error {
		pos, command, err := remoteArgs(cmd, args, 1)
		if err != nil {
			return err
		}
		if len(pos) == 0 || len(command) == 0 {
			return usagef("exec takes a sandbox id and a command")
		}
		if err := checkEnv(o.envs); err != nil {
			return err
		}
		switch {
		case o.stdin && !o.tty:
			return usagef("-i: an exec has no stdin; for an interactive terminal use -it (or sbx shell ID), to copy a file in use sbx scp")
		case o.tty && (o.detach || o.onCrash):
			return usagef("-t runs a terminal; it does not go with --detach or --on-crash")
		case o.tty && e.json:
			return usagef("-t runs a terminal, which prints no JSON; leave out -t for JSON lines of the output")
		case o.tty && o.timeout.set:
			return usagef("-t runs a terminal, which has no --timeout; end it from inside")
		case o.onCrash && o.detach && o.crashDir != "":
			return usagef("--crash-dir goes with a foreground --on-crash; a detached command's crash is read later: sbx crashes %s --bundle DIR", pos[0])
		case o.crashDir != "" && !o.onCrash:
			return usagef("--crash-dir goes with --on-crash")
		}
		id := pos[0]
		if o.tty {
			return runTerminal(e, id, shellWrap(command), o.envs, o.cwd, o.user)
		}
		req := api.ExecRequest{Cmd: shellWrap(command), Env: o.envs, Cwd: o.cwd, User: o.user, Timeout: o.timeout.Duration}
		defaulted := !o.timeout.set && !o.detach
		if defaulted {
			req.Timeout = api.Duration(defaultExecTimeout)
		}
		c, err := e.client()
		if err != nil {
			return err
		}
		opts := []client.ExecOption{client.WithEnv(o.envs...), client.WithCwd(o.cwd), client.WithUser(o.user)}
		switch {
		case defaulted:
			opts = append(opts, client.WithTimeout(defaultExecTimeout))
		case o.timeout.set:
			opts = append(opts, client.WithTimeout(o.timeout.D()))
		}
		if o.onCrash && !o.detach {
			return runExecOnCrash(e, c, id, req.Cmd, opts, o.crashDir)
		}
		sb := c.Sandbox(id)
		if o.detach {
			if o.onCrash {
				// refuses, before it starts, a sandbox that catches no crash
				opts = append(opts, client.WithOnCrash())
			}
			p, err := sb.Start(e.ctx, req.Cmd, opts...)
			if err != nil {
				return err
			}
			if e.json {
				x, err := p.Info(e.ctx)
				if err != nil {
					return err
				}
				return e.printJSON(x.API())
			}
			_, err = fmt.Fprintf(e.stdout, "%s %d\n", p.ID, p.Pid)
			if err == nil && o.onCrash {
				// every sandbox catches its crashes; nothing runs under gdb
				fmt.Fprintf(e.stderr, "sbx: a crash of %s or anything it starts is caught at its faulting instruction (the sandbox's first of this boot): read it with sbx crashes %s [--bundle DIR]\n", p.ID, id)
			}
			return err
		}
		res, err := sb.Exec(e.ctx, req.Cmd, append(opts, client.WithExecEvents(e.execEvent))...)
		if err != nil {
			if e.interrupted() && res != nil && !e.json {
				fmt.Fprintf(e.stderr, "\nsbx: %s goes on in the sandbox: `sbx attach %s %s` follows it\n", res.ID, id, res.ID)
			}
			return err
		}
		if defaulted && res.TimedOut && !e.json {
			fmt.Fprintf(e.stderr, "sbx: %s is the timeout of a foreground exec unless --timeout says otherwise: run with --timeout 0 for no limit, or --timeout 10m\n", defaultExecTimeout)
		}
		return lostWhy(e.ctx, sb, exitStatus(res.API()), res.API())
	})
	return cmd
}

// runExecOnCrash is exec --on-crash in the foreground: a plain exec
// (client.WithOnCrash); when the sandbox caught a crash of its process
// tree, the crash's bundle is written as `sbx crashes --bundle` writes it.
func runExecOnCrash(e *env, c *client.Client, id string, cmd []string, opts []client.ExecOption, dir string) error {
	res, err := c.Sandbox(id).Exec(e.ctx, cmd, append(opts, client.WithOnCrash(), client.WithExecEvents(e.execEvent))...)
	if err != nil {
		if e.interrupted() && res != nil && !e.json {
			fmt.Fprintf(e.stderr, "\nsbx: %s goes on in the sandbox: `sbx attach %s %s` follows it; its crash, if any, is read with sbx crashes %s\n", res.ID, id, res.ID, id)
		}
		return err
	}
	if res.CrashMissed != "" {
		if e.json {
			if err := e.printJSONLine(map[string]any{"event": "crash", "missed": res.CrashMissed}); err != nil {
				return err
			}
		} else {
			fmt.Fprintf(e.stderr, "sbx: %s died of a signal that dumps core (exit %d); %s\n", res.ID, res.ExitCode, safe(res.CrashMissed))
		}
		return exitStatus(res.API())
	}
	if res.Crash == nil {
		return exitStatus(res.API())
	}
	cr := *res.Crash
	b, berr := flaky.CrashBundle(e.ctx, flaky.Adapt(c), cr, flaky.CrashDir(dir, res.ID))
	if berr != nil {
		berr = fmt.Errorf("exec %s: the sandbox caught the crash of %d (%s) as %s, but its bundle was not written: %w (sbx crashes %s --bundle DIR tries again)", res.ID, cr.Pid, safe(cr.Signal), safe(cr.Snapshot), berr, id)
	} else {
		b.ExecID = res.ID
	}
	if e.json {
		ev := map[string]any{"event": "crash", "crash": cr}
		if b != nil {
			ev["bundle"] = b
		}
		if err := e.printJSONLine(ev); err != nil && berr == nil {
			berr = err
		}
	} else {
		// the crash and its backtrace are the sandbox's word (its gdb)
		fmt.Fprintf(e.stderr, "sbx: %d (%s) of %s died of %s, as the sandbox reports it; caught at its faulting instruction as %s\n", cr.Pid, safe(orDash(cr.Exe)), res.ID, safe(cr.Signal), safe(cr.Snapshot))
		if b != nil {
			fmt.Fprintf(e.stderr, "sbx: backtrace:\n%s", safeText(b.Backtrace))
			if b.Backtrace != "" && !strings.HasSuffix(b.Backtrace, "\n") {
				fmt.Fprintln(e.stderr)
			}
			for _, f := range b.Files {
				if f.Match == "mismatch" {
					fmt.Fprintf(e.stderr, "sbx: warning: %s changed on disk since it was mapped (build-id differs); the copy is not the binary that ran\n", safe(f.Path))
				}
			}
			fmt.Fprintf(e.stderr, "sbx: crash bundle: %s and %s\n", safe(b.Tar), safe(filepath.Join(b.Dir, "backtrace.txt")))
			if b.Truncated != "" {
				fmt.Fprintf(e.stderr, "sbx: warning: the crash bundle is cut short: %s\n", b.Truncated)
			}
		}
	}
	if berr != nil {
		return berr
	}
	code := res.ExitCode
	if sig := int(unix.SignalNum(cr.Signal)); sig > 0 && !isSignalCode(code) {
		// a process of its tree crashed, not the command itself: the exec
		// still says it crashed
		code = 128 + sig
	}
	return exitStatus(&api.Exec{ID: res.ID, State: res.State, ExitCode: &code})
}

// isSignalCode reports whether an exit code is a death by a signal.
func isSignalCode(code int) bool { return code < 0 || code > 128 && code < 128+65 }

// execEvent shows one event of a foreground exec.
func (e *env) execEvent(ev api.ExecEvent) error {
	if e.json {
		return e.printJSONLine(ev)
	}
	var err error
	switch ev.Event {
	case api.ExecStdout:
		_, err = e.stdout.Write(ev.Data)
	case api.ExecStderr:
		_, err = e.stderr.Write(ev.Data)
	case api.ExecNotice:
		_, err = fmt.Fprintf(e.stderr, "sbx: %s\n", safe(ev.Message))
	}
	return err
}

// lostWhy adds to the error of a lost exec what became of its sandbox,
// when that is why: a sandbox the kernel stopped (out of memory) loses
// every command in it.
func lostWhy(ctx context.Context, sb *client.Sandbox, err error, x *api.Exec) error {
	if x.State != api.ExecLost || err == nil {
		return err
	}
	info, ierr := sb.Info(ctx)
	if ierr != nil || info.State == api.StateReady || info.Reason == "" {
		return err
	}
	return fmt.Errorf("%w: sandbox %s is %s: %s", err, info.ID, info.State, safe(info.Reason))
}

// exitStatus turns an ended exec into sbx's exit: nil for 0, else an
// *exitError with the remote code (a negative code, a signal, becomes 128+n).
func exitStatus(x *api.Exec) error {
	if x.ExitCode == nil {
		return fmt.Errorf("exec %s ended (%s) without an exit code", x.ID, x.State)
	}
	code := *x.ExitCode
	switch {
	case code == 0:
		return nil
	case code < 0:
		code = 128 - code
	}
	if code > 255 {
		code = 255
	}
	return &exitError{code: code}
}

// shellMeta are the characters that make a lone command word shell syntax.
const shellMeta = " \t\n|&;<>()$`\\\"'*?[]#~{}"

// shellWrap returns cmd, or ["/bin/sh", "-c", cmd[0]] when cmd is one word of
// shell syntax ("ls -l | wc -l").
func shellWrap(cmd []string) []string {
	if len(cmd) == 1 && strings.ContainsAny(cmd[0], shellMeta) {
		return []string{"/bin/sh", "-c", cmd[0]}
	}
	return cmd
}
