package controller

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strconv"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"sbx.dev/sbx/api"
	"sbx.dev/sbx/internal/fleet/v1alpha1"
)

// Handler serves the fleet's side of sbx's HTTP API:
//
//	GET  /v1/health
//	GET  /v1/nodes
//	GET  /v1/nodes/{name}
//	POST /v1/nodes/{name}/cordon
//	POST /v1/nodes/{name}/uncordon
//	POST /v1/nodes/{name}/drain   cordon, and move its sandboxes (move.go)
//	GET  /v1/sandboxes          every node's, each saying its node
//	POST /v1/sandboxes          a Sandbox object, placed and made (proxy.go)
//	GET  /v1/sandboxes/{id}     by id or name
//	POST /v1/sandboxes/{id}/resume on its node, or moved first (move.go)
//	POST /v1/sandboxes/{id}/fork   spread over the nodes, or its node's (fork.go)
//	*    /v1/sandboxes/{id}/... on to the node that holds it (proxy.go)
//	*    /v1/templates[/...]    on to one ready node (proxy.go)
//	PUT  /v1/layers/{digest}    on to that node too (an image import's)
//	GET  /v1/snapshots          every ready node's, each saying its node (snapshots.go)
//	*    /v1/snapshots/{name}[/...] on to the node that holds it
//
// The rest of the API (storage) is a node agent's, and not served here:
// such a request is unavailable (503), saying which node to ask.
func (c *Controller) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/health", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, map[string]any{"ok": true, "role": "fleet-controller"})
	})
	mux.HandleFunc("GET /v1/nodes", c.listNodes)
	mux.HandleFunc("GET /v1/nodes/{name}", c.getNode)
	mux.HandleFunc("POST /v1/nodes/{name}/cordon", c.cordon(true))
	mux.HandleFunc("POST /v1/nodes/{name}/uncordon", c.cordon(false))
	mux.HandleFunc("POST /v1/nodes/{name}/drain", c.drain)
	mux.HandleFunc("GET /v1/sandboxes", c.listSandboxes)
	mux.HandleFunc("POST /v1/sandboxes", c.create)
	mux.HandleFunc("GET /v1/sandboxes/{id}", c.getSandbox)
	// one sandbox's: on to its node (proxy.go)
	mux.HandleFunc("DELETE /v1/sandboxes/{id}", c.proxy)
	mux.HandleFunc("POST /v1/sandboxes/{id}/resume", c.resume)
	mux.HandleFunc("POST /v1/sandboxes/{id}/fork", c.fork)
	mux.HandleFunc("/v1/sandboxes/{id}/{rest...}", c.proxy)
	mux.HandleFunc("GET /v1/snapshots", c.listSnapshots)
	mux.HandleFunc("POST /v1/snapshots/pull", c.pullSnapshot)
	mux.HandleFunc("/v1/snapshots/{name}", c.proxySnapshot)
	mux.HandleFunc("/v1/snapshots/{name}/{rest...}", c.proxySnapshot)
	mux.HandleFunc("/v1/templates", c.proxyTemplates)
	mux.HandleFunc("/v1/templates/{rest...}", c.proxyTemplates)
	mux.HandleFunc("PUT /v1/layers/{digest}", c.proxyTemplates)
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeError(w, api.Errorf(api.ErrUnavailable, "%s %s: the fleet controller does not serve this yet; ask the node agent that holds the sandbox (sbx --host ADDRESS, the address of `sbx node ls`)", r.Method, r.URL.Path))
	})
	return mux
}

func (c *Controller) apiNode(n *node) api.Node {
	st := n.typed.Status
	out := api.Node{
		Name: n.obj.GetName(), Address: st.Address, Ready: n.ready, Reason: n.reason,
		Cordoned: n.typed.Spec.Unschedulable, Sandboxes: st.Sandboxes, CPUs: st.Capacity.CPUs,
		Memory: st.Capacity.MemoryBytes, RunscSHA256: st.RunscSHA256, Agents: st.Agents, Version: st.Version,
	}
	if !n.renewed.IsZero() {
		t := n.renewed.UTC()
		out.Renewed = &t
	}
	return out
}

func (c *Controller) listNodes(w http.ResponseWriter, r *http.Request) {
	ns, err := c.nodes(r.Context())
	if err != nil {
		writeError(w, unavailable(err))
		return
	}
	out := make([]api.Node, 0, len(ns))
	for _, n := range ns {
		out = append(out, c.apiNode(n))
	}
	writeJSON(w, http.StatusOK, out)
}

func (c *Controller) findNode(r *http.Request) (*node, error) {
	name := r.PathValue("name")
	ns, err := c.nodes(r.Context())
	if err != nil {
		return nil, unavailable(err)
	}
	for _, n := range ns {
		if n.obj.GetName() == name {
			return n, nil
		}
	}
	return nil, api.Errorf(api.ErrNotFound, "no node %q in the fleet (sbx node ls lists them)", name)
}

func (c *Controller) getNode(w http.ResponseWriter, r *http.Request) {
	n, err := c.findNode(r)
	if err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, c.apiNode(n))
}

// cordon sets, or clears, a node's spec.unschedulable: a cordoned node
// keeps what it runs and is given nothing new.
func (c *Controller) cordon(on bool) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		n, err := c.findNode(r)
		if err != nil {
			writeError(w, err)
			return
		}
		patch, _ := json.Marshal(map[string]any{"spec": map[string]any{"unschedulable": on}})
		if _, err := c.dyn.Resource(v1alpha1.SandboxNodesResource).Patch(r.Context(), n.obj.GetName(), types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
			writeError(w, unavailable(fmt.Errorf("cordon %s: %w", n.obj.GetName(), err)))
			return
		}
		n.typed.Spec.Unschedulable = on
		verb := "uncordoned"
		if on {
			verb = "cordoned"
		}
		c.log.Info("fleet: node "+verb, "node", n.obj.GetName())
		writeJSON(w, http.StatusOK, c.apiNode(n))
	}
}

// sandboxes reads every node's Sandbox objects as sbx's sandboxes.
func (c *Controller) sandboxes(r *http.Request) ([]api.Sandbox, error) {
	l, err := c.dyn.Resource(v1alpha1.SandboxesResource).Namespace(c.cfg.Namespace).List(r.Context(), metav1.ListOptions{})
	if err != nil {
		return nil, unavailable(fmt.Errorf("list sandboxes: %w", err))
	}
	out := make([]api.Sandbox, 0, len(l.Items))
	for i := range l.Items {
		var sb v1alpha1.Sandbox
		if err := v1alpha1.FromUnstructured(&l.Items[i], &sb); err != nil {
			return nil, err
		}
		out = append(out, apiSandbox(&sb))
	}
	slices.SortFunc(out, func(a, b api.Sandbox) int { return a.CreatedAt.Compare(b.CreatedAt) })
	return out, nil
}

// apiSandbox is what sbx says of a Sandbox object.
func apiSandbox(sb *v1alpha1.Sandbox) api.Sandbox {
	out := api.Sandbox{
		ID: sb.Status.ID, Name: sb.Spec.Name, Template: sb.Spec.Template, State: api.State(sb.Status.State),
		Reason: sb.Status.Reason, Meta: sb.Spec.Meta, Memory: sb.Spec.MemoryBytes,
		From: sb.Spec.From, Parent: sb.Spec.Parent, MemoryRestored: sb.Status.MemoryRestored,
		ResumeReason: sb.Status.ResumeReason, Persistent: sb.Spec.Persistent, TemplateVersion: sb.Spec.TemplateVersion,
		DiskLimit: sb.Spec.DiskBytes, Network: sb.Spec.Network, Node: sb.Spec.NodeName, Agent: sb.Status.Agent,
	}
	// the node it is bound to; its status's lags a move until that node's
	// agent writes it
	if out.Node == "" {
		out.Node = sb.Status.Node
	}
	if sb.Spec.TTL != "" {
		_ = out.TTL.Set(sb.Spec.TTL) // the node agent wrote a Go duration; none if not
	}
	if sb.Status.CreatedAt != nil {
		out.CreatedAt = sb.Status.CreatedAt.Time.UTC()
	}
	if f, err := strconv.ParseFloat(sb.Spec.CPUs, 64); err == nil {
		out.CPUs = f
	}
	return out
}

func (c *Controller) listSandboxes(w http.ResponseWriter, r *http.Request) {
	out, err := c.sandboxes(r)
	if err != nil {
		writeError(w, err)
		return
	}
	if st := r.URL.Query()["state"]; len(st) > 0 {
		out = slices.DeleteFunc(out, func(sb api.Sandbox) bool { return !slices.Contains(st, string(sb.State)) })
	}
	writeJSON(w, http.StatusOK, out)
}

func (c *Controller) getSandbox(w http.ResponseWriter, r *http.Request) {
	sb, n, err := c.sandboxNode(r, r.PathValue("id"))
	switch {
	case err == nil:
		// from its node: the objects lag a node's changes by one pass of
		// its agent, and `sbx rm X; sbx info X` must say it is gone. A
		// node that does not answer (dead, its Lease not expired yet):
		// what the fleet knows
		c.forwardOr(w, r, n, "/v1/sandboxes/"+sb.ID, "which holds "+sb.ID, func(w http.ResponseWriter) {
			writeJSON(w, http.StatusOK, sb)
		})
	case sb.ID != "" && errors.Is(err, api.ErrUnavailable):
		// its node is down: what the fleet knows (lost, and why)
		writeJSON(w, http.StatusOK, sb)
	default:
		writeError(w, err)
	}
}

// unavailable says that the apiserver did not answer, unless err is one
// of its own answers with a kind of sbx's.
func unavailable(err error) error {
	var kind *api.Error
	if errors.As(err, &kind) || apierrors.IsNotFound(err) {
		return err
	}
	return api.Errorf(api.ErrUnavailable, "the fleet's apiserver: %v", err)
}

func writeError(w http.ResponseWriter, err error) {
	status, _ := api.StatusOf(err)
	writeJSON(w, status, api.Envelope(err))
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}
