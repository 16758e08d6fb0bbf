// Package controller is the fleet's controller: it watches the node
// agents' Leases and tells the fleet when one stops renewing (its node is
// not ready, and the sandboxes on it are lost, with the reason), it places
// the Sandboxes that have no node (internal/fleet/placement), and it
// serves the fleet's side of sbx's HTTP API: the nodes, their cordons,
// and the sandboxes of every node. It knows the fleet only through the
// apiserver; it runs no sandbox.
package controller

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/go-containerregistry/pkg/v1/remote"
	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/dynamic"
	coordclient "k8s.io/client-go/kubernetes/typed/coordination/v1"

	"sbx.dev/sbx/api"
	"sbx.dev/sbx/internal/fleet/kube"
	"sbx.dev/sbx/internal/fleet/placement"
	"sbx.dev/sbx/internal/fleet/v1alpha1"
)

// Defaults of Config.
const (
	DefaultCheckEvery = time.Second
	// DefaultInfoWait bounds how long sbx info through the controller
	// waits for the node's answer: a node that accepts and does not answer
	// (its sbxd stopped, its Lease not expired yet) is told from its object.
	DefaultInfoWait = 5 * time.Second
	// DefaultResumeWait bounds how long `sbx resume --require-memory` of
	// a sandbox whose node is down waits for a node where its memory
	// restores, as a create waits for a node.
	DefaultResumeWait = 2 * time.Minute
)

// Reasons the controller writes.
const (
	ReasonLeaseExpired = "LeaseExpired" // SandboxNode: its agent stopped renewing
	ReasonNodeLost     = "NodeLost"     // Sandbox: its node's Lease expired
)

// Config is what a Controller needs.
type Config struct {
	// Kubeconfig is the path of the fleet's kubeconfig.
	Kubeconfig string
	// Namespace holds the Sandboxes and the nodes' Leases.
	Namespace string
	// CheckEvery is how often the Leases are read and the unbound
	// Sandboxes placed (DefaultCheckEvery).
	CheckEvery time.Duration
	// Defaults count what a sandbox that asks no memory or disk takes of
	// its node (placement's defaults, sbxd's).
	Defaults placement.Defaults
	Logger   *slog.Logger
	// Now is the clock (time.Now).
	Now func() time.Time
	// NodeToken is the bearer token the node agents' APIs take: a request
	// to a sandbox goes on to its node with it. Unused with NodeTokenKey.
	NodeToken string
	// NodeTokenKey, if set, gives every node its own token,
	// NodeTokenOf(NodeTokenKey, its name): a node, or whatever address its
	// SandboxNode names, learns no other node's.
	NodeTokenKey []byte
	// RegistryOptions are added to how the controller reads a pull's
	// manifest from its registry (with the user's docker credentials).
	RegistryOptions []remote.Option
	// MoveRepository is the repository of the fleet's registry that stopped
	// sandboxes move through (127.0.0.1:5000/sbx/moves): a resume of one
	// whose node is cordoned, and a drain. "": they do not move.
	MoveRepository string
}

// Controller is the fleet's controller. Run it with Run; serve its API
// with Handler.
type Controller struct {
	cfg   Config
	dyn   dynamic.Interface
	coord coordclient.CoordinationV1Interface
	log   *slog.Logger
	place *placement.Placer
	// asked is poked by a create through the controller: placement runs at
	// once rather than at the next tick
	asked chan struct{}

	// leading: Run runs here (RunElected's leader, or Run called alone)
	leading atomic.Bool

	mu      sync.Mutex
	down    map[string]string // nodes found down, and why: told once
	waiting map[string]string // sandboxes no node can take, and why: told once

	// infoWait bounds how long sbx info waits for a node's answer before
	// it says what the fleet knows (DefaultInfoWait)
	infoWait time.Duration
	// resumeWait bounds how long a resume that requires its memory waits
	// for a node where it restores (DefaultResumeWait)
	resumeWait time.Duration
	tmu        sync.Mutex
	transports map[transportKey]*http.Transport // to the nodes, by address
}

// New makes a Controller from cfg; it does not reach the apiserver.
func New(cfg Config) (*Controller, error) {
	rc, err := kube.Config(cfg.Kubeconfig, "sbx-controller")
	if err != nil {
		return nil, err
	}
	c, err := kube.NewClients(rc)
	if err != nil {
		return nil, err
	}
	return NewWith(cfg, c.Dynamic, c.Coord), nil
}

// NewWith makes a Controller on the given clients (a test's fakes).
func NewWith(cfg Config, dyn dynamic.Interface, coord coordclient.CoordinationV1Interface) *Controller {
	if cfg.Namespace == "" {
		cfg.Namespace = v1alpha1.DefaultNamespace
	}
	if cfg.CheckEvery <= 0 {
		cfg.CheckEvery = DefaultCheckEvery
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	log := cfg.Logger
	if log == nil {
		log = slog.Default()
	}
	place := placement.New(placement.Config{Namespace: cfg.Namespace, Defaults: cfg.Defaults, Logger: log}, dyn)
	return &Controller{cfg: cfg, dyn: dyn, coord: coord, log: log, place: place, asked: make(chan struct{}, 1),
		down: map[string]string{}, waiting: map[string]string{}, infoWait: DefaultInfoWait, resumeWait: DefaultResumeWait, transports: map[transportKey]*http.Transport{}}
}

// Run checks the nodes' Leases, then places the unbound Sandboxes, every
// CheckEvery until ctx ends. An apiserver that does not answer is logged
// and asked again.
func (c *Controller) Run(ctx context.Context) {
	c.log.Info("fleet controller", "namespace", c.cfg.Namespace, "check_every", c.cfg.CheckEvery)
	c.leading.Store(true)
	t := time.NewTicker(c.cfg.CheckEvery)
	defer t.Stop()
	for {
		if err := c.CheckNodes(ctx); err != nil && ctx.Err() == nil {
			c.log.Warn("fleet: check the nodes", "err", err)
		}
		if err := c.Place(ctx); err != nil && ctx.Err() == nil {
			c.log.Warn("fleet: place the sandboxes", "err", err)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-c.asked:
		}
	}
}

// hurry has Run place the unbound Sandboxes now (at most one waits).
func (c *Controller) hurry() {
	select {
	case c.asked <- struct{}{}:
	default:
	}
}

// Place binds each Sandbox that has no node to the best node that can take
// it (placement.Placer.Place). It logs each placement, and each sandbox
// that begins to wait, with why, once while it waits (the why changes
// with the fleet's load; the round's Waiting has the latest).
func (c *Controller) Place(ctx context.Context) error {
	round, err := c.place.Place(ctx)
	tell := c.noteRound(round, err == nil)
	for _, w := range tell { // no lock across the apiserver
		if werr := c.tellWaiting(ctx, w); werr != nil && ctx.Err() == nil {
			c.log.Warn("fleet: could not say why a sandbox waits", "sandbox", w.Sandbox, "err", werr)
			c.mu.Lock()
			delete(c.waiting, w.Sandbox) // told again at the next round
			c.mu.Unlock()
		}
	}
	return err
}

// noteRound logs what a round placed and who began to wait, keeps who
// waits and why, and returns those whose why is new, to be told in their
// objects. whole says the round ended: one cut short does not say who
// stopped waiting.
func (c *Controller) noteRound(round placement.Round, whole bool) []placement.Wait {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, b := range round.Placed {
		c.log.Info("fleet: placed", "sandbox", b.Sandbox, "node", b.Node)
		delete(c.waiting, b.Sandbox)
	}
	waiting := make(map[string]string, len(round.Waiting))
	var tell []placement.Wait
	for _, w := range round.Waiting {
		waiting[w.Sandbox] = w.Why
		why, told := c.waiting[w.Sandbox]
		if !told {
			c.log.Warn("fleet: a sandbox waits for a node", "sandbox", w.Sandbox, "why", w.Why)
		}
		if !told || why != w.Why {
			tell = append(tell, w)
		}
	}
	if whole {
		c.waiting = waiting
	} else {
		maps.Copy(c.waiting, waiting)
	}
	return tell
}

// tellWaiting writes why a sandbox waits in its object's Placed condition
// (False, Unschedulable), for kubectl describe and the create waiting on
// it. The write is preconditioned on the object as read: one bound or
// made meanwhile is left to its node.
func (c *Controller) tellWaiting(ctx context.Context, w placement.Wait) error {
	rc := c.dyn.Resource(v1alpha1.SandboxesResource).Namespace(c.cfg.Namespace)
	u, err := rc.Get(ctx, w.Sandbox, metav1.GetOptions{})
	if err != nil {
		return err
	}
	var sb v1alpha1.Sandbox
	if err := v1alpha1.FromUnstructured(u, &sb); err != nil {
		return err
	}
	if sb.Spec.NodeName != "" || sb.Status.ID != "" {
		return nil
	}
	sb.Status.Conditions = v1alpha1.SetCondition(sb.Status.Conditions, metav1.Condition{
		Type: v1alpha1.ConditionPlaced, Status: metav1.ConditionFalse, Reason: v1alpha1.ReasonUnschedulable, Message: w.Why,
	}, c.cfg.Now())
	st, err := v1alpha1.ToUnstructured(&sb.Status)
	if err != nil {
		return err
	}
	u.Object["status"] = st.Object
	_, err = rc.UpdateStatus(ctx, u, metav1.UpdateOptions{})
	return err
}

// node is a SandboxNode with its Lease, as the controller judges it.
type node struct {
	obj     *unstructured.Unstructured
	typed   v1alpha1.SandboxNode
	lease   *coordinationv1.Lease
	ready   bool
	reason  string // why not ready
	renewed time.Time
}

// judge says whether a node's Lease holds at now.
func judge(l *coordinationv1.Lease, now time.Time) (ready bool, renewed time.Time, reason string) {
	if l == nil || l.Spec.RenewTime == nil {
		return false, time.Time{}, "its node agent has no Lease: it never started, or its Lease was removed"
	}
	renewed = l.Spec.RenewTime.Time
	d := 15 * time.Second
	if l.Spec.LeaseDurationSeconds != nil && *l.Spec.LeaseDurationSeconds > 0 {
		d = time.Duration(*l.Spec.LeaseDurationSeconds) * time.Second
	}
	if now.Sub(renewed) > d {
		return false, renewed, fmt.Sprintf("its node agent stopped renewing its Lease at %s (%s ago; it expires after %s)",
			renewed.UTC().Format(time.RFC3339), now.Sub(renewed).Round(time.Second), d)
	}
	return true, renewed, ""
}

// nodes reads the SandboxNodes and their Leases, and judges each.
func (c *Controller) nodes(ctx context.Context) ([]*node, error) {
	ul, err := c.dyn.Resource(v1alpha1.SandboxNodesResource).List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("list sandboxnodes: %w", err)
	}
	ll, err := c.coord.Leases(c.cfg.Namespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("list leases in %s: %w", c.cfg.Namespace, err)
	}
	leases := map[string]*coordinationv1.Lease{}
	for i := range ll.Items {
		leases[ll.Items[i].Name] = &ll.Items[i]
	}
	now := c.cfg.Now()
	var out []*node
	for i := range ul.Items {
		n := &node{obj: &ul.Items[i]}
		if err := v1alpha1.FromUnstructured(n.obj, &n.typed); err != nil {
			return nil, err
		}
		n.lease = leases[n.obj.GetName()]
		n.ready, n.renewed, n.reason = judge(n.lease, now)
		out = append(out, n)
	}
	slices.SortFunc(out, func(a, b *node) int {
		switch {
		case a.obj.GetName() < b.obj.GetName():
			return -1
		case a.obj.GetName() > b.obj.GetName():
			return 1
		}
		return 0
	})
	return out, nil
}

// CheckNodes reads every node's Lease once. A node whose Lease expired is
// marked not ready, and every sandbox on it that is not lost already is
// marked lost, with the reason. A node that comes back writes its own
// sandboxes' state again (its agent mirrors them).
func (c *Controller) CheckNodes(ctx context.Context) error {
	ns, err := c.nodes(ctx)
	if err != nil {
		return err
	}
	var errs []error
	for _, n := range ns {
		name := n.obj.GetName()
		c.mu.Lock()
		_, wasDown := c.down[name]
		if n.ready {
			delete(c.down, name)
		}
		c.mu.Unlock()
		if n.ready {
			if wasDown {
				c.log.Info("fleet: a node renews its Lease again", "node", name)
			}
			continue
		}
		if !wasDown {
			c.log.Warn("fleet: a node is down", "node", name, "reason", n.reason)
		}
		if err := c.markNodeDown(ctx, n); err != nil {
			errs = append(errs, err)
			continue
		}
		if err := c.markSandboxesLost(ctx, name, n.reason); err != nil {
			errs = append(errs, err)
			continue
		}
		c.mu.Lock()
		c.down[name] = n.reason
		c.mu.Unlock()
	}
	return errors.Join(errs...)
}

// markNodeDown sets the node's Ready condition to False, unless it says so.
func (c *Controller) markNodeDown(ctx context.Context, n *node) error {
	for _, cond := range n.typed.Status.Conditions {
		if cond.Type == v1alpha1.ConditionReady && cond.Status == metav1.ConditionFalse && cond.Reason == ReasonLeaseExpired {
			return nil
		}
	}
	st := n.typed.Status
	st.Conditions = v1alpha1.SetCondition(st.Conditions, metav1.Condition{
		Type: v1alpha1.ConditionReady, Status: metav1.ConditionFalse, Reason: ReasonLeaseExpired, Message: n.reason,
	}, c.cfg.Now())
	u, err := v1alpha1.ToUnstructured(&st)
	if err != nil {
		return err
	}
	obj := n.obj.DeepCopy()
	obj.Object["status"] = u.Object
	if _, err := c.dyn.Resource(v1alpha1.SandboxNodesResource).UpdateStatus(ctx, obj, metav1.UpdateOptions{}); err != nil {
		return fmt.Errorf("mark sandboxnode %s not ready: %w", n.obj.GetName(), err)
	}
	return nil
}

// markSandboxesLost marks every Sandbox of node that is not lost already
// lost, with reason. Each write is preconditioned on the object's
// resourceVersion: a node agent that came back meanwhile and wrote its
// own view wins (a conflict is left for the next check).
func (c *Controller) markSandboxesLost(ctx context.Context, nodeName, reason string) error {
	res := c.dyn.Resource(v1alpha1.SandboxesResource).Namespace(c.cfg.Namespace)
	// the node's are those its agent labelled and those bound to it that
	// it has not made yet (placement sets spec.nodeName, not the label):
	// one list, read here, rather than a selector that would miss the
	// second
	l, err := res.List(ctx, metav1.ListOptions{})
	if err != nil {
		return fmt.Errorf("list the sandboxes of node %s: %w", nodeName, err)
	}
	var errs []error
	if err := c.releaseDeleted(ctx, nodeName, l.Items); err != nil {
		errs = append(errs, err)
	}
	for i := range l.Items {
		u := &l.Items[i]
		var sb v1alpha1.Sandbox
		if err := v1alpha1.FromUnstructured(u, &sb); err != nil {
			errs = append(errs, err)
			continue
		}
		if u.GetLabels()[v1alpha1.LabelNode] != nodeName && sb.Spec.NodeName != nodeName {
			continue
		}
		if sb.Status.State == string(api.StateLost) || u.GetDeletionTimestamp() != nil {
			continue
		}
		msg := "node " + nodeName + " is down: " + reason
		sb.Status.Reason = msg
		sb.Status.State = string(api.StateLost)
		sb.Status.Conditions = v1alpha1.SetCondition(sb.Status.Conditions, metav1.Condition{
			Type: v1alpha1.ConditionReady, Status: metav1.ConditionFalse, Reason: ReasonNodeLost, Message: msg,
		}, c.cfg.Now())
		st, err := v1alpha1.ToUnstructured(&sb.Status)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		obj := u.DeepCopy()
		obj.Object["status"] = st.Object
		if _, err := res.UpdateStatus(ctx, obj, metav1.UpdateOptions{}); err != nil && !apierrors.IsConflict(err) {
			errs = append(errs, fmt.Errorf("mark sandbox %s lost: %w", u.GetName(), err))
		}
	}
	return errors.Join(errs...)
}

// releaseDeleted lets go of the objects of down node nodeName that are
// being deleted: their agent, away, cannot delete their sandboxes and drop
// its finalizer, and they would stay Terminating for good if the node
// never comes back. Each is noted in the node's SandboxNode status first
// (DeletedWhileDown), so that its agent, back, deletes
// the sandbox rather than mirror it again; then its finalizer is dropped.
// A crash between the two notes it twice, which the agent takes as once.
func (c *Controller) releaseDeleted(ctx context.Context, nodeName string, items []unstructured.Unstructured) error {
	var gone []*unstructured.Unstructured
	for i := range items {
		u := &items[i]
		if u.GetDeletionTimestamp() == nil || !slices.Contains(u.GetFinalizers(), v1alpha1.Finalizer) {
			continue
		}
		spec, _, _ := unstructured.NestedString(u.Object, "spec", "nodeName")
		if u.GetLabels()[v1alpha1.LabelNode] != nodeName && spec != nodeName {
			continue
		}
		gone = append(gone, u)
	}
	if len(gone) == 0 {
		return nil
	}
	var errs []error
	// those that fit are let go, the rest wait (Terminating) for room or
	// the node: a burst past the bound must not keep all of them
	gone, err := c.noteDeleted(ctx, nodeName, gone)
	if err != nil {
		if gone == nil {
			return err
		}
		errs = append(errs, err)
	}
	gone, err = c.noteOnMoveTargets(ctx, nodeName, gone)
	if err != nil {
		errs = append(errs, err)
	}
	res := c.dyn.Resource(v1alpha1.SandboxesResource).Namespace(c.cfg.Namespace)
	for _, u := range gone {
		w := u.DeepCopy()
		w.SetFinalizers(slices.DeleteFunc(w.GetFinalizers(), func(f string) bool { return f == v1alpha1.Finalizer }))
		if _, err := res.Update(ctx, w, metav1.UpdateOptions{}); err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
			errs = append(errs, fmt.Errorf("let sandbox object %s go (node %s is down): %w", u.GetName(), nodeName, err))
			continue
		}
		c.log.Info("fleet: let go of a sandbox object deleted while its node is down", "object", u.GetName(), "node", nodeName)
	}
	return errors.Join(errs...)
}

// noteDeleted adds us, objects being deleted, to node's list of those
// deleted while it could not see them (its SandboxNode's DeletedWhileDown),
// for its agent to delete their sandboxes, and returns those of us that
// are noted there (or need not be: an object no sandbox was made for yet),
// which may be let go. Past MaxDeletedWhileDown the rest are not, and the
// error says so; an error with nothing returned is one of reading or
// writing the list, for the next check.
func (c *Controller) noteDeleted(ctx context.Context, node string, us []*unstructured.Unstructured) ([]*unstructured.Unstructured, error) {
	nodes := c.dyn.Resource(v1alpha1.SandboxNodesResource)
	n, err := nodes.Get(ctx, node, metav1.GetOptions{})
	if err != nil {
		return nil, fmt.Errorf("note the objects deleted on node %s: %w", node, err)
	}
	var typed v1alpha1.SandboxNode
	if err := v1alpha1.FromUnstructured(n, &typed); err != nil {
		return nil, err
	}
	list := typed.Status.DeletedWhileDown
	noted := len(list)
	var ok []*unstructured.Unstructured
	left := 0
	for _, u := range us {
		d := v1alpha1.DeletedObject{Object: u.GetName(), UID: string(u.GetUID()), ID: statusID(u)}
		if d.ID != "" && !slices.Contains(list, d) {
			if len(list) >= v1alpha1.MaxDeletedWhileDown {
				left++
				continue
			}
			list = append(list, d)
		}
		ok = append(ok, u)
	}
	if len(list) != noted {
		typed.Status.DeletedWhileDown = list
		st, err := v1alpha1.ToUnstructured(&typed.Status)
		if err != nil {
			return nil, err
		}
		n.Object["status"] = st.Object
		// preconditioned on its resourceVersion: a write of another's
		// meanwhile is a conflict, tried again at the next check
		if _, err := nodes.UpdateStatus(ctx, n, metav1.UpdateOptions{}); err != nil {
			return nil, fmt.Errorf("note the objects deleted on node %s: %w", node, err)
		}
	}
	if left > 0 {
		return ok, fmt.Errorf("node %s: its list of objects deleted while it could not see them is full (%d); %d more stay Terminating until it is back", node, v1alpha1.MaxDeletedWhileDown, left)
	}
	return ok, nil
}

// noteOnMoveTargets notes each of gone, objects of down node from about to
// be let go, that a move was under way for (sbx.dev/moving-to: a resume
// adopting it elsewhere, cut by its deletion) on the SandboxNode of the
// node it was moving to, too: that node holds a stopped copy adopted for
// the move, which its agent keeps while the object is bound to from, and
// would mirror as a sandbox of its own once the object is gone. Its agent
// deletes the copy, as the node's own agent does its sandbox when back. It
// returns those of gone that may be let go: one whose target's list could
// not be written keeps its finalizer, for the next check.
func (c *Controller) noteOnMoveTargets(ctx context.Context, from string, gone []*unstructured.Unstructured) ([]*unstructured.Unstructured, error) {
	var out []*unstructured.Unstructured
	byTarget := map[string][]*unstructured.Unstructured{}
	for _, u := range gone {
		f := strings.Fields(u.GetAnnotations()[v1alpha1.AnnotationMovingTo])
		if len(f) == 0 || f[0] == from || statusID(u) == "" {
			out = append(out, u)
			continue
		}
		byTarget[f[0]] = append(byTarget[f[0]], u)
	}
	var errs []error
	for to, us := range byTarget {
		ok, err := c.noteDeleted(ctx, to, us)
		if ok == nil && apierrors.IsNotFound(err) {
			out = append(out, us...) // no such node: no copy there
			continue
		}
		if err != nil {
			errs = append(errs, err)
		}
		out = append(out, ok...)
	}
	return out, errors.Join(errs...)
}
