package server

import (
	"container/list"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"sync"
	"time"
)

// Floods must not stop sbxd. Anyone who can reach the TCP API or the
// preview proxy can open connections, and each holds one of sbxd's file
// descriptors (two, through the proxy) for as long as the client likes.
// So on those listeners:
//   - a connection that has not sent its request's header in
//     ReadHeaderTimeout, or sits idle between requests for IdleTimeout, is
//     closed;
//   - at most a fixed number are open at once (ConnBudget sizes it from
//     RLIMIT_NOFILE, keeping a reserve for sbxd's own files, sockets and
//     runsc); at that limit a new connection sheds the oldest one that has
//     no request in flight, and if there is none it is refused with a 503;
//   - a client that sends nothing for BodyIdleTimeout in the middle of a
//     request's body is disconnected (there is no limit on a body's whole
//     time: a large upload takes what it takes);
//   - a client without the API's token is answered 401 and disconnected at
//     once, and so is one the preview proxy answers 404 or 403, without
//     reading the rest of its body.
// The unix socket (mode 0600: root only) has no limit of connections or
// bodies.

const (
	// ReadHeaderTimeout bounds how long a client takes to send a request's header.
	ReadHeaderTimeout = 10 * time.Second
	// IdleTimeout bounds how long a kept-alive connection waits for its next request.
	IdleTimeout = 30 * time.Second
	// BodyIdleTimeout bounds how long a client sending a request's body may
	// pause.
	BodyIdleTimeout = 30 * time.Second
	// DefaultMaxConns is the default limit of open connections per listener.
	DefaultMaxConns = 1024
)

// ConnBudget returns how many connections the TCP API and the preview
// proxy may each hold open, at most maxConns, so that with RLIMIT_NOFILE at
// nofile sbxd always keeps reserve descriptors for itself: a quarter of
// nofile, at least 512, at most half. A proxied connection costs two
// descriptors (the client's and the sandbox's), and the proxy keeps up to
// MaxIdleUpstream idle ones into sandboxes besides.
func ConnBudget(nofile uint64, maxConns int) (api, preview, reserve int) {
	n := int(min(nofile, 1<<30))
	reserve = min(max(512, n/4), n/2)
	per := max((n-reserve-MaxIdleUpstream)/3, 8)
	return min(maxConns, per), min(maxConns, per), reserve
}

// NewHTTPServer returns the http.Server for a listener that lim guards
// (nil: no limit, for the unix socket), with the header and idle timeouts
// and, where guarded, the body's.
func NewHTTPServer(h http.Handler, lim *ConnLimiter) *http.Server {
	s := &http.Server{Handler: h, ReadHeaderTimeout: ReadHeaderTimeout, IdleTimeout: IdleTimeout}
	if lim != nil {
		s.Handler = bodyTimeout(h, BodyIdleTimeout)
		s.ConnState = lim.ConnState
	}
	return s
}

// bodyTimeout drops a client that pauses longer than d while sending a
// request's body, whether the handler reads it or not. The server would
// read what a handler left of a body with no deadline at all, before the
// response (unless full duplex, which is set here) and after the handler;
// here it is read after the handler, with a deadline. Deadlines are set
// only around reads: a response that streams for an hour is not cut.
// Upgrades manage their own connection.
func bodyTimeout(h http.Handler, d time.Duration) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Body == nil || r.Body == http.NoBody || r.Header.Get("Upgrade") != "" {
			h.ServeHTTP(w, r)
			return
		}
		rc := http.NewResponseController(w)
		_ = rc.EnableFullDuplex()
		body := &deadlineBody{ReadCloser: r.Body, rc: rc, d: d}
		r.Body = body
		defer func() {
			if p := recover(); p != nil {
				panic(p)
			}
			_ = rc.SetReadDeadline(time.Now().Add(d))
			err := body.ReadCloser.Close() // reads what is left (up to 256 KiB), for keep-alive
			_ = rc.SetReadDeadline(time.Time{})
			if err != nil {
				// a client that stalls mid-body is dropped, once it has
				// what the handler wrote
				_ = rc.Flush()
				panic(http.ErrAbortHandler)
			}
		}()
		h.ServeHTTP(w, r)
	})
}

type deadlineBody struct {
	io.ReadCloser
	rc *http.ResponseController
	d  time.Duration
}

func (b *deadlineBody) Read(p []byte) (int, error) {
	_ = b.rc.SetReadDeadline(time.Now().Add(b.d))
	n, err := b.ReadCloser.Read(p)
	_ = b.rc.SetReadDeadline(time.Time{})
	return n, err
}

// dropAfterReply ends the connection once the response is written, without
// reading what is left of the request (call it before writing).
func dropAfterReply(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Connection", "close")
	rc := http.NewResponseController(w)
	_ = rc.SetReadDeadline(time.Now())
	_ = r.Body.Close() // closed unread: the server does not read it either
	_ = rc.SetReadDeadline(time.Time{})
}

// ConnLimiter bounds the open connections of one listener (see Listener)
// and sheds those that wait (ConnState must be the http.Server's hook).
type ConnLimiter struct {
	name string
	max  int
	log  *slog.Logger

	mu   sync.Mutex
	open int
	// waiting holds the open connections with no request in flight (just
	// accepted, or idle between requests), the longest waiting first.
	waiting list.List
	// refused and shed count since the last log line.
	refused, shed int
	lastLog       time.Time
}

// NewConnLimiter returns a limiter of max open connections; name is the
// listener's in logs.
func NewConnLimiter(name string, max int, log *slog.Logger) *ConnLimiter {
	if log == nil {
		log = slog.Default()
	}
	return &ConnLimiter{name: name, max: max, log: log}
}

// Max is the limiter's limit.
func (c *ConnLimiter) Max() int { return c.max }

// Open is how many connections are open now.
func (c *ConnLimiter) Open() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.open
}

// Waiting is how many open connections have no request in flight.
func (c *ConnLimiter) Waiting() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.waiting.Len()
}

// Listener wraps l so that at most Max connections accepted from it are
// open at once.
func (c *ConnLimiter) Listener(l net.Listener) net.Listener {
	return &limitedListener{Listener: l, lim: c}
}

type limitedListener struct {
	net.Listener
	lim *ConnLimiter
}

func (l *limitedListener) Accept() (net.Conn, error) {
	for {
		conn, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		if lc := l.lim.admit(conn); lc != nil {
			return lc, nil
		}
		refuseConn(conn)
	}
}

// busyResponse is what a refused connection gets: not the HTTP server's
// (it never sees the connection), a fixed one.
var busyResponse = func() string {
	const body = "sbxd: too many connections are open; try again\n"
	return "HTTP/1.1 503 Service Unavailable\r\nContent-Type: text/plain; charset=utf-8\r\nConnection: close\r\n" +
		"Content-Length: " + strconv.Itoa(len(body)) + "\r\n\r\n" + body
}()

// refuseConn answers 503 and closes, without waiting on the client: the
// answer fits in a new socket's buffer, or is dropped.
func refuseConn(conn net.Conn) {
	_ = conn.SetWriteDeadline(time.Now().Add(10 * time.Millisecond))
	_, _ = io.WriteString(conn, busyResponse)
	_ = conn.Close()
}

// admit counts conn in, shedding the longest-waiting connection if the
// limit is reached; nil means there was none to shed and conn is refused.
func (c *ConnLimiter) admit(conn net.Conn) *limitedConn {
	var victim *limitedConn
	c.mu.Lock()
	if c.open >= c.max {
		e := c.waiting.Front()
		if e == nil {
			c.refused++
			c.logLocked()
			c.mu.Unlock()
			return nil
		}
		victim = e.Value.(*limitedConn)
		c.waiting.Remove(e)
		victim.elem = nil
		c.shed++
		c.logLocked()
	}
	c.open++
	lc := &limitedConn{Conn: conn, lim: c}
	c.mu.Unlock()
	if victim != nil {
		victim.Close()
	}
	return lc
}

// logLocked says, at most every 10 s, that the listener is full.
func (c *ConnLimiter) logLocked() {
	if time.Since(c.lastLog) < 10*time.Second {
		return
	}
	c.log.Warn("connection limit reached: shedding idle connections and refusing new ones",
		"listener", c.name, "max", c.max, "open", c.open, "shed", c.shed, "refused", c.refused)
	c.lastLog, c.shed, c.refused = time.Now(), 0, 0
}

// ConnState tracks which connections wait (the http.Server's hook).
func (c *ConnLimiter) ConnState(conn net.Conn, state http.ConnState) {
	lc, ok := conn.(*limitedConn)
	if !ok {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if lc.closed {
		return
	}
	if lc.elem != nil {
		c.waiting.Remove(lc.elem)
		lc.elem = nil
	}
	switch state {
	case http.StateNew, http.StateIdle:
		lc.elem = c.waiting.PushBack(lc)
	}
}

func (c *ConnLimiter) release(lc *limitedConn) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if lc.closed {
		return
	}
	lc.closed = true
	if lc.elem != nil {
		c.waiting.Remove(lc.elem)
		lc.elem = nil
	}
	c.open--
}

// limitedConn is a connection a ConnLimiter counts until it is closed
// (also after a hijack: a WebSocket holds its descriptor too).
type limitedConn struct {
	net.Conn
	lim *ConnLimiter
	// under lim.mu
	elem   *list.Element
	closed bool
}

func (lc *limitedConn) Close() error {
	lc.lim.release(lc)
	return lc.Conn.Close()
}

// CloseWrite lets the HTTP server end a response cleanly (a TCP half-close).
func (lc *limitedConn) CloseWrite() error {
	if cw, ok := lc.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return errors.ErrUnsupported
}

// ReadFrom keeps the TCP connection's fast path (splice, sendfile).
func (lc *limitedConn) ReadFrom(r io.Reader) (int64, error) {
	if rf, ok := lc.Conn.(io.ReaderFrom); ok {
		return rf.ReadFrom(r)
	}
	return io.Copy(struct{ io.Writer }{lc.Conn}, r)
}
