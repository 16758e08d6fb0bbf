package controller

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/v1/remote"

	"sbx.dev/sbx/api"
	"sbx.dev/sbx/internal/fleet/placement"
	"sbx.dev/sbx/internal/fleet/v1alpha1"
	"sbx.dev/sbx/internal/snapstore"
)

// A fleet's snapshots are its nodes': each stays on the node that took
// it, or pulled it from a registry (pullSnapshot places a pull). The
// controller lists every ready node's, sends a request for one on to the
// node that holds it, and places a create from one on that node.

// nodeAsk bounds one question to a node about its snapshots.
const nodeAsk = 10 * time.Second

// nodeGet GETs path of node n's API into out; it returns the node's
// status code (0 when it did not answer).
func (c *Controller) nodeGet(ctx context.Context, n *node, path string, out any) (int, error) {
	target, transport, err := c.nodeTarget(n.typed.Status.Address, 0)
	if err != nil {
		return 0, err
	}
	ctx, cancel := context.WithTimeout(ctx, nodeAsk)
	defer cancel()
	u := *target
	u.Path = path
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u.String(), nil)
	if err != nil {
		return 0, err
	}
	c.authorizeTo(req.Header, n)
	resp, err := (&http.Client{Transport: transport}).Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<16))
		return resp.StatusCode, fmt.Errorf("node %s answered %s", n.obj.GetName(), resp.Status)
	}
	return resp.StatusCode, json.NewDecoder(io.LimitReader(resp.Body, 64<<20)).Decode(out)
}

// readyNodes are the nodes whose Lease holds, by name.
func (c *Controller) readyNodes(ctx context.Context) ([]*node, error) {
	ns, err := c.nodes(ctx)
	if err != nil {
		return nil, unavailable(err)
	}
	return slices.DeleteFunc(ns, func(n *node) bool { return !n.ready }), nil
}

// listSnapshots is every ready node's snapshots, oldest first, each saying
// its node. A node that does not answer is left out, and logged.
func (c *Controller) listSnapshots(w http.ResponseWriter, r *http.Request) {
	ns, err := c.readyNodes(r.Context())
	if err != nil {
		writeError(w, err)
		return
	}
	out := []api.Snapshot{}
	for _, n := range ns {
		var sns []api.Snapshot
		if _, err := c.nodeGet(r.Context(), n, "/v1/snapshots", &sns); err != nil {
			c.log.Warn("fleet: a node's snapshots left out of the list: it did not answer", "node", n.obj.GetName(), "err", err)
			continue
		}
		for i := range sns {
			sns[i].Node = n.obj.GetName()
		}
		out = append(out, sns...)
	}
	slices.SortStableFunc(out, func(a, b api.Snapshot) int { return a.CreatedAt.Compare(b.CreatedAt) })
	writeJSON(w, http.StatusOK, out)
}

// snapshotNode is the ready node that holds snapshot name: api.ErrNotFound
// when none does.
func (c *Controller) snapshotNode(ctx context.Context, name string) (*node, error) {
	// the node checks the name; here only what is no name at all
	if name == "" || len(name) > 63 || strings.ContainsAny(name, "/\\\x00") {
		return nil, api.Errorf(api.ErrInvalid, "snapshot name %q: use 1-63 letters, digits, '.', '_' or '-'", name)
	}
	ns, err := c.readyNodes(ctx)
	if err != nil {
		return nil, err
	}
	for _, n := range ns {
		var sn api.Snapshot
		if code, err := c.nodeGet(ctx, n, "/v1/snapshots/"+url.PathEscape(name), &sn); err == nil && sn.Name == name {
			return n, nil
		} else if code == 0 {
			c.log.Warn("fleet: a node did not answer whether it holds a snapshot", "node", n.obj.GetName(), "snapshot", name, "err", err)
		}
	}
	return nil, api.Errorf(api.ErrNotFound, "no snapshot %q on any ready node of the fleet (sbx snapshot ls)", name)
}

// proxySnapshot sends a request for one snapshot (get, delete, keep) on
// to the node that holds it.
func (c *Controller) proxySnapshot(w http.ResponseWriter, r *http.Request) {
	n, err := c.snapshotNode(r.Context(), r.PathValue("name"))
	if err != nil {
		writeError(w, err)
		return
	}
	c.forward(w, r, n, r.URL.Path, "which holds snapshot "+r.PathValue("name"))
}

// pullSnapshot places a pull: on a ready, uncordoned node with room for
// its files where its memory restores (if it has memory), preferring the
// node that holds most of its files and its template version already (a
// node's Layers), which then fetches least. The controller reads the
// artifact's manifest from the registry for that; a registry it cannot
// read, or a request it cannot parse, goes on to the first ready node,
// which pulls and says what went wrong. A memory image no node can
// restore goes where it fits otherwise, and is recorded there as a disk
// snapshot, saying why.
func (c *Controller) pullSnapshot(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(io.LimitReader(r.Body, maxPullBody+1))
	if err != nil {
		writeError(w, api.Errorf(api.ErrInvalid, "pull: reading the request: %v", err))
		return
	}
	if len(body) > maxPullBody {
		writeError(w, api.Errorf(api.ErrInvalid, "pull: the request is larger than %d bytes", maxPullBody))
		return
	}
	r.Body, r.ContentLength = io.NopCloser(bytes.NewReader(body)), int64(len(body))
	var req api.PullRequest
	if json.Unmarshal(body, &req) != nil || req.Validate() != nil {
		c.toFirstNode(w, r, "asked to pull a snapshot")
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), nodeAsk)
	opts := append([]remote.Option{remote.WithAuthFromKeychain(authn.DefaultKeychain)}, c.cfg.RegistryOptions...)
	man, ref, err := snapstore.Fetch(ctx, req.Ref, opts...)
	cancel()
	if err != nil {
		c.log.Info("fleet: a pull's manifest could not be read here; the first node pulls", "ref", req.Ref, "err", err)
		c.toFirstNode(w, r, "asked to pull a snapshot")
		return
	}
	ns, err := c.nodes(r.Context())
	if err != nil {
		writeError(w, unavailable(err))
		return
	}
	pr := pullRequestOf(man, ref)
	var cands []*placement.Node
	byName := map[string]*node{}
	for _, n := range ns {
		v := placement.NewNode(&n.typed)
		if !n.ready { // the Lease's word over the published condition
			v.Ready, v.NotReady = false, "not ready: "+n.reason
		}
		cands = append(cands, v)
		byName[v.Name] = n
	}
	fit, rejected := placement.Filter(cands, pr)
	best := placement.Choose(fit, pr)
	if best == nil {
		writeError(w, api.Errorf(api.ErrUnavailable, "pull %s: %s (sbx node ls)", req.Ref, placement.Why(rejected)))
		return
	}
	c.log.Info("fleet: placed a pull", "ref", ref, "node", best.Name, "score", fmt.Sprintf("%+v", best.Score(pr)))
	c.forward(w, r, byName[best.Name], r.URL.Path, "chosen to pull "+req.Ref)
}

// maxPullBody bounds a pull request's body (a ref and a name).
const maxPullBody = 64 << 10

// pullRequestOf is what pulling the artifact man (at ref) asks of a node:
// disk for its files, and for a memory image a node where it restores
// (preferred, not required: elsewhere it is a disk snapshot). Its layers
// are its files' digests and its template version.
func pullRequestOf(man snapstore.Manifest, ref string) placement.Request {
	img := &v1alpha1.SandboxImage{Ref: ref, Memory: man.Memory, RunscSHA256: man.RunscSHA256,
		CPUFeatures: man.CPUFeatures, CacheLineBytes: man.CacheLineBytes, Agent: man.Agent}
	var disk int64
	for _, f := range man.Files {
		img.Layers = append(img.Layers, f.Digest)
		disk += max(f.Size, 0)
	}
	if man.TemplateVersion != "" {
		img.Layers = append(img.Layers, man.TemplateVersion)
	}
	return placement.Request{DiskBytes: disk, Image: img}
}
