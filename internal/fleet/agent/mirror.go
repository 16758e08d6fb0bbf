package agent

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/equality"
	kerrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/dynamic"

	"sbx.dev/sbx/api"
	"sbx.dev/sbx/internal/fleet/v1alpha1"
)

// mirror keeps one Sandbox object per sandbox of the node: at every change
// the source tells of, and every Resync in case a write was lost. It
// compares the whole list, so a change it missed, or one made by someone
// else to the objects, is put right at the next pass.
func (a *Agent) mirror(ctx context.Context) {
	// the objects asking something of this node (bound to it, or being
	// deleted) hurry the next pass, as sbxd's own changes do
	asked := make(chan struct{}, 1)
	go a.watchAsked(ctx, asked)
	fails := 0
	for {
		changed := a.cfg.Source.Changed() // before the List, or a change between is missed
		err := a.mirrorOnce(ctx)
		wait := a.cfg.Resync
		if err != nil && ctx.Err() == nil {
			fails++
			wait = backoff(fails, maxBackoff)
			a.log.Warn("fleet: mirror sandboxes failed; retrying", "err", err, "failures", fails, "retry_in", wait)
			changed = nil // the retry lists again anyway; changes do not hurry it
		} else if fails > 0 {
			a.log.Info("fleet: mirror sandboxes recovered", "after_failures", fails)
			fails = 0
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-changed:
			t.Stop()
		case <-asked:
			t.Stop()
		case <-t.C:
		}
	}
}

// watchAsked watches the namespace's Sandbox objects and pokes asked (at
// most one poke waits) at each one that asks something of this node: one
// bound here and not made yet, or one of its own being deleted; and each
// time the watch is set up again, since what came meanwhile was missed.
// The agent's own writes of its objects do not poke, so passes settle.
func (a *Agent) watchAsked(ctx context.Context, asked chan<- struct{}) {
	poke := func() {
		select {
		case asked <- struct{}{}:
		default:
		}
	}
	rc := a.dyn.Resource(v1alpha1.SandboxesResource).Namespace(a.cfg.Namespace)
	fails := 0
	for ctx.Err() == nil {
		w, err := rc.Watch(ctx, metav1.ListOptions{})
		if err == nil {
			began := time.Now()
			unhook := context.AfterFunc(ctx, w.Stop)
			poke()
			for ev := range w.ResultChan() {
				if ev.Type == watch.Error {
					break
				}
				u, ok := ev.Object.(*unstructured.Unstructured)
				if ok && (ev.Type == watch.Added || ev.Type == watch.Modified) &&
					(boundHere(u, a.cfg.Node) || movedHere(u, a.cfg.Node) ||
						(u.GetDeletionTimestamp() != nil && u.GetLabels()[v1alpha1.LabelNode] == a.cfg.Node)) {
					poke()
				}
			}
			unhook()
			w.Stop()
			if time.Since(began) > time.Second {
				fails = 0
				continue
			}
			// a watch that ends at once, again and again, waits as a
			// failure does
		}
		if ctx.Err() == nil {
			fails++
			t := time.NewTimer(backoff(fails, maxBackoff))
			select {
			case <-ctx.Done():
				t.Stop()
				return
			case <-t.C:
			}
		}
	}
}

func (a *Agent) mirrorOnce(ctx context.Context) error {
	rc := a.dyn.Resource(v1alpha1.SandboxesResource).Namespace(a.cfg.Namespace)
	// every object of the namespace: those labelled this node's (made
	// here, mirrored), and those bound to it that it has not made yet.
	// Listed before the sandboxes: an object is labelled this node's only
	// once its sandbox is here (made here, or adopted before a move's
	// rebind), so one listed with no sandbox after it is one whose
	// sandbox went; the other way round, a move's rebind between the two
	// lists had its object deleted as gone.
	list, err := rc.List(ctx, metav1.ListOptions{})
	if err != nil {
		return fmt.Errorf("list sandbox objects: %w", err)
	}
	sbs, err := a.cfg.Source.List(ctx)
	if err != nil {
		return fmt.Errorf("list sandboxes: %w", err)
	}
	var errs []error
	// objects deleted while this node was down, let go by the controller:
	// their sandboxes go before anything is mirrored
	sbs, waiting, err := a.deleteDeletedWhileDown(ctx, sbs)
	var unknown *unknownDeleted
	if errors.As(err, &unknown) {
		return err
	}
	if err != nil {
		errs = append(errs, err)
	}
	have := map[string]*unstructured.Unstructured{}
	var bound []*unstructured.Unstructured
	for i := range list.Items {
		u := &list.Items[i]
		switch {
		case u.GetLabels()[v1alpha1.LabelNode] == a.cfg.Node:
			have[u.GetName()] = u
		case boundHere(u, a.cfg.Node):
			bound = append(bound, u)
		}
	}
	// objects deleted (kubectl delete): their sandboxes go first, then the
	// finalizer, and the object with it
	gone, err := a.deleteAsked(ctx, rc, have, sbs)
	if err != nil {
		errs = append(errs, err)
	}
	sbs = slices.DeleteFunc(sbs, func(sb api.Sandbox) bool { return gone[sb.ID] })
	if made, err := a.makeBound(ctx, rc, bound, sbs); err != nil {
		errs = append(errs, err)
	} else {
		sbs = append(sbs, made...)
	}
	a.sandboxes.Store(int64(len(sbs) + waiting))
	for _, sb := range sbs {
		name := objectName(sb)
		old := have[name]
		if name != v1alpha1.ObjectName(sb.ID) {
			// the object it was made for, and no other of that name (one
			// asked again after the first went has another uid): this
			// node's already, or bound here and waiting, or its mirror
			// whose label was changed (kubectl label; taken back)
			uid := sb.Meta[v1alpha1.MetaObjectUID]
			if old == nil || string(old.GetUID()) != uid {
				old = nil
				u, err := rc.Get(ctx, name, metav1.GetOptions{})
				switch {
				case (kerrors.IsNotFound(err) || err == nil && string(u.GetUID()) != uid) && sb.Meta[v1alpha1.MetaObjectNamespace] == a.cfg.Namespace:
					// the object it was made for is gone: deleted while
					// sbxd made it, before this agent's finalizer was on
					// it (or since, by hand). Its deletion asked for the
					// sandbox's, as any object's does. (Only in the
					// namespace it was made in: an agent watching another
					// knows nothing of that object, and keeps the sandbox,
					// mirrored by its id)
					if err := a.deleteOrphan(ctx, sb, name); err != nil {
						errs = append(errs, err)
					}
					continue
				case err != nil && !kerrors.IsNotFound(err):
					errs = append(errs, fmt.Errorf("get sandbox object %s: %w", name, err))
					continue
				case err == nil && (boundHere(u, a.cfg.Node) || statusID(u) == sb.ID):
					old = u
				}
			}
			if old == nil { // another node's now: the sandbox lives on, mirrored by its id
				name = v1alpha1.ObjectName(sb.ID)
				old = have[name]
			}
		}
		delete(have, name)
		var err error
		if old != nil && old.GetLabels()[v1alpha1.LabelNode] != a.cfg.Node && boundElsewhere(old, a.cfg.Node) {
			err = &movedAway{obj: old} // relabelled and rebound by the controller's move
		} else {
			err = a.putSandbox(ctx, rc, name, sb, old)
		}
		var away *movedAway
		if errors.As(err, &away) {
			err = a.dropMovedCopy(ctx, sb, away.obj)
		}
		if err != nil {
			errs = append(errs, err)
		}
	}
	for name, u := range have { // sandboxes that are gone
		if err := dropFinalizer(ctx, rc, u); err != nil {
			errs = append(errs, err)
			continue
		}
		uid := u.GetUID()
		err := rc.Delete(ctx, name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &uid}})
		if err != nil && !kerrors.IsNotFound(err) {
			errs = append(errs, fmt.Errorf("delete sandbox object %s: %w", name, err))
		}
	}
	return errors.Join(errs...)
}

// deleteAsked deletes the sandbox of every object of have that is being
// deleted, then lets the object go (drops the finalizer), and removes it
// from have. It returns the ids of the sandboxes so deleted, or found gone
// already. An object whose sandbox could not be deleted keeps its
// finalizer, and is tried again at the next pass.
func (a *Agent) deleteAsked(ctx context.Context, rc dynamic.ResourceInterface, have map[string]*unstructured.Unstructured, sbs []api.Sandbox) (map[string]bool, error) {
	gone := map[string]bool{}
	var errs []error
	for name, u := range have {
		if u.GetDeletionTimestamp() == nil {
			continue
		}
		// only the sandboxes this very object mirrors: an object that
		// names another's id in its status (written by hand) deletes
		// nothing. Found by the object, not by its status id: a status
		// write lost after the finalizer's names none, and the sandbox
		// made for the object still goes
		failed := false
		for _, sb := range sbs {
			if !mirrors(u, sb) {
				continue
			}
			if _, err := a.cfg.Source.Delete(ctx, sb.ID, false); err != nil && !errors.Is(err, api.ErrNotFound) {
				errs = append(errs, fmt.Errorf("delete sandbox %s, whose object %s is deleted: %w", sb.ID, name, err))
				failed = true
				continue
			}
			a.log.Info("fleet: deleted a sandbox whose object was deleted", "object", name, "sandbox", sb.ID)
			gone[sb.ID] = true
		}
		if failed {
			continue
		}
		delete(have, name)
		if err := dropFinalizer(ctx, rc, u); err != nil {
			errs = append(errs, err)
		}
	}
	return gone, errors.Join(errs...)
}

// deleteDeletedWhileDown deletes the sandboxes whose objects were deleted
// while this node was down (DeletedWhileDown in its SandboxNode's status),
// each only if the object was its own, and takes those done off the list.
// It returns sbs without the sandboxes it deleted, nor those it could not
// delete now: these stay on the list for the next pass, and are not
// mirrored meanwhile (an id-named one's object, deleted, would be written
// again); waiting counts them, still held here.
func (a *Agent) deleteDeletedWhileDown(ctx context.Context, sbs []api.Sandbox) (left []api.Sandbox, waiting int, _ error) {
	nodes := a.dyn.Resource(v1alpha1.SandboxNodesResource)
	n, err := nodes.Get(ctx, a.cfg.Node, metav1.GetOptions{})
	if kerrors.IsNotFound(err) {
		return sbs, 0, nil
	}
	if err != nil {
		return sbs, 0, &unknownDeleted{fmt.Errorf("get sandboxnode %s: %w", a.cfg.Node, err)}
	}
	var typed v1alpha1.SandboxNode
	if err := v1alpha1.FromUnstructured(n, &typed); err != nil {
		return sbs, 0, &unknownDeleted{err}
	}
	list := typed.Status.DeletedWhileDown
	if len(list) == 0 {
		return sbs, 0, nil
	}
	var keep []v1alpha1.DeletedObject
	var errs []error
	gone := map[string]bool{}
	held := map[string]bool{} // to delete, not deleted yet
	for _, d := range list {
		i := slices.IndexFunc(sbs, func(sb api.Sandbox) bool { return sb.ID == d.ID })
		if i < 0 || gone[d.ID] {
			continue // gone already
		}
		sb := sbs[i]
		own := &unstructured.Unstructured{}
		own.SetName(d.Object)
		own.SetUID(types.UID(d.UID))
		if !mirrors(own, sb) {
			a.log.Warn("fleet: an object deleted while this node was down named a sandbox it was not made for; that sandbox stays", "object", d.Object, "sandbox", d.ID)
			continue
		}
		if _, err := a.cfg.Source.Delete(ctx, sb.ID, false); err != nil && !errors.Is(err, api.ErrNotFound) {
			errs = append(errs, fmt.Errorf("delete sandbox %s, whose object %s was deleted while this node was down: %w", sb.ID, d.Object, err))
			keep = append(keep, d)
			held[sb.ID] = true
			continue
		}
		a.log.Info("fleet: deleted a sandbox whose object was deleted while this node was down", "object", d.Object, "sandbox", sb.ID)
		gone[sb.ID] = true
	}
	typed.Status.DeletedWhileDown = keep
	left = slices.DeleteFunc(sbs, func(sb api.Sandbox) bool { return gone[sb.ID] || held[sb.ID] })
	st, err := v1alpha1.ToUnstructured(&typed.Status)
	if err != nil {
		return left, len(held), err
	}
	n.Object["status"] = st.Object
	if _, err := nodes.UpdateStatus(ctx, n, metav1.UpdateOptions{}); err != nil {
		// deleted again at the next pass: a delete of a sandbox gone is fine
		errs = append(errs, fmt.Errorf("take the objects deleted while it was down off sandboxnode %s: %w", a.cfg.Node, err))
	}
	return left, len(held), errors.Join(errs...)
}

// unknownDeleted is deleteDeletedWhileDown's error when it could not read
// the list: whether a sandbox here is one to delete is not known, so the
// pass mirrors nothing (it would write a deleted object again).
type unknownDeleted struct{ err error }

func (e *unknownDeleted) Error() string { return e.err.Error() }
func (e *unknownDeleted) Unwrap() error { return e.err }

// deleteOrphan deletes sb, whose object (name) was deleted before the
// agent could put its finalizer on it.
func (a *Agent) deleteOrphan(ctx context.Context, sb api.Sandbox, name string) error {
	if _, err := a.cfg.Source.Delete(ctx, sb.ID, false); err != nil && !errors.Is(err, api.ErrNotFound) {
		return fmt.Errorf("delete sandbox %s, whose object %s was deleted while it was made: %w", sb.ID, name, err)
	}
	a.log.Info("fleet: deleted a sandbox whose object was deleted while it was made", "object", name, "sandbox", sb.ID)
	return nil
}

// mirrors reports whether u is sb's own object: the one it was made for
// (by name and uid), or the one named after its id.
func mirrors(u *unstructured.Unstructured, sb api.Sandbox) bool {
	if n := sb.Meta[v1alpha1.MetaObject]; n != "" && n == u.GetName() {
		return string(u.GetUID()) == sb.Meta[v1alpha1.MetaObjectUID]
	}
	return u.GetName() == v1alpha1.ObjectName(sb.ID)
}

// dropFinalizer takes the agent's finalizer off u, if it has it, so that a
// deletion of u completes.
func dropFinalizer(ctx context.Context, rc dynamic.ResourceInterface, u *unstructured.Unstructured) error {
	fs := u.GetFinalizers()
	if !slices.Contains(fs, v1alpha1.Finalizer) {
		return nil
	}
	u = u.DeepCopy()
	u.SetFinalizers(slices.DeleteFunc(fs, func(f string) bool { return f == v1alpha1.Finalizer }))
	if _, err := rc.Update(ctx, u, metav1.UpdateOptions{}); err != nil && !kerrors.IsNotFound(err) {
		return fmt.Errorf("let sandbox object %s go (drop its finalizer): %w", u.GetName(), err)
	}
	return nil
}

// statusID is the sbx id u's status names, if any.
func statusID(u *unstructured.Unstructured) string {
	id, _, _ := unstructured.NestedString(u.Object, "status", "id")
	return id
}

// objectName is the name of sb's Sandbox object: the one it was made for,
// else its id's.
func objectName(sb api.Sandbox) string {
	if n := sb.Meta[v1alpha1.MetaObject]; n != "" {
		return n
	}
	return v1alpha1.ObjectName(sb.ID)
}

// boundHere reports whether u is a Sandbox asked for through the apiserver
// and placed on node, that no agent has taken up yet: spec.nodeName is
// node, its status says nothing (no id, no state; or lost, which the
// controller wrote while the node was down before it made it), and it is
// not being deleted (placement leaves such an object alone too).
func boundHere(u *unstructured.Unstructured, node string) bool {
	var sb v1alpha1.Sandbox
	if v1alpha1.FromUnstructured(u, &sb) != nil {
		return false
	}
	st := api.State(sb.Status.State)
	return sb.Spec.NodeName == node && sb.Status.ID == "" && (st == "" || st == api.StateLost) && u.GetDeletionTimestamp() == nil
}

// makeBound makes a sandbox for each object in bound that none of sbs was
// made for already (a pass before a crash may have made it and not
// written the object), and returns those it made. A spec sbxd refuses is
// told in the object's status (state error, with the reason), so it is not
// tried again: delete it and ask again.
func (a *Agent) makeBound(ctx context.Context, rc dynamic.ResourceInterface, bound []*unstructured.Unstructured, sbs []api.Sandbox) ([]api.Sandbox, error) {
	made := map[string]bool{} // name and uid of the objects made for
	for _, sb := range sbs {
		if n := sb.Meta[v1alpha1.MetaObject]; n != "" {
			made[n+"/"+sb.Meta[v1alpha1.MetaObjectUID]] = true
		}
	}
	var out []api.Sandbox
	var errs []error
	for _, u := range bound {
		if made[u.GetName()+"/"+string(u.GetUID())] {
			continue
		}
		var obj v1alpha1.Sandbox
		if err := v1alpha1.FromUnstructured(u, &obj); err != nil {
			errs = append(errs, err)
			continue
		}
		req, err := createRequest(u.GetName(), string(u.GetUID()), a.cfg.Namespace, obj.Spec)
		var sb *api.Sandbox
		if err == nil {
			sb, err = a.cfg.Source.Create(ctx, req)
		}
		if err != nil {
			if ctx.Err() != nil {
				return out, ctx.Err()
			}
			if errors.Is(err, api.ErrUnavailable) {
				// sbxd's, not the spec's (its data dir full, shutting
				// down): tried again at the next pass
				a.log.Warn("fleet: a sandbox bound to this node waits: sbxd cannot make it now", "object", u.GetName(), "err", err)
				if werr := a.tellCannotYet(ctx, rc, u, err); werr != nil {
					errs = append(errs, werr)
				}
				continue
			}
			a.log.Warn("fleet: a sandbox bound to this node could not be made", "object", u.GetName(), "err", err)
			if werr := a.refuse(ctx, rc, u, err); werr != nil {
				errs = append(errs, werr)
			}
			continue
		}
		a.log.Info("fleet: made a sandbox bound to this node", "object", u.GetName(), "sandbox", sb.ID)
		out = append(out, *sb)
	}
	return out, errors.Join(errs...)
}

// createRequest is what sbxd is asked to make for the object named name,
// of uid uid, in namespace ns. sbx's own meta keys in the spec are refused,
// as the API refuses them.
func createRequest(name, uid, ns string, spec v1alpha1.SandboxSpec) (api.CreateRequest, error) {
	req := api.CreateRequest{Template: spec.Template, Name: spec.Name, Network: spec.Network, From: spec.From,
		Meta: maps.Clone(spec.Meta)}
	if err := api.CheckOwnMeta(req.Meta); err != nil {
		return req, fmt.Errorf("spec.%w", err)
	}
	if req.Meta == nil {
		req.Meta = map[string]string{}
	}
	req.Meta[v1alpha1.MetaObject] = name
	req.Meta[v1alpha1.MetaObjectUID] = uid
	req.Meta[v1alpha1.MetaObjectNamespace] = ns
	if spec.TTL != "" {
		d, err := api.ParseDuration("spec.ttl", spec.TTL)
		if err != nil {
			return req, err
		}
		req.TTL = api.Duration(d)
	}
	if spec.CPUs != "" {
		c, err := strconv.ParseFloat(spec.CPUs, 64)
		if err != nil || c < 0 || math.IsNaN(c) || math.IsInf(c, 0) {
			return req, api.Errorf(api.ErrInvalid, "spec.cpus: %q is not a number of CPUs", spec.CPUs)
		}
		req.CPUs = c
	}
	if spec.MemoryBytes > 0 {
		req.Memory = strconv.FormatInt(spec.MemoryBytes, 10)
	}
	if spec.DiskBytes > 0 {
		req.Disk = strconv.FormatInt(spec.DiskBytes, 10)
	}
	return req, nil
}

// tellCannotYet writes into u's status that its node cannot make it for
// now, and why (a Ready=False condition, the state left unset: it is still
// bound here, and tried again), so that whoever waits for it hears why.
// Written once per why: a pass that finds the same says nothing.
func (a *Agent) tellCannotYet(ctx context.Context, rc dynamic.ResourceInterface, u *unstructured.Unstructured, why error) error {
	msg := "node " + a.cfg.Node + " cannot make it yet: " + why.Error()
	return a.writeStatus(ctx, rc, u, "why it is not made yet", func(st *v1alpha1.SandboxStatus) bool {
		for _, c := range st.Conditions {
			if c.Type == v1alpha1.ConditionReady && c.Reason == v1alpha1.ReasonNodeCannotYet && c.Message == msg {
				return false
			}
		}
		st.Conditions = v1alpha1.SetCondition(st.Conditions, metav1.Condition{
			Type: v1alpha1.ConditionReady, Status: metav1.ConditionFalse, Reason: v1alpha1.ReasonNodeCannotYet, Message: msg,
		}, a.now())
		return true
	})
}

// refuse writes into u's status that its node would not make it, and why.
func (a *Agent) refuse(ctx context.Context, rc dynamic.ResourceInterface, u *unstructured.Unstructured, why error) error {
	msg := "node " + a.cfg.Node + " could not make it: " + why.Error()
	_, code := api.StatusOf(why)
	return a.writeStatus(ctx, rc, u, "why it was not made", func(st *v1alpha1.SandboxStatus) bool {
		st.State, st.Reason, st.Node = string(api.StateError), msg, a.cfg.Node
		st.Conditions = v1alpha1.SetCondition(st.Conditions, metav1.Condition{
			Type: v1alpha1.ConditionReady, Status: metav1.ConditionFalse, Reason: v1alpha1.RefusedReason(code), Message: msg,
		}, a.now())
		return true
	})
}

// writeStatus writes u's status as edit changes it, unless edit says there
// is nothing to write. A conflict (someone wrote it meanwhile: the next
// pass sees theirs) and an object gone are not failures.
func (a *Agent) writeStatus(ctx context.Context, rc dynamic.ResourceInterface, u *unstructured.Unstructured, what string, edit func(*v1alpha1.SandboxStatus) bool) error {
	var obj v1alpha1.Sandbox
	if err := v1alpha1.FromUnstructured(u, &obj); err != nil {
		return err
	}
	if !edit(&obj.Status) {
		return nil
	}
	st, err := v1alpha1.ToUnstructured(&obj.Status)
	if err != nil {
		return err
	}
	w := u.DeepCopy()
	w.Object["status"] = st.Object
	if _, err := rc.UpdateStatus(ctx, w, metav1.UpdateOptions{}); err != nil && !kerrors.IsConflict(err) && !kerrors.IsNotFound(err) {
		return fmt.Errorf("tell sandbox object %s %s: %w", u.GetName(), what, err)
	}
	return nil
}

// putSandbox makes the object of sb what it should be, writing only what
// differs: spec and labels through the object, status through its
// subresource (a create drops the status).
func (a *Agent) putSandbox(ctx context.Context, rc dynamic.ResourceInterface, name string, sb api.Sandbox, old *unstructured.Unstructured) error {
	var prev []metav1.Condition
	if old != nil {
		var cur v1alpha1.Sandbox
		if err := v1alpha1.FromUnstructured(old, &cur); err == nil {
			prev = cur.Status.Conditions
		}
	}
	o := sandboxObject(a.cfg.Node, a.cfg.Namespace, sb, prev, a.now())
	o.Name = name
	if old != nil {
		// what the apiserver's side asked for and sbxd does not know
		var cur v1alpha1.Sandbox
		if err := v1alpha1.FromUnstructured(old, &cur); err == nil {
			o.Spec.Image = cur.Spec.Image
		}
	}
	want, err := v1alpha1.ToUnstructured(o)
	if err != nil {
		return err
	}
	if old == nil {
		old, err = rc.Create(ctx, want, metav1.CreateOptions{})
		if kerrors.IsAlreadyExists(err) {
			// not among this node's, yet there: its label was changed
			// (kubectl label). It is taken back if it says it is sb's
			// mirror; a kubectl delete of it is seen only once labelled.
			if u, gerr := rc.Get(ctx, name, metav1.GetOptions{}); gerr == nil && statusID(u) == sb.ID {
				if u.GetLabels()[v1alpha1.LabelNode] != a.cfg.Node && boundElsewhere(u, a.cfg.Node) {
					// moved: another node's copy is the sandbox now
					return &movedAway{obj: u}
				}
				old, err = u, nil
			}
		}
		if err != nil {
			return fmt.Errorf("create sandbox object %s: %w", name, err)
		}
	}
	if !apierrors.Semantic.DeepEqual(old.Object["spec"], want.Object["spec"]) || !maps.Equal(old.GetLabels(), want.GetLabels()) ||
		!slices.Contains(old.GetFinalizers(), v1alpha1.Finalizer) {
		old.Object["spec"] = want.Object["spec"]
		old.SetLabels(want.GetLabels())
		if !slices.Contains(old.GetFinalizers(), v1alpha1.Finalizer) {
			old.SetFinalizers(append(old.GetFinalizers(), v1alpha1.Finalizer))
		}
		if old, err = rc.Update(ctx, old, metav1.UpdateOptions{}); err != nil {
			return fmt.Errorf("update sandbox object %s: %w", name, err)
		}
	}
	if !apierrors.Semantic.DeepEqual(old.Object["status"], want.Object["status"]) {
		old.Object["status"] = want.Object["status"]
		if _, err = rc.UpdateStatus(ctx, old, metav1.UpdateOptions{}); err != nil {
			return fmt.Errorf("update sandbox object %s status: %w", name, err)
		}
	}
	return nil
}

// movedAway is putSandbox's answer for a sandbox whose object is bound to
// another node: the controller moved it there (a stopped sandbox, pushed
// from here and adopted there), and this node's copy is not the sandbox.
type movedAway struct{ obj *unstructured.Unstructured }

func (e *movedAway) Error() string {
	return "sandbox object " + e.obj.GetName() + " is bound to another node"
}

// movedHere reports whether u was moved to node by the controller and
// node has not written it since: bound and labelled here, its status
// another node's.
func movedHere(u *unstructured.Unstructured, node string) bool {
	n, _, _ := unstructured.NestedString(u.Object, "spec", "nodeName")
	st, _, _ := unstructured.NestedString(u.Object, "status", "node")
	return n == node && u.GetLabels()[v1alpha1.LabelNode] == node && st != "" && st != node
}

// movingFor is how long a move's annotation holds: the copy adopted for a
// move a crash cut short is dropped once it has expired (the controller's
// movingFor, the same; it rebinds well within it).
const movingFor = 30 * time.Minute

// movingHere reports whether u's annotation says a move to node is under
// way ("NODE RFC3339-TIME [MOVE]", written by the controller), and is
// recent.
func movingHere(u *unstructured.Unstructured, node string, now time.Time) bool {
	f := strings.Fields(u.GetAnnotations()[v1alpha1.AnnotationMovingTo])
	if len(f) < 2 || f[0] != node {
		return false
	}
	t, err := time.Parse(time.RFC3339, f[1])
	return err == nil && now.Sub(t) < movingFor
}

// boundElsewhere reports whether u is bound (spec.nodeName) to a node other
// than node.
func boundElsewhere(u *unstructured.Unstructured, node string) bool {
	n, _, _ := unstructured.NestedString(u.Object, "spec", "nodeName")
	return n != "" && n != node
}

// dropMovedCopy deletes this node's copy of sb, whose object u is bound to
// another node, once that node has written the object's status (it holds
// the sandbox) and no move to this node is under way (a copy adopted here
// waits for the object to be bound here). Only a stopped copy goes: a
// running one (resumed here through this node's own API after the move)
// is left, and said.
func (a *Agent) dropMovedCopy(ctx context.Context, sb api.Sandbox, u *unstructured.Unstructured) error {
	n, _, _ := unstructured.NestedString(u.Object, "spec", "nodeName")
	st, _, _ := unstructured.NestedString(u.Object, "status", "node")
	if st != n || movingHere(u, a.cfg.Node, a.now()) {
		return nil // the move is under way: not this pass's to judge
	}
	if sb.State != api.StateStopped {
		a.log.Warn("fleet: a sandbox here is another node's now, and runs here too: left alone", "sandbox", sb.ID, "object", u.GetName(), "node", n, "state", sb.State)
		return nil
	}
	if _, err := a.cfg.Source.Delete(ctx, sb.ID, false); err != nil && !errors.Is(err, api.ErrNotFound) {
		return fmt.Errorf("delete sandbox %s, which moved to node %s: %w", sb.ID, n, err)
	}
	a.log.Info("fleet: deleted the copy of a sandbox that moved to another node", "sandbox", sb.ID, "node", n)
	return nil
}

// sandboxObject is the Sandbox object of sb on node; prev are the
// conditions it had, whose transition times are kept while they hold.
func sandboxObject(node, namespace string, sb api.Sandbox, prev []metav1.Condition, now time.Time) *v1alpha1.Sandbox {
	mode := v1alpha1.OperatingModeRunning
	if sb.State == api.StateStopped || sb.State == api.StateStopping {
		mode = v1alpha1.OperatingModeSuspended
	}
	var cpus string
	if sb.CPUs > 0 {
		cpus = strconv.FormatFloat(sb.CPUs, 'f', -1, 64)
	}
	created := metav1.NewTime(sb.CreatedAt.Truncate(time.Second))
	ready := metav1.Condition{Type: v1alpha1.ConditionReady, Status: metav1.ConditionFalse, Reason: v1alpha1.ReasonSandboxNotReady, Message: "sandbox is " + string(sb.State)}
	if sb.State == api.StateReady {
		ready.Status, ready.Reason = metav1.ConditionTrue, v1alpha1.ReasonSandboxReady
	}
	if sb.Reason != "" {
		ready.Message += ": " + sb.Reason
	}
	susp := metav1.Condition{Type: v1alpha1.ConditionSuspended, Status: metav1.ConditionFalse, Reason: v1alpha1.ReasonSandboxRunning}
	if sb.State == api.StateStopped {
		susp.Status, susp.Reason, susp.Message = metav1.ConditionTrue, v1alpha1.ReasonSandboxStopped, "stopped with its memory; sbx resume "+sb.ID
	}
	conds := v1alpha1.SetCondition(v1alpha1.SetCondition(prev, ready, now), susp, now)
	if sb.Meta[v1alpha1.MetaObject] != "" { // asked for through the apiserver, and placed
		conds = v1alpha1.SetCondition(conds, metav1.Condition{Type: v1alpha1.ConditionPlaced, Status: metav1.ConditionTrue,
			Reason: v1alpha1.ReasonMadeOnNode, Message: "made on node " + node}, now)
	}
	return &v1alpha1.Sandbox{
		TypeMeta: metav1.TypeMeta{APIVersion: v1alpha1.APIVersion, Kind: v1alpha1.KindSandbox},
		ObjectMeta: metav1.ObjectMeta{
			Name: v1alpha1.ObjectName(sb.ID), Namespace: namespace,
			Labels:     map[string]string{v1alpha1.LabelNode: node, v1alpha1.LabelSandboxID: v1alpha1.ObjectName(sb.ID)},
			Finalizers: []string{v1alpha1.Finalizer},
		},
		Spec: v1alpha1.SandboxSpec{
			Name: sb.Name, Template: sb.Template, TemplateVersion: sb.TemplateVersion, NodeName: node,
			OperatingMode: mode, TTL: ttlString(sb.TTL), Persistent: sb.Persistent, CPUs: cpus, MemoryBytes: sb.Memory,
			DiskBytes: sb.DiskLimit, Network: sb.Network, Parent: sb.Parent, From: sb.From, Meta: sb.Meta,
		},
		Status: v1alpha1.SandboxStatus{
			ID: sb.ID, State: string(sb.State), Reason: sb.Reason, Node: node, CreatedAt: &created,
			MemoryRestored: sb.MemoryRestored, ResumeReason: sb.ResumeReason, Agent: sb.Agent, Conditions: conds,
		},
	}
}

// ttlString is a ttl as the Sandbox resource spells it: "" when none.
func ttlString(d api.Duration) string {
	if d == 0 {
		return ""
	}
	return d.String()
}
