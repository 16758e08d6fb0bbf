package agent

import (
	"context"
	"log/slog"
	"sync"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	dynamicfake "k8s.io/client-go/dynamic/fake"

	"sbx.dev/sbx/api"
	"sbx.dev/sbx/internal/fleet/v1alpha1"
)

// fakeSource is a Source whose sandboxes the test sets.
type fakeSource struct {
	mu  sync.Mutex
	sbs []api.Sandbox
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
