package agent

import (
	"context"
	"fmt"
	"strings"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

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
	want := make([]any, 0, len(ts))
	for _, t := range ts {
		want = append(want, templateObject(a.cfg.Node, a.cfg.Namespace, t))
	}
	return a.mirrorView(ctx, v1alpha1.SandboxTemplatesResource, "sandboxtemplate", want)
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
