package controller

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"

	"sbx.dev/sbx/api"
	"sbx.dev/sbx/internal/fleet/placement"
	"sbx.dev/sbx/internal/fleet/v1alpha1"
)

// A stopped sandbox moves between nodes through the fleet's registry
// (Config.MoveRepository): its node pushes its image and record, another
// node where its memory restores adopts a stopped copy, and the object is
// rebound there. The rebind, one write preconditioned on the object's
// resourceVersion, is the instant the sandbox moves: before it, the old
// node's copy is the sandbox; after it, the new node's. The copy left
// behind is deleted, by the controller at once, or by its node's agent
// once the object says the other node holds it (agent.dropMovedCopy).

// moveAsk bounds the nodes' part of a move: the push and the adopt of a
// large image.
const moveAsk = 10 * time.Minute

// movingFor is how long the annotation of a move holds: a copy adopted for
// a move that a crash cut short is dropped by its node's agent after it
// (agent.movingFor, the same).
const movingFor = 30 * time.Minute

// markHolds is how long after its mark a move may still rebind: the
// target's agent keeps the adopted copy for movingFor by its own clock, so
// a rebind later than this might bind the object to a copy already gone
// (the margin is for the two clocks' skew).
const markHolds = movingFor - 10*time.Minute

// nodeCall sends method path to node n with in (JSON, if not nil) and
// decodes a success into out (if not nil). An error answer is the error
// the node said, with its kind.
func (c *Controller) nodeCall(ctx context.Context, n *node, method, path string, in, out any) error {
	target, transport, err := c.nodeTarget(n.typed.Status.Address, 0)
	if err != nil {
		return api.Errorf(api.ErrUnavailable, "node %s: %v", n.obj.GetName(), err)
	}
	u := *target
	u.Path, u.RawQuery, _ = strings.Cut(path, "?")
	var body io.Reader
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			return err
		}
		body = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, u.String(), body)
	if err != nil {
		return err
	}
	if in != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	c.authorizeTo(req.Header, n)
	resp, err := (&http.Client{Transport: transport}).Do(req)
	if err != nil {
		return api.Errorf(api.ErrUnavailable, "node %s did not answer: %v", n.obj.GetName(), err)
	}
	defer resp.Body.Close()
	if resp.StatusCode >= 300 {
		var eb api.ErrorBody
		if json.NewDecoder(io.LimitReader(resp.Body, 1<<16)).Decode(&eb) == nil && eb.Error != nil {
			return fmt.Errorf("node %s: %w", n.obj.GetName(), eb.Err())
		}
		return api.Errorf(api.ErrUnavailable, "node %s answered %s", n.obj.GetName(), resp.Status)
	}
	if out == nil {
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<16))
		return nil
	}
	return json.NewDecoder(io.LimitReader(resp.Body, 64<<20)).Decode(out)
}

// sandboxObject reads the Sandbox object of sbx id.
func (c *Controller) sandboxObject(ctx context.Context, id string) (*unstructured.Unstructured, error) {
	l, err := c.dyn.Resource(v1alpha1.SandboxesResource).Namespace(c.cfg.Namespace).List(ctx,
		metav1.ListOptions{LabelSelector: v1alpha1.LabelSandboxID + "=" + v1alpha1.ObjectName(id)})
	if err != nil {
		return nil, unavailable(fmt.Errorf("list sandboxes: %w", err))
	}
	for i := range l.Items {
		if statusID(&l.Items[i]) == id {
			return &l.Items[i], nil
		}
	}
	return nil, api.Errorf(api.ErrNotFound, "sandbox %s has no object in the fleet", id)
}

func statusID(u *unstructured.Unstructured) string {
	id, _, _ := unstructured.NestedString(u.Object, "status", "id")
	return id
}

// errNoTarget is a move's error when no other node can take the sandbox
// with its memory.
var errNoTarget = errors.New("no other node can take it with its memory")

// move moves stopped sandbox id off node from, to the best other node
// where its memory restores and that has room, and returns that node:
//
//  1. the object says where it goes (sbx.dev/moving-to), so that node's
//     agent keeps the copy it is about to get;
//  2. from pushes the image and record to the fleet's registry;
//  3. the target adopts it: a stopped copy, not the sandbox yet;
//  4. the object is rebound to the target (spec.nodeName, its label, the
//     annotation dropped), preconditioned on its resourceVersion;
//  5. from's copy is deleted.
//
// Cut before 4 (a crash, a refusal), the sandbox is from's still and the
// target's copy, if any, is dropped by its agent once the annotation has
// expired. Cut after 4, from's copy is dropped by from's agent.
func (c *Controller) move(ctx context.Context, id string, from *node) (*node, error) {
	if c.cfg.MoveRepository == "" {
		return nil, api.Errorf(api.ErrUnavailable, "move %s: the fleet has no registry to move sandboxes through (sbx-controller --move-repository)", id)
	}
	u, err := c.sandboxObject(ctx, id)
	if err != nil {
		return nil, err
	}
	var obj v1alpha1.Sandbox
	if err := v1alpha1.FromUnstructured(u, &obj); err != nil {
		return nil, err
	}
	if obj.Spec.NodeName != from.obj.GetName() {
		return nil, api.Errorf(api.ErrConflict, "move %s: its object is bound to node %q, not %s", id, obj.Spec.NodeName, from.obj.GetName())
	}
	ns, err := c.nodes(ctx)
	if err != nil {
		return nil, unavailable(err)
	}
	notReady := map[string]string{}
	byName := map[string]*node{}
	for _, n := range ns {
		byName[n.obj.GetName()] = n
		if !n.ready {
			notReady[n.obj.GetName()] = "not ready: " + n.reason
		}
	}
	// its node's own word on it now, not the object's, which lags a resume
	// and a stop by a pass of its agent: the agent build its image was
	// taken on (placed by), and whether its stop pushed it already
	mctx, cancel := context.WithTimeout(ctx, moveAsk)
	defer cancel()
	var now api.Sandbox
	fresh := c.nodeCall(mctx, from, http.MethodGet, "/v1/sandboxes/"+id, nil, &now) == nil && now.ID == id && now.State == api.StateStopped
	agent := obj.Status.Agent
	if fresh {
		agent = now.Agent
	}
	req, _ := placement.RequestOf(&obj, c.cfg.Defaults)
	fs := from.typed.Status
	req.Image = &v1alpha1.SandboxImage{Memory: true, RequireMemory: true, RunscSHA256: fs.RunscSHA256,
		CPUFeatures: fs.CPUFeatures, CacheLineBytes: fs.CacheLineBytes, Agent: agent}
	best, rejected, err := c.place.Target(ctx, &obj, req, notReady)
	if err != nil {
		return nil, unavailable(err)
	}
	if best == nil {
		return nil, fmt.Errorf("move %s off node %s: %w: %s", id, from.obj.GetName(), errNoTarget, placement.Why(rejected))
	}
	to := byName[best.Name]
	// 1: the move's intent, on the object. It is this move's own: a move
	// begun meanwhile (another controller, a second resume) writes its own,
	// and this one's rebind is then refused (the target's agent drops a
	// copy no mark names).
	markedAt := c.cfg.Now().UTC().Truncate(time.Second)
	mark := to.obj.GetName() + " " + markedAt.Format(time.RFC3339) + " " + randomHex(4)
	if _, err := c.updateObject(ctx, id, func(u *unstructured.Unstructured) error {
		if n, _, _ := unstructured.NestedString(u.Object, "spec", "nodeName"); n != from.obj.GetName() {
			return api.Errorf(api.ErrConflict, "move %s: its object was bound to node %q meanwhile", id, n)
		}
		if u.GetDeletionTimestamp() != nil {
			return api.Errorf(api.ErrConflict, "move %s: its object is being deleted", id)
		}
		ann := u.GetAnnotations()
		if ann == nil {
			ann = map[string]string{}
		}
		ann[v1alpha1.AnnotationMovingTo] = mark
		u.SetAnnotations(ann)
		return nil
	}); err != nil {
		return nil, fmt.Errorf("move %s: mark its object: %w", id, err)
	}
	// 2: pushed by its node, unless its stop pushed it already (sbxd
	// --fleet-registry), as its node said above
	var pushed api.PushResult
	if fresh && strings.Contains(now.Meta[api.MetaImageRef], "@sha256:") {
		pushed.Ref = now.Meta[api.MetaImageRef]
	} else {
		ref := c.cfg.MoveRepository + ":" + id + "-" + randomHex(4)
		if err := c.nodeCall(mctx, from, http.MethodPost, "/v1/sandboxes/"+id+"/push", api.PushRequest{Ref: ref}, &pushed); err != nil {
			return nil, fmt.Errorf("move %s: push its image from node %s: %w", id, from.obj.GetName(), err)
		}
	}
	// 3: a copy adopted by the target
	var adopted api.Sandbox
	err = c.nodeCall(mctx, to, http.MethodPost, "/v1/sandboxes/adopt", api.AdoptRequest{Ref: pushed.Ref, ID: id}, &adopted)
	if errors.Is(err, api.ErrConflict) && c.dropLeftCopy(mctx, id, from.obj.GetName(), to, mark) {
		err = c.nodeCall(mctx, to, http.MethodPost, "/v1/sandboxes/adopt", api.AdoptRequest{Ref: pushed.Ref, ID: id}, &adopted)
	}
	if err != nil {
		return nil, fmt.Errorf("move %s: node %s adopting it: %w", id, to.obj.GetName(), err)
	}
	// the node's word is checked: the object is bound to what it says it
	// holds, and the old copy is deleted on it
	if adopted.ID != id || adopted.State != api.StateStopped {
		return nil, api.Errorf(api.ErrUnavailable, "move %s: node %s adopted sandbox %q (%s) from %s, not a stopped %s", id, to.obj.GetName(), adopted.ID, adopted.State, pushed.Ref, id)
	}
	// 4: the rebind, the instant it moves
	if err := c.rebind(ctx, id, from.obj.GetName(), to.obj.GetName(), mark, markedAt); err != nil {
		return nil, err
	}
	c.log.Info("fleet: moved a stopped sandbox", "sandbox", id, "from", from.obj.GetName(), "to", to.obj.GetName(), "ref", pushed.Ref, "bytes", pushed.Bytes)
	// 5: the copy left behind (its agent drops it otherwise)
	if err := c.nodeCall(ctx, from, http.MethodDelete, "/v1/sandboxes/"+id, nil, nil); err != nil && !errors.Is(err, api.ErrNotFound) {
		c.log.Warn("fleet: the copy a move left could not be deleted; its node's agent drops it", "sandbox", id, "node", from.obj.GetName(), "err", err)
	}
	return to, nil
}

// boundTo is the node sandbox id's object is bound to, "" when it cannot
// be read.
func (c *Controller) boundTo(ctx context.Context, id string) string {
	u, err := c.sandboxObject(ctx, id)
	if err != nil {
		return ""
	}
	n, _, _ := unstructured.NestedString(u.Object, "spec", "nodeName")
	return n
}

// dropLeftCopy deletes the stopped copy of sandbox id on to that an
// earlier move, cut before its rebind, left there, so that this move's
// adopt is not refused for as long as that copy's mark holds. It is no
// sandbox: the object is bound to from, under this move's mark (a move
// begun since has its own, and this one's rebind is refused anyway). A
// copy that runs (resumed through to's own API) is left. It reports
// whether it deleted one.
func (c *Controller) dropLeftCopy(ctx context.Context, id, from string, to *node, mark string) bool {
	var left api.Sandbox
	if err := c.nodeCall(ctx, to, http.MethodGet, "/v1/sandboxes/"+id, nil, &left); err != nil ||
		left.ID != id || left.State != api.StateStopped || left.Meta[api.MetaAdopted] == "" {
		return false
	}
	u, err := c.sandboxObject(ctx, id)
	if err != nil {
		return false
	}
	if n, _, _ := unstructured.NestedString(u.Object, "spec", "nodeName"); n != from || u.GetAnnotations()[v1alpha1.AnnotationMovingTo] != mark {
		return false
	}
	if err := c.nodeCall(ctx, to, http.MethodDelete, "/v1/sandboxes/"+id, nil, nil); err != nil && !errors.Is(err, api.ErrNotFound) {
		return false
	}
	c.log.Info("fleet: deleted the copy a cut move left on its target", "sandbox", id, "node", to.obj.GetName(), "ref", left.Meta[api.MetaAdopted])
	return true
}

// updateObject changes sandbox id's object with change and writes it,
// preconditioned on the resourceVersion it was read at; a Conflict (an
// agent's write meanwhile) reads it again, a few times. An error of
// change is returned as it is, and nothing is written.
func (c *Controller) updateObject(ctx context.Context, id string, change func(*unstructured.Unstructured) error) (*unstructured.Unstructured, error) {
	res := c.dyn.Resource(v1alpha1.SandboxesResource).Namespace(c.cfg.Namespace)
	for try := 0; ; try++ {
		u, err := c.sandboxObject(ctx, id)
		if err != nil {
			return nil, err
		}
		if err := change(u); err != nil {
			return nil, err
		}
		out, err := res.Update(ctx, u, metav1.UpdateOptions{})
		if apierrors.IsConflict(err) && try < 5 {
			continue
		}
		if err != nil {
			return nil, unavailable(err)
		}
		return out, nil
	}
}

// rebind binds sandbox id's object, bound to from, to to: spec.nodeName
// and its node label, the move's annotation dropped; and its status says
// to's node at once, so requests go there before to's agent writes it.
// It holds only while the object bears this move's mark, made at
// markedAt, and not for longer than markHolds: to's agent keeps the copy
// only while a recent mark names it.
func (c *Controller) rebind(ctx context.Context, id, from, to, mark string, markedAt time.Time) error {
	out, err := c.updateObject(ctx, id, func(u *unstructured.Unstructured) error {
		if n, _, _ := unstructured.NestedString(u.Object, "spec", "nodeName"); n != from {
			return api.Errorf(api.ErrConflict, "move %s: its object was bound to node %q meanwhile", id, n)
		}
		if u.GetDeletionTimestamp() != nil {
			return api.Errorf(api.ErrConflict, "move %s: its object is being deleted", id)
		}
		if got := u.GetAnnotations()[v1alpha1.AnnotationMovingTo]; got != mark {
			return api.Errorf(api.ErrConflict, "move %s: another move began meanwhile (%s %q)", id, v1alpha1.AnnotationMovingTo, got)
		}
		if age := c.cfg.Now().Sub(markedAt); age >= markHolds {
			return api.Errorf(api.ErrUnavailable, "move %s: it took %s, and node %s may have dropped its copy; it stays on node %s", id, age.Round(time.Second), to, from)
		}
		_ = unstructured.SetNestedField(u.Object, to, "spec", "nodeName")
		labels := u.GetLabels()
		if labels == nil {
			labels = map[string]string{}
		}
		labels[v1alpha1.LabelNode] = to
		u.SetLabels(labels)
		ann := u.GetAnnotations()
		delete(ann, v1alpha1.AnnotationMovingTo)
		u.SetAnnotations(ann)
		return nil
	})
	if err != nil {
		return fmt.Errorf("move %s: bind its object to node %s: %w", id, to, err)
	}
	// the status lags until to's agent writes it: say the node now (best
	// effort; the agent's next pass writes it whole)
	res := c.dyn.Resource(v1alpha1.SandboxesResource).Namespace(c.cfg.Namespace)
	patch, _ := json.Marshal(map[string]any{"status": map[string]any{"node": to}})
	if _, err := res.Patch(ctx, out.GetName(), types.MergePatchType, patch, metav1.PatchOptions{}, "status"); err != nil {
		c.log.Info("fleet: a moved sandbox's status names its old node until its new node writes it", "sandbox", id, "err", err)
	}
	return nil
}

// resumeRecheck is how often a resume that requires its memory looks
// again for a node where it restores.
const resumeRecheck = 2 * time.Second

// adoptElsewhere moves stopped sandbox id off node from, which is down,
// through the stop image its node pushed to the fleet's registry (the
// object's meta names it, api.MetaImageRef, written while the sandbox was
// stopped on that image): another node where its memory restores adopts
// it, and the object is rebound there (move's steps 1, 3 and 4). From's
// copy is dropped by its agent once it is back. A node where the memory
// restores is preferred; with requireMemory it is waited for (up to
// resumeWait), telling waiting why each time the why changes, and
// without, a node with room that cannot restore it adopts the disk alone,
// and the resume boots from it, saying why.
func (c *Controller) adoptElsewhere(ctx context.Context, id, from string, requireMemory bool, waiting func(why string)) (*node, error) {
	u, err := c.sandboxObject(ctx, id)
	if err != nil {
		return nil, err
	}
	var obj v1alpha1.Sandbox
	if err := v1alpha1.FromUnstructured(u, &obj); err != nil {
		return nil, err
	}
	ref := obj.Spec.Meta[api.MetaImageRef]
	switch {
	case obj.Spec.OperatingMode != v1alpha1.OperatingModeSuspended:
		return nil, api.Errorf(api.ErrUnavailable, "it was %s when its node was last heard of: its memory is there", strings.ToLower(obj.Spec.OperatingMode))
	case ref == "" && obj.Spec.Meta[api.MetaImagePending] != "":
		return nil, api.Errorf(api.ErrUnavailable, "its stop image never reached the fleet's registry (%s)", obj.Spec.Meta[api.MetaImagePending])
	case ref == "":
		return nil, api.Errorf(api.ErrUnavailable, "its stop image is not in the fleet's registry (its node pushes none: sbxd --fleet-registry)")
	case obj.Spec.NodeName != from:
		return nil, api.Errorf(api.ErrConflict, "its object is bound to node %q, not %s", obj.Spec.NodeName, from)
	}
	ns, err := c.nodes(ctx)
	if err != nil {
		return nil, unavailable(err)
	}
	var dead *node
	notReady := map[string]string{}
	byName := map[string]*node{}
	for _, n := range ns {
		byName[n.obj.GetName()] = n
		if !n.ready {
			notReady[n.obj.GetName()] = "not ready: " + n.reason
		}
		if n.obj.GetName() == from {
			dead = n
		}
	}
	if dead == nil {
		return nil, api.Errorf(api.ErrUnavailable, "node %q, where it was stopped, is not in the fleet: what its memory needs is not known", from)
	}
	req, _ := placement.RequestOf(&obj, c.cfg.Defaults)
	fs := dead.typed.Status
	req.Image = &v1alpha1.SandboxImage{Ref: ref, Memory: true, RequireMemory: true, RunscSHA256: fs.RunscSHA256,
		CPUFeatures: fs.CPUFeatures, CacheLineBytes: fs.CacheLineBytes, Agent: obj.Status.Agent}
	// a node where the memory restores; with the memory required, waited
	// for (its Lease back, a compatible node joining, room freed); without,
	// at once any node with room, which boots it from its disk
	best, rejected, err := c.place.Target(ctx, &obj, req, notReady)
	for waited := time.Duration(0); err == nil && best == nil && requireMemory && waited < c.resumeWait; waited += resumeRecheck {
		why := placement.Why(rejected)
		if waited == 0 {
			c.log.Info("fleet: a resume waits for a node where its memory restores", "sandbox", id, "why", why)
		}
		if waiting != nil {
			waiting(fmt.Sprintf("waiting up to %s for a node where its memory restores: %s", (c.resumeWait - waited).Round(time.Second), why))
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(resumeRecheck):
		}
		if ns, err = c.nodes(ctx); err != nil {
			return nil, unavailable(err)
		}
		clear(notReady)
		for _, n := range ns {
			byName[n.obj.GetName()] = n
			if !n.ready {
				notReady[n.obj.GetName()] = "not ready: " + n.reason
			}
		}
		best, rejected, err = c.place.Target(ctx, &obj, req, notReady)
	}
	if err != nil {
		return nil, unavailable(err)
	}
	withoutMemory := false
	if best == nil && !requireMemory {
		anyNode := req
		img := *req.Image
		img.RequireMemory = false
		anyNode.Image = &img
		if best, rejected, err = c.place.Target(ctx, &obj, anyNode, notReady); err != nil {
			return nil, unavailable(err)
		}
		withoutMemory = best != nil
	}
	if best == nil {
		if requireMemory {
			return nil, fmt.Errorf("%w: waited %s for one (%s)", errNoTarget, c.resumeWait, placement.Why(rejected))
		}
		return nil, fmt.Errorf("%w: %s", errNoTarget, placement.Why(rejected))
	}
	to := byName[best.Name]
	markedAt := c.cfg.Now().UTC().Truncate(time.Second)
	mark := to.obj.GetName() + " " + markedAt.Format(time.RFC3339) + " " + randomHex(4)
	if _, err := c.updateObject(ctx, id, func(u *unstructured.Unstructured) error {
		if n, _, _ := unstructured.NestedString(u.Object, "spec", "nodeName"); n != from {
			return api.Errorf(api.ErrConflict, "its object was bound to node %q meanwhile", n)
		}
		if u.GetDeletionTimestamp() != nil {
			return api.Errorf(api.ErrConflict, "its object is being deleted")
		}
		ann := u.GetAnnotations()
		if ann == nil {
			ann = map[string]string{}
		}
		ann[v1alpha1.AnnotationMovingTo] = mark
		u.SetAnnotations(ann)
		return nil
	}); err != nil {
		return nil, fmt.Errorf("mark its object: %w", err)
	}
	mctx, cancel := context.WithTimeout(ctx, moveAsk)
	defer cancel()
	var adopted api.Sandbox
	// the ref is the object's word, which a kubectl user can write: the
	// node adopts it only if it holds this sandbox
	areq := api.AdoptRequest{Ref: ref, ID: id, WithoutMemory: withoutMemory}
	err = c.nodeCall(mctx, to, http.MethodPost, "/v1/sandboxes/adopt", areq, &adopted)
	if errors.Is(err, api.ErrConflict) && c.dropLeftCopy(mctx, id, from, to, mark) {
		err = c.nodeCall(mctx, to, http.MethodPost, "/v1/sandboxes/adopt", areq, &adopted)
	}
	if err != nil {
		return nil, fmt.Errorf("node %s adopting it from the registry: %w", to.obj.GetName(), err)
	}
	if adopted.ID != id || adopted.State != api.StateStopped {
		return nil, api.Errorf(api.ErrUnavailable, "node %s adopted sandbox %q (%s) from %s, not a stopped %s", to.obj.GetName(), adopted.ID, adopted.State, ref, id)
	}
	if err := c.rebind(ctx, id, from, to.obj.GetName(), mark, markedAt); err != nil {
		return nil, err
	}
	c.log.Info("fleet: a stopped sandbox of a node that is down moved through the registry", "sandbox", id, "from", from, "to", to.obj.GetName(), "ref", ref)
	return to, nil
}

// resume resumes a sandbox through its node; a stopped one whose node is
// cordoned is moved first, with its memory, to a node that can take it
// (staying where it is if none can).
func (c *Controller) resume(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(io.LimitReader(r.Body, maxPullBody+1))
	if err != nil || len(body) > maxPullBody {
		writeError(w, api.Errorf(api.ErrInvalid, "resume: the request is unreadable or larger than %d bytes", maxPullBody))
		return
	}
	r.Body, r.ContentLength = io.NopCloser(bytes.NewReader(body)), int64(len(body))
	var rr api.ResumeRequest
	if len(bytes.TrimSpace(body)) > 0 && json.Unmarshal(body, &rr) != nil {
		writeError(w, api.Errorf(api.ErrInvalid, "resume: the request is no JSON resume request"))
		return
	}
	ref := r.PathValue("id")
	sb, n, err := c.sandboxNode(r, ref)
	if err != nil && sb.ID != "" && errors.Is(err, api.ErrUnavailable) {
		// its node is down: another adopts it, if its stop image is in
		// the fleet's registry
		to, aerr := c.adoptElsewhere(context.WithoutCancel(r.Context()), sb.ID, sb.Node, rr.RequireMemory, progressOf(w, r))
		if aerr != nil {
			writeError(w, api.Errorf(api.ErrUnavailable, "%v; and it cannot resume elsewhere: %v", err, aerr))
			return
		}
		n, err = to, nil
	}
	if err != nil {
		writeError(w, err)
		return
	}
	if sb.State == api.StateStopped && n.typed.Spec.Unschedulable && c.cfg.MoveRepository != "" {
		to, err := c.move(context.WithoutCancel(r.Context()), sb.ID, n)
		switch {
		case err == nil:
			n = to
		case errors.Is(err, errNoTarget):
			c.log.Info("fleet: a resume on a cordoned node stays there", "sandbox", sb.ID, "node", n.obj.GetName(), "why", err)
		default:
			writeError(w, err)
			return
		}
	}
	c.forward(w, r, n, "/v1/sandboxes/"+sb.ID+"/resume", "which holds "+sb.ID)
}

// drain cordons a node and moves each of its sandboxes to other nodes: a
// ready one is stopped with its memory, moved and resumed; a stopped one
// is moved and stays stopped. One that cannot move stays, and says why.
func (c *Controller) drain(w http.ResponseWriter, r *http.Request) {
	n, err := c.findNode(r)
	if err != nil {
		writeError(w, err)
		return
	}
	if !n.ready {
		writeError(w, api.Errorf(api.ErrUnavailable, "drain %s: the node is down (%s): its sandboxes cannot be pushed from it", n.obj.GetName(), n.reason))
		return
	}
	name := n.obj.GetName()
	patch, _ := json.Marshal(map[string]any{"spec": map[string]any{"unschedulable": true}})
	if _, err := c.dyn.Resource(v1alpha1.SandboxNodesResource).Patch(r.Context(), name, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		writeError(w, unavailable(fmt.Errorf("drain %s: cordon it: %w", name, err)))
		return
	}
	n.typed.Spec.Unschedulable = true
	all, err := c.sandboxes(r)
	if err != nil {
		writeError(w, err)
		return
	}
	out := api.DrainResult{Node: name, Moves: []api.MoveResult{}}
	ctx := context.WithoutCancel(r.Context()) // a move a client left is finished, not cut
	for _, sb := range all {
		if sb.Node != name || sb.ID == "" || (sb.State != api.StateReady && sb.State != api.StateStopped) {
			continue
		}
		mv := api.MoveResult{ID: sb.ID, From: name}
		wasReady := sb.State == api.StateReady
		if wasReady {
			var stopped api.Sandbox
			if err := c.nodeCall(ctx, n, http.MethodPost, "/v1/sandboxes/"+sb.ID+"/stop?wait=true", nil, &stopped); err != nil {
				mv.Error = "stop it: " + err.Error()
				out.Moves = append(out.Moves, mv)
				continue
			}
		}
		to, err := c.move(ctx, sb.ID, n)
		if err != nil {
			mv.Error = err.Error()
			if at := c.boundTo(ctx, sb.ID); at != name {
				// the rebind was written and its answer lost: the
				// sandbox is at's, and not resumed here
				mv.Error += fmt.Sprintf("; its object is bound to node %q now: it stays stopped", at)
				wasReady = false
			}
			if wasReady { // back as it was, where it was
				var back api.Sandbox
				if rerr := c.nodeCall(ctx, n, http.MethodPost, "/v1/sandboxes/"+sb.ID+"/resume", nil, &back); rerr != nil {
					mv.Error += "; and resuming it here again: " + rerr.Error()
				}
			}
			out.Moves = append(out.Moves, mv)
			continue
		}
		mv.To, mv.State = to.obj.GetName(), api.StateStopped
		if wasReady {
			var back api.Sandbox
			if err := c.nodeCall(ctx, to, http.MethodPost, "/v1/sandboxes/"+sb.ID+"/resume", nil, &back); err != nil {
				mv.Error = "moved, stopped; resuming it on " + mv.To + ": " + err.Error()
			} else {
				mv.State = back.State
			}
		}
		c.log.Info("fleet: drained a sandbox", "sandbox", sb.ID, "from", name, "to", mv.To, "state", mv.State, "err", mv.Error)
		out.Moves = append(out.Moves, mv)
	}
	writeJSON(w, http.StatusOK, out)
}

// maxProgress bounds the 102 answers one request is sent.
const maxProgress = 8

// progressOf is how a request that asked for progress (api.HeaderProgress
// "102") hears why it waits: an informational 102 answer carrying the why
// in api.HeaderWaiting, each time it changes (the time left aside), at
// most maxProgress of them. A request that did not ask hears nothing
// (nil): some HTTP stacks take a 102 for the answer.
func progressOf(w http.ResponseWriter, r *http.Request) func(why string) {
	if r.Header.Get(api.HeaderProgress) != "102" {
		return nil
	}
	var last string
	sent := 0
	return func(why string) {
		// the why holds what nodes publish: no control (C0, C1) or format
		// (bidi) characters, valid UTF-8, cut on a character's edge
		why = strings.Map(func(r rune) rune {
			if unicode.IsControl(r) || unicode.Is(unicode.Cf, r) || r == utf8.RuneError {
				return ' '
			}
			return r
		}, strings.ToValidUTF8(why, " "))
		if len(why) > 2000 {
			why = strings.ToValidUTF8(why[:2000], "") + "..."
		}
		// "waiting up to 1m58s for ...: WHY": the same why, less time, is
		// no news
		_, gist, _ := strings.Cut(why, " for ")
		if gist == last || sent >= maxProgress {
			return
		}
		last, sent = gist, sent+1
		w.Header().Set(api.HeaderWaiting, why)
		w.WriteHeader(http.StatusProcessing)
		w.Header().Del(api.HeaderWaiting)
	}
}
