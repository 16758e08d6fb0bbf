package e2e

import (
	"context"
	"io"
	"net/http"
	"os"
	"strings"
	"syscall"
	"testing"

	"sbx.dev/sbx/api"
)

// TestRestart: sandboxes keep running across an abrupt restart of sbxd and
// are still listed and usable; an exec started before it is still readable.
func TestRestart(t *testing.T) {
	d, err := startDaemon(nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.stop(true) })
	id := d.newSandbox(t, "--template", "tiny", "--name", "survivor")
	d.must(t, "exec", id, "--", "sh", "-c", "echo kept > /tmp/state")
	var e api.Exec
	d.jsonOut(t, &e, "exec", id, "--detach", "--", "sh", "-c", "sleep 2; echo late; exit 4")

	d.kill(syscall.SIGKILL)
	if err := d.start(nil); err != nil {
		t.Fatal(err)
	}
	var sb api.Sandbox
	sb = d.info(t, "survivor")
	if sb.ID != id || sb.State != api.StateReady {
		t.Fatalf("after restart: %+v, want %s running", sb, id)
	}
	if out := d.must(t, "exec", id, "--", "cat", "/tmp/state"); out != "kept\n" {
		t.Errorf("after restart: /tmp/state = %q", out)
	}
	r := d.sbx(t, "logs", id, "--exec", e.ID, "--follow")
	if r.stdout != "late\n" {
		t.Errorf("exec across the restart: output %q", r.stdout)
	}
	ex, err := sdk(d.client).GetExec(context.Background(), id, e.ID)
	if err != nil {
		t.Fatal(err)
	}
	if ex.ExitCode == nil || *ex.ExitCode != 4 {
		t.Errorf("exec across the restart = %+v, want exit 4", ex)
	}
}

// TestSideBySide: two daemons with their own data dirs do not see or touch
// each other's sandboxes.
func TestSideBySide(t *testing.T) {
	other, err := startDaemon(nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { other.stop(true) })
	mine := shared.newSandbox(t, "--template", "tiny")
	theirs := other.newSandbox(t, "--template", "tiny")
	if r := other.sbx(t, "info", mine); r.code != 1 {
		t.Errorf("the other daemon sees %s", mine)
	}
	other.must(t, "delete", "--yes", theirs)
	if out := shared.must(t, "exec", mine, "--", "echo", "alive"); out != "alive\n" {
		t.Errorf("a sandbox of one daemon was hurt by the other: %q", out)
	}
}

// TestTCPAuth: the TCP listener wants the token; the socket is 0600.
func TestTCPAuth(t *testing.T) {
	d := shared
	get := func(token string) (int, string) {
		req, _ := http.NewRequest("GET", "http://"+d.tcp+"/v1/sandboxes", nil)
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	if code, body := get(""); code != 401 || !strings.Contains(body, "unauthorized") {
		t.Errorf("no token: %d %s", code, body)
	}
	if code, _ := get("wrong"); code != 401 {
		t.Errorf("wrong token: %d", code)
	}
	if code, _ := get(d.token); code != 200 {
		t.Errorf("right token: %d", code)
	}
	st, err := os.Stat(d.socket)
	if err != nil {
		t.Fatal(err)
	}
	if st.Mode().Perm() != 0o600 {
		t.Errorf("socket mode = %v, want 0600", st.Mode().Perm())
	}
	// The CLI reaches the TCP listener with SBX_TOKEN.
	r := d.sbxEnv(t, []string{"SBX_HOST=tcp://" + d.tcp, "SBX_TOKEN=" + d.token}, "list")
	if r.code != 0 {
		t.Errorf("sbx over TCP with the token: exit %d %s", r.code, r.stderr)
	}
	r = d.sbxEnv(t, []string{"SBX_HOST=tcp://" + d.tcp, "SBX_TOKEN="}, "list")
	if r.code != 1 {
		t.Errorf("sbx over TCP without the token: exit %d", r.code)
	}
}
