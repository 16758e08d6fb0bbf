package e2e

import (
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"sbx.dev/sbx/internal/netns"
)

// outside makes a namespace of the test's own that stands for the outside
// world: a veth to the root namespace and a web server on its address.
func outside(t *testing.T) (addr string) {
	t.Helper()
	n := randHex(1)
	// Not "sbx...": the firewall treats every sbx+ interface as a sandbox.
	ns, host, peer := "e2e-out-"+n, "e2eo"+n, "e2ep"+n
	octet := int(n[0])%200 + 20
	hostAddr, outAddr := fmt.Sprintf("10.250.%d.1", octet), fmt.Sprintf("10.250.%d.2", octet)
	run := func(args ...string) {
		t.Helper()
		if out, err := exec.Command(args[0], args[1:]...).CombinedOutput(); err != nil {
			t.Fatalf("%v: %v: %s", args, err, out)
		}
	}
	t.Cleanup(func() {
		exec.Command("ip", "netns", "pids", ns).Run()
		if out, _ := exec.Command("ip", "netns", "pids", ns).Output(); len(out) > 0 {
			for _, p := range strings.Fields(string(out)) {
				exec.Command("kill", "-9", p).Run()
			}
		}
		exec.Command("ip", "link", "del", host).Run()
		exec.Command("ip", "netns", "del", ns).Run()
	})
	run("ip", "netns", "add", ns)
	run("ip", "link", "add", host, "type", "veth", "peer", "name", peer, "netns", ns)
	run("ip", "addr", "add", hostAddr+"/30", "dev", host)
	run("ip", "link", "set", host, "up")
	run("ip", "-n", ns, "addr", "add", outAddr+"/30", "dev", peer)
	run("ip", "-n", ns, "link", "set", peer, "up")
	run("ip", "-n", ns, "link", "set", "lo", "up")
	run("ip", "-n", ns, "route", "add", "default", "via", hostAddr)
	www := t.TempDir()
	os.WriteFile(filepath.Join(www, "hello.txt"), []byte("hello from outside\n"), 0o644)
	srv := exec.Command("ip", "netns", "exec", ns, "busybox", "httpd", "-f", "-p", outAddr+":8080", "-h", www)
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Process.Kill(); srv.Wait() })
	return outAddr
}

func TestNetwork(t *testing.T) {
	d := shared
	a := d.newSandbox(t, "--template", "tiny")
	b := d.newSandbox(t, "--template", "tiny")

	// Loopback inside a sandbox.
	d.must(t, "exec", a, "--", "sh", "-c", "mkdir -p /www && echo inside > /www/i.txt")
	d.must(t, "exec", a, "--detach", "--", "httpd", "-f", "-p", "127.0.0.1:8080", "-h", "/www")
	waitFor(t, "httpd on loopback", 10*time.Second, func() bool {
		r := d.sbx(t, "exec", a, "--", "wget", "-q", "-O-", "http://127.0.0.1:8080/i.txt")
		return r.code == 0 && r.stdout == "inside\n"
	})

	// Egress through NAT, to a server in a namespace this test made. (No
	// wget -T: busybox 1.35's wget crashes with it, on the host too.)
	out := outside(t)
	waitFor(t, "egress to the outside namespace", 10*time.Second, func() bool {
		r := d.sbx(t, "exec", a, "--timeout", "5s", "--", "wget", "-q", "-O-", "http://"+out+":8080/hello.txt")
		return r.code == 0 && r.stdout == "hello from outside\n"
	})

	// sbxd dials into the sandbox: a server on the sandbox's address answers.
	d.must(t, "exec", b, "--detach", "--", "sh", "-c", "mkdir -p /w && echo from-b > /w/b.txt && exec httpd -f -p 8081 -h /w")
	nm, err := netns.New(netns.Config{Tag: d.tag})
	if err != nil {
		t.Fatal(err)
	}
	var body string
	waitFor(t, "a dial into sandbox b", 10*time.Second, func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		conn, err := nm.Dial(ctx, b, 8081)
		if err != nil {
			return false
		}
		defer conn.Close()
		fmt.Fprintf(conn, "GET /b.txt HTTP/1.0\r\n\r\n")
		conn.SetReadDeadline(time.Now().Add(2 * time.Second))
		all, _ := io.ReadAll(conn)
		body = string(all)
		return strings.HasSuffix(body, "from-b\n")
	})

	// Isolation: a host service on every address, another sandbox, the
	// daemon's TCP port, and host files are all out of reach.
	hostSvc, err := net.Listen("tcp", "0.0.0.0:0")
	if err != nil {
		t.Fatal(err)
	}
	defer hostSvc.Close()
	go func() {
		for {
			c, err := hostSvc.Accept()
			if err != nil {
				return
			}
			c.Write([]byte("host-secret\n"))
			c.Close()
		}
	}()
	hostPort := hostSvc.Addr().(*net.TCPAddr).Port
	na, err := nm.Get(a)
	if err != nil {
		t.Fatal(err)
	}
	nb, err := nm.Get(b)
	if err != nil {
		t.Fatal(err)
	}
	_, daemonPort, _ := net.SplitHostPort(d.tcp)
	secret := filepath.Join(t.TempDir(), "host-only.txt")
	os.WriteFile(secret, []byte("host file\n"), 0o600)
	unreachable := []struct {
		name string
		cmd  string
	}{
		{"host service via the host side of its link", fmt.Sprintf("nc -w 2 %s %d", na.Outer.Addr().Next(), hostPort)},
		{"host service via the gateway", fmt.Sprintf("nc -w 2 10.88.0.1 %d", hostPort)},
		{"sbxd's TCP port", fmt.Sprintf("nc -w 2 %s %s", na.Outer.Addr().Next(), daemonPort)},
		{"another sandbox's link", fmt.Sprintf("nc -w 2 %s 8081", nb.Outer.Addr().Next().Next())},
		{"another sandbox's host side", fmt.Sprintf("nc -w 2 %s %d", nb.Outer.Addr().Next(), hostPort)},
		{"a host file", "cat " + secret},
		{"sbxd's socket", "ls " + d.socket},
	}
	for _, tc := range unreachable {
		t.Run(tc.name, func(t *testing.T) {
			r := d.sbx(t, "exec", a, "--timeout", "10s", "--", "sh", "-c", tc.cmd+" </dev/null")
			if r.code == 0 || strings.Contains(r.stdout, "secret") || strings.Contains(r.stdout, "host file") || strings.Contains(r.stdout, "from-b") {
				t.Errorf("%s: exit %d stdout %q: reachable from inside the sandbox", tc.cmd, r.code, r.stdout)
			}
		})
	}
}
