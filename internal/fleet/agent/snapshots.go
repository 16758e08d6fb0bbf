package agent

import (
	"context"
	"fmt"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

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
	want := make([]any, 0, len(sns))
	for _, sn := range sns {
		want = append(want, snapshotObject(a.cfg.Node, a.cfg.Namespace, sn))
	}
	return a.mirrorView(ctx, v1alpha1.SandboxSnapshotsResource, "sandboxsnapshot", want)
}

// snapshotObject is the SandboxSnapshot object of sn on node.
func snapshotObject(node, namespace string, sn api.Snapshot) *v1alpha1.SandboxSnapshot {
	created := metav1.NewTime(sn.CreatedAt)
	state := v1alpha1.SnapshotStateLocal
	if sn.Ref != "" {
		state = v1alpha1.SnapshotStatePushed
	}
	return &v1alpha1.SandboxSnapshot{
		TypeMeta: metav1.TypeMeta{APIVersion: v1alpha1.APIVersion, Kind: v1alpha1.KindSandboxSnapshot},
		ObjectMeta: metav1.ObjectMeta{Name: v1alpha1.SnapshotObjectName(node, sn.ID), Namespace: namespace,
			Labels: map[string]string{v1alpha1.LabelNode: node}},
		Spec: v1alpha1.SandboxSnapshotSpec{Name: sn.Name, Sandbox: sn.SandboxID, Memory: sn.Memory},
		Status: v1alpha1.SandboxSnapshotStatus{State: state, Reason: sn.RefPending, Image: sn.Ref, Node: node, Template: sn.Template,
			SizeBytes: sn.Size, Kept: sn.Kept, CreatedAt: &created},
	}
}
