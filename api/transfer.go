package api

import (
	"strings"
)

// Snapshots carried between sbxds through an OCI registry (issue 24's
// portable snapshots): POST /v1/snapshots/{name}/push and POST
// /v1/snapshots/pull.

// PushRequest is the body of POST /v1/snapshots/{name}/push.
type PushRequest struct {
	// Ref is where in a registry: a repository, with a tag or not
	// (127.0.0.1:5000/sbx/flaky:run-7). A registry on loopback or a private
	// address is spoken to in plain HTTP (go-containerregistry's rule),
	// others with TLS; with the credentials of the docker config of sbxd's
	// user.
	Ref string `json:"ref"`
}

// PushResult says where a snapshot went.
type PushResult struct {
	// Ref is the pushed artifact by digest (REPO@sha256:...): a pull of it
	// gets exactly this.
	Ref string `json:"ref"`
	// Files and Bytes are what the image holds.
	Files int   `json:"files"`
	Bytes int64 `json:"bytes"`
	// Memory says the artifact carries the memory too.
	Memory bool `json:"memory"`
}

// PullRequest is the body of POST /v1/snapshots/pull.
type PullRequest struct {
	// Ref is the artifact, by tag or digest.
	Ref string `json:"ref"`
	// Name is the name it is recorded under here; "" is the name it had.
	Name string `json:"name,omitempty"`
}

// PullResult is the snapshot a pull recorded.
type PullResult struct {
	Snapshot Snapshot `json:"snapshot"`
	// Ref is the artifact pulled, by digest.
	Ref string `json:"ref"`
	// PulledBytes came from the registry; the rest of the image's files
	// were on this node already.
	PulledBytes int64 `json:"pulledBytes"`
	// MemoryLeft says why the snapshot is recorded here without the
	// memory its artifact carries ("" when it carried none): it boots from
	// its disk.
	MemoryLeft string `json:"memoryLeft,omitempty"`
}

// maxRef bounds a registry reference.
const maxRef = 1024

func checkRef(ref string) error {
	switch {
	case ref == "":
		return Errorf(ErrInvalid, "ref: want a registry reference, like 127.0.0.1:5000/sbx/snaps:run-7")
	case len(ref) > maxRef:
		return Errorf(ErrInvalid, "ref: %d bytes, more than %d", len(ref), maxRef)
	case strings.ContainsAny(ref, " \t\r\n"):
		return Errorf(ErrInvalid, "ref: %q has blanks", ref)
	case strings.Contains(ref, "://"):
		return Errorf(ErrInvalid, "ref: %q: a registry reference has no scheme (127.0.0.1:5000/sbx/snaps:run-7)", ref)
	}
	return nil
}

// Validate checks the request's fields.
func (r *PushRequest) Validate() error { return checkRef(r.Ref) }

// Validate checks the request's fields.
func (r *PullRequest) Validate() error { return checkRef(r.Ref) }

// AdoptRequest is the body of POST /v1/sandboxes/adopt: a stopped
// sandbox that another node pushed (POST /v1/sandboxes/{id}/push), to be
// recorded here, stopped, under its id, name and meta, with its memory.
type AdoptRequest struct {
	// Ref is the pushed artifact, by digest (the push's answer).
	Ref string `json:"ref"`
	// ID, when set, is the sandbox the artifact must hold: a ref read
	// from where another could have written it (the fleet's object) may
	// name another sandbox's image, which is refused, nothing adopted.
	ID string `json:"id,omitempty"`
	// WithoutMemory takes the sandbox's disk alone when its memory does
	// not restore on this node (another runsc, CPU or cache line): it then
	// boots from its disk at its resume, saying why. Without it such an
	// adopt is a conflict.
	WithoutMemory bool `json:"withoutMemory,omitempty"`
}

// Validate checks the request's fields.
func (r *AdoptRequest) Validate() error { return checkRef(r.Ref) }

// MetaAdopted is the meta key of a sandbox adopted from another node: the
// artifact it came from, by digest. Set by sbxd; refused in a request.
const MetaAdopted = "sbx.adopted"

// MetaImageRef is the meta key of a stopped sandbox of a fleet's node
// whose hibernation image is in the fleet's registry (sbxd
// --fleet-registry): the artifact, by digest, that another node adopts
// to resume it when its own node is down. Set by sbxd; refused in a
// request.
const MetaImageRef = "sbx.image-ref"

// MetaImagePending says why a stopped sandbox's image is not in the
// fleet's registry yet (the registry down): sbxd keeps the image here and
// pushes it again. Set by sbxd; refused in a request.
const MetaImagePending = "sbx.image-pending"
