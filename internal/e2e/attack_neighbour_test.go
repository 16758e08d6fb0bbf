package e2e

// The attacker's neighbour suite: a local user who is not root, on the
// same host as sbxd, and what it can reach.

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"

	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// neighbour is a local user made for one test, removed after it.
type neighbour struct {
	name     string
	uid, gid uint32
}

func newNeighbour(t *testing.T) *neighbour {
	t.Helper()
	name := "sbxnb" + randHex(3)
	if out, err := exec.Command("useradd", "--no-create-home", "--shell", "/usr/sbin/nologin", name).CombinedOutput(); err != nil {
		t.Skipf("useradd: %v: %s", err, out)
	}
	t.Cleanup(func() {
		exec.Command("pkill", "-KILL", "-u", name).Run()
		if out, err := exec.Command("userdel", name).CombinedOutput(); err != nil {
			t.Logf("userdel %s: %v: %s", name, err, out)
		}
	})
	u, err := user.Lookup(name)
	if err != nil {
		t.Fatal(err)
	}
	uid, _ := strconv.Atoi(u.Uid)
	gid, _ := strconv.Atoi(u.Gid)
	return &neighbour{name: name, uid: uint32(uid), gid: uint32(gid)}
}

// run runs a command as the neighbour and returns its output and exit code.
func (n *neighbour) run(t *testing.T, name string, args ...string) (string, int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: n.uid, Gid: n.gid}}
	cmd.Dir = "/"
	cmd.Env = []string{"PATH=/usr/local/bin:/usr/bin:/bin", "HOME=/nonexistent"}
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatalf("run %s as %s: %v", name, n.name, err)
	}
	return out.String(), code
}

// TestAttackNeighbour (held): a local user who is not root reads no secret
// of sbxd or of a sandbox: not the data dir (token, preview key, an exec's
// request with its environment, output, memory images), not the unix
// socket, not the TCP API without the token, not `ps` (a detached exec's
// env and command line), not an unpublished or private preview.
func TestAttackNeighbour(t *testing.T) {
	n := newNeighbour(t)
	previewAddr := freePort()
	d, err := startDaemon([]string{"--preview-listen", previewAddr})
	if err != nil {
		t.Fatal(err)
	}
	d.preview = previewAddr
	t.Cleanup(func() { d.stop(true) })
	id := d.newSandbox(t, "--template", "tiny")
	const secret = "hunter2-" + "sbxattack"
	d.must(t, "exec", "-d", "-e", "API_KEY="+secret, id, "--", "sh", "-c", "mkdir -p /w; echo $API_KEY > /w/k.txt; exec httpd -f -p 8080 -h /w")
	d.must(t, "exec", "-d", id, "--", "sh", "-c", "echo "+secret+"; sleep 600")
	d.must(t, "preview", id, "8080", "--private")
	pollUntil(20*time.Second, listening(d, id, 8080))

	// the data dir and everything in it
	for _, p := range []string{d.dir, filepath.Join(d.dir, "token"), filepath.Join(d.dir, "preview.key"), filepath.Join(d.dir, "state.db"), filepath.Join(d.dir, "sandboxes", id), filepath.Join(d.dir, "images")} {
		if out, code := n.run(t, "ls", "-la", p); code == 0 {
			t.Errorf("a local user lists %s:\n%s", p, out)
		}
	}
	// whatever the neighbour can read anywhere under the data dir
	if out, _ := n.run(t, "grep", "-rl", secret, d.dir); strings.Contains(out, d.dir+"/") {
		t.Errorf("a local user finds the exec's secret in files of the data dir:\n%s", out)
	}
	// the socket
	// (the neighbour's own copy of sbx: the repository's bin/ may be in a
	// directory only root enters)
	if out, code := n.run(t, neighbourCopy(t, filepath.Join(binDir, "sbx")), "--host", "unix://"+d.socket, "list"); code == 0 {
		t.Errorf("a local user lists sandboxes through the unix socket:\n%s", out)
	} else if !strings.Contains(out, "permission denied") {
		t.Errorf("sbx list as a local user failed, but not for want of permission on the socket:\n%s", out)
	}
	// ps
	if out, _ := n.run(t, "ps", "-eo", "args"); strings.Contains(out, secret) {
		t.Errorf("a local user sees the exec's secret in ps:\n%s", grepLines(out, secret))
	}
	// /proc/PID/environ and cmdline of sbxd's processes
	for _, pid := range append(pidsWith(d.dir), d.cmd.Process.Pid) {
		for _, f := range []string{"environ", "cmdline"} {
			out, code := n.run(t, "cat", fmt.Sprintf("/proc/%d/%s", pid, f))
			if code == 0 && (strings.Contains(out, secret) || strings.Contains(out, d.token)) {
				t.Errorf("a local user reads a secret in /proc/%d/%s", pid, f)
			}
		}
	}
	// the TCP API without the token
	for _, p := range []string{"/v1/sandboxes", "/v1/sandboxes/" + id + "/execs", "/metrics", "/v1/health"} {
		out, _ := n.run(t, "curl", "-s", "-o", "/dev/null", "-w", "%{http_code}", "http://"+d.tcp+p)
		if out != "401" {
			t.Errorf("a local user GETs %s on the TCP API without the token: %s", p, out)
		}
	}
	// the private preview, and a port not published
	_, port, _ := net.SplitHostPort(previewAddr)
	for host, want := range map[string]string{"8080-" + id + ".localhost": "403", "8081-" + id + ".localhost": "404"} {
		out, _ := n.run(t, "curl", "-s", "-o", "/dev/null", "-w", "%{http_code}", "-H", "Host: "+host, "http://127.0.0.1:"+port+"/k.txt")
		if out != want {
			t.Errorf("a local user GETs http://%s/k.txt through the proxy: %s, want %s", host, out, want)
		}
	}
}

// TestAttackPreviewRevokedTokenComesBack: `sbx preview ID PORT --private`
// hands out a URL whose token is valid for an hour; `--off` withdraws the
// port, and the old URL gets 404. But the token is only an HMAC of the
// sandbox, the port and its expiry: once the port is published private
// again (with a new URL for new people), every URL and cookie handed out
// before the withdrawal works again until it expires. Withdrawing a
// private URL should revoke it for good (a generation or nonce in the
// publication, checked by the proxy).
func TestAttackPreviewRevokedTokenComesBack(t *testing.T) {
	previewAddr := freePort()
	d, err := startDaemon([]string{"--preview-listen", previewAddr})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.stop(true) })
	id := d.newSandbox(t, "--template", "tiny")
	d.must(t, "exec", "-d", id, "--", "sh", "-c", "mkdir -p /w; echo private > /w/k.txt; exec httpd -f -p 8080 -h /w")
	get := func(rawURL string) int {
		u, err := url.Parse(strings.TrimSpace(rawURL))
		if err != nil {
			t.Fatalf("preview URL %q: %v", rawURL, err)
		}
		req, _ := http.NewRequest(http.MethodGet, "http://"+previewAddr+"/k.txt?"+u.RawQuery, nil)
		req.Host = u.Hostname()
		resp, err := proxyClient(previewAddr).Do(req)
		if err != nil {
			t.Fatalf("GET %s: %v", rawURL, err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	old := firstField(d.must(t, "preview", id, "8080", "--private", "--ttl", "1h"))
	waitFor(t, "the private URL to serve", 20*time.Second, func() bool { return get(old) == 200 })
	d.must(t, "preview", id, "8080", "--off")
	if c := get(old); c != 404 {
		t.Errorf("the withdrawn private URL answers %d, want 404", c)
	}
	fresh := firstField(d.must(t, "preview", id, "8080", "--private", "--ttl", "5m"))
	if c := get(fresh); c != 200 {
		t.Errorf("the new private URL answers %d", c)
	}
	if c := get(old); c != 403 {
		t.Errorf("the private URL handed out before `preview --off` answers %d again once the port is published private anew (a new URL was made): withdrawing a private URL does not revoke it, it stays good until its own expiry (1h), want 403", c)
	}
}

// firstField is the first whitespace-separated word of s.
func firstField(s string) string {
	f := strings.Fields(s)
	if len(f) == 0 {
		return ""
	}
	return f[0]
}

// neighbourCopy copies the program at path where any user can run it.
func neighbourCopy(t *testing.T, path string) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "sbx-neighbour-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	dst := filepath.Join(dir, filepath.Base(path))
	if err := os.WriteFile(dst, b, 0o755); err != nil {
		t.Fatal(err)
	}
	return dst
}
