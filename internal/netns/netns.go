// Package netns gives each sandbox its own network namespace.
//
// A sandbox lives in namespace S (sbx-<tag>-<id>) that holds only lo and eth0,
// because runsc --network=sandbox takes over every interface there that is up
// and has an address. eth0 is one end of a veth whose other end, gw0, sits in
// a gateway namespace G (sbx-<tag>-<id>-gw). G routes and masquerades to the
// root namespace over a second veth (up0 in G, sbx<tag><n> in the root
// namespace) addressed from a /30 of the pool. Every sandbox sees the same
// inside address, so a memory snapshot restores into any fresh namespace.
package netns

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"sync"

	"github.com/vishvananda/netlink"
)

// Addresses every sandbox sees, whatever namespace it runs in.
var (
	// InsideAddr is eth0's address inside the sandbox.
	InsideAddr = netip.MustParsePrefix("10.88.0.2/30")
	// GatewayAddr is gw0's address in the gateway namespace: the sandbox's default route.
	GatewayAddr = netip.MustParseAddr("10.88.0.1")
)

const (
	runDir         = "/run/netns" // where ip netns keeps named namespaces
	defaultLock    = "/run/sbx/net.lock"
	sandboxIf      = "eth0"
	gatewayIf      = "gw0"
	uplinkIf       = "up0"
	gatewaySuffix  = "-gw"
	hostIfPrefix   = "sbx" // every daemon's host-side veths start with this; rules match sbx+
	maxIfName      = 15
	minPoolBits    = 8 // keeps sbx<tag><n> within 15 characters
	maxPoolBits    = 30
	outerPrefixLen = 30
)

var (
	defaultPool = netip.MustParsePrefix("10.201.0.0/16")
	tagRE       = regexp.MustCompile(`^[a-z0-9]{4}$`)
	idRE        = regexp.MustCompile(`^[A-Za-z0-9_]{1,64}$`)

	// fixed MACs: every sandbox sees the same link, like it sees the same address
	sandboxMAC = net.HardwareAddr{0x02, 0x88, 0x00, 0x00, 0x00, 0x02}
	gatewayMAC = net.HardwareAddr{0x02, 0x88, 0x00, 0x00, 0x00, 0x01}
)

// ErrInvalid is wrapped by errors about a bad tag, pool or sandbox id.
var ErrInvalid = errors.New("invalid")

// Config configures a Manager.
type Config struct {
	Tag      string       // 4 chars [a-z0-9]; names everything this daemon makes
	Pool     netip.Prefix // outer addresses; zero value = 10.201.0.0/16
	LockPath string       // zero = /run/sbx/net.lock
	// EgressAllow and EgressDeny widen and narrow what every sandbox of
	// this daemon reaches (see chainRules): IPv4 prefixes, the most
	// specific winning.
	EgressAllow, EgressDeny []netip.Prefix
}

// Manager creates, finds and deletes the namespaces of one daemon (one tag).
// Its methods are safe for concurrent use; allocation is serialized across
// daemons by a file lock.
type Manager struct {
	tag      string
	pool     netip.Prefix
	lockPath string
	egress   []egressRule

	shapeMu  sync.Mutex
	delayers map[string]*delayer // by sandbox id: the queue readers of Shape
}

// Network is the networking of one sandbox.
type Network struct {
	ID      string       // the sandbox id
	Path    string       // /run/netns/sbx-<tag>-<id>: what goes in the OCI spec
	Gateway string       // /run/netns/sbx-<tag>-<id>-gw
	HostIf  string       // root-namespace interface name
	Outer   netip.Prefix // the /30 of up0 and HostIf
}

// New returns a Manager for cfg. It errors (wrapping ErrInvalid) on a bad tag,
// pool or egress rule; it touches no kernel state.
func New(cfg Config) (*Manager, error) {
	if !tagRE.MatchString(cfg.Tag) {
		return nil, fmt.Errorf("netns: tag %q: %w: want 4 characters [a-z0-9]", cfg.Tag, ErrInvalid)
	}
	pool := cfg.Pool
	if !pool.IsValid() {
		pool = defaultPool
	}
	if !pool.Addr().Is4() || pool.Bits() < minPoolBits || pool.Bits() > maxPoolBits {
		return nil, fmt.Errorf("netns: pool %s: %w: want an IPv4 prefix from /%d to /%d", pool, ErrInvalid, minPoolBits, maxPoolBits)
	}
	lock := cfg.LockPath
	if lock == "" {
		lock = defaultLock
	}
	egress, err := egressRules(cfg.EgressAllow, cfg.EgressDeny)
	if err != nil {
		return nil, fmt.Errorf("netns: %w", err)
	}
	return &Manager{tag: cfg.Tag, pool: pool.Masked(), lockPath: lock, egress: egress}, nil
}

func (m *Manager) nsName(id string) string { return "sbx-" + m.tag + "-" + id }

func (m *Manager) paths(id string) (sandbox, gateway string) {
	name := m.nsName(id)
	return filepath.Join(runDir, name), filepath.Join(runDir, name+gatewaySuffix)
}

func (m *Manager) hostIf(index int) string { return fmt.Sprintf("%s%s%d", hostIfPrefix, m.tag, index) }

func checkID(id string) error {
	if !idRE.MatchString(id) {
		return fmt.Errorf("sandbox id %q: %w: want 1 to 64 characters [A-Za-z0-9_]", id, ErrInvalid)
	}
	return nil
}

// Create makes the namespaces, veths, addresses, routes and NAT of sandbox id
// and returns them. It is all or nothing: on error it removes what it made.
// It errors wrapping os.ErrExist if id already has a namespace, and ErrInvalid
// on a bad id.
func (m *Manager) Create(id string) (_ *Network, err error) {
	if err := checkID(id); err != nil {
		return nil, fmt.Errorf("create network %s: %w", id, err)
	}
	sPath, gPath := m.paths(id)
	nss, err := newNamed(sPath, gPath)
	if err != nil {
		return nil, fmt.Errorf("create network %s: %w", id, err)
	}
	s, g := nss[0], nss[1]
	defer s.close()
	defer g.close()
	defer func() {
		if err == nil {
			return
		}
		// deleting up0 also deletes its host-side peer, freeing the /30 at once
		if l, lerr := g.nl.LinkByName(uplinkIf); lerr == nil {
			g.nl.LinkDel(l)
		}
		removeNamed(sPath)
		removeNamed(gPath)
	}()

	// inside link: S/eth0 <-> G/gw0
	eth0 := &netlink.Veth{
		LinkAttrs:        netlink.LinkAttrs{Name: sandboxIf, HardwareAddr: sandboxMAC},
		PeerName:         gatewayIf,
		PeerHardwareAddr: gatewayMAC,
		PeerNamespace:    netlink.NsFd(g.fd),
	}
	if err := s.nl.LinkAdd(eth0); err != nil {
		return nil, fmt.Errorf("create network %s: add veth %s/%s: %w", id, sandboxIf, gatewayIf, err)
	}
	if err := configure(s.nl, sandboxIf, InsideAddr, GatewayAddr); err != nil {
		return nil, fmt.Errorf("create network %s: %w", id, err)
	}
	if err := configure(g.nl, gatewayIf, netip.PrefixFrom(GatewayAddr, InsideAddr.Bits()), netip.Addr{}); err != nil {
		return nil, fmt.Errorf("create network %s: %w", id, err)
	}

	// outer link: G/up0 <-> root/sbx<tag><n>
	hostIf, outer, err := m.attachUplink(g.fd)
	if err != nil {
		return nil, fmt.Errorf("create network %s: %w", id, err)
	}
	host := outer.Addr().Next()
	up := netip.PrefixFrom(host.Next(), outer.Bits())
	if err := configure(g.nl, uplinkIf, up, host); err != nil {
		return nil, fmt.Errorf("create network %s: %w", id, err)
	}
	// the end of a veth that went up first transmits nothing until the kernel's
	// link watch activates its queue, which may lag; RTM_GETLINK does that now
	for _, l := range []struct {
		h    *netlink.Handle
		name string
	}{{s.nl, sandboxIf}, {g.nl, gatewayIf}, {g.nl, uplinkIf}, {&netlink.Handle{}, hostIf}} {
		if _, err := l.h.LinkByName(l.name); err != nil {
			return nil, fmt.Errorf("create network %s: sync %s: %w", id, l.name, err)
		}
	}
	if err := inNS(gPath, func() error {
		t, err := ipt()
		if err != nil {
			return err
		}
		return t.Append("nat", "POSTROUTING", "-o", uplinkIf, "-j", "MASQUERADE")
	}); err != nil {
		return nil, fmt.Errorf("create network %s: gateway nat: %w", id, err)
	}
	return &Network{ID: id, Path: sPath, Gateway: gPath, HostIf: hostIf, Outer: outer}, nil
}

// configure gives link name in h's namespace the address addr, brings it up
// and, if gw is valid, routes by default via gw.
func configure(h *netlink.Handle, name string, addr netip.Prefix, gw netip.Addr) error {
	l, err := h.LinkByName(name)
	if err != nil {
		return fmt.Errorf("find %s: %w", name, err)
	}
	if err := h.AddrAdd(l, &netlink.Addr{IPNet: ipNet(addr)}); err != nil {
		return fmt.Errorf("address %s on %s: %w", addr, name, err)
	}
	if err := h.LinkSetUp(l); err != nil {
		return fmt.Errorf("set %s up: %w", name, err)
	}
	if gw.IsValid() {
		r := &netlink.Route{LinkIndex: l.Attrs().Index, Gw: gw.AsSlice()}
		if err := h.RouteAdd(r); err != nil {
			return fmt.Errorf("default route via %s on %s: %w", gw, name, err)
		}
	}
	return nil
}

func ipNet(p netip.Prefix) *net.IPNet {
	return &net.IPNet{IP: p.Addr().AsSlice(), Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen())}
}

// Get rebuilds sandbox id's Network from kernel state, as after a daemon
// restart. It errors wrapping os.ErrNotExist if either namespace is absent or
// the gateway has no uplink address.
func (m *Manager) Get(id string) (*Network, error) {
	if err := checkID(id); err != nil {
		return nil, fmt.Errorf("get network %s: %w", id, err)
	}
	sPath, gPath := m.paths(id)
	for _, p := range []string{sPath, gPath} {
		if _, err := os.Stat(p); err != nil {
			return nil, fmt.Errorf("get network %s: %w", id, err)
		}
	}
	var up netip.Prefix
	err := withHandle(gPath, func(h *netlink.Handle) error {
		l, err := h.LinkByName(uplinkIf)
		if err != nil {
			if errors.As(err, &netlink.LinkNotFoundError{}) {
				return fmt.Errorf("%s: %w", uplinkIf, os.ErrNotExist)
			}
			return err
		}
		addrs, err := h.AddrList(l, netlink.FAMILY_V4)
		if err != nil {
			return err
		}
		for _, a := range addrs {
			if p, ok := prefixOf(a.IPNet); ok {
				up = p
				return nil
			}
		}
		return fmt.Errorf("address of %s: %w", uplinkIf, os.ErrNotExist)
	})
	if err != nil {
		return nil, fmt.Errorf("get network %s: gateway: %w", id, err)
	}
	outer := up.Masked()
	host := outer.Addr().Next()
	hostIf, err := linkWithAddr(host)
	if err != nil {
		return nil, fmt.Errorf("get network %s: host side %s: %w", id, host, err)
	}
	return &Network{ID: id, Path: sPath, Gateway: gPath, HostIf: hostIf, Outer: outer}, nil
}

// Rearm gives sandbox id's eth0 back the address and default route that
// runsc took from it when the sandbox last started (runsc --network=sandbox
// moves them into the sandbox and removes them from the namespace, and
// skips an interface without an address): a sandbox restored or booted
// again in the same namespace, a resume, then has its network again. Call
// it only while no runsc sandbox uses the namespace. It is idempotent; a
// missing namespace is an error wrapping os.ErrNotExist.
func (m *Manager) Rearm(id string) error {
	if err := checkID(id); err != nil {
		return fmt.Errorf("rearm network %s: %w", id, err)
	}
	sPath, _ := m.paths(id)
	if _, err := os.Stat(sPath); err != nil {
		return fmt.Errorf("rearm network %s: %w", id, err)
	}
	err := withHandle(sPath, func(h *netlink.Handle) error {
		l, err := h.LinkByName(sandboxIf)
		if err != nil {
			return err
		}
		addrs, err := h.AddrList(l, netlink.FAMILY_V4)
		if err != nil {
			return err
		}
		has := false
		for _, a := range addrs {
			if p, ok := prefixOf(a.IPNet); ok && p == InsideAddr {
				has = true
			}
		}
		if !has {
			if err := h.AddrAdd(l, &netlink.Addr{IPNet: ipNet(InsideAddr)}); err != nil {
				return fmt.Errorf("address %s on %s: %w", InsideAddr, sandboxIf, err)
			}
		}
		if err := h.LinkSetUp(l); err != nil {
			return err
		}
		routes, err := h.RouteList(l, netlink.FAMILY_V4)
		if err != nil {
			return err
		}
		for _, r := range routes {
			if isDefault(r) && r.Gw != nil && r.Gw.Equal(GatewayAddr.AsSlice()) {
				return nil
			}
		}
		if err := h.RouteAdd(&netlink.Route{LinkIndex: l.Attrs().Index, Gw: GatewayAddr.AsSlice()}); err != nil {
			return fmt.Errorf("default route via %s: %w", GatewayAddr, err)
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("rearm network %s: %w", id, err)
	}
	return nil
}

// isDefault reports whether r is a default route (netlink gives its
// destination as nil or as 0.0.0.0/0, depending on the version).
func isDefault(r netlink.Route) bool {
	if r.Dst == nil {
		return true
	}
	ones, _ := r.Dst.Mask.Size()
	return ones == 0 && r.Dst.IP.IsUnspecified()
}

// linkWithAddr names the root-namespace link that has address a.
func linkWithAddr(a netip.Addr) (string, error) {
	addrs, err := addrList()
	if err != nil {
		return "", err
	}
	for _, ad := range addrs {
		if p, ok := prefixOf(ad.IPNet); ok && p.Addr() == a {
			l, err := netlink.LinkByIndex(ad.LinkIndex)
			if err != nil {
				return "", err
			}
			return l.Attrs().Name, nil
		}
	}
	return "", os.ErrNotExist
}

func prefixOf(n *net.IPNet) (netip.Prefix, bool) {
	if n == nil {
		return netip.Prefix{}, false
	}
	a, ok := netip.AddrFromSlice(n.IP)
	if !ok {
		return netip.Prefix{}, false
	}
	a = a.Unmap()
	if !a.Is4() {
		return netip.Prefix{}, false
	}
	ones, bits := n.Mask.Size()
	if bits != 32 {
		return netip.Prefix{}, false
	}
	return netip.PrefixFrom(a, ones), true
}

// Delete removes sandbox id's namespaces and veths. It is idempotent: missing
// pieces are fine. A namespace some process still holds (a running runsc)
// lives on until that process lets go, but its name and uplink are gone.
func (m *Manager) Delete(id string) error {
	if err := checkID(id); err != nil {
		return fmt.Errorf("delete network %s: %w", id, err)
	}
	m.unshape(id)
	sPath, gPath := m.paths(id)
	var errs []error
	// delete up0 explicitly: namespace teardown is asynchronous, and the host
	// side must be gone (its /30 free) when Delete returns
	err := os.ErrNotExist
	if isNamespace(gPath) { // a plain file (a crash between unmount and remove) is a gateway gone
		err = withHandle(gPath, func(h *netlink.Handle) error {
			l, err := h.LinkByName(uplinkIf)
			if err != nil {
				if errors.As(err, &netlink.LinkNotFoundError{}) {
					return nil
				}
				return err
			}
			return h.LinkDel(l)
		})
	}
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		errs = append(errs, fmt.Errorf("delete %s: %w", uplinkIf, err))
	}
	for _, p := range []string{sPath, gPath} {
		if err := removeNamed(p); err != nil {
			errs = append(errs, err)
		}
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("delete network %s: %w", id, err)
	}
	return nil
}

// List returns the ids, sorted, of sandboxes that have a namespace (sandbox
// or gateway) of this tag.
func (m *Manager) List() ([]string, error) {
	ents, err := os.ReadDir(runDir)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("list networks: %w", err)
	}
	prefix := "sbx-" + m.tag + "-"
	seen := map[string]bool{}
	var ids []string
	for _, e := range ents {
		id, ok := strings.CutPrefix(e.Name(), prefix)
		if !ok {
			continue
		}
		id = strings.TrimSuffix(id, gatewaySuffix) // ids have no '-'
		if checkID(id) != nil || seen[id] {
			continue
		}
		seen[id] = true
		ids = append(ids, id)
	}
	sort.Strings(ids)
	return ids, nil
}

// addrList dumps the root namespace's IPv4 addresses, retrying a dump that
// another process's change interrupted.
func addrList() ([]netlink.Addr, error) {
	var err error
	for range 10 {
		var addrs []netlink.Addr
		addrs, err = netlink.AddrList(nil, netlink.FAMILY_V4)
		if !errors.Is(err, netlink.ErrDumpInterrupted) {
			return addrs, err
		}
	}
	return nil, err
}
