// Package e2e tests the sbx fleet on a real control plane: etcd and
// kube-apiserver from `make fleet-tools`, and real sbxd node agents, all
// brought up by scripts/fleet.sh. It skips when the control plane is not
// built (bin/.fleet-dir missing).
package e2e

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	mrand "math/rand/v2"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/coder/websocket"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"sbx.dev/sbx/api"
	"sbx.dev/sbx/internal/agent"
	"sbx.dev/sbx/internal/flaky"
	"sbx.dev/sbx/internal/fleet/v1alpha1"
)

// fleet is one scripts/fleet.sh up DIR, seen from the test.
type fleet struct {
	root, dir string
	kubectl   string
	env       map[string]string // DIR/env
	nodes     []node            // DIR/nodes
}

// node is one line of DIR/nodes, and the node's own TCP token
// (DIR/NAME/token: SBX_TOKEN, the controller's, opens no node).
type node struct{ name, tag, socket, addr, token string }

func repoRoot(t testing.TB) string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..", "..")
}

// startFleet brings up a fleet of n nodes, and down again when the test
// ends, pass or fail; it skips the test when nothing is built to run it.
func startFleet(t testing.TB, n int) *fleet {
	t.Helper()
	root := repoRoot(t)
	if os.Geteuid() != 0 {
		t.Skip("fleet: needs root (sbxd makes namespaces, cgroups and gVisor sandboxes)")
	}
	fd, err := os.ReadFile(filepath.Join(root, "bin", ".fleet-dir"))
	if err != nil {
		t.Skip("fleet: the control plane is not built (bin/.fleet-dir missing): run `make fleet-tools` (once per pin; the README says how long)")
	}
	for _, b := range []string{"sbx", "sbxd", "runsc", "sbx-agent"} {
		if _, err := os.Stat(filepath.Join(root, "bin", b)); err != nil {
			t.Fatalf("bin/%s missing: run `make build` first", b)
		}
	}
	dir, err := os.MkdirTemp("", "sbx-fleet-e2e-")
	if err != nil {
		t.Fatal(err)
	}
	f := &fleet{root: root, dir: dir, kubectl: filepath.Join(strings.TrimSpace(string(fd)), "kubectl")}
	// the e2e package's cache: its nodes share it as they share their own
	// (a template's build is under a lock), and base is built once
	templates := os.Getenv("SBX_TEST_TEMPLATES")
	if templates == "" {
		templates = "/var/tmp/sbx-test-templates-v2"
	}
	script := filepath.Join(root, "scripts", "fleet.sh")
	t.Cleanup(func() {
		cmd := exec.Command(script, "down", dir)
		cmd.Env = append(os.Environ(), "SBX_FLEET_TEMPLATES="+templates)
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Errorf("fleet.sh down: %v\n%s", err, out)
		}
		for _, n := range f.nodes {
			for _, left := range leftovers(n.tag) {
				t.Errorf("fleet.sh down left %s behind", left)
			}
		}
		if t.Failed() {
			t.Logf("fleet: the logs are kept in %s", dir)
			return
		}
		os.RemoveAll(dir)
	})
	cmd := exec.Command(script, "up", dir, strconv.Itoa(n))
	cmd.Env = append(os.Environ(), "SBX_FLEET_TEMPLATES="+templates)
	start := time.Now()
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("fleet.sh up: %v\n%s", err, out)
	}
	t.Logf("fleet: up in %s", time.Since(start).Round(time.Millisecond))
	f.env = readEnv(t, filepath.Join(dir, "env"))
	b, err := os.ReadFile(filepath.Join(dir, "nodes"))
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		w := strings.Fields(l)
		if len(w) != 4 {
			t.Fatalf("DIR/nodes: bad line %q", l)
		}
		tok, err := os.ReadFile(filepath.Join(dir, w[0], "token"))
		if err != nil {
			t.Fatalf("node %s has no token of its own: %v", w[0], err)
		}
		f.nodes = append(f.nodes, node{w[0], w[1], w[2], w[3], strings.TrimSpace(string(tok))})
	}
	if len(f.nodes) != n {
		t.Fatalf("DIR/nodes: %d nodes, want %d", len(f.nodes), n)
	}
	return f
}

// leftovers lists what sbxd of tag made on the host and is still there:
// network namespaces, iptables chains, cgroups.
func leftovers(tag string) []string {
	var left []string
	out, _ := exec.Command("ip", "netns", "list").Output()
	for _, l := range strings.Split(string(out), "\n") {
		if strings.HasPrefix(l, "sbx-"+tag+"-") {
			left = append(left, "network namespace "+strings.Fields(l)[0])
		}
	}
	for _, table := range []string{"filter", "nat", "mangle"} {
		out, _ := exec.Command("iptables", "-w", "-t", table, "-S").Output()
		for _, l := range strings.Split(string(out), "\n") {
			if strings.HasPrefix(l, "-N SBX-"+strings.ToUpper(tag)+"-") {
				left = append(left, "iptables chain "+table+" "+strings.TrimPrefix(l, "-N "))
			}
			if strings.Contains(l, "--comment sbx-"+tag+" ") {
				left = append(left, "iptables rule "+table+" "+l)
			}
		}
	}
	cg, _ := filepath.Glob("/sys/fs/cgroup/*/sbx-" + tag)
	for _, c := range cg {
		left = append(left, "cgroup "+c)
	}
	return left
}

func readEnv(t testing.TB, path string) map[string]string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	env := map[string]string{}
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		if k, v, ok := strings.Cut(sc.Text(), "="); ok && !strings.HasPrefix(k, "export") {
			env[k] = v
		}
	}
	for _, k := range []string{"KUBECONFIG", "SBX_HOST", "SBX_TOKEN", "REGISTRY"} {
		if env[k] == "" {
			t.Fatalf("DIR/env has no %s:\n%s", k, b)
		}
	}
	return env
}

// run runs a command with the fleet's env, and returns its stdout; it
// fails the test if the command fails, unless mayFail.
func (f *fleet) run(t testing.TB, mayFail bool, name string, args ...string) (string, error) {
	t.Helper()
	limit := 2 * time.Minute
	if slices.Contains(args, "template") {
		// a first build of base, perhaps waiting on another package's
		// build of it (one build at a time holds the cache's lock)
		limit = 15 * time.Minute
	}
	ctx, cancel := context.WithTimeout(context.Background(), limit)
	defer cancel()
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Env = os.Environ()
	for k, v := range f.env {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil && !mayFail {
		t.Fatalf("%s %s: %v\n%s%s", filepath.Base(name), strings.Join(args, " "), err, out, stderr.Bytes())
	}
	if err != nil {
		err = &cmdError{err, stderr.String()}
	}
	return string(out), err
}

type cmdError struct {
	err    error
	stderr string
}

func (e *cmdError) Error() string { return e.err.Error() + ": " + e.stderr }
func (e *cmdError) Unwrap() error { return e.err }

func (f *fleet) kube(t testing.TB, args ...string) string {
	t.Helper()
	out, _ := f.run(t, false, f.kubectl, args...)
	return out
}

// holder starts in sandbox id, through host (--host=...), a process that
// writes a random token and its pid to /tmp/first once, then to /tmp/now
// every 0.2 s; it returns that "TOKEN PID" line: a memory image carries
// it on, the same token from the same pid.
func (f *fleet) holder(t testing.TB, host, id string) string {
	t.Helper()
	f.sbx(t, host, "exec", "-d", id, "--", "sh", "-c",
		`T=$(head -c 8 /dev/urandom | od -An -tx1 | tr -d ' \n'); echo "$T $$" > /tmp/first; while :; do echo "$T $$" > /tmp/now; sleep 0.2; done`)
	var first string
	waitFor(t, "the holder's first line", 20*time.Second, func() bool {
		out, err := f.run(t, true, filepath.Join(f.root, "bin", "sbx"), host, "exec", id, "--", "cat", "/tmp/first")
		first = strings.TrimSpace(out)
		return err == nil && len(strings.Fields(first)) == 2
	})
	return first
}

func (f *fleet) sbx(t testing.TB, args ...string) string {
	t.Helper()
	out, _ := f.run(t, false, filepath.Join(f.root, "bin", "sbx"), args...)
	return out
}

// waitFor polls cond until it holds or limit passes (no timing assertion:
// the limit is generous, for a 2-core machine under other tests).
func waitFor(t testing.TB, what string, limit time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(limit)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("gave up after %s waiting for %s", limit, what)
		}
		time.Sleep(250 * time.Millisecond)
	}
}

func (f *fleet) leaseRenewTime(t testing.TB, name string) time.Time {
	t.Helper()
	out := f.kube(t, "get", "lease", name, "-n", v1alpha1.DefaultNamespace, "-o", "jsonpath={.spec.renewTime}")
	rt, err := time.Parse(time.RFC3339Nano, strings.TrimSpace(out))
	if err != nil {
		t.Fatalf("lease %s: renewTime %q: %v", name, out, err)
	}
	return rt
}

// sandboxRow is the `kubectl get sandboxes` row of sbx sandbox id, as
// column name to value ("" if it has none).
func (f *fleet) sandboxRow(t testing.TB, id string) map[string]string {
	t.Helper()
	out := f.kube(t, "get", "sandboxes")
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) < 2 {
		return nil
	}
	// columns are cut at the header's word starts ("SBX NAME" is one)
	header := lines[0]
	var starts []int
	var names []string
	for i := 0; i < len(header); i++ {
		if header[i] != ' ' && (i == 0 || (header[i-1] == ' ' && (i < 2 || header[i-2] == ' '))) {
			starts = append(starts, i)
		}
	}
	for j, s := range starts {
		end := len(header)
		if j+1 < len(starts) {
			end = starts[j+1]
		}
		names = append(names, strings.TrimSpace(header[s:end]))
	}
	for _, l := range lines[1:] {
		row := map[string]string{}
		for j, s := range starts {
			end := len(l)
			if j+1 < len(starts) && starts[j+1] < len(l) {
				end = starts[j+1]
			}
			if s < len(l) {
				row[names[j]] = strings.TrimSpace(l[s:end])
			}
		}
		if row["ID"] == id {
			return row
		}
	}
	return nil
}

// pid reads a pid file of DIR.
func (f *fleet) pid(t testing.TB, file string) int {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(f.dir, file))
	if err != nil {
		t.Fatal(err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || pid <= 0 {
		t.Fatalf("%s: pid %q", file, b)
	}
	return pid
}

func fileSHA256(t testing.TB, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}

// TestFleetNodeAgents: two sbxd node agents on a real kube-apiserver
// publish their SandboxNodes and renew their Leases; a sandbox made through
// node 1's API shows in `kubectl get sandboxes` with its state and node,
// turns stopped, and goes; a SIGKILLed agent's Lease stops renewing.
func TestFleetNodeAgents(t *testing.T) {
	f := startFleet(t, 2)

	t.Run("crds established", func(t *testing.T) {
		for _, crd := range []string{"sandboxes", "sandboxsnapshots", "sandboxtemplates", "sandboxnodes"} {
			got := f.kube(t, "get", "crd", crd+".sbx.dev", "-o", `jsonpath={.status.conditions[?(@.type=="Established")].status}`)
			if got != "True" {
				t.Errorf("crd %s.sbx.dev: Established %q, want True", crd, got)
			}
		}
	})

	runscSum := fileSHA256(t, filepath.Join(f.root, "bin", "runsc"))
	t.Run("sandboxnodes", func(t *testing.T) {
		for _, n := range f.nodes {
			var sn v1alpha1.SandboxNode
			waitFor(t, "SandboxNode "+n.name+" to publish its status", 60*time.Second, func() bool {
				out, err := f.run(t, true, f.kubectl, "get", "sandboxnode", n.name, "-o", "json")
				return err == nil && json.Unmarshal([]byte(out), &sn) == nil && sn.Status.RunscSHA256 != ""
			})
			st := sn.Status
			if st.RunscSHA256 != runscSum {
				t.Errorf("%s: runscSHA256 %s, want %s (bin/runsc's)", n.name, st.RunscSHA256, runscSum)
			}
			if want := "tcp://" + n.addr; st.Address != want {
				t.Errorf("%s: address %q, want %q", n.name, st.Address, want)
			}
			if st.Capacity.CPUs != runtime.NumCPU() || st.Capacity.MemoryBytes <= 0 || st.Capacity.DiskFreeBytes <= 0 {
				t.Errorf("%s: capacity %+v, want %d CPUs and some memory and disk", n.name, st.Capacity, runtime.NumCPU())
			}
			if len(st.CPUFeatures) == 0 || !slices.IsSorted(st.CPUFeatures) {
				t.Errorf("%s: cpuFeatures %v, want some, sorted", n.name, st.CPUFeatures)
			}
			if st.CacheLineBytes <= 0 || st.Version == "" {
				t.Errorf("%s: cacheLineBytes %d, version %q: want both", n.name, st.CacheLineBytes, st.Version)
			}
			// the printer columns show what it published
			if out := f.kube(t, "get", "sandboxnode", n.name); !strings.Contains(out, st.Address) {
				t.Errorf("kubectl get sandboxnode %s does not show its address:\n%s", n.name, out)
			}
		}
	})

	t.Run("leases renew", func(t *testing.T) {
		for _, n := range f.nodes {
			var first time.Time
			waitFor(t, "lease "+n.name, 30*time.Second, func() bool {
				out, err := f.run(t, true, f.kubectl, "get", "lease", n.name, "-o", "jsonpath={.spec.renewTime}")
				return err == nil && strings.TrimSpace(out) != ""
			})
			first = f.leaseRenewTime(t, n.name)
			if got := f.kube(t, "get", "lease", n.name, "-o", "jsonpath={.spec.leaseDurationSeconds} {.spec.holderIdentity}"); got != "15 "+n.name {
				t.Errorf("lease %s: duration and holder %q, want \"15 %s\"", n.name, got, n.name)
			}
			waitFor(t, "lease "+n.name+" to renew", 60*time.Second, func() bool {
				return f.leaseRenewTime(t, n.name).After(first)
			})
		}
	})

	// each node is its own identity: sbx:node:NAME on the apiserver, which
	// deploy/rbac narrows to its own objects, and its own TCP token, which
	// opens no other node (nor is the fleet's API token a node's)
	t.Run("node identity", func(t *testing.T) {
		asNode1 := func(args ...string) error {
			_, err := f.run(t, true, f.kubectl, append([]string{"--kubeconfig", filepath.Join(f.dir, "node-1", "kubeconfig")}, args...)...)
			return err
		}
		bound2, err := json.Marshal(v1alpha1.Sandbox{
			TypeMeta:   metav1.TypeMeta{APIVersion: v1alpha1.APIVersion, Kind: v1alpha1.KindSandbox},
			ObjectMeta: metav1.ObjectMeta{Name: "placed-by-node-1", Namespace: v1alpha1.DefaultNamespace},
			Spec:       v1alpha1.SandboxSpec{Template: "tiny", NodeName: "node-2"},
		})
		if err != nil {
			t.Fatal(err)
		}
		manifest := filepath.Join(t.TempDir(), "bound.json")
		if err := os.WriteFile(manifest, bound2, 0o644); err != nil {
			t.Fatal(err)
		}
		// attack30's holes: an unbound Sandbox of its own making (the
		// controller would bind it elsewhere, and the node write on in it),
		// one labelled another node's, and another node's view
		manifests := map[string]string{
			"unbound.json": `{"apiVersion":"` + v1alpha1.APIVersion + `","kind":"Sandbox","metadata":{"name":"unbound-by-node-1","labels":{"sbx.dev/node":"node-1"}},"spec":{"template":"tiny"}}`,
			"label2.json":  `{"apiVersion":"` + v1alpha1.APIVersion + `","kind":"Sandbox","metadata":{"name":"labelled-node-2","labels":{"sbx.dev/node":"node-2"}},"spec":{"template":"tiny","nodeName":"node-1"}}`,
			"view2.json":   `{"apiVersion":"` + v1alpha1.APIVersion + `","kind":"SandboxSnapshot","metadata":{"name":"node-2.im-forged","labels":{"sbx.dev/node":"node-1"}},"spec":{"name":"forged"}}`,
		}
		tmp := t.TempDir()
		for name, body := range manifests {
			if err := os.WriteFile(filepath.Join(tmp, name), []byte(body), 0o644); err != nil {
				t.Fatal(err)
			}
		}
		t.Cleanup(func() {
			f.run(t, true, f.kubectl, "delete", "sandbox", "unbound-by-node-1", "labelled-node-2", "--ignore-not-found", "--wait=false")
			f.run(t, true, f.kubectl, "delete", "sandboxsnapshot", "node-2.im-forged", "--ignore-not-found", "--wait=false")
		})
		leader := filepath.Join(t.TempDir(), "lease.json")
		if err := os.WriteFile(leader, []byte(`{"apiVersion":"coordination.k8s.io/v1","kind":"Lease","metadata":{"name":"sbx-controller-x","namespace":"`+
			v1alpha1.DefaultNamespace+`"},"spec":{"holderIdentity":"node-1"}}`), 0o644); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			f.run(t, true, f.kubectl, "delete", "sandbox", "placed-by-node-1", "--ignore-not-found", "--wait=false")
		})
		for _, c := range []struct {
			what string
			args []string
			want string
		}{
			{"move node-2's address", []string{"patch", "sandboxnode", "node-2", "--subresource", "status", "--type", "merge", "-p", `{"status":{"address":"tcp://127.0.0.1:9"}}`}, "writes only its own SandboxNode"},
			{"renew node-2's Lease", []string{"patch", "lease", "node-2", "--type", "merge", "-p", `{"spec":{"holderIdentity":"node-1"}}`}, "writes only its own SandboxNode and Lease"},
			{"make a Lease not its own", []string{"create", "-f", leader}, "writes only its own SandboxNode and Lease"},
			{"place a Sandbox on node-2", []string{"create", "-f", manifest}, "node node-1"},
			{"make an unbound Sandbox", []string{"create", "-f", filepath.Join(tmp, "unbound.json")}, "cannot bind"},
			{"label a Sandbox node-2's", []string{"create", "-f", filepath.Join(tmp, "label2.json")}, "labels its Sandboxes sbx.dev/node=node-1"},
			{"write node-2's view", []string{"create", "-f", filepath.Join(tmp, "view2.json")}, "writes only the views named node-1.*"},
			{"uncordon itself", []string{"patch", "sandboxnode", "node-1", "--type", "merge", "-p", `{"spec":{"unschedulable":false}}`}, "forbidden"},
			{"delete node-2", []string{"delete", "sandboxnode", "node-2", "--wait=false"}, "forbidden"},
			{"read secrets", []string{"get", "secrets", "-A"}, "forbidden"},
		} {
			err := asNode1(c.args...)
			if err == nil {
				t.Errorf("node-1 could %s", c.what)
				continue
			}
			if !strings.Contains(err.Error(), c.want) {
				t.Errorf("node-1 refused to %s, but not saying %q: %v", c.what, c.want, err)
			}
		}
		if got := f.kube(t, "get", "sandboxnode", "node-2", "-o", "jsonpath={.status.address}"); got != "tcp://"+f.nodes[1].addr {
			t.Errorf("node-2's address is %q after node-1 tried to move it", got)
		}
		// TCP: each node takes its own token, and only its own
		get := func(n node, token string) int {
			req, _ := http.NewRequest(http.MethodGet, "http://"+n.addr+"/v1/sandboxes", nil)
			req.Header.Set("Authorization", "Bearer "+token)
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			return resp.StatusCode
		}
		if f.nodes[0].token == f.nodes[1].token {
			t.Fatal("the two nodes share a token")
		}
		for _, c := range []struct {
			to    node
			token string
			who   string
			want  int
		}{
			{f.nodes[1], f.nodes[1].token, "its own token", http.StatusOK},
			{f.nodes[1], f.nodes[0].token, "node-1's token", http.StatusUnauthorized},
			{f.nodes[1], f.env["SBX_TOKEN"], "the fleet's API token", http.StatusUnauthorized},
		} {
			if got := get(c.to, c.token); got != c.want {
				t.Errorf("node-2's API with %s: %d, want %d", c.who, got, c.want)
			}
		}
	})

	// node 1's own API, for what is a node's: templates, and a sandbox
	// made there rather than placed
	n1 := "--host=unix://" + f.nodes[0].socket
	t.Run("sandbox mirrored", func(t *testing.T) {
		if f.env["SBX_HOST"] != f.env["SBX_CONTROLLER"] {
			t.Fatalf("SBX_HOST %q is not the fleet's endpoint, the controller (%s)", f.env["SBX_HOST"], f.env["SBX_CONTROLLER"])
		}
		f.sbx(t, n1, "template", "build", "tiny")
		var sb api.Sandbox
		if err := json.Unmarshal([]byte(f.sbx(t, n1, "--json", "new", "--template", "tiny", "--name", "fleet-one")), &sb); err != nil || sb.ID == "" {
			t.Fatalf("sbx new: %v (%+v)", err, sb)
		}
		t.Cleanup(func() { f.run(t, true, filepath.Join(f.root, "bin", "sbx"), n1, "rm", sb.ID, "--yes") })
		var row map[string]string
		waitFor(t, sb.ID+" ready in kubectl get sandboxes", 60*time.Second, func() bool {
			row = f.sandboxRow(t, sb.ID)
			return row != nil && row["STATE"] == "ready"
		})
		want := map[string]string{"NAME": v1alpha1.ObjectName(sb.ID), "ID": sb.ID, "SBX NAME": "fleet-one", "TEMPLATE": "tiny", "STATE": "ready", "NODE": "node-1"}
		for k, v := range want {
			if row[k] != v {
				t.Errorf("kubectl get sandboxes: %s %q, want %q (row %v)", k, row[k], v, row)
			}
		}
		if row["AGE"] == "" || row["AGE"] == "<unknown>" {
			t.Errorf("kubectl get sandboxes: no AGE (row %v)", row)
		}
		f.sbx(t, n1, "stop", sb.ID)
		waitFor(t, sb.ID+" stopped in kubectl get sandboxes", 90*time.Second, func() bool {
			row = f.sandboxRow(t, sb.ID)
			return row != nil && row["STATE"] == "stopped"
		})
		mode := f.kube(t, "get", "sandbox", v1alpha1.ObjectName(sb.ID), "-o", `jsonpath={.spec.operatingMode} {.status.conditions[?(@.type=="Suspended")].status}`)
		if mode != "Suspended True" {
			t.Errorf("stopped sandbox: operatingMode and Suspended %q, want \"Suspended True\"", mode)
		}
		f.sbx(t, n1, "rm", sb.ID, "--yes")
		waitFor(t, sb.ID+" gone from kubectl get sandboxes", 60*time.Second, func() bool {
			_, err := f.run(t, true, f.kubectl, "get", "sandbox", v1alpha1.ObjectName(sb.ID))
			return err != nil && strings.Contains(err.Error(), "NotFound")
		})
	})

	// the apiserver away (stopped, so requests hang until they time out):
	// sbxd keeps serving, its agent retries, and catches up once it is back
	t.Run("apiserver away", func(t *testing.T) {
		api := f.pid(t, "kube-apiserver.pid")
		if err := syscall.Kill(api, syscall.SIGSTOP); err != nil {
			t.Fatal(err)
		}
		resumed := false
		resume := func() {
			if !resumed {
				resumed = true
				syscall.Kill(api, syscall.SIGCONT)
			}
		}
		t.Cleanup(resume)
		id := strings.TrimSpace(f.sbx(t, n1, "new", "--template", "tiny"))
		t.Cleanup(func() { f.run(t, true, filepath.Join(f.root, "bin", "sbx"), n1, "rm", id, "--yes") })
		logPath := filepath.Join(f.dir, f.nodes[0].name, "sbxd.log")
		waitFor(t, "node-1's agent to log a failure and retry", 90*time.Second, func() bool {
			b, _ := os.ReadFile(logPath)
			return bytes.Contains(b, []byte("failed; retrying"))
		})
		resume()
		waitFor(t, id+" mirrored once the apiserver is back", 120*time.Second, func() bool {
			row := f.sandboxRow(t, id)
			return row != nil && row["STATE"] == "ready"
		})
		if err := syscall.Kill(f.pid(t, f.nodes[0].name+"/sbxd.pid"), 0); err != nil {
			t.Errorf("node-1's sbxd is gone after the apiserver went away: %v", err)
		}
		f.sbx(t, n1, "rm", id, "--yes")
	})

	// one sandbox is left running for fleet.sh down to delete
	t.Run("left for down", func(t *testing.T) {
		id := strings.TrimSpace(f.sbx(t, n1, "new", "--template", "tiny"))
		waitFor(t, id+" in kubectl get sandboxes", 60*time.Second, func() bool {
			row := f.sandboxRow(t, id)
			return row != nil && row["STATE"] == "ready"
		})
		if left := leftovers(f.nodes[0].tag); len(left) == 0 {
			t.Errorf("a running sandbox of node-1 leaves nothing for leftovers() to see: it could not catch what down leaves")
		}
	})

	// the controller: one endpoint for the nodes and every node's sandboxes
	ctrl := f.env["SBX_CONTROLLER"]
	if ctrl == "" {
		t.Fatal("DIR/env has no SBX_CONTROLLER")
	}
	victimSandbox := ""
	t.Run("controller", func(t *testing.T) {
		var nodes struct{ Nodes []api.Node }
		waitFor(t, "both nodes ready at the controller", 60*time.Second, func() bool {
			if err := json.Unmarshal([]byte(f.sbx(t, "--host", ctrl, "--json", "node", "ls")), &nodes); err != nil {
				t.Fatal(err)
			}
			return len(nodes.Nodes) == 2 && nodes.Nodes[0].Ready && nodes.Nodes[1].Ready
		})
		if n := nodes.Nodes[0]; n.Name != "node-1" || n.Address == "" || n.Renewed == nil || n.Cordoned {
			t.Errorf("node-1 at the controller: %+v", n)
		}
		// a sandbox on node-2, made through node-2's own API
		victimSandbox = strings.TrimSpace(f.sbx(t, "--host", "unix://"+f.nodes[1].socket, "new", "--template", "tiny"))
		var list struct{ Sandboxes []api.Sandbox }
		waitFor(t, "node-2's sandbox in the controller's list", 60*time.Second, func() bool {
			if err := json.Unmarshal([]byte(f.sbx(t, "--host", ctrl, "--json", "list")), &list); err != nil {
				t.Fatal(err)
			}
			return slices.ContainsFunc(list.Sandboxes, func(sb api.Sandbox) bool {
				return sb.ID == victimSandbox && sb.Node == "node-2" && sb.State == api.StateReady
			})
		})
		if !slices.ContainsFunc(list.Sandboxes, func(sb api.Sandbox) bool { return sb.Node == "node-1" }) {
			t.Errorf("the controller lists no sandbox of node-1: %+v", list.Sandboxes)
		}
		// node-2's own sbxd says its node too
		var info struct{ Sandbox api.Sandbox }
		if err := json.Unmarshal([]byte(f.sbx(t, "--host", "unix://"+f.nodes[1].socket, "--json", "info", victimSandbox)), &info); err != nil || info.Sandbox.Node != "node-2" {
			t.Errorf("node-2's info of its sandbox: %+v, %v", info.Sandbox, err)
		}
		f.sbx(t, "--host", ctrl, "node", "cordon", "node-1")
		if got := f.kube(t, "get", "sandboxnode", "node-1", "-o", "jsonpath={.spec.unschedulable}"); got != "true" {
			t.Errorf("cordoned node-1: spec.unschedulable %q", got)
		}
		f.sbx(t, "--host", ctrl, "node", "uncordon", "node-1")
		if got := f.kube(t, "get", "sandboxnode", "node-1", "-o", "jsonpath={.spec.unschedulable}"); got != "false" {
			t.Errorf("uncordoned node-1: spec.unschedulable %q", got)
		}
		if _, err := f.run(t, true, filepath.Join(f.root, "bin", "sbx"), "--host", ctrl, "node", "cordon", "node-9"); err == nil || !strings.Contains(err.Error(), "no node") {
			t.Errorf("cordon of an unknown node: %v", err)
		}
		// one sbxd is no fleet, and says so
		if _, err := f.run(t, true, filepath.Join(f.root, "bin", "sbx"), "--host", "unix://"+f.nodes[0].socket, "node", "ls"); err == nil || !strings.Contains(err.Error(), "not a fleet") {
			t.Errorf("sbx node ls at one sbxd: %v", err)
		}
	})

	// the controller as the fleet's one endpoint (SBX_HOST): a create
	// placed and made by a node, then exec, files, logs, info by name and
	// rm through it, each going on to that node
	t.Run("through the controller", func(t *testing.T) {
		var sb api.Sandbox
		out := f.sbx(t, "--json", "new", "--template", "tiny", "--name", "fleet-two")
		if err := json.Unmarshal([]byte(out), &sb); err != nil || sb.ID == "" {
			t.Fatalf("sbx new through the controller: %v\n%s", err, out)
		}
		t.Cleanup(func() { f.run(t, true, filepath.Join(f.root, "bin", "sbx"), "rm", sb.ID, "--yes") })
		if sb.State != api.StateReady || (sb.Node != "node-1" && sb.Node != "node-2") || sb.Name != "fleet-two" {
			t.Fatalf("sbx new through the controller: %+v, want ready on a node of the fleet, named fleet-two", sb)
		}
		var node string
		for _, n := range f.nodes {
			if n.name == sb.Node {
				node = "--host=unix://" + n.socket
			}
		}
		// the node made it, and says so itself
		var info struct{ Sandbox api.Sandbox }
		if err := json.Unmarshal([]byte(f.sbx(t, node, "--json", "info", sb.ID)), &info); err != nil || info.Sandbox.Node != sb.Node || info.Sandbox.Name != "fleet-two" {
			t.Errorf("%s's own info of %s: %+v, %v", sb.Node, sb.ID, info.Sandbox, err)
		}

		// exec: stdout, stderr and the exit code, by name
		stdout, err := f.run(t, true, filepath.Join(f.root, "bin", "sbx"), "exec", "fleet-two", "--", "sh", "-c", "echo out-$((6*7)); echo err-side >&2; exit 3")
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.ExitCode() != 3 {
			t.Errorf("sbx exec through the controller: %v, want exit code 3", err)
		}
		if stdout != "out-42\n" || err == nil || !strings.Contains(err.Error(), "err-side") {
			t.Errorf("sbx exec through the controller: stdout %q, %v; want out-42 and err-side on stderr", stdout, err)
		}

		// files in and out
		payload := make([]byte, 256<<10)
		rand.Read(payload)
		local := filepath.Join(t.TempDir(), "in")
		if err := os.WriteFile(local, payload, 0o644); err != nil {
			t.Fatal(err)
		}
		f.sbx(t, "scp", local, sb.ID+":/tmp/in")
		if got := strings.TrimSpace(f.sbx(t, "exec", sb.ID, "--", "sha256sum", "/tmp/in")); !strings.HasPrefix(got, fileSHA256(t, local)) {
			t.Errorf("the file sent through the controller: sha256 %q, want %s", got, fileSHA256(t, local))
		}
		back := filepath.Join(t.TempDir(), "out")
		f.sbx(t, "scp", "fleet-two:/tmp/in", back)
		if got, err := os.ReadFile(back); err != nil || !bytes.Equal(got, payload) {
			t.Errorf("the file fetched through the controller differs (%d bytes, %v)", len(got), err)
		}
		if _, err := f.run(t, true, filepath.Join(f.root, "bin", "sbx"), "scp", sb.ID+":/no/such/file", back); err == nil || !strings.Contains(err.Error(), "/no/such/file does not exist") {
			t.Errorf("scp of a missing file through the controller: %v", err)
		}

		// a detached exec's output, followed through the controller
		var ex api.Exec
		if err := json.Unmarshal([]byte(f.sbx(t, "--json", "exec", "-d", sb.ID, "--", "sh", "-c", "echo first; sleep 1; echo second")), &ex); err != nil || ex.ID == "" {
			t.Fatalf("sbx exec -d through the controller: %v %+v", err, ex)
		}
		if got := f.sbx(t, "logs", sb.ID, "--exec", ex.ID, "--follow"); got != "first\nsecond\n" {
			t.Errorf("sbx logs --exec --follow through the controller: %q", got)
		}

		// a memory snapshot through the controller: listed with its node,
		// and a sandbox made from it on that node, its memory restored
		f.sbx(t, "snapshot", sb.ID, "fleet-snap", "--memory")
		t.Cleanup(func() { f.run(t, true, filepath.Join(f.root, "bin", "sbx"), "snapshot", "rm", "fleet-snap") })
		var sns struct{ Snapshots []api.Snapshot }
		if err := json.Unmarshal([]byte(f.sbx(t, "--json", "snapshot", "ls")), &sns); err != nil {
			t.Fatal(err)
		}
		if !slices.ContainsFunc(sns.Snapshots, func(sn api.Snapshot) bool { return sn.Name == "fleet-snap" && sn.Node == sb.Node && sn.Memory }) {
			t.Errorf("sbx snapshot ls through the controller: %+v, want fleet-snap on %s", sns.Snapshots, sb.Node)
		}
		var child api.Sandbox
		if err := json.Unmarshal([]byte(f.sbx(t, "--json", "new", "--from", "fleet-snap")), &child); err != nil || child.ID == "" {
			t.Fatalf("sbx new --from through the controller: %v %+v", err, child)
		}
		t.Cleanup(func() { f.run(t, true, filepath.Join(f.root, "bin", "sbx"), "rm", child.ID, "--yes") })
		if child.Node != sb.Node || !child.MemoryRestored || child.State != api.StateReady {
			t.Errorf("the sandbox from fleet-snap: %+v, want ready on %s with its memory", child, sb.Node)
		}
		if got := strings.TrimSpace(f.sbx(t, "exec", child.ID, "--", "sha256sum", "/tmp/in")); !strings.HasPrefix(got, fileSHA256(t, local)) {
			t.Errorf("the sandbox from fleet-snap lacks the file its parent had: %q", got)
		}
		f.sbx(t, "rm", child.ID, "--yes")
		f.sbx(t, "snapshot", "rm", "fleet-snap")
		if _, err := f.run(t, true, filepath.Join(f.root, "bin", "sbx"), "new", "--from", "fleet-snap"); err == nil || !strings.Contains(err.Error(), "no snapshot") {
			t.Errorf("sbx new --from a removed snapshot through the controller: %v", err)
		}

		// kubectl shows it on its node; rm through the controller ends it
		if row := f.sandboxRow(t, sb.ID); row == nil || row["NODE"] != sb.Node || row["SBX NAME"] != "fleet-two" {
			t.Errorf("kubectl get sandboxes: %v, want fleet-two on %s", row, sb.Node)
		}
		f.sbx(t, "rm", "fleet-two", "--yes")
		if _, err := f.run(t, true, filepath.Join(f.root, "bin", "sbx"), "info", sb.ID); err == nil || !(strings.Contains(err.Error(), "not found") || strings.Contains(err.Error(), "no sandbox")) {
			// "not found" from its node, or "no sandbox ... on any node"
			// once its agent removed the object
			t.Errorf("info after rm through the controller: %v, want not found", err)
		}
		if _, err := f.run(t, true, filepath.Join(f.root, "bin", "sbx"), node, "info", sb.ID); err == nil {
			t.Errorf("%s still has %s after rm through the controller", sb.Node, sb.ID)
		}
		// a bad create through the controller: the node's refusal, its kind kept
		if _, err := f.run(t, true, filepath.Join(f.root, "bin", "sbx"), "new", "--template", "no-such-template"); err == nil || !strings.Contains(err.Error(), "no-such-template") {
			t.Errorf("sbx new of an unknown template through the controller: %v", err)
		}
	})

	// a memory snapshot taken on node-1 restores on node-2: pushed to the
	// fleet's registry, pulled through the controller (node-1 cordoned, so
	// the pull is placed on node-2), and a sandbox made from it there has
	// the process it had, with its memory
	// a terminal through the controller: its WebSocket upgraded and
	// streamed both ways to the sandbox's node, as xterm.js would drive it
	t.Run("terminal through the controller", func(t *testing.T) {
		sb := strings.TrimSpace(f.sbx(t, "new", "--template", "tiny"))
		t.Cleanup(func() { f.run(t, true, filepath.Join(f.root, "bin", "sbx"), "rm", sb, "--yes") })
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		url := "ws://" + strings.TrimPrefix(ctrl, "tcp://") + "/v1/sandboxes/" + sb + "/exec/pty?cols=100&rows=30"
		c, _, err := websocket.Dial(ctx, url, &websocket.DialOptions{HTTPHeader: http.Header{"Authorization": {"Bearer " + f.env["SBX_TOKEN"]}}})
		if err != nil {
			t.Fatal(err)
		}
		defer c.CloseNow()
		var out strings.Builder
		readUntil := func(want string) string {
			t.Helper()
			out.Reset()
			for !strings.Contains(out.String(), want) {
				typ, b, err := c.Read(ctx)
				if err != nil {
					t.Fatalf("waiting for %q: %v; got %q", want, err, out.String())
				}
				if typ == websocket.MessageText {
					return string(b)
				}
				out.Write(b)
			}
			return ""
		}
		send := func(typ websocket.MessageType, s string) {
			t.Helper()
			if err := c.Write(ctx, typ, []byte(s)); err != nil {
				t.Fatal(err)
			}
		}
		send(websocket.MessageBinary, "echo hi-$((6*7)) $(hostname)\r")
		readUntil("hi-42 " + sb)
		send(websocket.MessageText, `{"type":"resize","cols":132,"rows":43}`)
		send(websocket.MessageBinary, "stty size\r")
		readUntil("43 132")
		send(websocket.MessageBinary, "exit 3\r")
		last := readUntil("\x00never")
		var got struct {
			Type string `json:"type"`
			Code *int   `json:"code"`
		}
		if err := json.Unmarshal([]byte(last), &got); err != nil || got.Type != "exit" || got.Code == nil || *got.Code != 3 {
			t.Fatalf("the terminal's last frame through the controller: %q, want exit 3", last)
		}
		f.sbx(t, "rm", sb, "--yes")
	})

	// a preview through the controller: `sbx preview` goes on to the
	// sandbox's node, whose preview URL (its own preview listener) reaches
	// the server in the sandbox
	t.Run("preview through the controller", func(t *testing.T) {
		bin := filepath.Join(f.root, "bin", "sbx")
		sb := strings.TrimSpace(f.sbx(t, "new", "--template", "tiny"))
		t.Cleanup(func() { f.run(t, true, bin, "rm", sb, "--yes") })
		f.sbx(t, "exec", "--detach", sb, "--", "sh", "-c", "mkdir -p /w && echo hi-from-$(hostname) > /w/i.txt && exec httpd -f -p 8080 -h /w")
		var u *url.URL
		waitFor(t, "a preview URL through the controller", 20*time.Second, func() bool {
			out, err := f.run(t, true, bin, "preview", sb, "8080")
			if err != nil {
				return false
			}
			u, err = url.Parse(strings.TrimSpace(out))
			return err == nil && u.Port() != ""
		})
		// the URL's name is the sandbox's (PORT-ID.localhost); its port is
		// its node's preview listener, on loopback
		hc := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{
			DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
				var d net.Dialer
				return d.DialContext(ctx, "tcp", "127.0.0.1:"+u.Port())
			},
		}}
		var body string
		waitFor(t, "the server through the preview URL", 20*time.Second, func() bool {
			resp, err := hc.Get(u.String() + "i.txt")
			if err != nil {
				return false
			}
			defer resp.Body.Close()
			b, _ := io.ReadAll(resp.Body)
			body = string(b)
			return resp.StatusCode == http.StatusOK
		})
		if body != "hi-from-"+sb+"\n" {
			t.Errorf("GET %si.txt: %q, want the sandbox's file", u, body)
		}
	})

	// each node's templates, as SandboxTemplate objects (the nodes share
	// one template cache here: tiny on both)
	t.Run("templates mirrored", func(t *testing.T) {
		waitFor(t, "tiny as a SandboxTemplate of each node", 30*time.Second, func() bool {
			out := f.kube(t, "get", "sandboxtemplates", "-o", "jsonpath={range .items[*]}{.metadata.name}={.spec.name}@{.status.nodes[0]}/{.status.version} {end}")
			return strings.Contains(out, "node-1.tiny=tiny@node-1/sha256:") && strings.Contains(out, "node-2.tiny=tiny@node-2/sha256:")
		})
	})

	t.Run("snapshot moves between nodes", func(t *testing.T) {
		reg := f.env["REGISTRY"]
		if reg == "" {
			t.Fatal("the fleet's env names no REGISTRY")
		}
		src := strings.TrimSpace(f.sbx(t, n1, "new", "--template", "tiny"))
		t.Cleanup(func() { f.run(t, true, filepath.Join(f.root, "bin", "sbx"), n1, "rm", src, "--yes") })
		first := f.holder(t, n1, src)
		f.sbx(t, n1, "snapshot", src, "moving", "--memory")
		t.Cleanup(func() { f.run(t, true, filepath.Join(f.root, "bin", "sbx"), n1, "snapshot", "rm", "moving") })
		var pushed api.PushResult
		if err := json.Unmarshal([]byte(f.sbx(t, "--json", "snapshot", "push", "moving", reg+"/sbx/moving:1")), &pushed); err != nil || !pushed.Memory {
			t.Fatalf("push through the controller: %+v %v", pushed, err)
		}
		f.sbx(t, "--host", ctrl, "node", "cordon", "node-1")
		defer f.sbx(t, "--host", ctrl, "node", "uncordon", "node-1")
		var pulled api.PullResult
		if err := json.Unmarshal([]byte(f.sbx(t, "--json", "snapshot", "pull", pushed.Ref, "--name", "moved")), &pulled); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { f.run(t, true, filepath.Join(f.root, "bin", "sbx"), "snapshot", "rm", "moved") })
		if pulled.Snapshot.Node != "node-2" || !pulled.Snapshot.Memory || pulled.MemoryLeft != "" {
			t.Fatalf("the pull through the controller: %+v, want on node-2 with its memory", pulled)
		}
		// kubectl sees both, each on its node (the agents mirror them)
		waitFor(t, "both snapshots as SandboxSnapshot objects", 30*time.Second, func() bool {
			out := f.kube(t, "get", "sandboxsnapshots", "-o", "jsonpath={range .items[*]}{.spec.name}@{.status.node}/{.spec.memory} {end}")
			return strings.Contains(out, "moving@node-1/true") && strings.Contains(out, "moved@node-2/true")
		})
		var child api.Sandbox
		if err := json.Unmarshal([]byte(f.sbx(t, "--json", "new", "--from", "moved")), &child); err != nil || child.ID == "" {
			t.Fatalf("sbx new --from the pulled snapshot: %v %+v", err, child)
		}
		t.Cleanup(func() { f.run(t, true, filepath.Join(f.root, "bin", "sbx"), "rm", child.ID, "--yes") })
		if child.Node != "node-2" || !child.MemoryRestored || child.State != api.StateReady {
			t.Fatalf("the sandbox from the moved snapshot: %+v, want ready on node-2 with its memory", child)
		}
		// the same process (token and pid) writes on, there
		f.sbx(t, "exec", child.ID, "--", "rm", "-f", "/tmp/now")
		waitFor(t, "the moved holder writing on", 20*time.Second, func() bool {
			out, err := f.run(t, true, filepath.Join(f.root, "bin", "sbx"), "exec", child.ID, "--", "cat", "/tmp/now")
			return err == nil && strings.TrimSpace(out) == first
		})
		f.sbx(t, "rm", child.ID, "--yes")
		f.sbx(t, "snapshot", "rm", "moved")
		waitFor(t, "the removed snapshot's object gone", 30*time.Second, func() bool {
			return !strings.Contains(f.kube(t, "get", "sandboxsnapshots", "-o", "jsonpath={range .items[*]}{.spec.name} {end}"), "moved")
		})

		// a freeze goes to the fleet's registry by itself: its ref is in
		// its record and its object, and pulled by it (node-1 still
		// cordoned) it restores on node-2 with the process as frozen
		said, err := f.run(t, true, filepath.Join(f.root, "bin", "sbx"), n1, "exec", src, "--", "sh", "-c", agent.FreezeCommand+" --reason fleet 2>&1")
		m := regexp.MustCompile(`as snapshot (freeze-[A-Za-z0-9._-]+)`).FindStringSubmatch(said)
		if err != nil || m == nil {
			t.Fatalf("freeze in %s: %v %q", src, err, said)
		}
		frozen := m[1]
		t.Cleanup(func() { f.run(t, true, filepath.Join(f.root, "bin", "sbx"), n1, "snapshot", "rm", frozen) })
		var info struct{ Snapshot api.Snapshot }
		waitFor(t, "the freeze's ref", 60*time.Second, func() bool {
			return json.Unmarshal([]byte(f.sbx(t, "--json", "snapshot", "info", frozen)), &info) == nil && strings.Contains(info.Snapshot.Ref, "@sha256:")
		})
		fz := info.Snapshot
		if !strings.HasPrefix(fz.Ref, reg+"/sbx/stops@") || fz.Node != "node-1" {
			t.Errorf("the freeze: %+v, want on node-1, in %s/sbx/stops", fz, reg)
		}
		waitFor(t, "the freeze's object pushed", 30*time.Second, func() bool {
			out := f.kube(t, "get", "sandboxsnapshots", "-o", "jsonpath={range .items[*]}{.spec.name}@{.status.state}@{.status.image} {end}")
			return strings.Contains(out, frozen+"@pushed@"+fz.Ref)
		})
		if err := json.Unmarshal([]byte(f.sbx(t, "--json", "snapshot", "pull", fz.Ref, "--name", "frozen-here")), &pulled); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { f.run(t, true, filepath.Join(f.root, "bin", "sbx"), "snapshot", "rm", "frozen-here") })
		if pulled.Snapshot.Node != "node-2" || !pulled.Snapshot.Memory {
			t.Fatalf("the freeze pulled: %+v, want on node-2 with its memory", pulled)
		}
		var thawed api.Sandbox
		if err := json.Unmarshal([]byte(f.sbx(t, "--json", "new", "--from", "frozen-here")), &thawed); err != nil || !thawed.MemoryRestored || thawed.Node != "node-2" {
			t.Fatalf("sbx new --from the pulled freeze: %+v %v", thawed, err)
		}
		t.Cleanup(func() { f.run(t, true, filepath.Join(f.root, "bin", "sbx"), "rm", thawed.ID, "--yes") })
		f.sbx(t, "exec", thawed.ID, "--", "rm", "-f", "/tmp/now")
		waitFor(t, "the frozen holder writing on, on node-2", 20*time.Second, func() bool {
			out, err := f.run(t, true, filepath.Join(f.root, "bin", "sbx"), "exec", thawed.ID, "--", "cat", "/tmp/now")
			return err == nil && strings.TrimSpace(out) == first
		})
	})

	// a stopped sandbox moves: stopped on node-1, node-1 cordoned, resumed
	// through the controller on node-2 with its memory (the same process,
	// by its token and pid); then node-2 drained, and it runs on node-1
	// again, its process still the same
	t.Run("stopped sandbox moves between nodes", func(t *testing.T) {
		bin := filepath.Join(f.root, "bin", "sbx")
		src := strings.TrimSpace(f.sbx(t, n1, "new", "--template", "tiny", "--name", "mover"))
		t.Cleanup(func() { f.run(t, true, bin, "rm", src, "--yes") })
		first := f.holder(t, n1, src)
		writesOn := func(what string) {
			t.Helper()
			f.sbx(t, "exec", src, "--", "rm", "-f", "/tmp/now")
			waitFor(t, what, 20*time.Second, func() bool {
				out, err := f.run(t, true, bin, "exec", src, "--", "cat", "/tmp/now")
				return err == nil && strings.TrimSpace(out) == first
			})
		}
		f.sbx(t, "stop", "--wait", "mover")
		f.sbx(t, "--host", ctrl, "node", "cordon", "node-1")
		defer f.sbx(t, "--host", ctrl, "node", "uncordon", "node-1")
		var resumed api.Sandbox
		if err := json.Unmarshal([]byte(f.sbx(t, "--json", "resume", "mover")), &resumed); err != nil {
			t.Fatal(err)
		}
		if resumed.ID != src || resumed.Node != "node-2" || !resumed.MemoryRestored || resumed.State != api.StateReady || resumed.Name != "mover" {
			t.Fatalf("the resume of a stopped sandbox on a cordoned node: %+v, want %s ready on node-2 with its memory and name", resumed, src)
		}
		writesOn("the moved holder writing on, on node-2")
		// one sandbox in the fleet, on node-2: node-1's copy is gone
		waitFor(t, "node-1's copy deleted", 30*time.Second, func() bool {
			_, err := f.run(t, true, bin, n1, "info", src)
			return err != nil
		})
		var info struct{ Sandbox api.Sandbox }
		if err := json.Unmarshal([]byte(f.sbx(t, "--json", "info", "mover")), &info); err != nil || info.Sandbox.Node != "node-2" {
			t.Fatalf("sbx info through the controller after the move: %+v %v", info, err)
		}
		waitFor(t, "its object on node-2, ready", 30*time.Second, func() bool {
			out := f.kube(t, "get", "sandboxes", "-l", "sbx.dev/sandbox-id="+strings.ReplaceAll(src, "_", "-"),
				"-o", "jsonpath={range .items[*]}{.metadata.labels.sbx\\.dev/node}/{.spec.nodeName}/{.status.node}/{.status.state} {end}")
			return strings.TrimSpace(out) == "node-2/node-2/node-2/ready"
		})
		f.sbx(t, "--host", ctrl, "node", "uncordon", "node-1")

		// drain node-2: the sandbox, ready there, is stopped, moved and
		// resumed on node-1, its process on
		var drained api.DrainResult
		if err := json.Unmarshal([]byte(f.sbx(t, "--json", "node", "drain", "node-2")), &drained); err != nil {
			t.Fatal(err)
		}
		defer f.sbx(t, "--host", ctrl, "node", "uncordon", "node-2")
		var mv *api.MoveResult
		for i := range drained.Moves {
			if drained.Moves[i].ID == src {
				mv = &drained.Moves[i]
			}
		}
		if mv == nil || mv.To != "node-1" || mv.State != api.StateReady || mv.Error != "" {
			t.Fatalf("sbx node drain node-2: %+v, want %s moved to node-1 and ready", drained, src)
		}
		// every sandbox of node-2 moved (the controller subtest's victim too)
		for _, m := range drained.Moves {
			if m.To != "node-1" || m.Error != "" {
				t.Errorf("drain: %+v did not move to node-1", m)
			}
		}
		var left struct{ Sandboxes []api.Sandbox }
		if err := json.Unmarshal([]byte(f.sbx(t, "--host=unix://"+f.nodes[1].socket, "--json", "list")), &left); err != nil || len(left.Sandboxes) != 0 {
			t.Errorf("node-2 holds %+v after its drain (%v)", left.Sandboxes, err)
		}
		writesOn("the drained holder writing on, on node-1")
		if err := json.Unmarshal([]byte(f.sbx(t, "--json", "info", src)), &info); err != nil || info.Sandbox.Node != "node-1" || !info.Sandbox.MemoryRestored {
			t.Fatalf("sbx info after the drain: %+v %v", info, err)
		}
		waitFor(t, "node-2's copy deleted", 30*time.Second, func() bool {
			_, err := f.run(t, true, bin, "--host=unix://"+f.nodes[1].socket, "info", src)
			return err != nil
		})
		f.sbx(t, "rm", src, "--yes")
		waitFor(t, "its object gone", 30*time.Second, func() bool {
			return !strings.Contains(f.kube(t, "get", "sandboxes", "-o", "name"), strings.ReplaceAll(src, "_", "-"))
		})
		// node-2 takes sandboxes again, and holds one for the killed
		// agent's subtest (the drain moved the controller subtest's)
		f.sbx(t, "--host", ctrl, "node", "uncordon", "node-2")
		victimSandbox = strings.TrimSpace(f.sbx(t, "--host", "unix://"+f.nodes[1].socket, "new", "--template", "tiny"))
	})

	// forks of one parent spread over both nodes: one capture, moved
	// through the registry, a create from it on each node; each child
	// carries on the parent's process, and is recorded as its fork
	t.Run("forks spread over two nodes", func(t *testing.T) {
		bin := filepath.Join(f.root, "bin", "sbx")
		parent := strings.TrimSpace(f.sbx(t, n1, "new", "--template", "tiny"))
		t.Cleanup(func() { f.run(t, true, bin, "rm", parent, "--yes") })
		first := f.holder(t, n1, parent)
		waitFor(t, "the parent's object ready", 30*time.Second, func() bool {
			out := f.kube(t, "get", "sandboxes", "-l", "sbx.dev/sandbox-id="+strings.ReplaceAll(parent, "_", "-"), "-o", "jsonpath={.items[*].status.state}")
			return strings.TrimSpace(out) == "ready"
		})
		var kids []api.Sandbox
		for _, line := range strings.Split(strings.TrimSpace(f.sbx(t, "--json", "fork", "--memory", "--count", "4", "--wait", "--ttl", "10m", parent)), "\n") {
			var l struct {
				Event   string
				Sandbox *api.Sandbox
			}
			if json.Unmarshal([]byte(line), &l) == nil && l.Event == api.ForkReady && l.Sandbox != nil {
				kids = append(kids, *l.Sandbox)
			}
		}
		nodes := map[string]int{}
		for _, k := range kids {
			t.Cleanup(func() { f.run(t, true, bin, "rm", k.ID, "--yes") })
			nodes[k.Node]++
		}
		if len(kids) != 4 || nodes["node-1"] == 0 || nodes["node-2"] == 0 {
			t.Fatalf("sbx fork --memory --count 4 through the controller: %d children on %v, want 4 over both nodes", len(kids), nodes)
		}
		for _, k := range kids {
			var info struct{ Sandbox api.Sandbox }
			if err := json.Unmarshal([]byte(f.sbx(t, "--json", "info", k.ID)), &info); err != nil {
				t.Fatal(err)
			}
			if s := info.Sandbox; s.Parent != parent || !s.MemoryRestored || s.State != api.StateReady || s.TTL.D() != 10*time.Minute {
				t.Errorf("child %s on %s: %+v, want a ready fork of %s with its memory and a 10m ttl", k.ID, k.Node, s, parent)
			}
			f.sbx(t, "exec", k.ID, "--", "rm", "-f", "/tmp/now")
			waitFor(t, "the parent's process writing on in "+k.ID, 20*time.Second, func() bool {
				out, err := f.run(t, true, bin, "exec", k.ID, "--", "cat", "/tmp/now")
				return err == nil && strings.TrimSpace(out) == first
			})
		}
		// the fork's snapshots are gone from every node
		if out := f.sbx(t, "snapshot", "ls"); strings.Contains(out, "fork-") {
			t.Errorf("a spread fork left its snapshots:\n%s", out)
		}
		for _, k := range kids {
			f.sbx(t, "rm", k.ID, "--yes")
		}
		f.sbx(t, "rm", parent, "--yes")
	})

	// the main job through the fleet's endpoint: a hunt of the bundled
	// flaky test keeps its failure (stopped with memory, on a node), which
	// resumes with its memory, and its flake rate is measured by forks
	t.Run("hunt through the controller", func(t *testing.T) {
		f.sbx(t, n1, "template", "build", "base")
		dir := t.TempDir()
		if out, err := exec.Command("cp", "-a", filepath.Join(f.root, "examples", "flaky")+"/.", dir).CombinedOutput(); err != nil {
			t.Fatalf("copy the example: %v\n%s", err, out)
		}
		sbxBin := filepath.Join(f.root, "bin", "sbx")
		t.Cleanup(func() {
			f.run(t, true, sbxBin, "rm", "fleet-hunt", "--yes")
			f.run(t, true, sbxBin, "rm", "fleet-hunt-fork", "--yes")
			f.run(t, true, sbxBin, "snapshot", "rm", "fleet-hunt")
		})
		hunt := exec.Command(sbxBin, "--json", "hunt", "--template", "base", "--runs", "40", "--name", "fleet-hunt", "--", "./test.sh")
		hunt.Dir = dir
		hunt.Env = os.Environ()
		for k, v := range f.env {
			hunt.Env = append(hunt.Env, k+"="+v)
		}
		out, err := hunt.Output()
		var summary *flaky.HuntSummary
		for _, l := range strings.Split(string(out), "\n") {
			var ev flaky.HuntEvent
			if json.Unmarshal([]byte(l), &ev) == nil && ev.Summary != nil {
				summary = ev.Summary
			}
		}
		if summary == nil || !summary.Failed || !summary.Stopped || summary.Snapshot == "" {
			t.Fatalf("sbx hunt through the controller: %v, summary %+v\n%s", err, summary, out)
		}
		var info struct{ Sandbox api.Sandbox }
		if err := json.Unmarshal([]byte(f.sbx(t, "--json", "info", "fleet-hunt")), &info); err != nil || info.Sandbox.State != api.StateStopped || info.Sandbox.Node == "" {
			t.Fatalf("the hunt's sandbox through the controller: %+v, %v; want stopped on a node", info.Sandbox, err)
		}
		if got := f.sbx(t, "resume", "fleet-hunt"); !strings.Contains(got, "memory restored") {
			t.Errorf("sbx resume of the hunt's failure through the controller: %q", got)
		}
		spreads := func() int {
			b, _ := os.ReadFile(filepath.Join(f.dir, "controller.log"))
			return strings.Count(string(b), "fleet: spread a fork")
		}
		before := spreads()
		rate := f.sbx(t, "flake-rate", "fleet-hunt", "-n", "6", "--", "cd /work && ./test.sh")
		if !strings.Contains(rate, "/6 failed") {
			t.Errorf("sbx flake-rate through the controller: %q", rate)
		}
		// its runs spread over the nodes (a fork of 6 spreads)
		if spreads() == before {
			t.Errorf("sbx flake-rate -n 6 through the controller: its forks did not spread over the nodes (the controller's log says no spread fork)")
		}
		// explain's runs too: monitored forks, made as flake-rate's are
		before = spreads()
		if got := f.sbx(t, "explain", "fleet-hunt", "-n", "6", "--knob-runs", "0", "--pnr-parents", "0", "--", "cd /work && ./test.sh"); !strings.Contains(got, "/6") {
			t.Errorf("sbx explain through the controller says no rate of 6 runs:\n%s", got)
		}
		if spreads() == before {
			t.Errorf("sbx explain -n 6 through the controller: its runs did not spread over the nodes (the controller's log says no spread fork)")
		}
	})

	// kubectl delete sandbox: the node deletes the sandbox, then the
	// object goes (the agent's finalizer holds it until then)
	t.Run("kubectl delete", func(t *testing.T) {
		var sb api.Sandbox
		if err := json.Unmarshal([]byte(f.sbx(t, "--json", "new", "--template", "tiny")), &sb); err != nil || sb.ID == "" {
			t.Fatalf("sbx new: %v %+v", err, sb)
		}
		t.Cleanup(func() { f.run(t, true, filepath.Join(f.root, "bin", "sbx"), "rm", sb.ID, "--yes") })
		var obj string
		waitFor(t, sb.ID+"'s object to carry the finalizer", 60*time.Second, func() bool {
			out, err := f.run(t, true, f.kubectl, "get", "sandboxes", "-l", v1alpha1.LabelSandboxID+"="+v1alpha1.ObjectName(sb.ID),
				"-o", "jsonpath={.items[0].metadata.name} {.items[0].metadata.finalizers}")
			name, fin, _ := strings.Cut(strings.TrimSpace(out), " ")
			obj = name
			return err == nil && strings.Contains(fin, v1alpha1.Finalizer)
		})
		f.kube(t, "delete", "sandbox", obj, "--wait", "--timeout", "90s")
		if _, err := f.run(t, true, filepath.Join(f.root, "bin", "sbx"), "info", sb.ID); err == nil {
			t.Errorf("%s is still in the fleet after kubectl delete sandbox %s", sb.ID, obj)
		}
		for _, n := range f.nodes {
			if n.name != sb.Node {
				continue
			}
			if _, err := f.run(t, true, filepath.Join(f.root, "bin", "sbx"), "--host=unix://"+n.socket, "info", sb.ID); err == nil {
				t.Errorf("%s still has %s after kubectl delete sandbox %s", n.name, sb.ID, obj)
			}
		}
	})

	// the controller SIGKILLed at a random instant while it places a burst
	// of Sandboxes and while a create through it waits, then started again
	// on its port: every object is made, and made once
	t.Run("controller killed", func(t *testing.T) {
		const burst = 6
		var items []string
		names := map[string]bool{}
		for i := range burst {
			name := fmt.Sprintf("burst-%d-%s", i, strconv.FormatInt(time.Now().UnixNano()%1e6, 36))
			names[name] = true
			items = append(items, fmt.Sprintf(`{"apiVersion":%q,"kind":"Sandbox","metadata":{"name":%q,"namespace":%q},"spec":{"template":"tiny"}}`,
				v1alpha1.APIVersion, name, v1alpha1.DefaultNamespace))
		}
		manifest := filepath.Join(t.TempDir(), "burst.json")
		if err := os.WriteFile(manifest, []byte(`{"apiVersion":"v1","kind":"List","items":[`+strings.Join(items, ",")+`]}`), 0o644); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			for name := range names {
				f.run(t, true, f.kubectl, "delete", "sandbox", name, "--wait=false")
			}
		})
		// a create through the controller, in flight when it dies
		inflight := exec.Command(filepath.Join(f.root, "bin", "sbx"), "new", "--template", "tiny", "--name", "killed-mid-create")
		inflight.Env = os.Environ()
		for k, v := range f.env {
			inflight.Env = append(inflight.Env, k+"="+v)
		}
		if err := inflight.Start(); err != nil {
			t.Fatal(err)
		}
		f.kube(t, "create", "-f", manifest)
		pid := f.pid(t, "controller.pid")
		time.Sleep(time.Duration(time.Now().UnixNano()%400) * time.Millisecond)
		if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
			t.Fatalf("kill the controller: %v", err)
		}
		inflightErr := inflight.Wait() // it ends with the controller, made or not
		waitFor(t, "the controller to die", 30*time.Second, func() bool { return syscall.Kill(pid, 0) != nil })
		if out, err := exec.Command(filepath.Join(f.root, "scripts", "fleet.sh"), "controller", f.dir).CombinedOutput(); err != nil {
			t.Fatalf("fleet.sh controller: %v\n%s", err, out)
		}
		names["killed-mid-create"] = false // asked by sbx name: the object is req-...
		// the kill may come before the in-flight create asked for its
		// object: then it is not made, and the client said it failed
		asked := func() bool {
			out, err := f.run(t, true, f.kubectl, "get", "sandboxes", "-o", "jsonpath={.items[*].spec.name}")
			return err == nil && slices.Contains(strings.Fields(out), "killed-mid-create")
		}
		want := burst + 1
		if !asked() {
			if inflightErr == nil {
				t.Errorf("sbx new through the controller succeeded, yet no object asks for killed-mid-create")
			}
			t.Logf("the controller died before the in-flight create asked for its object (%v): it is not made", inflightErr)
			delete(names, "killed-mid-create")
			want = burst
		}
		made := func() map[string][]string { // object or sbx name -> ids, over every node
			got := map[string][]string{}
			for _, n := range f.nodes {
				var list struct{ Sandboxes []api.Sandbox }
				if err := json.Unmarshal([]byte(f.sbx(t, "--host=unix://"+n.socket, "--json", "list")), &list); err != nil {
					t.Fatal(err)
				}
				for _, sb := range list.Sandboxes {
					if o := sb.Meta[v1alpha1.MetaObject]; names[o] {
						got[o] = append(got[o], sb.ID+"@"+n.name)
					}
					if sb.Name == "killed-mid-create" {
						got[sb.Name] = append(got[sb.Name], sb.ID+"@"+n.name)
					}
				}
			}
			return got
		}
		var got map[string][]string
		waitFor(t, "every object of the burst made after the restart", 3*time.Minute, func() bool {
			got = made()
			return len(got) == want
		})
		// settled: one more pass of every agent changes nothing
		time.Sleep(2 * time.Second)
		got = made()
		for name, ids := range got {
			if len(ids) != 1 {
				t.Errorf("%s was made %d times: %v", name, len(ids), ids)
			}
		}
		for name := range names {
			if _, ok := got[name]; !ok {
				t.Errorf("%s was never made", name)
			}
		}
		// placement spreads a burst: the node with more memory free first
		on := map[string]int{}
		for _, ids := range got {
			for _, idAt := range ids {
				_, n, _ := strings.Cut(idAt, "@")
				on[n]++
			}
		}
		if len(on) != 2 {
			t.Errorf("the burst was not spread over both nodes: %v", on)
		}
		for _, ids := range got {
			for _, idAt := range ids {
				id, _, _ := strings.Cut(idAt, "@")
				t.Cleanup(func() { f.run(t, true, filepath.Join(f.root, "bin", "sbx"), "rm", id, "--yes") })
			}
		}
	})

	// two replicas of the controller: one leads (holds Lease
	// sbx-controller: checks the nodes, places), the other serves the API
	// and stands by; a create through either is placed; the leader stopped
	// releases the Lease and the other leads, and so back again
	t.Run("controller replicas elect a leader", func(t *testing.T) {
		host, _ := os.Hostname()
		holder := func() string {
			out, _ := f.run(t, true, f.kubectl, "get", "lease", "sbx-controller", "-o", "jsonpath={.spec.holderIdentity}")
			return strings.TrimSpace(out)
		}
		first := host + "/" + strings.TrimPrefix(ctrl, "tcp://")
		waitFor(t, "the controller to lead", 30*time.Second, func() bool { return holder() == first })
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		addr := ln.Addr().String()
		ln.Close()
		logf, err := os.Create(filepath.Join(f.dir, "controller-2.log"))
		if err != nil {
			t.Fatal(err)
		}
		defer logf.Close()
		pki := filepath.Join(f.dir, "pki")
		replica := exec.Command(filepath.Join(f.root, "bin", "sbx-controller"), "--kubeconfig", filepath.Join(pki, "controller.kubeconfig"),
			"--listen", addr, "--token-file", filepath.Join(pki, "sbx-token"), "--node-token-key", filepath.Join(pki, "node-token-key"),
			"--move-repository", f.env["REGISTRY"]+"/sbx/moves")
		replica.Stdout, replica.Stderr = logf, logf
		if err := replica.Start(); err != nil {
			t.Fatal(err)
		}
		replicaDone := make(chan error, 1)
		go func() { replicaDone <- replica.Wait() }()
		stopReplica := func() {
			replica.Process.Signal(syscall.SIGTERM)
			select {
			case <-replicaDone:
			case <-time.After(20 * time.Second):
				replica.Process.Kill()
				<-replicaDone
				t.Error("the replica did not end within 20 s of SIGTERM")
			}
		}
		stopped := false
		t.Cleanup(func() {
			if !stopped {
				stopReplica()
			}
		})
		second, hostB := host+"/"+addr, "--host=tcp://"+addr
		bin := filepath.Join(f.root, "bin", "sbx")
		waitFor(t, "the replica to serve", 30*time.Second, func() bool {
			_, err := f.run(t, true, bin, hostB, "node", "ls")
			return err == nil
		})
		through := func(host, who string) {
			t.Helper()
			id := strings.TrimSpace(f.sbx(t, host, "new", "--template", "tiny"))
			defer f.run(t, true, bin, host, "rm", id, "--yes")
			if out := f.sbx(t, host, "exec", id, "--", "echo", "placed"); strings.TrimSpace(out) != "placed" {
				t.Errorf("a sandbox made through %s: exec says %q", who, out)
			}
		}
		through(hostB, "the follower")
		if h := holder(); h != first {
			t.Fatalf("the Lease is held by %q after the replica came, want %q", h, first)
		}
		// the leader stopped: it releases, and the replica leads
		pid := f.pid(t, "controller.pid")
		if err := syscall.Kill(pid, syscall.SIGTERM); err != nil {
			t.Fatal(err)
		}
		waitFor(t, "the first controller to end", 30*time.Second, func() bool { return syscall.Kill(pid, 0) != nil })
		waitFor(t, "the replica to lead", 30*time.Second, func() bool { return holder() == second })
		through(hostB, "the new leader")
		// the first again: it stands by until the replica goes
		if out, err := exec.Command(filepath.Join(f.root, "scripts", "fleet.sh"), "controller", f.dir).CombinedOutput(); err != nil {
			t.Fatalf("fleet.sh controller: %v\n%s", err, out)
		}
		if h := holder(); h != second {
			t.Errorf("the Lease went to %q as the first controller came back, want the replica's %q kept", h, second)
		}
		stopped = true
		stopReplica()
		waitFor(t, "the first controller to lead again", 30*time.Second, func() bool { return holder() == first })
		through("--host="+ctrl, "the controller leading again")
		b, _ := os.ReadFile(filepath.Join(f.dir, "controller-2.log"))
		for _, want := range []string{"another controller leads", "this controller leads", "this controller no longer leads"} {
			if !bytes.Contains(b, []byte(want)) {
				t.Errorf("the replica's log does not say %q", want)
			}
		}
	})

	// a memory image restores only where the runsc build, the CPU features
	// and the cache line allow: a node that reports another runsc sha256,
	// or fewer CPU features, is refused, and the object says why
	t.Run("incompatible node refused", func(t *testing.T) {
		var sn v1alpha1.SandboxNode
		if err := json.Unmarshal([]byte(f.kube(t, "get", "sandboxnode", "node-1", "-o", "json")), &sn); err != nil {
			t.Fatal(err)
		}
		st := sn.Status
		cases := []struct {
			name string
			img  v1alpha1.SandboxImage
			why  string
		}{
			{"other-runsc", v1alpha1.SandboxImage{Memory: true, RequireMemory: true, RunscSHA256: strings.Repeat("0", 64),
				CPUFeatures: st.CPUFeatures, CacheLineBytes: st.CacheLineBytes}, "runsc sha256 differs"},
			{"more-features", v1alpha1.SandboxImage{Memory: true, RequireMemory: true, RunscSHA256: st.RunscSHA256,
				CPUFeatures: append(slices.Clone(st.CPUFeatures), "sbxfake9000"), CacheLineBytes: st.CacheLineBytes}, "lacks CPU features"},
		}
		for _, tc := range cases {
			name := "needs-" + tc.name
			obj, err := json.Marshal(v1alpha1.Sandbox{
				TypeMeta:   metav1.TypeMeta{APIVersion: v1alpha1.APIVersion, Kind: v1alpha1.KindSandbox},
				ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: v1alpha1.DefaultNamespace},
				Spec:       v1alpha1.SandboxSpec{Template: "tiny", Image: &tc.img},
			})
			if err != nil {
				t.Fatal(err)
			}
			manifest := filepath.Join(t.TempDir(), name+".json")
			if err := os.WriteFile(manifest, obj, 0o644); err != nil {
				t.Fatal(err)
			}
			f.kube(t, "create", "-f", manifest)
			t.Cleanup(func() { f.run(t, true, f.kubectl, "delete", "sandbox", name, "--wait=false") })
			var msg string
			waitFor(t, name+" to say why it waits", 60*time.Second, func() bool {
				out, err := f.run(t, true, f.kubectl, "get", "sandbox", name, "-o",
					`jsonpath={.status.conditions[?(@.type=="Placed")].status}/{.status.conditions[?(@.type=="Placed")].message}`)
				status, m, _ := strings.Cut(out, "/")
				msg = m
				return err == nil && status == "False"
			})
			for _, n := range f.nodes {
				if !strings.Contains(msg, n.name+": ") {
					t.Errorf("%s: the why does not name %s: %q", name, n.name, msg)
				}
			}
			if strings.Count(msg, tc.why) != len(f.nodes) {
				t.Errorf("%s: want %q for each node, the why says %q", name, tc.why, msg)
			}
			if got := f.kube(t, "get", "sandbox", name, "-o", "jsonpath={.spec.nodeName}{.status.id}"); got != "" {
				t.Errorf("%s was placed or made: %q", name, got)
			}
		}
	})

	// a node agent killed in the middle of a stop, started again: it
	// reconciles as one sbxd does (the sandbox stopped with its image, or
	// ready, never lost), its object says so, and its process answers
	t.Run("node agent killed mid-capture", func(t *testing.T) {
		bin := filepath.Join(f.root, "bin", "sbx")
		node := f.nodes[0]
		onNode := "--host=unix://" + node.socket
		sb := strings.TrimSpace(f.sbx(t, onNode, "new", "--template", "tiny"))
		t.Cleanup(func() { f.run(t, true, bin, onNode, "rm", sb, "--yes") })
		first := f.holder(t, onNode, sb)
		f.sbx(t, onNode, "stop", sb)                                     // answers "stopping"; the stop goes on
		time.Sleep(time.Duration(50+mrand.IntN(400)) * time.Millisecond) // a random instant of the capture
		pid := f.pid(t, node.name+"/sbxd.pid")
		if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		waitFor(t, node.name+"'s sbxd to die", 30*time.Second, func() bool { return syscall.Kill(pid, 0) != nil })
		if out, err := exec.Command(filepath.Join(f.root, "scripts", "fleet.sh"), "node", f.dir, node.name).CombinedOutput(); err != nil {
			t.Fatalf("fleet.sh node: %v\n%s", err, out)
		}
		var info struct{ Sandbox api.Sandbox }
		waitFor(t, "the sandbox reconciled, stopped or ready", 60*time.Second, func() bool {
			if json.Unmarshal([]byte(f.sbx(t, onNode, "--json", "info", sb)), &info) != nil {
				return false
			}
			return info.Sandbox.State == api.StateStopped || info.Sandbox.State == api.StateReady
		})
		t.Logf("killed mid-stop, reconciled %s", info.Sandbox.State)
		waitFor(t, "its object saying so", 30*time.Second, func() bool {
			out := f.kube(t, "get", "sandboxes", "-l", "sbx.dev/sandbox-id="+strings.ReplaceAll(sb, "_", "-"), "-o", "jsonpath={.items[*].status.state}")
			return strings.TrimSpace(out) == string(info.Sandbox.State)
		})
		if info.Sandbox.State == api.StateStopped {
			f.sbx(t, "resume", sb)
		}
		f.sbx(t, "exec", sb, "--", "rm", "-f", "/tmp/now")
		waitFor(t, "its process writing on", 20*time.Second, func() bool {
			out, err := f.run(t, true, bin, "exec", sb, "--", "cat", "/tmp/now")
			return err == nil && strings.TrimSpace(out) == first
		})
		f.sbx(t, "rm", sb, "--yes")
	})

	t.Run("killed agent's lease stops", func(t *testing.T) {
		victim, other := f.nodes[1], f.nodes[0]
		bin := filepath.Join(f.root, "bin", "sbx")
		// a sandbox stopped on the victim: its stop image goes to the
		// fleet's registry, its object says where
		onVictim := "--host=unix://" + victim.socket
		stopped := strings.TrimSpace(f.sbx(t, onVictim, "new", "--template", "tiny"))
		t.Cleanup(func() { f.run(t, true, bin, "rm", stopped, "--yes") })
		first := f.holder(t, onVictim, stopped)
		f.sbx(t, onVictim, "stop", "--wait", stopped)
		waitFor(t, "its stop image's ref in its object", 60*time.Second, func() bool {
			out := f.kube(t, "get", "sandboxes", "-l", "sbx.dev/sandbox-id="+strings.ReplaceAll(stopped, "_", "-"),
				"-o", `jsonpath={.items[*].spec.meta.sbx\.image-ref}`)
			return strings.Contains(out, "@sha256:")
		})
		pid := f.pid(t, victim.name+"/sbxd.pid")
		if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
			t.Fatalf("kill %s's sbxd: %v", victim.name, err)
		}
		waitFor(t, victim.name+"'s sbxd to die", 30*time.Second, func() bool { return syscall.Kill(pid, 0) != nil })
		dead := f.leaseRenewTime(t, victim.name)
		// the live node renews twice meanwhile (every 5 s); the dead one never
		base := f.leaseRenewTime(t, other.name)
		waitFor(t, other.name+" to renew", 60*time.Second, func() bool { return f.leaseRenewTime(t, other.name).After(base) })
		base = f.leaseRenewTime(t, other.name)
		waitFor(t, other.name+" to renew again", 60*time.Second, func() bool { return f.leaseRenewTime(t, other.name).After(base) })
		if got := f.leaseRenewTime(t, victim.name); !got.Equal(dead) {
			t.Errorf("%s's lease renewed after its agent was killed: %v, then %v", victim.name, dead, got)
		}
		// the controller marks its sandboxes lost, with the reason, once its
		// Lease (15 s) has expired: here within 15 s of the expiry
		if victimSandbox == "" {
			t.Fatal("no sandbox on the victim (the controller subtest failed)")
		}
		var info struct{ Sandbox api.Sandbox }
		waitFor(t, victimSandbox+" lost at the controller", time.Until(dead.Add(30*time.Second)), func() bool {
			if err := json.Unmarshal([]byte(f.sbx(t, "--host", ctrl, "--json", "info", victimSandbox)), &info); err != nil {
				t.Fatal(err)
			}
			return info.Sandbox.State == api.StateLost
		})
		if r := info.Sandbox.Reason; !strings.Contains(r, "node "+victim.name+" is down") || !strings.Contains(r, "stopped renewing its Lease") {
			t.Errorf("lost, but the reason says: %q", r)
		}
		if row := f.sandboxRow(t, victimSandbox); row == nil || row["STATE"] != "lost" {
			t.Errorf("kubectl get sandboxes: %v", row)
		}
		var nodes struct{ Nodes []api.Node }
		if err := json.Unmarshal([]byte(f.sbx(t, "--host", ctrl, "--json", "node", "ls")), &nodes); err != nil {
			t.Fatal(err)
		}
		for _, n := range nodes.Nodes {
			if n.Name == victim.name && (n.Ready || !strings.Contains(n.Reason, "stopped renewing")) {
				t.Errorf("the dead node at the controller: %+v", n)
			}
			if n.Name == other.name && !n.Ready {
				t.Errorf("the live node at the controller: %+v", n)
			}
		}
		// the stopped one resumes on the live node, from the registry,
		// with its process; the running one cannot, and says why
		var resumed api.Sandbox
		if err := json.Unmarshal([]byte(f.sbx(t, "--json", "resume", stopped)), &resumed); err != nil {
			t.Fatal(err)
		}
		if resumed.Node != other.name || !resumed.MemoryRestored || resumed.State != api.StateReady {
			t.Fatalf("the resume of a dead node's stopped sandbox: %+v, want it ready on %s with its memory", resumed, other.name)
		}
		f.sbx(t, "exec", stopped, "--", "rm", "-f", "/tmp/now")
		waitFor(t, "its process writing on, on "+other.name, 20*time.Second, func() bool {
			out, err := f.run(t, true, bin, "exec", stopped, "--", "cat", "/tmp/now")
			return err == nil && strings.TrimSpace(out) == first
		})
		out, err := f.run(t, true, bin, "resume", victimSandbox)
		if err == nil || !strings.Contains(err.Error(), "it was running when its node was last heard of") {
			t.Errorf("a resume of the dead node's running sandbox: %v %q, want refused, saying it was running there", err, out)
		}
		f.sbx(t, "rm", stopped, "--yes")

		// kubectl delete of the dead node's running sandbox: its agent
		// cannot drop its finalizer, so the controller lets the object
		// go, noting it in the node's status; the node, back, deletes the
		// sandbox rather than mirror it again
		label := "sbx.dev/sandbox-id=" + strings.ReplaceAll(victimSandbox, "_", "-")
		f.kube(t, "delete", "sandboxes", "-l", label, "--wait=false")
		waitFor(t, "the object deleted while its node is down to go", 60*time.Second, func() bool {
			return strings.TrimSpace(f.kube(t, "get", "sandboxes", "-l", label, "-o", "name")) == ""
		})
		if noted := f.kube(t, "get", "sandboxnode", victim.name, "-o", "jsonpath={.status.deletedWhileDown[*].id}"); !strings.Contains(noted, victimSandbox) {
			t.Errorf("%s's status notes %q as deleted while it was down, want %s", victim.name, noted, victimSandbox)
		}
		if out, err := exec.Command(filepath.Join(f.root, "scripts", "fleet.sh"), "node", f.dir, victim.name).CombinedOutput(); err != nil {
			t.Fatalf("fleet.sh node: %v\n%s", err, out)
		}
		onVictim = "--host=unix://" + victim.socket
		waitFor(t, victimSandbox+" deleted on "+victim.name+" once it is back", 90*time.Second, func() bool {
			_, err := f.run(t, true, bin, onVictim, "info", victimSandbox)
			return err != nil && strings.Contains(err.Error(), "not found")
		})
		waitFor(t, victim.name+"'s list of objects deleted while it was down emptied", 60*time.Second, func() bool {
			return strings.TrimSpace(f.kube(t, "get", "sandboxnode", victim.name, "-o", "jsonpath={.status.deletedWhileDown}")) == ""
		})
		if got := strings.TrimSpace(f.kube(t, "get", "sandboxes", "-l", label, "-o", "name")); got != "" {
			t.Errorf("the sandbox deleted while its node was down has an object again: %s", got)
		}
	})

	// every write the agents and the controller made went through as
	// themselves: nothing they do needs more than deploy/rbac gives them
	t.Run("no write refused", func(t *testing.T) {
		logs := []string{filepath.Join(f.dir, "controller.log")}
		for _, n := range f.nodes {
			logs = append(logs, filepath.Join(f.dir, n.name, "sbxd.log"))
		}
		for _, l := range logs {
			b, err := os.ReadFile(l)
			if err != nil {
				t.Fatal(err)
			}
			for _, line := range strings.Split(string(b), "\n") {
				if strings.Contains(line, "forbidden") || strings.Contains(line, "denied request") {
					t.Errorf("%s: %s", filepath.Base(filepath.Dir(l))+"/"+filepath.Base(l), line)
				}
			}
		}
	})
}
