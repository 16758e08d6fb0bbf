package netns

import (
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// lock takes the cross-daemon file lock; the returned func releases it.
func (m *Manager) lock() (func(), error) {
	if err := os.MkdirAll(filepath.Dir(m.lockPath), 0o755); err != nil {
		return nil, fmt.Errorf("lock %s: %w", m.lockPath, err)
	}
	f, err := os.OpenFile(m.lockPath, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("lock %s: %w", m.lockPath, err)
	}
	for {
		err = unix.Flock(int(f.Fd()), unix.LOCK_EX)
		if !errors.Is(err, unix.EINTR) {
			break
		}
	}
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("lock %s: %w", m.lockPath, err)
	}
	return func() { f.Close() }, nil // closing the file releases the lock
}

// attachUplink allocates a free /30 of the pool and makes the veth
// sbx<tag><n> (root namespace, address .1) <-> up0 (namespace gwFD, no
// address yet). It holds the lock until the host side has its address:
// that address is what tells every daemon the /30 is taken.
func (m *Manager) attachUplink(gwFD int) (string, netip.Prefix, error) {
	unlock, err := m.lock()
	if err != nil {
		return "", netip.Prefix{}, err
	}
	defer unlock()
	addrs, err := addrList()
	if err != nil {
		return "", netip.Prefix{}, fmt.Errorf("list host addresses: %w", err)
	}
	var used []netip.Prefix
	for _, a := range addrs {
		if p, ok := prefixOf(a.IPNet); ok {
			used = append(used, p)
		}
	}
	taken := m.taken(used)
	for i := range taken {
		if taken[i] {
			continue
		}
		name := m.hostIf(i)
		outer := m.outer(i)
		veth := &netlink.Veth{
			LinkAttrs:     netlink.LinkAttrs{Name: name},
			PeerName:      uplinkIf,
			PeerNamespace: netlink.NsFd(gwFD),
		}
		if err := netlink.LinkAdd(veth); err != nil {
			if errors.Is(err, unix.EEXIST) {
				continue // a leftover link of a crashed create; Delete of its id removes it
			}
			return "", netip.Prefix{}, fmt.Errorf("add veth %s/%s: %w", name, uplinkIf, err)
		}
		if err := configure(&netlink.Handle{}, name, netip.PrefixFrom(outer.Addr().Next(), outer.Bits()), netip.Addr{}); err != nil {
			netlink.LinkDel(veth)
			return "", netip.Prefix{}, err
		}
		return name, outer, nil
	}
	return "", netip.Prefix{}, fmt.Errorf("pool %s: no free /%d", m.pool, outerPrefixLen)
}

// outer is the i-th /30 of the pool.
func (m *Manager) outer(i int) netip.Prefix {
	v := u32(m.pool.Addr()) + uint32(i)<<(32-outerPrefixLen)
	return netip.PrefixFrom(netip.AddrFrom4([4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)}), outerPrefixLen)
}

// taken marks each /30 of the pool that overlaps any prefix in used.
func (m *Manager) taken(used []netip.Prefix) []bool {
	n := 1 << (outerPrefixLen - m.pool.Bits())
	taken := make([]bool, n)
	first := u32(m.pool.Addr())
	last := first + uint32(n)<<(32-outerPrefixLen) - 1
	for _, p := range used {
		p = p.Masked()
		lo := u32(p.Addr())
		hi := lo | (1<<(32-p.Bits()) - 1)
		if p.Bits() == 0 {
			hi = ^uint32(0)
		}
		if hi < first || lo > last {
			continue
		}
		lo, hi = max(lo, first), min(hi, last)
		for i := (lo - first) >> (32 - outerPrefixLen); i <= (hi-first)>>(32-outerPrefixLen); i++ {
			taken[i] = true
		}
	}
	return taken
}

func u32(a netip.Addr) uint32 {
	b := a.As4()
	return uint32(b[0])<<24 | uint32(b[1])<<16 | uint32(b[2])<<8 | uint32(b[3])
}
