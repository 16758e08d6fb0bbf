// Package v1alpha1 holds the sbx.dev/v1alpha1 resources of an sbx fleet on
// Kubernetes: Sandbox, SandboxSnapshot, SandboxTemplate and SandboxNode
// (their CRDs are deploy/crds/). They travel as unstructured objects
// through client-go's dynamic client, so nothing here is generated.
package v1alpha1

import (
	"fmt"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// Group and Version name the API.
const (
	Group   = "sbx.dev"
	Version = "v1alpha1"
)

// GroupVersion is sbx.dev/v1alpha1.
var GroupVersion = schema.GroupVersion{Group: Group, Version: Version}

// The resources, as the dynamic client names them.
var (
	SandboxesResource        = GroupVersion.WithResource("sandboxes")
	SandboxSnapshotsResource = GroupVersion.WithResource("sandboxsnapshots")
	SandboxTemplatesResource = GroupVersion.WithResource("sandboxtemplates")
	SandboxNodesResource     = GroupVersion.WithResource("sandboxnodes")
)

// Kinds, labels, and the words of spec and conditions.
const (
	APIVersion          = Group + "/" + Version
	KindSandbox         = "Sandbox"
	KindSandboxSnapshot = "SandboxSnapshot"
	KindSandboxTemplate = "SandboxTemplate"
	KindSandboxNode     = "SandboxNode"

	LabelNode = "sbx.dev/node" // on a Sandbox: the node that holds it
	// MetaObject is the sbx meta key that names the Sandbox object a
	// sandbox was made for: one asked for through the apiserver, placed,
	// and made by its node's agent (the mirror keeps that object, not one
	// named after the id). The API refuses it in a user's request.
	MetaObject    = "sbx.object"     // api.MetaObject
	MetaObjectUID = "sbx.object-uid" // api.MetaObjectUID: the object's uid
	// MetaObjectNamespace is api.MetaObjectNamespace: the object's namespace
	MetaObjectNamespace = "sbx.object-namespace"
	LabelSandboxID      = "sbx.dev/sandbox-id" // on a Sandbox: its sbx id, "_" as "-"
	// Finalizer is on every Sandbox object a node agent mirrors: deleting
	// the object (kubectl delete sandbox) deletes its sandbox on the node
	// first, and the object goes once that is done.
	Finalizer = "sbx.dev/sandbox"
	// AnnotationMovingTo is on a Sandbox while the controller moves it
	// (a stopped sandbox, pushed by its node and adopted by another):
	// the node it goes to, whose copy is the sandbox's once the object is
	// bound there, and which keeps that copy until then.
	AnnotationMovingTo = "sbx.dev/moving-to"

	// DefaultNamespace holds the Sandboxes and the nodes' Leases.
	DefaultNamespace = "sbx-system"

	OperatingModeRunning   = "Running"   // spec.operatingMode: live
	OperatingModeSuspended = "Suspended" // stopped, with its memory

	ConditionReady     = "Ready"     // Sandbox: takes execs; SandboxNode: its agent publishes
	ConditionSuspended = "Suspended" // Sandbox: stopped (hibernated)
	// ConditionPlaced is a Sandbox asked for through the apiserver: False
	// while no node can take it (the message says why, node by node),
	// True once a node made it.
	ConditionPlaced = "Placed"

	ReasonSandboxReady    = "SandboxReady"
	ReasonSandboxNotReady = "SandboxNotReady"
	ReasonSandboxStopped  = "SandboxStopped"
	ReasonSandboxRunning  = "SandboxNotSuspended"
	ReasonAgentPublishing = "NodeAgentPublishing"
	ReasonUnschedulable   = "Unschedulable" // Placed=False: no node fits
	ReasonMadeOnNode      = "MadeOnNode"    // Placed=True
	// ReasonNodeCannotYet is a bound Sandbox's Ready=False while its
	// node's sbxd cannot make it for now (ErrUnavailable: its data dir
	// full, shutting down); the node tries again at each pass.
	ReasonNodeCannotYet = "NodeCannotMakeItYet"
)

// ObjectName is the Kubernetes name of the Sandbox object of sbx sandbox
// id: an sbx id (sb_ + base32) is no DNS label, its "_" becomes "-".
func ObjectName(id string) string { return strings.ReplaceAll(id, "_", "-") }

// Sandbox is one sbx sandbox, on the node that holds it. In this slice
// the node agent writes both spec and status, mirroring its sandboxes;
// the controller of a later slice writes spec and binds spec.nodeName.
type Sandbox struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`
	Spec              SandboxSpec   `json:"spec"`
	Status            SandboxStatus `json:"status,omitempty"`
}

// SandboxSpec is what a sandbox is asked to be.
type SandboxSpec struct {
	// Name is the sandbox's sbx name (sbx new --name), if any.
	Name     string `json:"name,omitempty"`
	Template string `json:"template"`
	// TemplateVersion is the content digest of Template it was made on.
	TemplateVersion string `json:"templateVersion,omitempty"`
	// NodeName is the SandboxNode it is bound to.
	NodeName string `json:"nodeName,omitempty"`
	// OperatingMode is Running (ready) or Suspended (stopped with memory).
	OperatingMode string            `json:"operatingMode,omitempty"`
	TTL           string            `json:"ttl,omitempty"`
	Persistent    bool              `json:"persistent,omitempty"`
	CPUs          string            `json:"cpus,omitempty"` // a decimal: 0.5
	MemoryBytes   int64             `json:"memoryBytes,omitempty"`
	DiskBytes     int64             `json:"diskLimitBytes,omitempty"`
	Network       string            `json:"network,omitempty"`
	Parent        string            `json:"parent,omitempty"` // the sbx id forked from
	From          string            `json:"from,omitempty"`   // the snapshot made from
	Meta          map[string]string `json:"meta,omitempty"`
	// Image is the pushed image a sandbox is restored from (a stop image,
	// a named snapshot, a freeze); nil for a fresh create. Placement reads
	// it: its layers, and what its memory needs of a node.
	Image *SandboxImage `json:"image,omitempty"`
}

// SandboxImage is what placement needs to know of the image a sandbox is
// restored from, as its manifest recorded it.
type SandboxImage struct {
	// Ref is the image in the registry, by digest.
	Ref string `json:"ref,omitempty"`
	// Layers are the digests (sha256:...) of its layers: a node that holds
	// them need not pull them.
	Layers []string `json:"layers,omitempty"`
	// Memory says the image holds the sandbox's memory, recorded on a node
	// with this runsc, these CPU features and this cache line: it restores
	// only on a node with the same runsc sha256, a superset of the
	// features and the same cache line.
	Memory         bool     `json:"memory,omitempty"`
	RunscSHA256    string   `json:"runscSHA256,omitempty"`
	CPUFeatures    []string `json:"cpuFeatures,omitempty"`
	CacheLineBytes int      `json:"cacheLineBytes,omitempty"`
	// Agent is the build of the in-sandbox agent the memory's processes
	// run on: it restores only on a node that holds it ("": not known,
	// an image from before images named theirs).
	Agent string `json:"agent,omitempty"`
	// RequireMemory places the sandbox only where its memory restores
	// (sbx resume --require-memory); without it a node where the memory
	// cannot restore is taken when no other can, and boots from the disk.
	RequireMemory bool `json:"requireMemory,omitempty"`
}

// SandboxStatus is what the node agent saw.
type SandboxStatus struct {
	// ID is the sbx id (sb_...).
	ID string `json:"id,omitempty"`
	// State is sbx's: creating, ready, stopping, stopped, error, lost.
	State          string       `json:"state,omitempty"`
	Reason         string       `json:"reason,omitempty"`
	Node           string       `json:"node,omitempty"`
	CreatedAt      *metav1.Time `json:"createdAt,omitempty"`
	MemoryRestored bool         `json:"memoryRestored,omitempty"`
	ResumeReason   string       `json:"resumeReason,omitempty"`
	// Agent is the in-sandbox agent's build its processes run on: a
	// move or a memory fork goes only to a node that holds it.
	Agent      string             `json:"agent,omitempty"`
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// SandboxSnapshot is one named snapshot of a node, mirrored by the node's
// agent: kubectl get sandboxsnapshots shows what sbx snapshot ls shows.
// Snapshot names are a node's own (two nodes may each hold one "before"),
// so the object's name is its node's and its image's
// (SnapshotObjectName); spec.name is the sbx name.
type SandboxSnapshot struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`
	Spec              SandboxSnapshotSpec   `json:"spec"`
	Status            SandboxSnapshotStatus `json:"status,omitempty"`
}

// SandboxSnapshotSpec is what the snapshot is of.
type SandboxSnapshotSpec struct {
	Name    string `json:"name"`              // its sbx name, on its node
	Sandbox string `json:"sandbox,omitempty"` // the sbx id captured ("" for one pulled of a sandbox elsewhere)
	Memory  bool   `json:"memory,omitempty"`  // with the sandbox's processes and memory
}

// SandboxSnapshotStatus is what its node holds.
type SandboxSnapshotStatus struct {
	// State is "local": on its node, in no registry the fleet knows of
	// (Reason says why not, for a freeze its node pushes); or "pushed":
	// in the fleet's registry too, as Image.
	State     string       `json:"state,omitempty"`
	Reason    string       `json:"reason,omitempty"`
	Image     string       `json:"image,omitempty"`
	Node      string       `json:"node,omitempty"`
	Template  string       `json:"template,omitempty"`
	SizeBytes int64        `json:"sizeBytes,omitempty"`
	Kept      bool         `json:"kept,omitempty"`
	CreatedAt *metav1.Time `json:"createdAt,omitempty"`
}

// SandboxTemplate is one template of a node: a name that points at one
// version, a content digest. Template names are each node's own (a fleet
// whose nodes share a template cache has the same on each), so the
// object is named by its node and template (TemplateObjectName); a view
// its node's agent writes, of what `sbx template ls` shows there.
type SandboxTemplate struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`
	Spec              SandboxTemplateSpec   `json:"spec"`
	Status            SandboxTemplateStatus `json:"status,omitempty"`
}

// SandboxTemplateSpec is what the template is.
type SandboxTemplateSpec struct {
	Name   string            `json:"name"`             // its sbx name
	Source string            `json:"source,omitempty"` // builtin (base, tiny) or an OCI image reference
	User   string            `json:"user,omitempty"`   // the default user of what runs in it
	Env    map[string]string `json:"env,omitempty"`    // its default environment
}

// SandboxTemplateStatus is what its node holds.
type SandboxTemplateStatus struct {
	Version   string       `json:"version,omitempty"` // the content digest the name points at
	SizeBytes int64        `json:"sizeBytes,omitempty"`
	Nodes     []string     `json:"nodes,omitempty"` // the node that holds this version
	CreatedAt *metav1.Time `json:"createdAt,omitempty"`
}

// TemplateObjectName is the name of the SandboxTemplate object of template
// name on node: "node-1.tiny" (a template's "_" becomes "-").
func TemplateObjectName(node, name string) string { return node + "." + ObjectName(name) }

// SnapshotStateLocal: a snapshot on its node.
const SnapshotStateLocal = "local"

// SnapshotStatePushed: a snapshot on its node, and in the fleet's registry.
const SnapshotStatePushed = "pushed"

// SnapshotObjectName is the name of the SandboxSnapshot object of image
// id on node: "node-1.im-abc" (an sbx image id, im_ + base32, is no DNS
// label; its "_" becomes "-").
func SnapshotObjectName(node, id string) string { return node + "." + ObjectName(id) }

// SandboxNode is one sbxd node agent: what it offers and what it runs.
// Cluster-scoped; its liveness is the Lease of the same name in
// DefaultNamespace.
type SandboxNode struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`
	Spec              SandboxNodeSpec   `json:"spec"`
	Status            SandboxNodeStatus `json:"status,omitempty"`
}

// SandboxNodeSpec is what the fleet asks of a node.
type SandboxNodeSpec struct {
	// Unschedulable: cordoned, no new sandboxes (sbx node cordon, later).
	Unschedulable bool `json:"unschedulable,omitempty"`
}

// SandboxNodeStatus is what a node agent publishes about itself: enough to
// tell whether a memory image made elsewhere restores here.
type SandboxNodeStatus struct {
	// Address is the node's sbx API, as sbx --host takes it (tcp://host:port, unix:///path).
	Address  string   `json:"address,omitempty"`
	Version  string   `json:"version,omitempty"` // sbxd's
	Capacity Capacity `json:"capacity,omitempty"`
	// RunscSHA256 is the runsc binary's digest: gVisor's own version check
	// accepts any sbx build (VERSION_MISSING), so sbx checks this.
	RunscSHA256 string `json:"runscSHA256,omitempty"`
	// CPUFeatures are /proc/cpuinfo's flags, sorted: a memory image
	// restores only where its feature set is a subset of these.
	CPUFeatures []string `json:"cpuFeatures,omitempty"`
	// CacheLineBytes must match for a memory image to restore.
	CacheLineBytes int `json:"cacheLineBytes,omitempty"`
	// Agents are the builds of the in-sandbox agent the node holds (the
	// one it boots new sandboxes on first): a memory image restores only
	// where the build its processes run on is. sbxd keeps every build
	// it has run, so a node upgraded in place still restores the old.
	Agents []string `json:"agents,omitempty"`
	// Layers are the digests (sha256:...) of the image layers the node
	// holds in its store: placement prefers a node that holds an image's
	// layers, which are then not pulled again.
	Layers     []string           `json:"layers,omitempty"`
	Sandboxes  int                `json:"sandboxes"` // how many it holds
	Conditions []metav1.Condition `json:"conditions,omitempty"`
	// DeletedWhileDown are the Sandbox objects deleted while the node was
	// down, which the controller let go of (see DeletedObject), and those
	// of a down node deleted while a move to this node was under way
	// (this node's adopted copy goes with them). Written
	// by the controller; the node's agent carries them in what it
	// publishes, and takes off those it has dealt with.
	DeletedWhileDown []DeletedObject `json:"deletedWhileDown,omitempty"`
}

// Capacity is what a node has for sandboxes.
type Capacity struct {
	CPUs          int   `json:"cpus,omitempty"`
	MemoryBytes   int64 `json:"memoryBytes,omitempty"`
	DiskFreeBytes int64 `json:"diskFreeBytes,omitempty"` // in its data dir
}

// ToUnstructured turns a typed object into what the dynamic client sends.
func ToUnstructured(obj any) (*unstructured.Unstructured, error) {
	m, err := runtime.DefaultUnstructuredConverter.ToUnstructured(obj)
	if err != nil {
		return nil, fmt.Errorf("to unstructured: %w", err)
	}
	return &unstructured.Unstructured{Object: m}, nil
}

// FromUnstructured fills a typed object from what the dynamic client got.
func FromUnstructured(u *unstructured.Unstructured, obj any) error {
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, obj); err != nil {
		return fmt.Errorf("from unstructured %s %s: %w", u.GetKind(), u.GetName(), err)
	}
	return nil
}

// SetCondition returns conds with c in place of its type's condition; the
// transition time is kept when the status did not change.
func SetCondition(conds []metav1.Condition, c metav1.Condition, now time.Time) []metav1.Condition {
	out := make([]metav1.Condition, 0, len(conds)+1)
	c.LastTransitionTime = metav1.NewTime(now.Truncate(time.Second))
	for _, o := range conds {
		if o.Type != c.Type {
			out = append(out, o)
			continue
		}
		if o.Status == c.Status {
			c.LastTransitionTime = o.LastTransitionTime
		}
	}
	return append(out, c)
}

// ReasonRefused begins the Ready condition's reason of a Sandbox its node
// would not make; sbx's error code follows, in CamelCase: a refused
// template is RefusedNotFound, a taken name RefusedConflict.
const ReasonRefused = "Refused"

// RefusedReason is the condition reason of a refusal of sbx error code
// code ("not_found": "RefusedNotFound").
func RefusedReason(code string) string {
	var b strings.Builder
	b.WriteString(ReasonRefused)
	for _, w := range strings.Split(code, "_") {
		if w != "" {
			b.WriteString(strings.ToUpper(w[:1]) + w[1:])
		}
	}
	return b.String()
}

// RefusedCode is the sbx error code of a refusal's condition reason, if it
// is one.
func RefusedCode(reason string) (string, bool) {
	rest, ok := strings.CutPrefix(reason, ReasonRefused)
	if !ok || rest == "" {
		return "", false
	}
	var b strings.Builder
	for i, r := range rest {
		if r >= 'A' && r <= 'Z' {
			if i > 0 {
				b.WriteByte('_')
			}
			r += 'a' - 'A'
		}
		b.WriteRune(r)
	}
	return b.String(), true
}
