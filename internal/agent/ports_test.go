package agent

import (
	"encoding/binary"
	"encoding/json"
	"net"
	"os"
	"testing"
)

func TestPortsFindsListener(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	port := ln.Addr().(*net.TCPAddr).Port

	code, stdout, stderr := run(t, nil, "ports")
	if code != 0 {
		t.Fatalf("exit code %d: %s", code, stderr)
	}
	var ports []Port
	if err := json.Unmarshal([]byte(stdout), &ports); err != nil {
		t.Fatal(err)
	}
	for _, p := range ports {
		if p.Port != port {
			continue
		}
		want := Port{Proto: "tcp", Address: "127.0.0.1", Port: port, Pid: os.Getpid(), Command: p.Command}
		if p != want {
			t.Errorf("got %+v, want %+v", p, want)
		}
		if p.Command == "" {
			t.Errorf("command is empty")
		}
		return
	}
	t.Errorf("port %d not in %s", port, stdout)
}

func TestParseSockAddr(t *testing.T) {
	// the kernel prints each 32-bit word as it sits in memory, read as a
	// host-order number; these cases are written for the host's order
	word := func(b [4]byte) string {
		var s string
		for _, x := range binary.BigEndian.AppendUint32(nil, binary.NativeEndian.Uint32(b[:])) {
			s += string("0123456789ABCDEF"[x>>4]) + string("0123456789ABCDEF"[x&15])
		}
		return s
	}
	zero := word([4]byte{})
	tests := []struct {
		name, in string
		addr     string
		port     int
		ok       bool
	}{
		{"ipv4 loopback", word([4]byte{127, 0, 0, 1}) + ":1F90", "127.0.0.1", 8080, true},
		{"ipv4 any", zero + ":0016", "0.0.0.0", 22, true},
		{"ipv6 loopback", zero + zero + zero + word([4]byte{0, 0, 0, 1}) + ":0050", "::1", 80, true},
		{"bad hex", "ZZ:0050", "", 0, false},
		{"no port", zero, "", 0, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			addr, port, ok := parseSockAddr(tc.in)
			if addr != tc.addr || port != tc.port || ok != tc.ok {
				t.Errorf("parseSockAddr(%q) = %q, %d, %v; want %q, %d, %v", tc.in, addr, port, ok, tc.addr, tc.port, tc.ok)
			}
		})
	}
}
