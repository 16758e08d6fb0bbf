package client

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"

	"sbx.dev/sbx/api"
)

// fakeTerminal speaks the server's side of the terminal protocol: it echoes
// input, answers a resize with "size C R", and ends with exit 4 on "q".
func fakeTerminal(t *testing.T) *httptest.Server {
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != "Bearer tok" {
			w.WriteHeader(http.StatusUnauthorized)
			json.NewEncoder(w).Encode(api.ErrorBody{Error: &api.ErrorDetail{Code: "unauthorized", Message: "no token"}})
			return
		}
		if !strings.HasPrefix(r.URL.Path, "/v1/sandboxes/sb_1/") {
			w.WriteHeader(http.StatusNotFound)
			json.NewEncoder(w).Encode(api.ErrorBody{Error: &api.ErrorDetail{Code: "not_found", Message: "sandbox not found"}})
			return
		}
		c, err := websocket.Accept(w, r, nil)
		if err != nil {
			return
		}
		defer c.CloseNow()
		ctx := r.Context()
		q := r.URL.Query()
		c.Write(ctx, websocket.MessageBinary, []byte(fmt.Sprintf("cmd=%s size=%sx%s\n", strings.Join(q["cmd"], ","), q.Get("cols"), q.Get("rows"))))
		for {
			typ, b, err := c.Read(ctx)
			if err != nil {
				return
			}
			if typ == websocket.MessageText {
				var m struct {
					Type       string
					Cols, Rows int
				}
				json.Unmarshal(b, &m)
				c.Write(ctx, websocket.MessageBinary, []byte(fmt.Sprintf("size %d %d\n", m.Cols, m.Rows)))
				continue
			}
			if string(b) == "q" {
				c.Write(ctx, websocket.MessageText, []byte(`{"type":"exit","code":4}`))
				c.Close(websocket.StatusNormalClosure, "")
				return
			}
			c.Write(ctx, websocket.MessageBinary, b)
		}
	}))
	t.Cleanup(ts.Close)
	return ts
}

func TestPTY(t *testing.T) {
	ts := fakeTerminal(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	t.Run("errors", func(t *testing.T) {
		c, _ := New("tcp://"+strings.TrimPrefix(ts.URL, "http://"), WithToken("bad"))
		if _, err := c.Sandbox("sb_1").PTY(ctx); !errors.Is(err, api.ErrUnauthorized) {
			t.Errorf("bad token: got %v, want ErrUnauthorized", err)
		}
		c, _ = New("tcp://"+strings.TrimPrefix(ts.URL, "http://"), WithToken("tok"))
		if _, err := c.Sandbox("sb_2").PTY(ctx); !errors.Is(err, api.ErrNotFound) {
			t.Errorf("unknown sandbox: got %v, want ErrNotFound", err)
		}
	})
	t.Run("session", func(t *testing.T) {
		c, _ := New("tcp://"+strings.TrimPrefix(ts.URL, "http://"), WithToken("tok"))
		term, err := c.Sandbox("sb_1").PTY(ctx, WithCommand("sh", "-l"), WithSize(100, 30))
		if err != nil {
			t.Fatal(err)
		}
		defer term.Close()
		if _, ok := term.ExitCode(); ok {
			t.Fatal("exit code before the end")
		}
		go func() {
			term.Write([]byte("hello\n"))
			term.Resize(120, 40)
			term.Write([]byte("q"))
		}()
		out, err := io.ReadAll(term)
		if err != nil {
			t.Fatal(err)
		}
		want := "cmd=sh,-l size=100x30\nhello\nsize 120 40\n"
		if string(out) != want {
			t.Errorf("output %q, want %q", out, want)
		}
		if code, ok := term.ExitCode(); !ok || code != 4 {
			t.Errorf("exit = %d, %v; want 4, true", code, ok)
		}
	})
}
