package main

import (
	"fmt"
	"strings"

	"sbx.dev/sbx/api"
)

var execCommand = &command{
	name:    "exec",
	usage:   "exec ID [--timeout D] [--env K=V]... [--cwd DIR] [--detach] -- CMD [ARGS...]",
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
