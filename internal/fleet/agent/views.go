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
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"

	"sbx.dev/sbx/internal/fleet/v1alpha1"
)

// mirrorView makes the node's objects of resource res (those labelled
// with its name) what want says, one each by name: made, updated where
// they differ (spec and labels through the object, status through its
// subresource), and deleted once not wanted. The objects are a view (the
// node's snapshots, its templates): nothing is asked of the node through
// them. what names them in errors ("sandboxsnapshot").
func (a *Agent) mirrorView(ctx context.Context, res schema.GroupVersionResource, what string, want []any) error {
	rc := a.dyn.Resource(res).Namespace(a.cfg.Namespace)
	list, err := rc.List(ctx, metav1.ListOptions{LabelSelector: v1alpha1.LabelNode + "=" + a.cfg.Node})
	if err != nil {
		return fmt.Errorf("list %s objects: %w", what, err)
	}
	have := map[string]*unstructured.Unstructured{}
	for i := range list.Items {
		have[list.Items[i].GetName()] = &list.Items[i]
	}
	var errs []error
	for _, o := range want {
		w, err := v1alpha1.ToUnstructured(o)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		old := have[w.GetName()]
		delete(have, w.GetName())
		if err := a.putView(ctx, rc, what, w, old); err != nil {
			errs = append(errs, err)
		}
	}
	for name, u := range have { // gone from the node
		uid := u.GetUID()
		err := rc.Delete(ctx, name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &uid}})
		if err != nil && !kerrors.IsNotFound(err) {
			errs = append(errs, fmt.Errorf("delete %s object %s: %w", what, name, err))
		}
	}
	return errors.Join(errs...)
}

// putView makes or updates the object want (old: as it is, nil if none).
func (a *Agent) putView(ctx context.Context, rc dynamic.ResourceInterface, what string, want, old *unstructured.Unstructured) error {
	name := want.GetName()
	var err error
	if old == nil {
		if old, err = rc.Create(ctx, want, metav1.CreateOptions{}); kerrors.IsAlreadyExists(err) {
			// there, but not labelled this node's (kubectl label): taken back
			old, err = rc.Get(ctx, name, metav1.GetOptions{})
		}
		if err != nil {
			return fmt.Errorf("create %s object %s: %w", what, name, err)
		}
	}
	if !apierrors.Semantic.DeepEqual(old.Object["spec"], want.Object["spec"]) || !maps.Equal(old.GetLabels(), want.GetLabels()) {
		old.Object["spec"] = want.Object["spec"]
		old.SetLabels(want.GetLabels())
		if old, err = rc.Update(ctx, old, metav1.UpdateOptions{}); err != nil {
			return fmt.Errorf("update %s object %s: %w", what, name, err)
		}
	}
	if !apierrors.Semantic.DeepEqual(old.Object["status"], want.Object["status"]) {
		old.Object["status"] = want.Object["status"]
		if _, err := rc.UpdateStatus(ctx, old, metav1.UpdateOptions{}); err != nil {
			return fmt.Errorf("update %s object %s status: %w", what, name, err)
		}
	}
	return nil
}
