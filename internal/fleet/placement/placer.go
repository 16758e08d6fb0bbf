package placement

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/dynamic"

	"sbx.dev/sbx/api"
	"sbx.dev/sbx/internal/fleet/v1alpha1"
)

// maxReads bounds how often one sandbox is read again after a Conflict in
// one round; one that keeps changing waits for the next round.
const maxReads = 3

// Config is what a Placer needs.
type Config struct {
	// Namespace holds the Sandboxes (v1alpha1.DefaultNamespace).
	Namespace string
	// Defaults count what a sandbox that asks no memory or disk takes.
	Defaults Defaults
	Logger   *slog.Logger
}

// Placer places the unbound Sandboxes of a namespace on the SandboxNodes.
// One Place at a time: its tally of a round is its own.
type Placer struct {
	cfg Config
	dyn dynamic.Interface
	log *slog.Logger
}

// New makes a Placer on dyn; it does not reach the apiserver.
func New(cfg Config, dyn dynamic.Interface) *Placer {
	if cfg.Namespace == "" {
		cfg.Namespace = v1alpha1.DefaultNamespace
	}
	log := cfg.Logger
	if log == nil {
		log = slog.Default()
	}
	return &Placer{cfg: cfg, dyn: dyn, log: log}
}

// Binding is a sandbox (its object's name) and the node it is bound to.
type Binding struct {
	Sandbox, Node string
}

// Wait is a sandbox that no node could take, and why.
type Wait struct {
	Sandbox    string
	Rejections []Rejection
	// Why is the one line of it (Why of Rejections, or what is wrong with
	// the sandbox itself).
	Why string
}

// Round is what one Place did.
type Round struct {
	// Placed are the sandboxes this round bound, in the order it bound them.
	Placed []Binding
	// Raced are those another placer bound meanwhile (the bind met a
	// Conflict, and the object read again was bound): left as they are.
	Raced []Binding
	// Waiting are those no node could take.
	Waiting []Wait
}

// Place reads the SandboxNodes and the Sandboxes once, and binds each
// Sandbox that has no node (and is not lost) to the best node that can
// take it, oldest first. What it binds is counted against its node at
// once, so a round does not overfill a node. A bind that meets a Conflict
// reads the Sandbox again and leaves it if it was bound meanwhile.
//
// The error joins what failed (a list, a bind other than a Conflict); the
// Round still says what was done. The lists are one round trip each, and
// each bind one more (two after a Conflict).
func (p *Placer) Place(ctx context.Context) (Round, error) {
	var round Round
	nodes, byName, err := p.nodes(ctx)
	if err != nil {
		return round, err
	}
	res := p.dyn.Resource(v1alpha1.SandboxesResource).Namespace(p.cfg.Namespace)
	l, err := res.List(ctx, metav1.ListOptions{})
	if err != nil {
		return round, fmt.Errorf("placement: list sandboxes in %s: %w", p.cfg.Namespace, err)
	}
	type pending struct {
		u  *unstructured.Unstructured
		sb v1alpha1.Sandbox
	}
	var unbound []pending
	var errs []error
	for i := range l.Items {
		u := &l.Items[i]
		var sb v1alpha1.Sandbox
		if err := v1alpha1.FromUnstructured(u, &sb); err != nil {
			errs = append(errs, fmt.Errorf("placement: %w", err))
			continue
		}
		if sb.Spec.NodeName != "" {
			p.tally(byName, &sb)
			continue
		}
		if placeable(&sb) {
			unbound = append(unbound, pending{u, sb})
		}
	}
	slices.SortFunc(unbound, func(a, b pending) int {
		return cmp.Or(a.sb.CreationTimestamp.Compare(b.sb.CreationTimestamp.Time), strings.Compare(a.sb.Name, b.sb.Name))
	})
	for _, pe := range unbound {
		if ctx.Err() != nil {
			errs = append(errs, fmt.Errorf("placement: %w", ctx.Err()))
			break
		}
		if err := p.placeOne(ctx, res, pe.u, pe.sb, nodes, byName, &round); err != nil {
			errs = append(errs, err)
		}
	}
	return round, errors.Join(errs...)
}

// nodes reads the SandboxNodes, by name.
func (p *Placer) nodes(ctx context.Context) ([]*Node, map[string]*Node, error) {
	l, err := p.dyn.Resource(v1alpha1.SandboxNodesResource).List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, nil, fmt.Errorf("placement: list sandboxnodes: %w", err)
	}
	nodes := make([]*Node, 0, len(l.Items))
	byName := make(map[string]*Node, len(l.Items))
	for i := range l.Items {
		var n v1alpha1.SandboxNode
		if err := v1alpha1.FromUnstructured(&l.Items[i], &n); err != nil {
			return nil, nil, fmt.Errorf("placement: %w", err)
		}
		v := NewNode(&n)
		nodes = append(nodes, v)
		byName[v.Name] = v
	}
	slices.SortFunc(nodes, func(a, b *Node) int { return strings.Compare(a.Name, b.Name) })
	return nodes, byName, nil
}

// tally counts a bound sandbox against its node, if the fleet has it.
func (p *Placer) tally(byName map[string]*Node, sb *v1alpha1.Sandbox) {
	n := byName[sb.Spec.NodeName]
	if n == nil {
		return
	}
	r, _ := RequestOf(sb, p.cfg.Defaults) // a bad cpus counts none; its own placement said so
	n.Add(sb, r)
}

// placeable says whether an unbound sandbox is to be placed: not lost,
// not deleted, not being deleted.
func placeable(sb *v1alpha1.Sandbox) bool {
	st := api.State(sb.Status.State)
	return st != api.StateLost && st != api.StateDeleted && sb.DeletionTimestamp == nil
}

// placeOne binds one unbound sandbox, read as u, and says so in round.
func (p *Placer) placeOne(ctx context.Context, res dynamic.ResourceInterface, u *unstructured.Unstructured, sb v1alpha1.Sandbox,
	nodes []*Node, byName map[string]*Node, round *Round) error {
	name := u.GetName()
	for range maxReads {
		if sb.Spec.NodeName != "" {
			p.tally(byName, &sb)
			round.Raced = append(round.Raced, Binding{Sandbox: name, Node: sb.Spec.NodeName})
			p.log.Info("placement: bound meanwhile by another; left so", "sandbox", name, "node", sb.Spec.NodeName)
			return nil
		}
		if !placeable(&sb) {
			return nil
		}
		r, err := RequestOf(&sb, p.cfg.Defaults)
		if err != nil {
			round.Waiting = append(round.Waiting, Wait{Sandbox: name, Why: err.Error()})
			return nil
		}
		fit, rejected := Filter(nodes, r)
		best := Choose(fit, r)
		if best == nil {
			round.Waiting = append(round.Waiting, Wait{Sandbox: name, Rejections: rejected, Why: Why(rejected)})
			return nil
		}
		out, err := Bind(ctx, res, u, best.Name)
		if err == nil {
			var bound v1alpha1.Sandbox
			if err := v1alpha1.FromUnstructured(out, &bound); err != nil {
				bound = sb
				bound.Spec.NodeName = best.Name
			}
			best.Add(&bound, r)
			round.Placed = append(round.Placed, Binding{Sandbox: name, Node: best.Name})
			return nil
		}
		if !apierrors.IsConflict(err) {
			return fmt.Errorf("placement: %w", err)
		}
		// changed since it was read: read it again, and bind it only if
		// still unbound (the loop's first check)
		if u, err = res.Get(ctx, name, metav1.GetOptions{}); apierrors.IsNotFound(err) {
			return nil
		} else if err != nil {
			return fmt.Errorf("placement: read sandbox %s again after a conflict: %w", name, err)
		}
		sb = v1alpha1.Sandbox{}
		if err := v1alpha1.FromUnstructured(u, &sb); err != nil {
			return fmt.Errorf("placement: %w", err)
		}
	}
	return fmt.Errorf("placement: sandbox %s changed at each of %d reads; it waits for the next round", name, maxReads)
}

// Target chooses where a bound sandbox, sb, moves to from its node: the
// best of the other nodes that can take r, counting what is bound to each
// (sb on none of them). notReady overrides a node's own word on its
// readiness (the controller's judgement of its Lease). None fitting is a
// nil node, with each node's reason.
func (p *Placer) Target(ctx context.Context, sb *v1alpha1.Sandbox, r Request, notReady map[string]string) (*Node, []Rejection, error) {
	nodes, byName, err := p.nodes(ctx)
	if err != nil {
		return nil, nil, err
	}
	l, err := p.dyn.Resource(v1alpha1.SandboxesResource).Namespace(p.cfg.Namespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, nil, fmt.Errorf("placement: list sandboxes in %s: %w", p.cfg.Namespace, err)
	}
	for i := range l.Items {
		var o v1alpha1.Sandbox
		if v1alpha1.FromUnstructured(&l.Items[i], &o) == nil && o.Spec.NodeName != "" && o.UID != sb.UID {
			p.tally(byName, &o)
		}
	}
	from := sb.Spec.NodeName
	nodes = slices.DeleteFunc(nodes, func(n *Node) bool { return n.Name == from })
	for _, n := range nodes {
		if why, ok := notReady[n.Name]; ok {
			n.Ready, n.NotReady = false, why
		}
	}
	fit, rejected := Filter(nodes, r)
	return Choose(fit, r), rejected, nil
}

// Spread chooses a node for each of n forks of parent, asking r each (its
// Parent set): every node that can take one, the parent's too, counting
// what is bound to each and the forks chosen before it, so forks of one
// parent spread (Score: fewer of them first). notReady overrides a node's
// own word on its readiness, or leaves it out of the fork (a node without
// the template). Forks no node can take are left out of the answer, with
// each node's reason.
func (p *Placer) Spread(ctx context.Context, parent *v1alpha1.Sandbox, r Request, n int, notReady map[string]string) ([]string, []Rejection, error) {
	nodes, byName, err := p.nodes(ctx)
	if err != nil {
		return nil, nil, err
	}
	l, err := p.dyn.Resource(v1alpha1.SandboxesResource).Namespace(p.cfg.Namespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, nil, fmt.Errorf("placement: list sandboxes in %s: %w", p.cfg.Namespace, err)
	}
	for i := range l.Items {
		var o v1alpha1.Sandbox
		if v1alpha1.FromUnstructured(&l.Items[i], &o) == nil && o.Spec.NodeName != "" {
			p.tally(byName, &o)
		}
	}
	for _, n := range nodes {
		if why, ok := notReady[n.Name]; ok {
			n.Ready, n.NotReady = false, why
		}
	}
	var out []string
	var rejected []Rejection
	child := &v1alpha1.Sandbox{Spec: v1alpha1.SandboxSpec{Parent: parent.Status.ID}}
	for range n {
		var fit []*Node
		fit, rejected = Filter(nodes, r)
		best := Choose(fit, r)
		if best == nil {
			break
		}
		best.Add(child, r)
		out = append(out, best.Name)
	}
	return out, rejected, nil
}
