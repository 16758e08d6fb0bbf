package agent

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	dynamicfake "k8s.io/client-go/dynamic/fake"

	"sbx.dev/sbx/api"
	"sbx.dev/sbx/internal/fleet/v1alpha1"
)

// fakeSource is a Source whose sandboxes the test sets.
type fakeSource struct {
	mu   sync.Mutex
	sbs  []api.Sandbox
	reqs []api.CreateRequest // what Create was asked

	failDelete error
}

// Create plays sbxd making a sandbox: refused when the template is
// "missing", else recorded and listed from then on.
func (s *fakeSource) Create(_ context.Context, req api.CreateRequest) (*api.Sandbox, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.reqs = append(s.reqs, req)
	if req.Template == "missing" {
		return nil, api.Errorf(api.ErrNotFound, "template missing not found")
	}
	sb := api.Sandbox{ID: fmt.Sprintf("sb_made%05d", len(s.reqs)), Name: req.Name, Template: req.Template, State: api.StateReady,
		TTL: req.TTL, CPUs: req.CPUs, Meta: req.Meta}
	s.sbs = append(s.sbs, sb)
	return &sb, nil
}

// Delete plays sbxd's delete; failDelete, if set, is its error instead.
func (s *fakeSource) Delete(_ context.Context, ref string, _ bool) (*api.DeleteResult, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.failDelete != nil {
		return nil, s.failDelete
	}
	return deleteFrom(&s.sbs, ref)
}

func (s *fakeSource) Changed() <-chan struct{} { return nil }
func (s *fakeSource) List(context.Context) ([]api.Sandbox, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]api.Sandbox(nil), s.sbs...), nil
}

// TestMirrorOnce: objects are made for new sandboxes, rewritten only when
// a sandbox changed, and deleted when it went; another node's are not
// touched.
func TestMirrorOnce(t *testing.T) {
	scheme := runtime.NewScheme()
	dyn := dynamicfake.NewSimpleDynamicClientWithCustomListKinds(scheme, map[schema.GroupVersionResource]string{
		v1alpha1.SandboxesResource: "SandboxList",
	})
	src := &fakeSource{}
	now := time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)
	a := &Agent{cfg: Config{Node: "node-1", Namespace: "sbx-system", Source: src}, dyn: dyn, log: slog.Default(), now: func() time.Time { return now }}
	ctx := context.Background()
	rc := dyn.Resource(v1alpha1.SandboxesResource).Namespace("sbx-system")

	// another node's sandbox, which node-1 must leave alone
	other, err := v1alpha1.ToUnstructured(sandboxObject("node-2", "sbx-system", api.Sandbox{ID: "sb_othernode", Template: "tiny", State: api.StateReady}, nil, now))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := rc.Create(ctx, other, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	writes := func() (n []string) {
		for _, ac := range dyn.Actions() {
			switch ac.GetVerb() {
			case "create", "update", "delete":
				n = append(n, ac.GetVerb()+"/"+ac.GetSubresource())
			}
		}
		dyn.ClearActions()
		return n
	}
	state := func(id string) string {
		u, err := rc.Get(ctx, v1alpha1.ObjectName(id), metav1.GetOptions{})
		if err != nil {
			return "<" + err.Error() + ">"
		}
		var sb v1alpha1.Sandbox
		if err := v1alpha1.FromUnstructured(u, &sb); err != nil {
			t.Fatal(err)
		}
		return sb.Status.State + "@" + sb.Status.Node
	}
	writes()

	sb := api.Sandbox{ID: "sb_aaaaaaaaaa", Template: "tiny", State: api.StateReady, CreatedAt: now}
	steps := []struct {
		name       string
		sandboxes  []api.Sandbox
		wantWrites bool // the fake keeps no status subresource, so how many differs from an apiserver
		wantState  string
	}{
		{"new sandbox", []api.Sandbox{sb}, true, "ready@node-1"},
		{"unchanged", []api.Sandbox{sb}, false, "ready@node-1"},
		{"stopped", []api.Sandbox{func() api.Sandbox { s := sb; s.State = api.StateStopped; return s }()}, true, "stopped@node-1"},
		{"stopped, unchanged", []api.Sandbox{func() api.Sandbox { s := sb; s.State = api.StateStopped; return s }()}, false, "stopped@node-1"},
		{"deleted", nil, true, "<" + `sandboxes.sbx.dev "sb-aaaaaaaaaa" not found` + ">"},
	}
	for _, st := range steps {
		src.mu.Lock()
		src.sbs = st.sandboxes
		src.mu.Unlock()
		if err := a.mirrorOnce(ctx); err != nil {
			t.Fatalf("%s: %v", st.name, err)
		}
		if got := writes(); (len(got) > 0) != st.wantWrites {
			t.Errorf("%s: writes %v, want some: %v", st.name, got, st.wantWrites)
		}
		if got := state(sb.ID); got != st.wantState {
			t.Errorf("%s: object %s, want %s", st.name, got, st.wantState)
		}
	}
	if got := state("sb_othernode"); got != "ready@node-2" {
		t.Errorf("another node's sandbox: %s, want it left as it was", got)
	}
}

// TestMakeBound: a Sandbox asked for through the apiserver and bound to
// this node is made once, with what its spec asks, and its object becomes
// the mirror of the sandbox; one bound elsewhere or not bound is left; one
// sbxd refuses says why in its status and is not tried again; a sandbox
// already made for an object (an agent that died before writing it) is
// not made twice.
func TestMakeBound(t *testing.T) {
	scheme := runtime.NewScheme()
	dyn := dynamicfake.NewSimpleDynamicClientWithCustomListKinds(scheme, map[schema.GroupVersionResource]string{
		v1alpha1.SandboxesResource: "SandboxList",
	})
	now := time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)
	ctx := context.Background()
	rc := dyn.Resource(v1alpha1.SandboxesResource).Namespace("sbx-system")
	ask := func(name, node, template string) {
		u, err := v1alpha1.ToUnstructured(&v1alpha1.Sandbox{
			TypeMeta:   metav1.TypeMeta{APIVersion: v1alpha1.APIVersion, Kind: v1alpha1.KindSandbox},
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "sbx-system"},
			Spec: v1alpha1.SandboxSpec{Template: template, Name: "n-" + name, NodeName: node, TTL: "10m0s", CPUs: "0.5",
				MemoryBytes: 256 << 20, Meta: map[string]string{"team": "a"}, Image: &v1alpha1.SandboxImage{Ref: "r"}},
		})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := rc.Create(ctx, u, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	get := func(name string) v1alpha1.Sandbox {
		u, err := rc.Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		var sb v1alpha1.Sandbox
		if err := v1alpha1.FromUnstructured(u, &sb); err != nil {
			t.Fatal(err)
		}
		if u.GetLabels()[v1alpha1.LabelNode] != "" {
			sb.Labels = u.GetLabels()
		}
		return sb
	}
	ask("web", "node-1", "tiny")
	ask("elsewhere", "node-2", "tiny")
	ask("unbound", "", "tiny")
	ask("bad", "node-1", "missing")
	// made before a crash of the agent: the sandbox exists, its object
	// was never written
	src := &fakeSource{sbs: []api.Sandbox{
		{ID: "sb_beforecrsh", Template: "tiny", State: api.StateReady, Meta: map[string]string{v1alpha1.MetaObject: "again"}},
		// a user's `sbx new --meta sbx.object=elsewhere`: it must not take
		// node-2's object
		{ID: "sb_hijacker1", Template: "tiny", State: api.StateReady, Meta: map[string]string{v1alpha1.MetaObject: "elsewhere"}},
	}}
	ask("again", "node-1", "tiny")
	a := &Agent{cfg: Config{Node: "node-1", Namespace: "sbx-system", Source: src}, dyn: dyn, log: slog.Default(), now: func() time.Time { return now }}

	for pass := 1; pass <= 2; pass++ {
		if err := a.mirrorOnce(ctx); err != nil {
			t.Fatalf("pass %d: %v", pass, err)
		}
	}
	src.mu.Lock()
	reqs := src.reqs
	src.mu.Unlock()
	var asked []string
	for _, r := range reqs {
		asked = append(asked, r.Meta[v1alpha1.MetaObject])
	}
	slices.Sort(asked)
	if strings.Join(asked, ",") != "bad,web" {
		t.Fatalf("made for %v over two passes, want bad and web, once each", asked)
	}
	var r api.CreateRequest
	var webID string
	for i, q := range reqs {
		if q.Meta[v1alpha1.MetaObject] == "web" {
			r, webID = q, fmt.Sprintf("sb_made%05d", i+1)
		}
	}
	if r.Template != "tiny" || r.Name != "n-web" || r.TTL.D() != 10*time.Minute || r.CPUs != 0.5 || r.Memory != "268435456" || r.Meta["team"] != "a" {
		t.Errorf("the request for web: %+v", r)
	}
	web := get("web")
	if web.Status.ID != webID || web.Status.State != "ready" || web.Status.Node != "node-1" || web.Labels[v1alpha1.LabelNode] != "node-1" {
		t.Errorf("web after it was made: labels %v status %+v", web.Labels, web.Status)
	}
	if web.Spec.Image == nil || web.Spec.Image.Ref != "r" {
		t.Errorf("web's spec.image was not kept: %+v", web.Spec.Image)
	}
	if !slices.ContainsFunc(web.Status.Conditions, func(c metav1.Condition) bool {
		return c.Type == v1alpha1.ConditionPlaced && c.Status == metav1.ConditionTrue && c.Reason == v1alpha1.ReasonMadeOnNode
	}) {
		t.Errorf("web's conditions say nothing of its placement: %+v", web.Status.Conditions)
	}
	if again := get("again"); again.Status.ID != "sb_beforecrsh" {
		t.Errorf("the object of the sandbox made before the crash: %+v", again.Status)
	}
	if bad := get("bad"); bad.Status.State != "error" || !strings.Contains(bad.Status.Reason, "template missing not found") {
		t.Errorf("a refused spec: %+v", bad.Status)
	}
	for _, n := range []string{"elsewhere", "unbound"} {
		if o := get(n); o.Status.ID != "" || o.Status.State != "" {
			t.Errorf("%s was touched: %+v", n, o.Status)
		}
	}
	if h := get(v1alpha1.ObjectName("sb_hijacker1")); h.Status.ID != "sb_hijacker1" {
		t.Errorf("the sandbox whose meta names another node's object has no object of its own: %+v", h.Status)
	}
	if _, err := rc.Get(ctx, v1alpha1.ObjectName(webID), metav1.GetOptions{}); err == nil {
		t.Error("a second object, named after the id, was made for web")
	}
}

// TestDeleteObjectDeletesSandbox: every mirrored object carries the
// agent's finalizer; deleting the object (kubectl delete sandbox) deletes
// its sandbox, then drops the finalizer; a sandbox sbxd could not delete
// keeps its object's finalizer and is tried again; a sandbox gone on its
// own loses the finalizer before its object is deleted. The fake
// apiserver ignores finalizers, so the test sets deletionTimestamp itself
// and reads the finalizers back.
func TestDeleteObjectDeletesSandbox(t *testing.T) {
	dyn := dynamicfake.NewSimpleDynamicClientWithCustomListKinds(runtime.NewScheme(), map[schema.GroupVersionResource]string{
		v1alpha1.SandboxesResource: "SandboxList",
	})
	now := time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)
	src := &fakeSource{sbs: []api.Sandbox{
		{ID: "sb_aaaaaaaaaa", Template: "tiny", State: api.StateReady, CreatedAt: now},
		{ID: "sb_bbbbbbbbbb", Template: "tiny", State: api.StateReady, CreatedAt: now},
	}}
	a := &Agent{cfg: Config{Node: "node-1", Namespace: "sbx-system", Source: src}, dyn: dyn, log: slog.Default(), now: func() time.Time { return now }}
	ctx := context.Background()
	rc := dyn.Resource(v1alpha1.SandboxesResource).Namespace("sbx-system")
	get := func(id string) *unstructured.Unstructured {
		t.Helper()
		u, err := rc.Get(ctx, v1alpha1.ObjectName(id), metav1.GetOptions{})
		if err != nil {
			t.Fatalf("object of %s: %v", id, err)
		}
		return u
	}
	has := func(sbs []api.Sandbox, id string) bool {
		return slices.ContainsFunc(sbs, func(sb api.Sandbox) bool { return sb.ID == id })
	}
	if err := a.mirrorOnce(ctx); err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{"sb_aaaaaaaaaa", "sb_bbbbbbbbbb"} {
		if fs := get(id).GetFinalizers(); !slices.Equal(fs, []string{v1alpha1.Finalizer}) {
			t.Errorf("object of %s: finalizers %v, want [%s]", id, fs, v1alpha1.Finalizer)
		}
	}

	// kubectl delete: the apiserver sets deletionTimestamp and keeps it
	u := get("sb_aaaaaaaaaa")
	ts := metav1.NewTime(now)
	u.SetDeletionTimestamp(&ts)
	if _, err := rc.Update(ctx, u, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	// sbxd cannot delete it now: the object keeps its finalizer
	src.mu.Lock()
	src.failDelete = api.Errorf(api.ErrUnavailable, "sbxd is shutting down")
	src.mu.Unlock()
	if err := a.mirrorOnce(ctx); err == nil || !strings.Contains(err.Error(), "shutting down") {
		t.Errorf("a pass whose delete failed: %v, want its error", err)
	}
	if fs := get("sb_aaaaaaaaaa").GetFinalizers(); !slices.Contains(fs, v1alpha1.Finalizer) {
		t.Errorf("the finalizer went though the sandbox was not deleted: %v", fs)
	}
	src.mu.Lock()
	src.failDelete = nil
	src.mu.Unlock()
	if err := a.mirrorOnce(ctx); err != nil {
		t.Fatal(err)
	}
	sbs, _ := src.List(ctx)
	if has(sbs, "sb_aaaaaaaaaa") || !has(sbs, "sb_bbbbbbbbbb") {
		t.Errorf("after kubectl delete of sb_aaaaaaaaaa's object, sbxd has %v", sbs)
	}
	if fs := get("sb_aaaaaaaaaa").GetFinalizers(); len(fs) != 0 {
		t.Errorf("the deleted sandbox's object keeps finalizers %v", fs)
	}
	// and the next pass neither deletes more nor writes it again
	dyn.ClearActions()
	if err := a.mirrorOnce(ctx); err != nil {
		t.Fatal(err)
	}
	if sbs, _ := src.List(ctx); !has(sbs, "sb_bbbbbbbbbb") {
		t.Errorf("the other sandbox went too: %v", sbs)
	}
	for _, ac := range dyn.Actions() {
		if ac.GetVerb() == "create" {
			t.Errorf("a pass after the delete wrote %s/%s again", ac.GetVerb(), ac.GetResource().Resource)
		}
	}

	// an object written by hand, this node's label, another sandbox's id
	// in its status, deleted: it deletes nothing but itself
	forged := get("sb_bbbbbbbbbb").DeepCopy()
	forged.SetName("forged")
	forged.SetResourceVersion("")
	forged.SetUID("forged-uid")
	forged.SetDeletionTimestamp(&ts)
	if _, err := rc.Create(ctx, forged, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := a.mirrorOnce(ctx); err != nil {
		t.Fatal(err)
	}
	if sbs, _ := src.List(ctx); !has(sbs, "sb_bbbbbbbbbb") {
		t.Errorf("deleting a forged object that names sb_bbbbbbbbbb deleted it: %v", sbs)
	}
	if fs := get("sb_bbbbbbbbbb").GetFinalizers(); !slices.Contains(fs, v1alpha1.Finalizer) {
		t.Errorf("sb_bbbbbbbbbb's own object lost its finalizer: %v", fs)
	}
	if u, err := rc.Get(ctx, "forged", metav1.GetOptions{}); err != nil || len(u.GetFinalizers()) != 0 {
		t.Errorf("the forged object keeps its finalizer (%v)", err)
	}
	if err := rc.Delete(ctx, "forged", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}

	// sbx rm: the sandbox goes; its object loses the finalizer, then goes
	src.mu.Lock()
	src.sbs = nil
	src.mu.Unlock()
	dyn.ClearActions()
	if err := a.mirrorOnce(ctx); err != nil {
		t.Fatal(err)
	}
	var verbs []string
	for _, ac := range dyn.Actions() {
		if ac.GetVerb() == "update" || ac.GetVerb() == "delete" {
			verbs = append(verbs, ac.GetVerb())
		}
	}
	if !slices.Equal(verbs, []string{"update", "delete"}) {
		t.Errorf("a sandbox gone on its own: writes %v, want the finalizer dropped (update), then the delete", verbs)
	}
}

// TestWatchHurriesMirror: with no resync for an hour and no change of
// sbxd's, an object bound to the node is made, and one deleted has its
// sandbox deleted, at once: the watch of the Sandbox objects pokes a pass.
func TestWatchHurriesMirror(t *testing.T) {
	dyn := dynamicfake.NewSimpleDynamicClientWithCustomListKinds(runtime.NewScheme(), map[schema.GroupVersionResource]string{
		v1alpha1.SandboxesResource: "SandboxList",
	})
	now := time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)
	src := &fakeSource{}
	a := &Agent{cfg: Config{Node: "node-1", Namespace: "sbx-system", Source: src, Resync: time.Hour}, dyn: dyn,
		log: slog.Default(), now: func() time.Time { return now }}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { a.mirror(ctx); close(done) }()
	defer func() { cancel(); <-done }()
	rc := dyn.Resource(v1alpha1.SandboxesResource).Namespace("sbx-system")
	until := func(what string, cond func() bool) {
		t.Helper()
		for deadline := time.Now().Add(20 * time.Second); !cond(); time.Sleep(10 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("gave up waiting for %s (the resync is an hour away)", what)
			}
		}
	}
	time.Sleep(50 * time.Millisecond) // the first pass, with nothing to do
	u, err := v1alpha1.ToUnstructured(&v1alpha1.Sandbox{
		TypeMeta:   metav1.TypeMeta{APIVersion: v1alpha1.APIVersion, Kind: v1alpha1.KindSandbox},
		ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: "sbx-system"},
		Spec:       v1alpha1.SandboxSpec{Template: "tiny", NodeName: "node-1"},
	})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := rc.Create(ctx, u, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	var id string
	until("the bound object made", func() bool {
		sbs, _ := src.List(ctx)
		if len(sbs) == 1 {
			id = sbs[0].ID
		}
		got, err := rc.Get(ctx, "web", metav1.GetOptions{})
		return id != "" && err == nil && slices.Contains(got.GetFinalizers(), v1alpha1.Finalizer)
	})
	got, _ := rc.Get(ctx, "web", metav1.GetOptions{})
	ts := metav1.NewTime(now)
	got.SetDeletionTimestamp(&ts)
	if _, err := rc.Update(ctx, got, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	until("the deleted object's sandbox deleted", func() bool {
		sbs, _ := src.List(ctx)
		return len(sbs) == 0
	})
}
