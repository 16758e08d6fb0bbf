package agent

import (
	"context"
	"fmt"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	kerrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	k8stesting "k8s.io/client-go/testing"

	"sbx.dev/sbx/api"
	"sbx.dev/sbx/internal/fleet/v1alpha1"
)

// Attacks on the node agent's mirror of kubectl's deletes and the objects'
// labels (issue 24, second round): mirror.go's boundHere, deleteAsked and
// putSandbox.

// TestAttack24bBoundWhileDeleted: an object bound to node-1 and being
// deleted (kubectl delete; another's finalizer holds it) asks for nothing:
// placement leaves such an object alone, and the agent must not make it
// either (the real apiserver then refuses the agent's finalizer on it, so
// the sandbox would outlive the object, mirrored by its id).
func TestAttack24bBoundWhileDeleted(t *testing.T) {
	src := &managerSource{}
	f := newFleetFixture(t, src)
	f.ask("web", v1alpha1.SandboxSpec{Template: "tiny", NodeName: "node-1"})
	f.markDeleted("web", "example.com/backup")
	f.pass()
	f.pass()
	if n := len(src.asked()); n != 0 {
		t.Errorf("an object bound here and being deleted was made: sbxd asked %d times; objects %v", n, f.objects())
	}
}

// TestAttack24bLostBeforeMade: an object bound to node-1 whose node went
// down before it made it is marked lost by the controller (state lost, no
// id). When node-1 comes back it must make it: nothing else will
// (placement leaves a bound or lost object alone), and the create waiting
// on it says "sbx list shows it once it is".
func TestAttack24bLostBeforeMade(t *testing.T) {
	src := &managerSource{}
	f := newFleetFixture(t, src)
	f.ask("web", v1alpha1.SandboxSpec{Template: "tiny", NodeName: "node-1"})
	u, err := f.rc.Get(f.ctx, "web", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	// what the controller's markSandboxesLost writes
	u.Object["status"] = map[string]any{"state": string(api.StateLost), "reason": "node node-1 is down: its node agent stopped renewing its Lease"}
	if _, err := f.rc.UpdateStatus(f.ctx, u, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	f.pass()
	f.pass()
	o, _ := f.get("web")
	if n := len(src.asked()); n != 1 || o.Status.ID == "" || o.Status.State != string(api.StateReady) {
		t.Errorf("an object bound to node-1, marked lost while node-1 was down before it made it, after node-1 is back: sbxd asked %d times, status %+v", n, o.Status)
	}
}

// TestAttack24bLabelTaken: kubectl label sandbox X sbx.dev/node- (or
// another node's name) takes a mirrored object out of the agent's list.
// The agent must put the label right (its Create of the object meets
// AlreadyExists at every pass otherwise, and the object is never put
// right), and a kubectl delete of it must then delete its sandbox (only
// labelled objects have their deletes seen: it would hang in Terminating).
func TestAttack24bLabelTaken(t *testing.T) {
	for _, label := range []string{"", "node-9"} {
		t.Run("label="+label, func(t *testing.T) {
			src := &managerSource{sbs: []api.Sandbox{{ID: "sb_aaaaaaaaaa", Template: "tiny", State: api.StateReady}}}
			f := newFleetFixture(t, src)
			f.pass()
			name := v1alpha1.ObjectName("sb_aaaaaaaaaa")
			u, err := f.rc.Get(f.ctx, name, metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			ls := u.GetLabels()
			if label == "" {
				delete(ls, v1alpha1.LabelNode)
			} else {
				ls[v1alpha1.LabelNode] = label
			}
			u.SetLabels(ls)
			if _, err := f.rc.Update(f.ctx, u, metav1.UpdateOptions{}); err != nil {
				t.Fatal(err)
			}
			if err := f.a.mirrorOnce(f.ctx); err != nil {
				t.Errorf("the pass after the label was changed: %v", err)
			}
			if err := f.a.mirrorOnce(f.ctx); err != nil {
				t.Errorf("the second pass after the label was changed: %v", err)
			}
			o, ok := f.get(name)
			if !ok || o.Labels[v1alpha1.LabelNode] != "node-1" || o.Status.ID != "sb_aaaaaaaaaa" {
				t.Fatalf("the object after its label was changed to %q and two passes: %v, labels %v, status %+v", label, ok, o.Labels, o.Status)
			}
			// kubectl delete: the apiserver sets deletionTimestamp
			f.markDeleted(name)
			f.pass()
			if sbs, _ := src.List(f.ctx); len(sbs) != 0 {
				t.Errorf("kubectl delete of the relabelled object left its sandbox: %v", sbs)
			}
			if u, err := f.rc.Get(f.ctx, name, metav1.GetOptions{}); err == nil && slices.Contains(u.GetFinalizers(), v1alpha1.Finalizer) {
				t.Errorf("the deleted object keeps the finalizer: it hangs in Terminating")
			}
		})
	}
}

// TestAttack24bLabelTakenFleetMade: as TestAttack24bLabelTaken, for an
// object asked through the apiserver (the sandbox mirrored under the
// object's own name): with its label gone, the agent wrote a second
// object, named after the id, for the same sandbox, and the first one,
// kubectl deleted, hung in Terminating.
func TestAttack24bLabelTakenFleetMade(t *testing.T) {
	src := &managerSource{}
	f := newFleetFixture(t, src)
	f.ask("web", v1alpha1.SandboxSpec{Template: "tiny", NodeName: "node-1"})
	f.pass()
	o, _ := f.get("web")
	if o.Status.ID == "" {
		t.Fatalf("web not made: %+v", o.Status)
	}
	u, err := f.rc.Get(f.ctx, "web", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	ls := u.GetLabels()
	delete(ls, v1alpha1.LabelNode)
	u.SetLabels(ls)
	if _, err := f.rc.Update(f.ctx, u, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	f.pass()
	f.pass()
	if objs := f.objects(); !slices.Equal(objs, []string{"web"}) {
		t.Errorf("after web's label was taken off, the objects are %v, want web alone", objs)
	}
	if o, _ := f.get("web"); o.Labels[v1alpha1.LabelNode] != "node-1" {
		t.Errorf("web's labels after two passes: %v", o.Labels)
	}
	f.markDeleted("web")
	f.pass()
	if sbs, _ := src.List(f.ctx); len(sbs) != 0 {
		t.Errorf("kubectl delete of web left its sandbox: %v", sbs)
	}
}

// TestAttack24bFinalizerConflict: kubectl delete of a made object, and the
// agent's drop of its finalizer meets a Conflict (someone wrote the object
// meanwhile): the sandbox is deleted once, the finalizer goes at the next
// pass, and nothing is made again or deleted besides.
func TestAttack24bFinalizerConflict(t *testing.T) {
	src := &managerSource{sbs: []api.Sandbox{{ID: "sb_bbbbbbbbbb", Template: "tiny", State: api.StateReady}}}
	f := newFleetFixture(t, src)
	f.ask("web", v1alpha1.SandboxSpec{Template: "tiny", NodeName: "node-1"})
	f.pass()
	f.markDeleted("web")
	conflicts := 1
	f.dyn.PrependReactor("update", "sandboxes", func(ac k8stesting.Action) (bool, runtime.Object, error) {
		if o, ok := ac.(k8stesting.UpdateAction); ok && conflicts > 0 && ac.GetSubresource() == "" {
			if m, err := meta.Accessor(o.GetObject()); err == nil && m.GetName() == "web" {
				conflicts--
				return true, nil, kerrors.NewConflict(v1alpha1.SandboxesResource.GroupResource(), "web", fmt.Errorf("the object has been modified"))
			}
		}
		return false, nil, nil
	})
	f.pass()
	f.pass()
	f.pass()
	sbs, _ := src.List(f.ctx)
	if len(sbs) != 1 || sbs[0].ID != "sb_bbbbbbbbbb" || len(src.asked()) != 1 {
		t.Errorf("after a kubectl delete whose finalizer drop met a conflict: sandboxes %v, creates %d", sbs, len(src.asked()))
	}
	if u, err := f.rc.Get(f.ctx, "web", metav1.GetOptions{}); err == nil && slices.Contains(u.GetFinalizers(), v1alpha1.Finalizer) {
		t.Errorf("web keeps the finalizer after three passes")
	}
}

// TestAttack24bWatchEndsAtOnce: an apiserver whose watches end at once
// (an aggressive proxy, a timeout of 0) is watched again with backoff,
// not in a hot loop of watches and mirror passes.
func TestAttack24bWatchEndsAtOnce(t *testing.T) {
	src := &managerSource{}
	f := newFleetFixture(t, src)
	var watches atomic.Int32
	f.dyn.PrependWatchReactor("sandboxes", func(k8stesting.Action) (bool, watch.Interface, error) {
		watches.Add(1)
		return true, watch.NewEmptyWatch(), nil
	})
	ctx, cancel := context.WithTimeout(f.ctx, 1600*time.Millisecond)
	defer cancel()
	asked := make(chan struct{}, 1)
	pokes := 0
	done := make(chan struct{})
	go func() { f.a.watchAsked(ctx, asked); close(done) }()
	for {
		select {
		case <-asked:
			pokes++
			continue
		case <-done:
		}
		break
	}
	if n := watches.Load(); n == 0 || n > 4 || pokes > 4 {
		t.Errorf("watches that end at once, over 1.6 s: %d watches, %d pokes of the mirror", n, pokes)
	}
}

// markDeleted plays kubectl delete of object name on an apiserver that
// keeps it while finalizers remain: its deletionTimestamp set, and extra
// finalizers (another controller's) in place of its own.
func (f *fleetFixture) markDeleted(name string, extra ...string) {
	f.t.Helper()
	u, err := f.rc.Get(f.ctx, name, metav1.GetOptions{})
	if err != nil {
		f.t.Fatal(err)
	}
	ts := metav1.NewTime(time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC))
	u.SetDeletionTimestamp(&ts)
	if len(extra) > 0 {
		u.SetFinalizers(extra)
	}
	if _, err := f.rc.Update(f.ctx, u, metav1.UpdateOptions{}); err != nil {
		f.t.Fatal(err)
	}
}
