package runsc

import (
	"bufio"
	"encoding/json"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"

	"sbx.dev/sbx/internal/wire/agentwire"
	"sbx.dev/sbx/internal/wire/frame"
)

// fakeInit dials the channel in dir as init does, pings while idle, and
// answers one request with what serve writes. It returns the request.
func fakeInit(t *testing.T, dir string, serve func(req agentwire.ChannelRequest, fw *frame.Writer)) <-chan agentwire.ChannelRequest {
	t.Helper()
	got := make(chan agentwire.ChannelRequest, 1)
	c, err := net.Dial("unix", filepath.Join(dir, ChannelSocketName))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	go func() {
		defer c.Close()
		_, _ = c.Write([]byte{agentwire.ChannelPing, agentwire.ChannelPing})
		line, err := bufio.NewReader(c).ReadBytes('\n')
		if err != nil {
			return
		}
		var req agentwire.ChannelRequest
		_ = json.Unmarshal(line, &req)
		got <- req
		_, _ = c.Write([]byte{agentwire.ChannelPing}) // one in flight as the request came
		serve(req, frame.NewWriter(c))
	}()
	return got
}

func channelDriver(t *testing.T) (*Driver, string) {
	t.Helper()
	d := &Driver{ExecChannel: true}
	dir := filepath.Join(t.TempDir(), "chan")
	if err := d.OpenChannel("sb_1", dir); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.CloseChannel("sb_1") })
	return d, dir
}

// waitIdle waits until the channel holds n idle connections.
func waitIdle(t *testing.T, d *Driver, n int) {
	t.Helper()
	ch := d.channel("sb_1")
	for deadline := time.Now().Add(5 * time.Second); ; {
		ch.mu.Lock()
		got := len(ch.idle)
		ch.mu.Unlock()
		if got == n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d idle connections, want %d", got, n)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestChannelExec: an exec over the channel keeps what a shim keeps (the
// output, pid, offsets and exit files) and reports the pid and the end, and
// the request carries the agent's arguments and the stdin, never argv.
func TestChannelExec(t *testing.T) {
	d, dir := channelDriver(t)
	got := fakeInit(t, dir, func(req agentwire.ChannelRequest, fw *frame.Writer) {
		fw.WriteCode(frame.Pid, 42)
		fw.Write(frame.Stdout, []byte("hello\n"))
		fw.Write(frame.Stderr, []byte("warn\n"))
		fw.WriteCode(frame.Exit, 3)
	})
	waitIdle(t, d, 1)
	execDir := t.TempDir()
	sh, err := d.StartExec("sb_1", ShimExec{Dir: execDir, Args: []string{AgentPath, "start"}, Stdin: []byte(`{"id":"ex_1"}`), Channel: dir, Stall: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	var pid, exit int
	for ev := range sh.Events {
		switch {
		case ev.Pid > 0:
			pid = ev.Pid
		case ev.Exit != nil:
			exit = *ev.Exit
		case ev.Lost != "":
			t.Fatalf("lost: %s", ev.Lost)
		}
	}
	if pid != 42 || exit != 3 {
		t.Errorf("events: pid %d, exit %d; want 42, 3", pid, exit)
	}
	req := <-got
	if strings.Join(req.Args, " ") != "start" || string(req.Stdin) != `{"id":"ex_1"}` {
		t.Errorf("the request: %+v", req)
	}
	for name, want := range map[string]string{"stdout": "hello\n", "stderr": "warn\n", PidFile: "42\n", ExitFile: "3\n", OffsetsFile: "6 5\n"} {
		if b, err := os.ReadFile(filepath.Join(execDir, name)); err != nil || string(b) != want {
			t.Errorf("%s: %q, %v; want %q", name, b, err, want)
		}
	}
	if code, ok := ReadExit(execDir); !ok || code != 3 {
		t.Errorf("ReadExit: %d, %v", code, ok)
	}
}

// TestChannelExecStall: a copier that says nothing past the stall is given
// up (lost, saying why), as a shim gives up a stopped copier.
func TestChannelExecStall(t *testing.T) {
	d, dir := channelDriver(t)
	fakeInit(t, dir, func(req agentwire.ChannelRequest, fw *frame.Writer) {
		fw.WriteCode(frame.Pid, 7)
		time.Sleep(3 * time.Second)
	})
	waitIdle(t, d, 1)
	sh, err := d.StartExec("sb_1", ShimExec{Dir: t.TempDir(), Args: []string{AgentPath, "start"}, Channel: dir, Stall: 300 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	var lost string
	for ev := range sh.Events {
		if ev.Exit != nil {
			t.Fatalf("an exit from a stalled copier: %d", *ev.Exit)
		}
		if ev.Lost != "" {
			lost = ev.Lost
		}
	}
	if !strings.Contains(lost, "sent nothing") {
		t.Errorf("lost %q; want the stall said", lost)
	}
}

// TestChannelExecClosed: a connection that closes before the exit frame
// (a capture closes the sandbox's host sockets) is a lost copy, to be
// attached again; nothing is invented for its exit.
func TestChannelExecClosed(t *testing.T) {
	d, dir := channelDriver(t)
	fakeInit(t, dir, func(req agentwire.ChannelRequest, fw *frame.Writer) {
		fw.Write(frame.Stdout, []byte("part"))
	})
	waitIdle(t, d, 1)
	execDir := t.TempDir()
	sh, err := d.StartExec("sb_1", ShimExec{Dir: execDir, Args: []string{AgentPath, "attach", "--framed", "--id", "ex_1"}, Channel: dir, Offsets: [2]int64{10, 0}})
	if err != nil {
		t.Fatal(err)
	}
	var lost string
	for ev := range sh.Events {
		if ev.Exit != nil {
			t.Fatalf("an exit from a closed channel: %d", *ev.Exit)
		}
		lost += ev.Lost
	}
	if !strings.Contains(lost, "closed") {
		t.Errorf("lost %q", lost)
	}
	if _, ok := ReadExit(execDir); ok {
		t.Error("an exit file for a copy cut short")
	}
	if off := ReadOffsets(execDir); off != [2]int64{14, 0} {
		t.Errorf("offsets %v; want [14 0] (10 given, 4 more)", off)
	}
}

// TestChannelHostile: what root inside the sandbox may do to the socket: a
// flood of connections keeps at most channelMaxIdle, an idle connection
// that sends anything but pings is dropped, and a close ends every one.
func TestChannelHostile(t *testing.T) {
	d, dir := channelDriver(t)
	var conns []net.Conn
	for i := 0; i < 3*channelMaxIdle; i++ {
		c, err := net.Dial("unix", filepath.Join(dir, ChannelSocketName))
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		conns = append(conns, c)
	}
	waitIdle(t, d, channelMaxIdle)
	ch := d.channel("sb_1")
	for _, c := range conns {
		c.Write([]byte("x")) // not a ping
	}
	waitIdle(t, d, 0)
	time.Sleep(2 * channelMaxIdle * 10 * time.Millisecond * 2) // the accept loop's backlog, paced
	waitIdle(t, d, 0)
	if c := ch.take(); c != nil {
		t.Error("a connection that sent junk while idle was handed to an exec")
	}
	d.CloseChannel("sb_1")
	if _, err := os.Stat(filepath.Join(dir, ChannelSocketName)); !os.IsNotExist(err) {
		t.Errorf("the socket is still there after the close: %v", err)
	}
	if c := ch.take(); c != nil {
		t.Error("a closed channel handed out a connection")
	}
}

// TestChannelTakeWaits: take waits (bounded) for init to replace its
// connections only when init has spoken on the channel; a sandbox whose init
// never did (an image of an older sbx) falls back at once.
func TestChannelTakeWaits(t *testing.T) {
	d, dir := channelDriver(t)
	ch := d.channel("sb_1")
	start := time.Now()
	if c := ch.take(); c != nil || time.Since(start) > channelWait/2 {
		t.Errorf("an init that never spoke: take gave %v after %s; want nil at once", c, time.Since(start))
	}
	c, err := net.Dial("unix", filepath.Join(dir, ChannelSocketName))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	waitIdle(t, d, 1)
	if ch.take() == nil {
		t.Fatal("no connection taken")
	}
	go func() {
		time.Sleep(100 * time.Millisecond)
		if c, err := net.Dial("unix", filepath.Join(dir, ChannelSocketName)); err == nil {
			t.Cleanup(func() { c.Close() })
		}
	}()
	if ch.take() == nil {
		t.Error("take did not wait for init's next connection")
	}
}

// TestChannelTakeWaitsAfterRestore: a restored init has not spoken on the
// new boot's channel yet, but it redials as its restore ends; take waits
// for that first connection, for expectDialFor after the restore only (an
// image whose init never dials costs only the first execs a wait).
func TestChannelTakeWaitsAfterRestore(t *testing.T) {
	d, dir := channelDriver(t)
	ch := d.channel("sb_1")
	d.expectDial("sb_1")
	go func() {
		time.Sleep(100 * time.Millisecond)
		if c, err := net.Dial("unix", filepath.Join(dir, ChannelSocketName)); err == nil {
			t.Cleanup(func() { c.Close() })
		}
	}()
	if ch.take() == nil {
		t.Fatal("take after a restore did not wait for the restored init's first connection")
	}
	// an init that never dials: past the window, no wait
	d2, _ := channelDriver(t)
	d2.expectDial("sb_1")
	ch2 := d2.channel("sb_1")
	ch2.mu.Lock()
	ch2.expect = time.Now().Add(-time.Millisecond)
	ch2.mu.Unlock()
	start := time.Now()
	if c := ch2.take(); c != nil || time.Since(start) > channelWait/2 {
		t.Errorf("past the window after a restore: take gave %v after %s; want nil at once", c, time.Since(start))
	}
}

// TestChannelSocketTooLong: a data dir too deep for a unix socket is said,
// and the execs go by shims.
func TestChannelSocketTooLong(t *testing.T) {
	d := &Driver{ExecChannel: true}
	err := d.OpenChannel("sb_1", "/"+strings.Repeat("d", 120))
	if err == nil || !strings.Contains(err.Error(), "too long") {
		t.Errorf("OpenChannel with a 130-byte socket path: %v", err)
	}
	if (&Driver{}).OpenChannel("sb_1", t.TempDir()) != nil {
		t.Error("OpenChannel without ExecChannel did something")
	}
}

// TestChannelPingFlood: an idle connection that floods pings (root inside,
// to keep sbxd reading) is dropped.
func TestChannelPingFlood(t *testing.T) {
	d, dir := channelDriver(t)
	c, err := net.Dial("unix", filepath.Join(dir, ChannelSocketName))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	waitIdle(t, d, 1)
	go func() {
		zeros := make([]byte, 4096)
		for {
			if _, err := c.Write(zeros); err != nil {
				return
			}
		}
	}()
	waitIdle(t, d, 0)
}

// TestChannelMountOfAnImage: an image's exec channel mount restores with
// this sandbox's own directory, never the image's source; a bundle without
// a channel drops it (runsc then refuses the restore), and an image whose
// channel mount is writable is refused.
func TestChannelMountOfAnImage(t *testing.T) {
	with := Spec(SpecOptions{Rootfs: "/r", AgentDir: "/a", EtcDir: "/e", ChannelDir: "/ours/chan"}).Mounts
	without := Spec(SpecOptions{Rootfs: "/r", AgentDir: "/a", EtcDir: "/e"}).Mounts
	image := Spec(SpecOptions{Rootfs: "/r", AgentDir: "/a", EtcDir: "/e", ChannelDir: "/etc"}).Mounts // a pulled image's word
	sources := func(ms []specs.Mount) map[string]string {
		m := map[string]string{}
		for _, x := range ms {
			m[x.Destination] = x.Source
		}
		return m
	}
	got, _ := fitMounts(image, with)
	if s := sources(got)[agentwire.ChannelDir]; s != "/ours/chan" {
		t.Errorf("into a bundle with a channel: the channel's source is %q, want the sandbox's own", s)
	}
	got, _ = fitMounts(image, without)
	if s, ok := sources(got)[agentwire.ChannelDir]; ok {
		t.Errorf("into a bundle without a channel: the image's channel mount is kept, from %q", s)
	}
	ours := map[string]specs.Mount{}
	for _, m := range Spec(SpecOptions{ChannelDir: "/"}).Mounts {
		ours[m.Destination] = m
	}
	rw := specs.Mount{Destination: agentwire.ChannelDir, Type: "bind", Source: "/x", Options: []string{"rbind", "rw"}}
	if err := checkImageMount(rw, ours); err == nil {
		t.Error("an image with a writable channel mount was not refused")
	}
	ro := specs.Mount{Destination: agentwire.ChannelDir, Type: "bind", Source: "/x", Options: []string{"rbind", "ro"}}
	if err := checkImageMount(ro, ours); err != nil {
		t.Errorf("an image with sbx's channel mount was refused: %v", err)
	}
}

// TestChannelTakeSkipsDead: a connection whose sandbox end closed before
// drain saw it (a save closes them all; one may wait in the accept queue
// already dead) is never given to an exec: take gives the live one under
// it, pings and all.
func TestChannelTakeSkipsDead(t *testing.T) {
	ch := &channel{arrived: make(chan struct{})}
	pair := func() (*net.UnixConn, *os.File) {
		fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM, 0)
		if err != nil {
			t.Fatal(err)
		}
		f := os.NewFile(uintptr(fds[0]), "host")
		defer f.Close()
		c, err := net.FileConn(f)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		peer := os.NewFile(uintptr(fds[1]), "sandbox")
		t.Cleanup(func() { peer.Close() })
		return c.(*net.UnixConn), peer
	}
	idle := func(c *net.UnixConn) {
		// as accept would leave it, but drain has not read yet
		ic := &idleConn{c: c, done: make(chan struct{})}
		close(ic.done)
		ch.idle = append(ch.idle, ic)
	}
	live, livePeer := pair()
	deadPinged, dp := pair()
	dead, deadPeer := pair()
	if _, err := livePeer.Write([]byte{agentwire.ChannelPing, agentwire.ChannelPing}); err != nil {
		t.Fatal(err)
	}
	if _, err := dp.Write([]byte{agentwire.ChannelPing}); err != nil {
		t.Fatal(err)
	}
	dp.Close()
	deadPeer.Close()
	idle(live)
	idle(deadPinged)
	idle(dead) // the newest, taken first
	got := ch.take()
	if got != live {
		t.Fatalf("take gave %v, want the live connection %v", got, live)
	}
	if len(ch.idle) != 0 {
		t.Errorf("%d idle connections left, want none", len(ch.idle))
	}
	if _, err := livePeer.Write([]byte("x")); err != nil {
		t.Fatal(err)
	}
	_ = got.SetReadDeadline(time.Now().Add(time.Second))
	var b [1]byte
	if _, err := got.Read(b[:]); err != nil || b[0] != 'x' {
		t.Errorf("the live connection reads %q, %v; want what its peer wrote after its pings", b[:], err)
	}
}

// TestChannelExecResentAfterReset: a connection the sandbox closes with the
// request unread (a restored init dropping a connection of its old life,
// seen in CI right after a resume: "read: connection reset by peer") has
// started nothing, so the request goes again over the next connection, and
// the exec runs once, with its own exit code, rather than being lost.
func TestChannelExecResentAfterReset(t *testing.T) { channelExecResent(t, false) }

// TestChannelExecResentAfterClose: a connection that read the request and
// closed before any frame (a freeze's save, the request read or not) is
// replaced, and the request sent again: init spawns an id once, a start
// sent again follows what the first started (initRequest.Again).
func TestChannelExecResentAfterClose(t *testing.T) { channelExecResent(t, true) }

func channelExecResent(t *testing.T, readFirst bool) {
	d, dir := channelDriver(t)
	served := fakeInit(t, dir, func(req agentwire.ChannelRequest, fw *frame.Writer) {
		fw.WriteCode(frame.Pid, 9)
		fw.WriteCode(frame.Exit, 4)
	})
	waitIdle(t, d, 1)
	// the newest connection, taken first: it closes as soon as the
	// request is there, without reading it
	c, err := net.Dial("unix", filepath.Join(dir, ChannelSocketName))
	if err != nil {
		t.Fatal(err)
	}
	f, err := c.(*net.UnixConn).File()
	if err != nil {
		t.Fatal(err)
	}
	c.Close()
	resetDone := make(chan struct{})
	go func() {
		defer close(resetDone)
		defer f.Close()
		fds := []unix.PollFd{{Fd: int32(f.Fd()), Events: unix.POLLIN}}
		for {
			if _, err := unix.Poll(fds, 5000); err != unix.EINTR {
				if readFirst {
					b := make([]byte, 4096)
					unix.Read(int(f.Fd()), b) // closed with nothing unread: an EOF, not a reset
				}
				return
			}
		}
	}()
	waitIdle(t, d, 2)
	sh, err := d.StartExec("sb_1", ShimExec{Dir: t.TempDir(), Args: []string{AgentPath, "start"}, Stdin: []byte(`{"id":"ex_2"}`), Channel: dir, Stall: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	var pid, exit int
	lost := ""
	for ev := range sh.Events {
		switch {
		case ev.Pid > 0:
			pid = ev.Pid
		case ev.Exit != nil:
			exit = *ev.Exit
		case ev.Lost != "":
			lost = ev.Lost
		}
	}
	<-resetDone
	if lost != "" || pid != 9 || exit != 4 {
		t.Errorf("events: pid %d, exit %d, lost %q; want 9, 4, not lost (the request sent again)", pid, exit, lost)
	}
	select {
	case req := <-served:
		if string(req.Stdin) != `{"id":"ex_2"}` {
			t.Errorf("the request sent again: %+v", req)
		}
	default:
		t.Error("the live connection never got the request")
	}
}
