package agent

import (
	"context"
	"errors"
	"fmt"
	"maps"

	apierrors "k8s.io/apimachinery/pkg/api/equality"
	kerrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"sbx.dev/sbx/api"
	"sbx.dev/sbx/internal/fleet/v1alpha1"
)

// SnapshotSource is a Source that also lists the node's snapshots (sbxd's
// manager is one): the agent then mirrors them as SandboxSnapshot objects.
type SnapshotSource interface {
	Snapshots(ctx context.Context) ([]api.Snapshot, error)
}

// mirrorSnapshots makes the node's SandboxSnapshot objects (those labelled
// with its name) what its snapshots are: one each, made, updated, and
// deleted once the snapshot is gone. The objects are a view: nothing is
// asked of the node through them.
func (a *Agent) mirrorSnapshots(ctx context.Context) error {
	src, ok := a.cfg.Source.(SnapshotSource)
	if !ok {
		return nil
	}
	sns, err := src.Snapshots(ctx)
	if err != nil {
		return fmt.Errorf("list snapshots: %w", err)
	}
	rc := a.dyn.Resource(v1alpha1.SandboxSnapshotsResource).Namespace(a.cfg.Namespace)
	list, err := rc.List(ctx, metav1.ListOptions{LabelSelector: v1alpha1.LabelNode + "=" + a.cfg.Node})
	if err != nil {
		return fmt.Errorf("list sandboxsnapshot objects: %w", err)
	}
	have := map[string]*unstructured.Unstructured{}
	for i := range list.Items {
		have[list.Items[i].GetName()] = &list.Items[i]
	}
	var errs []error
	for _, sn := range sns {
		o := snapshotObject(a.cfg.Node, a.cfg.Namespace, sn)
		old := have[o.Name]
		delete(have, o.Name)
		if err := a.putSnapshot(ctx, o, old); err != nil {
			errs = append(errs, err)
		}
	}
	for name, u := range have { // snapshots that are gone
		uid := u.GetUID()
		err := rc.Delete(ctx, name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &uid}})
		if err != nil && !kerrors.IsNotFound(err) {
			errs = append(errs, fmt.Errorf("delete sandboxsnapshot object %s: %w", name, err))
		}
	}
	return errors.Join(errs...)
}

// putSnapshot makes or updates the object o (old: as it is, nil if none).
func (a *Agent) putSnapshot(ctx context.Context, o *v1alpha1.SandboxSnapshot, old *unstructured.Unstructured) error {
	rc := a.dyn.Resource(v1alpha1.SandboxSnapshotsResource).Namespace(a.cfg.Namespace)
	want, err := v1alpha1.ToUnstructured(o)
	if err != nil {
		return err
	}
	if old == nil {
		if old, err = rc.Create(ctx, want, metav1.CreateOptions{}); kerrors.IsAlreadyExists(err) {
			// there, but not labelled this node's (kubectl label): taken back
			old, err = rc.Get(ctx, o.Name, metav1.GetOptions{})
		}
		if err != nil {
			return fmt.Errorf("create sandboxsnapshot object %s: %w", o.Name, err)
		}
	}
	if !apierrors.Semantic.DeepEqual(old.Object["spec"], want.Object["spec"]) || !maps.Equal(old.GetLabels(), want.GetLabels()) {
		old.Object["spec"] = want.Object["spec"]
		old.SetLabels(want.GetLabels())
		if old, err = rc.Update(ctx, old, metav1.UpdateOptions{}); err != nil {
			return fmt.Errorf("update sandboxsnapshot object %s: %w", o.Name, err)
		}
	}
	if !apierrors.Semantic.DeepEqual(old.Object["status"], want.Object["status"]) {
		old.Object["status"] = want.Object["status"]
		if _, err := rc.UpdateStatus(ctx, old, metav1.UpdateOptions{}); err != nil {
			return fmt.Errorf("update sandboxsnapshot object %s status: %w", o.Name, err)
		}
	}
	return nil
}

// snapshotObject is the SandboxSnapshot object of sn on node.
func snapshotObject(node, namespace string, sn api.Snapshot) *v1alpha1.SandboxSnapshot {
	created := metav1.NewTime(sn.CreatedAt)
	return &v1alpha1.SandboxSnapshot{
		TypeMeta: metav1.TypeMeta{APIVersion: v1alpha1.APIVersion, Kind: v1alpha1.KindSandboxSnapshot},
		ObjectMeta: metav1.ObjectMeta{Name: v1alpha1.SnapshotObjectName(node, sn.ID), Namespace: namespace,
			Labels: map[string]string{v1alpha1.LabelNode: node}},
		Spec: v1alpha1.SandboxSnapshotSpec{Name: sn.Name, Sandbox: sn.SandboxID, Memory: sn.Memory},
		Status: v1alpha1.SandboxSnapshotStatus{State: v1alpha1.SnapshotStateLocal, Node: node, Template: sn.Template,
			SizeBytes: sn.Size, Kept: sn.Kept, CreatedAt: &created},
	}
}
