package controller

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	k8stypes "k8s.io/apimachinery/pkg/types"

	"sbx.dev/sbx/internal/fleet/v1alpha1"
)

// Attacks on releaseDeleted (attack 32): the objects of a down node that
// are being deleted, noted on its SandboxNode and let go.

// deletingObj is sandbox id's object on node, being deleted (kubectl
// delete): a deletion timestamp, the agent's finalizer still on it.
func deletingObj(t *testing.T, id, node, uid string) *unstructured.Unstructured {
	u := sandboxObj(t, id, node, "ready", t0)
	now := metav1.NewTime(t0)
	u.SetDeletionTimestamp(&now)
	u.SetFinalizers([]string{v1alpha1.Finalizer})
	u.SetUID(k8stypes.UID(uid))
	return u
}

// TestAttack32ReleasePastMax: more objects of a down node are deleted at
// once (kubectl delete sandboxes --all) than its list holds. Those past
// MaxDeletedWhileDown stay Terminating until it is back, as the list's
// bound says; the first MaxDeletedWhileDown must still be let go, not all
// kept Terminating for as long as the node is down, check after check.
func TestAttack32ReleasePastMax(t *testing.T) {
	ctx := context.Background()
	extra := 3
	objs := []runtime.Object{nodeObj(t, "n1"), nodeObj(t, "n2")}
	for i := range v1alpha1.MaxDeletedWhileDown + extra {
		id := fmt.Sprintf("sb_%010d", i)
		objs = append(objs, deletingObj(t, id, "n2", fmt.Sprintf("uid-%d", i)))
	}
	f := newTestFleet(t, objs, lease("n1", t0.Add(10*time.Second)), lease("n2", t0.Add(-5*time.Second)))
	*f.now = t0.Add(11 * time.Second)
	for range 2 {
		_ = f.c.CheckNodes(ctx) // the rest's error is said
	}
	n2, err := f.dyn.Resource(v1alpha1.SandboxNodesResource).Get(ctx, "n2", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	noted := deletedWhileDown(t, n2)
	if len(noted) != v1alpha1.MaxDeletedWhileDown {
		t.Errorf("noted %d, want %d", len(noted), v1alpha1.MaxDeletedWhileDown)
	}
	l, err := f.dyn.Resource(v1alpha1.SandboxesResource).Namespace(v1alpha1.DefaultNamespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	held := 0
	for _, u := range l.Items {
		if !slices.Contains(u.GetFinalizers(), v1alpha1.Finalizer) {
			continue
		}
		held++
		d := v1alpha1.DeletedObject{Object: u.GetName(), UID: string(u.GetUID()), ID: statusID(&u)}
		if slices.Contains(noted, d) {
			t.Errorf("%s is noted, yet its finalizer is kept", u.GetName())
		}
	}
	if held != extra {
		t.Errorf("%d objects keep the finalizer, want %d (those past the list's bound)", held, extra)
	}
}

// TestAttack32ReleaseCutMove: a resume of stopped sb_movingxxxx, whose
// node n2 is down, had n1 adopt a copy (the object marked moving to n1)
// when the object was deleted; the rebind is refused, and the controller
// lets the object go for n2. n1's agent kept its copy while the object was
// bound to n2; once the object is gone it mirrors the copy as a sandbox of
// its own, the deleted object written again. So the object must be noted
// on n1's list too (its agent deletes the copy), before it is let go; an
// object marked for a node that is not in the fleet is let go alone.
func TestAttack32ReleaseCutMove(t *testing.T) {
	ctx := context.Background()
	moving := deletingObj(t, "sb_movingxxxx", "n2", "uid-m")
	moving.SetAnnotations(map[string]string{v1alpha1.AnnotationMovingTo: "n1 " + t0.Format(time.RFC3339) + " abcd"})
	nowhere := deletingObj(t, "sb_nowherexxx", "n2", "uid-w")
	nowhere.SetAnnotations(map[string]string{v1alpha1.AnnotationMovingTo: "n9 " + t0.Format(time.RFC3339) + " abcd"})
	f := newTestFleet(t, []runtime.Object{nodeObj(t, "n1"), nodeObj(t, "n2"), moving, nowhere},
		lease("n1", t0.Add(10*time.Second)), lease("n2", t0.Add(-5*time.Second)))
	*f.now = t0.Add(11 * time.Second)
	if err := f.c.CheckNodes(ctx); err != nil {
		t.Fatal(err)
	}
	n1, err := f.dyn.Resource(v1alpha1.SandboxNodesResource).Get(ctx, "n1", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	want := []v1alpha1.DeletedObject{{Object: v1alpha1.ObjectName("sb_movingxxxx"), UID: "uid-m", ID: "sb_movingxxxx"}}
	if got := deletedWhileDown(t, n1); !slices.Equal(got, want) {
		t.Errorf("noted on n1, the move's target: %+v, want %+v", got, want)
	}
	rc := f.dyn.Resource(v1alpha1.SandboxesResource).Namespace(v1alpha1.DefaultNamespace)
	for _, id := range []string{"sb_movingxxxx", "sb_nowherexxx"} {
		if u, err := rc.Get(ctx, v1alpha1.ObjectName(id), metav1.GetOptions{}); err == nil && slices.Contains(u.GetFinalizers(), v1alpha1.Finalizer) {
			t.Errorf("%s is not let go", id)
		}
	}
}
