package e2e

// The attacker's command-line suite: a user who learned on docker, and
// the scripts sbx users already have (DESIGN §3).

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestAttackTerminalWithoutTTY: in a CI job (no terminal, stdin at EOF) a
// docker user's `sbx exec -it ID sh` (or `sbx shell ID`) opens a remote
// terminal and then waits for ever: the end of its stdin never reaches the
// remote shell. docker refuses ("the input device is not a TTY"); sbx
// should refuse too, or pass the end of input on (the shell then exits),
// never hang a script.
func TestAttackTerminalWithoutTTY(t *testing.T) {
	d := shared
	id := d.newSandbox(t, "--template", "tiny")
	for _, args := range [][]string{{"exec", "-it", id, "sh"}, {"shell", id}} {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		cmd := exec.CommandContext(ctx, filepath.Join(binDir, "sbx"), args...)
		cmd.Env = append(os.Environ(), "SBX_HOST=unix://"+d.socket)
		devnull, _ := os.Open(os.DevNull)
		cmd.Stdin = devnull
		var out bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &out
		start := time.Now()
		err := cmd.Run()
		devnull.Close()
		hung := ctx.Err() != nil
		cancel()
		if hung {
			t.Errorf("`sbx %s` with stdin at EOF and no terminal (a CI job) still runs after %s (output %q): the end of input never reaches the remote shell; refuse without a terminal (exit 2), or pass EOF on", strings.Join(args, " "), time.Since(start).Round(time.Second), lastBytes(out.String(), 120))
		} else {
			t.Logf("`sbx %s` < /dev/null: %v after %s: %q", strings.Join(args, " "), err, time.Since(start).Round(time.Millisecond), lastBytes(out.String(), 200))
		}
	}
}

// TestAttackDockerFlags: the README promises that a flag sbx does not have
// says what sbx does instead. It does for --rm, -v, -p, --privileged; a
// docker user's other everyday flags get a bare "unknown flag". Each case
// wants exit 2 and a message that names the sbx way.
func TestAttackDockerFlags(t *testing.T) {
	d := shared
	id := d.newSandbox(t, "--template", "tiny")
	cases := []struct {
		name string
		args []string
		hint string // a word the message must hold
	}{
		{"held: new --rm", []string{"new", "--rm"}, "ttl"},
		{"held: exec --privileged", []string{"exec", "--privileged", id, "true"}, "gVisor"},
		{"exec --workdir (docker's long -w)", []string{"exec", "--workdir", "/tmp", id, "pwd"}, "--cwd"},
		{"exec --env-file", []string{"exec", "--env-file", "/dev/null", id, "true"}, "variable"},
		{"stop -t (docker's grace seconds)", []string{"stop", "-t", "10", id}, "memory"},
		{"logs --since", []string{"logs", "--since", "5m", id}, "--tail"},
		{"logs --timestamps", []string{"logs", "--timestamps", id}, "--tail"},
		{"rm -v (docker: its volumes)", []string{"rm", "-v", id}, "volume"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := d.sbx(t, tc.args...)
			first := firstLine(r.stderr, "sbx:")
			if r.code != 2 || !strings.Contains(first, tc.hint) {
				t.Errorf("`sbx %s`: exit %d, %q; want exit 2 and a message that says what sbx does instead (naming %q)", strings.Join(tc.args, " "), r.code, firstLine(r.stderr, "sbx:"), tc.hint)
			}
		})
	}
	if sb := d.info(t, id); sb.State != "ready" {
		t.Errorf("the sandbox is %s after the docker flags", sb.State)
	}
}
