// Package archtest holds the floors of ARCHITECTURE.md in tests that read
// the import graph (go list), so that a wall moved in the code and not on
// the map, or an arrow back up, fails `go test ./...` naming the edge.
package archtest

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"testing"
)

const module = "sbx.dev/sbx/"

// floors are ARCHITECTURE.md's floors, top down: a package imports only
// packages of the floors below its own (tests import anything). A name
// ending in /... stands for the packages below it.
var floors = [][]string{
	1: {"cmd/sbx", "cmd/sbxd", "cmd/sbx-shim", "cmd/sbx-agent", "cmd/sbx-controller"},
	2: {
		"client", "client/image", "internal/server", "internal/flaky", "internal/explain", "internal/explain/analyze",
		"internal/fleet/agent",
		"internal/fleet/controller", // the fleet's controller: the apiserver, and sbx's API for a fleet
		"internal/fleet/placement",  // the controller's filter, score and bind of Sandboxes to nodes
		"internal/agent",            // the sandbox's side: only cmd/sbx-agent links it (TestAgentOnlyInItsCommand)
		"freeze",                    // what a Go test inside a sandbox imports; nothing of sbx
	},
	3: {"internal/sandbox"},
	4: {"internal/runsc", "internal/netns", "internal/store", "internal/template", "internal/monitor", "internal/metrics", "internal/snapstore"},
	5: {
		"api", "internal/wire/...", "internal/atomicfile", "internal/procfs", "internal/cgroup", "internal/follow", "internal/safetar", "internal/safetar/tartest", "internal/fleet/v1alpha1", "internal/fleet/kube",
		"internal/agent/hooks", // files the manager puts beside the agent in /.sbx; no code of the agent
	},
}

// within are the imports allowed inside one floor: the workflows are built
// on the client, explain on flaky's, the fleet's controller on placement,
// and the shared pieces on api.
var within = map[string][]string{
	"client/image":              {"client"},
	"internal/flaky":            {"client"},
	"internal/explain":          {"client", "internal/flaky", "internal/explain/analyze"},
	"internal/fleet/controller": {"internal/fleet/placement"},
	"internal/wire/agentwire":   {"internal/wire/freezewire"}, // the agent's freeze answer carries the verdict
}

// floorOf is the floor of the sbx package p (module prefix cut), 0 if the
// table has none.
func floorOf(p string) int {
	for f, pkgs := range floors {
		for _, q := range pkgs {
			if q == p || strings.HasSuffix(q, "/...") && strings.HasPrefix(p, strings.TrimSuffix(q, "...")) {
				return f
			}
		}
	}
	return 0
}

// pkg is what go list says of a package.
type pkg struct {
	ImportPath string
	Standard   bool
	GoFiles    []string
	Imports    []string
	Deps       []string
	Error      *struct{ Err string }
}

// graph is every package of the module and all they import, by path.
var graph = sync.OnceValues(func() (map[string]*pkg, error) {
	var out, stderr bytes.Buffer
	cmd := exec.Command("go", "list", "-e", "-deps", "-json=ImportPath,Standard,GoFiles,Imports,Deps,Error", module+"...")
	cmd.Stdout, cmd.Stderr = &out, &stderr
	if err := cmd.Run(); err != nil {
		return nil, fmt.Errorf("go list: %w: %s", err, stderr.Bytes())
	}
	g := map[string]*pkg{}
	dec := json.NewDecoder(&out)
	for {
		var p pkg
		err := dec.Decode(&p)
		if errors.Is(err, io.EOF) {
			return g, nil
		}
		if err != nil {
			return nil, fmt.Errorf("go list's output: %w", err)
		}
		if p.Error != nil {
			return nil, fmt.Errorf("go list %s: %s", p.ImportPath, p.Error.Err)
		}
		g[p.ImportPath] = &p
	}
})

func load(t *testing.T) map[string]*pkg {
	t.Helper()
	g, err := graph()
	if err != nil {
		t.Fatal(err)
	}
	return g
}

// ours are the module's packages that hold code (not only tests), their
// paths without the module prefix.
func ours(g map[string]*pkg) []string {
	var ps []string
	for path, p := range g {
		if rest, ok := strings.CutPrefix(path, module); ok && len(p.GoFiles) > 0 {
			ps = append(ps, rest)
		}
	}
	slices.Sort(ps)
	return ps
}

// chain is the shortest import path from one package to another, as
// "a → b → c", module prefix cut.
func chain(g map[string]*pkg, from, to string) string {
	prev := map[string]string{from: ""}
	queue := []string{from}
	for len(queue) > 0 {
		p := queue[0]
		queue = queue[1:]
		if p == to {
			var hops []string
			for ; p != ""; p = prev[p] {
				hops = append(hops, strings.TrimPrefix(p, module))
			}
			slices.Reverse(hops)
			return strings.Join(hops, " → ")
		}
		if g[p] == nil {
			continue
		}
		for _, q := range g[p].Imports {
			if _, seen := prev[q]; !seen {
				prev[q] = p
				queue = append(queue, q)
			}
		}
	}
	return strings.TrimPrefix(from, module) + " → ... → " + strings.TrimPrefix(to, module)
}

// TestFloors: every package has a floor, and every import goes down.
func TestFloors(t *testing.T) {
	g := load(t)
	for _, p := range ours(g) {
		f := floorOf(p)
		if f == 0 {
			t.Errorf("%s has no floor: add it to ARCHITECTURE.md's Floors and to floors in %s", p, "internal/archtest/layers_test.go")
			continue
		}
		for _, imp := range g[module+p].Imports {
			q, ok := strings.CutPrefix(imp, module)
			if !ok {
				continue
			}
			switch fq := floorOf(q); {
			case fq == 0:
				// reported as a package without a floor
			case fq == f && !slices.Contains(within[p], q) && !(f == 5 && q == "api"):
				t.Errorf("%s imports %s: both are on floor %d, and that edge is not one of within's", p, q, f)
			case fq < f:
				t.Errorf("%s (floor %d) imports %s (floor %d): imports only go down ARCHITECTURE.md's floors", p, f, q, fq)
			}
		}
	}
}

// TestNoHTTPBelowServer: nothing below internal/server knows HTTP. api is
// the one exception: it is the HTTP API's wire (the route table, the status
// of each error kind).
func TestNoHTTPBelowServer(t *testing.T) {
	g := load(t)
	for _, p := range ours(g) {
		if floorOf(p) < 3 || p == "api" {
			continue
		}
		for _, imp := range g[module+p].Imports {
			if imp == "net/http" || strings.HasPrefix(imp, "net/http/") {
				t.Errorf("%s imports %s: nothing below internal/server knows HTTP (ARCHITECTURE.md, Floors)", p, imp)
			}
		}
	}
}

// TestAgentOnlyInItsCommand: the sandbox's PID-1 code is linked by
// cmd/sbx-agent alone; the CLI, the client and sbxd share with it only
// internal/wire.
func TestAgentOnlyInItsCommand(t *testing.T) {
	g := load(t)
	agent := module + "internal/agent"
	for _, p := range ours(g) {
		if p == "cmd/sbx-agent" || p == "internal/agent" {
			continue
		}
		if slices.Contains(g[module+p].Deps, agent) {
			t.Errorf("%s links internal/agent (%s): only cmd/sbx-agent may; share through internal/wire", p, chain(g, module+p, agent))
		}
	}
}

// TestClientSpeaksOnlyAPI: the client and what is built into it link no
// sbx package but api and the shared pieces of floor 5: not the manager,
// not the server, not the agent.
func TestClientSpeaksOnlyAPI(t *testing.T) {
	g := load(t)
	for _, c := range []string{"client", "client/image"} {
		for _, d := range g[module+c].Deps {
			q, ok := strings.CutPrefix(d, module)
			if !ok || floorOf(q) == 5 || c == "client/image" && q == "client" {
				continue
			}
			t.Errorf("%s links %s (%s): the client speaks only api", c, q, chain(g, module+c, d))
		}
	}
}

// maxClientDeps bounds what importing sbx.dev/sbx/client brings into an SDK
// user's build: packages outside the standard library, sbx's own included.
const maxClientDeps = 30

// TestClientDependencies: `go list -deps sbx.dev/sbx/client` names at most
// maxClientDeps packages whose path has a dot in its first element (the
// image import, with go-containerregistry, is client/image's).
func TestClientDependencies(t *testing.T) {
	g := load(t)
	c := module + "client"
	var non []string
	for _, d := range append([]string{c}, g[c].Deps...) {
		first, _, _ := strings.Cut(d, "/")
		if strings.Contains(first, ".") {
			non = append(non, d)
		}
	}
	if len(non) > maxClientDeps {
		t.Errorf("sbx.dev/sbx/client links %d packages outside the standard library, want at most %d:\n  %s", len(non), maxClientDeps, strings.Join(non, "\n  "))
		for _, d := range non {
			if !strings.HasPrefix(d, module) && slices.Contains(g[c].Imports, d) {
				t.Logf("imported by the client itself: %s", d)
			}
		}
	}
	t.Logf("sbx.dev/sbx/client links %d packages outside the standard library", len(non))
}
