package placement

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	dynamicfake "k8s.io/client-go/dynamic/fake"
	k8stesting "k8s.io/client-go/testing"

	"sbx.dev/sbx/internal/fleet/v1alpha1"
)

// The fakes are client-go's own. Its object tracker neither sets nor
// checks resourceVersions, so apiserver adds what a real apiserver does
// that placement relies on: every write gets a new resourceVersion, and
// an update carrying another than the stored one is a Conflict. It also
// records every nodeName each sandbox was given, which is how a test
// sees a double bind.

const gib = int64(1) << 30

var t0 = time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

type apiserver struct {
	dyn *dynamicfake.FakeDynamicClient

	mu    sync.Mutex
	rv    int
	binds map[string][]string // sandbox: every non-empty nodeName written, in order
	// beforeUpdate, if set, runs before a sandbox update is judged; a
	// test's way to have another writer come in between (it may change
	// the stored object through the tracker). Returning an error fails
	// the update with it.
	beforeUpdate func(name string) error
}

func newAPIServer(tb testing.TB) *apiserver {
	tb.Helper()
	lists := map[schema.GroupVersionResource]string{
		v1alpha1.SandboxesResource:    "SandboxList",
		v1alpha1.SandboxNodesResource: "SandboxNodeList",
	}
	s := &apiserver{
		dyn:   dynamicfake.NewSimpleDynamicClientWithCustomListKinds(runtime.NewScheme(), lists),
		binds: map[string][]string{},
	}
	s.dyn.PrependReactor("create", "*", s.create)
	s.dyn.PrependReactor("update", "*", s.update)
	return s
}

func (s *apiserver) nextRV() string {
	s.rv++
	return fmt.Sprint(s.rv)
}

func (s *apiserver) create(a k8stesting.Action) (bool, runtime.Object, error) {
	ca := a.(k8stesting.CreateAction)
	u := ca.GetObject().(*unstructured.Unstructured).DeepCopy()
	s.mu.Lock()
	u.SetResourceVersion(s.nextRV())
	s.mu.Unlock()
	if err := s.dyn.Tracker().Create(ca.GetResource(), u, ca.GetNamespace()); err != nil {
		return true, nil, err
	}
	return true, u, nil
}

func (s *apiserver) update(a k8stesting.Action) (bool, runtime.Object, error) {
	ua := a.(k8stesting.UpdateAction)
	u := ua.GetObject().(*unstructured.Unstructured).DeepCopy()
	gvr, ns, name := ua.GetResource(), ua.GetNamespace(), u.GetName()
	if gvr == v1alpha1.SandboxesResource && s.beforeUpdate != nil {
		if err := s.beforeUpdate(name); err != nil {
			return true, nil, err
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	o, err := s.dyn.Tracker().Get(gvr, ns, name)
	if err != nil {
		return true, nil, err
	}
	cur := o.(*unstructured.Unstructured)
	if u.GetResourceVersion() != cur.GetResourceVersion() {
		return true, nil, apierrors.NewConflict(gvr.GroupResource(), name,
			fmt.Errorf("the object has been modified (resourceVersion %s, not %s)", cur.GetResourceVersion(), u.GetResourceVersion()))
	}
	if gvr == v1alpha1.SandboxesResource {
		was, _, _ := unstructured.NestedString(cur.Object, "spec", "nodeName")
		now, _, _ := unstructured.NestedString(u.Object, "spec", "nodeName")
		if now != "" && now != was {
			s.binds[name] = append(s.binds[name], now)
		}
	}
	u.SetResourceVersion(s.nextRV())
	if err := s.dyn.Tracker().Update(gvr, u, ns); err != nil {
		return true, nil, err
	}
	return true, u, nil
}

// put stores obj (a *v1alpha1.Sandbox or *v1alpha1.SandboxNode) as a
// client would create it.
func (s *apiserver) put(tb testing.TB, obj any) {
	tb.Helper()
	u, err := v1alpha1.ToUnstructured(obj)
	if err != nil {
		tb.Fatal(err)
	}
	ctx := context.Background()
	switch obj.(type) {
	case *v1alpha1.Sandbox:
		_, err = s.dyn.Resource(v1alpha1.SandboxesResource).Namespace(u.GetNamespace()).Create(ctx, u, metav1.CreateOptions{})
	case *v1alpha1.SandboxNode:
		_, err = s.dyn.Resource(v1alpha1.SandboxNodesResource).Create(ctx, u, metav1.CreateOptions{})
	default:
		tb.Fatalf("put %T", obj)
	}
	if err != nil {
		tb.Fatal(err)
	}
}

// sandbox reads the Sandbox object name.
func (s *apiserver) sandbox(tb testing.TB, name string) v1alpha1.Sandbox {
	tb.Helper()
	u, err := s.dyn.Resource(v1alpha1.SandboxesResource).Namespace(v1alpha1.DefaultNamespace).Get(context.Background(), name, metav1.GetOptions{})
	if err != nil {
		tb.Fatal(err)
	}
	var sb v1alpha1.Sandbox
	if err := v1alpha1.FromUnstructured(u, &sb); err != nil {
		tb.Fatal(err)
	}
	return sb
}

// setNode changes the stored Sandbox name's nodeName, as another placer
// would (a new resourceVersion).
func (s *apiserver) setNode(tb testing.TB, name, node string) {
	tb.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	o, err := s.dyn.Tracker().Get(v1alpha1.SandboxesResource, v1alpha1.DefaultNamespace, name)
	if err != nil {
		tb.Fatal(err)
	}
	u := o.(*unstructured.Unstructured).DeepCopy()
	if err := unstructured.SetNestedField(u.Object, node, "spec", "nodeName"); err != nil {
		tb.Fatal(err)
	}
	u.SetResourceVersion(s.nextRV())
	if node != "" {
		s.binds[name] = append(s.binds[name], node)
	}
	if err := s.dyn.Tracker().Update(v1alpha1.SandboxesResource, u, v1alpha1.DefaultNamespace); err != nil {
		tb.Fatal(err)
	}
}

// bindsOf is every nodeName written to sandbox name.
func (s *apiserver) bindsOf(name string) []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.binds[name]...)
}

// testNode is a ready node of memGiB memory, cpus CPUs and 1 TiB of disk,
// with runsc "runsc-a", features "avx2 sse4_2", a 64-byte cache line and
// agent builds "agent-new" and "agent-old".
func testNode(name string, memGiB int64, cpus int) *v1alpha1.SandboxNode {
	return &v1alpha1.SandboxNode{
		TypeMeta:   metav1.TypeMeta{APIVersion: v1alpha1.APIVersion, Kind: v1alpha1.KindSandboxNode},
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Status: v1alpha1.SandboxNodeStatus{
			Capacity:    v1alpha1.Capacity{CPUs: cpus, MemoryBytes: memGiB * gib, DiskFreeBytes: 1024 * gib},
			RunscSHA256: "runsc-a", CPUFeatures: []string{"avx2", "sse4_2"}, CacheLineBytes: 64,
			Agents:     []string{"agent-new", "agent-old"},
			Conditions: []metav1.Condition{{Type: v1alpha1.ConditionReady, Status: metav1.ConditionTrue, Reason: v1alpha1.ReasonAgentPublishing}},
		},
	}
}

// testSandbox is an unbound Sandbox of memGiB memory made at t0+age.
func testSandbox(name string, memGiB int64, age time.Duration) *v1alpha1.Sandbox {
	return &v1alpha1.Sandbox{
		TypeMeta: metav1.TypeMeta{APIVersion: v1alpha1.APIVersion, Kind: v1alpha1.KindSandbox},
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: v1alpha1.DefaultNamespace,
			CreationTimestamp: metav1.NewTime(t0.Add(age))},
		Spec: v1alpha1.SandboxSpec{Template: "base", MemoryBytes: memGiB * gib, DiskBytes: gib},
	}
}

func newTestPlacer(s *apiserver) *Placer {
	return New(Config{Logger: quiet}, s.dyn)
}
