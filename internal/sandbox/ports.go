package sandbox

import (
	"context"

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
