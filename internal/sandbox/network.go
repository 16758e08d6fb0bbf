package sandbox

import (
	"strings"
	"time"

	"sbx.dev/sbx/api"
	"sbx.dev/sbx/internal/netns"
	"sbx.dev/sbx/internal/runsc"
	"sbx.dev/sbx/internal/store"
)

// NetworkNone is the network mode of a sandbox without a network: runsc
// gives it loopback only, in a namespace of its own; sbx makes none for it.
const NetworkNone = runsc.NetworkNone

// checkNetwork checks a create request's network mode.
func checkNetwork(mode string) error {
	if mode != "" && mode != NetworkNone {
		return api.Errorf(api.ErrInvalid, "network: %q is not a network mode; want %q (no network) or leave it out (NAT egress)", mode, NetworkNone)
	}
	return nil
}

// parseShape checks a request's shaping of a sandbox's traffic (nil:
// none) for a sandbox of the network mode network.
func parseShape(sh *api.NetShape, network string) (time.Duration, float64, error) {
	if sh == nil {
		return 0, 0, nil
	}
	s := netns.Shape{Delay: sh.Delay.D(), Loss: sh.Loss}
	if err := s.Check(); err != nil {
		return 0, 0, api.Errorf(api.ErrInvalid, "netShape: %s", strings.TrimSuffix(err.Error(), ": "+netns.ErrInvalid.Error()))
	}
	if !s.Zero() && network == NetworkNone {
		return 0, 0, api.Errorf(api.ErrInvalid, "netShape: a sandbox with network %q sends nothing out to shape", NetworkNone)
	}
	return s.Delay, s.Loss, nil
}

// shapeOf is sb's shaping as the API tells it (nil: none).
func shapeOf(sb *store.Sandbox) *api.NetShape {
	if sb.NetDelay == 0 && sb.NetLoss == 0 {
		return nil
	}
	return &api.NetShape{Delay: api.Duration(sb.NetDelay), Loss: sb.NetLoss}
}

// applyShape shapes sb's traffic as its record says, in its network
// namespace (which must exist); a sandbox with no shaping is left alone.
func (m *Manager) applyShape(sb *store.Sandbox) error {
	if sb.NetDelay == 0 && sb.NetLoss == 0 || sb.Network == NetworkNone {
		return nil
	}
	return m.cfg.Networks.Shape(sb.ID, netns.Shape{Delay: sb.NetDelay, Loss: sb.NetLoss})
}
