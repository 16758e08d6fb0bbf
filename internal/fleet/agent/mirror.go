package agent

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"strconv"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/equality"
	kerrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/dynamic"

	"sbx.dev/sbx/api"
	"sbx.dev/sbx/internal/fleet/v1alpha1"
)

// mirror keeps one Sandbox object per sandbox of the node: at every change
// the source tells of, and every Resync in case a write was lost. It
// compares the whole list, so a change it missed, or one made by someone
// else to the objects, is put right at the next pass.
func (a *Agent) mirror(ctx context.Context) {
	fails := 0
	for {
		changed := a.cfg.Source.Changed() // before the List, or a change between is missed
		err := a.mirrorOnce(ctx)
		wait := a.cfg.Resync
		if err != nil && ctx.Err() == nil {
			fails++
			wait = backoff(fails, maxBackoff)
			a.log.Warn("fleet: mirror sandboxes failed; retrying", "err", err, "failures", fails, "retry_in", wait)
			changed = nil // the retry lists again anyway; changes do not hurry it
		} else if fails > 0 {
			a.log.Info("fleet: mirror sandboxes recovered", "after_failures", fails)
			fails = 0
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-changed:
			t.Stop()
		case <-t.C:
		}
	}
}

func (a *Agent) mirrorOnce(ctx context.Context) error {
	sbs, err := a.cfg.Source.List(ctx)
	if err != nil {
		return fmt.Errorf("list sandboxes: %w", err)
	}
	a.sandboxes.Store(int64(len(sbs)))
	rc := a.dyn.Resource(v1alpha1.SandboxesResource).Namespace(a.cfg.Namespace)
	list, err := rc.List(ctx, metav1.ListOptions{LabelSelector: v1alpha1.LabelNode + "=" + a.cfg.Node})
	if err != nil {
		return fmt.Errorf("list sandbox objects: %w", err)
	}
	have := map[string]*unstructured.Unstructured{}
	for i := range list.Items {
		have[list.Items[i].GetName()] = &list.Items[i]
	}
	var errs []error
	for _, sb := range sbs {
		name := v1alpha1.ObjectName(sb.ID)
		old := have[name]
		delete(have, name)
		if err := a.putSandbox(ctx, rc, sb, old); err != nil {
			errs = append(errs, err)
		}
	}
	for name, u := range have { // sandboxes that are gone
		uid := u.GetUID()
		err := rc.Delete(ctx, name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &uid}})
		if err != nil && !kerrors.IsNotFound(err) {
			errs = append(errs, fmt.Errorf("delete sandbox object %s: %w", name, err))
		}
	}
	return errors.Join(errs...)
}

// putSandbox makes the object of sb what it should be, writing only what
// differs: spec and labels through the object, status through its
// subresource (a create drops the status).
func (a *Agent) putSandbox(ctx context.Context, rc dynamic.ResourceInterface, sb api.Sandbox, old *unstructured.Unstructured) error {
	var prev []metav1.Condition
	if old != nil {
		var cur v1alpha1.Sandbox
		if err := v1alpha1.FromUnstructured(old, &cur); err == nil {
			prev = cur.Status.Conditions
		}
	}
	want, err := v1alpha1.ToUnstructured(sandboxObject(a.cfg.Node, a.cfg.Namespace, sb, prev, a.now()))
	if err != nil {
		return err
	}
	name := want.GetName()
	if old == nil {
		if old, err = rc.Create(ctx, want, metav1.CreateOptions{}); err != nil {
			return fmt.Errorf("create sandbox object %s: %w", name, err)
		}
	}
	if !apierrors.Semantic.DeepEqual(old.Object["spec"], want.Object["spec"]) || !maps.Equal(old.GetLabels(), want.GetLabels()) {
		old.Object["spec"] = want.Object["spec"]
		old.SetLabels(want.GetLabels())
		if old, err = rc.Update(ctx, old, metav1.UpdateOptions{}); err != nil {
			return fmt.Errorf("update sandbox object %s: %w", name, err)
		}
	}
	if !apierrors.Semantic.DeepEqual(old.Object["status"], want.Object["status"]) {
		old.Object["status"] = want.Object["status"]
		if _, err = rc.UpdateStatus(ctx, old, metav1.UpdateOptions{}); err != nil {
			return fmt.Errorf("update sandbox object %s status: %w", name, err)
		}
	}
	return nil
}

// sandboxObject is the Sandbox object of sb on node; prev are the
// conditions it had, whose transition times are kept while they hold.
func sandboxObject(node, namespace string, sb api.Sandbox, prev []metav1.Condition, now time.Time) *v1alpha1.Sandbox {
	mode := v1alpha1.OperatingModeRunning
	if sb.State == api.StateStopped || sb.State == api.StateStopping {
		mode = v1alpha1.OperatingModeSuspended
	}
	var cpus string
	if sb.CPUs > 0 {
		cpus = strconv.FormatFloat(sb.CPUs, 'f', -1, 64)
	}
	created := metav1.NewTime(sb.CreatedAt.Truncate(time.Second))
	ready := metav1.Condition{Type: v1alpha1.ConditionReady, Status: metav1.ConditionFalse, Reason: v1alpha1.ReasonSandboxNotReady, Message: "sandbox is " + string(sb.State)}
	if sb.State == api.StateReady {
		ready.Status, ready.Reason = metav1.ConditionTrue, v1alpha1.ReasonSandboxReady
	}
	if sb.Reason != "" {
		ready.Message += ": " + sb.Reason
	}
	susp := metav1.Condition{Type: v1alpha1.ConditionSuspended, Status: metav1.ConditionFalse, Reason: v1alpha1.ReasonSandboxRunning}
	if sb.State == api.StateStopped {
		susp.Status, susp.Reason, susp.Message = metav1.ConditionTrue, v1alpha1.ReasonSandboxStopped, "stopped with its memory; sbx resume "+sb.ID
	}
	conds := setCondition(setCondition(prev, ready, now), susp, now)
	return &v1alpha1.Sandbox{
		TypeMeta: metav1.TypeMeta{APIVersion: v1alpha1.APIVersion, Kind: v1alpha1.KindSandbox},
		ObjectMeta: metav1.ObjectMeta{
			Name: v1alpha1.ObjectName(sb.ID), Namespace: namespace,
			Labels: map[string]string{v1alpha1.LabelNode: node, v1alpha1.LabelSandboxID: v1alpha1.ObjectName(sb.ID)},
		},
		Spec: v1alpha1.SandboxSpec{
			Name: sb.Name, Template: sb.Template, TemplateVersion: sb.TemplateVersion, NodeName: node,
			OperatingMode: mode, TTL: sb.TTL, Persistent: sb.Persistent, CPUs: cpus, MemoryBytes: sb.Memory,
			DiskBytes: sb.DiskLimit, Network: sb.Network, Parent: sb.Parent, From: sb.From, Meta: sb.Meta,
		},
		Status: v1alpha1.SandboxStatus{
			ID: sb.ID, State: string(sb.State), Reason: sb.Reason, Node: node, CreatedAt: &created,
			MemoryRestored: sb.MemoryRestored, ResumeReason: sb.ResumeReason, Conditions: conds,
		},
	}
}
