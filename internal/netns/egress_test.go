package netns

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/vishvananda/netlink"
)

func TestEgressRules(t *testing.T) {
	pp := func(ss ...string) []netip.Prefix {
		var out []netip.Prefix
		for _, s := range ss {
			out = append(out, netip.MustParsePrefix(s))
		}
		return out
	}
	tests := []struct {
		name        string
		allow, deny []netip.Prefix
		want        []string // "+prefix" allowed, "-prefix" denied, in order
		invalid     bool
	}{
		{"none", nil, nil, nil, false},
		{"most specific first", pp("10.1.2.3/32", "169.254.0.0/16"), pp("10.0.0.0/8"), []string{"+10.1.2.3/32", "+169.254.0.0/16", "-10.0.0.0/8"}, false},
		{"deny inside an allow", pp("10.0.0.0/8"), pp("10.9.0.0/16"), []string{"-10.9.0.0/16", "+10.0.0.0/8"}, false},
		{"masked", pp("10.1.2.3/8"), nil, []string{"+10.0.0.0/8"}, false},
		{"repeated", pp("10.0.0.0/8", "10.0.0.0/8"), nil, []string{"+10.0.0.0/8"}, false},
		{"same length by address", nil, pp("192.168.0.0/16", "172.16.0.0/16"), []string{"-172.16.0.0/16", "-192.168.0.0/16"}, false},
		{"both allowed and denied", pp("10.0.0.0/8"), pp("10.0.0.0/8"), nil, true},
		{"ipv6", pp("fd00::/8"), nil, nil, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			rules, err := egressRules(tc.allow, tc.deny)
			if tc.invalid {
				if !errors.Is(err, ErrInvalid) {
					t.Fatalf("got %v, want ErrInvalid", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, r := range rules {
				sign := "-"
				if r.allow {
					sign = "+"
				}
				got = append(got, sign+r.prefix.String())
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("(-want +got):\n%s", diff)
			}
		})
	}
	if _, err := New(Config{Tag: "abcd", EgressDeny: pp("fd00::/8")}); !errors.Is(err, ErrInvalid) {
		t.Errorf("New with an IPv6 deny: %v, want ErrInvalid", err)
	}
}

// TestEgressPolicy: from a sandbox's namespace, against listeners this test
// puts in namespaces of its own, under each daemon policy in turn. Each
// policy is set by a new Manager of the same tag, as a restarted sbxd with
// other flags would: the chains are rewritten for the sandboxes already
// there.
func TestEgressPolicy(t *testing.T) {
	m := newManager(t)
	tag := m.tag
	nw := create(t, m)
	outPath, hostAddr, outAddr := outsideIn(t, tag, "out", 250)
	llPath, _, llAddr := outsideIn(t, tag, "link", 254)
	out := listen(t, outPath, outAddr.String()+":0").Addr().String()
	ll := listen(t, llPath, llAddr.String()+":0").Addr().String()
	host := listen(t, "", "0.0.0.0:0")
	hostAt := netip.AddrPortFrom(hostAddr, uint16(portOf(host))).String()
	// controls: each listener answers from where it is meant to
	for _, c := range []struct{ path, addr string }{{"", out}, {"", ll}, {"", hostAt}} {
		conn, err := dialFrom(c.path, c.addr)
		if err != nil {
			t.Fatalf("control: connect from the host to %s: %v", c.addr, err)
		}
		conn.Close()
	}

	p := func(s string) []netip.Prefix { return []netip.Prefix{netip.MustParsePrefix(s)} }
	outNet := outAddr.String() + "/32" // not the /30: the root side, a host address, is in it
	llNet := netip.PrefixFrom(llAddr, 30).Masked().String()
	tests := []struct {
		name        string
		allow, deny []netip.Prefix
		reach       map[string]bool
	}{
		{"default", nil, nil, map[string]bool{out: true, ll: false, hostAt: false}},
		{"allow link-local", p(LinkLocal.String()), nil, map[string]bool{out: true, ll: true, hostAt: false}},
		{"allow one link-local /30", p(llNet), nil, map[string]bool{out: true, ll: true, hostAt: false}},
		{"allow a host address", p(hostAddr.String() + "/32"), nil, map[string]bool{out: true, ll: false, hostAt: true}},
		{"deny the outside", nil, p(outNet), map[string]bool{out: false, ll: false, hostAt: false}},
		{"deny wide, allow narrow", p(outNet), p("10.0.0.0/8"), map[string]bool{out: true, ll: false, hostAt: false}},
		{"allow wide, deny narrow", p("10.0.0.0/8"), p(outNet), map[string]bool{out: false, ll: false, hostAt: true}},
		{"back to the default", nil, nil, map[string]bool{out: true, ll: false, hostAt: false}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			pm, err := New(Config{Tag: tag, EgressAllow: tc.allow, EgressDeny: tc.deny})
			if err != nil {
				t.Fatal(err)
			}
			if err := pm.Setup(); err != nil {
				t.Fatal(err)
			}
			for addr, want := range tc.reach {
				c, err := dialFrom(nw.Path, addr)
				if c != nil {
					c.Close()
				}
				if got := err == nil; got != want {
					t.Errorf("from the sandbox to %s: reached %v, want %v (%v)", addr, got, want, err)
				}
			}
		})
	}
}

// TestSetupRewrites: a daemon restarted with fewer rules has none of the
// old ones left over, and the rules of another tag are untouched.
func TestSetupRewrites(t *testing.T) {
	requireRoot(t)
	tag := randTag()
	wide, err := New(Config{Tag: tag, EgressAllow: []netip.Prefix{netip.MustParsePrefix("169.254.169.254/32")}, EgressDeny: []netip.Prefix{netip.MustParsePrefix("10.99.0.0/16")}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { wide.Cleanup() })
	if err := wide.Setup(); err != nil {
		t.Fatal(err)
	}
	other := newManager(t)
	before := ruleLines(t, other)
	if got := chainText(t, wide.fwdChain()); !strings.Contains(got, "169.254.169.254/32") || !strings.Contains(got, "10.99.0.0/16") {
		t.Fatalf("the flags' rules are missing:\n%s", got)
	}
	plain, err := New(Config{Tag: tag})
	if err != nil {
		t.Fatal(err)
	}
	if err := plain.Setup(); err != nil {
		t.Fatal(err)
	}
	for _, chain := range []string{plain.inChain(), plain.fwdChain()} {
		if got := chainText(t, chain); strings.Contains(got, "169.254.169.254/32") || strings.Contains(got, "10.99.0.0/16") {
			t.Errorf("after a restart without the flags, %s still has them:\n%s", chain, got)
		}
	}
	if diff := cmp.Diff(before, ruleLines(t, other)); diff != "" {
		t.Errorf("another daemon's rules changed (-before +after):\n%s", diff)
	}
}

func chainText(t *testing.T, chain string) string {
	t.Helper()
	out, err := output("iptables", "-w", "-t", "filter", "-S", chain)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// TestRearm: runsc takes eth0's address and route when a sandbox starts; a
// resume in the same namespace needs them back, or the sandbox has no eth0.
func TestRearm(t *testing.T) {
	m := newManager(t)
	nw := create(t, m)
	// what runsc does when it takes the interface over
	err := withHandle(nw.Path, func(h *netlink.Handle) error {
		l, err := h.LinkByName(sandboxIf)
		if err != nil {
			return err
		}
		return h.AddrDel(l, &netlink.Addr{IPNet: ipNet(InsideAddr)})
	})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := dialFrom(nw.Path, "10.250.0.1:1"); err == nil {
		t.Fatal("control: the namespace still routes without its address")
	}
	for i := range 2 { // idempotent
		if err := m.Rearm(nw.ID); err != nil {
			t.Fatalf("Rearm #%d: %v", i+1, err)
		}
	}
	ln := listen(t, nw.Path, InsideAddr.Addr().String()+":0")
	c, err := m.Dial(context.Background(), nw.ID, portOf(ln))
	if err != nil {
		t.Fatalf("dial after Rearm: %v", err)
	}
	echo(t, c)
	err = withHandle(nw.Path, func(h *netlink.Handle) error {
		routes, err := h.RouteList(nil, netlink.FAMILY_V4)
		if err != nil {
			return err
		}
		defaults := 0
		for _, r := range routes {
			if isDefault(r) {
				defaults++
			}
		}
		if defaults != 1 {
			return fmt.Errorf("%d default routes, want 1", defaults)
		}
		return nil
	})
	if err != nil {
		t.Error(err)
	}
	if err := m.Rearm("sb_absentabcd"); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("Rearm of a missing network: %v, want os.ErrNotExist", err)
	}
}

// output runs a command and returns its stdout, or an error with its stderr.
func output(name string, args ...string) (string, error) {
	var stderr bytes.Buffer
	cmd := exec.Command(name, args...)
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("%s %s: %w: %s", name, strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return string(out), nil
}
