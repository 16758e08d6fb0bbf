package netns

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"os"
)

// Dial opens a TCP connection to InsideAddr:port of sandbox id from inside
// its gateway namespace, the only place that address routes to that
// sandbox. It errors wrapping os.ErrNotExist if the gateway namespace is
// absent, and ErrInvalid on a bad id or port.
func (m *Manager) Dial(ctx context.Context, id string, port int) (net.Conn, error) {
	if err := checkID(id); err != nil {
		return nil, fmt.Errorf("dial %s:%d: %w", id, port, err)
	}
	if port < 1 || port > 65535 {
		return nil, fmt.Errorf("dial %s:%d: port: %w", id, port, ErrInvalid)
	}
	_, gPath := m.paths(id)
	if _, err := os.Stat(gPath); err != nil {
		return nil, fmt.Errorf("dial %s:%d: %w", id, port, err)
	}
	addr := netip.AddrPortFrom(InsideAddr.Addr(), uint16(port)).String()
	var conn net.Conn
	// a socket stays in the namespace it was made in, whatever thread uses it later
	err := inNS(gPath, func() error {
		var d net.Dialer
		var err error
		conn, err = d.DialContext(ctx, "tcp4", addr)
		return err
	})
	if err != nil {
		if conn != nil {
			conn.Close()
		}
		return nil, fmt.Errorf("dial %s:%d: %w", id, port, err)
	}
	return conn, nil
}
