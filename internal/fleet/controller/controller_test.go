package controller

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	dynamicfake "k8s.io/client-go/dynamic/fake"
	kubefake "k8s.io/client-go/kubernetes/fake"

	"sbx.dev/sbx/api"
	"sbx.dev/sbx/internal/fleet/v1alpha1"
)

// Fakes behind the real interfaces (client-go's own): what is tested here
// is the controller's judgement and bookkeeping, not the apiserver. The
// fleet e2e test runs it against a real one.

var t0 = time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)

func unstr(t *testing.T, obj any) *unstructured.Unstructured {
	t.Helper()
	u, err := v1alpha1.ToUnstructured(obj)
	if err != nil {
		t.Fatal(err)
	}
	return u
}

func nodeObj(t *testing.T, name string) *unstructured.Unstructured {
	return unstr(t, &v1alpha1.SandboxNode{
		TypeMeta:   metav1.TypeMeta{APIVersion: v1alpha1.APIVersion, Kind: v1alpha1.KindSandboxNode},
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Status:     v1alpha1.SandboxNodeStatus{Address: "tcp://127.0.0.1:1", Sandboxes: 1, Capacity: v1alpha1.Capacity{CPUs: 2}},
	})
}

func sandboxObj(t *testing.T, id, node, state string, created time.Time) *unstructured.Unstructured {
	c := metav1.NewTime(created)
	return unstr(t, &v1alpha1.Sandbox{
		TypeMeta: metav1.TypeMeta{APIVersion: v1alpha1.APIVersion, Kind: v1alpha1.KindSandbox},
		ObjectMeta: metav1.ObjectMeta{Name: v1alpha1.ObjectName(id), Namespace: v1alpha1.DefaultNamespace,
			Labels: map[string]string{v1alpha1.LabelNode: node}},
		Spec:   v1alpha1.SandboxSpec{Template: "base", NodeName: node, Name: "n-" + id[3:]},
		Status: v1alpha1.SandboxStatus{ID: id, State: state, Node: node, CreatedAt: &c},
	})
}

// boundOnly is a sandbox placement bound (spec.nodeName) that its node's
// agent has not made yet: no node label.
func boundOnly(t *testing.T, u *unstructured.Unstructured) *unstructured.Unstructured {
	u.SetLabels(nil)
	return u
}

func lease(name string, renewed time.Time) *coordinationv1.Lease {
	secs := int32(15)
	r := metav1.NewMicroTime(renewed)
	return &coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: v1alpha1.DefaultNamespace},
		Spec:       coordinationv1.LeaseSpec{HolderIdentity: &name, LeaseDurationSeconds: &secs, RenewTime: &r},
	}
}

type testFleet struct {
	c    *Controller
	now  *time.Time
	dyn  *dynamicfake.FakeDynamicClient
	kube *kubefake.Clientset
}

func newTestFleet(t *testing.T, objs []runtime.Object, leases ...runtime.Object) *testFleet {
	t.Helper()
	lists := map[schema.GroupVersionResource]string{
		v1alpha1.SandboxesResource:        "SandboxList",
		v1alpha1.SandboxNodesResource:     "SandboxNodeList",
		v1alpha1.SandboxSnapshotsResource: "SandboxSnapshotList",
		v1alpha1.SandboxTemplatesResource: "SandboxTemplateList",
	}
	dyn := dynamicfake.NewSimpleDynamicClientWithCustomListKinds(runtime.NewScheme(), lists)
	for _, o := range objs {
		u := o.(*unstructured.Unstructured)
		res := dyn.Resource(v1alpha1.SandboxNodesResource)
		var err error
		if u.GetKind() == v1alpha1.KindSandbox {
			_, err = dyn.Resource(v1alpha1.SandboxesResource).Namespace(u.GetNamespace()).Create(context.Background(), u, metav1.CreateOptions{})
		} else {
			_, err = res.Create(context.Background(), u, metav1.CreateOptions{})
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	kube := kubefake.NewClientset(leases...)
	now := t0
	c := NewWith(Config{Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), Now: func() time.Time { return now }}, dyn, kube.CoordinationV1())
	return &testFleet{c: c, now: &now, dyn: dyn, kube: kube}
}

func (f *testFleet) sandbox(t *testing.T, id string) v1alpha1.Sandbox {
	t.Helper()
	u, err := f.dyn.Resource(v1alpha1.SandboxesResource).Namespace(v1alpha1.DefaultNamespace).Get(context.Background(), v1alpha1.ObjectName(id), metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var sb v1alpha1.Sandbox
	if err := v1alpha1.FromUnstructured(u, &sb); err != nil {
		t.Fatal(err)
	}
	return sb
}

func TestJudge(t *testing.T) {
	if ok, _, why := judge(nil, t0); ok || !strings.Contains(why, "no Lease") {
		t.Errorf("no lease: %v %q", ok, why)
	}
	if ok, _, _ := judge(lease("a", t0.Add(-14*time.Second)), t0); !ok {
		t.Error("renewed 14 s ago under 15 s: not ready")
	}
	ok, renewed, why := judge(lease("a", t0.Add(-16*time.Second)), t0)
	if ok || !renewed.Equal(t0.Add(-16*time.Second)) || !strings.Contains(why, "stopped renewing its Lease") || !strings.Contains(why, "16s ago") {
		t.Errorf("expired: %v %v %q", ok, renewed, why)
	}
}

// TestLeaseExpiryMarksLost: the sandboxes of a node whose Lease expired
// are lost, with the reason, and its Ready condition is False; a node that
// renews is left alone, and a node that comes back is ready again.
func TestLeaseExpiryMarksLost(t *testing.T) {
	ctx := context.Background()
	f := newTestFleet(t, []runtime.Object{
		nodeObj(t, "n1"), nodeObj(t, "n2"),
		sandboxObj(t, "sb_aaaaaaaaaa", "n1", "ready", t0.Add(-time.Hour)),
		sandboxObj(t, "sb_bbbbbbbbbb", "n2", "ready", t0.Add(-time.Minute)),
		sandboxObj(t, "sb_cccccccccc", "n2", "stopped", t0.Add(-2*time.Minute)),
		boundOnly(t, sandboxObj(t, "sb_dddddddddd", "n2", "", t0.Add(-3*time.Minute))),
	}, lease("n1", t0.Add(-2*time.Second)), lease("n2", t0.Add(-5*time.Second)))

	// both renew: nothing changes
	if err := f.c.CheckNodes(ctx); err != nil {
		t.Fatal(err)
	}
	if st := f.sandbox(t, "sb_bbbbbbbbbb").Status.State; st != "ready" {
		t.Fatalf("a sandbox of a live node: %s", st)
	}
	// n2 stops renewing: 11 s later its Lease is 16 s old
	*f.now = t0.Add(11 * time.Second)
	if _, err := f.kube.CoordinationV1().Leases(v1alpha1.DefaultNamespace).Update(ctx, lease("n1", *f.now), metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := f.c.CheckNodes(ctx); err != nil {
		t.Fatal(err)
	}
	// sb_dddddddddd is bound to n2 by placement, not yet made (no label)
	for _, id := range []string{"sb_bbbbbbbbbb", "sb_cccccccccc", "sb_dddddddddd"} {
		sb := f.sandbox(t, id)
		if sb.Status.State != "lost" || !strings.Contains(sb.Status.Reason, "node n2 is down") || !strings.Contains(sb.Status.Reason, "stopped renewing its Lease") {
			t.Errorf("%s on the dead node: %s %q", id, sb.Status.State, sb.Status.Reason)
		}
		found := false
		for _, c := range sb.Status.Conditions {
			found = found || (c.Type == v1alpha1.ConditionReady && c.Status == metav1.ConditionFalse && c.Reason == ReasonNodeLost)
		}
		if !found {
			t.Errorf("%s: no Ready=False NodeLost condition: %+v", id, sb.Status.Conditions)
		}
	}
	if sb := f.sandbox(t, "sb_aaaaaaaaaa"); sb.Status.State != "ready" {
		t.Errorf("a sandbox of the live node: %s", sb.Status.State)
	}
	ns, err := f.c.nodes(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(ns) != 2 || !ns[0].ready || ns[1].ready {
		t.Fatalf("nodes: %+v", ns)
	}
	down := false
	for _, c := range ns[1].typed.Status.Conditions {
		down = down || (c.Type == v1alpha1.ConditionReady && c.Status == metav1.ConditionFalse && c.Reason == ReasonLeaseExpired)
	}
	if !down {
		t.Errorf("n2's conditions: %+v", ns[1].typed.Status.Conditions)
	}
	// a second look writes nothing more (the lost are lost)
	before := len(f.dyn.Actions())
	if err := f.c.CheckNodes(ctx); err != nil {
		t.Fatal(err)
	}
	for _, a := range f.dyn.Actions()[before:] {
		if a.GetVerb() == "update" {
			t.Errorf("a second check wrote again: %v", a)
		}
	}
	// n2 comes back
	if _, err := f.kube.CoordinationV1().Leases(v1alpha1.DefaultNamespace).Update(ctx, lease("n2", *f.now), metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := f.c.CheckNodes(ctx); err != nil {
		t.Fatal(err)
	}
	f.c.mu.Lock()
	left := len(f.c.down)
	f.c.mu.Unlock()
	if left != 0 {
		t.Errorf("still down after renewing: %v", f.c.down)
	}
}

func TestHTTP(t *testing.T) {
	f := newTestFleet(t, []runtime.Object{
		nodeObj(t, "n1"), nodeObj(t, "n2"),
		sandboxObj(t, "sb_aaaaaaaaaa", "n1", "ready", t0.Add(-time.Hour)),
		sandboxObj(t, "sb_bbbbbbbbbb", "n2", "stopped", t0.Add(-time.Minute)),
	}, lease("n1", t0))
	srv := httptest.NewServer(f.c.Handler())
	defer srv.Close()
	call := func(method, path string, out any) int {
		t.Helper()
		req, _ := http.NewRequest(method, srv.URL+path, nil)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		if out != nil {
			if err := json.NewDecoder(resp.Body).Decode(out); err != nil {
				t.Fatalf("%s %s: %v", method, path, err)
			}
		}
		return resp.StatusCode
	}
	var nodes []api.Node
	if code := call("GET", "/v1/nodes", &nodes); code != 200 || len(nodes) != 2 {
		t.Fatalf("nodes: %d %+v", code, nodes)
	}
	if !nodes[0].Ready || nodes[0].Renewed == nil || nodes[1].Ready || !strings.Contains(nodes[1].Reason, "no Lease") || nodes[0].CPUs != 2 {
		t.Errorf("nodes: %+v", nodes)
	}
	var n api.Node
	if code := call("POST", "/v1/nodes/n1/cordon", &n); code != 200 || !n.Cordoned {
		t.Fatalf("cordon: %d %+v", code, n)
	}
	u, _ := f.dyn.Resource(v1alpha1.SandboxNodesResource).Get(context.Background(), "n1", metav1.GetOptions{})
	if on, _, _ := unstructured.NestedBool(u.Object, "spec", "unschedulable"); !on {
		t.Error("cordon did not set spec.unschedulable")
	}
	if code := call("GET", "/v1/nodes/n1", &n); code != 200 || !n.Cordoned {
		t.Errorf("after cordon: %+v", n)
	}
	if code := call("POST", "/v1/nodes/n1/uncordon", &n); code != 200 || n.Cordoned {
		t.Errorf("uncordon: %d %+v", code, n)
	}
	var body api.ErrorBody
	if code := call("POST", "/v1/nodes/nope/cordon", &body); code != 404 || !strings.Contains(body.Error.Message, "no node \"nope\"") {
		t.Errorf("cordon of an unknown node: %d %+v", code, body)
	}
	var sbs []api.Sandbox
	if code := call("GET", "/v1/sandboxes", &sbs); code != 200 || len(sbs) != 2 {
		t.Fatalf("sandboxes: %d %+v", code, sbs)
	}
	if sbs[0].ID != "sb_aaaaaaaaaa" || sbs[0].Node != "n1" || sbs[1].Node != "n2" || sbs[1].State != api.StateStopped {
		t.Errorf("sandboxes (oldest first, with nodes): %+v", sbs)
	}
	if code := call("GET", "/v1/sandboxes?state=stopped", &sbs); code != 200 || len(sbs) != 1 || sbs[0].ID != "sb_bbbbbbbbbb" {
		t.Errorf("stopped ones: %+v", sbs)
	}
	var sb api.Sandbox
	// by name, on n2, which is down: what the fleet knows of it
	if code := call("GET", "/v1/sandboxes/n-bbbbbbbbbb", &sb); code != 200 || sb.ID != "sb_bbbbbbbbbb" || sb.State != api.StateStopped || sb.Node != "n2" {
		t.Errorf("by name, on a node that is down: %d %+v", code, sb)
	}
	// on n1, which is up: asked of the node, whose address here answers
	// nothing, so what the fleet knows (TestProxyToTheNode has a node
	// that answers)
	if code := call("GET", "/v1/sandboxes/n-aaaaaaaaaa", &sb); code != 200 || sb.ID != "sb_aaaaaaaaaa" || sb.Node != "n1" {
		t.Errorf("by name, on a node that is up and does not answer: %d %+v", code, sb)
	}
	if code := call("GET", "/v1/sandboxes/sb_zzzzzzzzzz", &body); code != 404 {
		t.Errorf("unknown sandbox: %d", code)
	}
	// a sandbox's route goes on to its node (proxy.go), whose address here
	// answers nothing
	if code := call("POST", "/v1/sandboxes/sb_aaaaaaaaaa/exec", &body); code != 503 || !strings.Contains(body.Error.Message, "did not answer") {
		t.Errorf("a node's route: %d %+v", code, body)
	}
	if code := call("GET", "/v1/storage", &body); code != 503 || !strings.Contains(body.Error.Message, "node agent") {
		t.Errorf("a route the fleet does not serve: %d %+v", code, body)
	}
}

// TestPlace: the controller binds an unbound Sandbox to a ready node that
// can take it, and leaves one no node can take waiting, telling why once.
func TestPlace(t *testing.T) {
	ready := []metav1.Condition{{Type: v1alpha1.ConditionReady, Status: metav1.ConditionTrue, Reason: v1alpha1.ReasonAgentPublishing, LastTransitionTime: metav1.NewTime(t0)}}
	node := func(name string, memGiB int64) *unstructured.Unstructured {
		return unstr(t, &v1alpha1.SandboxNode{
			TypeMeta:   metav1.TypeMeta{APIVersion: v1alpha1.APIVersion, Kind: v1alpha1.KindSandboxNode},
			ObjectMeta: metav1.ObjectMeta{Name: name},
			Status: v1alpha1.SandboxNodeStatus{Conditions: ready,
				Capacity: v1alpha1.Capacity{CPUs: 2, MemoryBytes: memGiB << 30, DiskFreeBytes: 100 << 30}},
		})
	}
	unbound := func(name string, memGiB int64) *unstructured.Unstructured {
		return unstr(t, &v1alpha1.Sandbox{
			TypeMeta:   metav1.TypeMeta{APIVersion: v1alpha1.APIVersion, Kind: v1alpha1.KindSandbox},
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: v1alpha1.DefaultNamespace, ResourceVersion: "1"},
			Spec:       v1alpha1.SandboxSpec{Template: "base", MemoryBytes: memGiB << 30},
		})
	}
	var logs strings.Builder
	f := newTestFleet(t, []runtime.Object{node("n1", 4), node("n2", 8), unbound("sb-small", 1), unbound("sb-huge", 64)})
	f.c.log = slog.New(slog.NewTextHandler(&logs, nil))
	for range 2 {
		if err := f.c.Place(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	u, err := f.dyn.Resource(v1alpha1.SandboxesResource).Namespace(v1alpha1.DefaultNamespace).Get(context.Background(), "sb-small", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if got, _, _ := unstructured.NestedString(u.Object, "spec", "nodeName"); got != "n2" {
		t.Errorf("sb-small's nodeName: got %q, want n2 (the most free memory)", got)
	}
	if n := strings.Count(logs.String(), "a sandbox waits for a node"); n != 1 || !strings.Contains(logs.String(), "too little memory: asks 64 GiB") {
		t.Errorf("told %d times why sb-huge waits, want once:\n%s", n, logs.String())
	}
	// and in its object, for kubectl describe: written once while the why
	// holds
	huge := f.sandbox(t, "sb_huge")
	var placed *metav1.Condition
	for i, c := range huge.Status.Conditions {
		if c.Type == v1alpha1.ConditionPlaced {
			placed = &huge.Status.Conditions[i]
		}
	}
	if placed == nil || placed.Status != metav1.ConditionFalse || placed.Reason != v1alpha1.ReasonUnschedulable || !strings.Contains(placed.Message, "too little memory: asks 64 GiB") {
		t.Errorf("sb-huge's Placed condition: %+v", placed)
	}
	if huge.Status.ID != "" || huge.Status.State != "" {
		t.Errorf("telling why it waits wrote more than the condition: %+v", huge.Status)
	}
	writes := 0
	f.dyn.ClearActions()
	if err := f.c.Place(context.Background()); err != nil {
		t.Fatal(err)
	}
	for _, a := range f.dyn.Actions() {
		if a.GetVerb() == "update" {
			writes++
		}
	}
	if writes != 0 {
		t.Errorf("a round with the same why wrote %d times", writes)
	}
}

// TestDeletedWhileNodeDown: objects of a down node being deleted (kubectl
// delete; their agent, away, cannot drop its finalizer) are noted on the
// node's SandboxNode, then let go; another node's, and one not being
// deleted, are left alone. A second check notes nothing twice.
func TestDeletedWhileNodeDown(t *testing.T) {
	ctx := context.Background()
	f := newTestFleet(t, []runtime.Object{
		nodeObj(t, "n1"), nodeObj(t, "n2"),
		deletingObj(t, "sb_aaaaaaaaaa", "n2", "uid-a"),
		sandboxObj(t, "sb_bbbbbbbbbb", "n2", "ready", t0),
		deletingObj(t, "sb_cccccccccc", "n1", "uid-c"),
	}, lease("n1", t0.Add(10*time.Second)), lease("n2", t0.Add(-5*time.Second)))
	*f.now = t0.Add(11 * time.Second)
	for i := 0; i < 2; i++ {
		if err := f.c.CheckNodes(ctx); err != nil {
			t.Fatal(err)
		}
	}
	n2, err := f.dyn.Resource(v1alpha1.SandboxNodesResource).Get(ctx, "n2", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	want := []v1alpha1.DeletedObject{{Object: v1alpha1.ObjectName("sb_aaaaaaaaaa"), UID: "uid-a", ID: "sb_aaaaaaaaaa"}}
	if got := deletedWhileDown(t, n2); !slices.Equal(got, want) {
		t.Errorf("noted on n2: %+v, want %+v", got, want)
	}
	rc := f.dyn.Resource(v1alpha1.SandboxesResource).Namespace(v1alpha1.DefaultNamespace)
	for _, tc := range []struct {
		id        string
		finalizer bool
	}{{"sb_aaaaaaaaaa", false}, {"sb_bbbbbbbbbb", false}, {"sb_cccccccccc", true}} {
		u, err := rc.Get(ctx, v1alpha1.ObjectName(tc.id), metav1.GetOptions{})
		if err != nil {
			continue // gone: let go
		}
		if has := slices.Contains(u.GetFinalizers(), v1alpha1.Finalizer); has != tc.finalizer {
			t.Errorf("%s: finalizer %v, want %v", tc.id, has, tc.finalizer)
		}
	}
	if n1, _ := f.dyn.Resource(v1alpha1.SandboxNodesResource).Get(ctx, "n1", metav1.GetOptions{}); len(deletedWhileDown(t, n1)) != 0 {
		t.Errorf("noted on n1, which is up: %+v", deletedWhileDown(t, n1))
	}
}

func deletedWhileDown(t *testing.T, u *unstructured.Unstructured) []v1alpha1.DeletedObject {
	t.Helper()
	var n v1alpha1.SandboxNode
	if err := v1alpha1.FromUnstructured(u, &n); err != nil {
		t.Fatal(err)
	}
	return n.Status.DeletedWhileDown
}
