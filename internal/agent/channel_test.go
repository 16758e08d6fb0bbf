package agent

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"sbx.dev/sbx/internal/wire/agentwire"
)

// channelPair is the two ends of one exec channel connection: host (the
// test, as sbxd) and init's, served by serveChannelConn with supervisor s
// in the test's process (nil: over init's socket).
func channelPair(t *testing.T, s *supervisor) (host net.Conn, served chan struct{}) {
	var link initLink = socketLink{}
	if s != nil {
		link = inProcess{s}
	}
	t.Helper()
	ln, err := net.Listen("unix", filepath.Join(t.TempDir(), "agent.sock"))
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	served = make(chan struct{})
	go func() {
		defer close(served)
		c, err := net.Dial("unix", ln.Addr().String())
		if err != nil {
			return
		}
		defer c.Close()
		serveChannelConn(c, link)
	}()
	host, err = ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { host.Close() })
	return host, served
}

// askChannel sends req on host and returns the frames that come back,
// without the pings before them, and how many pings there were.
func askChannel(t *testing.T, host net.Conn, req agentwire.ChannelRequest) (frames []byte, pings int) {
	t.Helper()
	line, err := json.Marshal(req)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := host.Write(append(line, '\n')); err != nil {
		t.Fatal(err)
	}
	_ = host.SetReadDeadline(time.Now().Add(20 * time.Second))
	b, err := io.ReadAll(host)
	if err != nil {
		t.Fatalf("read the frames: %v", err)
	}
	for len(b) > 0 && b[0] == agentwire.ChannelPing {
		b, pings = b[1:], pings+1
	}
	return b, pings
}

// askChannelLine sends line (a request, well formed or not) on a new
// channel connection and returns what comes back, without the pings.
func askChannelLine(t *testing.T, line string) []byte {
	t.Helper()
	host, _ := channelPair(t, nil)
	if _, err := io.WriteString(host, line+"\n"); err != nil {
		t.Fatal(err)
	}
	_ = host.SetReadDeadline(time.Now().Add(10 * time.Second))
	b, _ := io.ReadAll(bufio.NewReader(host))
	return bytes.TrimLeft(b, "\x00")
}

// TestChannelServesStart: a start on the channel is the start of `sbx-agent
// start`: the command's pid, output and exit code, as frames, and the
// connection closed after them; an idle connection pings while it waits.
func TestChannelServesStart(t *testing.T) {
	host, served := channelPair(t, startSupervisor(t))
	time.Sleep(3 * channelPing) // idle: pings come
	req, _ := json.Marshal(StartRequest{ID: newExecID(), Argv: []string{"sh", "-c", "echo out; echo err >&2; exit 3"}, Env: []string{"K=V"}})
	b, pings := askChannel(t, host, agentwire.ChannelRequest{Args: []string{"start"}, Stdin: req})
	stdout, stderr, pid, exit := decodeFrames(t, b)
	if stdout != "out\n" || stderr != "err\n" || exit != 3 || pid <= 0 {
		t.Errorf("over the channel: stdout %q, stderr %q, pid %d, exit %d; want out, err, a pid, 3", stdout, stderr, pid, exit)
	}
	if pings < 1 {
		t.Errorf("an idle connection sent %d pings in %s; want some (a capture's close is seen by them)", pings, 3*channelPing)
	}
	select {
	case <-served:
	case <-time.After(5 * time.Second):
		t.Fatal("the connection was not let go after its request")
	}
}

// TestChannelStartSentAgain: a start sent again (sbxd's, after a capture
// closed the first's connection before any frame) follows the command the
// first started, which runs once; a start of an id that was settled
// before it started is refused.
func TestChannelStartSentAgain(t *testing.T) {
	s := startSupervisor(t)
	dir := t.TempDir()
	id := newExecID()
	req, _ := json.Marshal(StartRequest{ID: id, Argv: []string{"sh", "-c", "echo ran >> " + dir + "/runs; echo out"}})
	var pids [2]int
	for i := range pids {
		host, _ := channelPair(t, s)
		b, _ := askChannel(t, host, agentwire.ChannelRequest{Args: []string{"start"}, Stdin: req})
		stdout, stderr, pid, exit := decodeFrames(t, b)
		if stdout != "out\n" || exit != 0 || pid <= 0 {
			t.Errorf("start %d of one id: stdout %q, stderr %q, pid %d, exit %d; want out, a pid, 0", i+1, stdout, stderr, pid, exit)
		}
		pids[i] = pid
	}
	if runs, _ := os.ReadFile(filepath.Join(dir, "runs")); string(runs) != "ran\n" || pids[0] != pids[1] {
		t.Errorf("two starts of one id: ran %q, pids %v; want once, one pid", runs, pids)
	}
	settledID := newExecID()
	s.settle(initRequest{Op: "settle", ID: settledID})
	req, _ = json.Marshal(StartRequest{ID: settledID, Argv: []string{"true"}})
	host, _ := channelPair(t, s)
	b, _ := askChannel(t, host, agentwire.ChannelRequest{Args: []string{"start"}, Stdin: req})
	if _, stderr, _, exit := decodeFrames(t, b); exit != ExitUsageExec || !strings.Contains(stderr, "given up") {
		t.Errorf("a start of a settled id: exit %d %q; want %d, given up", exit, stderr, ExitUsageExec)
	}
}

// TestChannelAttach: attach --framed follows a command started before, from
// offsets; attach without --framed, other subcommands, bad and oversized
// requests are refused with exit 125 and a word why.
func TestChannelAttach(t *testing.T) {
	s := startSupervisor(t)
	id := newExecID()
	var out bytes.Buffer
	Main([]string{"start"}, startReq(t, StartRequest{ID: id, Argv: []string{"sh", "-c", "echo one; sleep 0.3; echo two"}}), &out, io.Discard)
	host, _ := channelPair(t, s)
	b, _ := askChannel(t, host, agentwire.ChannelRequest{Args: []string{"attach", "--framed", "--id", id, "--stdout-offset", "4"}})
	if stdout, _, _, exit := decodeFrames(t, b); stdout != "two\n" || exit != 0 {
		t.Errorf("attach from offset 4: stdout %q, exit %d; want \"two\\n\", 0", stdout, exit)
	}
	for _, tc := range []struct {
		name string
		line string
		want string
	}{
		{"attach, not framed", `{"args":["attach","--id","` + id + `"]}`, "--framed"},
		{"another subcommand", `{"args":["rm","/"]}`, "not served"},
		{"no arguments", `{"args":[]}`, "bad request"},
		{"not JSON", `{"args":`, "bad request"},
		{"start with arguments", `{"args":["start","x"]}`, "no arguments"},
		{"too long", `{"args":["start"],"stdin":"` + strings.Repeat("A", agentwire.MaxChannelRequest) + `"}`, "longer than"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := askChannelLine(t, tc.line)
			_, stderr, _, exit := decodeFrames(t, b)
			if exit != ExitUsageExec || !strings.Contains(stderr, tc.want) {
				t.Errorf("%s: exit %d, stderr %q; want %d and %q", tc.name, exit, stderr, ExitUsageExec, tc.want)
			}
		})
	}
}

// TestChannelIdleClosed: a connection closed while idle (sbxd gone, a
// capture) ends its wait, so that init dials a new one.
func TestChannelIdleClosed(t *testing.T) {
	host, served := channelPair(t, nil)
	host.Close()
	select {
	case <-served:
	case <-time.After(5 * time.Second):
		t.Fatal("a closed idle connection is still waited on")
	}
}

// TestChannelKeepsInitSignals: serving the channel in init's process
// changes none of init's signal dispositions, which its commands inherit:
// a copier's own process ignores SIGPIPE, and an ignored signal survives
// exec, so a command init started after a channel request ignored it too
// (`yes | head -1` then never ended by SIGPIPE). Init catches SIGPIPE
// (ignoreOtherSignals), as this test does first.
func TestChannelKeepsInitSignals(t *testing.T) {
	c := make(chan os.Signal, 1)
	signal.Notify(c, syscall.SIGPIPE)
	t.Cleanup(func() { signal.Stop(c) })
	s := startSupervisor(t)
	for i := 0; i < 2; i++ {
		host, _ := channelPair(t, s)
		req, _ := json.Marshal(StartRequest{ID: newExecID(), Argv: []string{"grep", "^SigIgn:", "/proc/self/status"}})
		b, _ := askChannel(t, host, agentwire.ChannelRequest{Args: []string{"start"}, Stdin: req})
		stdout, stderr, _, exit := decodeFrames(t, b)
		f := strings.Fields(stdout)
		if exit != 0 || len(f) != 2 {
			t.Fatalf("request %d: %q %q exit %d", i+1, stdout, stderr, exit)
		}
		mask, err := strconv.ParseUint(f[1], 16, 64)
		if err != nil {
			t.Fatal(err)
		}
		if mask&(1<<(syscall.SIGPIPE-1)) != 0 {
			t.Errorf("request %d: the command's SigIgn %s has SIGPIPE: init's served channel ignored it", i+1, f[1])
		}
	}
}

// TestChannelPingPace: an idle connection pings every 200 ms only while
// the channel is warm (a request or a connection in the last 30 s), then
// seldom: at five pings a second on each of two connections, an idle
// sandbox used 30 times the CPU it used without the channel. A kick (a
// copier's connection to init's socket: an exec that found no live
// connection after a capture) makes it ping at once.
// resetPacer makes the shared pacer as new for a test: no kick made yet,
// none pending (a later kick an earlier test left would wake this one's
// connections when it fires).
func resetPacer(t *testing.T) {
	t.Helper()
	reset := func() {
		pacer.mu.Lock()
		defer pacer.mu.Unlock()
		if pacer.later != nil {
			pacer.later.Stop()
			pacer.later = nil
		}
		pacer.kicked = time.Time{}
	}
	reset()
	t.Cleanup(reset)
}

func TestChannelPingPace(t *testing.T) {
	resetPacer(t)
	oldIdle := channelPingIdle
	channelPingIdle = time.Hour
	t.Cleanup(func() { channelPingIdle = oldIdle })
	pings := func(host net.Conn, within time.Duration, first bool) int {
		t.Helper()
		_ = host.SetReadDeadline(time.Now().Add(within))
		defer host.SetReadDeadline(time.Time{})
		n := 0
		b := make([]byte, 64)
		for {
			k, err := host.Read(b)
			for _, x := range b[:k] {
				if x != agentwire.ChannelPing {
					t.Fatalf("an idle connection sent %q, not a ping", x)
				}
			}
			n += k
			if err != nil || (first && n > 0) {
				return n
			}
		}
	}

	// warm: a new connection pings at once, and every channelPing
	pacer.touch()
	host, _ := channelPair(t, nil)
	if n := pings(host, channelPing*5/2, false); n < 2 || n > 4 {
		t.Errorf("a warm connection sent %d pings in %v, want 2 or 3 (one every %v)", n, channelPing*5/2, channelPing)
	}

	// cold: none for as long as the test looks, until a kick
	pacer.mu.Lock()
	pacer.active = time.Now().Add(-2 * channelWarm)
	pacer.mu.Unlock()
	pings(host, channelPing+300*time.Millisecond, false) // the warm wait under way ends
	if n := pings(host, 1500*time.Millisecond, false); n != 0 {
		t.Errorf("a connection of a channel cold for %v sent %d pings in 1.5 s, want none", 2*channelWarm, n)
	}
	pacer.mu.Lock()
	pacer.active = time.Now().Add(-2 * channelWarm)
	pacer.kicked = time.Time{}
	pacer.mu.Unlock()
	pacer.kick()
	if n := pings(host, 10*time.Second, true); n == 0 {
		t.Error("a kick did not make the idle connection ping")
	}
}

// blockingRead is a /proc/gvisor/checkpoint that says result once release
// is closed.
type blockingRead struct {
	release <-chan struct{}
	result  string
}

func (b blockingRead) Read(p []byte) (int, error) {
	<-b.release
	return copy(p, b.result), nil
}
func (blockingRead) Close() error { return nil }

// As each checkpoint of the sandbox ends, the channel is kicked: its idle
// connections ping at once, and those the save closed are replaced before
// the first exec after a resume or a fork looks for one. The watch ends
// when the file cannot be opened (not gVisor).
func TestKickAtCaptures(t *testing.T) {
	resetPacer(t)
	releases := make(chan chan struct{}, 4)
	opens := 0
	done := make(chan struct{})
	open := func() (io.ReadCloser, error) {
		opens++
		if opens > 2 {
			return nil, errors.New("no such file")
		}
		r := make(chan struct{})
		releases <- r
		return blockingRead{release: r, result: "restore\n"}, nil
	}
	pacer.mu.Lock()
	pacer.kicked = time.Time{}
	wake := pacer.wake
	pacer.mu.Unlock()
	go func() { kickAtCaptures(open); close(done) }()
	r := <-releases
	select {
	case <-wake:
		t.Fatal("kicked before any checkpoint ended")
	case <-time.After(50 * time.Millisecond):
	}
	close(r) // a checkpoint ends
	select {
	case <-wake:
	case <-time.After(5 * time.Second):
		t.Fatal("the end of a checkpoint did not kick the channel")
	}
	close(<-releases) // the second file, opened for the next one
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("the watch did not end when the file could not be opened")
	}
	if opens != 3 {
		t.Errorf("opened the checkpoint file %d times, want once per checkpoint and a last failing one (3)", opens)
	}
}

// A kick within channelKickEvery of the last is made when that time is up,
// not dropped: two captures in a row (a snapshot, then a fork) close the
// connections twice, and those the second closed are replaced at once too
// rather than at the next ping. Kicks in between make one wake, not many.
func TestKickTooSoonIsMadeLater(t *testing.T) {
	resetPacer(t)
	pacer.mu.Lock()
	pacer.kicked = time.Time{}
	first := pacer.wake
	pacer.mu.Unlock()
	pacer.kick()
	select {
	case <-first:
	default:
		t.Fatal("a first kick did not wake the connections at once")
	}
	pacer.mu.Lock()
	second := pacer.wake
	pacer.mu.Unlock()
	start := time.Now()
	pacer.kick()
	pacer.kick()
	select {
	case <-second:
		t.Fatal("a kick right after another woke the connections at once (at most one wake every channelKickEvery)")
	default:
	}
	select {
	case <-second:
	case <-time.After(5 * time.Second):
		t.Fatal("a kick right after another was dropped, not made later")
	}
	if waited := time.Since(start); waited < channelKickEvery/2 {
		t.Errorf("the later kick came after %v, want about channelKickEvery (%v)", waited, channelKickEvery)
	}
	pacer.mu.Lock()
	third, later := pacer.wake, pacer.later
	pacer.mu.Unlock()
	if later != nil {
		t.Error("a later kick is still pending after it was made: the two kicks made two")
	}
	select {
	case <-third:
		t.Error("the two kicks in a row woke the connections twice after the first")
	case <-time.After(2 * channelKickEvery):
	}
}

// A kick cuts short a connection loop's wait between failed dials: a
// restarted sbxd listens again at its first exec, whose copier kicks the
// channel, and the loop, backed off to seconds while nobody listened,
// dials at once rather than at its next try.
func TestKickCutsDialBackoff(t *testing.T) {
	resetPacer(t)
	path := filepath.Join(t.TempDir(), "agent.sock")
	go channelLoop(path, nil)
	time.Sleep(1500 * time.Millisecond) // failed dials: the loop waits 1.6 s or more now
	ln, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	pacer.kick()
	got := make(chan net.Conn, 1)
	go func() {
		if c, err := ln.Accept(); err == nil {
			got <- c
		}
	}()
	select {
	case c := <-got:
		c.Close()
	case <-time.After(700 * time.Millisecond):
		t.Error("a kick did not make a loop backed off between failed dials dial at once")
	}
	ln.Close()
	os.Remove(path)
}

// kickingConn is init's end of a channel connection whose pings are where
// a save ends: each ping written kicks the channel, as kickAtCaptures does
// when a save ends as the ping goes.
type kickingConn struct {
	net.Conn
}

func (c kickingConn) Write(b []byte) (int, error) {
	if len(b) == 1 && b[0] == agentwire.ChannelPing {
		pacer.mu.Lock()
		pacer.kicked = time.Time{} // not rate-limited: a save, long after the last
		pacer.mu.Unlock()
		pacer.kick()
	}
	return c.Conn.Write(b)
}

// TestKickDuringPingIsKept: a save that ends while an idle connection pings
// (its kick comes after the wait's timeout and before the ping is written)
// makes the connection ping again at once: that save may have closed it
// after the ping went. The kick the next wait watches was taken after the
// ping, and this kick was lost: the connection waited for its next ping
// (an hour here).
func TestKickDuringPingIsKept(t *testing.T) {
	resetPacer(t)
	oldPing, oldIdle := channelPing, channelPingIdle
	channelPing, channelPingIdle = time.Hour, time.Hour
	t.Cleanup(func() { channelPing, channelPingIdle = oldPing, oldIdle })

	host, initEnd := net.Pipe()
	t.Cleanup(func() { host.Close(); initEnd.Close() })
	_, wake := pacer.next() // taken before the wait starts, so the kick below is its
	go waitChannelRequest(kickingConn{initEnd}, nil, wake)

	pacer.kick() // the first ping: a save's end
	b := make([]byte, 1)
	for i := 0; i < 2; i++ {
		_ = host.SetReadDeadline(time.Now().Add(10 * time.Second))
		if _, err := io.ReadFull(host, b); err != nil || b[0] != agentwire.ChannelPing {
			t.Fatalf("ping %d: %q, %v; want a ping (the kick at ping %d lost: the next ping an hour away)", i+1, b, err, i)
		}
	}
}

// TestKickBeforeDialIsKept: a kick taken before a dial (a save that ended
// between the dial and the wait) makes the new connection ping at once.
func TestKickBeforeDialIsKept(t *testing.T) {
	resetPacer(t)
	oldPing, oldIdle := channelPing, channelPingIdle
	channelPing, channelPingIdle = time.Hour, time.Hour
	t.Cleanup(func() { channelPing, channelPingIdle = oldPing, oldIdle })

	_, wake := pacer.next() // before the dial
	pacer.kick()            // the save ends
	host, initEnd := net.Pipe()
	t.Cleanup(func() { host.Close(); initEnd.Close() })
	go waitChannelRequest(initEnd, nil, wake)
	_ = host.SetReadDeadline(time.Now().Add(10 * time.Second))
	b := make([]byte, 1)
	if _, err := io.ReadFull(host, b); err != nil || b[0] != agentwire.ChannelPing {
		t.Fatalf("%q, %v; want a ping at once: the kick between the dial and the wait was lost", b, err)
	}
}
