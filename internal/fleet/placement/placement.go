// Package placement chooses a node for each Sandbox that has none, and binds
// it there. It is sbx's own filter and score (kube-scheduler places only
// Pods): a node is a candidate if it is ready, not cordoned, can restore
// what the sandbox is made from, and has room left after what is bound to
// it; the candidates are ranked by whether the memory restores there, by
// how few forks of the same parent they hold, by how many of the image's
// layers they hold, and by free memory. The bind writes spec.nodeName
// under the resourceVersion the Sandbox was read at, so two placers never
// place one sandbox twice.
package placement

import (
	"cmp"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"sbx.dev/sbx/api"
	"sbx.dev/sbx/internal/fleet/v1alpha1"
)

// The defaults of a Sandbox that asks for no memory or disk: sbxd's own
// (--default-memory, --default-disk), which is what a node will give it.
const (
	DefaultMemoryBytes = 2 << 30
	DefaultDiskBytes   = 10 << 30
)

// Defaults are what a sandbox that asks for no memory or disk is counted
// as asking; zero fields are the package's defaults.
type Defaults struct {
	MemoryBytes, DiskBytes int64
}

// Request is what a sandbox asks of its node.
type Request struct {
	MemoryBytes int64
	// MilliCPUs is its CPU quota in thousandths; 0 asks none: sbxd sets no
	// quota then, the sandbox shares the node's CPUs and reserves none.
	MilliCPUs int64
	DiskBytes int64
	// Parent is the sbx id it was forked from: forks of one parent spread.
	Parent string
	// Image is what it is restored from; nil for a fresh create.
	Image *v1alpha1.SandboxImage
}

// RequestOf is what sb asks, its unset sizes counted as def's. A CPU count
// that is no number is api.ErrInvalid; the request is then returned
// without CPUs.
func RequestOf(sb *v1alpha1.Sandbox, def Defaults) (Request, error) {
	r := Request{MemoryBytes: sb.Spec.MemoryBytes, DiskBytes: sb.Spec.DiskBytes, Parent: sb.Spec.Parent, Image: sb.Spec.Image}
	if r.MemoryBytes <= 0 {
		r.MemoryBytes = cmp.Or(def.MemoryBytes, DefaultMemoryBytes)
	}
	if r.DiskBytes <= 0 {
		r.DiskBytes = cmp.Or(def.DiskBytes, DefaultDiskBytes)
	}
	if sb.Spec.CPUs == "" {
		return r, nil
	}
	cpus, err := strconv.ParseFloat(sb.Spec.CPUs, 64)
	if err != nil || cpus < 0 || math.IsInf(cpus, 0) || math.IsNaN(cpus) || cpus > 1e6 {
		return r, api.Errorf(api.ErrInvalid, "sandbox %s: cpus %q is not a number of CPUs", sb.Name, sb.Spec.CPUs)
	}
	r.MilliCPUs = int64(math.Ceil(cpus * 1000))
	return r, nil
}

// memoryWanted says whether r's memory restores only on a compatible node.
func (r Request) memoryWanted() bool { return r.Image != nil && r.Image.Memory }

// Node is a SandboxNode as one round of placement sees it: what it offers,
// and what is bound to it so far (the apiserver's bindings and the round's
// own). It is not safe for concurrent use.
type Node struct {
	Name string
	// Ready is its Ready condition; NotReady says why not.
	Ready    bool
	NotReady string
	Cordoned bool
	Status   v1alpha1.SandboxNodeStatus

	features map[string]bool
	layers   map[string]bool
	used     Used
	forks    map[string]int // bound sandboxes by parent
}

// Used is what the sandboxes bound to a node take of it.
type Used struct {
	// Sandboxes bound to it, lost ones not counted.
	Sandboxes int
	// MemoryBytes and MilliCPUs of those not stopped (a stopped sandbox
	// holds neither).
	MemoryBytes int64
	MilliCPUs   int64
	// PendingDiskBytes are the disk limits of those bound and not yet made
	// there: the node's DiskFreeBytes is measured, and already holds the
	// disks of the rest.
	PendingDiskBytes int64
}

// NewNode is the view of n with nothing bound to it yet.
func NewNode(n *v1alpha1.SandboxNode) *Node {
	out := &Node{
		Name: n.Name, Cordoned: n.Spec.Unschedulable, Status: n.Status,
		features: make(map[string]bool, len(n.Status.CPUFeatures)),
		layers:   make(map[string]bool, len(n.Status.Layers)),
		forks:    map[string]int{},
	}
	for _, f := range n.Status.CPUFeatures {
		out.features[f] = true
	}
	for _, l := range n.Status.Layers {
		out.layers[l] = true
	}
	out.NotReady = "not ready: its node agent never published a Ready condition"
	for _, c := range n.Status.Conditions {
		if c.Type != v1alpha1.ConditionReady {
			continue
		}
		out.Ready = c.Status == metav1.ConditionTrue
		out.NotReady = ""
		if !out.Ready {
			out.NotReady = "not ready"
			if c.Message != "" {
				out.NotReady += ": " + c.Message
			} else if c.Reason != "" {
				out.NotReady += " (" + c.Reason + ")"
			}
		}
	}
	return out
}

// Used is what is bound to n so far.
func (n *Node) Used() Used { return n.used }

// Add counts sb, asking r, as bound to n. A sandbox the node has not made
// yet (no state in its status) holds its disk limit too; a stopped one
// holds no memory and no CPUs; a lost or deleted one holds nothing.
func (n *Node) Add(sb *v1alpha1.Sandbox, r Request) {
	switch api.State(sb.Status.State) {
	case api.StateLost, api.StateDeleted:
		return
	case "":
		n.used.PendingDiskBytes += r.DiskBytes
	}
	n.used.Sandboxes++
	if sb.Status.State != string(api.StateStopped) {
		n.used.MemoryBytes += r.MemoryBytes
		n.used.MilliCPUs += r.MilliCPUs
	}
	if r.Parent != "" {
		n.forks[r.Parent]++
	}
}

// Forks is how many sandboxes forked from parent are bound to n.
func (n *Node) Forks(parent string) int { return n.forks[parent] }

// FreeMemoryBytes is n's memory not taken by what is bound to it.
func (n *Node) FreeMemoryBytes() int64 { return n.Status.Capacity.MemoryBytes - n.used.MemoryBytes }

// Fit says whether n can take r and, if not, why: every rule it fails,
// joined with "; ".
func (n *Node) Fit(r Request) (ok bool, why string) {
	var no []string
	if !n.Ready {
		no = append(no, n.NotReady)
	}
	if n.Cordoned {
		no = append(no, "cordoned")
	}
	if r.memoryWanted() && r.Image.RequireMemory {
		no = append(no, n.memoryMisfits(r.Image)...)
	}
	no = append(no, n.roomMisfits(r)...)
	return len(no) == 0, strings.Join(no, "; ")
}

// legacyAgent is the agent build of a sandbox booted before sbx named its
// builds (sbxd's own word for it).
const legacyAgent = "legacy"

// memoryMisfits are the reasons img's memory would not restore on n.
func (n *Node) memoryMisfits(img *v1alpha1.SandboxImage) []string {
	var no []string
	switch {
	case n.Status.RunscSHA256 == "":
		no = append(no, "publishes no runsc sha256")
	case img.RunscSHA256 != n.Status.RunscSHA256:
		no = append(no, fmt.Sprintf("runsc sha256 differs (the image's %s, the node's %s)", short(img.RunscSHA256), short(n.Status.RunscSHA256)))
	}
	switch {
	case img.Agent == "": // an image from before images named their agent
	case img.Agent == legacyAgent:
		// an agent of before builds were named: each node's may be
		// another release's, so its memory restores only where it was
		// taken, never on a node placement picks
		no = append(no, "the image's processes run on an agent of before builds were named, which restores only on the node it was taken on")
	case len(n.Status.Agents) == 0:
		no = append(no, "publishes no agent builds (an sbxd older than the image)")
	case !slices.Contains(n.Status.Agents, img.Agent):
		no = append(no, fmt.Sprintf("lacks the agent build the image's processes run on (%s)", img.Agent))
	}
	var missing []string
	for _, f := range img.CPUFeatures {
		if !n.features[f] {
			missing = append(missing, f)
		}
	}
	if len(missing) > 0 {
		const shown = 5
		list := strings.Join(missing[:min(len(missing), shown)], " ")
		if len(missing) > shown {
			list += fmt.Sprintf(" and %d more", len(missing)-shown)
		}
		no = append(no, "lacks CPU features the image was recorded with: "+list)
	}
	if img.CacheLineBytes != n.Status.CacheLineBytes {
		no = append(no, fmt.Sprintf("cache line differs (the image's %d bytes, the node's %d)", img.CacheLineBytes, n.Status.CacheLineBytes))
	}
	return no
}

// roomMisfits are the reasons n has no room left for r.
func (n *Node) roomMisfits(r Request) []string {
	var no []string
	c := n.Status.Capacity
	if free := n.FreeMemoryBytes(); r.MemoryBytes > free {
		no = append(no, fmt.Sprintf("too little memory: asks %s, %s left of %s", size(r.MemoryBytes), size(max(free, 0)), size(c.MemoryBytes)))
	}
	if free := int64(c.CPUs)*1000 - n.used.MilliCPUs; r.MilliCPUs > free {
		no = append(no, fmt.Sprintf("too few CPUs: asks %s, %s left of %d", milli(r.MilliCPUs), milli(max(free, 0)), c.CPUs))
	}
	if free := c.DiskFreeBytes - n.used.PendingDiskBytes; r.DiskBytes > free {
		no = append(no, fmt.Sprintf("too little disk: asks %s, %s free", size(r.DiskBytes), size(max(free, 0))))
	}
	return no
}

// Rejection is a node that cannot take a sandbox, and why.
type Rejection struct {
	Node, Reason string
}

// String is "node-2: cordoned".
func (r Rejection) String() string { return r.Node + ": " + r.Reason }

// Filter returns the nodes that can take r, and a Rejection for each of
// the others, both in the order of nodes.
func Filter(nodes []*Node, r Request) (fit []*Node, rejected []Rejection) {
	for _, n := range nodes {
		if ok, why := n.Fit(r); ok {
			fit = append(fit, n)
		} else {
			rejected = append(rejected, Rejection{Node: n.Name, Reason: why})
		}
	}
	return fit, rejected
}

// Why is the line that says why a sandbox waits, from the rejections of
// every node: the first few named, the rest counted.
func Why(rejected []Rejection) string {
	if len(rejected) == 0 {
		return "no node can take it: the fleet has no SandboxNode"
	}
	const shown = 5
	parts := make([]string, 0, shown)
	for _, r := range rejected[:min(len(rejected), shown)] {
		parts = append(parts, r.String())
	}
	s := fmt.Sprintf("no node of %d can take it: %s", len(rejected), strings.Join(parts, "; "))
	if len(rejected) > shown {
		s += fmt.Sprintf("; and %d more", len(rejected)-shown)
	}
	return s
}

// Score is how much a node is preferred for a request. Its fields rank in
// this order: Compare looks at the next only on a tie.
type Score struct {
	// MemoryRestores: the request's memory restores here. Only a memory
	// image that does not require it has candidates where it does not:
	// they boot from the disk, so they come last.
	MemoryRestores bool
	// Forks of the request's parent bound here: fewer first. Before the
	// layers: a fork's layers are on its parent's node only, and would
	// draw every fork there.
	Forks int
	// Layers of the request's image held here: more first.
	Layers int
	// FreeMemoryBytes before the request: more first (spread the load).
	FreeMemoryBytes int64
	// Node: ties go to the first name.
	Node string
}

// Score is how n scores for r.
func (n *Node) Score(r Request) Score {
	s := Score{MemoryRestores: true, FreeMemoryBytes: n.FreeMemoryBytes(), Node: n.Name}
	if r.Parent != "" {
		s.Forks = n.forks[r.Parent]
	}
	if r.Image != nil {
		for _, l := range r.Image.Layers {
			if n.layers[l] {
				s.Layers++
			}
		}
		if r.memoryWanted() {
			s.MemoryRestores = len(n.memoryMisfits(r.Image)) == 0
		}
	}
	return s
}

// Compare is negative when a is preferred to b, positive when b is, and 0
// only for the same node.
func (a Score) Compare(b Score) int {
	if a.MemoryRestores != b.MemoryRestores {
		if a.MemoryRestores {
			return -1
		}
		return 1
	}
	return cmp.Or(
		cmp.Compare(a.Forks, b.Forks),
		cmp.Compare(b.Layers, a.Layers),
		cmp.Compare(b.FreeMemoryBytes, a.FreeMemoryBytes),
		strings.Compare(a.Node, b.Node),
	)
}

// Choose is the best of fit for r (nil if fit is empty).
func Choose(fit []*Node, r Request) *Node {
	var best *Node
	var bestScore Score
	for _, n := range fit {
		if s := n.Score(r); best == nil || s.Compare(bestScore) < 0 {
			best, bestScore = n, s
		}
	}
	return best
}

// short is a digest's first 12 characters, "none" for none.
func short(d string) string {
	if d == "" {
		return "none"
	}
	return d[:min(len(d), 12)]
}

// size is n bytes as a person reads it: 1.5 GiB.
func size(n int64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	div, exp := int64(unit), 0
	for m := n / unit; m >= unit && exp < 4; m /= unit {
		div *= unit
		exp++
	}
	return strings.TrimSuffix(fmt.Sprintf("%.1f", float64(n)/float64(div)), ".0") + " " + string("KMGTP"[exp]) + "iB"
}

// milli is a count of thousandths of a CPU as a decimal: 1.5.
func milli(m int64) string { return strconv.FormatFloat(float64(m)/1000, 'f', -1, 64) }
