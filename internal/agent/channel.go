package agent

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"sync"
	"time"

	"sbx.dev/sbx/internal/wire/agentwire"
	"sbx.dev/sbx/internal/wire/frame"
)

// The exec channel, init's side (agentwire.ChannelSocket): init keeps
// channelIdle connections to sbxd open, each waiting for one request. A
// request is served as `sbx-agent start` or `attach --framed` would serve
// it, with the connection as its stdout, in a goroutine of init rather than
// in a process `runsc exec` starts: the command is init's child either way,
// and the goroutine calls init's supervisor directly (inProcess).
// A request is served in a goroutine of its own (the copy of an exec lasts
// as long as its command), and a new connection dialed at once.
//
// gVisor closes a sandbox's host sockets when it saves it (a checkpoint,
// also one that leaves it running), and does not wake a reader of one: an
// idle connection sends a ping (a NUL byte, which no frame starts with),
// and a failed ping replaces it. A restored sandbox's connections fail at
// once.
//
// Pings cost: each wakes init's runtime in the sentry, and at one every
// 200 ms on each connection an idle sandbox used 19 ms of CPU a second
// against 0.6 without the channel. The end of every save kicks the
// channel instead (kickAtCaptures: sbx's saves and the application's own,
// a freeze among them): every idle connection pings at once, and a dead
// one is replaced. Pings are left to find what no kick tells of (a save
// gVisor failed to announce): every channelPing while the channel is
// warm (a request, a new connection or a kick in the last channelWarm),
// then every channelPingIdle. An exec that finds no live connection goes
// through `runsc exec` as before, and the copier it starts connects to
// init's socket, which kicks the channel too; a kick also ends a loop's
// wait between failed dials (a restarted sbxd listens again only at its
// first exec).
const (
	channelIdle = 2
	channelWarm = 30 * time.Second
	// channelKickEvery bounds how often a kick makes the connections ping
	// (a flood of connections to init's socket is not a flood of pings).
	channelKickEvery = 100 * time.Millisecond
	// channelBackoffMax bounds the wait between dials while nobody listens
	// (an sbxd without the channel, or one restarting); a kick cuts it short.
	channelBackoffMax = 5 * time.Second
)

// channelPing and channelPingIdle are how often a connection pings while
// the channel is warm, and while it is not (variables for tests).
var (
	channelPing     = time.Second
	channelPingIdle = 2 * time.Second
)

// channelPacer paces the pings of init's idle connections.
type channelPacer struct {
	mu     sync.Mutex
	active time.Time     // the last request, connection or kick
	kicked time.Time     // the last kick that woke the connections
	wake   chan struct{} // closed at a kick, then replaced
	// later: a kick that came within channelKickEvery of the last is
	// made then (captures come in runs: the connections the second of two
	// saves closed are replaced at once too)
	later *time.Timer
}

var pacer = &channelPacer{wake: make(chan struct{})}

// touch marks the channel warm.
func (p *channelPacer) touch() {
	p.mu.Lock()
	p.active = time.Now()
	p.mu.Unlock()
}

// kick marks the channel warm and makes every idle connection ping now.
func (p *channelPacer) kick() {
	p.mu.Lock()
	defer p.mu.Unlock()
	now := time.Now()
	p.active = now
	if wait := channelKickEvery - now.Sub(p.kicked); wait > 0 {
		if p.later == nil {
			var later *time.Timer
			later = time.AfterFunc(wait, func() {
				p.mu.Lock()
				defer p.mu.Unlock()
				if p.later != later {
					return // called off (a test's reset)
				}
				p.later = nil
				p.wakeLocked(time.Now())
			})
			p.later = later
		}
		return
	}
	p.wakeLocked(now)
}

// wakeLocked makes every idle connection ping now; p.mu is held.
func (p *channelPacer) wakeLocked(now time.Time) {
	p.kicked = now
	close(p.wake)
	p.wake = make(chan struct{})
}

// next is how long an idle connection waits before its next ping, and
// what cuts that wait short.
func (p *channelPacer) next() (time.Duration, <-chan struct{}) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if time.Since(p.active) < channelWarm {
		return channelPing, p.wake
	}
	return channelPingIdle, p.wake
}

// serveChannel keeps init's connections to the exec channel at path, for
// the life of the process; their requests reach init through link (init's
// own supervisor, in its process).
func serveChannel(path string, link initLink) {
	for i := 0; i < channelIdle; i++ {
		go channelLoop(path, link)
	}
	go kickAtCaptures(openCaptureWait)
}

// openCaptureWait opens gVisor's /proc/gvisor/checkpoint for reading: a
// read of it waits for the next checkpoint of the sandbox to end, and says
// "resume" in the sandbox that ran on, "restore" in one restored from it
// (or "error"). Opened read-only, it is told of saves through runsc too
// (a snapshot, a fork's source: gVisor patch 16), not only of the
// application's own. A variable for tests.
var openCaptureWait = func() (io.ReadCloser, error) { return os.Open(checkpointPath) }

// kickAtCaptures kicks the channel as every checkpoint of the sandbox
// ends. A save closes init's connections without waking their readers,
// so until their next ping (then 200 ms, or 2 s when idle) the first exec
// after a resume, a fork or a snapshot found none and went by `runsc
// exec`, a process start on the host. Kicked, they ping at once and the
// dead ones are replaced. It returns when the file cannot be opened or
// read (not gVisor, or an older one).
func kickAtCaptures(open func() (io.ReadCloser, error)) {
	var buf [16]byte
	for {
		start := time.Now()
		f, err := open()
		if err != nil {
			return
		}
		n, err := f.Read(buf[:])
		f.Close()
		if err != nil || n == 0 {
			return
		}
		pacer.kick()
		if time.Since(start) < 10*time.Millisecond {
			// a file that does not wait: no spin
			time.Sleep(channelKickEvery)
		}
	}
}

func channelLoop(path string, link initLink) {
	for n := 0; ; {
		_, wake := pacer.next()
		conn, err := net.Dial("unix", path)
		if err != nil {
			// a kick cuts the wait short: a restarted sbxd listens
			// again at its first exec, whose copier (`runsc exec`)
			// kicks the channel; up to channelBackoffMax of execs by
			// `runsc exec` otherwise (TestAttackPingSbxdDownLong).
			// Kicks are rate-limited, so are these dials.
			n++
			pause := time.NewTimer(min(backoff(n)*10, channelBackoffMax))
			select {
			case <-pause.C:
			case <-wake:
				pause.Stop()
			}
			continue
		}
		n = 0
		pacer.touch()
		// a request is served in a goroutine of its own, and the loop
		// dials again at once: an exec's copy lasts as long as its
		// command, and two long ones would otherwise leave init no
		// connection for the execs that follow
		if serve := waitChannelRequest(conn, link, wake); serve != nil {
			go func() {
				serve()
				conn.Close()
			}()
			continue
		}
		conn.Close()
	}
}

// serveChannelConn waits on conn for one request, pinging while it waits,
// and serves it.
func serveChannelConn(conn net.Conn, link initLink) {
	if serve := waitChannelRequest(conn, link, nil); serve != nil {
		serve()
	}
}

// waitChannelRequest waits on conn for one request, pinging while it
// waits, and returns what serves it; nil if conn closed first. wake is the
// kick taken before conn was dialed (nil: none): a save that ended between
// the dial and the wait may have closed conn, and is told by it.
//
// Each kick a wait watches is taken before the ping that went ahead of it:
// a save that ended before the ping closed conn, and the ping fails; one
// that ends after it closes the kick the wait watches. Taken after the
// ping, a kick that came between the two was lost, and a dead connection
// waited for its next ping.
func waitChannelRequest(conn net.Conn, link initLink, wake <-chan struct{}) func() {
	r := bufio.NewReaderSize(conn, 64<<10)
	wait, next := pacer.next()
	if wake == nil {
		wake = next
	}
	for {
		_ = conn.SetReadDeadline(time.Now().Add(wait))
		peeked, done := make(chan struct{}), make(chan struct{})
		go func() {
			defer close(done)
			select {
			case <-wake:
				_ = conn.SetReadDeadline(time.Now()) // ping now
			case <-peeked:
			}
		}()
		_, err := r.Peek(1)
		close(peeked)
		<-done // no deadline set after this: the request's read sets its own
		if err == nil {
			pacer.touch()
			break
		}
		var ne net.Error
		if !errors.As(err, &ne) || !ne.Timeout() {
			return nil // closed: sbxd went, or a capture closed it
		}
		wait, wake = pacer.next()
		if _, err := conn.Write([]byte{agentwire.ChannelPing}); err != nil {
			return nil
		}
	}
	return func() {
		_ = conn.SetReadDeadline(time.Now().Add(clientTimeout))
		line, err := readLine(r, agentwire.MaxChannelRequest)
		_ = conn.SetReadDeadline(time.Time{})
		fw := frame.NewWriter(conn)
		fail := func(format string, args ...any) {
			_ = fw.Write(frame.Stderr, []byte("sbx: "+fmt.Sprintf(format, args...)+"\n"))
			_ = fw.WriteCode(frame.Exit, ExitUsageExec)
		}
		if err != nil {
			fail("channel: read the request: %s", err)
			return
		}
		var req agentwire.ChannelRequest
		if err := json.Unmarshal(line, &req); err != nil || len(req.Args) == 0 {
			fail("channel: bad request")
			return
		}
		serveChannelRequest(link, req, conn, fail)
	}
}

// serveChannelRequest runs what a channel request asks for, writing its
// frames to w. Only the copiers' two commands are served.
func serveChannelRequest(link initLink, req agentwire.ChannelRequest, w io.Writer, fail func(string, ...any)) {
	switch req.Args[0] {
	case "start":
		if len(req.Args) != 1 {
			fail("channel: start takes no arguments")
			return
		}
		startOn(link, bytes.NewReader(req.Stdin), w, io.Discard)
	case "attach":
		// parsed here, not by runAttach: its refusals go to its stderr,
		// which is nowhere here, and a flag that says --framed is not
		// enough (a --framed=false after it wins)
		a, err := parseAttach(req.Args[1:])
		switch {
		case err != nil:
			fail("channel: attach: %.200s", err)
		case !a.framed:
			fail("channel: attach is --framed here")
		default:
			attachOn(link, a.id, a.outOff, a.errOff, frame.NewWriter(w), io.Discard)
		}
	default:
		fail("channel: %.32q is not served here", req.Args[0])
	}
}

// readLine reads one line of at most max bytes (without its newline).
func readLine(r *bufio.Reader, max int) ([]byte, error) {
	var line []byte
	for {
		chunk, err := r.ReadSlice('\n')
		if len(line)+len(chunk) > max+1 {
			return nil, fmt.Errorf("the request is longer than %d bytes", max)
		}
		line = append(line, chunk...)
		switch {
		case err == nil:
			return line[:len(line)-1], nil
		case errors.Is(err, bufio.ErrBufferFull):
			continue
		case errors.Is(err, io.EOF) && len(line) > 0:
			return nil, io.ErrUnexpectedEOF
		default:
			return nil, err
		}
	}
}

// channelAvailable reports whether the exec channel's directory is there
// (a sandbox booted by an sbx that binds it).
func channelAvailable() bool {
	_, err := os.Stat(agentwire.ChannelDir)
	return err == nil
}
