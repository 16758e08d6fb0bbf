// Package e2e tests the sbx fleet on a real control plane: etcd and
// kube-apiserver from `make fleet-tools`, and real sbxd node agents, all
// brought up by scripts/fleet.sh. It skips when the control plane is not
// built (bin/.fleet-dir missing).
package e2e

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"sbx.dev/sbx/api"
	"sbx.dev/sbx/internal/fleet/v1alpha1"
)

// fleet is one scripts/fleet.sh up DIR, seen from the test.
type fleet struct {
	root, dir string
	kubectl   string
	env       map[string]string // DIR/env
	nodes     []node            // DIR/nodes
}

type node struct{ name, tag, socket, addr string }

func repoRoot(t *testing.T) string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..", "..")
}

// startFleet brings up a fleet of n nodes, and down again when the test
// ends, pass or fail; it skips the test when nothing is built to run it.
func startFleet(t *testing.T, n int) *fleet {
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
	templates := os.Getenv("SBX_TEST_TEMPLATES")
	if templates == "" {
		templates = "/var/tmp/sbx-test-templates-fleet"
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
		f.nodes = append(f.nodes, node{w[0], w[1], w[2], w[3]})
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
		}
	}
	cg, _ := filepath.Glob("/sys/fs/cgroup/*/sbx-" + tag)
	for _, c := range cg {
		left = append(left, "cgroup "+c)
	}
	return left
}

func readEnv(t *testing.T, path string) map[string]string {
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
func (f *fleet) run(t *testing.T, mayFail bool, name string, args ...string) (string, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
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

func (f *fleet) kube(t *testing.T, args ...string) string {
	t.Helper()
	out, _ := f.run(t, false, f.kubectl, args...)
	return out
}

func (f *fleet) sbx(t *testing.T, args ...string) string {
	t.Helper()
	out, _ := f.run(t, false, filepath.Join(f.root, "bin", "sbx"), args...)
	return out
}

// waitFor polls cond until it holds or limit passes (no timing assertion:
// the limit is generous, for a 2-core machine under other tests).
func waitFor(t *testing.T, what string, limit time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(limit)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("gave up after %s waiting for %s", limit, what)
		}
		time.Sleep(250 * time.Millisecond)
	}
}

func (f *fleet) leaseRenewTime(t *testing.T, name string) time.Time {
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
func (f *fleet) sandboxRow(t *testing.T, id string) map[string]string {
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
func (f *fleet) pid(t *testing.T, file string) int {
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

func fileSHA256(t *testing.T, path string) string {
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

	t.Run("sandbox mirrored", func(t *testing.T) {
		if !strings.HasPrefix(f.env["SBX_HOST"], "tcp://"+f.nodes[0].addr) {
			t.Fatalf("SBX_HOST %q is not node 1's API (tcp://%s)", f.env["SBX_HOST"], f.nodes[0].addr)
		}
		f.sbx(t, "template", "build", "tiny")
		var sb api.Sandbox
		if err := json.Unmarshal([]byte(f.sbx(t, "--json", "new", "--template", "tiny", "--name", "fleet-one")), &sb); err != nil || sb.ID == "" {
			t.Fatalf("sbx new: %v (%+v)", err, sb)
		}
		t.Cleanup(func() { f.run(t, true, filepath.Join(f.root, "bin", "sbx"), "rm", sb.ID, "--yes") })
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
		f.sbx(t, "stop", sb.ID)
		waitFor(t, sb.ID+" stopped in kubectl get sandboxes", 90*time.Second, func() bool {
			row = f.sandboxRow(t, sb.ID)
			return row != nil && row["STATE"] == "stopped"
		})
		mode := f.kube(t, "get", "sandbox", v1alpha1.ObjectName(sb.ID), "-o", `jsonpath={.spec.operatingMode} {.status.conditions[?(@.type=="Suspended")].status}`)
		if mode != "Suspended True" {
			t.Errorf("stopped sandbox: operatingMode and Suspended %q, want \"Suspended True\"", mode)
		}
		f.sbx(t, "rm", sb.ID, "--yes")
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
		id := strings.TrimSpace(f.sbx(t, "new", "--template", "tiny"))
		t.Cleanup(func() { f.run(t, true, filepath.Join(f.root, "bin", "sbx"), "rm", id, "--yes") })
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
		f.sbx(t, "rm", id, "--yes")
	})

	// one sandbox is left running for fleet.sh down to delete
	t.Run("left for down", func(t *testing.T) {
		id := strings.TrimSpace(f.sbx(t, "new", "--template", "tiny"))
		waitFor(t, id+" in kubectl get sandboxes", 60*time.Second, func() bool {
			row := f.sandboxRow(t, id)
			return row != nil && row["STATE"] == "ready"
		})
		if left := leftovers(f.nodes[0].tag); len(left) == 0 {
			t.Errorf("a running sandbox of node-1 leaves nothing for leftovers() to see: it could not catch what down leaves")
		}
	})

	t.Run("killed agent's lease stops", func(t *testing.T) {
		victim, other := f.nodes[1], f.nodes[0]
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
	})
}
