package sandbox

import (
	"sbx.dev/sbx/api"
	"sbx.dev/sbx/internal/runsc"
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
