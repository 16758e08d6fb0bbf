package main

import (
	"errors"
	"io"
	"os"
	"os/signal"
	"syscall"

	"github.com/spf13/cobra"
	"golang.org/x/term"

	"sbx.dev/sbx/client"
)

func newShellCmd(e *env) *cobra.Command {
	var (
		envs      []string
		cwd, user string
	)
	cmd := &cobra.Command{
		Use:   "shell [flags] ID [[--] CMD [ARGS...]]",
		Short: "open an interactive terminal in a sandbox; exits with its exit code",
		Long: "shell opens a terminal in the sandbox running CMD, or its shell (bash if it has it,\n" +
			"else sh). As with exec, the command owns everything from its first word on.",
		Example:           "  sbx shell web\n  sbx shell -u root web\n  sbx shell web top -d 1",
		Args:              cobra.ArbitraryArgs,
		ValidArgsFunction: completeSandboxes(e),
	}
	cmd.Flags().SetInterspersed(false)
	fs := cmd.Flags()
	fs.StringArrayVarP(&envs, "env", "e", nil, "environment variable K=V (repeatable)")
	fs.StringVarP(&cwd, "cwd", "w", "", "working directory")
	fs.StringVarP(&user, "user", "u", "", "run as this user: a name or uid[:gid] (default: the template's user)")
	cmd.RunE = remote(func(cmd *cobra.Command, args []string) error {
		pos, command, err := remoteArgs(cmd, args, 1)
		if err != nil {
			return err
		}
		if len(pos) == 0 {
			return usagef("shell takes a sandbox id")
		}
		if err := checkEnv(envs); err != nil {
			return err
		}
		if e.json {
			return usagef("shell is an interactive terminal and prints no JSON; use sbx --json exec ID CMD")
		}
		return runTerminal(e, pos[0], shellWrap(command), envs, cwd, user)
	})
	return cmd
}

// runTerminal runs argv (or the sandbox's shell) in a terminal in sandbox
// id: raw mode and resizes when stdin is a terminal; its exit code is sbx's.
func runTerminal(e *env, id string, argv, envs []string, cwd, user string) error {
	opts := []client.PTYOption{client.WithEnv(envs...), client.WithUser(user)}
	if cwd != "" {
		opts = append(opts, client.WithCwd(cwd))
	}
	if len(argv) > 0 {
		opts = append(opts, client.WithCommand(argv...))
	}
	fd := -1
	if f, ok := e.stdin.(*os.File); ok && term.IsTerminal(int(f.Fd())) {
		fd = int(f.Fd())
		if cols, rows, err := term.GetSize(fd); err == nil {
			opts = append(opts, client.WithSize(cols, rows))
		}
	}
	c, err := e.client()
	if err != nil {
		return err
	}
	t, err := c.Sandbox(id).PTY(e.ctx, opts...)
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
		_, _ = io.Copy(t, e.stdin)
		if fd < 0 {
			// Input that is no terminal (a pipe, /dev/null in a CI job)
			// has ended: the remote terminal's input ends too (sbxd types
			// ^D while it is not raw). A terminal's own input never ends:
			// there the remote command decides.
			_ = t.CloseWrite()
		}
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
