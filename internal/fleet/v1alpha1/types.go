// Package v1alpha1 holds the sbx.dev/v1alpha1 resources of an sbx fleet on
// Kubernetes: Sandbox, SandboxSnapshot, SandboxTemplate and SandboxNode
// (their CRDs are deploy/crds/). They travel as unstructured objects
// through client-go's dynamic client, so nothing here is generated.
package v1alpha1

import (
	"fmt"
	"strings"

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

	LabelNode      = "sbx.dev/node"       // on a Sandbox: the node that holds it
	LabelSandboxID = "sbx.dev/sandbox-id" // on a Sandbox: its sbx id, "_" as "-"

	// DefaultNamespace holds the Sandboxes and the nodes' Leases.
	DefaultNamespace = "sbx-system"

	OperatingModeRunning   = "Running"   // spec.operatingMode: live
	OperatingModeSuspended = "Suspended" // stopped, with its memory

	ConditionReady     = "Ready"     // Sandbox: takes execs; SandboxNode: its agent publishes
	ConditionSuspended = "Suspended" // Sandbox: stopped (hibernated)

	ReasonSandboxReady    = "SandboxReady"
	ReasonSandboxNotReady = "SandboxNotReady"
	ReasonSandboxStopped  = "SandboxStopped"
	ReasonSandboxRunning  = "SandboxNotSuspended"
	ReasonAgentPublishing = "NodeAgentPublishing"
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
}

// SandboxStatus is what the node agent saw.
type SandboxStatus struct {
	// ID is the sbx id (sb_...).
	ID string `json:"id,omitempty"`
	// State is sbx's: creating, ready, stopping, stopped, error, lost.
	State          string             `json:"state,omitempty"`
	Reason         string             `json:"reason,omitempty"`
	Node           string             `json:"node,omitempty"`
	CreatedAt      *metav1.Time       `json:"createdAt,omitempty"`
	MemoryRestored bool               `json:"memoryRestored,omitempty"`
	ResumeReason   string             `json:"resumeReason,omitempty"`
	Conditions     []metav1.Condition `json:"conditions,omitempty"`
}

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
	CacheLineBytes int                `json:"cacheLineBytes,omitempty"`
	Sandboxes      int                `json:"sandboxes"` // how many it holds
	Conditions     []metav1.Condition `json:"conditions,omitempty"`
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
