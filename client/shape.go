package client

import (
	"time"

	"sbx.dev/sbx/api"
)

type shapeOption struct{ s *api.NetShape }

func (o shapeOption) applyCreate(r *api.CreateRequest) { r.Shape = o.s }
func (o shapeOption) applyFork(f *forkConfig)          { f.req.Shape = o.s }

// WithNetShape perturbs the traffic that leaves a created sandbox, or each
// child of a fork: every packet it sends out is held delay and dropped
// with probability loss (0 ≤ loss < 1). WithNetShape(0, 0) on a fork
// gives the children none, whatever the parent's; without the option a
// fork's children keep the parent's. sbxd refuses it for a sandbox with
// network "none", a delay past 10 s and a loss out of range.
func WithNetShape(delay time.Duration, loss float64) SandboxOption {
	return shapeOption{&api.NetShape{Delay: api.Duration(delay), Loss: loss}}
}
