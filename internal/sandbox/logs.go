package sandbox

import (
	"context"

	"sbx.dev/sbx/api"
)

// Logs streams one of a sandbox's logs (not yet implemented beyond exec/ID).
func (m *Manager) Logs(ctx context.Context, ref, stream string, follow bool, tail int, emit func(api.LogEvent) error) error {
	return api.Errorf(api.ErrUnavailable, "log streams are not implemented yet; use sbx logs ID --exec EXEC_ID")
}

// Metrics reports a sandbox's resource use (not yet implemented).
func (m *Manager) Metrics(ctx context.Context, ref string) (*api.Metrics, error) {
	return nil, api.Errorf(api.ErrUnavailable, "metrics are not implemented yet")
}
