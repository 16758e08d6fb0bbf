package runsc

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"sbx.dev/sbx/internal/wire/agentwire"
	"sbx.dev/sbx/internal/wire/frame"
)

// The exec channel, the host's side (agentwire.ChannelSocket). With
// Driver.ExecChannel, every sandbox's init keeps connections open to a
// unix socket the driver listens on in the sandbox's channel directory
// (bound read-only at agentwire.ChannelDir; runsc is given --host-uds=open
// so that the sandbox may connect to it). StartExec then sends its request
// on one of them and reads the frames there, in this process, instead of
// starting a shim and a `runsc exec`: no process is started on the host,
// and none but the command inside.
//
// What a shim gives, the channel gives too, from the same files: the output
// within its budget, the pid, the offsets reached and the exit file. What
// it cannot give is to outlive sbxd: when sbxd goes, so does the
// connection, the command goes on under init, and a restarted sbxd finds
// no shim and no exit file and attaches a copier, as for a shim that died.
// A capture closes the sandbox's connections too (gVisor closes host
// sockets at a save): an exec being copied then ends its copy without an
// exit code, and is attached to again, as after a resume.
//
// Anything may arrive on the socket: only root inside the sandbox can reach
// it (its directory is 0700), and root there owns the sandbox, so what comes
// is read as a copier's output is, bounded and checked. At most
// channelMaxIdle connections are kept; more are closed at once.

// ChannelSocketName is the socket's name in its directory.
const ChannelSocketName = "agent.sock"

const (
	channelMaxIdle = 8
	// channelWait bounds how long an exec waits for a connection when the
	// sandbox's init has spoken on the channel before but has none open
	// now (a capture's end has it replace those the save closed at once; else
	// its next ping does, within a second).
	channelWait = 500 * time.Millisecond
	// expectDialFor is how long after a restore execs wait for init's
	// first connection (expectDial).
	expectDialFor = 2 * time.Second
	// maxChannelSocket is the longest path a unix socket may have.
	maxChannelSocket = 107
)

// channel is one sandbox's listener and the idle connections on it.
type channel struct {
	ln *net.UnixListener

	mu    sync.Mutex
	idle  []*idleConn
	spoke bool // init has connected on it
	// expect is until when an exec waits for init's first connection
	// though it has not spoken yet: a restored init redials as its
	// restore ends (expectDial).
	expect  time.Time
	arrived chan struct{} // closed at the next connection, then replaced
	closed  bool
}

// idleConn is a connection waiting for a request; its reader drops init's
// pings until it is taken.
type idleConn struct {
	c     *net.UnixConn
	taken bool          // under channel.mu
	done  chan struct{} // closed when the reader has stopped
}

// channelTable holds the open channels by sandbox id.
type channelTable struct {
	// opening is held for the whole of an OpenChannel: two execs after a
	// restart may both open a sandbox's channel at once, and the second's
	// remove-and-listen must not come between the first's listen and its
	// entry in m (a listener left out of m, never closed, that has the
	// socket).
	opening sync.Mutex
	mu      sync.Mutex
	m       map[string]*channel
}

// OpenChannel listens for sandbox id's init in dir (made 0700), replacing
// a channel of an earlier boot of it. It is a no-op without ExecChannel.
func (d *Driver) OpenChannel(id, dir string) error {
	if !d.ExecChannel || dir == "" {
		return nil
	}
	socket := filepath.Join(dir, ChannelSocketName)
	if len(socket) > maxChannelSocket {
		return fmt.Errorf("exec channel of %s: socket path %s is too long for a unix socket (%d bytes, at most %d); use a shorter --data-dir", id, socket, len(socket), maxChannelSocket)
	}
	d.channels.opening.Lock()
	defer d.channels.opening.Unlock()
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("exec channel of %s: %w", id, err)
	}
	if err := os.Chmod(dir, 0o700); err != nil {
		return fmt.Errorf("exec channel of %s: %w", id, err)
	}
	d.CloseChannel(id)
	_ = os.Remove(socket) // an earlier sbxd's
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: socket, Net: "unix"})
	if err != nil {
		return fmt.Errorf("exec channel of %s: listen: %w", id, err)
	}
	ln.SetUnlinkOnClose(true)
	if err := os.Chmod(socket, 0o600); err != nil {
		ln.Close()
		return fmt.Errorf("exec channel of %s: %w", id, err)
	}
	ch := &channel{ln: ln, arrived: make(chan struct{})}
	d.channels.mu.Lock()
	if d.channels.m == nil {
		d.channels.m = map[string]*channel{}
	}
	d.channels.m[id] = ch
	d.channels.mu.Unlock()
	go ch.accept()
	return nil
}

// expectDial has execs into sandbox id wait for its init's first
// connection for a while, as they do once init has spoken: a restored
// init held connections before the save, which the save closed, and its
// agent redials as the restore ends (it waits on /proc/gvisor/checkpoint);
// without the wait the first exec after a resume or a fork went by `runsc
// exec`. An image whose init never dials (an older sbx's) costs the execs
// of the first expectDialFor at most channelWait each.
func (d *Driver) expectDial(id string) {
	d.channels.mu.Lock()
	ch := d.channels.m[id]
	d.channels.mu.Unlock()
	if ch == nil {
		return
	}
	ch.mu.Lock()
	ch.expect = time.Now().Add(expectDialFor)
	ch.mu.Unlock()
}

// CloseChannel stops listening for sandbox id and closes its connections.
func (d *Driver) CloseChannel(id string) {
	d.channels.mu.Lock()
	ch := d.channels.m[id]
	delete(d.channels.m, id)
	d.channels.mu.Unlock()
	if ch != nil {
		ch.close()
	}
}

func (d *Driver) channel(id string) *channel {
	d.channels.mu.Lock()
	defer d.channels.mu.Unlock()
	return d.channels.m[id]
}

func (ch *channel) accept() {
	for {
		c, err := ch.ln.AcceptUnix()
		if err != nil {
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				continue
			}
			ch.mu.Lock()
			closed := ch.closed
			ch.mu.Unlock()
			if closed {
				return
			}
			time.Sleep(10 * time.Millisecond) // out of fds, say
			continue
		}
		ch.mu.Lock()
		if ch.closed || len(ch.idle) >= channelMaxIdle {
			ch.mu.Unlock()
			c.Close()
			// a flood of connections costs this loop a wake-up each:
			// at most a hundred a second
			time.Sleep(10 * time.Millisecond)
			continue
		}
		ic := &idleConn{c: c, done: make(chan struct{})}
		ch.idle = append(ch.idle, ic)
		ch.spoke = true
		close(ch.arrived)
		ch.arrived = make(chan struct{})
		ch.mu.Unlock()
		go ch.drain(ic)
	}
}

// maxPingsPerSecond bounds the pings of an idle connection (init sends
// five a second): one that sends more would keep drain reading.
const maxPingsPerSecond = 50

// drain reads an idle connection's pings until it is taken; a connection
// that ends, sends anything but pings, or floods pings, is dropped.
func (ch *channel) drain(ic *idleConn) {
	defer close(ic.done)
	var b [64]byte
	window, pings := time.Now(), 0
	for {
		n, err := ic.c.Read(b[:])
		ch.mu.Lock()
		taken := ic.taken
		ch.mu.Unlock()
		if taken {
			return // woken by take's deadline: the pings read were only pings
		}
		if time.Since(window) > time.Second {
			window, pings = time.Now(), 0
		}
		pings += n
		bad := err != nil || pings > maxPingsPerSecond
		for _, x := range b[:n] {
			bad = bad || x != agentwire.ChannelPing
		}
		if bad {
			ch.drop(ic)
			ic.c.Close()
			return
		}
	}
}

func (ch *channel) drop(ic *idleConn) {
	ch.mu.Lock()
	defer ch.mu.Unlock()
	for i, x := range ch.idle {
		if x == ic {
			ch.idle = append(ch.idle[:i], ch.idle[i+1:]...)
			return
		}
	}
}

// take returns an idle connection, waiting up to channelWait for one if
// init has spoken on the channel; nil if there is none.
func (ch *channel) take() *net.UnixConn {
	deadline := time.Now().Add(channelWait)
	for {
		ch.mu.Lock()
		if ch.closed {
			ch.mu.Unlock()
			return nil
		}
		if n := len(ch.idle); n > 0 {
			ic := ch.idle[n-1] // the newest: the least likely a capture closed
			ch.idle = ch.idle[:n-1]
			ic.taken = true
			ch.mu.Unlock()
			_ = ic.c.SetReadDeadline(time.Now()) // stops drain
			<-ic.done
			_ = ic.c.SetReadDeadline(time.Time{})
			if !alive(ic.c) {
				// closed before drain saw it (a save closes the
				// sandbox's end; one queued to accept may be dead
				// already): the next, or a new one
				ic.c.Close()
				continue
			}
			return ic.c
		}
		spoke, arrived := ch.spoke || time.Now().Before(ch.expect), ch.arrived
		ch.mu.Unlock()
		left := time.Until(deadline)
		if !spoke || left <= 0 {
			return nil
		}
		select {
		case <-arrived:
		case <-time.After(left):
		}
	}
}

// alive reports whether c's peer is still there: it reads, without
// waiting, what c holds, pings all, and finds no end after them.
func alive(c *net.UnixConn) bool {
	rc, err := c.SyscallConn()
	if err != nil {
		return false
	}
	ok := false
	var b [64]byte
	err = rc.Read(func(fd uintptr) bool {
		for {
			n, _, err := unix.Recvfrom(int(fd), b[:], unix.MSG_DONTWAIT)
			switch {
			case err == unix.EINTR:
				continue
			case err == unix.EAGAIN:
				ok = true // nothing more to read, and no end
				return true
			case err != nil || n == 0:
				return true // an error, or the end
			}
			for _, x := range b[:n] {
				if x != agentwire.ChannelPing {
					return true
				}
			}
		}
	})
	return err == nil && ok
}

func (ch *channel) close() {
	ch.mu.Lock()
	ch.closed = true
	idle := ch.idle
	ch.idle = nil
	close(ch.arrived)
	ch.arrived = make(chan struct{})
	ch.mu.Unlock()
	ch.ln.Close()
	for _, ic := range idle {
		ic.c.Close()
	}
}

// channelExec runs o over c: it sends the request, then keeps the frames
// that come back in o.Dir as a shim would, reporting on the Shim's Events.
// A connection the sandbox closed before any frame (a capture's save
// closes it, whether or not init had read the request) is replaced by
// another of ch's, and the request sent again, up to resendMax times:
// init spawns an exec id once, and a start sent again follows the command
// the first started (initRequest.Again), so nothing runs twice, and an
// exec a freeze or a snapshot crossed on its way in runs rather than
// being given up (settled, exit 125). A connection closed after a frame,
// or silent past the stall, is an exec lost, for the caller to attach to
// (it settles what init did).
func (d *Driver) channelExec(ch *channel, c *net.UnixConn, o ShimExec, head, tail int64) (*Shim, error) {
	if len(o.Args) == 0 || o.Args[0] != AgentPath {
		c.Close()
		return nil, fmt.Errorf("exec channel: %q is not the agent", o.Args)
	}
	line, err := json.Marshal(agentwire.ChannelRequest{Args: o.Args[1:], Stdin: o.Stdin})
	if err != nil {
		c.Close()
		return nil, err
	}
	line = append(line, '\n')
	out, err := openOutputs(o.Dir, head, tail, o.Offsets)
	if err != nil {
		c.Close()
		return nil, err
	}
	_ = os.Remove(filepath.Join(o.Dir, ExitFile))
	_ = os.Remove(filepath.Join(o.Dir, ShimPidFile)) // no shim follows this exec now
	if err := sendChannelRequest(c, line); err != nil {
		out.close()
		c.Close()
		return nil, err
	}
	events := make(chan ShimEvent, 4)
	say := func(format string, args ...any) {
		if ev, ok := parseShimLine(fmt.Sprintf(format, args...)); ok {
			events <- ev
		}
	}
	go func() {
		defer close(events)
		var code int
		var known, unread bool
		var lost string
		for sent := 1; ; sent++ {
			code, known, unread, lost = readChannelFrames(c, out, o.Stall, say)
			c.Close()
			if !unread || sent > resendMax {
				break
			}
			if c = ch.take(); c == nil {
				break
			}
			if err := sendChannelRequest(c, line); err != nil {
				c.Close()
				break
			}
		}
		out.close()
		if !known {
			say("lost %s", lost)
			return
		}
		say("exit %d", code)
		writeExitFile(o.Dir, code)
	}()
	return &Shim{Events: events}, nil
}

// resendMax bounds the times one exec's request is sent again over the
// channel after a connection closed before any frame.
const resendMax = 3

func sendChannelRequest(c *net.UnixConn, line []byte) error {
	_ = c.SetWriteDeadline(time.Now().Add(10 * time.Second))
	if _, err := c.Write(line); err != nil {
		return fmt.Errorf("exec channel: send: %w", err)
	}
	_ = c.SetWriteDeadline(time.Time{})
	return nil
}

// readChannelFrames reads c's frames into out until the exit frame. unread
// says the connection ended before any frame came (reset, or closed: a
// capture's save, or a restored init dropping a connection of its old
// life), so nothing of the exec was read: the request can be sent again
// from where it was.
func readChannelFrames(c *net.UnixConn, out *outputs, stall time.Duration, say func(string, ...any)) (code int, known, unread bool, lost string) {
	r := bufio.NewReaderSize(c, 64<<10)
	// pings init sent before it saw the request come before the frames:
	// a few, within one stall in all (pings do not reset it, or whoever
	// pings on after the request holds the exec for ever)
	if stall > 0 {
		_ = c.SetReadDeadline(time.Now().Add(stall))
	}
	for pings := 0; ; pings++ {
		if pings > maxPingsPerSecond {
			return -1, false, false, "the exec channel: pings and no frame after the request"
		}
		b, err := r.ReadByte()
		if err != nil {
			closed := errors.Is(err, syscall.ECONNRESET) || errors.Is(err, io.EOF) || errors.Is(err, syscall.EPIPE)
			return -1, false, closed, channelLost(err, stall)
		}
		if b != agentwire.ChannelPing {
			_ = r.UnreadByte()
			break
		}
	}
	buf := make([]byte, frame.MaxPayload)
	for {
		if stall > 0 {
			_ = c.SetReadDeadline(time.Now().Add(stall))
		}
		typ, p, err := frame.Read(r, buf)
		if err != nil {
			return -1, false, false, channelLost(err, stall)
		}
		if code, ok := out.take(typ, p, say); ok {
			return code, true, false, ""
		}
	}
}

// ChannelClosed is the reason an exec's copy over the channel ended when
// the connection closed before the exit code: a capture closed it (most
// often), or init's copy ended.
const ChannelClosed = "the exec channel closed before the exit code (a capture, or init's copy ended)"

func channelLost(err error, stall time.Duration) string {
	switch {
	case errors.Is(err, os.ErrDeadlineExceeded):
		return fmt.Sprintf("the copier in the sandbox sent nothing for %s (stopped, or wedged)", stall)
	case errors.Is(err, io.EOF):
		return ChannelClosed
	}
	return "the exec channel: " + err.Error()
}
