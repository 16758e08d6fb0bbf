package agent

import (
	"context"
	"sync"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"sbx.dev/sbx/api"
	"sbx.dev/sbx/internal/fleet/v1alpha1"
)

// Attacks on the agent's side of a move (mirror.go): the controller's
// rebind racing a pass of the target's agent.

// listHookSource is a managerSource whose List runs after, once, after
// answering: what changes between the list of sandboxes and what the
// pass reads next.
type listHookSource struct {
	managerSource
	mu    sync.Mutex
	after func()
}

func (s *listHookSource) List(ctx context.Context) ([]api.Sandbox, error) {
	sbs, err := s.managerSource.List(ctx)
	s.mu.Lock()
	after := s.after
	s.after = nil
	s.mu.Unlock()
	if after != nil {
		after()
	}
	return sbs, err
}

// TestAttackMoveRebindMidPass: the target's agent listed its sandboxes
// just before the adopt, and the objects just after the controller's
// rebind (which labels the object with the target). It took the object,
// labelled here with no sandbox here in its list, for one whose sandbox
// is gone, and deleted it: the sandbox's object (a kubectl user's, named
// web) was gone, and the old node's agent, its copy not deleted yet, made
// one of its own, bound there.
func TestAttackMoveRebindMidPass(t *testing.T) {
	const id = "sb_aaaaaaaaaa"
	src := &listHookSource{}
	f := newFleetFixture(t, src)
	now := time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)
	// the object, written by node-0's agent, being moved to node-1
	sb := api.Sandbox{ID: id, Name: "web", Template: "tiny", State: api.StateStopped, CreatedAt: now,
		Meta: map[string]string{v1alpha1.MetaObject: "web", v1alpha1.MetaObjectUID: "uid-web"}}
	o := sandboxObject("node-0", "sbx-system", sb, nil, now)
	o.Name, o.UID = "web", "uid-web"
	o.Annotations = map[string]string{v1alpha1.AnnotationMovingTo: "node-1 " + now.Format(time.RFC3339) + " 0a0b"}
	u, err := v1alpha1.ToUnstructured(o)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.rc.Create(f.ctx, u, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// between this pass's list of sandboxes and of objects: the adopt here,
	// then the rebind
	src.after = func() {
		src.managerSource.mu.Lock()
		adopted := sb
		adopted.Meta = map[string]string{v1alpha1.MetaObject: "web", v1alpha1.MetaObjectUID: "uid-web", api.MetaAdopted: "reg/m@sha256:1"}
		src.managerSource.sbs = append(src.managerSource.sbs, adopted)
		src.managerSource.mu.Unlock()
		u, err := f.rc.Get(f.ctx, "web", metav1.GetOptions{})
		if err != nil {
			t.Error(err)
			return
		}
		_ = unstructured.SetNestedField(u.Object, "node-1", "spec", "nodeName")
		l := u.GetLabels()
		l[v1alpha1.LabelNode] = "node-1"
		u.SetLabels(l)
		u.SetAnnotations(nil)
		_ = unstructured.SetNestedField(u.Object, "node-1", "status", "node")
		if _, err := f.rc.Update(f.ctx, u, metav1.UpdateOptions{}); err != nil {
			t.Error(err)
		}
	}
	f.a.cfg.Node = "node-1"
	f.pass()
	got, ok := f.get("web")
	if !ok {
		t.Fatalf("the target's agent deleted the object of the sandbox moved to it (objects now %v)", f.objects())
	}
	f.pass()
	if got, ok = f.get("web"); !ok || got.Spec.NodeName != "node-1" || got.Status.ID != id || got.Status.Node != "node-1" {
		t.Errorf("the moved sandbox's object after two passes of its new node: %v %+v %+v (objects %v)", ok, got.Spec, got.Status, f.objects())
	}
	if sbs, _ := src.List(f.ctx); len(sbs) != 1 {
		t.Errorf("the target's copy: %v", sbs)
	}
}
