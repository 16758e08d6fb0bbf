package netns

import (
	"errors"
	"fmt"
	"net"
	"net/netip"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// Reset gives sandbox id's eth0 back the address and default route a
// sandbox boots with, and brings it up. runsc --network=sandbox moves
// them from the namespace into the sandbox's own stack, so after a runsc
// sandbox of this namespace is gone (a stop), the next one (a resume) would
// find eth0 bare and come up with loopback only. It is idempotent, and a
// no-op on a namespace whose eth0 is already configured.
func (m *Manager) Reset(id string) error {
	if err := checkID(id); err != nil {
		return fmt.Errorf("reset network %s: %w", id, err)
	}
	sPath, _ := m.paths(id)
	err := withHandle(sPath, func(h *netlink.Handle) error {
		l, err := h.LinkByName(sandboxIf)
		if err != nil {
			return fmt.Errorf("find %s: %w", sandboxIf, err)
		}
		if err := h.AddrAdd(l, &netlink.Addr{IPNet: ipNet(InsideAddr)}); err != nil && !errors.Is(err, unix.EEXIST) {
			return fmt.Errorf("address %s on %s: %w", InsideAddr, sandboxIf, err)
		}
		if err := h.LinkSetUp(l); err != nil {
			return fmt.Errorf("set %s up: %w", sandboxIf, err)
		}
		r := &netlink.Route{LinkIndex: l.Attrs().Index, Dst: defaultDst(), Gw: GatewayAddr.AsSlice()}
		if err := h.RouteReplace(r); err != nil {
			return fmt.Errorf("default route via %s on %s: %w", GatewayAddr, sandboxIf, err)
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("reset network %s: %w", id, err)
	}
	return nil
}

func defaultDst() *net.IPNet {
	return ipNet(netip.PrefixFrom(netip.IPv4Unspecified(), 0))
}
