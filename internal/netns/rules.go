package netns

import (
	"bytes"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"sort"
	"strings"
	"sync"

	"github.com/coreos/go-iptables/iptables"
)

// rule is one iptables rule: a table, a chain and a rule spec.
type rule struct {
	table, chain string
	spec         []string
}

// ipt is the iptables of this host (coreos/go-iptables: it runs the
// iptables binary, with --wait, in the calling thread's network namespace,
// so that called inside inNS it works on that namespace's tables).
var ipt = sync.OnceValues(func() (*iptables.IPTables, error) {
	t, err := iptables.New(iptables.IPFamily(iptables.ProtocolIPv4), iptables.Timeout(30))
	if err != nil {
		return nil, fmt.Errorf("iptables: %w", err)
	}
	return t, nil
})

func (m *Manager) inChain() string  { return "SBX-" + strings.ToUpper(m.tag) + "-IN" }
func (m *Manager) fwdChain() string { return "SBX-" + strings.ToUpper(m.tag) + "-FWD" }

// chainRules are this tag's chains and their rules, in order: the egress
// policy of every sandbox of this daemon.
//
//   - INPUT from a sandbox (to any address of the host's own, every
//     interface's, sbxd's listeners included) is dropped, unless an
//     --egress-allow covers the address.
//   - Forwarding from one sandbox's uplink to another's is dropped, across
//     daemons too; no flag opens it.
//   - The daemon's rules (EgressAllow, EgressDeny; the most specific
//     first), then link-local and metadata addresses (169.254.0.0/16)
//     dropped, then everything else accepted: the internet through NAT.
func (m *Manager) chainRules() map[string][][]string {
	own := hostIfPrefix + m.tag + "+"
	all := hostIfPrefix + "+"
	var in, policy [][]string
	for _, r := range m.egress {
		target := "DROP"
		if r.allow {
			target = "ACCEPT"
		}
		spec := []string{"-i", own, "-d", r.prefix.String(), "-j", target}
		in = append(in, spec)
		policy = append(policy, spec)
	}
	fwd := [][]string{{"-i", all, "-o", all, "-j", "DROP"}}
	fwd = append(fwd, policy...)
	fwd = append(fwd,
		[]string{"-i", own, "-d", LinkLocal.String(), "-j", "DROP"},
		[]string{"-i", own, "-j", "ACCEPT"},
		[]string{"-o", own, "-m", "conntrack", "--ctstate", "ESTABLISHED,RELATED", "-j", "ACCEPT"},
	)
	return map[string][][]string{
		m.inChain():  append(in, []string{"-i", own, "-j", "DROP"}),
		m.fwdChain(): fwd,
	}
}

// LinkLocal holds the link-local and cloud metadata addresses
// (169.254.169.254), which no sandbox reaches unless --egress-allow says so.
var LinkLocal = netip.MustParsePrefix("169.254.0.0/16")

// egressRule is one --egress-allow or --egress-deny.
type egressRule struct {
	prefix netip.Prefix
	allow  bool
}

// egressRules checks and orders a daemon's rules: the most specific prefix
// first, so that `--egress-deny 10.0.0.0/8 --egress-allow 10.1.2.3/32`
// and `--egress-allow 10.0.0.0/8 --egress-deny 10.9.0.0/16` both mean
// what they say. It errors wrapping ErrInvalid on a prefix that is not
// IPv4, or one both allowed and denied.
func egressRules(allow, deny []netip.Prefix) ([]egressRule, error) {
	seen := map[netip.Prefix]bool{}
	var rules []egressRule
	for _, set := range []struct {
		prefixes []netip.Prefix
		allow    bool
		flag     string
	}{{allow, true, "--egress-allow"}, {deny, false, "--egress-deny"}} {
		for _, p := range set.prefixes {
			if !p.IsValid() || !p.Addr().Unmap().Is4() {
				return nil, fmt.Errorf("%s %s: %w: want an IPv4 prefix (sandboxes have no IPv6 route)", set.flag, p, ErrInvalid)
			}
			p = netip.PrefixFrom(p.Addr().Unmap(), p.Bits()).Masked()
			if allowed, dup := seen[p]; dup {
				if allowed != set.allow {
					return nil, fmt.Errorf("%s %s: %w: the prefix is both allowed and denied", set.flag, p, ErrInvalid)
				}
				continue
			}
			seen[p] = set.allow
			rules = append(rules, egressRule{p, set.allow})
		}
	}
	sort.SliceStable(rules, func(i, j int) bool {
		a, b := rules[i].prefix, rules[j].prefix
		if a.Bits() != b.Bits() {
			return a.Bits() > b.Bits()
		}
		return a.Addr().Less(b.Addr())
	})
	return rules, nil
}

// jumps are the jumps to inChain and fwdChain, in that order.
func (m *Manager) jumps() []rule {
	return []rule{
		{"filter", "INPUT", []string{"-j", m.inChain()}},
		{"filter", "FORWARD", []string{"-j", m.fwdChain()}},
	}
}

// natRule is this daemon's egress NAT rule. It carries the tag, so each
// daemon adds and removes its own (two for one pool do no harm), and a
// daemon with a pool of its own leaves nothing behind.
func (m *Manager) natRule() rule {
	return rule{"nat", "POSTROUTING", []string{"-s", m.pool.String(), "!", "-o", hostIfPrefix + "+",
		"-m", "comment", "--comment", "sbx-" + m.tag, "-j", "MASQUERADE"}}
}

// Setup turns on IP forwarding and ensures this tag's iptables chains, the
// jumps to them from the top of INPUT and FORWARD, and the egress NAT of the
// pool. It checks before it adds, so it is harmless at every daemon start.
func (m *Manager) Setup() error {
	unlock, err := m.lock()
	if err != nil {
		return fmt.Errorf("netns setup: %w", err)
	}
	defer unlock()
	const fwd = "/proc/sys/net/ipv4/ip_forward"
	if b, err := os.ReadFile(fwd); err != nil || strings.TrimSpace(string(b)) != "1" {
		if err := os.WriteFile(fwd, []byte("1"), 0); err != nil {
			return fmt.Errorf("netns setup: %w", err)
		}
	}
	chains := m.chainRules()
	for _, chain := range []string{m.inChain(), m.fwdChain()} {
		if err := ensureChain(chain, chains[chain]); err != nil {
			return fmt.Errorf("netns setup: %w", err)
		}
	}
	for _, r := range m.jumps() {
		if err := ensure(r, true); err != nil {
			return fmt.Errorf("netns setup: %w", err)
		}
	}
	if err := ensure(m.natRule(), false); err != nil {
		return fmt.Errorf("netns setup: %w", err)
	}
	return nil
}

// ensureChain makes filter chain name hold exactly specs, in order. It
// rewrites the chain only if a rule is missing or one is too many (the
// daemon's egress flags changed), and then in one transaction
// (iptables-restore), so that running sandboxes never see the chain empty.
func ensureChain(name string, specs [][]string) error {
	t, err := ipt()
	if err != nil {
		return err
	}
	exact := false
	if lines, err := t.List("filter", name); err == nil {
		n := 0
		for _, line := range lines {
			if strings.HasPrefix(line, "-A ") {
				n++
			}
		}
		exact = n == len(specs)
	}
	for _, s := range specs {
		if !exact {
			break
		}
		ok, err := t.Exists("filter", name, s...)
		if err != nil {
			return err
		}
		exact = ok
	}
	if exact {
		return nil
	}
	// go-iptables has no transaction: iptables-restore is one
	var b strings.Builder
	fmt.Fprintf(&b, "*filter\n:%s - [0:0]\n", name) // declared: made, or emptied first
	for _, s := range specs {
		fmt.Fprintf(&b, "-A %s %s\n", name, strings.Join(s, " "))
	}
	b.WriteString("COMMIT\n")
	var stderr bytes.Buffer
	cmd := exec.Command("iptables-restore", "-w", "--noflush")
	cmd.Stdin = strings.NewReader(b.String())
	cmd.Stderr = &stderr
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("iptables-restore %s: %w: %s", name, err, strings.TrimSpace(stderr.String()))
	}
	return nil
}

// ensure adds r unless it is there: at the top with first, else at the end.
func ensure(r rule, first bool) error {
	t, err := ipt()
	if err != nil {
		return err
	}
	if first {
		return t.InsertUnique(r.table, r.chain, 1, r.spec...)
	}
	return t.AppendUnique(r.table, r.chain, r.spec...)
}

// Cleanup removes this tag's chains, the jumps to them and its NAT rule.
// Missing rules are fine. It leaves namespaces alone: Delete them first.
func (m *Manager) Cleanup() error {
	unlock, err := m.lock()
	if err != nil {
		return fmt.Errorf("netns cleanup: %w", err)
	}
	defer unlock()
	t, err := ipt()
	if err != nil {
		return fmt.Errorf("netns cleanup: %w", err)
	}
	for i, chain := range []string{m.inChain(), m.fwdChain()} {
		// no chain, no jump to it: iptables refuses a jump to a missing chain
		ok, err := t.ChainExists("filter", chain)
		if err != nil {
			return fmt.Errorf("netns cleanup: %w", err)
		}
		if !ok {
			continue
		}
		if err := removeAll(m.jumps()[i]); err != nil {
			return fmt.Errorf("netns cleanup: %w", err)
		}
		if err := t.ClearAndDeleteChain("filter", chain); err != nil {
			return fmt.Errorf("netns cleanup: %w", err)
		}
	}
	// Every NAT rule of this tag, whatever pool it was made with.
	lines, err := t.List("nat", "POSTROUTING")
	if err != nil {
		return fmt.Errorf("netns cleanup: %w", err)
	}
	for _, line := range lines {
		f := strings.Fields(line)
		if len(f) < 3 || f[0] != "-A" || !strings.Contains(line+" ", "--comment sbx-"+m.tag+" ") {
			continue
		}
		if err := t.Delete("nat", f[1], f[2:]...); err != nil {
			return fmt.Errorf("netns cleanup: %w", err)
		}
	}
	return nil
}

// removeAll deletes every copy of r.
func removeAll(r rule) error {
	t, err := ipt()
	if err != nil {
		return err
	}
	for {
		ok, err := t.Exists(r.table, r.chain, r.spec...)
		if err != nil || !ok {
			return err
		}
		if err := t.Delete(r.table, r.chain, r.spec...); err != nil {
			return err
		}
	}
}
