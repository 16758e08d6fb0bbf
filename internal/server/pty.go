package server

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/coder/websocket"
	"github.com/creack/pty"
	"golang.org/x/sys/unix"

	"sbx.dev/sbx/api"
)

// The terminal WebSocket (GET /v1/sandboxes/{id}/exec/pty):
//
//   - Query: cmd is the command's argv, one parameter per word
//     (?cmd=ls&cmd=-l), run as given, no shell; for a shell line pass
//     cmd=sh&cmd=-c&cmd=LINE. No cmd: bash if the sandbox has it, else sh.
//     env (repeatable, K=V) and cwd as for an exec; cols and rows the
//     initial size (80x24).
//   - Binary frames are the terminal's bytes, both ways.
//   - A text frame {"type":"resize","cols":N,"rows":N} resizes.
//   - A text frame {"type":"eof"} says the client's input has ended (its
//     stdin was no terminal: a pipe, /dev/null). From then on, until the
//     command ends, the server types the terminal's end-of-input character
//     (VEOF, ^D) whenever the terminal is not in raw mode (its output
//     processing, OPOST, on): a shell or a program reading lines sees its
//     input end, even one that flushed what came before while setting up
//     its line editing; a program that made the terminal raw reads no byte
//     it was not sent. Any other
//     text frame from the client is input, as a binary one would be: that is
//     what xterm.js's attach addon sends for keystrokes.
//   - When the command ends the server sends its remaining output, then the
//     text frame {"type":"exit","code":N}, and closes normally.
//   - The client closing (or going away) hangs the terminal up.
//
// Errors found before the upgrade (unknown sandbox, one not running, a bad
// query, no token on the TCP listener) are ordinary JSON error answers.

// ptyControl is a text frame of the terminal protocol.
type ptyControl struct {
	Type string `json:"type"`
	Cols int    `json:"cols,omitempty"`
	Rows int    `json:"rows,omitempty"`
	Code *int   `json:"code,omitempty"`
}

const (
	// ptyReadLimit bounds one frame from the client (a paste).
	ptyReadLimit = 1 << 20
	// ptyDrainQuiet and ptyDrainMax bound how long output is still relayed
	// once the command has ended: a background process in the sandbox may
	// hold the terminal open forever.
	ptyDrainQuiet = 200 * time.Millisecond
	ptyDrainMax   = 2 * time.Second
)

// wsHandshake says why r cannot be accepted as a WebSocket, as Accept
// would decide it (an upgrade of version 13 with a key, from no origin or
// the same host), or nil.
func wsHandshake(r *http.Request) error {
	if r.Method != http.MethodGet || !r.ProtoAtLeast(1, 1) {
		return api.Errorf(api.ErrInvalid, "this is a WebSocket endpoint: want GET over HTTP/1.1, not %s %s", r.Method, r.Proto)
	}
	if !headerHas(r.Header, "Connection", "upgrade") || !headerHas(r.Header, "Upgrade", "websocket") {
		return api.Errorf(api.ErrInvalid, "this is a WebSocket endpoint: want a request with Connection: Upgrade and Upgrade: websocket")
	}
	keys := r.Header.Values("Sec-WebSocket-Key")
	if r.Header.Get("Sec-WebSocket-Version") != "13" || len(keys) != 1 {
		return api.Errorf(api.ErrInvalid, "want a WebSocket handshake of version 13 with one Sec-WebSocket-Key")
	}
	if k, err := base64.StdEncoding.DecodeString(keys[0]); err != nil || len(k) != 16 {
		return api.Errorf(api.ErrInvalid, "Sec-WebSocket-Key %q: want 16 bytes in base64", keys[0])
	}
	if o := r.Header.Get("Origin"); o != "" {
		u, err := url.Parse(o)
		if err != nil || !strings.EqualFold(u.Host, r.Host) {
			return api.Errorf(api.ErrForbidden, "WebSocket from origin %q refused: only the API's own host may open a terminal", o)
		}
	}
	return nil
}

// headerHas reports whether the comma-separated header key has token.
func headerHas(h http.Header, key, token string) bool {
	for _, v := range h.Values(key) {
		for _, t := range strings.Split(v, ",") {
			if strings.EqualFold(strings.TrimSpace(t), token) {
				return true
			}
		}
	}
	return false
}

// pty serves an interactive terminal over a WebSocket.
func (s *Server) pty(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	cols, err := sizeParam(q.Get("cols"), "cols")
	if err != nil {
		s.fail(w, r, err)
		return
	}
	rows, err := sizeParam(q.Get("rows"), "rows")
	if err != nil {
		s.fail(w, r, err)
		return
	}
	// the handshake is checked before the command starts: a request that
	// cannot become a WebSocket must not run anything
	if err := wsHandshake(r); err != nil {
		s.fail(w, r, err)
		return
	}
	ctx, cancel := context.WithCancel(r.Context())
	defer cancel()
	master, wait, err := s.m.PTY(ctx, r.PathValue("id"), q["cmd"], q["env"], q.Get("cwd"), q.Get("user"), cols, rows)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	defer master.Close()
	conn, err := websocket.Accept(w, r, nil)
	if err != nil {
		// Accept has answered; hang the command up
		cancel()
		_, _ = wait()
		return
	}
	defer conn.CloseNow()
	conn.SetReadLimit(ptyReadLimit)

	// output: the terminal to the client
	var lastOut atomic.Int64
	lastOut.Store(time.Now().UnixNano())
	outDone := make(chan struct{})
	go func() {
		defer close(outDone)
		buf := make([]byte, 32<<10)
		for {
			n, err := master.Read(buf)
			if n > 0 {
				lastOut.Store(time.Now().UnixNano())
				if werr := conn.Write(ctx, websocket.MessageBinary, buf[:n]); werr != nil {
					cancel()
					return
				}
			}
			if err != nil {
				return
			}
		}
	}()
	// input: the client to the terminal; its end is the client's
	go func() {
		eof := false
		defer func() {
			cancel()
			master.Close() // a hang-up for whatever still reads the terminal
		}()
		for {
			typ, b, err := conn.Read(ctx)
			if err != nil {
				return
			}
			if typ == websocket.MessageText {
				var c ptyControl
				if json.Unmarshal(b, &c) == nil && c.Type != "" {
					switch {
					case c.Type == "resize" && c.Cols > 0 && c.Rows > 0 && c.Cols <= 0xffff && c.Rows <= 0xffff:
						_ = pty.Setsize(master, &pty.Winsize{Cols: uint16(c.Cols), Rows: uint16(c.Rows)})
					case c.Type == "eof" && !eof:
						eof = true
						go typeEOF(ctx, master)
					}
					continue
				}
			}
			if _, err := master.Write(b); err != nil {
				return
			}
		}
	}()

	code, err := wait()
	drainPTY(outDone, &lastOut)
	if ctx.Err() != nil {
		return // the client left
	}
	if err != nil {
		s.log.Error("pty ended without an exit code", "sandbox", r.PathValue("id"), "err", err)
		conn.Close(websocket.StatusInternalError, "the command's exit code is unknown")
		return
	}
	b, _ := json.Marshal(ptyControl{Type: "exit", Code: &code})
	if err := conn.Write(ctx, websocket.MessageText, b); err != nil {
		return
	}
	conn.Close(websocket.StatusNormalClosure, "")
}

// eofEvery is how often typeEOF looks at the terminal.
const eofEvery = 300 * time.Millisecond

// typeEOF types the terminal's end-of-input character whenever it is not
// in raw mode, until ctx ends (the command ended, or the client left).
func typeEOF(ctx context.Context, master *os.File) {
	rc, err := master.SyscallConn()
	if err != nil {
		return
	}
	tick := time.NewTicker(eofEvery)
	defer tick.Stop()
	for {
		var t *unix.Termios
		_ = rc.Control(func(fd uintptr) { t, _ = unix.IoctlGetTermios(int(fd), unix.TCGETS) })
		if t != nil && t.Oflag&unix.OPOST != 0 {
			if _, err := master.Write([]byte{t.Cc[unix.VEOF]}); err != nil {
				return
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

// drainPTY waits, bounded, for the output still in the terminal once the
// command has ended: until the terminal's last holder closes it, or it has
// been quiet for a while.
func drainPTY(outDone <-chan struct{}, lastOut *atomic.Int64) {
	deadline := time.After(ptyDrainMax)
	tick := time.NewTicker(ptyDrainQuiet / 4)
	defer tick.Stop()
	for {
		select {
		case <-outDone:
			return
		case <-deadline:
			return
		case <-tick.C:
			if time.Since(time.Unix(0, lastOut.Load())) > ptyDrainQuiet {
				return
			}
		}
	}
}

// sizeParam parses a terminal dimension; empty is 0 (the default).
func sizeParam(v, name string) (int, error) {
	if v == "" {
		return 0, nil
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 1 || n > 0xffff {
		return 0, api.Errorf(api.ErrInvalid, "%s: %q is not a size between 1 and 65535", name, v)
	}
	return n, nil
}

// attach re-attaches a WebSocket to a running exec's output: binary frames
// carry its stdout and stderr as they come (stdin stays out of reach: an
// exec's stdin is closed), then the text frame {"type":"exit","code":N} once
// it has ended. from=start (the default) sends the output kept so far first;
// from=tail only what comes after the attach.
func (s *Server) attach(w http.ResponseWriter, r *http.Request) {
	id, execID := r.PathValue("id"), r.PathValue("exec")
	from := r.URL.Query().Get("from")
	if from != "" && from != "start" && from != "tail" {
		s.fail(w, r, api.Errorf(api.ErrInvalid, "from: %q: want start or tail", from))
		return
	}
	if _, err := s.m.GetExec(r.Context(), id, execID); err != nil {
		s.fail(w, r, err)
		return
	}
	// what to skip of each stream for tail: what is there now (the
	// streams are append-only files)
	skip := map[string]int{}
	if from == "tail" {
		err := s.m.Output(r.Context(), id, execID, false, func(ev api.ExecEvent) error {
			if ev.Event == "stdout" || ev.Event == "stderr" {
				skip[ev.Event] += len(ev.Data)
			}
			return nil
		})
		if err != nil {
			s.fail(w, r, err)
			return
		}
	}
	conn, err := websocket.Accept(w, r, nil)
	if err != nil {
		return
	}
	defer conn.CloseNow()
	ctx := conn.CloseRead(r.Context()) // ends when the client does
	err = s.m.Output(ctx, id, execID, true, func(ev api.ExecEvent) error {
		switch ev.Event {
		case "stdout", "stderr":
			data := ev.Data
			if n := min(skip[ev.Event], len(data)); n > 0 {
				skip[ev.Event] -= n
				data = data[n:]
			}
			if len(data) == 0 {
				return nil
			}
			return conn.Write(ctx, websocket.MessageBinary, data)
		case "exit":
			c := ptyControl{Type: "exit", Code: ev.Exec.ExitCode}
			if c.Code == nil {
				lost := -1
				c.Code = &lost
			}
			b, _ := json.Marshal(c)
			return conn.Write(ctx, websocket.MessageText, b)
		}
		return nil
	})
	switch {
	case err == nil:
		conn.Close(websocket.StatusNormalClosure, "")
	case ctx.Err() != nil || errors.Is(err, context.Canceled):
		// the client left
	default:
		s.log.Error("attach failed", "exec", execID, "err", err)
		conn.Close(websocket.StatusInternalError, "reading the exec's output failed")
	}
}
