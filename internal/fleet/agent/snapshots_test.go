package agent

import (
	"context"
	"log/slog"
	"sync"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	dynamicfake "k8s.io/client-go/dynamic/fake"

	"sbx.dev/sbx/api"
	"sbx.dev/sbx/internal/fleet/v1alpha1"
)

// fakeSnapshots is a fakeSource that lists snapshots too.
type fakeSnapshots struct {
	fakeSource
	smu sync.Mutex
	sns []api.Snapshot
}

func (s *fakeSnapshots) Snapshots(context.Context) ([]api.Snapshot, error) {
	s.smu.Lock()
	defer s.smu.Unlock()
	return append([]api.Snapshot(nil), s.sns...), nil
}

// TestMirrorSnapshots: each snapshot of the node has one object, named by
// its node and image, saying its sbx name; rewritten only when it changed
// (kept), deleted when it went; two nodes' snapshots of one name are two
// objects, and another node's are left alone.
func TestMirrorSnapshots(t *testing.T) {
	dyn := dynamicfake.NewSimpleDynamicClientWithCustomListKinds(runtime.NewScheme(), map[schema.GroupVersionResource]string{
		v1alpha1.SandboxSnapshotsResource: "SandboxSnapshotList",
	})
	ctx := context.Background()
	now := time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)
	src1, src2 := &fakeSnapshots{}, &fakeSnapshots{}
	a1 := &Agent{cfg: Config{Node: "node-1", Namespace: "sbx-system", Source: src1}, dyn: dyn, log: slog.Default(), now: func() time.Time { return now }}
	a2 := &Agent{cfg: Config{Node: "node-2", Namespace: "sbx-system", Source: src2}, dyn: dyn, log: slog.Default(), now: func() time.Time { return now }}
	rc := dyn.Resource(v1alpha1.SandboxSnapshotsResource).Namespace("sbx-system")
	get := func(node, id string) *v1alpha1.SandboxSnapshot {
		u, err := rc.Get(ctx, v1alpha1.SnapshotObjectName(node, id), metav1.GetOptions{})
		if err != nil {
			return nil
		}
		var o v1alpha1.SandboxSnapshot
		if err := v1alpha1.FromUnstructured(u, &o); err != nil {
			t.Fatal(err)
		}
		return &o
	}
	writes := func() (n int) {
		for _, ac := range dyn.Actions() {
			switch ac.GetVerb() {
			case "create", "update", "delete":
				n++
			}
		}
		dyn.ClearActions()
		return n
	}

	before := api.Snapshot{Name: "before", ID: "im_aaaaaaaaaa", SandboxID: "sb_aaaaaaaaaa", Template: "tiny", Memory: true, CreatedAt: now, Size: 1 << 20}
	src1.sns = []api.Snapshot{before}
	src2.sns = []api.Snapshot{{Name: "before", ID: "im_bbbbbbbbbb", Template: "tiny", CreatedAt: now, Size: 2}}
	for _, a := range []*Agent{a1, a2} {
		if err := a.mirrorSnapshots(ctx); err != nil {
			t.Fatal(err)
		}
	}
	o := get("node-1", before.ID)
	if o == nil || o.Spec.Name != "before" || !o.Spec.Memory || o.Spec.Sandbox != before.SandboxID || o.Status.Node != "node-1" ||
		o.Status.SizeBytes != 1<<20 || o.Status.State != v1alpha1.SnapshotStateLocal || o.Labels[v1alpha1.LabelNode] != "node-1" {
		t.Fatalf("node-1's snapshot object: %+v", o)
	}
	if o := get("node-2", "im_bbbbbbbbbb"); o == nil || o.Spec.Name != "before" || o.Status.Node != "node-2" {
		t.Fatalf("node-2's snapshot of the same name: %+v", o)
	}
	writes()
	if err := a1.mirrorSnapshots(ctx); err != nil {
		t.Fatal(err)
	}
	if n := writes(); n != 0 {
		t.Errorf("an unchanged snapshot was written %d times", n)
	}
	kept := before
	kept.Kept = true
	src1.sns = []api.Snapshot{kept}
	if err := a1.mirrorSnapshots(ctx); err != nil {
		t.Fatal(err)
	}
	if o := get("node-1", before.ID); o == nil || !o.Status.Kept {
		t.Errorf("a kept snapshot's object: %+v, want kept", o)
	}
	src1.sns = nil
	if err := a1.mirrorSnapshots(ctx); err != nil {
		t.Fatal(err)
	}
	if o := get("node-1", before.ID); o != nil {
		t.Errorf("a removed snapshot's object is left: %+v", o)
	}
	if o := get("node-2", "im_bbbbbbbbbb"); o == nil {
		t.Error("node-1's pass deleted node-2's snapshot object")
	}
	// a Source that lists no snapshots mirrors none, and fails nothing
	a3 := &Agent{cfg: Config{Node: "node-3", Namespace: "sbx-system", Source: &fakeSource{}}, dyn: dyn, log: slog.Default(), now: func() time.Time { return now }}
	if err := a3.mirrorSnapshots(ctx); err != nil {
		t.Error(err)
	}
}
