package controller

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"time"

	"sbx.dev/sbx/api"
)

// A fleet's snapshots are its nodes': each stays on the node that took
// it (the registry that would carry them between nodes is not here yet).
// The controller lists every ready node's, sends a request for one on to
// the node that holds it, and places a create from one on that node.

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
	if c.cfg.NodeToken != "" {
		req.Header.Set("Authorization", "Bearer "+c.cfg.NodeToken)
	}
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

// pullSnapshot sends a pull on to the first ready, uncordoned node, which
// then holds the snapshot (a create --from it is made there). Placing a
// pull where its template is, or where its files are already, is the
// portable snapshots' next step (issue 24).
func (c *Controller) pullSnapshot(w http.ResponseWriter, r *http.Request) {
	c.toFirstNode(w, r, "asked to pull a snapshot")
}
