package controller

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"slices"
	"strings"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"sbx.dev/sbx/api"
	"sbx.dev/sbx/internal/fleet/v1alpha1"
)

// The fleet's one endpoint: a create through the controller is a Sandbox
// object, which placement binds to a node and that node's agent makes; a
// request to one sandbox (exec, files, PTY, logs, previews, stop, fork,
// delete) goes on to the node that holds it, streamed both ways.

// createWait bounds how long a create through the fleet waits for its
// sandbox to be placed and made.
const createWait = 2 * time.Minute

// create makes a Sandbox object of the request and answers once the node
// it was placed on has made it (its status has an id), or has refused it.
func (c *Controller) create(w http.ResponseWriter, r *http.Request) {
	var req api.CreateRequest
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, 1<<20))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&req); err != nil {
		writeError(w, api.DecodeError(err))
		return
	}
	if err := req.Validate(); err != nil {
		writeError(w, err)
		return
	}
	spec, err := fleetSpec(req)
	if err != nil {
		writeError(w, err)
		return
	}
	if req.Name != "" {
		// a name is unique in the fleet, as on one sbxd: another node
		// would make it (racing creates of one name are caught at use:
		// sandboxNode refuses a name two sandboxes have)
		all, err := c.sandboxes(r)
		if err != nil {
			writeError(w, err)
			return
		}
		for _, sb := range all {
			if sb.Name == req.Name && (sb.ID != "" || sb.State != api.StateError) {
				writeError(w, api.Errorf(api.ErrConflict, "name %q is taken in the fleet (by %s on node %s)", req.Name, cmp.Or(sb.ID, "a sandbox being made"), cmp.Or(sb.Node, "none yet")))
				return
			}
		}
	}
	if req.From != "" {
		// a snapshot stays on the node that took it: the sandbox is made
		// there, bound at once (placement leaves a bound object)
		n, err := c.snapshotNode(r.Context(), req.From)
		if err != nil {
			writeError(w, err)
			return
		}
		spec.From, spec.NodeName = req.From, n.obj.GetName()
	}
	name := "req-" + randomHex(5)
	u, err := v1alpha1.ToUnstructured(&v1alpha1.Sandbox{
		TypeMeta:   metav1.TypeMeta{APIVersion: v1alpha1.APIVersion, Kind: v1alpha1.KindSandbox},
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: c.cfg.Namespace},
		Spec:       spec,
	})
	if err != nil {
		writeError(w, err)
		return
	}
	rc := c.dyn.Resource(v1alpha1.SandboxesResource).Namespace(c.cfg.Namespace)
	if _, err := rc.Create(r.Context(), u, metav1.CreateOptions{}); err != nil {
		writeError(w, unavailable(fmt.Errorf("ask for sandbox %s: %w", name, err)))
		return
	}
	c.log.Info("fleet: a create asked", "object", name, "template", spec.Template)
	c.hurry()
	// once asked, it is made whatever the client does (as a create of one
	// sbxd): the wait alone ends with the client
	ctx, cancel := context.WithTimeout(r.Context(), createWait)
	defer cancel()
	for {
		got, err := rc.Get(ctx, name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			writeError(w, api.Errorf(api.ErrNotFound, "sandbox object %s was deleted before a node made its sandbox", name))
			return
		}
		if err == nil {
			var sb v1alpha1.Sandbox
			if err := v1alpha1.FromUnstructured(got, &sb); err == nil {
				if sb.Status.ID != "" && sb.Status.State != string(api.StateCreating) {
					writeJSON(w, http.StatusCreated, apiSandbox(&sb))
					return
				}
				if refused := refusal(&sb); refused != nil {
					writeError(w, refused)
					return
				}
				if why := notYet(&sb); why != "" {
					// as one sbxd that cannot make a sandbox now answers
					// 503 having made none: the object goes, so that
					// nothing is made after the answer (a sandbox its
					// node made meanwhile goes with it, at the node's
					// next pass)
					uid := got.GetUID()
					err := rc.Delete(context.WithoutCancel(ctx), name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &uid}})
					if err != nil && !apierrors.IsNotFound(err) {
						writeError(w, api.Errorf(api.ErrUnavailable, "%s; sandbox object %s could not be withdrawn (%v): it may still be made", why, name, err))
						return
					}
					writeError(w, api.Errorf(api.ErrUnavailable, "%s; nothing was made: ask again", why))
					return
				}
			}
		}
		select {
		case <-ctx.Done():
			why := c.waitingWhy(name)
			writeError(w, api.Errorf(api.ErrUnavailable, "sandbox object %s is not made after %s (%s); it goes on: sbx list shows it once it is", name, createWait, why))
			return
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// waitingWhy says why placement has not bound object name yet.
func (c *Controller) waitingWhy(name string) string {
	c.mu.Lock()
	defer c.mu.Unlock()
	if why := c.waiting[name]; why != "" {
		return "placement: " + why
	}
	return "no node has made it yet"
}

// notYet says why a Sandbox object's node cannot make it for now, if it
// cannot: its sbxd refuses for the moment (ReasonNodeCannotYet), or the
// node went down before making it (the controller marked it lost).
func notYet(sb *v1alpha1.Sandbox) string {
	if sb.Status.ID != "" {
		return ""
	}
	if sb.Status.State == string(api.StateLost) {
		return cmp.Or(sb.Status.Reason, "its node went down") + " before it made the sandbox"
	}
	for _, cond := range sb.Status.Conditions {
		if cond.Type == v1alpha1.ConditionReady && cond.Reason == v1alpha1.ReasonNodeCannotYet {
			return cond.Message
		}
	}
	return ""
}

// refusal is the error of a Sandbox object its node would not make (its
// status says error, with the kind in the Ready condition's reason), or
// nil.
func refusal(sb *v1alpha1.Sandbox) error {
	if sb.Status.State != string(api.StateError) || sb.Status.ID != "" {
		return nil
	}
	for _, cond := range sb.Status.Conditions {
		if cond.Type != v1alpha1.ConditionReady {
			continue
		}
		if code, ok := v1alpha1.RefusedCode(cond.Reason); ok {
			return api.StreamError(code, sb.Status.Reason)
		}
	}
	return api.Errorf(api.ErrInvalid, "%s", sb.Status.Reason)
}

// fleetSpec is the Sandbox spec of a create request. What the fleet cannot
// carry yet is refused, naming the field, rather than dropped.
func fleetSpec(req api.CreateRequest) (v1alpha1.SandboxSpec, error) {
	switch {
	case req.Monitor:
		return v1alpha1.SandboxSpec{}, api.Errorf(api.ErrInvalid, "monitor: not through the fleet yet; create it through a node (sbx --host ADDRESS)")
	case req.Shape != nil:
		return v1alpha1.SandboxSpec{}, api.Errorf(api.ErrInvalid, "netShape: not through the fleet yet; create it through a node (sbx --host ADDRESS)")
	case req.Pids != 0:
		return v1alpha1.SandboxSpec{}, api.Errorf(api.ErrInvalid, "pids: not through the fleet yet; create it through a node (sbx --host ADDRESS)")
	case req.ForkOf != "":
		return v1alpha1.SandboxSpec{}, api.Errorf(api.ErrInvalid, "forkOf: the fleet's own, for a fork it spreads; fork the sandbox (sbx fork)")
	}
	mem, err := api.ParseSize("memory", req.Memory)
	if err != nil {
		return v1alpha1.SandboxSpec{}, err
	}
	disk, err := api.ParseSize("disk", req.Disk)
	if err != nil {
		return v1alpha1.SandboxSpec{}, err
	}
	spec := v1alpha1.SandboxSpec{Template: req.Template, Name: req.Name, MemoryBytes: mem, DiskBytes: disk,
		Network: req.Network, Meta: req.Meta}
	if req.TTL > 0 {
		spec.TTL = req.TTL.String()
	}
	if req.CPUs > 0 {
		spec.CPUs = fmt.Sprint(req.CPUs)
	}
	return spec, nil
}

// proxy sends a request to one sandbox on to the node agent that holds it,
// with the fleet's node token, and streams its answer back (server-sent
// events and a terminal's upgraded connection too).
func (c *Controller) proxy(w http.ResponseWriter, r *http.Request) {
	ref := r.PathValue("id")
	sb, n, err := c.sandboxNode(r, ref)
	if err != nil {
		writeError(w, err)
		return
	}
	// by id on the node: a name is the fleet's to resolve
	path := "/v1/sandboxes/" + sb.ID + strings.TrimPrefix(r.URL.Path, "/v1/sandboxes/"+ref)
	c.forward(w, r, n, path, "which holds "+sb.ID)
}

// proxyTemplates sends a template request (list, get, build, import) on
// to one node: the first ready one that is not cordoned, by name. The
// nodes of scripts/fleet.sh share one template cache, so that node's
// answer is every node's; in a fleet whose nodes keep their own, build
// or import on each (sbx --host ADDRESS template build; sbx node ls).
func (c *Controller) proxyTemplates(w http.ResponseWriter, r *http.Request) {
	c.toFirstNode(w, r, "asked for the fleet's templates")
}

// toFirstNode sends r on to the first ready, uncordoned node (by name);
// what says what the node is to r.
func (c *Controller) toFirstNode(w http.ResponseWriter, r *http.Request, what string) {
	ns, err := c.nodes(r.Context())
	if err != nil {
		writeError(w, unavailable(err))
		return
	}
	for _, n := range ns { // sorted by name
		if n.ready && !n.typed.Spec.Unschedulable {
			c.forward(w, r, n, r.URL.Path, what)
			return
		}
	}
	writeError(w, api.Errorf(api.ErrUnavailable, "%s %s: no node of the fleet is ready and uncordoned to answer (sbx node ls)", r.Method, r.URL.Path))
}

// forward sends r on to node n's API at path, with the fleet's node
// token, and streams its answer back (server-sent events and a
// terminal's upgraded connection too). what says what the node is to r,
// for the error of a node that does not answer.
func (c *Controller) forward(w http.ResponseWriter, r *http.Request, n *node, path, what string) {
	c.forwardOr(w, r, n, path, what, nil)
}

// forwardOr is forward, with fallback, if not nil, answering instead of
// the error when the node does not answer.
func (c *Controller) forwardOr(w http.ResponseWriter, r *http.Request, n *node, path, what string, fallback func(http.ResponseWriter)) {
	// a . or .. segment came escaped (%2E, %2F), past the mux's cleaning:
	// sent on decoded, it would name another path on the node
	if slices.ContainsFunc(strings.Split(path, "/"), func(seg string) bool { return seg == "." || seg == ".." }) {
		writeError(w, api.Errorf(api.ErrInvalid, "%s %s: a path with . or .. segments is not sent on to a node", r.Method, r.URL.EscapedPath()))
		return
	}
	var wait time.Duration
	if fallback != nil {
		wait = c.infoWait
	}
	target, transport, err := c.nodeTarget(n.typed.Status.Address, wait)
	if err != nil {
		writeError(w, api.Errorf(api.ErrUnavailable, "node %s: %v", n.obj.GetName(), err))
		return
	}
	rp := &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.SetURL(target)
			pr.Out.URL.Path = path
			pr.Out.URL.RawPath = ""
			pr.Out.Host = target.Host
			pr.Out.Header.Del("Authorization")
			c.authorizeTo(pr.Out.Header, n)
		},
		Transport:     transport,
		FlushInterval: -1, // every write at once: streams
		ErrorHandler: func(w http.ResponseWriter, _ *http.Request, err error) {
			if fallback != nil {
				c.log.Warn("fleet: a node did not answer; answering from its objects", "node", n.obj.GetName(), "path", path, "err", err)
				fallback(w)
				return
			}
			writeError(w, api.Errorf(api.ErrUnavailable, "node %s, %s, did not answer: %v", n.obj.GetName(), what, err))
		},
	}
	// The request's body is read by the transport while the node's answer
	// comes back. Without full duplex the server, as the proxy writes the
	// answer's header, reads what is left of the body itself and closes
	// it; the transport, still reading it, then fails, and closes the
	// connection to the node in the middle of its answer ("use of closed
	// network connection"; the client saw a fork's stream break). So the
	// body is the transport's until it ends.
	_ = http.NewResponseController(w).EnableFullDuplex()
	rp.ServeHTTP(w, r)
}

// sandboxNode finds sandbox ref (an id or a name) and the node that holds
// it, which must be ready; when it is not, the error comes with the
// sandbox as the fleet knows it.
func (c *Controller) sandboxNode(r *http.Request, ref string) (api.Sandbox, *node, error) {
	all, err := c.sandboxes(r)
	if err != nil {
		return api.Sandbox{}, nil, err
	}
	// an id first; a name is unique on its node, not in the fleet: one
	// that two nodes have names no sandbox
	var sb *api.Sandbox
	var named []string
	for i := range all {
		switch {
		case all[i].ID == "":
		case all[i].ID == ref:
			sb, named = &all[i], nil
		case all[i].Name != "" && all[i].Name == ref:
			named = append(named, all[i].ID+" on node "+all[i].Node)
			if sb == nil {
				sb = &all[i]
			}
		}
		if sb != nil && sb.ID == ref {
			break
		}
	}
	if len(named) > 1 {
		return api.Sandbox{}, nil, api.Errorf(api.ErrConflict, "%d sandboxes of the fleet are named %q (%s): use the id", len(named), ref, strings.Join(named, ", "))
	}
	if sb == nil {
		return api.Sandbox{}, nil, api.Errorf(api.ErrNotFound, "no sandbox %q on any node of the fleet", ref)
	}
	ns, err := c.nodes(r.Context())
	if err != nil {
		return api.Sandbox{}, nil, unavailable(err)
	}
	for _, n := range ns {
		if n.obj.GetName() != sb.Node {
			continue
		}
		if !n.ready {
			return *sb, nil, api.Errorf(api.ErrUnavailable, "sandbox %s is on node %s, which is down: %s", sb.ID, sb.Node, n.reason)
		}
		return *sb, n, nil
	}
	return *sb, nil, api.Errorf(api.ErrUnavailable, "sandbox %s is on node %q, which the fleet does not know", sb.ID, sb.Node)
}

// nodeTarget is the URL and transport of a node agent's published address
// (tcp://HOST:PORT, or unix://PATH on the controller's own host). The
// transport is the address's own, kept for the next request, so its
// kept-alive connections are reused; headerWait, if not 0, bounds how long
// it waits for a response's header (a node that accepts and says nothing).
func (c *Controller) nodeTarget(addr string, headerWait time.Duration) (*url.URL, http.RoundTripper, error) {
	var target *url.URL
	var path string
	switch {
	case strings.HasPrefix(addr, "tcp://"):
		target = &url.URL{Scheme: "http", Host: strings.TrimPrefix(addr, "tcp://")}
	case strings.HasPrefix(addr, "unix://"):
		path = strings.TrimPrefix(addr, "unix://")
		target = &url.URL{Scheme: "http", Host: "sbxd"}
	default:
		return nil, nil, fmt.Errorf("its address %q is neither tcp://HOST:PORT nor unix://PATH", addr)
	}
	key := transportKey{addr, headerWait}
	c.tmu.Lock()
	defer c.tmu.Unlock()
	if tr := c.transports[key]; tr != nil {
		return target, tr, nil
	}
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.ResponseHeaderTimeout = headerWait
	if path != "" {
		tr.Proxy = nil
		tr.DialContext = func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", path)
		}
	}
	c.transports[key] = tr
	return target, tr, nil
}

// transportKey names one of the controller's transports to the nodes.
type transportKey struct {
	addr       string
	headerWait time.Duration
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}
