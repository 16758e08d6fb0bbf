package controller

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"sbx.dev/sbx/api"
	"sbx.dev/sbx/internal/fleet/v1alpha1"
)

// TestMove: a stopped sandbox moves to the other node: adopted there,
// its object bound and labelled there, its status naming it, the mark
// gone, and the old node's copy deleted.
func TestMove(t *testing.T) {
	const id = "sb_aaaaaaaaaa"
	mn := newMoveNet(t, "n0", "n1")
	f := moveFleet(t, mn, id, "n0")
	to, err := f.c.move(context.Background(), id, f.node(t, "n0"))
	if err != nil {
		t.Fatal(err)
	}
	sb := f.sandbox(t, id)
	if to.obj.GetName() != "n1" || sb.Spec.NodeName != "n1" || sb.Labels[v1alpha1.LabelNode] != "n1" || sb.Status.Node != "n1" {
		t.Errorf("moved to %s; object bound to %s, labelled %s, status %s; want n1", to.obj.GetName(), sb.Spec.NodeName, sb.Labels[v1alpha1.LabelNode], sb.Status.Node)
	}
	if m, ok := sb.Annotations[v1alpha1.AnnotationMovingTo]; ok {
		t.Errorf("the mark stayed: %q", m)
	}
	if mn.has("n1", id) != api.StateStopped || mn.has("n0", id) != "" {
		t.Errorf("copies: n0 %q, n1 %q; want n1's alone, stopped", mn.has("n0", id), mn.has("n1", id))
	}
	if _, err := f.c.move(context.Background(), id, f.node(t, "n0")); err == nil {
		t.Errorf("a move off a node it is no longer bound to succeeded")
	}
}

func post(t *testing.T, url string) (int, []byte) {
	t.Helper()
	resp, err := http.Post(url, "application/json", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, b
}

// TestResumeMoves: a resume of a stopped sandbox whose node is cordoned
// moves it first and resumes it there; a sandbox with no other node that
// can take it, or whose node is not cordoned, resumes where it is; an
// unknown one is not found.
func TestResumeMoves(t *testing.T) {
	const id = "sb_aaaaaaaaaa"
	for _, tc := range []struct {
		name     string
		nodes    []string
		cordoned []string
		ref      string
		code     int
		want     string // the node that holds it, ready
	}{
		{"cordoned: moved", []string{"n0", "n1"}, []string{"n0"}, id, 200, "n1"},
		{"by name", []string{"n0", "n1"}, []string{"n0"}, "n-aaaaaaaaaa", 200, "n1"},
		{"not cordoned: in place", []string{"n0", "n1"}, nil, id, 200, "n0"},
		{"no other node: in place", []string{"n0", "n1"}, []string{"n0", "n1"}, id, 200, "n0"},
		{"unknown", []string{"n0", "n1"}, []string{"n0"}, "sb_nonexisting", 404, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			mn := newMoveNet(t, tc.nodes...)
			f := moveFleet(t, mn, id, "n0", tc.cordoned...)
			srv := httptest.NewServer(f.c.Handler())
			defer srv.Close()
			code, body := post(t, srv.URL+"/v1/sandboxes/"+tc.ref+"/resume")
			if code != tc.code {
				t.Fatalf("resume: %d %s, want %d", code, body, tc.code)
			}
			if tc.want == "" {
				return
			}
			if mn.has(tc.want, id) != api.StateReady || oneHolder(t, f, mn, id) != tc.want {
				t.Errorf("after the resume: n0 %q, n1 %q, bound to %s; want ready on %s", mn.has("n0", id), mn.has("n1", id), f.sandbox(t, id).Spec.NodeName, tc.want)
			}
		})
	}
}

// TestDrain: a drain cordons the node and moves its sandboxes: a ready
// one stopped, moved and resumed, a stopped one moved; an unknown node is
// not found, and a node that is down cannot be drained.
func TestDrain(t *testing.T) {
	const a, b = "sb_aaaaaaaaaa", "sb_bbbbbbbbbb"
	mn := newMoveNet(t, "n0", "n1")
	f := moveFleet(t, mn, a, "n0")
	o := sandboxObj(t, b, "n0", "ready", t0)
	o.SetLabels(map[string]string{v1alpha1.LabelNode: "n0", v1alpha1.LabelSandboxID: v1alpha1.ObjectName(b)})
	if _, err := f.dyn.Resource(v1alpha1.SandboxesResource).Namespace(v1alpha1.DefaultNamespace).Create(context.Background(), o, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	mn.put("n0", b, api.StateReady)
	srv := httptest.NewServer(f.c.Handler())
	defer srv.Close()
	code, body := post(t, srv.URL+"/v1/nodes/n0/drain")
	var out api.DrainResult
	if err := json.Unmarshal(body, &out); code != 200 || err != nil || len(out.Moves) != 2 {
		t.Fatalf("drain: %d %s", code, body)
	}
	for _, mv := range out.Moves {
		want := map[string]api.State{a: api.StateStopped, b: api.StateReady}[mv.ID]
		if mv.To != "n1" || mv.State != want || mv.Error != "" || mn.has("n1", mv.ID) != want || mn.has("n0", mv.ID) != "" {
			t.Errorf("%s drained: %+v; copies n0 %q n1 %q; want %s on n1", mv.ID, mv, mn.has("n0", mv.ID), mn.has("n1", mv.ID), want)
		}
		oneHolder(t, f, mn, mv.ID)
	}
	if !f.node(t, "n0").typed.Spec.Unschedulable {
		t.Errorf("the drained node is not cordoned")
	}
	if code, body := post(t, srv.URL+"/v1/nodes/nope/drain"); code != 404 {
		t.Errorf("drain of an unknown node: %d %s", code, body)
	}
	*f.now = t0.Add(f.c.cfg.Now().Sub(t0) + 60e9) // every Lease expired
	if code, body := post(t, srv.URL+"/v1/nodes/n1/drain"); code != 503 {
		t.Errorf("drain of a node that is down: %d %s", code, body)
	}
}
