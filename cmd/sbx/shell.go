package main

import (
	"errors"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"golang.org/x/term"

	"sbx.dev/sbx/client"
)

var shellCommand = &command{
	name:    "shell",
	usage:   "shell ID [--env K=V]... [--cwd DIR] [-- CMD [ARGS...]]",
	summary: "open an interactive terminal in a sandbox; exits with its exit code",
	run:     runShell,
}

func runShell(e *env, args []string) error {
	fs := e.flags("shell")
	var envs listFlag
	fs.Var(&envs, "env", "environment variable K=V (repeatable)")
	cwd := fs.String("cwd", "", "working directory")
	pos, err := parseFlags(fs, args)
	if err != nil {
		return err
	}
	if len(pos) < 1 {
		return usagef("shell takes a sandbox id")
	}
	for _, kv := range envs {
		if k, _, ok := strings.Cut(kv, "="); !ok || k == "" {
			return usagef("--env %q: want K=V", kv)
		}
	}
	opts := []client.PTYOption{client.WithPTYEnv(envs...)}
	if *cwd != "" {
		opts = append(opts, client.WithPTYCwd(*cwd))
	}
	if len(pos) > 1 {
		opts = append(opts, client.WithPTYCommand(shellWrap(pos[1:])...))
	}
	fd := -1
	if f, ok := e.stdin.(*os.File); ok && term.IsTerminal(int(f.Fd())) {
		fd = int(f.Fd())
		if cols, rows, err := term.GetSize(fd); err == nil {
			opts = append(opts, client.WithPTYSize(cols, rows))
		}
	}
	c, err := e.client()
	if err != nil {
		return err
	}
	t, err := c.PTY(e.ctx, pos[0], opts...)
	if err != nil {
		return err
	}
	defer t.Close()
	if fd >= 0 {
		// raw: every key, ^C included, goes to the remote terminal
		old, err := term.MakeRaw(fd)
		if err != nil {
			return err
		}
		defer term.Restore(fd, old)
		winch := make(chan os.Signal, 1)
		signal.Notify(winch, syscall.SIGWINCH)
		defer signal.Stop(winch)
		go func() {
			for range winch {
				if cols, rows, err := term.GetSize(fd); err == nil {
					_ = t.Resize(cols, rows)
				}
			}
		}()
	}
	go func() {
		// input ends with stdin; the remote command decides when to end
		_, _ = io.Copy(t, e.stdin)
	}()
	if _, err := io.Copy(e.stdout, t); err != nil {
		return err
	}
	code, ok := t.ExitCode()
	if !ok {
		return errors.New("the terminal ended without the command's exit code")
	}
	if code != 0 {
		if code < 0 || code > 255 {
			code = 255
		}
		return &exitError{code: code}
	}
	return nil
}
