package agent

import (
	"context"
	"fmt"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"sbx.dev/sbx/internal/fleet/v1alpha1"
)

// nodeStatus is what the node publishes now; old is the status it
// replaces, whose condition times are kept while they hold.
func (a *Agent) nodeStatus(old []metav1.Condition) v1alpha1.SandboxNodeStatus {
	f := a.cfg.Facts
	var layers []string
	if a.cfg.Layers != nil {
		layers = a.cfg.Layers()
	}
	var agents []string
	if a.cfg.Agents != nil {
		agents = a.cfg.Agents()
	}
	return v1alpha1.SandboxNodeStatus{
		Layers: layers, Agents: agents,
		Address: f.Address, Version: f.Version, Capacity: f.capacity(),
		RunscSHA256: f.RunscSHA256, CPUFeatures: f.CPUFeatures, CacheLineBytes: f.CacheLineBytes,
		Sandboxes: int(a.sandboxes.Load()),
		Conditions: v1alpha1.SetCondition(old, metav1.Condition{
			Type: v1alpha1.ConditionReady, Status: metav1.ConditionTrue, Reason: v1alpha1.ReasonAgentPublishing,
			Message: "the node agent publishes; its Lease says whether it still does",
		}, a.now()),
	}
}

// publishNode creates the SandboxNode if it is missing and writes its
// status. The spec (a cordon) belongs to others and is left alone.
func (a *Agent) publishNode(ctx context.Context) error {
	nodes := a.dyn.Resource(v1alpha1.SandboxNodesResource)
	u, err := nodes.Get(ctx, a.cfg.Node, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		n := v1alpha1.SandboxNode{
			TypeMeta:   metav1.TypeMeta{APIVersion: v1alpha1.APIVersion, Kind: v1alpha1.KindSandboxNode},
			ObjectMeta: metav1.ObjectMeta{Name: a.cfg.Node},
		}
		if u, err = v1alpha1.ToUnstructured(&n); err != nil {
			return err
		}
		if u, err = nodes.Create(ctx, u, metav1.CreateOptions{}); err != nil {
			return fmt.Errorf("create sandboxnode %s: %w", a.cfg.Node, err)
		}
	} else if err != nil {
		return fmt.Errorf("get sandboxnode %s: %w", a.cfg.Node, err)
	}
	var cur v1alpha1.SandboxNode
	if err := v1alpha1.FromUnstructured(u, &cur); err != nil {
		return err
	}
	status := a.nodeStatus(cur.Status.Conditions)
	// the controller's, taken off by the mirror once dealt with
	status.DeletedWhileDown = cur.Status.DeletedWhileDown
	st, err := v1alpha1.ToUnstructured(&status)
	if err != nil {
		return err
	}
	u.Object["status"] = st.Object
	if _, err := nodes.UpdateStatus(ctx, u, metav1.UpdateOptions{}); err != nil {
		return fmt.Errorf("update sandboxnode %s status: %w", a.cfg.Node, err)
	}
	return nil
}
