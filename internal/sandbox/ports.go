package sandbox

import (
	"context"
	"net"

	"sbx.dev/sbx/api"
)

// Ports lists the TCP ports listening inside a running sandbox (the agent
// reads the sandbox's /proc). Inspection: not activity.
func (m *Manager) Ports(ctx context.Context, ref string) ([]api.Port, error) {
	out, err := m.inspect(ctx, ref, "ports")
	if err != nil {
		return nil, err
	}
	ps, err := decodeList[api.Port](out, maxAnswerEntries, "ports")
	if err != nil {
		return nil, err
	}
	if ps == nil {
		ps = []api.Port{}
	}
	return ps, nil
}

// Dial connects to a TCP port inside a running sandbox, from its gateway
// namespace. The caller accounts for activity (Lease). The connection ends
// when the sandbox stops or is deleted.
func (m *Manager) Dial(ctx context.Context, ref string, port int) (net.Conn, error) {
	if port < 1 || port > 65535 {
		return nil, api.Errorf(api.ErrInvalid, "port: %d is not a TCP port", port)
	}
	sb, err := m.running(ctx, ref)
	if err != nil {
		return nil, err
	}
	if sb.Network == NetworkNone {
		return nil, api.Errorf(api.ErrConflict, "sandbox %s has no network (network %q): nothing outside it can reach its ports", sb.ID, NetworkNone)
	}
	c, err := m.cfg.Networks.Dial(ctx, sb.ID, port)
	if err != nil {
		return nil, err
	}
	return m.conns.track(sb.ID, c), nil
}
