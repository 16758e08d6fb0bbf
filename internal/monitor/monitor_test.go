package monitor

import (
	"encoding/binary"
	"encoding/json"
	"math/rand/v2"
	"net"
	"os"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"
	pb "gvisor.dev/gvisor/pkg/sentry/seccheck/points/points_go_proto"

	"sbx.dev/sbx/api"
)

// sink is what gVisor's remote sink does: connect, handshake, send points.
func sink(t *testing.T, socket string) *net.UnixConn {
	t.Helper()
	c, err := net.DialUnix("unixpacket", nil, &net.UnixAddr{Name: socket, Net: "unixpacket"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	hs, _ := proto.Marshal(&pb.Handshake{Version: 1})
	if _, err := c.Write(hs); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 1024)
	n, err := c.Read(buf)
	if err != nil {
		t.Fatal(err)
	}
	var back pb.Handshake
	if err := proto.Unmarshal(buf[:n], &back); err != nil || back.Version != 1 {
		t.Fatalf("handshake answer %v, %v", &back, err)
	}
	return c
}

func message(typ pb.MessageType, dropped uint32, m proto.Message) []byte {
	payload, _ := proto.Marshal(m)
	h := make([]byte, 8)
	binary.LittleEndian.PutUint16(h[0:], 8)
	binary.LittleEndian.PutUint16(h[2:], uint16(typ))
	binary.LittleEndian.PutUint32(h[4:], dropped)
	return append(h, payload...)
}

func inet(ip [4]byte, port uint16) []byte {
	b := make([]byte, 16)
	binary.LittleEndian.PutUint16(b, 2)
	binary.BigEndian.PutUint16(b[2:], port)
	copy(b[4:], ip[:])
	return b
}

func waitEvents(t *testing.T, m *Monitor, n int) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		tr := m.Trace()
		if len(tr.Events)+int(tr.Dropped) >= n {
			return
		}
	}
	t.Fatalf("trace has %+v, want %d events", m.Trace(), n)
}

func TestReceive(t *testing.T) {
	m, cfg, err := Start("sb_test", t.TempDir(), 0)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	var conf struct {
		TraceSession struct {
			Sinks []struct {
				Config map[string]any `json:"config"`
			} `json:"sinks"`
		} `json:"trace_session"`
	}
	b, _ := os.ReadFile(cfg)
	if err := json.Unmarshal(b, &conf); err != nil || conf.TraceSession.Sinks[0].Config["endpoint"] != m.socket {
		t.Fatalf("pod init config %s: %v", b, err)
	}
	c := sink(t, m.socket)
	ctx := &pb.ContextData{TimeNs: 1000, ThreadGroupId: 7, ThreadId: 8, ParentThreadGroupId: 1, ProcessName: "curl"}
	c.Write(message(pb.MessageType_MESSAGE_SYSCALL_CONNECT, 0, &pb.Connect{ContextData: ctx, Exit: &pb.Exit{Result: -111, Errorno: 111}, Address: inet([4]byte{127, 0, 0, 1}, 8765)}))
	c.Write(message(pb.MessageType_MESSAGE_SYSCALL_OPEN, 0, &pb.Open{ContextData: ctx, Exit: &pb.Exit{Errorno: 2}, FdPath: "/work", Pathname: "data.txt"}))
	c.Write(message(pb.MessageType_MESSAGE_SENTRY_EXEC, 3, &pb.ExecveInfo{ContextData: ctx, BinaryPath: "/bin/sh", Argv: []string{"sh", "-c", "true"}}))
	c.Write([]byte{1, 2, 3}) // malformed
	waitEvents(t, m, 4)
	tr := m.Trace()
	if !tr.Connected || len(tr.Events) != 3 || tr.Dropped != 1 || tr.SentryDropped != 3 {
		t.Fatalf("trace %+v", tr)
	}
	if e := tr.Events[0]; e.Kind != "connect" || e.Addr != "127.0.0.1:8765" || e.Errno != 111 || e.Pid != 7 || e.PPid != 1 || e.Process != "curl" || e.TimeNs != 1000 {
		t.Errorf("connect: got %+v", e)
	}
	if e := tr.Events[1]; e.Kind != "open" || e.Path != "/work/data.txt" || e.Errno != 2 {
		t.Errorf("open: got %+v", e)
	}
	if e := tr.Events[2]; e.Kind != "execve" || len(e.Argv) != 3 {
		t.Errorf("execve: got %+v", e)
	}
}

// A sandbox that floods points keeps Limit of them and counts the rest.
func TestFloodBounded(t *testing.T) {
	m, _, err := Start("sb_test", t.TempDir(), 100)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	c := sink(t, m.socket)
	long := make([]byte, 10000)
	for i := range long {
		long[i] = 'a'
	}
	for i := 0; i < 300; i++ {
		c.Write(message(pb.MessageType_MESSAGE_SYSCALL_OPEN, 0, &pb.Open{ContextData: &pb.ContextData{ThreadGroupId: 1}, Pathname: "/" + string(long)}))
	}
	waitEvents(t, m, 300)
	tr := m.Trace()
	if len(tr.Events) != 100 || tr.Dropped != 200 {
		t.Fatalf("got %d events, %d dropped; want 100, 200", len(tr.Events), tr.Dropped)
	}
	if l := len(tr.Events[0].Path); l > maxString+3 {
		t.Errorf("path of %d bytes kept, want at most %d", l, maxString+3)
	}
}

func TestSockaddr(t *testing.T) {
	v6 := make([]byte, 28)
	binary.LittleEndian.PutUint16(v6, 10)
	binary.BigEndian.PutUint16(v6[2:], 80)
	v6[23] = 1
	for _, tc := range []struct {
		name string
		in   []byte
		want string
	}{
		{"inet", inet([4]byte{127, 0, 0, 1}, 8765), "127.0.0.1:8765"},
		{"inet6", v6, "[::1]:80"},
		{"unix", append([]byte{1, 0}, "/run/x.sock\x00"...), "unix:/run/x.sock"},
		{"abstract", append([]byte{1, 0, 0}, "name"...), "unix:@name"},
		{"short", []byte{2, 0, 1}, ""},
		{"empty", nil, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := Sockaddr(tc.in); got != tc.want {
				t.Errorf("got %q, want %q", got, tc.want)
			}
		})
	}
}

// TestDecodeHostile: what a sandbox makes gVisor send, or writes to the
// socket itself, never panics the decoder and never yields unbounded
// strings.
func TestDecodeHostile(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for i := 0; i < 20000; i++ {
		msg := make([]byte, r.IntN(300))
		for j := range msg {
			msg[j] = byte(r.Uint32())
		}
		if len(msg) >= 4 && r.IntN(2) == 0 {
			binary.LittleEndian.PutUint16(msg[0:], 8)
			binary.LittleEndian.PutUint16(msg[2:], uint16(r.IntN(36)))
		}
		ev, _, _ := Decode(msg)
		if len(ev.Path) > maxString+3 || len(ev.Process) > maxString+3 || len(ev.Argv) > maxArgs+1 {
			t.Fatalf("message %x decoded to %+v", msg, ev)
		}
	}
	// a huge argv and a long path through the real encoding
	argv := make([]string, 1000)
	for i := range argv {
		argv[i] = strings.Repeat("x", 5000)
	}
	ev, _, ok := Decode(message(pb.MessageType_MESSAGE_SENTRY_EXEC, 0, &pb.ExecveInfo{BinaryPath: strings.Repeat("/a", 10000), Argv: argv}))
	if !ok || len(ev.Argv) != maxArgs+1 || len(ev.Path) > maxString+3 || len(ev.Argv[0]) > maxString+3 {
		t.Errorf("execve decoded to %d args, path of %d bytes", len(ev.Argv), len(ev.Path))
	}
}

// TestTraceBytesBounded: a sandbox that execs with the longest argv sbxd
// keeps (16 arguments of 512 bytes) cannot make its trace hold
// DefaultLimit of them (180 MB): the trace is bounded in bytes too, and
// counts what it did not keep.
func TestTraceBytesBounded(t *testing.T) {
	m := &Monitor{limit: DefaultLimit, budget: DefaultBytes}
	long := strings.Repeat("A", maxString)
	argv := make([]string, maxArgs)
	for i := range argv {
		argv[i] = long
	}
	for range DefaultLimit {
		m.add(api.TraceEvent{Kind: "execve", Path: "/bin/" + long, Argv: argv, Process: "sh"}, 0, true)
	}
	tr := m.Trace()
	b, _ := json.Marshal(tr)
	if len(b) > 2*DefaultBytes {
		t.Errorf("the trace is %d bytes of JSON with %d events, want at most about %d", len(b), len(tr.Events), DefaultBytes)
	}
	if tr.Dropped == 0 || !tr.Full || int64(len(tr.Events))+tr.Dropped != DefaultLimit {
		t.Errorf("kept %d, dropped %d, full %v: want the rest counted as dropped", len(tr.Events), tr.Dropped, tr.Full)
	}
}
