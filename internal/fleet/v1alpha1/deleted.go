package v1alpha1

// MaxDeletedWhileDown bounds SandboxNodeStatus.DeletedWhileDown: past it,
// objects being deleted stay Terminating until their node is back.
const MaxDeletedWhileDown = 2048

// DeletedObject is one Sandbox object deleted while its node was down
// (kubectl delete): its name and uid, and the sbx id its status named.
// Its node's agent, away, could not delete the sandbox and drop its
// finalizer, so the controller dropped it, having noted the object in the
// node's status first. The agent, back, deletes the sandbox before it
// mirrors anything (else it would write its object again), and only if the
// object was that sandbox's own, as a deleted object deletes only the
// sandbox it mirrors (a status id written by hand names another's).
type DeletedObject struct {
	Object string `json:"object"`
	UID    string `json:"uid"`
	ID     string `json:"id"`
}
