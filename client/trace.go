package client

import (
	"context"
	"net/http"

	"sbx.dev/sbx/api"
)

type monitorOption struct{}

func (monitorOption) applyCreate(r *api.CreateRequest) { r.Monitor = true }
func (monitorOption) applyFork(f *forkConfig)          { f.req.Monitor = true }

// WithMonitoring turns on gVisor's runtime monitoring for a created
// sandbox, or for each child of a fork (its own trace from its restore
// on): sbxd keeps a bounded trace of the syscalls on files and sockets,
// the execs and the exits, read with Sandbox.Trace. Off by default; a
// stop and resume boots without it.
func WithMonitoring() SandboxOption { return monitorOption{} }

// WithForkCPUs gives a fork's children a CPU quota of their own (memory
// forks too), instead of the parent's.
func WithForkCPUs(n float64) ForkOption {
	return forkFunc(func(c *forkConfig) { c.req.CPUs = n })
}

// Trace returns what runtime monitoring kept of the sandbox: its events in
// the order they came, and counts of those dropped. An unknown sandbox is
// api.ErrNotFound; one not monitored api.ErrConflict.
func (s *Sandbox) Trace(ctx context.Context) (*api.Trace, error) {
	var tr api.Trace
	if err := s.c.call(ctx, http.MethodGet, s.path("trace"), nil, nil, &tr); err != nil {
		return nil, err
	}
	return &tr, nil
}
