package placement

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"

	"sbx.dev/sbx/api"
	"sbx.dev/sbx/internal/fleet/v1alpha1"
)

// memoryImage is an image with memory recorded on runsc-a, avx2, 64 bytes.
func memoryImage(require bool, layers ...string) *v1alpha1.SandboxImage {
	return &v1alpha1.SandboxImage{
		Ref: "registry/sbx@sha256:img", Layers: layers, Memory: true,
		RunscSHA256: "runsc-a", CPUFeatures: []string{"avx2"}, CacheLineBytes: 64, RequireMemory: require,
	}
}

// withAgent is img with its processes on agent build key.
func withAgent(img *v1alpha1.SandboxImage, key string) *v1alpha1.SandboxImage {
	img.Agent = key
	return img
}

func TestRequestOf(t *testing.T) {
	sb := testSandbox("s", 0, 0)
	sb.Spec.DiskBytes = 0
	r, err := RequestOf(sb, Defaults{})
	if err != nil || r.MemoryBytes != DefaultMemoryBytes || r.DiskBytes != DefaultDiskBytes || r.MilliCPUs != 0 {
		t.Errorf("no sizes: %+v %v, want sbxd's defaults and no CPUs", r, err)
	}
	if r, _ := RequestOf(sb, Defaults{MemoryBytes: gib, DiskBytes: 3 * gib}); r.MemoryBytes != gib || r.DiskBytes != 3*gib {
		t.Errorf("the defaults given: %+v", r)
	}
	sb.Spec.CPUs = "0.5"
	if r, err := RequestOf(sb, Defaults{}); err != nil || r.MilliCPUs != 500 {
		t.Errorf("cpus 0.5: %+v %v", r, err)
	}
	for _, bad := range []string{"lots", "-1", "NaN", "+Inf"} {
		sb.Spec.CPUs = bad
		if _, err := RequestOf(sb, Defaults{}); !errors.Is(err, api.ErrInvalid) {
			t.Errorf("cpus %q: %v, want ErrInvalid", bad, err)
		}
	}
}

// TestFilterReasons: each rule rejects a node on its own, saying why, and
// a node failing several says each.
func TestFilterReasons(t *testing.T) {
	fresh := Request{MemoryBytes: 2 * gib, DiskBytes: gib}
	withImage := func(img *v1alpha1.SandboxImage) Request { r := fresh; r.Image = img; return r }
	tests := []struct {
		name  string
		node  func(n *v1alpha1.SandboxNode)
		bound []Request // bound to the node before
		req   Request
		want  []string // in the reason; none: the node fits
	}{
		{name: "fits", req: fresh},
		{name: "not ready", req: fresh, want: []string{"not ready: its node agent stopped renewing"}, node: func(n *v1alpha1.SandboxNode) {
			n.Status.Conditions[0].Status, n.Status.Conditions[0].Message = metav1.ConditionFalse, "its node agent stopped renewing its Lease"
		}},
		{name: "no ready condition", req: fresh, want: []string{"never published a Ready condition"}, node: func(n *v1alpha1.SandboxNode) {
			n.Status.Conditions = nil
		}},
		{name: "cordoned", req: fresh, want: []string{"cordoned"}, node: func(n *v1alpha1.SandboxNode) { n.Spec.Unschedulable = true }},
		{name: "runsc differs", req: withImage(memoryImage(true)), want: []string{"runsc sha256 differs (the image's runsc-a, the node's runsc-b)"},
			node: func(n *v1alpha1.SandboxNode) { n.Status.RunscSHA256 = "runsc-b" }},
		{name: "no runsc published", req: withImage(memoryImage(true)), want: []string{"publishes no runsc sha256"},
			node: func(n *v1alpha1.SandboxNode) { n.Status.RunscSHA256 = "" }},
		{name: "fewer CPU features", req: withImage(memoryImage(true)), want: []string{"lacks CPU features the image was recorded with: avx2"},
			node: func(n *v1alpha1.SandboxNode) { n.Status.CPUFeatures = []string{"sse4_2"} }},
		{name: "more CPU features", req: withImage(memoryImage(true)),
			node: func(n *v1alpha1.SandboxNode) { n.Status.CPUFeatures = append(n.Status.CPUFeatures, "avx512f") }},
		{name: "cache line differs", req: withImage(memoryImage(true)), want: []string{"cache line differs (the image's 64 bytes, the node's 128)"},
			node: func(n *v1alpha1.SandboxNode) { n.Status.CacheLineBytes = 128 }},
		{name: "an old agent build held", req: withImage(withAgent(memoryImage(true), "agent-old"))},
		{name: "agent build missing", req: withImage(withAgent(memoryImage(true), "agent-older")),
			want: []string{"lacks the agent build the image's processes run on (agent-older)"}},
		{name: "no agent builds published", req: withImage(withAgent(memoryImage(true), "agent-new")),
			want: []string{"publishes no agent builds"}, node: func(n *v1alpha1.SandboxNode) { n.Status.Agents = nil }},
		{name: "an image of before agent builds needs no match", req: withImage(memoryImage(true)),
			node: func(n *v1alpha1.SandboxNode) { n.Status.Agents = nil }},
		{name: "memory not required needs no agent build", req: withImage(withAgent(memoryImage(false), "agent-older"))},
		{name: "a fresh create needs no match", req: fresh, node: func(n *v1alpha1.SandboxNode) {
			n.Status.RunscSHA256, n.Status.CPUFeatures, n.Status.CacheLineBytes = "runsc-b", nil, 128
		}},
		{name: "memory not required needs no match", req: withImage(memoryImage(false)), node: func(n *v1alpha1.SandboxNode) {
			n.Status.RunscSHA256 = "runsc-b"
		}},
		{name: "a disk image needs no match", req: withImage(&v1alpha1.SandboxImage{Layers: []string{"sha256:l1"}}), node: func(n *v1alpha1.SandboxNode) {
			n.Status.RunscSHA256 = "runsc-b"
		}},
		{name: "memory", req: fresh, bound: []Request{{MemoryBytes: 7 * gib}}, want: []string{"too little memory: asks 2 GiB, 1 GiB left of 8 GiB"}},
		{name: "memory exactly left", req: fresh, bound: []Request{{MemoryBytes: 6 * gib}}},
		{name: "cpus", req: Request{MemoryBytes: gib, MilliCPUs: 1500}, bound: []Request{{MilliCPUs: 1000}}, want: []string{"too few CPUs: asks 1.5, 1 left of 2"}},
		{name: "no cpus asked, none needed", req: Request{MemoryBytes: gib}, bound: []Request{{MilliCPUs: 2000}}},
		{name: "disk", req: Request{MemoryBytes: gib, DiskBytes: 1000 * gib}, bound: []Request{{DiskBytes: 100 * gib}}, want: []string{"too little disk: asks 1000 GiB, 924 GiB free"}},
		{name: "every reason", req: withImage(memoryImage(true)), bound: []Request{{MemoryBytes: 8 * gib}}, node: func(n *v1alpha1.SandboxNode) {
			n.Spec.Unschedulable = true
			n.Status.RunscSHA256 = "runsc-b"
		}, want: []string{"cordoned; runsc sha256 differs", "; too little memory"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			sn := testNode("node-2", 8, 2)
			if tc.node != nil {
				tc.node(sn)
			}
			n := NewNode(sn)
			for i, r := range tc.bound {
				n.Add(&v1alpha1.Sandbox{Spec: v1alpha1.SandboxSpec{NodeName: "node-2"}, ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprint(i)}}, r)
			}
			fit, rejected := Filter([]*Node{n}, tc.req)
			if len(tc.want) == 0 {
				if len(fit) != 1 || len(rejected) != 0 {
					t.Fatalf("rejected: %v, want it to fit", rejected)
				}
				return
			}
			if len(fit) != 0 || len(rejected) != 1 {
				t.Fatalf("fit %d, rejected %v: want it rejected", len(fit), rejected)
			}
			got := rejected[0].String()
			if !strings.HasPrefix(got, "node-2: ") {
				t.Errorf("got %q, want it to name the node", got)
			}
			for _, w := range tc.want {
				if !strings.Contains(got, w) {
					t.Errorf("got %q, want it to say %q", got, w)
				}
			}
		})
	}
}

// TestUsedCounts: what holds a node's room and what does not.
func TestUsedCounts(t *testing.T) {
	n := NewNode(testNode("n", 8, 2))
	r := Request{MemoryBytes: gib, MilliCPUs: 500, DiskBytes: 4 * gib, Parent: "sb_p"}
	for _, st := range []api.State{"", api.StateReady, api.StateStopped, api.StateLost, api.StateDeleted} {
		n.Add(&v1alpha1.Sandbox{Status: v1alpha1.SandboxStatus{State: string(st)}}, r)
	}
	want := Used{Sandboxes: 3, MemoryBytes: 2 * gib, MilliCPUs: 1000, PendingDiskBytes: 4 * gib}
	if diff := cmp.Diff(want, n.Used()); diff != "" {
		t.Errorf("used (-want +got):\n%s", diff)
	}
	if got := n.Forks("sb_p"); got != 3 {
		t.Errorf("forks: got %d, want 3", got)
	}
}

// TestScoreOrder: memory that restores first, then fewer forks of the
// parent, then more of the image's layers, then more free memory, then
// the name.
func TestScoreOrder(t *testing.T) {
	type nodeSpec struct {
		name   string
		memGiB int64
		layers []string
		runsc  string
		forks  int // of sb_parent, bound already
	}
	tests := []struct {
		name  string
		nodes []nodeSpec
		req   Request
		want  []string
	}{
		{name: "more free memory", req: Request{MemoryBytes: gib},
			nodes: []nodeSpec{{name: "a", memGiB: 8}, {name: "b", memGiB: 16}, {name: "c", memGiB: 12}},
			want:  []string{"b", "c", "a"}},
		{name: "ties by name", req: Request{MemoryBytes: gib},
			nodes: []nodeSpec{{name: "c", memGiB: 8}, {name: "a", memGiB: 8}, {name: "b", memGiB: 8}},
			want:  []string{"a", "b", "c"}},
		{name: "layers before free memory", req: Request{MemoryBytes: gib, Image: &v1alpha1.SandboxImage{Layers: []string{"sha256:1", "sha256:2"}}},
			nodes: []nodeSpec{{name: "a", memGiB: 64}, {name: "b", memGiB: 8, layers: []string{"sha256:1"}}, {name: "c", memGiB: 8, layers: []string{"sha256:2", "sha256:1"}}},
			want:  []string{"c", "b", "a"}},
		{name: "fewer forks before free memory", req: Request{MemoryBytes: gib, Parent: "sb_parent"},
			nodes: []nodeSpec{{name: "a", memGiB: 64, forks: 2}, {name: "b", memGiB: 8, forks: 1}, {name: "c", memGiB: 16, forks: 1}},
			want:  []string{"c", "b", "a"}},
		{name: "fewer forks before layers", req: Request{MemoryBytes: gib, Parent: "sb_parent", Image: &v1alpha1.SandboxImage{Layers: []string{"sha256:1"}}},
			nodes: []nodeSpec{{name: "a", memGiB: 8, forks: 1, layers: []string{"sha256:1"}}, {name: "b", memGiB: 8}},
			want:  []string{"b", "a"}},
		{name: "forks of another parent do not count", req: Request{MemoryBytes: gib, Parent: "sb_other"},
			nodes: []nodeSpec{{name: "a", memGiB: 8, forks: 3}, {name: "b", memGiB: 4}},
			want:  []string{"a", "b"}},
		{name: "memory that restores first", req: Request{MemoryBytes: gib, Image: memoryImage(false, "sha256:1")},
			nodes: []nodeSpec{{name: "a", memGiB: 64, runsc: "runsc-b", layers: []string{"sha256:1"}}, {name: "b", memGiB: 8}},
			want:  []string{"b", "a"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var nodes []*Node
			for _, ns := range tc.nodes {
				sn := testNode(ns.name, ns.memGiB, 4)
				sn.Status.Layers = ns.layers
				if ns.runsc != "" {
					sn.Status.RunscSHA256 = ns.runsc
				}
				n := NewNode(sn)
				for range ns.forks {
					n.Add(&v1alpha1.Sandbox{Status: v1alpha1.SandboxStatus{State: "ready"}}, Request{MemoryBytes: 1, Parent: "sb_parent"})
				}
				nodes = append(nodes, n)
			}
			var got []string
			for rest := nodes; len(rest) > 0; {
				best := Choose(rest, tc.req)
				got = append(got, best.Name)
				var next []*Node
				for _, n := range rest {
					if n != best {
						next = append(next, n)
					}
				}
				rest = next
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("order (-want +got):\n%s", diff)
			}
		})
	}
	if Choose(nil, Request{}) != nil {
		t.Error("Choose of no nodes is not nil")
	}
}

func TestWhy(t *testing.T) {
	if got := Why(nil); !strings.Contains(got, "no SandboxNode") {
		t.Errorf("no nodes: %q", got)
	}
	var rs []Rejection
	for i := range 7 {
		rs = append(rs, Rejection{Node: fmt.Sprintf("node-%d", i), Reason: "cordoned"})
	}
	got := Why(rs)
	want := "no node of 7 can take it: node-0: cordoned; node-1: cordoned; node-2: cordoned; node-3: cordoned; node-4: cordoned; and 2 more"
	if got != want {
		t.Errorf("got %q, want %q", got, want)
	}
}

// TestPlace: a round binds the unbound, oldest first, to the best node,
// leaves the lost and the bound alone, and says why one waits.
func TestPlace(t *testing.T) {
	s := newAPIServer(t)
	s.put(t, testNode("node-1", 8, 2))
	big := testNode("node-2", 16, 2)
	s.put(t, big)
	cordoned := testNode("node-3", 64, 2)
	cordoned.Spec.Unschedulable = true
	s.put(t, cordoned)

	s.put(t, testSandbox("sb-new", 2, 2*time.Second))
	s.put(t, testSandbox("sb-old", 2, time.Second))
	lost := testSandbox("sb-lost", 2, 0)
	lost.Status.State = string(api.StateLost)
	s.put(t, lost)
	bound := testSandbox("sb-bound", 1, 0)
	bound.Spec.NodeName = "node-1"
	bound.Status.State = string(api.StateReady)
	s.put(t, bound)
	huge := testSandbox("sb-huge", 32, 3*time.Second)
	s.put(t, huge)

	p := newTestPlacer(s)
	s.dyn.ClearActions()
	round, err := p.Place(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	// sb-old first: node-2 (16 GiB free); then sb-new: node-2 has 14 GiB
	// free, node-1 7 GiB: node-2 again
	want := []Binding{{Sandbox: "sb-old", Node: "node-2"}, {Sandbox: "sb-new", Node: "node-2"}}
	if diff := cmp.Diff(want, round.Placed); diff != "" {
		t.Errorf("placed (-want +got):\n%s", diff)
	}
	// two lists and a bind each: the round trips of a round
	var verbs []string
	for _, a := range s.dyn.Actions() {
		verbs = append(verbs, a.GetVerb()+" "+a.GetResource().Resource)
	}
	if diff := cmp.Diff([]string{"list sandboxnodes", "list sandboxes", "update sandboxes", "update sandboxes"}, verbs); diff != "" {
		t.Errorf("round trips (-want +got):\n%s", diff)
	}
	if len(round.Waiting) != 1 || round.Waiting[0].Sandbox != "sb-huge" {
		t.Fatalf("waiting: %+v, want sb-huge", round.Waiting)
	}
	why := round.Waiting[0].Why
	for _, w := range []string{"no node of 3 can take it", "node-1: too little memory: asks 32 GiB, 7 GiB left of 8 GiB", "node-3: cordoned"} {
		if !strings.Contains(why, w) {
			t.Errorf("why %q: want it to say %q", why, w)
		}
	}
	if got := s.sandbox(t, "sb-lost").Spec.NodeName; got != "" {
		t.Errorf("a lost sandbox was placed on %s", got)
	}
	if got := s.sandbox(t, "sb-old").Spec.NodeName; got != "node-2" {
		t.Errorf("sb-old's nodeName: got %q, want node-2", got)
	}
	// a second round has nothing to do but say sb-huge still waits
	round, err = p.Place(context.Background())
	if err != nil || len(round.Placed) != 0 || len(round.Waiting) != 1 {
		t.Errorf("second round: %+v %v", round, err)
	}
}

// TestCapacityWithinRound: what a round binds counts against its node at
// once, with what was bound before (a stopped sandbox holds no memory).
func TestCapacityWithinRound(t *testing.T) {
	s := newAPIServer(t)
	s.put(t, testNode("node-1", 8, 2))
	ready := testSandbox("sb-ready", 2, 0)
	ready.Spec.NodeName, ready.Status.State = "node-1", string(api.StateReady)
	s.put(t, ready)
	stopped := testSandbox("sb-stopped", 4, 0)
	stopped.Spec.NodeName, stopped.Status.State = "node-1", string(api.StateStopped)
	s.put(t, stopped)
	for i := range 10 {
		s.put(t, testSandbox(fmt.Sprintf("sb-%02d", i), 2, time.Duration(i)*time.Second))
	}
	cpu := testSandbox("sb-cpu", 0, time.Hour)
	cpu.Spec.MemoryBytes, cpu.Spec.CPUs = 1, "2"
	s.put(t, cpu)
	round, err := newTestPlacer(s).Place(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	// 8 GiB less sb-ready's 2: three of 2 GiB
	want := []Binding{{"sb-00", "node-1"}, {"sb-01", "node-1"}, {"sb-02", "node-1"}}
	if diff := cmp.Diff(want, round.Placed); diff != "" {
		t.Errorf("placed (-want +got):\n%s", diff)
	}
	if len(round.Waiting) != 8 {
		t.Fatalf("waiting: got %d, want 8: %+v", len(round.Waiting), round.Waiting)
	}
	for _, w := range round.Waiting[:7] {
		if !strings.Contains(w.Why, "node-1: too little memory: asks 2 GiB, 0 B left of 8 GiB") {
			t.Errorf("%s waits: %q", w.Sandbox, w.Why)
		}
	}
	if w := round.Waiting[7]; w.Sandbox != "sb-cpu" || !strings.Contains(w.Why, "too little memory: asks 1 B, 0 B left") {
		t.Errorf("sb-cpu waits: %+v", w)
	}

	// CPUs: two of 1.5 on a 2-CPU node do not both fit
	s = newAPIServer(t)
	s.put(t, testNode("node-1", 64, 2))
	for i := range 2 {
		sb := testSandbox(fmt.Sprintf("sb-%d", i), 1, time.Duration(i))
		sb.Spec.CPUs = "1.5"
		s.put(t, sb)
	}
	round, err = newTestPlacer(s).Place(context.Background())
	if err != nil || len(round.Placed) != 1 || len(round.Waiting) != 1 || !strings.Contains(round.Waiting[0].Why, "too few CPUs: asks 1.5, 0.5 left of 2") {
		t.Errorf("cpus: %+v %v", round, err)
	}
}

// TestForksSpread: ten forks of one parent over three nodes, even when
// one node holds the layers and has the most memory.
func TestForksSpread(t *testing.T) {
	s := newAPIServer(t)
	home := testNode("node-1", 64, 8)
	home.Status.Layers = []string{"sha256:parent-mem"}
	s.put(t, home)
	s.put(t, testNode("node-2", 16, 8))
	s.put(t, testNode("node-3", 16, 8))
	for i := range 10 {
		sb := testSandbox(fmt.Sprintf("sb-fork-%d", i), 1, time.Duration(i))
		sb.Spec.Parent = "sb_parent"
		sb.Spec.Image = &v1alpha1.SandboxImage{Layers: []string{"sha256:parent-mem"}}
		s.put(t, sb)
	}
	round, err := newTestPlacer(s).Place(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	per := map[string]int{}
	for _, b := range round.Placed {
		per[b.Node]++
	}
	if diff := cmp.Diff(map[string]int{"node-1": 4, "node-2": 3, "node-3": 3}, per); diff != "" {
		t.Errorf("forks per node (-want +got):\n%s", diff)
	}
}

// TestBindConflict: a bind whose object changed since it was read is a
// Conflict; the placer reads it again and binds it only if still unbound.
func TestBindConflict(t *testing.T) {
	setup := func(t *testing.T) *apiserver {
		s := newAPIServer(t)
		s.put(t, testNode("node-1", 8, 2))
		s.put(t, testNode("node-2", 16, 2))
		s.put(t, testSandbox("sb-a", 2, 0))
		return s
	}
	t.Run("bound meanwhile", func(t *testing.T) {
		s := setup(t)
		s.beforeUpdate = func(name string) error {
			s.beforeUpdate = nil
			s.setNode(t, name, "node-1") // another placer, first
			return nil
		}
		round, err := newTestPlacer(s).Place(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		if len(round.Placed) != 0 || len(round.Raced) != 1 || round.Raced[0] != (Binding{"sb-a", "node-1"}) {
			t.Errorf("round: %+v, want sb-a raced to node-1", round)
		}
		if got := s.sandbox(t, "sb-a").Spec.NodeName; got != "node-1" {
			t.Errorf("nodeName: got %q, want the other placer's node-1", got)
		}
		if diff := cmp.Diff([]string{"node-1"}, s.bindsOf("sb-a")); diff != "" {
			t.Errorf("binds (-want +got):\n%s", diff)
		}
	})
	t.Run("changed, still unbound", func(t *testing.T) {
		s := setup(t)
		s.beforeUpdate = func(name string) error {
			s.beforeUpdate = nil
			s.setNode(t, name, "") // a status write, say: a new resourceVersion
			return nil
		}
		s.dyn.ClearActions()
		round, err := newTestPlacer(s).Place(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		if diff := cmp.Diff([]Binding{{"sb-a", "node-2"}}, round.Placed); diff != "" {
			t.Errorf("placed (-want +got):\n%s", diff)
		}
		var verbs []string
		for _, a := range s.dyn.Actions() {
			verbs = append(verbs, a.GetVerb())
		}
		if diff := cmp.Diff([]string{"list", "list", "update", "get", "update"}, verbs); diff != "" {
			t.Errorf("round trips (-want +got):\n%s", diff)
		}
	})
	t.Run("a conflict from the reactor", func(t *testing.T) {
		s := setup(t)
		conflicts := 0
		s.beforeUpdate = func(name string) error {
			conflicts++
			return apierrors.NewConflict(schema.GroupResource{Group: v1alpha1.Group, Resource: "sandboxes"}, name, errors.New("modified"))
		}
		round, err := newTestPlacer(s).Place(context.Background())
		if err == nil || !strings.Contains(err.Error(), "changed at each of 3 reads") {
			t.Errorf("err: %v, want it to give up after 3 reads", err)
		}
		if conflicts != maxReads || len(round.Placed) != 0 || s.sandbox(t, "sb-a").Spec.NodeName != "" {
			t.Errorf("conflicts %d, round %+v", conflicts, round)
		}
	})
	t.Run("deleted meanwhile", func(t *testing.T) {
		s := setup(t)
		s.beforeUpdate = func(name string) error {
			s.beforeUpdate = nil
			if err := s.dyn.Tracker().Delete(v1alpha1.SandboxesResource, v1alpha1.DefaultNamespace, name); err != nil {
				t.Fatal(err)
			}
			return apierrors.NewConflict(schema.GroupResource{Group: v1alpha1.Group, Resource: "sandboxes"}, name, errors.New("modified"))
		}
		round, err := newTestPlacer(s).Place(context.Background())
		if err != nil || len(round.Placed) != 0 {
			t.Errorf("round %+v, err %v", round, err)
		}
	})
}

// TestBindNeverOverwrites: Bind refuses a bound object, and one read
// without a resourceVersion, without a write.
func TestBindNeverOverwrites(t *testing.T) {
	s := newAPIServer(t)
	sb := testSandbox("sb-a", 1, 0)
	sb.Spec.NodeName = "node-1"
	s.put(t, sb)
	res := s.dyn.Resource(v1alpha1.SandboxesResource).Namespace(v1alpha1.DefaultNamespace)
	u, err := res.Get(context.Background(), "sb-a", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	s.dyn.ClearActions()
	if _, err := Bind(context.Background(), res, u, "node-2"); !errors.Is(err, api.ErrConflict) || !strings.Contains(err.Error(), "bound to node-1 already") {
		t.Errorf("bind of a bound sandbox: %v, want ErrConflict", err)
	}
	if err := unstructured.SetNestedField(u.Object, "", "spec", "nodeName"); err != nil {
		t.Fatal(err)
	}
	u.SetResourceVersion("")
	if _, err := Bind(context.Background(), res, u, "node-2"); !errors.Is(err, api.ErrInvalid) {
		t.Errorf("bind without a resourceVersion: %v, want ErrInvalid", err)
	}
	if n := len(s.dyn.Actions()); n != 0 {
		t.Errorf("%d writes, want none", n)
	}
	if got := s.sandbox(t, "sb-a").Spec.NodeName; got != "node-1" {
		t.Errorf("nodeName: %q", got)
	}
}

// TestNeverPlacedTwice: placers that race (two controllers), and one
// killed at a random bind and started again, bind each sandbox once.
func TestNeverPlacedTwice(t *testing.T) {
	const sandboxes = 300
	setup := func(t *testing.T) *apiserver {
		s := newAPIServer(t)
		for i := range 5 {
			s.put(t, testNode(fmt.Sprintf("node-%d", i), 1024, 64))
		}
		for i := range sandboxes {
			s.put(t, testSandbox(fmt.Sprintf("sb-%03d", i), 1, time.Duration(i)))
		}
		return s
	}
	check := func(t *testing.T, s *apiserver) {
		t.Helper()
		for i := range sandboxes {
			name := fmt.Sprintf("sb-%03d", i)
			if b := s.bindsOf(name); len(b) != 1 {
				t.Errorf("%s bound %d times: %v", name, len(b), b)
			}
		}
	}
	t.Run("two placers at once", func(t *testing.T) {
		s := setup(t)
		var wg sync.WaitGroup
		rounds := make([]Round, 2)
		errs := make([]error, 2)
		for i := range 2 {
			wg.Go(func() { rounds[i], errs[i] = newTestPlacer(s).Place(context.Background()) })
		}
		wg.Wait()
		for _, err := range errs {
			if err != nil {
				t.Error(err)
			}
		}
		placed := len(rounds[0].Placed) + len(rounds[1].Placed)
		if placed != sandboxes {
			t.Errorf("placed %d+%d, want %d in all", len(rounds[0].Placed), len(rounds[1].Placed), sandboxes)
		}
		check(t, s)
		t.Logf("placed %d and %d, raced %d and %d", len(rounds[0].Placed), len(rounds[1].Placed), len(rounds[0].Raced), len(rounds[1].Raced))
	})
	t.Run("a placer that read before the other bound", func(t *testing.T) {
		s := setup(t)
		listed, release := make(chan struct{}), make(chan struct{})
		var once sync.Once
		stale := New(Config{Logger: quiet}, gated{s.dyn, func() { once.Do(func() { close(listed); <-release }) }})
		var round Round
		var err error
		done := make(chan struct{})
		go func() { defer close(done); round, err = stale.Place(context.Background()) }()
		<-listed // the stale placer read every sandbox unbound, and is about to bind
		other, oerr := newTestPlacer(s).Place(context.Background())
		close(release)
		<-done
		if err != nil || oerr != nil {
			t.Fatal(err, oerr)
		}
		if len(other.Placed) != sandboxes || len(round.Placed) != 0 || len(round.Raced) != sandboxes {
			t.Errorf("the other placed %d; the stale one placed %d and found %d bound, want %d, 0, %d",
				len(other.Placed), len(round.Placed), len(round.Raced), sandboxes, sandboxes)
		}
		check(t, s)
	})
	t.Run("killed and restarted", func(t *testing.T) {
		for _, killAt := range []int{1, 17, 150, 299} {
			s := setup(t)
			ctx, kill := context.WithCancel(context.Background())
			updates := 0
			s.beforeUpdate = func(string) error {
				if updates++; updates == killAt {
					kill() // this bind still lands: the apiserver had it
				}
				return nil
			}
			first, _ := newTestPlacer(s).Place(ctx)
			kill()
			s.beforeUpdate = nil
			second, err := newTestPlacer(s).Place(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			if got := len(first.Placed) + len(second.Placed); got != sandboxes || len(second.Raced) != 0 {
				t.Errorf("kill at %d: placed %d then %d (raced %d), want %d in all", killAt, len(first.Placed), len(second.Placed), len(second.Raced), sandboxes)
			}
			check(t, s)
		}
	})
}

// gated is a dynamic client whose namespaced Updates call before first,
// outside the fake's lock: a test's way to hold a placer between its
// read and its bind.
type gated struct {
	dynamic.Interface
	before func()
}

func (g gated) Resource(r schema.GroupVersionResource) dynamic.NamespaceableResourceInterface {
	return gatedResource{g.Interface.Resource(r), g.before}
}

type gatedResource struct {
	dynamic.NamespaceableResourceInterface
	before func()
}

func (g gatedResource) Namespace(ns string) dynamic.ResourceInterface {
	return gatedNamespace{g.NamespaceableResourceInterface.Namespace(ns), g.before}
}

type gatedNamespace struct {
	dynamic.ResourceInterface
	before func()
}

func (g gatedNamespace) Update(ctx context.Context, obj *unstructured.Unstructured, opts metav1.UpdateOptions, sub ...string) (*unstructured.Unstructured, error) {
	g.before()
	return g.ResourceInterface.Update(ctx, obj, opts, sub...)
}
