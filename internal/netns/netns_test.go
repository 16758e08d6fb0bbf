package netns

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	"github.com/vishvananda/netlink"
)

func TestNewInvalid(t *testing.T) {
	tests := []struct {
		name string
		cfg  Config
	}{
		{"empty tag", Config{}},
		{"short tag", Config{Tag: "abc"}},
		{"upper tag", Config{Tag: "ABCD"}},
		{"dash tag", Config{Tag: "ab-c"}},
		{"ipv6 pool", Config{Tag: "abcd", Pool: netip.MustParsePrefix("fd00::/64")}},
		{"pool too small", Config{Tag: "abcd", Pool: netip.MustParsePrefix("10.0.0.0/31")}},
		{"pool too big", Config{Tag: "abcd", Pool: netip.MustParsePrefix("10.0.0.0/7")}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := New(tc.cfg)
			if !errors.Is(err, ErrInvalid) {
				t.Errorf("New(%+v) = %v, want ErrInvalid", tc.cfg, err)
			}
		})
	}
}

func TestBadID(t *testing.T) {
	m, err := New(Config{Tag: "abcd"})
	if err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{"", "a-b", "../x", "a/b", "sb x", strings.Repeat("a", 65)} {
		if _, err := m.Create(id); !errors.Is(err, ErrInvalid) {
			t.Errorf("Create(%q) = %v, want ErrInvalid", id, err)
		}
		if _, err := m.Get(id); !errors.Is(err, ErrInvalid) {
			t.Errorf("Get(%q) = %v, want ErrInvalid", id, err)
		}
		if err := m.Delete(id); !errors.Is(err, ErrInvalid) {
			t.Errorf("Delete(%q) = %v, want ErrInvalid", id, err)
		}
	}
}

func TestTaken(t *testing.T) {
	m, err := New(Config{Tag: "abcd", Pool: netip.MustParsePrefix("10.201.0.0/28")}) // four /30s
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		used []string
		want []bool
	}{
		{"none", nil, []bool{false, false, false, false}},
		{"outside", []string{"10.200.0.1/24", "192.0.2.2/24"}, []bool{false, false, false, false}},
		{"host address", []string{"10.201.0.5/30"}, []bool{false, true, false, false}},
		{"single /32", []string{"10.201.0.14/32"}, []bool{false, false, false, true}},
		{"a /29 inside", []string{"10.201.0.9/29"}, []bool{false, false, true, true}},
		{"covers the pool", []string{"10.0.0.1/8"}, []bool{true, true, true, true}},
		{"default", []string{"0.0.0.0/0"}, []bool{true, true, true, true}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var used []netip.Prefix
			for _, u := range tc.used {
				used = append(used, netip.MustParsePrefix(u))
			}
			if diff := cmp.Diff(tc.want, m.taken(used)); diff != "" {
				t.Errorf("taken(%v) (-want +got):\n%s", tc.used, diff)
			}
		})
	}
	if got, want := m.outer(3), netip.MustParsePrefix("10.201.0.12/30"); got != want {
		t.Errorf("outer(3) = %v, want %v", got, want)
	}
}

// --- integration tests: root, real namespaces ---

func requireRoot(t testing.TB) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("netns integration tests need root (namespaces, veths, iptables)")
	}
	for _, bin := range []string{"ip", "iptables"} {
		if _, err := exec.LookPath(bin); err != nil {
			t.Skipf("netns integration tests need %s: %v", bin, err)
		}
	}
}

func randTag() string {
	const chars = "abcdefghijklmnopqrstuvwxyz0123456789"
	b := []byte{'t', 0, 0, 0}
	for i := 1; i < 4; i++ {
		b[i] = chars[rand.IntN(len(chars))]
	}
	return string(b)
}

func randID() string {
	const chars = "abcdefghijklmnopqrstuvwxyz234567"
	b := []byte("sb_")
	for range 10 {
		b = append(b, chars[rand.IntN(len(chars))])
	}
	return string(b)
}

// newManager returns a set-up Manager with a random tag whose rules are
// removed when the test ends.
func newManager(t testing.TB) *Manager {
	t.Helper()
	requireRoot(t)
	m, err := New(Config{Tag: randTag()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := m.Cleanup(); err != nil {
			t.Errorf("Cleanup: %v", err)
		}
	})
	if err := m.Setup(); err != nil {
		t.Fatal(err)
	}
	return m
}

// create makes a network that is deleted when the test ends.
func create(t testing.TB, m *Manager) *Network {
	t.Helper()
	id := randID()
	t.Cleanup(func() {
		if err := m.Delete(id); err != nil {
			t.Errorf("Delete(%s): %v", id, err)
		}
	})
	nw, err := m.Create(id)
	if err != nil {
		t.Fatal(err)
	}
	return nw
}

// listen listens on addr from inside the namespace at path ("" = root) and echoes
// every connection.
func listen(t *testing.T, path, addr string) net.Listener {
	t.Helper()
	var ln net.Listener
	listen := func() error {
		var err error
		ln, err = net.Listen("tcp4", addr)
		return err
	}
	var err error
	if path == "" {
		err = listen()
	} else {
		err = inNS(path, listen)
	}
	if err != nil {
		t.Fatalf("listen on %s in %s: %v", addr, path, err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				io.Copy(c, c)
			}()
		}
	}()
	return ln
}

// dialFrom connects to addr from inside the namespace at path ("" = root).
func dialFrom(path, addr string) (net.Conn, error) {
	d := net.Dialer{Timeout: time.Second}
	if path == "" {
		return d.Dial("tcp4", addr)
	}
	var c net.Conn
	err := inNS(path, func() error {
		var err error
		c, err = d.Dial("tcp4", addr)
		return err
	})
	return c, err
}

// echo writes a line on c and checks it comes back.
func echo(t *testing.T, c net.Conn) {
	t.Helper()
	defer c.Close()
	c.SetDeadline(time.Now().Add(5 * time.Second))
	msg := "hello " + randID() + "\n"
	if _, err := io.WriteString(c, msg); err != nil {
		t.Fatalf("write: %v", err)
	}
	buf := make([]byte, len(msg))
	if _, err := io.ReadFull(c, buf); err != nil {
		t.Fatalf("read: %v", err)
	}
	if got := string(buf); got != msg {
		t.Errorf("echo got %q, want %q", got, msg)
	}
}

func portOf(ln net.Listener) int { return ln.Addr().(*net.TCPAddr).Port }

func TestDial(t *testing.T) {
	m := newManager(t)
	nw1, nw2 := create(t, m), create(t, m)
	ln1 := listen(t, nw1.Path, "10.88.0.2:0")
	ln2 := listen(t, nw2.Path, "10.88.0.2:0")

	for _, tc := range []struct {
		name string
		id   string
		port int
	}{
		{"first", nw1.ID, portOf(ln1)},
		{"second", nw2.ID, portOf(ln2)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			c, err := m.Dial(ctx, tc.id, tc.port)
			if err != nil {
				t.Fatalf("Dial(%s, %d): %v", tc.id, tc.port, err)
			}
			echo(t, c)
		})
	}
	// the two sandboxes share an address but not a namespace
	if portOf(ln1) != portOf(ln2) {
		if c, err := m.Dial(context.Background(), nw1.ID, portOf(ln2)); err == nil {
			c.Close()
			t.Errorf("Dial(%s, %d) reached sandbox %s's listener", nw1.ID, portOf(ln2), nw2.ID)
		}
	}
	if _, err := m.Dial(context.Background(), "sb_absent", 80); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("Dial(absent) = %v, want os.ErrNotExist", err)
	}
}

// outside makes a namespace standing for the internet: a veth to the root
// namespace, 10.250.x.1 on the root side and 10.250.x.2 inside, and returns
// the path of the namespace and the inside address.
func outside(t *testing.T, tag string) (string, netip.Addr) {
	t.Helper()
	path, _, inside := outsideIn(t, tag, "out", 250)
	return path, inside
}

// outsideIn is outside with a free /30 of 10.B.0.0/16 (B < 255) or, with
// B = 254, of 169.254.0.0/16 (link-local); name tells two apart. It also
// returns the root side's address, one of the host's own.
func outsideIn(t *testing.T, tag, name string, b byte) (path string, rootAddr, insideAddr netip.Addr) {
	t.Helper()
	addrs, err := addrList()
	if err != nil {
		t.Fatal(err)
	}
	first := byte(10)
	if b == 254 {
		first = 169
	}
	var subnet netip.Prefix
	for range 100 {
		// 169.254.0.x and 169.254.255.x are reserved; keep clear of them
		p := netip.PrefixFrom(netip.AddrFrom4([4]byte{first, b, byte(1 + rand.IntN(250)), byte(rand.IntN(64) * 4)}), 30)
		free := true
		for _, a := range addrs {
			if q, ok := prefixOf(a.IPNet); ok && q.Overlaps(p) {
				free = false
			}
		}
		if free {
			subnet = p
			break
		}
	}
	if !subnet.IsValid() {
		t.Fatal("no free /30 in 10.250.0.0/16")
	}
	rootSide := netip.PrefixFrom(subnet.Addr().Next(), 30)
	inside := netip.PrefixFrom(rootSide.Addr().Next(), 30)

	path = filepath.Join(runDir, "sbxtest-"+tag+"-"+name)
	nss, err := newNamed(path)
	if err != nil {
		t.Fatal(err)
	}
	o := nss[0]
	defer o.close()
	t.Cleanup(func() {
		if err := removeNamed(path); err != nil {
			t.Errorf("remove %s: %v", path, err)
		}
	})
	link := "o" + name[:1] + tag // not sbx*: the rules must treat it as a foreign link
	veth := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: link}, PeerName: "ext0", PeerNamespace: netlink.NsFd(o.fd)}
	if err := netlink.LinkAdd(veth); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if l, err := netlink.LinkByName(link); err == nil {
			netlink.LinkDel(l)
		}
	})
	if err := configure(&netlink.Handle{}, link, rootSide, netip.Addr{}); err != nil {
		t.Fatal(err)
	}
	if err := configure(o.nl, "ext0", inside, netip.Addr{}); err != nil {
		t.Fatal(err)
	}
	if _, err := netlink.LinkByName(link); err != nil { // see Create: sync link watch
		t.Fatal(err)
	}
	return path, rootSide.Addr(), inside.Addr()
}

func TestEgress(t *testing.T) {
	m := newManager(t)
	nw := create(t, m)
	out, addr := outside(t, m.tag)
	ln := listen(t, out, addr.String()+":0")
	target := ln.Addr().String()

	c, err := dialFrom(nw.Path, target)
	if err != nil {
		t.Fatalf("connect from sandbox %s to %s: %v\n%s", nw.ID, target, err, diagnose(nw))
	}
	echo(t, c)
}

func TestIsolation(t *testing.T) {
	m := newManager(t)
	nw1, nw2 := create(t, m), create(t, m)
	// another daemon's chain, its jump above this one's: as when another
	// package's tests run beside these, it may be the one that drops
	newManager(t)

	hostLn := listen(t, "", "0.0.0.0:0")
	host1 := netip.AddrPortFrom(nw1.Outer.Addr().Next(), uint16(portOf(hostLn))).String()
	// control: the listener answers on that address, just not to the sandbox
	c, err := dialFrom("", host1)
	if err != nil {
		t.Fatalf("control: connect from root to %s: %v", host1, err)
	}
	c.Close()

	up2 := nw2.Outer.Addr().Next().Next()
	gwLn := listen(t, nw2.Gateway, up2.String()+":0")
	// control: the gateway's listener is up
	c, err = dialFrom(nw2.Gateway, gwLn.Addr().String())
	if err != nil {
		t.Fatalf("control: connect within %s to %s: %v", nw2.Gateway, gwLn.Addr(), err)
	}
	c.Close()

	sbLn := listen(t, nw2.Path, "10.88.0.2:0")
	dropsBefore := forwardDrops(t, m)

	tests := []struct {
		name, target string
	}{
		{"own host side", host1},
		{"other sandbox's uplink", gwLn.Addr().String()},
		{"other sandbox's listener", sbLn.Addr().String()},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c, err := dialFrom(nw1.Path, tc.target)
			if err == nil {
				c.Close()
				t.Fatalf("connect from sandbox %s to %s succeeded, want failure", nw1.ID, tc.target)
			}
		})
	}
	if got := forwardDrops(t, m); got <= dropsBefore {
		t.Errorf("sandbox-to-sandbox drop rule counted %d packets, want more than %d", got, dropsBefore)
	}
}

// forwardDrops returns the packet count of the sbx+ -> sbx+ DROP rules of
// every daemon's forward chain. Every daemon inserts its jump at the top of
// FORWARD, and each chain drops sandbox-to-sandbox traffic across daemons,
// so while another package's tests run a daemon of their own (go test runs
// packages side by side) its chain may be the one that drops the packet.
func forwardDrops(t *testing.T, m *Manager) int {
	t.Helper()
	out, err := output("iptables", "-w", "-t", "filter", "-L", "-n", "-v", "-x")
	if err != nil {
		t.Fatal(err)
	}
	all := hostIfPrefix + "+"
	total, ours, chain := 0, false, ""
	for line := range strings.Lines(out) {
		f := strings.Fields(line)
		if len(f) > 1 && f[0] == "Chain" {
			chain = f[1]
			continue
		}
		if !strings.HasPrefix(chain, "SBX-") || !strings.HasSuffix(chain, "-FWD") {
			continue
		}
		if len(f) > 6 && f[2] == "DROP" && f[5] == all && f[6] == all {
			n, err := strconv.Atoi(f[0])
			if err != nil {
				t.Fatalf("parse %q: %v", line, err)
			}
			total += n
			ours = ours || chain == m.fwdChain()
		}
	}
	if !ours {
		t.Fatalf("no %s -> %s DROP rule in %s:\n%s", all, all, m.fwdChain(), out)
	}
	return total
}

func TestDeleteGetList(t *testing.T) {
	m := newManager(t)
	nw := create(t, m)

	// a new Manager with the same tag, as after a daemon restart
	m2, err := New(Config{Tag: m.tag})
	if err != nil {
		t.Fatal(err)
	}
	got, err := m2.Get(nw.ID)
	if err != nil {
		t.Fatalf("Get(%s): %v", nw.ID, err)
	}
	if diff := cmp.Diff(nw, got, cmpopts.EquateComparable(netip.Prefix{})); diff != "" {
		t.Errorf("Get(%s) (-want +got):\n%s", nw.ID, diff)
	}
	ids, err := m2.List()
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]string{nw.ID}, ids); diff != "" {
		t.Errorf("List() (-want +got):\n%s", diff)
	}
	if _, err := m.Create(nw.ID); !errors.Is(err, os.ErrExist) {
		t.Errorf("Create(%s) again = %v, want os.ErrExist", nw.ID, err)
	}
	if _, err := m.Get(nw.ID); err != nil {
		t.Errorf("Get(%s) after a failed Create of the same id: %v", nw.ID, err)
	}

	for i := range 2 {
		if err := m2.Delete(nw.ID); err != nil {
			t.Fatalf("Delete #%d: %v", i+1, err)
		}
	}
	for _, p := range []string{nw.Path, nw.Gateway} {
		if _, err := os.Stat(p); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("stat %s after Delete: %v, want os.ErrNotExist", p, err)
		}
	}
	if out, err := exec.Command("ip", "link", "show", nw.HostIf).CombinedOutput(); err == nil {
		t.Errorf("ip link show %s after Delete:\n%s", nw.HostIf, out)
	}
	if addrs, err := addrList(); err == nil {
		for _, a := range addrs {
			// this manager's: a daemon of another package's tests may take
			// the freed range at once (go test runs packages side by side)
			if p, ok := prefixOf(a.IPNet); ok && p.Overlaps(nw.Outer) && a.Label == nw.HostIf {
				t.Errorf("address %s still on the host after Delete (%s)", p, a.Label)
			}
		}
	}
	if _, err := m.Get(nw.ID); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("Get after Delete = %v, want os.ErrNotExist", err)
	}
	if ids, err := m.List(); err != nil || len(ids) != 0 {
		t.Errorf("List after Delete = %v, %v; want none", ids, err)
	}
}

func TestNoCollision(t *testing.T) {
	ms := []*Manager{newManager(t), newManager(t)}
	const each = 4
	var (
		mu   sync.Mutex
		nets []*Network
		wg   sync.WaitGroup
	)
	for _, m := range ms {
		for range each {
			id := randID()
			t.Cleanup(func() {
				if err := m.Delete(id); err != nil {
					t.Errorf("Delete(%s): %v", id, err)
				}
			})
			wg.Go(func() {
				nw, err := m.Create(id)
				if err != nil {
					t.Errorf("Create(%s): %v", id, err)
					return
				}
				mu.Lock()
				nets = append(nets, nw)
				mu.Unlock()
			})
		}
	}
	wg.Wait()
	if len(nets) != len(ms)*each {
		t.Fatalf("created %d networks, want %d", len(nets), len(ms)*each)
	}
	for i, a := range nets {
		for _, b := range nets[i+1:] {
			if a.Outer.Overlaps(b.Outer) || a.HostIf == b.HostIf {
				t.Errorf("%s (%s %s) collides with %s (%s %s)", a.ID, a.HostIf, a.Outer, b.ID, b.HostIf, b.Outer)
			}
		}
	}
}

func TestCreateFailsClean(t *testing.T) {
	m := newManager(t)
	// a /30 pool with its only /30 already on the host: allocation fails late,
	// after both namespaces and the inside veth exist
	nw := create(t, m)
	m2, err := New(Config{Tag: randTag(), Pool: nw.Outer})
	if err != nil {
		t.Fatal(err)
	}
	id := randID()
	t.Cleanup(func() { m2.Delete(id) })
	if _, err := m2.Create(id); err == nil {
		t.Fatalf("Create(%s) in a full pool succeeded", id)
	}
	sPath, gPath := m2.paths(id)
	for _, p := range []string{sPath, gPath} {
		if _, err := os.Stat(p); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("stat %s after a failed Create: %v, want os.ErrNotExist", p, err)
		}
	}
}

func TestSetupIdempotent(t *testing.T) {
	m := newManager(t) // Setup once
	if err := m.Setup(); err != nil {
		t.Fatal(err)
	}
	own := ruleLines(t, m)
	want := map[string]int{
		"-N " + m.inChain():                          1,
		"-N " + m.fwdChain():                         1,
		"-A INPUT -j " + m.inChain():                 1,
		"-A FORWARD -j " + m.fwdChain():              1,
		"-A " + m.inChain():                          1,
		"-A " + m.fwdChain():                         4,
		"-A POSTROUTING -s " + m.pool.String() + " ": 1,
	}
	if diff := cmp.Diff(want, own); diff != "" {
		t.Errorf("rules after Setup twice (-want +got):\n%s", diff)
	}
	if err := m.Cleanup(); err != nil {
		t.Fatal(err)
	}
	got := ruleLines(t, m)
	for k, n := range got {
		if strings.Contains(k, m.inChain()) || strings.Contains(k, m.fwdChain()) {
			if n != 0 {
				t.Errorf("after Cleanup: %d rules like %q", n, k)
			}
		}
	}
}

// ruleLines counts the lines of iptables -S (filter and nat) that start with
// each of the prefixes this tag's rules produce.
func ruleLines(t *testing.T, m *Manager) map[string]int {
	t.Helper()
	filter, err := output("iptables", "-w", "-t", "filter", "-S")
	if err != nil {
		t.Fatal(err)
	}
	nat, err := output("iptables", "-w", "-t", "nat", "-S")
	if err != nil {
		t.Fatal(err)
	}
	prefixes := []string{
		"-N " + m.inChain(), "-N " + m.fwdChain(),
		"-A INPUT -j " + m.inChain(), "-A FORWARD -j " + m.fwdChain(),
		"-A " + m.inChain(), "-A " + m.fwdChain(),
		"-A POSTROUTING -s " + m.pool.String() + " ",
	}
	counts := map[string]int{}
	for line := range strings.Lines(filter + nat) {
		line = strings.TrimSpace(line)
		for _, p := range prefixes {
			if line == p || strings.HasPrefix(line, p+" ") || (strings.HasSuffix(p, " ") && strings.HasPrefix(line, p)) {
				// NAT rules are per daemon (other daemons may share the pool)
				if strings.HasPrefix(p, "-A POSTROUTING") && !strings.Contains(line, "--comment sbx-"+m.tag+" ") {
					continue
				}
				counts[p]++
			}
		}
	}
	return counts
}

func BenchmarkCreateDelete(b *testing.B) {
	m := newManager(b)
	var create, del time.Duration
	for b.Loop() {
		id := randID()
		start := time.Now()
		if _, err := m.Create(id); err != nil {
			b.Fatal(err)
		}
		mid := time.Now()
		if err := m.Delete(id); err != nil {
			b.Fatal(err)
		}
		create += mid.Sub(start)
		del += time.Since(mid)
	}
	b.ReportMetric(float64(create.Microseconds())/float64(b.N)/1000, "ms/create")
	b.ReportMetric(float64(del.Microseconds())/float64(b.N)/1000, "ms/delete")
}

// TestLayout checks what runsc will find in the sandbox namespace (and so
// take over), and the gateway behind it.
func TestLayout(t *testing.T) {
	m := newManager(t)
	nw := create(t, m)

	type ns struct {
		Links   []string
		Addrs   []string
		Default string
		Forward string
	}
	look := func(path string) ns {
		t.Helper()
		var got ns
		err := withHandle(path, func(h *netlink.Handle) error {
			links, err := h.LinkList()
			if err != nil {
				return err
			}
			for _, l := range links {
				got.Links = append(got.Links, l.Attrs().Name)
				addrs, err := h.AddrList(l, netlink.FAMILY_V4)
				if err != nil {
					return err
				}
				for _, a := range addrs {
					got.Addrs = append(got.Addrs, l.Attrs().Name+" "+a.IPNet.String())
				}
			}
			routes, err := h.RouteList(nil, netlink.FAMILY_V4)
			if err != nil {
				return err
			}
			for _, r := range routes {
				if r.Dst == nil || r.Dst.IP.IsUnspecified() {
					got.Default = r.Gw.String()
				}
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		err = inNS(path, func() error {
			b, err := os.ReadFile("/proc/sys/net/ipv4/ip_forward")
			got.Forward = strings.TrimSpace(string(b))
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
		return got
	}
	up := netip.PrefixFrom(nw.Outer.Addr().Next().Next(), 30)
	tests := []struct {
		name, path string
		want       ns
	}{
		{"sandbox", nw.Path, ns{
			Links:   []string{"lo", "eth0"},
			Addrs:   []string{"lo 127.0.0.1/8", "eth0 10.88.0.2/30"},
			Default: "10.88.0.1",
			Forward: "0",
		}},
		{"gateway", nw.Gateway, ns{
			Links:   []string{"lo", "gw0", "up0"},
			Addrs:   []string{"lo 127.0.0.1/8", "gw0 10.88.0.1/30", "up0 " + up.String()},
			Default: nw.Outer.Addr().Next().String(),
			Forward: "1",
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := look(tc.path)
			sort := cmpopts.SortSlices(func(a, b string) bool { return a < b })
			if diff := cmp.Diff(tc.want, got, sort); diff != "" {
				t.Errorf("namespace %s (-want +got):\n%s", tc.path, diff)
			}
		})
	}
	if !strings.HasPrefix(nw.HostIf, "sbx"+m.tag) || len(nw.HostIf) > maxIfName {
		t.Errorf("HostIf = %q, want sbx%s<n> of at most %d characters", nw.HostIf, m.tag, maxIfName)
	}
}

// diagnose describes the kernel state a failed connection went through.
func diagnose(nw *Network) string {
	var b strings.Builder
	for _, args := range [][]string{
		{"sysctl", "net.ipv4.ip_forward"},
		{"iptables", "-w", "-S", "-v"},
		{"iptables", "-w", "-t", "nat", "-S", "-v"},
		{"ip", "netns", "exec", filepath.Base(nw.Gateway), "iptables", "-w", "-t", "nat", "-S", "-v"},
		{"ip", "netns", "exec", filepath.Base(nw.Gateway), "sysctl", "net.ipv4.ip_forward"},
		{"ip", "-br", "addr"},
		{"ip", "route"},
		{"ip", "neigh"},
		{"ip", "netns", "exec", filepath.Base(nw.Gateway), "ip", "neigh"},
	} {
		out, err := exec.Command(args[0], args[1:]...).CombinedOutput()
		fmt.Fprintf(&b, "$ %s (%v)\n%s\n", strings.Join(args, " "), err, out)
	}
	return b.String()
}
