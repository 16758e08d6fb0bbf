package netns

import (
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"sbx.dev/sbx/api"
)

func TestShapeCheck(t *testing.T) {
	for _, s := range []Shape{{Delay: -time.Millisecond}, {Delay: api.MaxNetDelay + 1}, {Loss: -0.1}, {Loss: 1}, {Loss: 2}} {
		if err := s.Check(); !errors.Is(err, ErrInvalid) {
			t.Errorf("Check(%+v) = %v, want ErrInvalid", s, err)
		}
	}
	for _, s := range []Shape{{}, {Delay: api.MaxNetDelay}, {Loss: 0.999}, {Delay: time.Millisecond, Loss: 0.5}} {
		if err := s.Check(); err != nil {
			t.Errorf("Check(%+v) = %v", s, err)
		}
	}
	m := newManager(t)
	if err := m.Shape("no_such", Shape{Delay: time.Millisecond}); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("Shape of a sandbox with no namespace: %v, want ErrNotExist", err)
	}
	if err := m.Shape("../x", Shape{}); !errors.Is(err, ErrInvalid) {
		t.Errorf("Shape of a bad id: %v, want ErrInvalid", err)
	}
}

// udpRound sends n numbered datagrams from the namespace at from to an
// echo server on addr and returns, for each that came back within wait,
// its round trip.
func udpRound(t *testing.T, from, addr string, n int, wait time.Duration) map[int]time.Duration {
	t.Helper()
	var c net.Conn
	if err := inNS(from, func() error {
		var err error
		c, err = net.Dial("udp4", addr)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	sent := make([]time.Time, n)
	for i := range n {
		sent[i] = time.Now()
		fmt.Fprintf(c, "%d", i)
		time.Sleep(2 * time.Millisecond) // pacing: each datagram's delay is measured from its own send
	}
	got := map[int]time.Duration{}
	c.SetReadDeadline(time.Now().Add(wait))
	buf := make([]byte, 64)
	for {
		k, err := c.Read(buf)
		if err != nil {
			return got
		}
		var i int
		if _, err := fmt.Sscanf(string(buf[:k]), "%d", &i); err == nil && i >= 0 && i < n {
			got[i] = time.Since(sent[i])
		}
	}
}

// udpEcho echoes every datagram to addr in the namespace at path.
func udpEcho(t *testing.T, path, addr string) string {
	t.Helper()
	var pc net.PacketConn
	if err := inNS(path, func() error {
		var err error
		pc, err = net.ListenPacket("udp4", addr)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pc.Close() })
	go func() {
		buf := make([]byte, 64)
		for {
			k, from, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			pc.WriteTo(buf[:k], from)
		}
	}()
	return pc.LocalAddr().String()
}

// TestShape: a delay holds every packet leaving the sandbox for at least
// that long and loses none; a loss drops about that share; the zero Shape
// takes both away, and so does the namespace's delete (no queue reader
// is left behind, nor a rule).
func TestShape(t *testing.T) {
	m := newManager(t)
	nw := create(t, m)
	out, addr := outside(t, m.tag)
	target := udpEcho(t, out, addr.String()+":0")

	const delay = 150 * time.Millisecond
	if err := m.Shape(nw.ID, Shape{Delay: delay}); err != nil {
		t.Fatal(err)
	}
	got := udpRound(t, nw.Path, target, 100, 3*time.Second)
	if len(got) != 100 {
		t.Errorf("with a delay of %s, %d of 100 datagrams came back, want all", delay, len(got))
	}
	for i, rtt := range got {
		if rtt < delay {
			t.Errorf("datagram %d came back after %s, under the delay of %s", i, rtt, delay)
		}
	}
	// a TCP connection too: its SYN is held
	ln := listen(t, out, addr.String()+":0")
	t0 := time.Now()
	c, err := dialFrom(nw.Path, ln.Addr().String())
	if err != nil {
		t.Fatalf("connect with a delay: %v", err)
	}
	if took := time.Since(t0); took < delay {
		t.Errorf("a connect with a delay of %s took %s", delay, took)
	}
	echo(t, c)

	// loss, and a delay changed in place
	if err := m.Shape(nw.ID, Shape{Delay: 20 * time.Millisecond, Loss: 0.9}); err != nil {
		t.Fatal(err)
	}
	got = udpRound(t, nw.Path, target, 200, 2*time.Second)
	if len(got) > 60 || len(got) == 0 {
		t.Errorf("with a loss of 0.9, %d of 200 datagrams came back: want about 20", len(got))
	}
	rules := shapeRulesOf(t, nw.Gateway)
	if !strings.Contains(rules, "statistic") || !strings.Contains(rules, "NFQUEUE") {
		t.Errorf("SBX-SHAPE with a delay and a loss:\n%s", rules)
	}

	// none
	if err := m.Shape(nw.ID, Shape{}); err != nil {
		t.Fatal(err)
	}
	if rules := shapeRulesOf(t, nw.Gateway); strings.Contains(rules, "-A "+shapeChain) {
		t.Errorf("SBX-SHAPE with no shape:\n%s", rules)
	}
	if got := udpRound(t, nw.Path, target, 50, 2*time.Second); len(got) != 50 {
		t.Errorf("with no shape, %d of 50 datagrams came back", len(got))
	}
	m.shapeMu.Lock()
	left := len(m.delayers)
	m.shapeMu.Unlock()
	if left != 0 {
		t.Errorf("%d queue readers left with no shape", left)
	}

	// a delete stops the reader of a shaped sandbox
	if err := m.Shape(nw.ID, Shape{Delay: delay}); err != nil {
		t.Fatal(err)
	}
	if err := m.Delete(nw.ID); err != nil {
		t.Fatal(err)
	}
	m.shapeMu.Lock()
	left = len(m.delayers)
	m.shapeMu.Unlock()
	if left != 0 {
		t.Errorf("%d queue readers left after the delete", left)
	}
}

// TestShapeWithoutReader: the rules outlive sbxd (a restart) in the
// gateway namespace, and a queue nobody reads is bypassed: the sandbox
// keeps its network, undelayed, until it is shaped again.
func TestShapeWithoutReader(t *testing.T) {
	m := newManager(t)
	nw := create(t, m)
	out, addr := outside(t, m.tag)
	target := udpEcho(t, out, addr.String()+":0")
	if err := m.Shape(nw.ID, Shape{Delay: 100 * time.Millisecond}); err != nil {
		t.Fatal(err)
	}
	// what a restart leaves: the rules, no reader
	m.unshape(nw.ID)
	if got := udpRound(t, nw.Path, target, 20, 2*time.Second); len(got) != 20 {
		t.Errorf("with the queue's reader gone, %d of 20 datagrams came back, want all", len(got))
	}
	if err := m.Shape(nw.ID, Shape{Delay: 100 * time.Millisecond}); err != nil {
		t.Fatal(err)
	}
	for i, rtt := range udpRound(t, nw.Path, target, 20, 2*time.Second) {
		if rtt < 100*time.Millisecond {
			t.Errorf("shaped again: datagram %d back after %s", i, rtt)
		}
	}
	if n := strings.Count(shapeRulesOf(t, nw.Gateway), "-A "+shapeChain); n != 1 {
		t.Errorf("shaped twice: %d rules, want 1", n)
	}
}

func shapeRulesOf(t *testing.T, gateway string) string {
	t.Helper()
	out, err := exec.Command("ip", "netns", "exec", filepath.Base(gateway), "iptables", "-w", "-S").CombinedOutput()
	if err != nil {
		t.Fatalf("iptables -S: %v: %s", err, out)
	}
	return string(out)
}

// TestShapeFlood: a sandbox flooding what it sends out cannot make sbxd
// hold more than its queue, nor read more than its rate: past them the
// packets go undelayed (and none is lost by the shaping itself).
func TestShapeFlood(t *testing.T) {
	m := newManager(t)
	nw := create(t, m)
	out, addr := outside(t, m.tag)
	var pc net.PacketConn
	if err := inNS(out, func() error {
		var err error
		pc, err = net.ListenPacket("udp4", addr.String()+":0")
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer pc.Close()
	pc.(*net.UDPConn).SetReadBuffer(8 << 20)
	if err := m.Shape(nw.ID, Shape{Delay: 2 * time.Second}); err != nil {
		t.Fatal(err)
	}
	const n = 50000
	var c net.Conn
	if err := inNS(nw.Path, func() error {
		var err error
		c, err = net.Dial("udp4", pc.LocalAddr().String())
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	// count what arrives before the delay, as it arrives
	start := time.Now()
	early := make(chan int)
	go func() {
		k := 0
		buf := make([]byte, 64)
		pc.SetReadDeadline(start.Add(2 * time.Second))
		for {
			if _, _, err := pc.ReadFrom(buf); err != nil {
				early <- k
				return
			}
			k++
		}
	}()
	for i := range n {
		fmt.Fprintf(c, "%d", i)
	}
	// what sbxd could not hold went at once (how much arrives depends on
	// how fast this busy machine reads a UDP socket: none is the failure)
	if k := <-early; k == 0 {
		t.Errorf("of a flood of %d datagrams under a 2 s delay, none came before the delay: want what passes the queue's bounds to go at once", n)
	}
	took := time.Since(start)
	m.shapeMu.Lock()
	d := m.delayers[nw.ID]
	m.shapeMu.Unlock()
	if held := len(d.held); held > shapeQueueLen {
		t.Errorf("sbxd holds %d packets, more than the queue's %d", held, shapeQueueLen)
	}
	// the limit's burst, its rate over the flood, and a second of slack
	if got, most := d.received.Load(), int64(shapeQueueLen)+10000*int64(took.Seconds()+1); got > most {
		t.Errorf("sbxd read %d packets of the flood in %s, past the limit (at most %d)", got, took, most)
	}
}
