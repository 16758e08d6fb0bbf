package placement

import (
	"context"
	"fmt"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/dynamic"

	"sbx.dev/sbx/api"
)

// Bind writes node into the spec.nodeName of u, the Sandbox as it was read,
// with an Update that carries the resourceVersion it was read at: the
// apiserver refuses it if anyone wrote the object since, so of two placers
// (or a controller and its restarted self) only one binds. It returns the
// object as written.
//
// A Sandbox bound already is api.ErrConflict, and nothing is written: a
// non-empty nodeName is never overwritten. One read without a
// resourceVersion is api.ErrInvalid (its Update would be unconditional).
// One changed since it was read is the apiserver's Conflict
// (apierrors.IsConflict): read it again, and bind it only if it is still
// unbound.
func Bind(ctx context.Context, res dynamic.ResourceInterface, u *unstructured.Unstructured, node string) (*unstructured.Unstructured, error) {
	name := u.GetName()
	if node == "" {
		return nil, api.Errorf(api.ErrInvalid, "bind sandbox %s: no node", name)
	}
	cur, _, err := unstructured.NestedString(u.Object, "spec", "nodeName")
	if err != nil {
		return nil, api.Errorf(api.ErrInvalid, "bind sandbox %s: spec.nodeName: %v", name, err)
	}
	if cur != "" {
		return nil, api.Errorf(api.ErrConflict, "bind sandbox %s to %s: it is bound to %s already", name, node, cur)
	}
	if u.GetResourceVersion() == "" {
		return nil, api.Errorf(api.ErrInvalid, "bind sandbox %s: read without a resourceVersion, its bind could overwrite another's", name)
	}
	obj := u.DeepCopy()
	if err := unstructured.SetNestedField(obj.Object, node, "spec", "nodeName"); err != nil {
		return nil, api.Errorf(api.ErrInvalid, "bind sandbox %s: %v", name, err)
	}
	out, err := res.Update(ctx, obj, metav1.UpdateOptions{})
	if err != nil {
		return nil, fmt.Errorf("bind sandbox %s to %s: %w", name, node, err)
	}
	return out, nil
}
