package agent

import (
	"context"
	"log/slog"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	dynamicfake "k8s.io/client-go/dynamic/fake"

	"sbx.dev/sbx/api"
	"sbx.dev/sbx/internal/fleet/v1alpha1"
)

// TestMirrorTemplates: each template of a node has one object, named by
// its node and template, saying its sbx name, source, version and
// defaults; it is rewritten only when it changed (a rebuild: another
// version) and deleted when it went; the same name on two nodes is two
// objects, and another node's are left alone.
func TestMirrorTemplates(t *testing.T) {
	dyn := dynamicfake.NewSimpleDynamicClientWithCustomListKinds(runtime.NewScheme(), map[schema.GroupVersionResource]string{
		v1alpha1.SandboxTemplatesResource: "SandboxTemplateList",
	})
	ctx := context.Background()
	now := time.Date(2026, 12, 3, 10, 0, 0, 0, time.UTC)
	var ts1, ts2 []api.Template
	agent := func(node string, ts *[]api.Template) *Agent {
		return &Agent{cfg: Config{Node: node, Namespace: "sbx-system", Templates: func() ([]api.Template, error) { return *ts, nil }},
			dyn: dyn, log: slog.Default(), now: func() time.Time { return now }}
	}
	a1, a2 := agent("node-1", &ts1), agent("node-2", &ts2)
	rc := dyn.Resource(v1alpha1.SandboxTemplatesResource).Namespace("sbx-system")
	get := func(node, name string) *v1alpha1.SandboxTemplate {
		u, err := rc.Get(ctx, v1alpha1.TemplateObjectName(node, name), metav1.GetOptions{})
		if err != nil {
			return nil
		}
		var o v1alpha1.SandboxTemplate
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
	v1, v2 := "sha256:"+repeat("1"), "sha256:"+repeat("2")
	ts1 = []api.Template{{Name: "my_tpl", Version: v1, Size: 5 << 20, CreatedAt: now, Source: "docker.io/library/alpine:3",
		Defaults: api.TemplateDefaults{User: "1000", Env: []string{"LANG=C.UTF-8"}}}}
	ts2 = []api.Template{{Name: "my_tpl", Version: v2, Size: 6 << 20, CreatedAt: now, Source: "builtin"}}
	for _, a := range []*Agent{a1, a2} {
		if err := a.mirrorTemplates(ctx); err != nil {
			t.Fatal(err)
		}
	}
	o := get("node-1", "my_tpl")
	if o == nil || o.Name != "node-1.my-tpl" || o.Spec.Name != "my_tpl" || o.Spec.Source != "docker.io/library/alpine:3" || o.Spec.User != "1000" ||
		o.Spec.Env["LANG"] != "C.UTF-8" || o.Status.Version != v1 || o.Status.SizeBytes != 5<<20 || len(o.Status.Nodes) != 1 ||
		o.Status.Nodes[0] != "node-1" || o.Labels[v1alpha1.LabelNode] != "node-1" {
		t.Fatalf("node-1's template object: %+v", o)
	}
	if o := get("node-2", "my_tpl"); o == nil || o.Status.Version != v2 {
		t.Fatalf("node-2's template object: %+v", o)
	}
	dyn.ClearActions()
	if err := a1.mirrorTemplates(ctx); err != nil || writes() != 0 {
		t.Errorf("a pass with nothing changed wrote: %v", err)
	}
	// rebuilt: another version, one status write
	ts1[0].Version = v2
	if err := a1.mirrorTemplates(ctx); err != nil {
		t.Fatal(err)
	}
	if n := writes(); n != 1 || get("node-1", "my_tpl").Status.Version != v2 {
		t.Errorf("a rebuilt template: %d writes, version %s", n, get("node-1", "my_tpl").Status.Version)
	}
	// removed on node-1: its object goes, node-2's stays
	ts1 = nil
	if err := a1.mirrorTemplates(ctx); err != nil {
		t.Fatal(err)
	}
	if get("node-1", "my_tpl") != nil || get("node-2", "my_tpl") == nil {
		t.Errorf("after node-1's template went: node-1's %v, node-2's %v", get("node-1", "my_tpl"), get("node-2", "my_tpl"))
	}
}

func repeat(s string) string {
	out := ""
	for len(out) < 64 {
		out += s
	}
	return out
}
