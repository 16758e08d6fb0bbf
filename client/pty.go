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

// PTYOption configures a terminal.
type PTYOption func(q url.Values)

// WithPTYCommand sets the command's argv; without, the sandbox's shell
// (bash if it has it, else sh).
func WithPTYCommand(argv ...string) PTYOption {
	return func(q url.Values) { q["cmd"] = argv }
}

// WithPTYSize sets the terminal's initial size (default 80x24).
func WithPTYSize(cols, rows int) PTYOption {
	return func(q url.Values) {
		if cols > 0 && rows > 0 {
			q.Set("cols", strconv.Itoa(cols))
			q.Set("rows", strconv.Itoa(rows))
		}
	}
}

// WithPTYEnv adds environment variables, K=V.
func WithPTYEnv(kv ...string) PTYOption {
	return func(q url.Values) { q["env"] = append(q["env"], kv...) }
}

// WithPTYUser runs the command as user, a name or uid[:gid] inside the
// sandbox; "" is the template's default user.
func WithPTYUser(user string) PTYOption {
	return func(q url.Values) {
		if user != "" {
			q.Set("user", user)
		}
	}
}

// WithPTYCwd sets the command's working directory.
func WithPTYCwd(dir string) PTYOption {
	return func(q url.Values) { q.Set("cwd", dir) }
}

// PTY opens an interactive terminal in running sandbox id. Errors are
// *api.Error: api.ErrNotFound for an unknown sandbox, api.ErrConflict for
// one not running, api.ErrInvalid for a bad option. ctx bounds the whole
// session, not only the opening; Close ends it (and hangs the command up).
func (c *Client) PTY(ctx context.Context, id string, opts ...PTYOption) (*Terminal, error) {
	q := url.Values{}
	for _, o := range opts {
		o(q)
	}
	return c.dialTerminal(ctx, sandboxPath(id, "exec", "pty"), q)
}

// Attach re-attaches to exec execID of sandbox id: its output from the start
// (fromStart) or from now on, then its exit. Write is refused: an exec's
// stdin is out of reach.
func (c *Client) Attach(ctx context.Context, id, execID string, fromStart bool) (*Terminal, error) {
	q := url.Values{"from": {"tail"}}
	if fromStart {
		q.Set("from", "start")
	}
	return c.dialTerminal(ctx, sandboxPath(id, "execs", url.PathEscape(execID), "attach"), q)
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
