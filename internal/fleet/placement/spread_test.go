package placement

import (
	"context"
	"testing"

	"sbx.dev/sbx/api"
	"sbx.dev/sbx/internal/fleet/v1alpha1"
)

// TestSpread: the forks of one parent go round the nodes that can take
// them (the parent's too), counting the forks already bound to each, its
// memory and what each has room for; a cordoned node, or one left out,
// takes none; forks no node has room for are left out, with the reasons.
func TestSpread(t *testing.T) {
	s := newAPIServer(t)
	s.put(t, testNode("node-1", 8, 2))
	s.put(t, testNode("node-2", 8, 2))
	s.put(t, testNode("node-3", 8, 2))
	cordoned := testNode("node-4", 64, 2)
	cordoned.Spec.Unschedulable = true
	s.put(t, cordoned)
	parent := testSandbox("sb-parent", 1, 0)
	parent.Spec.NodeName, parent.Status.State, parent.Status.ID = "node-1", string(api.StateReady), "sb_parentaaaa"
	s.put(t, parent)
	// a fork of it on node-2 already
	old := testSandbox("sb-old-fork", 1, 0)
	old.Spec.NodeName, old.Spec.Parent, old.Status.State = "node-2", "sb_parentaaaa", string(api.StateReady)
	s.put(t, old)
	p := newTestPlacer(s)
	img := &v1alpha1.SandboxImage{Memory: true, RequireMemory: true, RunscSHA256: "runsc-a", CPUFeatures: []string{"avx2"}, CacheLineBytes: 64}
	r := Request{MemoryBytes: gib, Parent: "sb_parentaaaa", Image: img}

	got, _, err := p.Spread(context.Background(), parent, r, 5, map[string]string{"node-3": "lacks the template"})
	if err != nil {
		t.Fatal(err)
	}
	count := map[string]int{}
	for _, n := range got {
		count[n]++
	}
	// node-1 and node-2 alone (node-3 left out, node-4 cordoned); node-2's
	// fork counts, so node-1 takes three and node-2 two
	if len(got) != 5 || count["node-1"] != 3 || count["node-2"] != 2 {
		t.Errorf("5 forks spread as %v (%v), want node-1 3, node-2 2", got, count)
	}

	// room for 7 a node (8 GiB, 1 GiB each; node-1's parent holds 1, node-2's
	// old fork 1): 14 of 20 placed, the rest said why
	got, rejected, err := p.Spread(context.Background(), parent, r, 20, map[string]string{"node-3": "lacks the template"})
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 14 || len(rejected) == 0 {
		t.Errorf("20 forks on two nodes with room for 14: %d placed, rejected %v", len(got), rejected)
	}
	// another runsc: no node fits the memory
	other := *img
	other.RunscSHA256 = "runsc-b"
	r.Image = &other
	if got, rejected, _ := p.Spread(context.Background(), parent, r, 2, nil); len(got) != 0 || len(rejected) != 4 {
		t.Errorf("forks whose memory restores nowhere: placed %v, rejected %v", got, rejected)
	}
}
