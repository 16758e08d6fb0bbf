package agent

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"strings"

	apierrors "k8s.io/apimachinery/pkg/api/equality"
	kerrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"sbx.dev/sbx/api"
	"sbx.dev/sbx/internal/fleet/v1alpha1"
)

// mirrorTemplates makes the node's SandboxTemplate objects (those labelled
// with its name) what its templates are, as mirrorSnapshots does its
// snapshots: a view; nothing is asked of the node through them.
func (a *Agent) mirrorTemplates(ctx context.Context) error {
	ts, err := a.cfg.Templates()
	if err != nil {
		return fmt.Errorf("list templates: %w", err)
	}
	rc := a.dyn.Resource(v1alpha1.SandboxTemplatesResource).Namespace(a.cfg.Namespace)
	list, err := rc.List(ctx, metav1.ListOptions{LabelSelector: v1alpha1.LabelNode + "=" + a.cfg.Node})
	if err != nil {
		return fmt.Errorf("list sandboxtemplate objects: %w", err)
	}
	have := map[string]*unstructured.Unstructured{}
	for i := range list.Items {
		have[list.Items[i].GetName()] = &list.Items[i]
	}
	var errs []error
	for _, t := range ts {
		o := templateObject(a.cfg.Node, a.cfg.Namespace, t)
		old := have[o.Name]
		delete(have, o.Name)
		if err := a.putTemplate(ctx, o, old); err != nil {
			errs = append(errs, err)
		}
	}
	for name, u := range have { // templates that are gone
		uid := u.GetUID()
		err := rc.Delete(ctx, name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &uid}})
		if err != nil && !kerrors.IsNotFound(err) {
			errs = append(errs, fmt.Errorf("delete sandboxtemplate object %s: %w", name, err))
		}
	}
	return errors.Join(errs...)
}

// putTemplate makes or updates the object o (old: as it is, nil if none).
func (a *Agent) putTemplate(ctx context.Context, o *v1alpha1.SandboxTemplate, old *unstructured.Unstructured) error {
	rc := a.dyn.Resource(v1alpha1.SandboxTemplatesResource).Namespace(a.cfg.Namespace)
	want, err := v1alpha1.ToUnstructured(o)
	if err != nil {
		return err
	}
	if old == nil {
		if old, err = rc.Create(ctx, want, metav1.CreateOptions{}); kerrors.IsAlreadyExists(err) {
			old, err = rc.Get(ctx, o.Name, metav1.GetOptions{}) // relabelled by hand: taken back
		}
		if err != nil {
			return fmt.Errorf("create sandboxtemplate object %s: %w", o.Name, err)
		}
	}
	if !apierrors.Semantic.DeepEqual(old.Object["spec"], want.Object["spec"]) || !maps.Equal(old.GetLabels(), want.GetLabels()) {
		old.Object["spec"] = want.Object["spec"]
		old.SetLabels(want.GetLabels())
		if old, err = rc.Update(ctx, old, metav1.UpdateOptions{}); err != nil {
			return fmt.Errorf("update sandboxtemplate object %s: %w", o.Name, err)
		}
	}
	if !apierrors.Semantic.DeepEqual(old.Object["status"], want.Object["status"]) {
		old.Object["status"] = want.Object["status"]
		if _, err := rc.UpdateStatus(ctx, old, metav1.UpdateOptions{}); err != nil {
			return fmt.Errorf("update sandboxtemplate object %s status: %w", o.Name, err)
		}
	}
	return nil
}

// templateObject is the SandboxTemplate object of t on node.
func templateObject(node, namespace string, t api.Template) *v1alpha1.SandboxTemplate {
	var env map[string]string
	for _, kv := range t.Defaults.Env {
		k, v, _ := strings.Cut(kv, "=")
		if env == nil {
			env = map[string]string{}
		}
		env[k] = v
	}
	o := &v1alpha1.SandboxTemplate{
		TypeMeta: metav1.TypeMeta{APIVersion: v1alpha1.APIVersion, Kind: v1alpha1.KindSandboxTemplate},
		ObjectMeta: metav1.ObjectMeta{Name: v1alpha1.TemplateObjectName(node, t.Name), Namespace: namespace,
			Labels: map[string]string{v1alpha1.LabelNode: node}},
		Spec:   v1alpha1.SandboxTemplateSpec{Name: t.Name, Source: t.Source, User: t.Defaults.User, Env: env},
		Status: v1alpha1.SandboxTemplateStatus{Version: t.Version, SizeBytes: t.Size, Nodes: []string{node}},
	}
	if !t.CreatedAt.IsZero() {
		created := metav1.NewTime(t.CreatedAt)
		o.Status.CreatedAt = &created
	}
	return o
}
