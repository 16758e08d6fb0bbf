package controller

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"sbx.dev/sbx/api"
	"sbx.dev/sbx/internal/fleet/v1alpha1"
)

// Attacks on a spread fork (fork.go): nodes that answer its snapshot,
// push, pull and creates wrong, or fail after doing the work. After each,
// the parent is untouched, no child is left unknown, and no node keeps
// the fork's snapshot.

// forkNode plays one node's sbxd for a spread fork.
type forkNode struct {
	name string
	srv  *httptest.Server

	mu      sync.Mutex
	snaps   map[string]bool         // snapshots held
	sbs     map[string]*api.Sandbox // sandboxes held
	calls   []string                // "METHOD path" of each call
	creates int
	// hooks, run under mu; one answering true has written the answer
	onSnapshot, onPull func(w http.ResponseWriter, name string) bool
	onCreate           func(w http.ResponseWriter, n int, kid *api.Sandbox) bool
	hangDeletes        chan struct{} // when set, a delete waits for it to close
}

func newForkNode(t *testing.T, name string) *forkNode {
	n := &forkNode{name: name, snaps: map[string]bool{}, sbs: map[string]*api.Sandbox{}}
	n.srv = httptest.NewServer(http.HandlerFunc(n.serve))
	t.Cleanup(n.srv.Close)
	return n
}

func (n *forkNode) serve(w http.ResponseWriter, r *http.Request) {
	if r.Method == http.MethodDelete && n.hangDeletes != nil {
		select {
		case <-n.hangDeletes:
		case <-r.Context().Done():
		}
		writeError(w, api.Errorf(api.ErrUnavailable, "hung"))
		return
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	n.calls = append(n.calls, r.Method+" "+r.URL.Path)
	p := r.URL.Path
	switch {
	case r.Method == http.MethodPost && strings.HasPrefix(p, "/v1/sandboxes/") && strings.HasSuffix(p, "/snapshots"):
		var req api.SnapshotRequest
		_ = json.NewDecoder(r.Body).Decode(&req)
		n.snaps[req.Name] = true
		if n.onSnapshot != nil && n.onSnapshot(w, req.Name) {
			return
		}
		writeJSON(w, http.StatusCreated, api.Snapshot{Name: req.Name, Memory: req.Memory})
	case r.Method == http.MethodPost && strings.HasPrefix(p, "/v1/snapshots/") && strings.HasSuffix(p, "/push"):
		var req api.PushRequest
		_ = json.NewDecoder(r.Body).Decode(&req)
		writeJSON(w, http.StatusOK, api.PushResult{Ref: req.Ref + "@sha256:" + strings.Repeat("0", 64), Files: 1, Bytes: 1})
	case r.Method == http.MethodPost && p == "/v1/snapshots/pull":
		var req api.PullRequest
		_ = json.NewDecoder(r.Body).Decode(&req)
		n.snaps[req.Name] = true
		if n.onPull != nil && n.onPull(w, req.Name) {
			return
		}
		writeJSON(w, http.StatusOK, api.PullResult{Ref: req.Ref, Snapshot: api.Snapshot{Name: req.Name}})
	case r.Method == http.MethodDelete && strings.HasPrefix(p, "/v1/snapshots/"):
		delete(n.snaps, strings.TrimPrefix(p, "/v1/snapshots/"))
		w.WriteHeader(http.StatusNoContent)
	case r.Method == http.MethodPost && p == "/v1/sandboxes":
		var req api.CreateRequest
		_ = json.NewDecoder(r.Body).Decode(&req)
		n.creates++
		kid := &api.Sandbox{ID: "sb_" + n.name + "kid" + randomHex(3), State: api.StateReady, Parent: req.ForkOf, Meta: req.Meta}
		if n.onCreate != nil && n.onCreate(w, n.creates, kid) {
			return
		}
		n.sbs[kid.ID] = kid
		writeJSON(w, http.StatusCreated, kid)
	case r.Method == http.MethodDelete && strings.HasPrefix(p, "/v1/sandboxes/"):
		id := strings.TrimPrefix(p, "/v1/sandboxes/")
		if n.sbs[id] == nil {
			writeError(w, api.Errorf(api.ErrNotFound, "sandbox %s not found", id))
			return
		}
		delete(n.sbs, id)
		w.WriteHeader(http.StatusNoContent)
	default:
		writeError(w, api.Errorf(api.ErrNotFound, "%s %s", r.Method, p))
	}
}

// held is what n holds: its snapshots and sandboxes.
func (n *forkNode) held() (snaps, sbs []string) {
	n.mu.Lock()
	defer n.mu.Unlock()
	for s := range n.snaps {
		snaps = append(snaps, s)
	}
	for id := range n.sbs {
		sbs = append(sbs, id)
	}
	return snaps, sbs
}

const forkParent = "sb_parentaaaa"

// forkFleet is a fleet of nodes a and b, moving through a registry, with
// the parent ready on a (meta as given); it returns the fleet and the
// nodes.
func forkFleet(t *testing.T, meta map[string]string) (*testFleet, *forkNode, *forkNode) {
	t.Helper()
	a, b := newForkNode(t, "a"), newForkNode(t, "b")
	a.sbs[forkParent] = &api.Sandbox{ID: forkParent, State: api.StateReady, Meta: meta}
	f := newTestFleet(t, nil, lease("a", t0), lease("b", t0))
	enforceRV(f.dyn)
	o := sandboxObj(t, forkParent, "a", "ready", t0)
	o.SetLabels(map[string]string{v1alpha1.LabelNode: "a", v1alpha1.LabelSandboxID: v1alpha1.ObjectName(forkParent)})
	if meta != nil {
		_ = unstructured.SetNestedStringMap(o.Object, meta, "spec", "meta")
	}
	if _, err := f.dyn.Resource(v1alpha1.SandboxesResource).Namespace(v1alpha1.DefaultNamespace).Create(context.Background(), o, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	for _, n := range []*forkNode{a, b} {
		u := pullNode(t, n.name, n.srv.URL, runscA, 10<<30, false).(*unstructured.Unstructured)
		if _, err := f.dyn.Resource(v1alpha1.SandboxNodesResource).Create(context.Background(), u, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	f.c.cfg.MoveRepository = "127.0.0.1:5000/sbx/moves"
	return f, a, b
}

// spread runs a spread fork of the parent over plan, and returns the
// events it told.
func (f *testFleet) spread(t *testing.T, req api.ForkRequest, plan ...string) []api.ForkEvent {
	t.Helper()
	rec := httptest.NewRecorder()
	pn := f.node(t, "a")
	f.c.spreadFork(context.Background(), newSSE(rec), api.Sandbox{ID: forkParent, State: api.StateReady, Node: "a"}, pn, req, plan)
	var evs []api.ForkEvent
	for _, chunk := range strings.Split(rec.Body.String(), "\n\n") {
		_, data, ok := strings.Cut(chunk, "data: ")
		if !ok {
			continue
		}
		var ev api.ForkEvent
		if err := json.Unmarshal([]byte(data), &ev); err != nil {
			t.Fatalf("event %q: %v", data, err)
		}
		evs = append(evs, ev)
	}
	return evs
}

// TestAttackForkChildAnswers: a node answering a child's create with the
// parent itself, another sandbox's child, no id, or one id twice. The
// controller took each answer as a child: told the parent as a child of
// its own fork (whose client then deletes it as one), and on the fork's
// undo deleted the parent.
func TestAttackForkChildAnswers(t *testing.T) {
	for _, tc := range []struct {
		name   string
		answer func(n int, kid *api.Sandbox)
		bFails bool // and node b's child fails: the fork is undone
	}{
		{"the parent", func(n int, kid *api.Sandbox) {
			if n == 1 {
				kid.ID = forkParent
			}
		}, false},
		{"the parent, undone", func(n int, kid *api.Sandbox) {
			if n == 1 {
				kid.ID = forkParent
			}
		}, true},
		{"another's child", func(n int, kid *api.Sandbox) {
			if n == 1 {
				kid.Parent = "sb_otherxxxxx"
			}
		}, false},
		{"no id", func(n int, kid *api.Sandbox) {
			if n == 1 {
				kid.ID = ""
			}
		}, false},
		{"an id twice", func(n int, kid *api.Sandbox) { kid.ID = "sb_twinxxxxxx" }, false},
		{"a path", func(n int, kid *api.Sandbox) {
			if n == 1 {
				kid.ID = "../sandboxes/" + forkParent
			}
		}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f, a, b := forkFleet(t, nil)
			a.onCreate = func(w http.ResponseWriter, n int, kid *api.Sandbox) bool {
				tc.answer(n, kid)
				return false
			}
			if tc.bFails {
				b.onCreate = func(w http.ResponseWriter, _ int, _ *api.Sandbox) bool {
					writeError(w, api.Errorf(api.ErrConflict, "no room"))
					return true
				}
			}
			evs := f.spread(t, api.ForkRequest{Count: 3}, "a", "a", "b")
			last := evs[len(evs)-1]
			if last.Event != api.StreamErrorEvent {
				t.Errorf("the fork ended with %+v, want an error", last)
			}
			for _, ev := range evs {
				for _, id := range ev.IDs {
					if id == forkParent {
						t.Errorf("the parent told as its own child: %+v", ev)
					}
				}
			}
			if a.sbs[forkParent] == nil {
				t.Errorf("the parent was deleted by its fork's undo; node a called %v", a.calls)
			}
			if _, sbs := b.held(); len(sbs) != 0 {
				t.Errorf("node b keeps children %v of a failed fork", sbs)
			}
		})
	}
}

// TestAttackForkSnapshotsLeft: a node that made the fork's snapshot (or
// pulled it) and then answered an error. The snapshot was deleted only
// from the nodes whose answer was good: one whose pull's answer was lost
// (a 500, a timeout) kept it for good.
func TestAttackForkSnapshotsLeft(t *testing.T) {
	fail := func(w http.ResponseWriter, _ string) bool {
		writeError(w, api.Errorf(api.ErrInternal, "disk hiccup after the write"))
		return true
	}
	for _, tc := range []struct {
		name string
		set  func(a, b *forkNode)
	}{
		{"the pull", func(a, b *forkNode) { b.onPull = fail }},
		{"the snapshot", func(a, b *forkNode) { a.onSnapshot = fail }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f, a, b := forkFleet(t, nil)
			tc.set(a, b)
			evs := f.spread(t, api.ForkRequest{Count: 2}, "a", "b")
			if last := evs[len(evs)-1]; last.Event != api.StreamErrorEvent {
				t.Errorf("the fork ended with %+v, want an error", last)
			}
			for _, n := range []*forkNode{a, b} {
				if snaps, _ := n.held(); len(snaps) != 0 {
					t.Errorf("node %s keeps the failed fork's snapshots %v; it was called %v", n.name, snaps, n.calls)
				}
			}
		})
	}
}

// TestAttackForkUndoHangs: a node that hangs on the deletes of a failed
// fork's undo. The undo waited for it for good, so the fork's client never
// heard its error, and its request never ended.
func TestAttackForkUndoHangs(t *testing.T) {
	f, a, b := forkFleet(t, nil)
	hang := make(chan struct{})
	defer close(hang)
	a.hangDeletes = hang
	b.onCreate = func(w http.ResponseWriter, _ int, _ *api.Sandbox) bool {
		writeError(w, api.Errorf(api.ErrConflict, "no room"))
		return true
	}
	defer func(d time.Duration) { forkUndoAsk = d }(forkUndoAsk)
	forkUndoAsk = 100 * time.Millisecond
	done := make(chan []api.ForkEvent)
	go func() { done <- f.spread(t, api.ForkRequest{Count: 3}, "a", "a", "b") }()
	select {
	case evs := <-done:
		last := evs[len(evs)-1]
		if last.Event != api.StreamErrorEvent || last.Error == nil || !strings.Contains(last.Error.Message, "left on node a") {
			t.Errorf("the fork ended with %+v, want an error naming the children left", last)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("a fork whose undo meets a hung node never ended")
	}
}
