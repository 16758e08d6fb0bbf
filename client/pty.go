package client

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"sync"

	"github.com/coder/websocket"
)

// Terminal is an interactive terminal in a sandbox (PTY), or a re-attached
// exec's output (Attach). Read returns its output and io.EOF once the remote
// command has ended; ExitCode then has its code. Write sends input. Read is
// for one goroutine; Write and Resize may be called from another.
type Terminal struct {
	conn *websocket.Conn
	ctx  context.Context

	buf []byte // of the binary frame being read

	mu     sync.Mutex
	code   int
	exited bool
}

// PTY opens an interactive terminal in the running sandbox: WithCommand
// (default its shell), WithSize, WithEnv, WithCwd, WithUser. Errors are
// api.ErrNotFound for an unknown sandbox, api.ErrConflict for one not
// running, api.ErrInvalid for a bad option. ctx bounds the whole session,
// not only the opening; Close ends it (and hangs the command up).
func (s *Sandbox) PTY(ctx context.Context, opts ...PTYOption) (*Terminal, error) {
	var cfg ptyConfig
	for _, o := range opts {
		o.applyPTY(&cfg)
	}
	q := url.Values{}
	if len(cfg.cmd) > 0 {
		q["cmd"] = cfg.cmd
	}
	if len(cfg.env) > 0 {
		q["env"] = cfg.env
	}
	if cfg.cwd != "" {
		q.Set("cwd", cfg.cwd)
	}
	if cfg.user != "" {
		q.Set("user", cfg.user)
	}
	if cfg.cols > 0 && cfg.rows > 0 {
		q.Set("cols", strconv.Itoa(cfg.cols))
		q.Set("rows", strconv.Itoa(cfg.rows))
	}
	return s.c.dialTerminal(ctx, s.path("exec", "pty"), q)
}

// Attach re-attaches a terminal to the exec's output: from now on, or
// FromStart; Read ends with io.EOF at its exit, and ExitCode says it.
// Write is refused: an exec's stdin is out of reach.
func (p *Process) Attach(ctx context.Context, opts ...AttachOption) (*Terminal, error) {
	q := url.Values{"from": {"tail"}}
	for _, o := range opts {
		o.applyAttach(q)
	}
	return p.sb.c.dialTerminal(ctx, p.path("attach"), q)
}

func (c *Client) dialTerminal(ctx context.Context, path string, q url.Values) (*Terminal, error) {
	u := c.base + path
	if len(q) > 0 {
		u += "?" + q.Encode()
	}
	h := http.Header{}
	if c.token != "" {
		h.Set("Authorization", "Bearer "+c.token)
	}
	conn, resp, err := websocket.Dial(ctx, u, &websocket.DialOptions{HTTPClient: c.hc, HTTPHeader: h})
	if err != nil {
		if resp != nil && resp.StatusCode != http.StatusSwitchingProtocols {
			return nil, decodeError(resp)
		}
		return nil, c.transportError(err)
	}
	// a paste of the remote's output can be large
	conn.SetReadLimit(4 << 20)
	return &Terminal{conn: conn, ctx: ctx}, nil
}

// Read reads the terminal's output. It returns io.EOF after the remote
// command's exit, and an error if the connection ends before it.
func (t *Terminal) Read(p []byte) (int, error) {
	for len(t.buf) == 0 {
		if _, ok := t.ExitCode(); ok {
			return 0, io.EOF
		}
		typ, b, err := t.conn.Read(t.ctx)
		if err != nil {
			return 0, fmt.Errorf("terminal ended before the command's exit: %w", err)
		}
		if typ == websocket.MessageBinary {
			t.buf = b
			continue
		}
		var ctl struct {
			Type string `json:"type"`
			Code int    `json:"code"`
		}
		if json.Unmarshal(b, &ctl) == nil && ctl.Type == "exit" {
			t.mu.Lock()
			t.code, t.exited = ctl.Code, true
			t.mu.Unlock()
			t.conn.Close(websocket.StatusNormalClosure, "")
		}
	}
	n := copy(p, t.buf)
	t.buf = t.buf[n:]
	return n, nil
}

// Write sends p as the terminal's input.
func (t *Terminal) Write(p []byte) (int, error) {
	if err := t.conn.Write(t.ctx, websocket.MessageBinary, p); err != nil {
		return 0, err
	}
	return len(p), nil
}

// Resize sets the terminal's size.
func (t *Terminal) Resize(cols, rows int) error {
	b, _ := json.Marshal(map[string]any{"type": "resize", "cols": cols, "rows": rows})
	return t.conn.Write(t.ctx, websocket.MessageText, b)
}

// CloseWrite says the input has ended (a pipe's end, /dev/null): until
// the command ends, sbxd then types the terminal's end-of-input character
// (^D) whenever the terminal is not raw, so that a shell or a program
// reading lines ends as it would on a pipe. Write no more after it.
func (t *Terminal) CloseWrite() error {
	return t.conn.Write(t.ctx, websocket.MessageText, []byte(`{"type":"eof"}`))
}

// ExitCode returns the remote command's exit code once Read has returned
// io.EOF; ok is false before.
func (t *Terminal) ExitCode() (code int, ok bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.code, t.exited
}

// Close ends the session; a command still running is hung up.
func (t *Terminal) Close() error {
	if _, ok := t.ExitCode(); ok {
		return nil
	}
	return t.conn.Close(websocket.StatusNormalClosure, "")
}
