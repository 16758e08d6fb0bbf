package controller

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"regexp"
	"slices"
	"strings"
	"sync"
	"time"

	"sbx.dev/sbx/api"
	"sbx.dev/sbx/internal/fleet/placement"
	"sbx.dev/sbx/internal/fleet/v1alpha1"
)

// A fork of several children spreads across the nodes that can take them
// (placement.Spread: forks of one parent go round the nodes, fewest
// first), when the fleet has a registry to move the parent's state
// through. The parent's node snapshots it once (with its memory for a
// memory fork), pushes the snapshot if any child goes elsewhere, each
// other node pulls it, and every child is a create from it recorded as a
// fork of the parent (CreateRequest.ForkOf). The snapshots go once the
// children are made. A fork that stays on one node is that node's own
// (one capture, its children restored side by side).

// forkPerNode bounds the creates in flight on one node during a fork.
const forkPerNode = 2

// forkUndoAsk bounds each delete of a fork's end (a child undone, a
// snapshot dropped): a node that hangs on one leaves it, said so, rather
// than the fork's client waiting for good.
var forkUndoAsk = time.Minute

// undoCall is c.nodeCall of a fork's end, bounded by forkUndoAsk.
func (c *Controller) undoCall(ctx context.Context, n *node, path string) error {
	ctx, cancel := context.WithTimeout(ctx, forkUndoAsk)
	defer cancel()
	return c.nodeCall(ctx, n, http.MethodDelete, path, nil, nil)
}

// fork places a fork request: spread over the nodes, or on to the
// parent's node.
func (c *Controller) fork(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(io.LimitReader(r.Body, maxPullBody+1))
	if err != nil || len(body) > maxPullBody {
		writeError(w, api.Errorf(api.ErrInvalid, "fork: the request is unreadable or larger than %d bytes", maxPullBody))
		return
	}
	r.Body, r.ContentLength = io.NopCloser(bytes.NewReader(body)), int64(len(body))
	sb, pn, err := c.sandboxNode(r, r.PathValue("id"))
	if err != nil {
		writeError(w, err)
		return
	}
	var req api.ForkRequest
	n := 0
	if json.Unmarshal(body, &req) == nil && req.Validate() == nil {
		n = max(req.Count, 1)
	}
	// what only the parent's node does: one child, a perturbation a
	// create from a memory snapshot does not take (its CPUs, a shape),
	// a request the node is to judge, no registry to move it through
	var plan []string
	if n > 1 && req.CPUs == 0 && req.Shape == nil && sb.State != api.StateReady && c.cfg.MoveRepository != "" {
		// the object lags its node by a pass of its agent (a sandbox just
		// made, as flake-rate's root is): the node's word
		var now api.Sandbox
		if err := c.nodeCall(r.Context(), pn, http.MethodGet, "/v1/sandboxes/"+sb.ID, nil, &now); err == nil && now.ID == sb.ID {
			sb.State = now.State
		}
	}
	if n > 1 && req.CPUs == 0 && req.Shape == nil && sb.State == api.StateReady && c.cfg.MoveRepository != "" {
		plan, err = c.forkPlan(r.Context(), sb, pn, req.Memory, n)
		if err != nil {
			c.log.Warn("fleet: a fork's spread could not be planned; its parent's node forks it", "sandbox", sb.ID, "err", err)
		}
	}
	if len(plan) < n || !slices.ContainsFunc(plan, func(node string) bool { return node != pn.obj.GetName() }) {
		c.forward(w, r, pn, "/v1/sandboxes/"+sb.ID+"/fork", "which holds "+sb.ID)
		return
	}
	c.spreadFork(context.WithoutCancel(r.Context()), newSSE(w), sb, pn, req, plan)
}

// forkPlan is the node of each of n forks of sb, on pn: placement's spread
// over the ready nodes that hold sb's template version, and for a memory
// fork restore pn's memory.
func (c *Controller) forkPlan(ctx context.Context, sb api.Sandbox, pn *node, memory bool, n int) ([]string, error) {
	u, err := c.sandboxObject(ctx, sb.ID)
	if err != nil {
		return nil, err
	}
	var obj v1alpha1.Sandbox
	if err := v1alpha1.FromUnstructured(u, &obj); err != nil {
		return nil, err
	}
	ns, err := c.nodes(ctx)
	if err != nil {
		return nil, err
	}
	leave := map[string]string{}
	for _, x := range ns {
		switch {
		case !x.ready:
			leave[x.obj.GetName()] = "not ready: " + x.reason
		case x.obj.GetName() != pn.obj.GetName() && obj.Spec.TemplateVersion != "" && !slices.Contains(x.typed.Status.Layers, obj.Spec.TemplateVersion) &&
			!c.holdsVersion(ctx, x, obj.Spec.TemplateVersion):
			leave[x.obj.GetName()] = "does not hold template version " + obj.Spec.TemplateVersion
		}
	}
	req, _ := placement.RequestOf(&obj, c.cfg.Defaults)
	req.Parent = sb.ID
	if memory {
		fs := pn.typed.Status
		req.Image = &v1alpha1.SandboxImage{Memory: true, RequireMemory: true, RunscSHA256: fs.RunscSHA256,
			CPUFeatures: fs.CPUFeatures, CacheLineBytes: fs.CacheLineBytes, Agent: sb.Agent}
	}
	plan, _, err := c.place.Spread(ctx, &obj, req, n, leave)
	return plan, err
}

// holdsVersion asks node n whether it holds template version v: its
// published layers lag a template built or imported since by up to a
// publish (30 s).
func (c *Controller) holdsVersion(ctx context.Context, n *node, v string) bool {
	var ts []api.Template
	if err := c.nodeCall(ctx, n, http.MethodGet, "/v1/templates", nil, &ts); err != nil {
		return false
	}
	return slices.ContainsFunc(ts, func(t api.Template) bool { return t.Version == v })
}

// spreadFork makes sb's forks on the nodes of plan, telling out as a
// node's fork does: "sandbox.captured" once the parent's state is taken,
// then, once every child is made, "sandbox.forking" with their ids,
// "sandbox.ready" for each and "done"; or "error", once every child made
// is deleted again.
func (c *Controller) spreadFork(ctx context.Context, out *sse, sb api.Sandbox, pn *node, req api.ForkRequest, plan []string) {
	fail := func(err error) {
		c.log.Warn("fleet: a spread fork failed", "sandbox", sb.ID, "err", err)
		_ = out.send(api.StreamErrorEvent, api.ForkEvent{Event: api.StreamErrorEvent, ErrorBody: api.Envelope(err)})
	}
	u, err := c.sandboxObject(ctx, sb.ID)
	if err != nil {
		fail(err)
		return
	}
	var obj v1alpha1.Sandbox
	if err := v1alpha1.FromUnstructured(u, &obj); err != nil {
		fail(err)
		return
	}
	create, err := forkCreate(obj, req)
	if err != nil {
		fail(err)
		return
	}
	ns, err := c.nodes(ctx)
	if err != nil {
		fail(unavailable(err))
		return
	}
	byName := map[string]*node{}
	for _, x := range ns {
		byName[x.obj.GetName()] = x
	}
	per := map[string]int{}
	for _, name := range plan {
		per[name]++
	}
	name := "fork-" + strings.TrimPrefix(sb.ID, "sb_") + "-" + randomHex(3)
	create.From = name
	mctx, cancel := context.WithTimeout(ctx, moveAsk)
	defer cancel()

	// the nodes that may hold the snapshot, each counted before it is
	// asked: one that made it and failed to say so (an error, a timeout)
	// holds it too. It goes from each at the end; a delete of none is 404.
	holders := []*node{pn}
	defer func() {
		for _, h := range holders {
			if err := c.undoCall(ctx, h, "/v1/snapshots/"+name); err != nil && !errors.Is(err, api.ErrNotFound) {
				c.log.Warn("fleet: a spread fork's snapshot is left", "snapshot", name, "node", h.obj.GetName(), "err", err)
			}
		}
	}()
	// the parent's state, once
	var snap api.Snapshot
	if err := c.nodeCall(mctx, pn, http.MethodPost, "/v1/sandboxes/"+sb.ID+"/snapshots", api.SnapshotRequest{Name: name, Memory: req.Memory}, &snap); err != nil {
		fail(fmt.Errorf("fork %s: snapshot it on node %s: %w", sb.ID, pn.obj.GetName(), err))
		return
	}
	_ = out.send(api.ForkCaptured, api.ForkEvent{Event: api.ForkCaptured})

	// to the other nodes, through the registry
	if len(per) > 1 || per[pn.obj.GetName()] == 0 {
		var pushed api.PushResult
		if err := c.nodeCall(mctx, pn, http.MethodPost, "/v1/snapshots/"+name+"/push", api.PushRequest{Ref: c.cfg.MoveRepository + ":" + name}, &pushed); err != nil {
			fail(fmt.Errorf("fork %s: push its snapshot from node %s: %w", sb.ID, pn.obj.GetName(), err))
			return
		}
		for node := range per {
			to := byName[node]
			if node == pn.obj.GetName() {
				continue
			}
			if to == nil {
				fail(api.Errorf(api.ErrUnavailable, "fork %s: node %s left the fleet", sb.ID, node))
				return
			}
			holders = append(holders, to)
			var pulled api.PullResult
			if err := c.nodeCall(mctx, to, http.MethodPost, "/v1/snapshots/pull", api.PullRequest{Ref: pushed.Ref, Name: name}, &pulled); err != nil {
				fail(fmt.Errorf("fork %s: node %s pulling its snapshot: %w", sb.ID, node, err))
				return
			}
			if req.Memory && pulled.MemoryLeft != "" {
				fail(api.Errorf(api.ErrUnavailable, "fork %s: node %s took its snapshot without the memory: %s", sb.ID, node, pulled.MemoryLeft))
				return
			}
		}
	}

	// the children, a few at a time on each node
	var mu sync.Mutex
	var made []api.Sandbox
	var where []*node
	var errs []error
	var wg sync.WaitGroup
	for node, k := range per {
		to := byName[node] // each of per's is a holder, checked above, or the parent's
		if node == pn.obj.GetName() {
			to = pn
		}
		sem := make(chan struct{}, forkPerNode)
		for range k {
			wg.Add(1)
			go func() {
				defer wg.Done()
				sem <- struct{}{}
				defer func() { <-sem }()
				var kid api.Sandbox
				err := c.nodeCall(mctx, to, http.MethodPost, "/v1/sandboxes", create, &kid)
				mu.Lock()
				defer mu.Unlock()
				if err == nil {
					err = checkChild(kid, sb.ID, made)
				}
				if err != nil {
					errs = append(errs, fmt.Errorf("a child on node %s: %w", node, err))
					return
				}
				kid.Node = node
				made, where = append(made, kid), append(where, to)
			}()
		}
	}
	wg.Wait()
	if len(errs) > 0 {
		// all or nothing, as a node's fork
		for i, kid := range made {
			if err := c.undoCall(ctx, where[i], "/v1/sandboxes/"+kid.ID); err != nil {
				errs = append(errs, fmt.Errorf("and child %s is left on node %s: %w", kid.ID, where[i].obj.GetName(), err))
			}
		}
		fail(fmt.Errorf("fork %s: %w", sb.ID, errorsJoin(errs)))
		return
	}
	c.log.Info("fleet: spread a fork", "sandbox", sb.ID, "children", len(made), "nodes", fmt.Sprint(per))
	// the ids once all are made: a client that does not wait takes the
	// first "sandbox.forking" as the whole fork's
	ids := make([]string, len(made))
	for i, kid := range made {
		ids[i] = kid.ID
	}
	_ = out.send(api.ForkForking, api.ForkEvent{Event: api.ForkForking, IDs: ids})
	for i := range made {
		_ = out.send(api.ForkReady, api.ForkEvent{Event: api.ForkReady, Sandbox: &made[i]})
	}
	_ = out.send(api.ForkDone, api.ForkEvent{Event: api.ForkDone, Sandboxes: made})
}

// childID is what a node's create answers: sbxd's ids (newID("sb_")), and
// nothing a path could be made of.
var childID = regexp.MustCompile(`^sb_[a-z0-9]{1,64}$`)

// checkChild refuses a node's answer to a child's create that is not a
// new fork of parent: made is the fork's children so far. Such an answer
// is no child, so a fork's undo does not delete what it names (the
// parent, another's sandbox, one child twice).
func checkChild(kid api.Sandbox, parent string, made []api.Sandbox) error {
	switch {
	case !childID.MatchString(kid.ID), kid.ID == parent:
		return api.Errorf(api.ErrUnavailable, "the node answered the create with sandbox %q, which is no new child of %s (left as it is)", kid.ID, parent)
	case kid.Parent != parent:
		return api.Errorf(api.ErrUnavailable, "the node answered the create with sandbox %s, a fork of %q, not of %s (left as it is)", kid.ID, kid.Parent, parent)
	case slices.ContainsFunc(made, func(m api.Sandbox) bool { return m.ID == kid.ID }):
		return api.Errorf(api.ErrUnavailable, "the node answered two creates with one sandbox, %s", kid.ID)
	}
	return nil
}

// forkCreate is the create of one child of the parent obj, forked as req
// asks: the parent's meta (not the fleet's own keys) with req's, its ttl
// unless req gives one, recorded as a fork of it.
func forkCreate(obj v1alpha1.Sandbox, req api.ForkRequest) (api.CreateRequest, error) {
	meta := maps.Clone(obj.Spec.Meta)
	for _, k := range []string{api.MetaObject, api.MetaObjectUID, api.MetaObjectNamespace, api.MetaAdopted, api.MetaPool, api.MetaImageRef, api.MetaImagePending} {
		delete(meta, k)
	}
	if len(req.Meta) > 0 && meta == nil {
		meta = map[string]string{}
	}
	maps.Copy(meta, req.Meta)
	create := api.CreateRequest{ForkOf: obj.Status.ID, Meta: meta, Monitor: req.Monitor}
	switch {
	case req.TTL != nil:
		create.TTL = *req.TTL
	case obj.Spec.TTL != "":
		if err := create.TTL.Set(obj.Spec.TTL); err != nil {
			return create, fmt.Errorf("the parent's ttl %q: %w", obj.Spec.TTL, err)
		}
	}
	return create, nil
}

// errorsJoin joins errs in one line each.
func errorsJoin(errs []error) error {
	msgs := make([]string, len(errs))
	for i, e := range errs {
		msgs[i] = e.Error()
	}
	return fmt.Errorf("%s", strings.Join(msgs, "; "))
}

// sse writes server-sent events, as sbxd's API does.
type sse struct {
	mu      sync.Mutex
	w       http.ResponseWriter
	rc      *http.ResponseController
	started bool
}

func newSSE(w http.ResponseWriter) *sse { return &sse{w: w, rc: http.NewResponseController(w)} }

func (e *sse) send(event string, v any) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if !e.started {
		e.w.Header().Set("Content-Type", "text/event-stream")
		e.w.Header().Set("Cache-Control", "no-cache")
		e.w.WriteHeader(http.StatusOK)
		e.started = true
	}
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	if _, err := fmt.Fprintf(e.w, "event: %s\ndata: %s\n\n", event, b); err != nil {
		return err
	}
	return e.rc.Flush()
}
