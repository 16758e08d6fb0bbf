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
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	k8stypes "k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
	dynamicfake "k8s.io/client-go/dynamic/fake"
	k8stesting "k8s.io/client-go/testing"

	"sbx.dev/sbx/api"
	"sbx.dev/sbx/internal/fleet/v1alpha1"
)

// Attacks on the node agent's making of bound Sandbox objects (issue 24):
// mirror.go's mirrorOnce, makeBound, boundHere, objectName, createRequest
// and refuse.

// managerSource plays *sandbox.Manager more closely than fakeSource: its
// names are unique (a taken one is api.ErrConflict), a missing template
// or snapshot is api.ErrNotFound, and List hides a sandbox whose meta has
// api.MetaPool, as Manager.List does (a warm pool's). fail, if set, is the
// error of the next Create (then cleared).
type managerSource struct {
	mu   sync.Mutex
	sbs  []api.Sandbox
	reqs []api.CreateRequest
	fail error
	// during, if set, runs inside Create, before the sandbox exists
	during func(req api.CreateRequest)
}

func (s *managerSource) Create(_ context.Context, req api.CreateRequest) (*api.Sandbox, error) {
	s.mu.Lock()
	during := s.during
	s.mu.Unlock()
	if during != nil {
		during(req)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.reqs = append(s.reqs, req)
	if err := s.fail; err != nil {
		s.fail = nil
		return nil, err
	}
	switch {
	case req.Template == "missing":
		return nil, api.Errorf(api.ErrNotFound, "template missing not found")
	case req.From != "":
		return nil, api.Errorf(api.ErrNotFound, "snapshot %s not found", req.From)
	}
	for _, sb := range s.sbs {
		if req.Name != "" && sb.Name == req.Name {
			return nil, api.Errorf(api.ErrConflict, "name %q is taken", req.Name)
		}
	}
	sb := api.Sandbox{ID: fmt.Sprintf("sb_made%05d", len(s.reqs)), Name: req.Name, Template: req.Template, State: api.StateReady,
		TTL: req.TTL, CPUs: req.CPUs, Meta: req.Meta}
	s.sbs = append(s.sbs, sb)
	return &sb, nil
}

func (s *managerSource) Delete(_ context.Context, ref string, _ bool) (*api.DeleteResult, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return deleteFrom(&s.sbs, ref)
}

// deleteFrom plays sbxd's delete on sbs: by id or name, api.ErrNotFound
// when none is.
func deleteFrom(sbs *[]api.Sandbox, ref string) (*api.DeleteResult, error) {
	for i, sb := range *sbs {
		if sb.ID == ref || (sb.Name != "" && sb.Name == ref) {
			*sbs = slices.Delete(*sbs, i, i+1)
			return &api.DeleteResult{}, nil
		}
	}
	return nil, api.Errorf(api.ErrNotFound, "no sandbox %q", ref)
}

func (s *managerSource) Changed() <-chan struct{} { return nil }
func (s *managerSource) List(context.Context) ([]api.Sandbox, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []api.Sandbox
	for _, sb := range s.sbs {
		if sb.Meta[api.MetaPool] != "" {
			continue // Manager.List: the warm pool's
		}
		out = append(out, sb)
	}
	return out, nil
}

func (s *managerSource) asked() []api.CreateRequest {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]api.CreateRequest(nil), s.reqs...)
}

// fleetFixture is a fake apiserver and an agent of node-1 on src.
type fleetFixture struct {
	t   *testing.T
	ctx context.Context
	dyn *dynamicfake.FakeDynamicClient
	rc  dynamic.ResourceInterface
	a   *Agent
}

func newFleetFixture(t *testing.T, src Source) *fleetFixture {
	scheme := runtime.NewScheme()
	dyn := dynamicfake.NewSimpleDynamicClientWithCustomListKinds(scheme, map[schema.GroupVersionResource]string{
		v1alpha1.SandboxesResource: "SandboxList",
	})
	now := time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)
	return &fleetFixture{t: t, ctx: context.Background(), dyn: dyn,
		rc: dyn.Resource(v1alpha1.SandboxesResource).Namespace("sbx-system"),
		a: &Agent{cfg: Config{Node: "node-1", Namespace: "sbx-system", Source: src}, dyn: dyn,
			log: slog.New(slog.DiscardHandler), now: func() time.Time { return now }},
	}
}

// ask makes a Sandbox object name with spec, as the controller would.
func (f *fleetFixture) ask(name string, spec v1alpha1.SandboxSpec) {
	f.t.Helper()
	u, err := v1alpha1.ToUnstructured(&v1alpha1.Sandbox{
		TypeMeta: metav1.TypeMeta{APIVersion: v1alpha1.APIVersion, Kind: v1alpha1.KindSandbox},
		// a UID, as the apiserver gives every object (the fake gives none)
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "sbx-system", UID: k8stypes.UID(fmt.Sprintf("uid-%s-%d", name, time.Now().UnixNano()))},
		Spec:       spec,
	})
	if err != nil {
		f.t.Fatal(err)
	}
	if _, err := f.rc.Create(f.ctx, u, metav1.CreateOptions{}); err != nil {
		f.t.Fatal(err)
	}
}

// get is object name, or ok false if there is none.
func (f *fleetFixture) get(name string) (v1alpha1.Sandbox, bool) {
	f.t.Helper()
	u, err := f.rc.Get(f.ctx, name, metav1.GetOptions{})
	if err != nil {
		return v1alpha1.Sandbox{}, false
	}
	var sb v1alpha1.Sandbox
	if err := v1alpha1.FromUnstructured(u, &sb); err != nil {
		f.t.Fatal(err)
	}
	sb.Labels = u.GetLabels()
	return sb, true
}

func (f *fleetFixture) pass() {
	f.t.Helper()
	if err := f.a.mirrorOnce(f.ctx); err != nil {
		f.t.Logf("mirrorOnce: %v", err)
	}
}

func (f *fleetFixture) objects() []string {
	f.t.Helper()
	l, err := f.rc.List(f.ctx, metav1.ListOptions{})
	if err != nil {
		f.t.Fatal(err)
	}
	var n []string
	for _, u := range l.Items {
		n = append(n, u.GetName())
	}
	return n
}

// TestAttack24PoolMetaInSpec: spec.meta may set sbx.pool (the warm pool's
// mark): createRequest copies it and asks sbxd, with no
// api.CreateRequest.Validate (the edge that refuses it over HTTP), and
// Manager.Create does not refuse it either. The sandbox is the pool's:
// Manager.List hides it, so at the next pass the agent takes the object it
// just made for it as gone and deletes it, while the sandbox lives on,
// hidden, to be given to someone else's create.
func TestAttack24PoolMetaInSpec(t *testing.T) {
	if req, err := createRequest("web", "uid-web", "sbx-system", v1alpha1.SandboxSpec{Template: "tiny", Meta: map[string]string{api.MetaPool: "tiny"}}); err == nil && req.Meta[api.MetaPool] != "" {
		t.Errorf("createRequest passes spec.meta %s=%s on to sbxd (over HTTP, api.CreateRequest.Validate refuses the key)", api.MetaPool, req.Meta[api.MetaPool])
	}
	src := &managerSource{}
	f := newFleetFixture(t, src)
	f.ask("web", v1alpha1.SandboxSpec{Template: "tiny", NodeName: "node-1", Meta: map[string]string{api.MetaPool: "tiny"}})
	f.pass()
	if len(src.asked()) == 0 {
		return // refused before sbxd: held
	}
	if o, ok := f.get("web"); ok && o.Status.State == string(api.StateError) {
		return // refused, and said why: held
	}
	f.pass()
	o, ok := f.get("web")
	if !ok || o.Status.ID == "" {
		t.Fatalf("a Sandbox whose spec.meta sets %s was made (sandbox %s, hidden from List as a warm pool's), and at the next pass its object was deleted as gone: object web %+v, %v",
			api.MetaPool, src.sbs[0].ID, o.Status, ok)
	}
}

// TestAttack24CPUsNaN: spec.cpus "NaN" parses (strconv.ParseFloat) and
// passes `c < 0`; it goes to sbxd as NaN, whose range check lets it by
// (the store's NOT NULL then fails the create with an internal error:
// internal/sandbox TestAttack25CPUsNaN).
func TestAttack24CPUsNaN(t *testing.T) {
	for _, s := range []string{"NaN", "nan", "-0", "+Inf", "1e400", "0x1p-2", "1_0"} {
		req, err := createRequest("web", "uid-web", "sbx-system", v1alpha1.SandboxSpec{Template: "tiny", CPUs: s})
		if err != nil {
			continue
		}
		if req.CPUs != req.CPUs { // NaN; +Inf goes too, but sbxd's checkCPUs refuses it
			t.Errorf("spec.cpus %q is taken as %v and sent to sbxd (mirror.go createRequest checks only c < 0)", s, req.CPUs)
		}
	}
}

// TestAttack24HostileSpecs: specs sbxd or the agent refuses are told in
// their status (state error, the reason) and not tried again; none makes
// a sandbox, and the agent's own meta key is the object's name whatever
// spec.meta says.
func TestAttack24HostileSpecs(t *testing.T) {
	src := &managerSource{sbs: []api.Sandbox{{ID: "sb_usersbxaaa", Name: "taken", Template: "tiny", State: api.StateReady}}}
	f := newFleetFixture(t, src)
	big := map[string]string{}
	for i := range 200 {
		big[fmt.Sprintf("k%03d", i)] = strings.Repeat("v", 1024)
	}
	specs := map[string]v1alpha1.SandboxSpec{
		"bad-ttl":      {Template: "tiny", NodeName: "node-1", TTL: "-5m"},
		"bad-ttl2":     {Template: "tiny", NodeName: "node-1", TTL: "forever"},
		"bad-cpus":     {Template: "tiny", NodeName: "node-1", CPUs: "two"},
		"neg-cpus":     {Template: "tiny", NodeName: "node-1", CPUs: "-1"},
		"no-template":  {Template: "missing", NodeName: "node-1"},
		"no-snapshot":  {Template: "tiny", NodeName: "node-1", From: "nosuchsnap"},
		"taken-name":   {Template: "tiny", NodeName: "node-1", Name: "taken"},
		"huge-meta":    {Template: "tiny", NodeName: "node-1", Meta: big},
		"object-spoof": {Template: "tiny", NodeName: "node-1", Meta: map[string]string{api.MetaObject: "elsewhere"}},
	}
	// huge-meta is refused by sbxd's checkMeta (64 keys); the fake has no
	// such rule, so it plays it
	src.during = func(req api.CreateRequest) {
		if len(req.Meta) > 64 {
			src.mu.Lock()
			src.fail = api.Errorf(api.ErrInvalid, "meta: at most 64 keys, got %d", len(req.Meta))
			src.mu.Unlock()
		}
	}
	for name, s := range specs {
		f.ask(name, s)
	}
	f.pass()
	f.pass()
	asked := map[string]int{}
	for _, r := range src.asked() {
		asked[r.Meta[api.MetaObject]]++
	}
	for name := range specs {
		o, ok := f.get(name)
		if !ok {
			t.Errorf("%s: the object is gone", name)
			continue
		}
		if asked[name] > 1 {
			t.Errorf("%s: sbxd was asked %d times over two passes", name, asked[name])
		}
		if name == "object-spoof" {
			// sbx's own meta in a spec is refused, as the API refuses it
			if o.Status.State != string(api.StateError) || !strings.Contains(o.Status.Reason, "sbx.object is the fleet's") || asked["elsewhere"] > 0 {
				t.Errorf("object-spoof: %+v; asked %v", o.Status, asked)
			}
			continue
		}
		if o.Status.State != string(api.StateError) || !strings.Contains(o.Status.Reason, "node-1 could not make it") {
			t.Errorf("%s: status %+v, want state error with the reason", name, o.Status)
		}
	}
	if o, _ := f.get("taken-name"); !strings.Contains(o.Status.Reason, "taken") {
		t.Errorf("taken-name: the reason does not say the name is taken: %q", o.Status.Reason)
	}
}

// TestAttack24SameSpecName: two objects asking the same sbx name: one is
// made, the other is refused (the name is taken) and says so.
func TestAttack24SameSpecName(t *testing.T) {
	src := &managerSource{}
	f := newFleetFixture(t, src)
	f.ask("one", v1alpha1.SandboxSpec{Template: "tiny", NodeName: "node-1", Name: "dup"})
	f.ask("two", v1alpha1.SandboxSpec{Template: "tiny", NodeName: "node-1", Name: "dup"})
	f.pass()
	f.pass()
	one, _ := f.get("one")
	two, _ := f.get("two")
	made, refused := 0, 0
	for _, o := range []v1alpha1.Sandbox{one, two} {
		switch {
		case o.Status.ID != "" && o.Status.State == "ready":
			made++
		case o.Status.State == "error" && strings.Contains(o.Status.Reason, "taken"):
			refused++
		}
	}
	if made != 1 || refused != 1 || len(src.sbs) != 1 {
		t.Errorf("two objects with spec.name dup: one %+v, two %+v, sandboxes %d", one.Status, two.Status, len(src.sbs))
	}
}

// TestAttack24ReboundAfterMade: an object made on node-1, then bound to
// node-2 (spec.nodeName changed, status as node-1 wrote it): node-2 makes
// nothing, node-1 keeps it as its mirror.
func TestAttack24ReboundAfterMade(t *testing.T) {
	src1, src2 := &managerSource{}, &managerSource{}
	f := newFleetFixture(t, src1)
	f.ask("web", v1alpha1.SandboxSpec{Template: "tiny", NodeName: "node-1"})
	f.pass()
	u, err := f.rc.Get(f.ctx, "web", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if err := unstructuredSet(u.Object, "node-2", "spec", "nodeName"); err != nil {
		t.Fatal(err)
	}
	if _, err := f.rc.Update(f.ctx, u, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	a2 := &Agent{cfg: Config{Node: "node-2", Namespace: "sbx-system", Source: src2}, dyn: f.dyn, log: slog.New(slog.DiscardHandler), now: f.a.now}
	if err := a2.mirrorOnce(f.ctx); err != nil {
		t.Fatal(err)
	}
	f.pass()
	if n := len(src2.asked()); n != 0 {
		t.Errorf("node-2 made %d sandboxes for an object node-1 had made already", n)
	}
	if o, _ := f.get("web"); o.Status.Node != "node-1" || o.Spec.NodeName != "node-1" || o.Status.ID != src1.sbs[0].ID {
		t.Errorf("the object after its rebinding: spec.nodeName %s, status %+v", o.Spec.NodeName, o.Status)
	}
}

func unstructuredSet(obj map[string]any, v string, path ...string) error {
	for _, p := range path[:len(path)-1] {
		next, ok := obj[p].(map[string]any)
		if !ok {
			return fmt.Errorf("no %s", p)
		}
		obj = next
	}
	obj[path[len(path)-1]] = v
	return nil
}

// TestAttack24DeletedWhileMade: the object is deleted while sbxd makes its
// sandbox, before the agent's finalizer is on it. Its deletion asks for the
// sandbox's, as any object's does: the sandbox is deleted, not mirrored
// under its id (it lived on so before, a sandbox nobody had asked to keep).
// A new object of the same name, asking something else, is then made
// for itself: makeBound's "made already" goes by the object's name and
// uid.
func TestAttack24DeletedWhileMade(t *testing.T) {
	src := &managerSource{}
	f := newFleetFixture(t, src)
	f.ask("web", v1alpha1.SandboxSpec{Template: "tiny", NodeName: "node-1", Name: "old"})
	src.during = func(api.CreateRequest) {
		if err := f.rc.Delete(f.ctx, "web", metav1.DeleteOptions{}); err != nil {
			t.Error(err)
		}
	}
	f.pass()
	src.mu.Lock()
	src.during = nil
	left := len(src.sbs)
	src.mu.Unlock()
	if len(src.asked()) != 1 {
		t.Fatalf("sbxd was asked %d times for web, want once", len(src.asked()))
	}
	if left != 0 {
		t.Errorf("%d sandboxes left after their object was deleted while they were made, want none; objects %v", left, f.objects())
	}
	if objs := f.objects(); len(objs) != 0 {
		t.Errorf("objects after the deleted web: %v, want none", objs)
	}
	// the same name asked again, for another template
	f.ask("web", v1alpha1.SandboxSpec{Template: "big", NodeName: "node-1", Name: "new"})
	f.pass()
	f.pass()
	var forWeb []string
	for _, r := range src.asked() {
		if r.Meta[api.MetaObject] == "web" {
			forWeb = append(forWeb, r.Template)
		}
	}
	o, _ := f.get("web")
	if len(forWeb) != 2 || o.Spec.Template != "big" || o.Status.ID == "" {
		t.Fatalf("a Sandbox object web (template big, name new), asked after an earlier web was deleted while being made, was never made: sbxd asked for web with %v; object web is now spec.template %q spec.name %q status.id %s; objects %v",
			forWeb, o.Spec.Template, o.Spec.Name, o.Status.ID, f.objects())
	}
}

// TestAttack24TransientFailureIsFinal: sbxd refuses a create for a reason
// that is not the spec's (its data dir is full, for a moment: ErrUnavailable).
// makeBound's refuse marks the object failed (state error) and it is never
// tried again, though nothing in it was wrong.
func TestAttack24TransientFailureIsFinal(t *testing.T) {
	src := &managerSource{fail: api.Errorf(api.ErrUnavailable, "create: sbxd's data dir /var/lib/sbx is full (10 MiB free, it wants 1.0 GiB): free some space there")}
	f := newFleetFixture(t, src)
	f.ask("web", v1alpha1.SandboxSpec{Template: "tiny", NodeName: "node-1"})
	f.pass() // the data dir is full
	// whoever waits for it hears why (a create through the controller
	// answers with it), and it is still bound here, not refused
	if o, _ := f.get("web"); o.Status.State != "" || !slices.ContainsFunc(o.Status.Conditions, func(c metav1.Condition) bool {
		return c.Type == v1alpha1.ConditionReady && c.Reason == v1alpha1.ReasonNodeCannotYet && strings.Contains(c.Message, "data dir /var/lib/sbx is full")
	}) {
		t.Errorf("an object its node cannot make yet: status %+v, want no state and Ready=False %s saying why", o.Status, v1alpha1.ReasonNodeCannotYet)
	}
	f.pass() // it is not any more
	f.pass()
	o, _ := f.get("web")
	if o.Status.ID == "" {
		t.Fatalf("an object refused once because sbxd was momentarily unavailable is never tried again: %d creates over three passes, status %s %q (mirror.go makeBound refuses on any error)",
			len(src.asked()), o.Status.State, o.Status.Reason)
	}
}

// TestAttack24MadeOnceAcrossFailedWrite: the sandbox is made, the object's
// writes fail at that pass (the apiserver says no); the next pass does not
// make it again, it writes the object.
func TestAttack24MadeOnceAcrossFailedWrite(t *testing.T) {
	src := &managerSource{}
	f := newFleetFixture(t, src)
	f.ask("web", v1alpha1.SandboxSpec{Template: "tiny", NodeName: "node-1"})
	fail := true
	f.dyn.PrependReactor("update", "sandboxes", func(ac k8stesting.Action) (bool, runtime.Object, error) {
		if fail {
			return true, nil, fmt.Errorf("apiserver: the write timed out")
		}
		return false, nil, nil
	})
	f.pass()
	fail = false
	f.pass()
	f.pass()
	if n := len(src.asked()); n != 1 {
		t.Errorf("sbxd was asked %d times for one object whose first write failed", n)
	}
	if o, _ := f.get("web"); o.Status.ID != src.sbs[0].ID {
		t.Errorf("the object after its write failed once: %+v", o.Status)
	}
}

// TestDeletedWhileDownDeletesSandboxes: node-1 comes back to find objects
// deleted while it was down noted on its SandboxNode (the controller let
// them go): a sandbox made for its object and one mirrored by its id are
// deleted before anything is mirrored (so no object is written for them
// again), and the list is emptied. An entry naming a sandbox with another
// object's name (a status id written by hand) deletes nothing.
func TestDeletedWhileDownDeletesSandboxes(t *testing.T) {
	src := &managerSource{sbs: []api.Sandbox{
		{ID: "sb_madeforweb", Template: "tiny", State: api.StateReady, Meta: map[string]string{api.MetaObject: "web", api.MetaObjectUID: "uid-web"}},
		{ID: "sb_mirrorbyid", Template: "tiny", State: api.StateReady},
		{ID: "sb_someoneels", Template: "tiny", State: api.StateReady},
	}}
	f := newFleetFixture(t, src)
	f.putNode([]v1alpha1.DeletedObject{
		{Object: "web", UID: "uid-web", ID: "sb_madeforweb"},
		{Object: v1alpha1.ObjectName("sb_mirrorbyid"), UID: "uid-m", ID: "sb_mirrorbyid"},
		{Object: "hostile", UID: "uid-h", ID: "sb_someoneels"},
		{Object: "gone", UID: "uid-g", ID: "sb_notherenow"},
	})
	f.pass()
	var left []string
	for _, sb := range src.sbs {
		left = append(left, sb.ID)
	}
	if !slices.Equal(left, []string{"sb_someoneels"}) {
		t.Errorf("sandboxes after the pass: %v, want only sb_someoneels (its entry named another object)", left)
	}
	if objs := f.objects(); !slices.Equal(objs, []string{v1alpha1.ObjectName("sb_someoneels")}) {
		t.Errorf("objects after the pass: %v, want only sb_someoneels's mirror", objs)
	}
	n, err := f.dyn.Resource(v1alpha1.SandboxNodesResource).Get(f.ctx, "node-1", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var typed v1alpha1.SandboxNode
	if err := v1alpha1.FromUnstructured(n, &typed); err != nil {
		t.Fatal(err)
	}
	if l := typed.Status.DeletedWhileDown; len(l) != 0 {
		t.Errorf("the list after the pass: %+v, want it empty", l)
	}
}
