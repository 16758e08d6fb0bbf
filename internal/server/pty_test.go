package server

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/creack/pty"

	"sbx.dev/sbx/api"
)

// ptyManager runs the terminal's command on the host: the relay, the
// protocol and the auth are what these tests are about.
type ptyManager struct {
	fakeManager
	gotCmd []string
	calls  atomic.Int32
}

func (f *ptyManager) PTY(ctx context.Context, ref string, cmd, env []string, cwd, user string, cols, rows int) (*os.File, func() (int, error), error) {
	if ref != "sb_aaaaaaaaaa" {
		return nil, nil, api.Errorf(api.ErrNotFound, "sandbox %s not found", ref)
	}
	f.calls.Add(1)
	f.gotCmd = cmd
	if len(cmd) == 0 {
		cmd = []string{"/bin/sh"}
	}
	master, tty, err := pty.Open()
	if err != nil {
		return nil, nil, err
	}
	defer tty.Close()
	if err := pty.Setsize(master, &pty.Winsize{Cols: uint16(cols), Rows: uint16(rows)}); err != nil {
		return nil, nil, err
	}
	c := exec.CommandContext(ctx, cmd[0], cmd[1:]...)
	c.Env = []string{"PS1=$ ", "PATH=/usr/bin:/bin"}
	c.Stdin, c.Stdout, c.Stderr = tty, tty, tty
	c.SysProcAttr = &syscall.SysProcAttr{Setsid: true, Setctty: true}
	if err := c.Start(); err != nil {
		return nil, nil, err
	}
	return master, func() (int, error) {
		err := c.Wait()
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			return ee.ExitCode(), nil
		}
		return 0, err
	}, nil
}

// readUntil reads the terminal until its output contains want, and returns
// the exit frame if one came first.
func readUntil(t *testing.T, ctx context.Context, c *websocket.Conn, want string) string {
	t.Helper()
	var got strings.Builder
	for !strings.Contains(got.String(), want) {
		typ, b, err := c.Read(ctx)
		if err != nil {
			t.Fatalf("waiting for %q: %v; got %q", want, err, got.String())
		}
		if typ == websocket.MessageText {
			return string(b)
		}
		got.Write(b)
	}
	return got.String()
}

func TestPTY(t *testing.T) {
	if _, err := os.Stat("/bin/sh"); err != nil {
		t.Skip("no /bin/sh")
	}
	m := &ptyManager{}
	ts := newTestServer(t, m, "s3cret")
	url := "ws" + strings.TrimPrefix(ts.URL, "http") + "/v1/sandboxes/sb_aaaaaaaaaa/exec/pty?cols=100&rows=30"
	auth := &websocket.DialOptions{HTTPHeader: http.Header{"Authorization": {"Bearer s3cret"}}}

	t.Run("refused without the token", func(t *testing.T) {
		_, resp, err := websocket.Dial(context.Background(), url, nil)
		if err == nil || resp == nil || resp.StatusCode != http.StatusUnauthorized {
			t.Fatalf("dial without token: err %v, resp %v; want a 401", err, resp)
		}
	})
	t.Run("unknown sandbox", func(t *testing.T) {
		u := strings.Replace(url, "sb_aaaaaaaaaa", "sb_nnnnnnnnnn", 1)
		_, resp, err := websocket.Dial(context.Background(), u, auth)
		if err == nil || resp == nil || resp.StatusCode != http.StatusNotFound {
			t.Fatalf("dial unknown: err %v, resp %v; want a 404", err, resp)
		}
	})
	t.Run("bad size", func(t *testing.T) {
		u := strings.Replace(url, "cols=100", "cols=wide", 1)
		_, resp, err := websocket.Dial(context.Background(), u, auth)
		if err == nil || resp == nil || resp.StatusCode != http.StatusBadRequest {
			t.Fatalf("dial bad size: err %v, resp %v; want a 400", err, resp)
		}
	})
	// a request that cannot become a WebSocket starts nothing
	for _, tc := range []struct {
		name   string
		header http.Header
		status int
	}{
		{"plain GET", http.Header{}, http.StatusBadRequest},
		{"no key", http.Header{"Connection": {"Upgrade"}, "Upgrade": {"websocket"}, "Sec-Websocket-Version": {"13"}}, http.StatusBadRequest},
		{"short key", http.Header{"Connection": {"Upgrade"}, "Upgrade": {"websocket"}, "Sec-Websocket-Version": {"13"},
			"Sec-Websocket-Key": {"c2hvcnQ="}}, http.StatusBadRequest},
		{"cross origin", http.Header{"Connection": {"keep-alive, Upgrade"}, "Upgrade": {"websocket"}, "Sec-Websocket-Version": {"13"},
			"Sec-Websocket-Key": {"dGhlIHNhbXBsZSBub25jZQ=="}, "Origin": {"https://evil.example"}}, http.StatusForbidden},
	} {
		t.Run(tc.name, func(t *testing.T) {
			req, _ := http.NewRequest("GET", ts.URL+"/v1/sandboxes/sb_aaaaaaaaaa/exec/pty", nil)
			req.Header = tc.header
			req.Header.Set("Authorization", "Bearer s3cret")
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if resp.StatusCode != tc.status {
				t.Errorf("status %d, want %d", resp.StatusCode, tc.status)
			}
			if n := m.calls.Load(); n != 0 {
				t.Errorf("the command was started %d times", n)
			}
		})
	}
	t.Run("session", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		c, _, err := websocket.Dial(ctx, url, auth)
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
		send(websocket.MessageBinary, "echo hi-$((6*7))\r")
		readUntil(t, ctx, c, "hi-42")
		send(websocket.MessageBinary, "stty size\r")
		readUntil(t, ctx, c, "30 100")
		send(websocket.MessageText, `{"type":"resize","cols":132,"rows":43}`)
		// a text frame that is no control message is input (xterm.js)
		send(websocket.MessageText, "stty size\r")
		readUntil(t, ctx, c, "43 132")
		send(websocket.MessageBinary, "exit 3\r")
		var last string
		for {
			typ, b, err := c.Read(ctx)
			if err != nil {
				t.Fatalf("read before the exit frame: %v", err)
			}
			if typ == websocket.MessageText {
				last = string(b)
				break
			}
		}
		var got ptyControl
		if err := json.Unmarshal([]byte(last), &got); err != nil || got.Type != "exit" || got.Code == nil || *got.Code != 3 {
			t.Fatalf("last frame %s, want {\"type\":\"exit\",\"code\":3}", last)
		}
		if _, _, err := c.Read(ctx); websocket.CloseStatus(err) != websocket.StatusNormalClosure {
			t.Errorf("after exit: %v, want a normal closure", err)
		}
		if m.gotCmd != nil {
			t.Errorf("cmd = %q, want none (the default shell)", m.gotCmd)
		}
	})
	t.Run("argv", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		c, _, err := websocket.Dial(ctx, url+"&cmd=sh&cmd=-c&cmd=echo+a+b%3B+exit+5", auth)
		if err != nil {
			t.Fatal(err)
		}
		defer c.CloseNow()
		out := readUntil(t, ctx, c, "a b")
		if !strings.Contains(out, "a b") {
			t.Fatalf("output %q, want a b", out)
		}
		typ, b, err := c.Read(ctx)
		if err != nil || typ != websocket.MessageText || string(b) != `{"type":"exit","code":5}` {
			t.Fatalf("got %v %q %v, want the exit frame with code 5", typ, b, err)
		}
		if want := []string{"sh", "-c", "echo a b; exit 5"}; strings.Join(m.gotCmd, "|") != strings.Join(want, "|") {
			t.Errorf("cmd = %q, want %q", m.gotCmd, want)
		}
	})
}
