package sandbox

import (
	"cmp"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"

	"sbx.dev/sbx/api"
	"sbx.dev/sbx/internal/agent/hooks"
	"sbx.dev/sbx/internal/runsc"
)

// DefaultShell is what a terminal runs when given no command: bash where the
// sandbox has it, else sh.
var DefaultShell = []string{"/bin/sh", "-c", "if [ -x /bin/bash ]; then exec /bin/bash; fi; exec /bin/sh"}

// PTY starts cmd (DefaultShell when empty) in running sandbox ref with a
// terminal of cols x rows (80x24 for 0) and returns the terminal's master
// and a wait function that returns the command's exit code once it has
// ended. Ending ctx hangs the terminal up (SIGHUP, then SIGKILL to runsc
// after a grace). The sandbox is leased, so counts as active, until wait
// returns: the caller must call wait. It returns api.ErrNotFound for an
// unknown sandbox, api.ErrConflict for one not running, api.ErrInvalid for a
// bad env, cwd or size.
func (m *Manager) PTY(ctx context.Context, ref string, cmd, env []string, cwd, user string, cols, rows int) (*os.File, func() (int, error), error) {
	for _, e := range env {
		if k, _, ok := strings.Cut(e, "="); !ok || k == "" {
			return nil, nil, api.Errorf(api.ErrInvalid, "env: %q is not KEY=VALUE", e)
		}
	}
	if cwd != "" && !strings.HasPrefix(cwd, "/") {
		return nil, nil, api.Errorf(api.ErrInvalid, "cwd: %q is not an absolute path", cwd)
	}
	if cols < 0 || rows < 0 || cols > 0xffff || rows > 0xffff {
		return nil, nil, api.Errorf(api.ErrInvalid, "terminal size %dx%d is out of range", cols, rows)
	}
	if cols == 0 {
		cols = 80
	}
	if rows == 0 {
		rows = 24
	}
	if len(cmd) == 0 {
		cmd = DefaultShell
	}
	if cmd[0] == "" {
		return nil, nil, api.Errorf(api.ErrInvalid, "cmd: give a command to run")
	}
	if strings.IndexByte(user, 0) >= 0 || strings.ContainsAny(user, "\n/") {
		return nil, nil, api.Errorf(api.ErrInvalid, "user: %q is not a user name or uid", user)
	}
	sb, err := m.whenReady(ctx, ref)
	if err != nil {
		return nil, nil, err
	}
	def := m.defaults(sb)
	if user == "" {
		user, cwd = def.User, cmp.Or(cwd, def.WorkDir)
	}
	// the freeze hooks importable, as in every exec
	env = hooks.Env(append(slices.Clip(def.Env), env...))
	if user != "" && user != "0" && user != "root" {
		// the agent becomes the user (from the sandbox's own /etc/passwd),
		// then becomes the command
		cmd = append([]string{runsc.AgentPath, "exec", "--user", user, "--"}, cmd...)
	} else {
		// root's too goes through the agent, which puts /etc's names right
		// in a copy before the shell starts (see agent.followHostname)
		cmd = append([]string{runsc.AgentPath, "exec", "--"}, cmd...)
	}
	release, err := m.Lease(ctx, sb.ID)
	if err != nil {
		return nil, nil, err
	}
	term, err := m.startPTY(ctx, sb.ID, cmd, env, cwd, cols, rows)
	if err != nil {
		release()
		return nil, nil, err
	}
	var once sync.Once
	wait := func() (int, error) {
		code, err := term.Wait()
		once.Do(release)
		if err != nil {
			err = fmt.Errorf("pty in %s: %w", sb.ID, err)
		}
		return code, err
	}
	return term.Master, wait, nil
}

// startPTY starts a terminal; starting is serialized with the sandbox's
// lifecycle, as an exec's is.
func (m *Manager) startPTY(ctx context.Context, id string, cmd, env []string, cwd string, cols, rows int) (*runsc.Terminal, error) {
	unlock, err := m.claims.start(ctx, id)
	if err != nil {
		return nil, err
	}
	defer unlock()
	if _, err := m.running(ctx, id); err != nil {
		return nil, err
	}
	dir := filepath.Join(m.sandboxDir(id), "ptys")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("pty in %s: %w", id, err)
	}
	process := filepath.Join(dir, newID("pt_")+".json")
	term, err := m.cfg.Runtime.StartTerminal(ctx, id, runsc.Process(cmd, env, cwd), process, cols, rows)
	if err != nil {
		return nil, fmt.Errorf("pty in %s: %w", id, err)
	}
	return term, nil
}
