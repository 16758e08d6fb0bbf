package v1alpha1

import (
	"encoding/json"
	"fmt"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

// AnnotationDeletedWhileDown is on a SandboxNode: the Sandbox objects that
// were deleted while the node was down (kubectl delete, sbx rm), a JSON
// list of DeletedObject. Their node's agent, away, could not delete their
// sandboxes and drop its finalizer, so the controller dropped it, having
// noted them here first; the agent, back, deletes those sandboxes before
// it mirrors anything (else it would write their objects again), and takes
// them off the list.
const AnnotationDeletedWhileDown = "sbx.dev/deleted-while-down"

// MaxDeletedWhileDown bounds the list (an annotation holds 256 KiB at
// most): past it, objects being deleted stay Terminating until their node
// is back.
const MaxDeletedWhileDown = 2048

// DeletedObject is one Sandbox object deleted while its node was down:
// its name and uid, and the sbx id its status named. The agent deletes
// the sandbox only if the object was that sandbox's own (as a deleted
// object deletes only the sandbox it mirrors: a status id written by hand
// names another's).
type DeletedObject struct {
	Object string `json:"object"`
	UID    string `json:"uid"`
	ID     string `json:"id"`
}

// DeletedWhileDown is the list on SandboxNode u (none if it has no
// annotation, or one that is not such a list).
func DeletedWhileDown(u *unstructured.Unstructured) []DeletedObject {
	v := u.GetAnnotations()[AnnotationDeletedWhileDown]
	if v == "" {
		return nil
	}
	var l []DeletedObject
	if json.Unmarshal([]byte(v), &l) != nil {
		return nil
	}
	return l
}

// SetDeletedWhileDown sets the list on SandboxNode u (removing the
// annotation for an empty one).
func SetDeletedWhileDown(u *unstructured.Unstructured, l []DeletedObject) error {
	if len(l) > MaxDeletedWhileDown {
		return fmt.Errorf("sandboxnode %s: more than %d objects deleted while it was down", u.GetName(), MaxDeletedWhileDown)
	}
	ann := u.GetAnnotations()
	if len(l) == 0 {
		delete(ann, AnnotationDeletedWhileDown)
		u.SetAnnotations(ann)
		return nil
	}
	b, err := json.Marshal(l)
	if err != nil {
		return err
	}
	if ann == nil {
		ann = map[string]string{}
	}
	ann[AnnotationDeletedWhileDown] = string(b)
	u.SetAnnotations(ann)
	return nil
}
