package e2e

import (
	"context"
	"encoding/json"
	"net/http"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"

	"sbx.dev/sbx/client"
)

// TestPTYWebSocket drives the terminal WebSocket on the TCP listener, as
// xterm.js would.
func TestPTYWebSocket(t *testing.T) {
	d := shared
	id := d.newSandbox(t, "--template", "tiny")
	url := "ws://" + d.tcp + "/v1/sandboxes/" + id + "/exec/pty?cols=100&rows=30"

	t.Run("refused without the token", func(t *testing.T) {
		_, resp, err := websocket.Dial(context.Background(), url, nil)
		if err == nil || resp == nil || resp.StatusCode != http.StatusUnauthorized {
			t.Fatalf("dial without token: err %v, resp %v; want a 401", err, resp)
		}
	})

	t.Run("session", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		c, _, err := websocket.Dial(ctx, url, &websocket.DialOptions{HTTPHeader: http.Header{"Authorization": {"Bearer " + d.token}}})
		if err != nil {
			t.Fatal(err)
		}
		defer c.CloseNow()
		send := func(typ websocket.MessageType, s string) {
			t.Helper()
			if err := c.Write(ctx, typ, []byte(s)); err != nil {
				t.Fatal(err)
			}
		}
		var out strings.Builder
		// readUntil reads output until it holds want; it returns the exit
		// frame if that comes first.
		readUntil := func(want string) string {
			t.Helper()
			out.Reset()
			for !strings.Contains(out.String(), want) {
				typ, b, err := c.Read(ctx)
				if err != nil {
					t.Fatalf("waiting for %q: %v; got %q", want, err, out.String())
				}
				if typ == websocket.MessageText {
					return string(b)
				}
				out.Write(b)
			}
			return ""
		}
		send(websocket.MessageBinary, "echo hi-$((6*7))\r")
		readUntil("hi-42")
		send(websocket.MessageBinary, "stty size\r")
		readUntil("30 100")
		send(websocket.MessageText, `{"type":"resize","cols":132,"rows":43}`)
		send(websocket.MessageBinary, "stty size\r")
		readUntil("43 132")
		send(websocket.MessageBinary, "exit 3\r")
		last := readUntil("\x00never")
		var got struct {
			Type string `json:"type"`
			Code *int   `json:"code"`
		}
		if err := json.Unmarshal([]byte(last), &got); err != nil || got.Type != "exit" || got.Code == nil || *got.Code != 3 {
			t.Fatalf("last frame %q, want {\"type\":\"exit\",\"code\":3}", last)
		}
		if _, _, err := c.Read(ctx); websocket.CloseStatus(err) != websocket.StatusNormalClosure {
			t.Errorf("after exit: %v, want a normal closure", err)
		}
	})

	t.Run("client", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		term, err := d.client.Sandbox(id).PTY(ctx, client.WithCommand("sh", "-c", "echo from-$((1+1)); exit 9"))
		if err != nil {
			t.Fatal(err)
		}
		defer term.Close()
		var out strings.Builder
		buf := make([]byte, 4096)
		for {
			n, err := term.Read(buf)
			out.Write(buf[:n])
			if err != nil {
				break
			}
		}
		if !strings.Contains(out.String(), "from-2") {
			t.Errorf("output %q, want from-2", out.String())
		}
		if code, ok := term.ExitCode(); !ok || code != 9 {
			t.Errorf("exit %d, %v; want 9, true", code, ok)
		}
	})
}

// TestShellTmux runs `sbx shell` in a real terminal (tmux): keys, ^C and
// the exit code all cross.
func TestShellTmux(t *testing.T) {
	if _, err := exec.LookPath("tmux"); err != nil {
		t.Skip("no tmux")
	}
	d := shared
	id := d.newSandbox(t, "--template", "tiny")
	name := "sbx-pty-" + randHex(4)
	sbx := filepath.Join(binDir, "sbx")
	cmd := "SBX_HOST=unix://" + d.socket + " " + sbx + " shell " + id + "; echo EXIT=$? ; sleep 30"
	if out, err := exec.Command("tmux", "new-session", "-d", "-s", name, "-x", "120", "-y", "40", cmd).CombinedOutput(); err != nil {
		t.Fatalf("tmux new-session: %v: %s", err, out)
	}
	t.Cleanup(func() { exec.Command("tmux", "kill-session", "-t", name).Run() })
	keys := func(k ...string) {
		t.Helper()
		if out, err := exec.Command("tmux", append([]string{"send-keys", "-t", name}, k...)...).CombinedOutput(); err != nil {
			t.Fatalf("tmux send-keys %q: %v: %s", k, err, out)
		}
	}
	var pane string
	shows := func(want string) func() bool {
		return func() bool {
			out, _ := exec.Command("tmux", "capture-pane", "-p", "-t", name).Output()
			pane = string(out)
			return strings.Contains(pane, want)
		}
	}
	wait := func(what string) {
		t.Helper()
		deadline := time.Now().Add(30 * time.Second)
		for !shows(what)() {
			if time.Now().After(deadline) {
				t.Fatalf("timed out waiting for %q; the pane:\n%s", what, pane)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	keys("echo ok-$((2+3))", "Enter")
	wait("ok-5")
	keys("stty size", "Enter")
	wait("40 120")
	// a window resize (SIGWINCH for sbx) reaches the remote terminal
	if out, err := exec.Command("tmux", "resize-window", "-t", name, "-x", "100", "-y", "30").CombinedOutput(); err != nil {
		t.Fatalf("tmux resize-window: %v: %s", err, out)
	}
	keys("clear; stty size", "Enter")
	wait("30 100")
	keys("sleep 100", "Enter")
	time.Sleep(500 * time.Millisecond) // let sleep start, so ^C is not typed ahead
	keys("C-c")
	keys("echo back-$((3*3))", "Enter")
	// the shell answers well before sleep 100 could have ended: ^C reached it
	start := time.Now()
	wait("back-9")
	if time.Since(start) > 20*time.Second {
		t.Fatalf("the shell came back after %s: ^C did not reach sleep", time.Since(start))
	}
	keys("exit 7", "Enter")
	wait("EXIT=7")
}

// TestAttach re-attaches to a detached exec's output, from its start and
// from now on.
func TestAttach(t *testing.T) {
	d := shared
	id := d.newSandbox(t, "--template", "tiny")
	out := d.must(t, "exec", id, "--detach", "--", "sh", "-c", "echo first; sleep 2; echo second; exit 4")
	execID := strings.Fields(out)[0]
	waitFor(t, "the first line", 10*time.Second, func() bool {
		return strings.Contains(d.sbx(t, "logs", id, "--exec", execID).stdout, "first")
	})
	done := make(chan result, 1)
	go func() { done <- d.sbx(t, "attach", id, execID, "--from", "tail") }()
	r := d.sbx(t, "attach", id, execID)
	if r.code != 4 || r.stdout != "first\nsecond\n" {
		t.Errorf("attach --from start: exit %d, stdout %q (stderr %q); want 4, %q", r.code, r.stdout, r.stderr, "first\nsecond\n")
	}
	r = <-done
	if r.code != 4 || r.stdout != "second\n" {
		t.Errorf("attach --from tail: exit %d, stdout %q (stderr %q); want 4, %q", r.code, r.stdout, r.stderr, "second\n")
	}
	if r := d.sbx(t, "attach", id, "ex_nosuchexec"); r.code != 1 || !strings.Contains(r.stderr, "not found") {
		t.Errorf("attach to an unknown exec: exit %d, stderr %q; want 1 and not found", r.code, r.stderr)
	}
}
