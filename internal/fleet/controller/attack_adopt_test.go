package controller

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/http/httptrace"
	"net/textproto"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"sbx.dev/sbx/api"
	"sbx.dev/sbx/client"
	"sbx.dev/sbx/internal/fleet/v1alpha1"
)

// TestAttackAdoptElsewhereOthersRef: a resume of a stopped sandbox whose
// node is down, its object's sbx.image-ref naming another sandbox's stop
// image (a kubectl user's edit, a stale copy of another object). The
// target adopted what the ref held, the other sandbox, and the resume
// failed only after: that sandbox was left copied on the target, a second
// holder of it, its own node none the wiser.
func TestAttackAdoptElsewhereOthersRef(t *testing.T) {
	ctx := context.Background()
	const id, other = "sb_mineaaaaaa", "sb_othersaaaa"
	mn := newMoveNet(t, "a", "b")
	f := moveFleet(t, mn, id, "a")
	otherRef := "127.0.0.1:5000/sbx/stops:" + other + "-im_x@sha256:" + "1234567890123456789012345678901234567890123456789012345678901234"
	mn.mu.Lock()
	mn.refs[otherRef] = other
	mn.mu.Unlock()
	res := f.dyn.Resource(v1alpha1.SandboxesResource).Namespace(v1alpha1.DefaultNamespace)
	u, err := res.Get(ctx, v1alpha1.ObjectName(id), metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	_ = unstructured.SetNestedField(u.Object, v1alpha1.OperatingModeSuspended, "spec", "operatingMode")
	_ = unstructured.SetNestedStringMap(u.Object, map[string]string{api.MetaImageRef: otherRef}, "spec", "meta")
	if _, err := res.Update(ctx, u, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if to, err := f.c.adoptElsewhere(ctx, id, "a", false, nil); err == nil {
		t.Errorf("resumed elsewhere, on %s, through another sandbox's image", to.obj.GetName())
	}
	if st := mn.has("b", other); st != "" {
		t.Errorf("node b holds a %s copy of sandbox %s, adopted for %s", st, other, id)
	}
	if sb := f.sandbox(t, id); sb.Spec.NodeName != "a" {
		t.Errorf("sandbox %s bound to %s, want a still", id, sb.Spec.NodeName)
	}
}

// TestAdoptElsewhereWithoutMemory: the one other node cannot restore the
// memory of a dead node's stopped sandbox (another runsc). Requiring the
// memory, the resume waits for a node where it restores, then gives up
// saying why, nothing adopted, the object where it was; not requiring it,
// that node adopts the disk alone (its resume boots from the disk).
func TestAdoptElsewhereWithoutMemory(t *testing.T) {
	ctx := context.Background()
	const id = "sb_lonelyaaaa"
	f, mn := lonelyFleet(t, id)
	f.c.resumeWait = resumeRecheck // one look again
	if _, err := f.c.adoptElsewhere(ctx, id, "a", true, nil); !errors.Is(err, errNoTarget) || !strings.Contains(err.Error(), "runsc sha256 differs") || !strings.Contains(err.Error(), "waited") {
		t.Fatalf("requiring the memory: %v, want no node, after a wait, saying why", err)
	}
	if st := mn.has("b", id); st != "" || f.sandbox(t, id).Spec.NodeName != "a" {
		t.Fatalf("requiring the memory: b holds %q, bound to %s", st, f.sandbox(t, id).Spec.NodeName)
	}
	to, err := f.c.adoptElsewhere(ctx, id, "a", false, nil)
	if err != nil || to.obj.GetName() != "b" {
		t.Fatalf("not requiring the memory: %v", err)
	}
	mn.mu.Lock()
	adopts := mn.nodes["b"].adopts
	mn.mu.Unlock()
	if len(adopts) != 1 || !adopts[0].WithoutMemory || adopts[0].ID != id {
		t.Errorf("b was asked %+v, want one adopt of %s without its memory", adopts, id)
	}
	if sb := f.sandbox(t, id); sb.Spec.NodeName != "b" {
		t.Errorf("bound to %s, want b", sb.Spec.NodeName)
	}
}

// lonelyFleet is a fleet of nodes a and b where a is down, holding
// stopped sandbox id whose stop image is in the registry, and b cannot
// restore its memory (another runsc).
func lonelyFleet(t *testing.T, id string) (*testFleet, *moveNet) {
	t.Helper()
	ctx := context.Background()
	mn := newMoveNet(t, "a", "b")
	f := moveFleet(t, mn, id, "a")
	ref := "127.0.0.1:5000/sbx/stops:" + id + "-im_x@sha256:" + "1234567890123456789012345678901234567890123456789012345678901234"
	mn.mu.Lock()
	mn.refs[ref] = id
	mn.mu.Unlock()
	nodes := f.dyn.Resource(v1alpha1.SandboxNodesResource)
	nb, err := nodes.Get(ctx, "b", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	_ = unstructured.SetNestedField(nb.Object, "runsc-b", "status", "runscSHA256")
	if _, err := nodes.Update(ctx, nb, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	res := f.dyn.Resource(v1alpha1.SandboxesResource).Namespace(v1alpha1.DefaultNamespace)
	u, err := res.Get(ctx, v1alpha1.ObjectName(id), metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	_ = unstructured.SetNestedField(u.Object, v1alpha1.OperatingModeSuspended, "spec", "operatingMode")
	_ = unstructured.SetNestedStringMap(u.Object, map[string]string{api.MetaImageRef: ref}, "spec", "meta")
	if _, err := res.Update(ctx, u, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	return f, mn
}

// TestResumeSaysWhyItWaits: a resume through the controller that requires
// its memory, with no node where it restores, hears why it waits while it
// waits (a 102 with the why, through client.OnWait), then the refusal; a
// request that did not ask is sent no 102.
func TestResumeSaysWhyItWaits(t *testing.T) {
	const id = "sb_waitingaaa"
	f, _ := lonelyFleet(t, id)
	f.c.resumeWait = 2 * resumeRecheck
	// a is down: its Lease gone
	if err := f.kube.CoordinationV1().Leases(v1alpha1.DefaultNamespace).Delete(context.Background(), "a", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(f.c.Handler())
	defer srv.Close()
	c, err := client.New("tcp://" + strings.TrimPrefix(srv.URL, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	var whys []string
	start := time.Now()
	_, err = c.Sandbox(id).Resume(context.Background(), client.RequireMemory(), client.OnWait(func(why string) {
		whys = append(whys, fmt.Sprintf("%s after %s", why, time.Since(start).Round(time.Millisecond)))
	}))
	if !errors.Is(err, api.ErrUnavailable) || !strings.Contains(err.Error(), "runsc sha256 differs") {
		t.Fatalf("the resume: %v, want unavailable, saying why", err)
	}
	// told once: the why stays the same over the rechecks
	if len(whys) != 1 || !strings.Contains(whys[0], "waiting up to 4s for a node where its memory restores") || !strings.Contains(whys[0], "runsc sha256 differs") {
		t.Fatalf("while it waited the resume heard %q", whys)
	}
	// not asked, not sent
	got1xx := 0
	ctx := httptrace.WithClientTrace(context.Background(), &httptrace.ClientTrace{
		Got1xxResponse: func(int, textproto.MIMEHeader) error { got1xx++; return nil },
	})
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL+"/v1/sandboxes/"+id+"/resume", strings.NewReader(`{"requireMemory":true}`))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if got1xx != 0 || resp.StatusCode != http.StatusServiceUnavailable {
		t.Errorf("a resume that did not ask for progress: %d 1xx answers, then %d", got1xx, resp.StatusCode)
	}
}
