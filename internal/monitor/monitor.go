// Package monitor receives a sandbox's runtime monitoring from gVisor's
// remote sink and keeps a bounded trace of it.
//
// runsc, given --pod-init-config naming a "remote" sink, connects to a
// SOCK_SEQPACKET unix socket when it creates (or restores) the sandbox,
// sends a Handshake, reads one back, and then sends one message per point:
// an 8-byte wire.Header (header size, message type, dropped count) and the
// point's protobuf (points_go_proto). Everything after the socket is the
// sandbox's doing and so untrusted: messages are read into a fixed buffer,
// strings are cut, and past Limit events only a count is kept.
package monitor

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"google.golang.org/protobuf/proto"
	pb "gvisor.dev/gvisor/pkg/sentry/seccheck/points/points_go_proto"

	"sbx.dev/sbx/api"
)

// DefaultLimit is the most events one sandbox's trace keeps: a test's
// process tree opening, connecting and exec'ing is well under it, and at
// about 200 bytes an event, 16 forks alive hold some 60 MB.
const DefaultLimit = 20000

// DefaultBytes bounds the bytes one sandbox's trace keeps, whatever its
// events carry: at maxString a string and maxArgs arguments, an execve can
// carry 9 KB, and DefaultLimit of them would be 180 MB per sandbox (and
// each read of the trace as much JSON again).
const DefaultBytes = 8 << 20

// Bounds on what one event may carry.
const (
	maxMessage = 64 << 10 // one point; a longer one is cut by the socket and dropped
	maxString  = 512
	maxArgs    = 16
	maxConns   = 4 // a boot and the restores after it
)

// Points are the points a monitored sandbox reports.
var Points = []string{
	"syscall/open/exit", "syscall/openat/exit", "syscall/creat/exit",
	"syscall/connect/exit", "syscall/bind/exit",
	"syscall/accept/exit", "syscall/accept4/exit",
	"syscall/sysno/50/exit",  // listen: its fd says which bound address
	"syscall/sysno/82/exit",  // rename
	"syscall/sysno/264/exit", // renameat
	"syscall/sysno/316/exit", // renameat2
	"syscall/sysno/87/exit",  // unlink
	"syscall/sysno/263/exit", // unlinkat
	"sentry/execve", "sentry/clone", "sentry/task_exit",
}

// rawNames names the raw syscalls of Points.
var rawNames = map[uint64]string{50: "listen", 82: "rename", 264: "renameat", 316: "renameat2", 87: "unlink", 263: "unlinkat"}

var contextFields = []string{"time", "thread_id", "group_id", "parent_thread_group_id", "process_name"}

// Monitor is one sandbox's receiver: its socket, and the trace kept.
type Monitor struct {
	id     string
	socket string
	ln     *net.UnixListener
	limit  int
	budget int64

	mu        sync.Mutex
	events    []api.TraceEvent
	bytes     int64 // what the events kept carry (eventSize)
	dropped   int64
	full      bool // an event was not kept for want of room
	sentry    int64
	connected bool
	conns     map[*net.UnixConn]bool
	closed    bool
	wg        sync.WaitGroup
}

// Start listens on dir/trace.sock for sandbox id's sink and writes the pod
// init config runsc is to be given (returned as its path). limit bounds the
// events kept (0: DefaultLimit). Close ends it.
func Start(id, dir string, limit int) (*Monitor, string, error) {
	if limit <= 0 {
		limit = DefaultLimit
	}
	socket := filepath.Join(dir, "trace.sock")
	if len(socket) >= 108 {
		return nil, "", fmt.Errorf("monitor %s: socket path %s is too long for a unix socket (%d bytes, at most 107); use a shorter --data-dir", id, socket, len(socket))
	}
	_ = os.Remove(socket) // a stale one of an earlier boot
	ln, err := net.ListenUnix("unixpacket", &net.UnixAddr{Name: socket, Net: "unixpacket"})
	if err != nil {
		return nil, "", fmt.Errorf("monitor %s: listen: %w", id, err)
	}
	if err := os.Chmod(socket, 0o600); err != nil {
		ln.Close()
		return nil, "", fmt.Errorf("monitor %s: %w", id, err)
	}
	cfg := filepath.Join(dir, "pod-init.json")
	if err := os.WriteFile(cfg, PodInitConfig(socket), 0o600); err != nil {
		ln.Close()
		return nil, "", fmt.Errorf("monitor %s: write pod init config: %w", id, err)
	}
	m := &Monitor{id: id, socket: socket, ln: ln, limit: limit, budget: DefaultBytes, conns: map[*net.UnixConn]bool{}}
	m.wg.Add(1)
	go m.accept()
	return m, cfg, nil
}

// PodInitConfig is the --pod-init-config that sends Points to the remote
// sink at socket.
func PodInitConfig(socket string) []byte {
	type point struct {
		Name           string   `json:"name"`
		OptionalFields []string `json:"optional_fields,omitempty"`
		ContextFields  []string `json:"context_fields"`
	}
	var pts []point
	for _, p := range Points {
		pt := point{Name: p, ContextFields: contextFields}
		switch p {
		case "syscall/openat/exit", "syscall/connect/exit", "syscall/bind/exit", "syscall/accept/exit", "syscall/accept4/exit":
			pt.OptionalFields = []string{"fd_path"}
		}
		pts = append(pts, pt)
		if raw, ok := strings.CutSuffix(p, "/exit"); ok && strings.HasPrefix(p, "syscall/sysno/") {
			// gVisor fills a raw exit's context from its enter point's
			// fields (task_syscall.go): without the enter point enabled
			// with them, a raw exit comes with no time and no pid. The
			// enter events that then come too are not kept.
			pts = append(pts, point{Name: raw + "/enter", ContextFields: contextFields})
		}
	}
	cfg := map[string]any{"trace_session": map[string]any{
		"name":           "Default",
		"ignore_missing": true,
		"points":         pts,
		"sinks": []any{map[string]any{
			"name": "remote",
			// a full socket drops points (counted) rather than stall the sandbox for long
			"config": map[string]any{"endpoint": socket, "retries": 3},
		}},
	}}
	b, _ := json.Marshal(cfg)
	return b
}

func (m *Monitor) accept() {
	defer m.wg.Done()
	for {
		c, err := m.ln.AcceptUnix()
		if err != nil {
			return
		}
		m.mu.Lock()
		if m.closed || len(m.conns) >= maxConns {
			m.mu.Unlock()
			c.Close()
			continue
		}
		m.conns[c] = true
		m.mu.Unlock()
		m.wg.Add(1)
		go func() {
			defer m.wg.Done()
			m.serve(c)
			m.mu.Lock()
			delete(m.conns, c)
			m.mu.Unlock()
			c.Close()
		}()
	}
}

// serve answers the handshake and reads points until the sink goes.
func (m *Monitor) serve(c *net.UnixConn) {
	buf := make([]byte, maxMessage)
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	n, err := c.Read(buf)
	if err != nil {
		return
	}
	var hs pb.Handshake
	if err := proto.Unmarshal(buf[:n], &hs); err != nil || hs.Version < 1 {
		return
	}
	out, _ := proto.Marshal(&pb.Handshake{Version: 1})
	if _, err := c.Write(out); err != nil {
		return
	}
	_ = c.SetReadDeadline(time.Time{})
	m.mu.Lock()
	m.connected = true
	m.mu.Unlock()
	for {
		n, err := c.Read(buf)
		if err != nil {
			return
		}
		ev, sentryDropped, ok := Decode(buf[:n])
		m.add(ev, sentryDropped, ok)
	}
}

func (m *Monitor) add(ev api.TraceEvent, sentryDropped uint32, ok bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if int64(sentryDropped) > m.sentry {
		m.sentry = int64(sentryDropped)
	}
	if !ok {
		m.dropped++
		return
	}
	if ev.Kind == "" {
		return // a point sbx does not ask for
	}
	size := eventSize(ev)
	if len(m.events) >= m.limit || m.bytes+size > m.budget {
		m.dropped++
		m.full = true
		return
	}
	m.bytes += size
	m.events = append(m.events, ev)
}

// eventSize is about what an event costs kept, and as JSON: its strings
// and its fixed fields.
func eventSize(ev api.TraceEvent) int64 {
	n := 160 + len(ev.Kind) + len(ev.Path) + len(ev.Addr) + len(ev.Process)
	for _, a := range ev.Argv {
		n += 16 + len(a)
	}
	return int64(n)
}

// Trace returns a copy of what was kept so far.
func (m *Monitor) Trace() api.Trace {
	m.mu.Lock()
	defer m.mu.Unlock()
	return api.Trace{
		SandboxID: m.id, Events: append([]api.TraceEvent{}, m.events...),
		Dropped: m.dropped, SentryDropped: m.sentry, Limit: m.limit, Connected: m.connected, Full: m.full,
	}
}

// Close stops listening, ends the connections and waits for them.
func (m *Monitor) Close() error {
	m.mu.Lock()
	if m.closed {
		m.mu.Unlock()
		return nil
	}
	m.closed = true
	for c := range m.conns {
		c.Close()
	}
	m.mu.Unlock()
	err := m.ln.Close()
	m.wg.Wait()
	_ = os.Remove(m.socket)
	if errors.Is(err, net.ErrClosed) {
		err = nil
	}
	return err
}

// headerSize is wire.HeaderStructSize: u16 header size, u16 message type,
// u32 dropped count, little-endian.
const headerSize = 8

// Decode reads one message of the remote sink: the event (Kind "" for a
// point sbx does not decode), the sink's count of dropped points, and false
// if the message is malformed.
func Decode(msg []byte) (api.TraceEvent, uint32, bool) {
	if len(msg) < headerSize {
		return api.TraceEvent{}, 0, false
	}
	hsize := int(binary.LittleEndian.Uint16(msg[0:2]))
	typ := pb.MessageType(binary.LittleEndian.Uint16(msg[2:4]))
	dropped := binary.LittleEndian.Uint32(msg[4:8])
	if hsize < headerSize || hsize > len(msg) {
		return api.TraceEvent{}, dropped, false
	}
	ev, err := decodePoint(typ, msg[hsize:])
	if err != nil {
		return api.TraceEvent{}, dropped, false
	}
	return ev, dropped, true
}

func decodePoint(typ pb.MessageType, payload []byte) (api.TraceEvent, error) {
	var ev api.TraceEvent
	var ctx *pb.ContextData
	var exit *pb.Exit
	switch typ {
	case pb.MessageType_MESSAGE_SYSCALL_OPEN:
		var p pb.Open
		if err := proto.Unmarshal(payload, &p); err != nil {
			return ev, err
		}
		ctx, exit = p.ContextData, p.Exit
		ev.Kind, ev.Path, ev.Flags = "open", joinAt(p.FdPath, p.Pathname), p.Flags
	case pb.MessageType_MESSAGE_SYSCALL_CONNECT:
		var p pb.Connect
		if err := proto.Unmarshal(payload, &p); err != nil {
			return ev, err
		}
		ctx, exit = p.ContextData, p.Exit
		ev.Kind, ev.Addr, ev.Fd = "connect", Sockaddr(p.Address), p.Fd
	case pb.MessageType_MESSAGE_SYSCALL_BIND:
		var p pb.Bind
		if err := proto.Unmarshal(payload, &p); err != nil {
			return ev, err
		}
		ctx, exit = p.ContextData, p.Exit
		ev.Kind, ev.Addr, ev.Fd = "bind", Sockaddr(p.Address), int64(p.Fd)
	case pb.MessageType_MESSAGE_SYSCALL_ACCEPT:
		var p pb.Accept
		if err := proto.Unmarshal(payload, &p); err != nil {
			return ev, err
		}
		ctx, exit = p.ContextData, p.Exit
		// the address accepted is the peer's; the socket's own is in fd_path
		ev.Kind, ev.Addr, ev.Path, ev.Fd = "accept", Sockaddr(p.Address), cut(p.FdPath), int64(p.Fd)
	case pb.MessageType_MESSAGE_SYSCALL_RAW:
		var p pb.Syscall
		if err := proto.Unmarshal(payload, &p); err != nil {
			return ev, err
		}
		if p.Exit == nil {
			return ev, nil // a raw enter point: asked for only for its exit's context
		}
		ctx, exit = p.ContextData, p.Exit
		ev.Kind = rawNames[p.Sysno]
		if ev.Kind == "listen" {
			ev.Fd = int64(int32(p.Arg1))
		}
		if ev.Kind == "" {
			ev.Kind = fmt.Sprintf("sysno/%d", p.Sysno)
		}
	case pb.MessageType_MESSAGE_SENTRY_EXEC:
		var p pb.ExecveInfo
		if err := proto.Unmarshal(payload, &p); err != nil {
			return ev, err
		}
		ctx = p.ContextData
		ev.Kind, ev.Path = "execve", cut(p.BinaryPath)
		for i, a := range p.Argv {
			if i == maxArgs {
				ev.Argv = append(ev.Argv, fmt.Sprintf("... (%d more)", len(p.Argv)-i))
				break
			}
			ev.Argv = append(ev.Argv, cut(a))
		}
	case pb.MessageType_MESSAGE_SENTRY_CLONE:
		var p pb.CloneInfo
		if err := proto.Unmarshal(payload, &p); err != nil {
			return ev, err
		}
		ctx = p.ContextData
		ev.Kind, ev.Child = "clone", p.CreatedThreadGroupId
	case pb.MessageType_MESSAGE_SENTRY_TASK_EXIT:
		var p pb.TaskExit
		if err := proto.Unmarshal(payload, &p); err != nil {
			return ev, err
		}
		ctx = p.ContextData
		ev.Kind, ev.Status = "exit", p.ExitStatus
	default:
		return ev, nil // not asked for
	}
	if ctx != nil {
		ev.TimeNs, ev.Pid, ev.Tid, ev.PPid = ctx.TimeNs, ctx.ThreadGroupId, ctx.ThreadId, ctx.ParentThreadGroupId
		ev.Process = cut(ctx.ProcessName)
	}
	if exit != nil {
		ev.Result, ev.Errno = exit.Result, exit.Errorno
	}
	return ev, nil
}

// joinAt is the path an open names: relative paths against the directory
// of its dirfd when the sentry said which.
func joinAt(dir, name string) string {
	if name == "" || name[0] == '/' || dir == "" {
		return cut(name)
	}
	return cut(filepath.Join(dir, name))
}

func cut(s string) string {
	if len(s) > maxString {
		return s[:maxString] + "..."
	}
	return s
}

// Sockaddr renders a raw struct sockaddr: "127.0.0.1:8765", "[::1]:80",
// "unix:/path" ("unix:@name" for an abstract one); "" if it is none of
// these.
func Sockaddr(b []byte) string {
	if len(b) < 2 {
		return ""
	}
	switch binary.LittleEndian.Uint16(b) {
	case 1: // AF_UNIX
		p := b[2:]
		if len(p) > 0 && p[0] == 0 {
			return "unix:@" + cut(trimNul(p[1:]))
		}
		return "unix:" + cut(trimNul(p))
	case 2: // AF_INET
		if len(b) < 8 {
			return ""
		}
		return fmt.Sprintf("%s:%d", net.IP(b[4:8]), binary.BigEndian.Uint16(b[2:4]))
	case 10: // AF_INET6
		if len(b) < 24 {
			return ""
		}
		return fmt.Sprintf("[%s]:%d", net.IP(b[8:24]), binary.BigEndian.Uint16(b[2:4]))
	}
	return ""
}

func trimNul(b []byte) string {
	for i, c := range b {
		if c == 0 {
			return string(b[:i])
		}
	}
	return string(b)
}
