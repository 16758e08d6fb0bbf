package controller

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	kerrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	dynamicfake "k8s.io/client-go/dynamic/fake"
	k8stesting "k8s.io/client-go/testing"

	"sbx.dev/sbx/api"
	"sbx.dev/sbx/internal/fleet/v1alpha1"
)

// Attacks on the move of a stopped sandbox between nodes (move.go): the
// controller cut or raced at its steps, nodes that answer wrong. After
// each, the sandbox must have exactly one holder: the node its object is
// bound to holds a copy.

// enforceRV makes dyn's Sandboxes behave as an apiserver's do for
// optimistic concurrency: every write gives a new resourceVersion, and an
// update carrying an old one is a Conflict (the fake checks none).
func enforceRV(dyn *dynamicfake.FakeDynamicClient) {
	tr := dyn.Tracker()
	react := k8stesting.ObjectReaction(tr)
	gvr := v1alpha1.SandboxesResource
	var mu sync.Mutex
	rv := 1000
	next := func() string { rv++; return strconv.Itoa(rv) }
	dyn.PrependReactor("*", "sandboxes", func(ac k8stesting.Action) (bool, runtime.Object, error) {
		mu.Lock()
		defer mu.Unlock()
		switch a := ac.(type) {
		case k8stesting.CreateAction:
			m, err := meta.Accessor(a.GetObject())
			if err != nil {
				return true, nil, err
			}
			m.SetResourceVersion(next())
			if m.GetUID() == "" {
				m.SetUID(types.UID("uid-" + m.GetName()))
			}
			return react(ac)
		case k8stesting.UpdateAction:
			m, err := meta.Accessor(a.GetObject())
			if err != nil {
				return true, nil, err
			}
			cur, err := tr.Get(gvr, a.GetNamespace(), m.GetName())
			if err != nil {
				return true, nil, err
			}
			cm, _ := meta.Accessor(cur)
			if m.GetResourceVersion() != "" && m.GetResourceVersion() != cm.GetResourceVersion() {
				return true, nil, kerrors.NewConflict(gvr.GroupResource(), m.GetName(), errors.New("the object has been modified"))
			}
			m.SetResourceVersion(next())
			return react(ac)
		case k8stesting.PatchAction:
			ok, obj, err := react(ac)
			if err != nil || obj == nil {
				return ok, obj, err
			}
			m, _ := meta.Accessor(obj)
			m.SetResourceVersion(next())
			if err := tr.Update(gvr, obj, a.GetNamespace()); err != nil {
				return true, nil, err
			}
			return true, obj, nil
		}
		return false, nil, nil
	})
}

// moveNet plays the nodes' sbxds and the registry between them: a push
// records which sandbox a ref holds, an adopt makes a stopped copy of it.
type moveNet struct {
	mu    sync.Mutex
	refs  map[string]string // pushed ref: sandbox id
	nodes map[string]*fakeNode
}

type fakeNode struct {
	name string
	net  *moveNet
	srv  *httptest.Server
	sbs  map[string]*api.Sandbox // guarded by net.mu
	// hooks, run outside net.mu; a hook answering true has written the
	// answer itself
	onPush, onAdopt func(w http.ResponseWriter, id string) bool
	adopts          []api.AdoptRequest // every adopt asked, guarded by net.mu
}

func newMoveNet(t *testing.T, names ...string) *moveNet {
	mn := &moveNet{refs: map[string]string{}, nodes: map[string]*fakeNode{}}
	for _, name := range names {
		n := &fakeNode{name: name, net: mn, sbs: map[string]*api.Sandbox{}}
		n.srv = httptest.NewServer(http.HandlerFunc(n.serve))
		t.Cleanup(n.srv.Close)
		mn.nodes[name] = n
	}
	return mn
}

// put puts sandbox id on node in state.
func (mn *moveNet) put(node, id string, state api.State) {
	mn.mu.Lock()
	defer mn.mu.Unlock()
	mn.nodes[node].sbs[id] = &api.Sandbox{ID: id, State: state, Node: node}
}

// has is the state of node's copy of id, "" if none.
func (mn *moveNet) has(node, id string) api.State {
	mn.mu.Lock()
	defer mn.mu.Unlock()
	if sb := mn.nodes[node].sbs[id]; sb != nil {
		return sb.State
	}
	return ""
}

func (n *fakeNode) serve(w http.ResponseWriter, r *http.Request) {
	mn := n.net
	rest := strings.TrimPrefix(r.URL.Path, "/v1/sandboxes/")
	id, verb, _ := strings.Cut(rest, "/")
	switch {
	case r.Method == http.MethodPost && rest == "adopt":
		var req api.AdoptRequest
		_ = json.NewDecoder(r.Body).Decode(&req)
		mn.mu.Lock()
		n.adopts = append(n.adopts, req)
		id, ok := mn.refs[req.Ref]
		sb := n.sbs[id]
		switch {
		case !ok:
			mn.mu.Unlock()
			writeError(w, api.Errorf(api.ErrNotFound, "no artifact %s", req.Ref))
			return
		case req.ID != "" && req.ID != id: // as sbxd's AdoptSandbox
			mn.mu.Unlock()
			writeError(w, api.Errorf(api.ErrInvalid, "adopt %s: it holds sandbox %s, not %s", req.Ref, id, req.ID))
			return
		case sb != nil && sb.Meta[api.MetaAdopted] == req.Ref && sb.State == api.StateStopped:
		case sb != nil:
			mn.mu.Unlock()
			writeError(w, api.Errorf(api.ErrConflict, "adopt %s: sandbox %s is on this node already (%s)", req.Ref, id, sb.State))
			return
		default:
			sb = &api.Sandbox{ID: id, State: api.StateStopped, Node: n.name, Meta: map[string]string{api.MetaAdopted: req.Ref}}
			n.sbs[id] = sb
		}
		out := *sb
		mn.mu.Unlock()
		if n.onAdopt != nil && n.onAdopt(w, id) {
			return
		}
		writeJSON(w, http.StatusOK, out)
	case r.Method == http.MethodPost && verb == "push":
		var req api.PushRequest
		_ = json.NewDecoder(r.Body).Decode(&req)
		if n.onPush != nil && n.onPush(w, id) {
			return
		}
		mn.mu.Lock()
		sb := n.sbs[id]
		if sb == nil || sb.State != api.StateStopped {
			mn.mu.Unlock()
			writeError(w, api.Errorf(api.ErrConflict, "sandbox %s is not stopped here", id))
			return
		}
		ref := req.Ref + "@sha256:" + strings.Repeat("0", 60) + randomHex(2)
		mn.refs[ref] = id
		mn.mu.Unlock()
		writeJSON(w, http.StatusOK, api.PushResult{Ref: ref, Files: 1, Bytes: 1, Memory: true})
	case r.Method == http.MethodDelete && verb == "":
		mn.mu.Lock()
		_, ok := n.sbs[id]
		delete(n.sbs, id)
		mn.mu.Unlock()
		if !ok {
			writeError(w, api.Errorf(api.ErrNotFound, "sandbox %s not found", id))
			return
		}
		w.WriteHeader(http.StatusNoContent)
	case r.Method == http.MethodGet && verb == "":
		mn.mu.Lock()
		sb := n.sbs[id]
		var out api.Sandbox
		if sb != nil {
			out = *sb
		}
		mn.mu.Unlock()
		if sb == nil {
			writeError(w, api.Errorf(api.ErrNotFound, "sandbox %s not found", id))
			return
		}
		writeJSON(w, http.StatusOK, out)
	case r.Method == http.MethodPost && (verb == "resume" || verb == "stop"):
		mn.mu.Lock()
		sb := n.sbs[id]
		if sb == nil {
			mn.mu.Unlock()
			writeError(w, api.Errorf(api.ErrNotFound, "sandbox %s not found", id))
			return
		}
		sb.State = api.StateReady
		if verb == "stop" {
			sb.State = api.StateStopped
		}
		out := *sb
		mn.mu.Unlock()
		writeJSON(w, http.StatusOK, out)
	default:
		writeError(w, api.Errorf(api.ErrNotFound, "%s %s", r.Method, r.URL.Path))
	}
}

// agentPass plays node's agent (agent.dropMovedCopy) at the fleet's clock:
// a stopped copy whose object is bound, and written, elsewhere is deleted,
// unless a recent move's mark names this node.
func (mn *moveNet) agentPass(t *testing.T, f *testFleet, node string) {
	t.Helper()
	mn.mu.Lock()
	var ids []string
	for id, sb := range mn.nodes[node].sbs {
		if sb.State == api.StateStopped {
			ids = append(ids, id)
		}
	}
	mn.mu.Unlock()
	for _, id := range ids {
		u, err := f.dyn.Resource(v1alpha1.SandboxesResource).Namespace(v1alpha1.DefaultNamespace).Get(context.Background(), v1alpha1.ObjectName(id), metav1.GetOptions{})
		if err != nil {
			continue
		}
		sn, _, _ := unstructured.NestedString(u.Object, "spec", "nodeName")
		st, _, _ := unstructured.NestedString(u.Object, "status", "node")
		if sn == node || st != sn {
			continue
		}
		if fs := strings.Fields(u.GetAnnotations()[v1alpha1.AnnotationMovingTo]); len(fs) >= 2 && fs[0] == node {
			if at, err := time.Parse(time.RFC3339, fs[1]); err == nil && f.c.cfg.Now().Sub(at) < movingFor {
				continue
			}
		}
		mn.mu.Lock()
		delete(mn.nodes[node].sbs, id)
		mn.mu.Unlock()
	}
}

// moveFleet is a fleet of mn's nodes, all ready, all where a memory
// restores, those in cordoned cordoned, moving through a registry; sandbox
// id stopped on from, with its object.
func moveFleet(t *testing.T, mn *moveNet, id, from string, cordoned ...string) *testFleet {
	t.Helper()
	var objs, leases []runtime.Object
	for name, n := range mn.nodes {
		c := false
		for _, x := range cordoned {
			c = c || x == name
		}
		objs = append(objs, pullNode(t, name, n.srv.URL, runscA, 10<<30, c))
		leases = append(leases, lease(name, t0))
	}
	o := sandboxObj(t, id, from, "stopped", t0)
	o.SetUID(types.UID("uid-" + id))
	o.SetLabels(map[string]string{v1alpha1.LabelNode: from, v1alpha1.LabelSandboxID: v1alpha1.ObjectName(id)})
	objs = append(objs, o)
	mn.put(from, id, api.StateStopped)
	f := newTestFleet(t, nil, leases...)
	enforceRV(f.dyn)
	for _, ob := range objs {
		u := ob.(*unstructured.Unstructured)
		var err error
		if u.GetKind() == v1alpha1.KindSandbox {
			_, err = f.dyn.Resource(v1alpha1.SandboxesResource).Namespace(u.GetNamespace()).Create(context.Background(), u, metav1.CreateOptions{})
		} else {
			_, err = f.dyn.Resource(v1alpha1.SandboxNodesResource).Create(context.Background(), u, metav1.CreateOptions{})
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	f.c.cfg.MoveRepository = "127.0.0.1:5000/sbx/moves"
	return f
}

// node is f's node name, as move takes it.
func (f *testFleet) node(t *testing.T, name string) *node {
	t.Helper()
	ns, err := f.c.nodes(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range ns {
		if n.obj.GetName() == name {
			return n
		}
	}
	t.Fatalf("no node %s", name)
	return nil
}

// cordon sets node name's spec.unschedulable.
func (f *testFleet) cordon(t *testing.T, name string, on bool) {
	t.Helper()
	patch, _ := json.Marshal(map[string]any{"spec": map[string]any{"unschedulable": on}})
	if _, err := f.dyn.Resource(v1alpha1.SandboxNodesResource).Patch(context.Background(), name, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
}

// oneHolder checks the invariant of a move: the node sandbox id's object
// is bound to holds a copy of it, and no other node holds a stopped copy
// once the agents have passed. It returns the holder.
func oneHolder(t *testing.T, f *testFleet, mn *moveNet, id string) string {
	t.Helper()
	sb := f.sandbox(t, id)
	bound := sb.Spec.NodeName
	if st := mn.has(bound, id); st == "" {
		var where []string
		for name := range mn.nodes {
			if mn.has(name, id) != "" {
				where = append(where, name)
			}
		}
		t.Errorf("sandbox %s is bound to node %s, which has no copy of it (copies on %v): it is lost", id, bound, where)
	}
	if l := sb.Labels[v1alpha1.LabelNode]; l != "" && l != bound {
		t.Errorf("sandbox %s: bound to %s, labelled %s", id, bound, l)
	}
	return bound
}

// TestAttackMoveOverwrittenMark: two moves of one sandbox at once (two
// resumes on a cordoned node, two drains, two controllers). The second's
// mark replaced the first's while the first was between its adopt and
// its rebind; the first's target's agent, seeing a mark naming another
// node, dropped its fresh copy (as it must: a copy no mark names is not
// the sandbox), and the first move rebound the object to it anyway and
// deleted the copy on the old node: the sandbox was nowhere.
func TestAttackMoveOverwrittenMark(t *testing.T) {
	const id = "sb_aaaaaaaaaa"
	mn := newMoveNet(t, "n0", "n1", "n2")
	f := moveFleet(t, mn, id, "n0", "n2") // n2 cordoned: the first move goes to n1
	from := f.node(t, "n0")
	second := make(chan error, 1)
	marked, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	mn.nodes["n0"].onPush = func(w http.ResponseWriter, _ string) bool {
		sec := false
		select {
		case <-marked: // the second move's push
			sec = true
		default:
		}
		if sec {
			<-release
		}
		return false
	}
	mn.nodes["n1"].onAdopt = func(w http.ResponseWriter, _ string) bool {
		once.Do(func() {
			// the second move begins: n1 is cordoned meanwhile, n2 not
			f.cordon(t, "n1", true)
			f.cordon(t, "n2", false)
			close(marked)
			go func() {
				_, err := f.c.move(context.Background(), id, f.node(t, "n0"))
				second <- err
			}()
			// wait for its mark, then n1's agent passes
			deadline := time.Now().Add(5 * time.Second)
			for !strings.HasPrefix(f.sandbox(t, id).Annotations[v1alpha1.AnnotationMovingTo], "n2 ") && time.Now().Before(deadline) {
				time.Sleep(time.Millisecond)
			}
			mn.agentPass(t, f, "n1")
		})
		return false
	}
	to, err := f.c.move(context.Background(), id, from)
	close(release)
	select {
	case <-marked:
	default:
		t.Fatalf("the first move never adopted on n1: %v", err)
	}
	err2 := <-second
	t.Logf("first move: %v %v; second: %v", to != nil, err, err2)
	mn.agentPass(t, f, "n0")
	mn.agentPass(t, f, "n1")
	mn.agentPass(t, f, "n2")
	oneHolder(t, f, mn, id)
	if err == nil && err2 == nil {
		t.Errorf("both moves succeeded")
	}
}

// TestAttackMoveMarkExpired: a push and adopt of a large image that took
// until the mark had expired. The target's agent, at a pass meanwhile,
// dropped the adopted copy (the mark said nothing any more); the rebind
// went ahead, binding the object to a node with no copy, and the old
// node's copy was deleted.
func TestAttackMoveMarkExpired(t *testing.T) {
	const id = "sb_aaaaaaaaaa"
	mn := newMoveNet(t, "n0", "n1")
	f := moveFleet(t, mn, id, "n0")
	mn.nodes["n1"].onAdopt = func(w http.ResponseWriter, _ string) bool {
		*f.now = f.now.Add(movingFor + time.Minute) // a slow pull, on the fake clock
		mn.agentPass(t, f, "n1")
		return false
	}
	_, err := f.c.move(context.Background(), id, f.node(t, "n0"))
	if err == nil {
		t.Errorf("a move whose mark expired before its rebind succeeded")
	}
	if got := oneHolder(t, f, mn, id); got != "n0" {
		t.Errorf("the sandbox is on %s, want n0 still", got)
	}
	if mn.has("n0", id) != api.StateStopped {
		t.Errorf("the old node's copy: %q", mn.has("n0", id))
	}
}

// TestAttackMoveBeingDeleted: kubectl delete of a stopped sandbox's
// object, and a drain (or a resume on its cordoned node) moves it before
// the node's agent deletes it. The move went on: the old node's agent
// deleted its copy and let the object go, and the copy adopted on the
// target, with no object, was mirrored anew there: a deleted sandbox came
// back. A move must leave an object being deleted alone.
func TestAttackMoveBeingDeleted(t *testing.T) {
	const id = "sb_aaaaaaaaaa"
	mn := newMoveNet(t, "n0", "n1")
	f := moveFleet(t, mn, id, "n0")
	rc := f.dyn.Resource(v1alpha1.SandboxesResource).Namespace(v1alpha1.DefaultNamespace)
	u, err := rc.Get(context.Background(), v1alpha1.ObjectName(id), metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	ts := metav1.NewTime(t0)
	u.SetDeletionTimestamp(&ts)
	u.SetFinalizers([]string{v1alpha1.Finalizer})
	if _, err := rc.Update(context.Background(), u, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	pushed := false
	mn.nodes["n0"].onPush = func(http.ResponseWriter, string) bool { pushed = true; return false }
	_, err = f.c.move(context.Background(), id, f.node(t, "n0"))
	if err == nil || !errors.Is(err, api.ErrConflict) {
		t.Errorf("a move of a sandbox whose object is being deleted: %v, want a conflict", err)
	}
	if pushed || mn.has("n1", id) != "" {
		t.Errorf("a sandbox being deleted was pushed (%v) or adopted (%q)", pushed, mn.has("n1", id))
	}
}

// TestAttackMoveWrongSandboxBack: a node whose push answers the ref of
// another sandbox's artifact (a bug, a hostile node): the target adopted
// that other sandbox, the object was rebound to it, and the sandbox's
// only copy, on the old node, was deleted.
func TestAttackMoveWrongSandboxBack(t *testing.T) {
	const id, other = "sb_aaaaaaaaaa", "sb_zzzzzzzzzz"
	mn := newMoveNet(t, "n0", "n1")
	f := moveFleet(t, mn, id, "n0")
	mn.refs["127.0.0.1:5000/sbx/moves:other@sha256:1"] = other
	mn.nodes["n0"].onPush = func(w http.ResponseWriter, _ string) bool {
		writeJSON(w, http.StatusOK, api.PushResult{Ref: "127.0.0.1:5000/sbx/moves:other@sha256:1", Memory: true})
		return true
	}
	if _, err := f.c.move(context.Background(), id, f.node(t, "n0")); err == nil {
		t.Errorf("a move whose target adopted another sandbox succeeded")
	}
	if got := oneHolder(t, f, mn, id); got != "n0" {
		t.Errorf("the sandbox is bound to %s, want n0 still", got)
	}
}

// TestAttackMoveHostileNodes: a node answering a push or an adopt with
// garbage, an error, a huge body or nothing at all: the move fails, and
// the sandbox stays where it was, its copy whole.
func TestAttackMoveHostileNodes(t *testing.T) {
	for _, tc := range []struct {
		name         string
		push, adopt  func(w http.ResponseWriter, id string) bool
		wantTargetOK bool
	}{
		{"push answers garbage", func(w http.ResponseWriter, _ string) bool { w.Write([]byte("<html>")); return true }, nil, false},
		{"push answers 500", func(w http.ResponseWriter, _ string) bool { w.WriteHeader(500); return true }, nil, false},
		{"push answers a huge body", func(w http.ResponseWriter, _ string) bool {
			w.Write([]byte(`{"ref":"`))
			b := []byte(strings.Repeat("a", 1<<20))
			for range 80 {
				if _, err := w.Write(b); err != nil {
					break
				}
			}
			return true
		}, nil, false},
		{"push answers no ref", func(w http.ResponseWriter, _ string) bool { w.Write([]byte(`{}`)); return true }, nil, false},
		{"adopt answers 500", nil, func(w http.ResponseWriter, _ string) bool { w.WriteHeader(500); return true }, true},
		{"adopt answers garbage", nil, func(w http.ResponseWriter, _ string) bool { w.Write([]byte("{")); return true }, true},
		{"adopt answers a running sandbox", nil, func(w http.ResponseWriter, id string) bool {
			writeJSON(w, http.StatusOK, api.Sandbox{ID: id, State: api.StateReady})
			return true
		}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			const id = "sb_aaaaaaaaaa"
			mn := newMoveNet(t, "n0", "n1")
			f := moveFleet(t, mn, id, "n0")
			mn.nodes["n0"].onPush, mn.nodes["n1"].onAdopt = tc.push, tc.adopt
			if _, err := f.c.move(context.Background(), id, f.node(t, "n0")); err == nil {
				t.Errorf("the move succeeded")
			}
			if got := oneHolder(t, f, mn, id); got != "n0" || mn.has("n0", id) != api.StateStopped {
				t.Errorf("the sandbox is bound to %s; n0's copy %q", got, mn.has("n0", id))
			}
		})
	}
}

// TestAttackMoveAgainAfterCut: a move cut between its adopt and its rebind
// (the apiserver failing the write, the controller crashing) leaves the
// target a stopped copy and the object its mark. The move asked again
// chose the same target, whose adopt refused (a copy of that id is
// there, from another artifact) until that copy's mark expired: the
// sandbox could not move for the mark's whole life. It must converge at
// once: the copy left is no sandbox (the object is bound to the old
// node, under the new move's mark), so it goes.
func TestAttackMoveAgainAfterCut(t *testing.T) {
	const id = "sb_aaaaaaaaaa"
	mn := newMoveNet(t, "n0", "n1")
	f := moveFleet(t, mn, id, "n0")
	cut := true
	f.dyn.PrependReactor("update", "sandboxes", func(ac k8stesting.Action) (bool, runtime.Object, error) {
		u, ok := ac.(k8stesting.UpdateAction).GetObject().(*unstructured.Unstructured)
		if ok && cut && ac.GetSubresource() == "" && u.GetLabels()[v1alpha1.LabelNode] == "n1" {
			return true, nil, errors.New("etcdserver: request timed out")
		}
		return false, nil, nil
	})
	if _, err := f.c.move(context.Background(), id, f.node(t, "n0")); err == nil {
		t.Fatal("the cut move succeeded")
	}
	if mn.has("n1", id) != api.StateStopped {
		t.Fatalf("the cut move left no copy on n1: %q", mn.has("n1", id))
	}
	oneHolder(t, f, mn, id)
	cut = false
	*f.now = f.now.Add(10 * time.Second)
	mn.agentPass(t, f, "n1") // the mark holds: n1's agent keeps it
	to, err := f.c.move(context.Background(), id, f.node(t, "n0"))
	if err != nil {
		t.Fatalf("the move asked again: %v", err)
	}
	mn.agentPass(t, f, "n0")
	if got := oneHolder(t, f, mn, id); got != "n1" || to.obj.GetName() != "n1" || mn.has("n0", id) != "" {
		t.Errorf("after the second move: bound to %s, moved to %s, n0's copy %q", got, to.obj.GetName(), mn.has("n0", id))
	}
}

// TestAttackMoveAgainLeavesRunningCopy: the copy on the target that a cut
// move left was resumed there through that node's own API: it is not
// deleted for a second move, which fails saying so.
func TestAttackMoveAgainLeavesRunningCopy(t *testing.T) {
	const id = "sb_aaaaaaaaaa"
	mn := newMoveNet(t, "n0", "n1")
	f := moveFleet(t, mn, id, "n0")
	mn.put("n1", id, api.StateReady)
	if _, err := f.c.move(context.Background(), id, f.node(t, "n0")); err == nil {
		t.Errorf("a move onto a node where a copy runs succeeded")
	}
	if mn.has("n1", id) != api.StateReady || mn.has("n0", id) != api.StateStopped {
		t.Errorf("copies after: n0 %q, n1 %q", mn.has("n0", id), mn.has("n1", id))
	}
	oneHolder(t, f, mn, id)
}

// TestAttackDrainAmbiguousRebind: the rebind's write reached the
// apiserver but its answer did not (a timeout): the move said it failed,
// and the drain resumed the sandbox on the old node, while its object was
// bound to the new one, which holds the sandbox: two copies, the running
// one not the sandbox. The drain must see where the object is bound.
func TestAttackDrainAmbiguousRebind(t *testing.T) {
	const id = "sb_aaaaaaaaaa"
	mn := newMoveNet(t, "n0", "n1")
	f := moveFleet(t, mn, id, "n0")
	mn.put("n0", id, api.StateReady)
	u, _ := f.dyn.Resource(v1alpha1.SandboxesResource).Namespace(v1alpha1.DefaultNamespace).Get(context.Background(), v1alpha1.ObjectName(id), metav1.GetOptions{})
	_ = unstructured.SetNestedField(u.Object, "ready", "status", "state")
	if _, err := f.dyn.Resource(v1alpha1.SandboxesResource).Namespace(v1alpha1.DefaultNamespace).Update(context.Background(), u, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	lost := true
	f.dyn.PrependReactor("update", "sandboxes", func(ac k8stesting.Action) (bool, runtime.Object, error) {
		u, ok := ac.(k8stesting.UpdateAction).GetObject().(*unstructured.Unstructured)
		if ok && lost && ac.GetSubresource() == "" && u.GetLabels()[v1alpha1.LabelNode] == "n1" {
			lost = false
			if err := f.dyn.Tracker().Update(v1alpha1.SandboxesResource, u, v1alpha1.DefaultNamespace); err != nil {
				return true, nil, err
			}
			return true, nil, errors.New("http2: client connection lost")
		}
		return false, nil, nil
	})
	srv := httptest.NewServer(f.c.Handler())
	defer srv.Close()
	resp, err := http.Post(srv.URL+"/v1/nodes/n0/drain", "application/json", nil)
	if err != nil {
		t.Fatal(err)
	}
	var out api.DrainResult
	_ = json.NewDecoder(resp.Body).Decode(&out)
	resp.Body.Close()
	t.Logf("drain: %d %+v", resp.StatusCode, out)
	bound := oneHolder(t, f, mn, id)
	if other := map[string]string{"n0": "n1", "n1": "n0"}[bound]; mn.has(other, id) == api.StateReady {
		t.Errorf("the sandbox is bound to %s, and runs on %s too", bound, other)
	}
}
