package sandbox

import (
	"errors"
	"net"
	"os"
	"testing"
	"time"
)

// TestConnTable: the connections dialed into a sandbox end when it does;
// another sandbox's go on, and one closed by its user is forgotten.
func TestConnTable(t *testing.T) {
	var tab connTable
	pair := func(id string) (net.Conn, net.Conn) {
		a, b := net.Pipe()
		return tab.track(id, a), b
	}
	a1, peer1 := pair("sb_a")
	a2, _ := pair("sb_a")
	b1, peerB := pair("sb_b")
	defer peer1.Close()
	defer peerB.Close()
	a2.Close()
	if n := tab.count("sb_a"); n != 1 {
		t.Fatalf("sb_a: %d connections open, want 1 (one closed by its user)", n)
	}
	tab.closeAll("sb_a")
	a1.SetReadDeadline(time.Now().Add(time.Second))
	if _, err := a1.Read(make([]byte, 1)); err == nil || errors.Is(err, os.ErrDeadlineExceeded) {
		t.Errorf("a connection into a sandbox that ended: read %v, want it closed", err)
	}
	if n := tab.count("sb_a"); n != 0 {
		t.Errorf("sb_a: %d connections left after closeAll", n)
	}
	go peerB.Write([]byte("x"))
	b1.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := b1.Read(make([]byte, 1)); err != nil {
		t.Errorf("another sandbox's connection: %v", err)
	}
	a1.Close() // after closeAll: no panic, nothing to forget
	b1.Close()
	if n := tab.count("sb_b"); n != 0 {
		t.Errorf("sb_b: %d connections left", n)
	}
}
