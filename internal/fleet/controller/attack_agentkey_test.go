package controller

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"sbx.dev/sbx/api"
	"sbx.dev/sbx/internal/fleet/v1alpha1"
)

// Attacks on the agent builds of the fleet: a memory restore sent to a
// node that does not hold the agent build the memory's processes run on.

const (
	agentOld = "0123456789abcdef"
	agentNew = "fedcba9876543210"
)

// setNodeAgents sets node name's published agent builds.
func setNodeAgents(t *testing.T, f *testFleet, name string, agents ...string) {
	t.Helper()
	nodes := f.dyn.Resource(v1alpha1.SandboxNodesResource)
	u, err := nodes.Get(context.Background(), name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	_ = unstructured.SetNestedStringSlice(u.Object, agents, "status", "agents")
	if _, err := nodes.Update(context.Background(), u, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// setStatusAgent sets sandbox id's object's status.agent.
func setStatusAgent(t *testing.T, f *testFleet, id, agent string) {
	t.Helper()
	res := f.dyn.Resource(v1alpha1.SandboxesResource).Namespace(v1alpha1.DefaultNamespace)
	u, err := res.Get(context.Background(), v1alpha1.ObjectName(id), metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	_ = unstructured.SetNestedField(u.Object, agent, "status", "agent")
	if _, err := res.Update(context.Background(), u, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// TestAttackAgentKeyForkIgnoresParentAgent: a memory fork of a parent
// whose processes run on agent build agentOld, on node a, which holds it;
// node b holds only agentNew. The controller reads the parent through
// apiSandbox, which does not copy status.agent, so forkPlan's image names
// no agent and placement spreads children to b: b pulls the snapshot
// without its memory (sbxd's PullSnapshot refuses an agent it lacks) and
// the whole fork fails, where the parent's node alone would have forked
// it. The fleet's listing never shows a sandbox's agent either.
func TestAttackAgentKeyForkIgnoresParentAgent(t *testing.T) {
	f, _, b := forkFleet(t, nil)
	setNodeAgents(t, f, "a", agentOld, agentNew)
	setNodeAgents(t, f, "b", agentNew)
	setStatusAgent(t, f, forkParent, agentOld)

	// what the fleet says of the parent
	r := httptest.NewRequest(http.MethodGet, "/v1/sandboxes", nil)
	sb, pn, err := f.c.sandboxNode(r, forkParent)
	if err != nil {
		t.Fatal(err)
	}
	if sb.Agent != agentOld {
		t.Errorf("the fleet's view of the parent names agent %q, want %s (its object's status.agent)", sb.Agent, agentOld)
	}
	// the plan fork() makes of it
	plan, err := f.c.forkPlan(context.Background(), sb, pn, true, 2)
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range plan {
		if n == "b" {
			t.Errorf("a memory fork of a parent on agent %s planned onto node b, which holds only %s: %v", agentOld, agentNew, plan)
			break
		}
	}
	// and through the API: b is never asked to pull the parent's memory
	srv := httptest.NewServer(f.c.Handler())
	defer srv.Close()
	resp, err := http.Post(srv.URL+"/v1/sandboxes/"+forkParent+"/fork", "application/json", strings.NewReader(`{"count":2,"memory":true}`))
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, resp.Body) // the fork's end: its stream closes
	resp.Body.Close()
	b.mu.Lock()
	calls := append([]string(nil), b.calls...)
	b.mu.Unlock()
	for _, c := range calls {
		if strings.Contains(c, "/v1/snapshots/pull") {
			t.Errorf("node b, without agent %s, was asked to pull the memory fork's snapshot (calls %v)", agentOld, calls)
			break
		}
	}
}

// TestAttackAgentKeyLegacyRestoresNowhereElse: a stopped sandbox of dead
// node a whose memory runs on the legacy agent (an image of before the
// notes). Node b publishes "legacy" too (an sbxd upgraded in place keeps
// DATA_DIR/agent/sbx-agent), so placement takes b as a node where the
// memory restores; but no sbxd restores a legacy image another node
// pushed (PullSnapshot: "a legacy agent is whatever another node had
// last"), so b's adopt with the memory is refused ("its memory stayed
// behind") and a resume that does not require the memory fails, where it
// should have been adopted without the memory and booted from its disk.
func TestAttackAgentKeyLegacyRestoresNowhereElse(t *testing.T) {
	ctx := context.Background()
	const id = "sb_legacyaaaa"
	mn := newMoveNet(t, "a", "b")
	f := moveFleet(t, mn, id, "a")
	ref := "127.0.0.1:5000/sbx/stops:" + id + "-im_x@sha256:" + strings.Repeat("1", 64)
	mn.mu.Lock()
	mn.refs[ref] = id
	mn.mu.Unlock()
	setNodeAgents(t, f, "a", agentNew, "legacy")
	setNodeAgents(t, f, "b", agentNew, "legacy")
	res := f.dyn.Resource(v1alpha1.SandboxesResource).Namespace(v1alpha1.DefaultNamespace)
	u, err := res.Get(ctx, v1alpha1.ObjectName(id), metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	_ = unstructured.SetNestedField(u.Object, v1alpha1.OperatingModeSuspended, "spec", "operatingMode")
	_ = unstructured.SetNestedStringMap(u.Object, map[string]string{api.MetaImageRef: ref}, "spec", "meta")
	_ = unstructured.SetNestedField(u.Object, "legacy", "status", "agent")
	if _, err := res.Update(ctx, u, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	to, err := f.c.adoptElsewhere(ctx, id, "a", false, nil)
	if err != nil {
		t.Fatalf("not requiring the memory: %v", err)
	}
	mn.mu.Lock()
	adopts := mn.nodes["b"].adopts
	mn.mu.Unlock()
	if to.obj.GetName() != "b" || len(adopts) != 1 || !adopts[0].WithoutMemory {
		t.Errorf("node %s was asked %+v: want one adopt without the memory (no node restores a legacy image pushed from another; sbxd refuses the adopt with it)", to.obj.GetName(), adopts)
	}
}

// TestAttackAgentKeyMoveStaleObject: a move places by the object's
// status.agent, which lags the node by a pass of its agent: the sandbox
// was resumed from its disk on the node's current agent and stopped again
// since (its stop image is agentNew's), while the object still says
// agentOld. The move asks its node for its word on the image (GET) only
// after it placed, so it picks b (agentOld only), whose adopt then drops
// the memory, over c, which holds agentNew.
func TestAttackAgentKeyMoveStaleObject(t *testing.T) {
	const id = "sb_staleaaaaa"
	mn := newMoveNet(t, "n0", "b", "c")
	f := moveFleet(t, mn, id, "n0")
	setNodeAgents(t, f, "n0", agentNew, agentOld)
	setNodeAgents(t, f, "b", agentOld)
	setNodeAgents(t, f, "c", agentNew)
	setStatusAgent(t, f, id, agentOld) // the object's word, a pass old
	mn.mu.Lock()
	mn.nodes["n0"].sbs[id].Agent = agentNew // the node's word now
	mn.mu.Unlock()
	to, err := f.c.move(context.Background(), id, f.node(t, "n0"))
	if err != nil {
		t.Fatalf("move: %v", err)
	}
	if to.obj.GetName() != "c" {
		t.Errorf("moved to %s, whose agents lack %s (the image's, as its node says), want c", to.obj.GetName(), agentNew)
	}
}
