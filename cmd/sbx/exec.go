package main

import (
	"fmt"
	"strings"

	"sbx.dev/sbx/api"
	"sbx.dev/sbx/client"
	"sbx.dev/sbx/internal/flaky"
)

var execCommand = &command{
	name: "exec",
	usage: "exec ID [--timeout D] [--env K=V]... [--cwd DIR] [--detach] [--on-crash [--crash-dir DIR]] -- CMD [ARGS...]\n" +
		"\n" +
		"--on-crash runs CMD under gdb inside the sandbox (the template needs gdb and\n" +
		"python3, as base has). When CMD dies of SIGSEGV, SIGABRT, SIGBUS, SIGFPE or\n" +
		"SIGILL, sbx prints the backtrace of every thread on stderr and saves\n" +
		"./sbx-crash-EXECID/ (or --crash-dir DIR) with backtrace.txt and crash.tar:\n" +
		"backtrace.txt, a core written by gdb (gVisor writes no kernel cores),\n" +
		"the binary and the shared libraries it had loaded under files/ (build-ids\n" +
		"in buildids.txt, checked against the copies), sharedlibs.txt,\n" +
		"mappings.txt and maps. The exit code is CMD's, or 128+signal (139 for\n" +
		"SIGSEGV); without a crash no bundle is made. Only the top process is\n" +
		"traced: crashes of its children are not captured.",
	summary: "run a command in a sandbox; exits with its exit code",
	run:     runExec,
}

func runExec(e *env, args []string) error {
	fs := e.flags("exec")
	timeout := fs.String("timeout", "", "kill the command after this long, e.g. 5s")
	var envs listFlag
	fs.Var(&envs, "env", "environment variable K=V (repeatable)")
	cwd := fs.String("cwd", "", "working directory")
	detach := fs.Bool("detach", false, "start the command and print EXEC_ID PID")
	onCrash := fs.Bool("on-crash", false, "run under gdb; on a fatal signal print the backtrace and save a crash bundle")
	crashDir := fs.String("crash-dir", "", "with --on-crash: the folder for the bundle (default ./sbx-crash-EXECID)")
	pos, err := parseFlags(fs, args)
	if err != nil {
		return err
	}
	if len(pos) < 2 {
		return usagef("exec takes a sandbox id and a command")
	}
	for _, kv := range envs {
		if k, _, ok := strings.Cut(kv, "="); !ok || k == "" {
			return usagef("--env %q: want K=V", kv)
		}
	}
	if *onCrash && *detach {
		return usagef("--on-crash and --detach do not go together: the crash is caught while sbx waits")
	}
	if *crashDir != "" && !*onCrash {
		return usagef("--crash-dir goes with --on-crash")
	}
	id := pos[0]
	req := api.ExecRequest{Cmd: shellWrap(pos[1:]), Env: envs, Cwd: *cwd, Timeout: *timeout}
	c, err := e.client()
	if err != nil {
		return err
	}
	if *detach {
		x, err := c.ExecDetached(e.ctx, id, req)
		if err != nil {
			return err
		}
		if e.json {
			return e.printJSON(x)
		}
		_, err = fmt.Fprintf(e.stdout, "%s %d\n", x.ID, x.Pid)
		return err
	}
	if *onCrash {
		return runExecOnCrash(e, c, id, req, *crashDir)
	}
	var x *api.Exec
	if e.json {
		x, err = c.ExecEvents(e.ctx, id, req, func(ev api.ExecEvent) error { return e.printJSONLine(ev) })
	} else {
		x, err = c.Exec(e.ctx, id, req, e.stdout, e.stderr)
	}
	if err != nil {
		return err
	}
	return exitStatus(x)
}

// runExecOnCrash is exec --on-crash: see flaky.ExecOnCrash.
func runExecOnCrash(e *env, c *client.Client, id string, req api.ExecRequest, dir string) error {
	fn := func(ev api.ExecEvent) error {
		if e.json {
			return e.printJSONLine(ev)
		}
		var err error
		switch ev.Event {
		case "stdout":
			_, err = e.stdout.Write(ev.Data)
		case "stderr":
			_, err = e.stderr.Write(ev.Data)
		}
		return err
	}
	x, cr, err := flaky.ExecOnCrash(e.ctx, c, id, req, dir, fn)
	if cr != nil {
		if e.json {
			if perr := e.printJSONLine(map[string]any{"event": "crash", "crash": cr}); perr != nil && err == nil {
				err = perr
			}
		} else {
			fmt.Fprintf(e.stderr, "sbx: %s died of %s; backtrace:\n%s", x.ID, cr.SignalName, cr.Backtrace)
			for _, f := range cr.Files {
				if f.Match == "mismatch" {
					fmt.Fprintf(e.stderr, "sbx: warning: %s changed on disk since it was mapped (build-id differs); the copy is not the binary that ran\n", f.Path)
				}
			}
			if err == nil {
				fmt.Fprintf(e.stderr, "sbx: crash bundle: %s (in the sandbox: %s)\n", cr.Tar, cr.Remote)
			}
		}
	}
	if err != nil {
		return err
	}
	return exitStatus(x)
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
