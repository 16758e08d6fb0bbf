package netns

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
)

// rule is one iptables rule: a table, a chain and a rule spec.
type rule struct {
	table, chain string
	spec         []string
}

func (r rule) args(op string) []string {
	return append([]string{"-w", "-t", r.table, op, r.chain}, r.spec...)
}

func (m *Manager) inChain() string  { return "SBX-" + strings.ToUpper(m.tag) + "-IN" }
func (m *Manager) fwdChain() string { return "SBX-" + strings.ToUpper(m.tag) + "-FWD" }

// chainRules are this tag's chains and their rules, in order.
func (m *Manager) chainRules() map[string][][]string {
	own := hostIfPrefix + m.tag + "+"
	all := hostIfPrefix + "+"
	return map[string][][]string{
		// a sandbox reaches no host service, sbxd's API included
		m.inChain(): {{"-i", own, "-j", "DROP"}},
		m.fwdChain(): {
			{"-i", all, "-o", all, "-j", "DROP"}, // no sandbox to sandbox, across daemons too
			{"-i", own, "-j", "ACCEPT"},
			{"-o", own, "-m", "conntrack", "--ctstate", "ESTABLISHED,RELATED", "-j", "ACCEPT"},
		},
	}
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
		if err := ensure(r, "-I"); err != nil {
			return fmt.Errorf("netns setup: %w", err)
		}
	}
	if err := ensure(m.natRule(), "-A"); err != nil {
		return fmt.Errorf("netns setup: %w", err)
	}
	return nil
}

// ensureChain makes filter chain name hold exactly specs, in order. It
// rewrites the chain only if a rule is missing.
func ensureChain(name string, specs [][]string) error {
	if ok, err := exists("-w", "-t", "filter", "-S", name); err != nil {
		return err
	} else if !ok {
		if err := iptables("-w", "-t", "filter", "-N", name); err != nil {
			return err
		}
	}
	complete := true
	for _, s := range specs {
		ok, err := exists(rule{"filter", name, s}.args("-C")...)
		if err != nil {
			return err
		}
		complete = complete && ok
	}
	if complete {
		return nil
	}
	if err := iptables("-w", "-t", "filter", "-F", name); err != nil {
		return err
	}
	for _, s := range specs {
		if err := iptables(rule{"filter", name, s}.args("-A")...); err != nil {
			return err
		}
	}
	return nil
}

// ensure adds r with op (-A appends, -I inserts at the top) unless it is there.
func ensure(r rule, op string) error {
	ok, err := exists(r.args("-C")...)
	if err != nil || ok {
		return err
	}
	return iptables(r.args(op)...)
}

// Cleanup removes this tag's chains, the jumps to them and its NAT rule.
// Missing rules are fine. It leaves namespaces alone: Delete them first.
func (m *Manager) Cleanup() error {
	unlock, err := m.lock()
	if err != nil {
		return fmt.Errorf("netns cleanup: %w", err)
	}
	defer unlock()
	for i, chain := range []string{m.inChain(), m.fwdChain()} {
		// no chain, no jump to it: iptables refuses a jump to a missing chain
		ok, err := exists("-w", "-t", "filter", "-S", chain)
		if err != nil {
			return fmt.Errorf("netns cleanup: %w", err)
		}
		if !ok {
			continue
		}
		if err := removeAll(m.jumps()[i]); err != nil {
			return fmt.Errorf("netns cleanup: %w", err)
		}
		if err := iptables("-w", "-t", "filter", "-F", chain); err != nil {
			return fmt.Errorf("netns cleanup: %w", err)
		}
		if err := iptables("-w", "-t", "filter", "-X", chain); err != nil {
			return fmt.Errorf("netns cleanup: %w", err)
		}
	}
	// Every NAT rule of this tag, whatever pool it was made with.
	out, err := output("iptables", "-w", "-t", "nat", "-S", "POSTROUTING")
	if err != nil {
		return fmt.Errorf("netns cleanup: %w", err)
	}
	for line := range strings.Lines(out) {
		f := strings.Fields(line)
		if len(f) < 2 || f[0] != "-A" || !strings.Contains(line, "--comment sbx-"+m.tag+" ") {
			continue
		}
		if err := iptables(append([]string{"-w", "-t", "nat", "-D"}, f[1:]...)...); err != nil {
			return fmt.Errorf("netns cleanup: %w", err)
		}
	}
	return nil
}

// removeAll deletes every copy of r.
func removeAll(r rule) error {
	for {
		ok, err := exists(r.args("-C")...)
		if err != nil || !ok {
			return err
		}
		if err := iptables(r.args("-D")...); err != nil {
			return err
		}
	}
}

func iptables(args ...string) error { return run("iptables", args...) }

// exists runs an iptables query (-C, -S chain) and reports whether it
// succeeded; exit status 1 means "no such rule or chain".
func exists(args ...string) (bool, error) {
	var stderr bytes.Buffer
	cmd := exec.Command("iptables", args...)
	cmd.Stderr = &stderr
	err := cmd.Run()
	if err == nil {
		return true, nil
	}
	var ee *exec.ExitError
	if errors.As(err, &ee) && ee.ExitCode() == 1 {
		return false, nil
	}
	return false, fmt.Errorf("iptables %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
}

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
