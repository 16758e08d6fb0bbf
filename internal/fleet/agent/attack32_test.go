package agent

import (
	"context"
	"slices"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	k8stypes "k8s.io/apimachinery/pkg/types"

	"sbx.dev/sbx/api"
	"sbx.dev/sbx/internal/fleet/v1alpha1"
)

// Attacks on the agent's side of the last branch: deleteOrphan,
// deleteDeletedWhileDown, deleteAsked and tellCannotYet (attack 32).

// failingDelete is a managerSource whose Delete of the ids in fail
// answers err (sbxd busy with it, or refusing for now).
type failingDelete struct {
	*managerSource
	fail map[string]bool
	err  error
}

func (s *failingDelete) Delete(ctx context.Context, ref string, force bool) (*api.DeleteResult, error) {
	if s.fail[ref] {
		return nil, s.err
	}
	return s.managerSource.Delete(ctx, ref, force)
}

// putNode makes node-1's SandboxNode with list as its DeletedWhileDown.
func (f *fleetFixture) putNode(list []v1alpha1.DeletedObject) {
	f.t.Helper()
	node, err := v1alpha1.ToUnstructured(&v1alpha1.SandboxNode{
		TypeMeta:   metav1.TypeMeta{APIVersion: v1alpha1.APIVersion, Kind: v1alpha1.KindSandboxNode},
		ObjectMeta: metav1.ObjectMeta{Name: "node-1"},
		Status:     v1alpha1.SandboxNodeStatus{DeletedWhileDown: list},
	})
	if err != nil {
		f.t.Fatal(err)
	}
	if _, err := f.dyn.Resource(v1alpha1.SandboxNodesResource).Create(f.ctx, node, metav1.CreateOptions{}); err != nil {
		f.t.Fatal(err)
	}
}

func (f *fleetFixture) deletedWhileDown() []v1alpha1.DeletedObject {
	f.t.Helper()
	n, err := f.dyn.Resource(v1alpha1.SandboxNodesResource).Get(f.ctx, "node-1", metav1.GetOptions{})
	if err != nil {
		f.t.Fatal(err)
	}
	var typed v1alpha1.SandboxNode
	if err := v1alpha1.FromUnstructured(n, &typed); err != nil {
		f.t.Fatal(err)
	}
	return typed.Status.DeletedWhileDown
}

// TestAttack32DeletedWhileDownDeleteFails: node-1 is back, and its list
// names a sandbox mirrored by its id whose object was deleted while it was
// down; sbxd will not delete it for now. The sandbox stays for the next
// pass, but the mirror must not write its object again meanwhile: the
// object was deleted, and kubectl get would show it back (and, were the
// note then lost, the sandbox would live on under it).
func TestAttack32DeletedWhileDownDeleteFails(t *testing.T) {
	ms := &managerSource{sbs: []api.Sandbox{
		{ID: "sb_mirrorbyid", Template: "tiny", State: api.StateReady},
		{ID: "sb_madeforweb", Template: "tiny", State: api.StateReady, Meta: map[string]string{api.MetaObject: "web", api.MetaObjectUID: "uid-web"}},
	}}
	src := &failingDelete{managerSource: ms, fail: map[string]bool{"sb_mirrorbyid": true, "sb_madeforweb": true},
		err: api.Errorf(api.ErrUnavailable, "busy")}
	f := newFleetFixture(t, src)
	f.putNode([]v1alpha1.DeletedObject{
		{Object: v1alpha1.ObjectName("sb_mirrorbyid"), UID: "uid-m", ID: "sb_mirrorbyid"},
		{Object: "web", UID: "uid-web", ID: "sb_madeforweb"},
	})
	f.pass()
	if objs := f.objects(); len(objs) != 0 {
		t.Errorf("objects after a pass whose deletes failed: %v, want none (they were deleted)", objs)
	}
	if l := f.deletedWhileDown(); len(l) != 2 {
		t.Errorf("the list after the failed deletes: %+v, want both kept", l)
	}
	// sbxd deletes them now: the next pass does, and empties the list
	src.fail = nil
	f.pass()
	if len(ms.sbs) != 0 {
		t.Errorf("sandboxes left: %+v", ms.sbs)
	}
	if l := f.deletedWhileDown(); len(l) != 0 {
		t.Errorf("the list at the end: %+v, want it empty", l)
	}
	if objs := f.objects(); len(objs) != 0 {
		t.Errorf("objects at the end: %v", objs)
	}
}

// TestAttack32DeletingObjectWithoutStatusID: an object this node made a
// sandbox for is labelled here and holds the finalizer, but its status
// names no id yet (the status write after the label and finalizer failed:
// a conflict with the kubectl delete itself). It is deleted; it has
// another finalizer too, so it stays Terminating once the agent's is off.
// Its sandbox is the object's own (by sbx.object and its uid) and must go;
// it must not be kept, mirrored under an object named after its id.
func TestAttack32DeletingObjectWithoutStatusID(t *testing.T) {
	src := &managerSource{sbs: []api.Sandbox{
		{ID: "sb_madeforweb", Template: "tiny", State: api.StateReady, Meta: map[string]string{api.MetaObject: "web", api.MetaObjectUID: "uid-web"}},
	}}
	f := newFleetFixture(t, src)
	now := metav1.NewTime(time.Date(2026, 12, 1, 9, 0, 0, 0, time.UTC))
	u, err := v1alpha1.ToUnstructured(&v1alpha1.Sandbox{
		TypeMeta: metav1.TypeMeta{APIVersion: v1alpha1.APIVersion, Kind: v1alpha1.KindSandbox},
		ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: "sbx-system", UID: k8stypes.UID("uid-web"),
			Labels:            map[string]string{v1alpha1.LabelNode: "node-1"},
			Finalizers:        []string{v1alpha1.Finalizer, "example.com/keep"},
			DeletionTimestamp: &now},
		Spec: v1alpha1.SandboxSpec{Template: "tiny", NodeName: "node-1"},
	})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.rc.Create(f.ctx, u, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	f.pass()
	if len(src.sbs) != 0 {
		t.Errorf("sandboxes after its object was deleted: %+v, want none", src.sbs)
	}
	if objs := f.objects(); !slices.Equal(objs, []string{"web"}) {
		t.Errorf("objects: %v, want only web (Terminating, another's finalizer)", objs)
	}
	if sb, _ := f.get("web"); slices.Contains(sb.Finalizers, v1alpha1.Finalizer) {
		t.Errorf("web still has the agent's finalizer: %v", sb.Finalizers)
	}
}

// TestAttack32CutMoveCopyNoted: node-1 holds the stopped copy it adopted
// for a resume of sb_movedbyidx (mirrored by its id) off a down node; the
// object was deleted meanwhile and let go by the controller, which noted
// it on node-1's list too (the move's target). node-1 deletes the copy and
// writes no object for it: without the note it would mirror the copy as
// a sandbox of its own, the deleted object written again.
func TestAttack32CutMoveCopyNoted(t *testing.T) {
	src := &managerSource{sbs: []api.Sandbox{
		{ID: "sb_movedbyidx", Template: "tiny", State: api.StateStopped, Meta: map[string]string{api.MetaAdopted: "reg/moves:sb_movedbyidx-1"}},
	}}
	f := newFleetFixture(t, src)
	f.putNode([]v1alpha1.DeletedObject{{Object: v1alpha1.ObjectName("sb_movedbyidx"), UID: "uid-x", ID: "sb_movedbyidx"}})
	f.pass()
	if len(src.sbs) != 0 {
		t.Errorf("the copy is kept: %+v", src.sbs)
	}
	if objs := f.objects(); len(objs) != 0 {
		t.Errorf("objects: %v, want none", objs)
	}
}

// TestAttack32OrphanOfAnotherNamespace: the agent's namespace changed (its
// --fleet-namespace): the objects its sandboxes were made for are not
// found in the new one, which says nothing of them. They are kept,
// mirrored by their ids, not deleted as orphans (a helper's suspicion: a
// namespace change would have deleted every sandbox made through the
// apiserver). One made in this namespace whose object is gone still goes.
func TestAttack32OrphanOfAnotherNamespace(t *testing.T) {
	src := &managerSource{sbs: []api.Sandbox{
		{ID: "sb_madeinold1", Template: "tiny", State: api.StateReady, Meta: map[string]string{
			api.MetaObject: "web", api.MetaObjectUID: "uid-web", api.MetaObjectNamespace: "sbx-old"}},
		{ID: "sb_madehere01", Template: "tiny", State: api.StateReady, Meta: map[string]string{
			api.MetaObject: "api", api.MetaObjectUID: "uid-api", api.MetaObjectNamespace: "sbx-system"}},
	}}
	f := newFleetFixture(t, src)
	f.pass()
	var left []string
	for _, sb := range src.sbs {
		left = append(left, sb.ID)
	}
	if !slices.Equal(left, []string{"sb_madeinold1"}) {
		t.Errorf("sandboxes left: %v, want the one made in another namespace only", left)
	}
	if o, ok := f.get(v1alpha1.ObjectName("sb_madeinold1")); !ok || o.Status.ID != "sb_madeinold1" {
		t.Errorf("the sandbox made in another namespace has no mirror here: %v %+v (objects %v)", ok, o.Status, f.objects())
	}
}
