package controller

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"

	"sbx.dev/sbx/api"
	"sbx.dev/sbx/client"
	"sbx.dev/sbx/internal/fleet/v1alpha1"
)

// nodeAt is a ready SandboxNode whose agent's API is at url (http://...).
func nodeAt(t *testing.T, name, url string) *unstructured.Unstructured {
	u := nodeObj(t, name)
	if err := unstructured.SetNestedField(u.Object, "tcp://"+strings.TrimPrefix(url, "http://"), "status", "address"); err != nil {
		t.Fatal(err)
	}
	return u
}

// TestProxyToTheNode: a request to one sandbox through the controller goes
// on to the node that holds it, by id (a name resolved by the fleet), with
// the node token instead of the controller's; a stream comes back as it is
// written; a sandbox on a node that is down, or on none, is refused, saying
// why; the rest of the API is not served.
func TestProxyToTheNode(t *testing.T) {
	var mu sync.Mutex
	var got []string
	node := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		got = append(got, r.Method+" "+r.URL.Path+"?"+r.URL.RawQuery+" "+r.Header.Get("Authorization"))
		mu.Unlock()
		switch r.URL.Path { // n1's one snapshot, s1
		case "/v1/snapshots":
			io.WriteString(w, `[{"name":"s1","id":"im_1","sandboxId":"sb_aaaaaaaaaa","template":"tiny","memory":true,"createdAt":"2026-12-01T10:00:00Z","sizeBytes":1}]`)
			return
		case "/v1/snapshots/s1":
			if r.Method == http.MethodDelete {
				w.WriteHeader(http.StatusNoContent)
				return
			}
			io.WriteString(w, `{"name":"s1","id":"im_1","sandboxId":"sb_aaaaaaaaaa","template":"tiny","memory":true,"createdAt":"2026-12-01T10:00:00Z","sizeBytes":1}`)
			return
		}
		if strings.HasPrefix(r.URL.Path, "/v1/snapshots/") {
			w.WriteHeader(http.StatusNotFound)
			io.WriteString(w, `{"error":{"code":"not_found","message":"snapshot not found"}}`)
			return
		}
		if strings.HasSuffix(r.URL.Path, "/output") {
			w.Header().Set("Content-Type", "text/event-stream")
			for i := range 3 {
				io.WriteString(w, "data: line"+string(rune('0'+i))+"\n\n")
				w.(http.Flusher).Flush()
				time.Sleep(50 * time.Millisecond)
			}
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, `{"id":"ex_1","sandboxId":"sb_aaaaaaaaaa","cmd":["true"],"state":"running","startedAt":"2026-12-01T10:00:00Z"}`)
	}))
	defer node.Close()
	f := newTestFleet(t, []runtime.Object{
		nodeAt(t, "n1", node.URL), nodeObj(t, "n2"),
		sandboxObj(t, "sb_aaaaaaaaaa", "n1", "ready", t0),
		sandboxObj(t, "sb_bbbbbbbbbb", "n2", "ready", t0),
	}, lease("n1", t0))
	f.c.cfg.NodeToken = "node-token"
	srv := httptest.NewServer(f.c.Handler())
	defer srv.Close()
	do := func(method, path, body string) (int, string) {
		t.Helper()
		req, _ := http.NewRequest(method, srv.URL+path, strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer controller-token")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	// by name: the node is asked by id, with its own token
	if code, body := do("POST", "/v1/sandboxes/n-aaaaaaaaaa/exec?x=1", `{"cmd":["true"]}`); code != http.StatusCreated || !strings.Contains(body, `"ex_1"`) {
		t.Fatalf("exec through the fleet: %d %s", code, body)
	}
	mu.Lock()
	if len(got) != 1 || got[0] != "POST /v1/sandboxes/sb_aaaaaaaaaa/exec?x=1 Bearer node-token" {
		t.Errorf("the node was asked %q", got)
	}
	mu.Unlock()
	// info comes from the node, fresher than the objects
	mu.Lock()
	got = nil
	mu.Unlock()
	if code, _ := do("GET", "/v1/sandboxes/n-aaaaaaaaaa", ""); code != http.StatusCreated {
		t.Errorf("info through the fleet: %d, want the node's answer", code)
	}
	mu.Lock()
	if len(got) != 1 || got[0] != "GET /v1/sandboxes/sb_aaaaaaaaaa? Bearer node-token" {
		t.Errorf("for info the node was asked %q", got)
	}
	mu.Unlock()
	// a stream, line by line as the node writes it
	req, _ := http.NewRequest("GET", srv.URL+"/v1/sandboxes/sb_aaaaaaaaaa/execs/ex_1/output?follow=1", nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	sc := bufio.NewScanner(resp.Body)
	start := time.Now()
	if !sc.Scan() || sc.Text() != "data: line0" {
		t.Fatalf("first line of the stream: %q", sc.Text())
	}
	if first := time.Since(start); first > 100*time.Millisecond {
		t.Logf("the first line took %s (the node writes one every 50 ms)", first)
	}
	rest, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if !strings.Contains(string(rest), "line2") {
		t.Errorf("the rest of the stream: %q", rest)
	}
	// n2 has no Lease: down
	if code, body := do("POST", "/v1/sandboxes/sb_bbbbbbbbbb/stop", ""); code != http.StatusServiceUnavailable || !strings.Contains(body, "on node n2, which is down") {
		t.Errorf("a sandbox on a node that is down: %d %s", code, body)
	}
	if code, body := do("DELETE", "/v1/sandboxes/sb_nonexisting", ""); code != http.StatusNotFound {
		t.Errorf("an unknown sandbox: %d %s", code, body)
	}
	// snapshots: every ready node's, saying its node; one by name goes to
	// the node that holds it
	if code, body := do("GET", "/v1/snapshots", ""); code != http.StatusOK || !strings.Contains(body, `"name":"s1"`) || !strings.Contains(body, `"node":"n1"`) {
		t.Errorf("snapshots through the fleet: %d %s", code, body)
	}
	mu.Lock()
	got = nil
	mu.Unlock()
	if code, body := do("DELETE", "/v1/snapshots/s1", ""); code != http.StatusNoContent {
		t.Errorf("delete of a snapshot through the fleet: %d %s", code, body)
	}
	mu.Lock()
	if len(got) != 2 || got[1] != "DELETE /v1/snapshots/s1? Bearer node-token" {
		t.Errorf("for a snapshot's delete the node was asked %q (a get to find it, then the delete)", got)
	}
	mu.Unlock()
	for _, name := range []string{"nope", "a%2Fb"} {
		if code, body := do("GET", "/v1/snapshots/"+name, ""); code != http.StatusNotFound && code != http.StatusBadRequest {
			t.Errorf("snapshot %q through the fleet: %d %s, want 404 or 400", name, code, body)
		}
	}
	// a template's request goes to the one ready node, n1, as it is
	mu.Lock()
	got = nil
	mu.Unlock()
	if code, body := do("POST", "/v1/templates/tiny/build?force=1", ""); code != http.StatusCreated {
		t.Errorf("a template build through the fleet: %d %s", code, body)
	}
	mu.Lock()
	if len(got) != 1 || got[0] != "POST /v1/templates/tiny/build?force=1 Bearer node-token" {
		t.Errorf("for a template build the node was asked %q", got)
	}
	mu.Unlock()
	// none ready and uncordoned: 503, saying so
	if code, body := do("POST", "/v1/nodes/n1/cordon", ""); code != http.StatusOK {
		t.Fatalf("cordon n1: %d %s", code, body)
	}
	if code, body := do("GET", "/v1/templates", ""); code != http.StatusServiceUnavailable || !strings.Contains(body, "no node of the fleet is ready and uncordoned") {
		t.Errorf("templates with every node cordoned or down: %d %s", code, body)
	}
	// a node that does not answer
	node.Close()
	if code, body := do("GET", "/v1/sandboxes/sb_aaaaaaaaaa/execs", ""); code != http.StatusServiceUnavailable || !strings.Contains(body, "did not answer") {
		t.Errorf("a node that does not answer: %d %s", code, body)
	}
}

// TestCreateThroughTheFleet: a create through the controller, by the Go
// client unchanged, is a Sandbox object that, once its node made it (here
// a goroutine plays placement and the agent), answers as a create of one
// sbxd; one its node refused answers the refusal's kind and reason; what
// the fleet cannot carry yet is refused naming the field.
func TestCreateThroughTheFleet(t *testing.T) {
	f := newTestFleet(t, []runtime.Object{nodeObj(t, "n1")}, lease("n1", t0))
	srv := httptest.NewServer(f.c.Handler())
	defer srv.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	rc := f.dyn.Resource(v1alpha1.SandboxesResource).Namespace(v1alpha1.DefaultNamespace)
	go func() { // placement and n1's agent, played
		for ctx.Err() == nil {
			l, err := rc.List(ctx, metav1.ListOptions{})
			if err == nil {
				for i := range l.Items {
					u := &l.Items[i]
					var sb v1alpha1.Sandbox
					if v1alpha1.FromUnstructured(u, &sb) != nil || sb.Status.State != "" {
						continue
					}
					if sb.Spec.Template == "vanish" { // kubectl delete while it waits
						_ = rc.Delete(ctx, u.GetName(), metav1.DeleteOptions{})
						continue
					}
					if sb.Spec.Template == "busy" { // its node's sbxd cannot make it now
						if len(sb.Status.Conditions) == 0 {
							sb.Status.Conditions = []metav1.Condition{{Type: v1alpha1.ConditionReady, Status: metav1.ConditionFalse, Reason: v1alpha1.ReasonNodeCannotYet, Message: "node n1 cannot make it yet: sbxd is shutting down", LastTransitionTime: metav1.NewTime(t0)}}
							st, _ := v1alpha1.ToUnstructured(&sb.Status)
							u.Object["status"] = st.Object
							_, _ = rc.UpdateStatus(ctx, u, metav1.UpdateOptions{})
						}
						continue
					}
					if sb.Spec.Template == "lostfirst" { // its node went down before making it
						sb.Status.State, sb.Status.Reason = "lost", "node n1 is down: its Lease expired"
					} else if sb.Spec.Template == "missing" {
						sb.Status.State, sb.Status.Reason = "error", "node n1 could not make it: template missing not found"
						sb.Status.Conditions = []metav1.Condition{{Type: v1alpha1.ConditionReady, Status: metav1.ConditionFalse, Reason: v1alpha1.RefusedReason("not_found"), Message: sb.Status.Reason, LastTransitionTime: metav1.NewTime(t0)}}
					} else {
						created := metav1.NewTime(t0)
						sb.Status = v1alpha1.SandboxStatus{ID: "sb_madeinfleet", State: "ready", Node: "n1", CreatedAt: &created}
					}
					st, _ := v1alpha1.ToUnstructured(&sb.Status)
					u.Object["status"] = st.Object
					_, _ = rc.UpdateStatus(ctx, u, metav1.UpdateOptions{})
				}
			}
			time.Sleep(20 * time.Millisecond)
		}
	}()
	c, err := client.New(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	sb, err := c.Create(ctx, client.WithTemplate("tiny"), client.WithName("web"), client.WithTTL(10*time.Minute), client.WithMemoryLimit(256<<20))
	if err != nil {
		t.Fatal(err)
	}
	if sb.ID != "sb_madeinfleet" || sb.Node != "n1" || sb.State != api.StateReady {
		t.Errorf("the create through the fleet: %+v", sb)
	}
	l, _ := rc.List(ctx, metav1.ListOptions{})
	var asked v1alpha1.Sandbox
	for i := range l.Items {
		if v1alpha1.FromUnstructured(&l.Items[i], &asked); asked.Spec.Name == "web" {
			break
		}
	}
	if asked.Spec.Template != "tiny" || asked.Spec.TTL != "10m0s" || asked.Spec.MemoryBytes != 256<<20 || asked.Spec.NodeName != "" {
		t.Errorf("the Sandbox object asked: %+v", asked.Spec)
	}
	if _, err := c.Create(ctx, client.WithTemplate("missing")); err == nil || !strings.Contains(err.Error(), "template missing not found") || !errors.Is(err, api.ErrNotFound) {
		t.Errorf("a create its node refused: %v, want not found with the reason", err)
	}
	for _, tc := range []struct{ template, want string }{
		{"busy", "node n1 cannot make it yet: sbxd is shutting down; nothing was made"},
		{"lostfirst", "node n1 is down: its Lease expired before it made the sandbox; nothing was made"},
	} {
		// answered at once, as one sbxd answers, and withdrawn: nothing
		// is made after the answer
		start := time.Now()
		_, err := c.Create(ctx, client.WithTemplate(tc.template))
		if err == nil || !strings.Contains(err.Error(), tc.want) || !errors.Is(err, api.ErrUnavailable) || time.Since(start) > 30*time.Second {
			t.Errorf("a create whose node cannot make it (%s): %v after %s, want unavailable, %q, at once", tc.template, err, time.Since(start), tc.want)
		}
		l, _ := rc.List(ctx, metav1.ListOptions{})
		for i := range l.Items {
			var o v1alpha1.Sandbox
			if v1alpha1.FromUnstructured(&l.Items[i], &o) == nil && o.Spec.Template == tc.template {
				t.Errorf("the object of a create answered 503 (%s) is still there: %+v", tc.template, o.Status)
			}
		}
	}
	if _, err := c.Create(ctx, client.WithTemplate("vanish")); err == nil || !strings.Contains(err.Error(), "was deleted before a node made") || !errors.Is(err, api.ErrNotFound) {
		t.Errorf("a create whose object was deleted while it waited: %v, want not found, saying so", err)
	}
	body, _ := json.Marshal(api.CreateRequest{Template: "tiny", From: "snap"})
	resp, err := http.Post(srv.URL+"/v1/sandboxes", "application/json", strings.NewReader(string(body)))
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusNotFound || !strings.Contains(string(b), `no snapshot \"snap\" on any ready node`) {
		t.Errorf("a create from a snapshot no node holds, through the fleet: %d %s", resp.StatusCode, b)
	}
}

// TestProxyStreamWhileBodyComes: a node that answers (a fork's stream)
// before the request's body has all come, as the transport may still be
// reading it when the node's header comes back. The answer streams to its
// end and the node gets the whole body: before, the controller's server
// read and closed the rest of the body as the proxy wrote the header, the
// transport failed reading it and dropped the connection to the node in
// the middle of the answer (CI: "the stream from sbxd broke before its
// end: unexpected EOF" on a fork through the fleet).
func TestProxyStreamWhileBodyComes(t *testing.T) {
	gotBody := make(chan string, 1)
	node := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_ = http.NewResponseController(w).EnableFullDuplex()
		w.Header().Set("Content-Type", "text/event-stream")
		w.WriteHeader(http.StatusOK)
		w.(http.Flusher).Flush()
		b, err := io.ReadAll(r.Body)
		if err != nil {
			b = []byte("error: " + err.Error())
		}
		gotBody <- string(b)
		for i := range 3 {
			io.WriteString(w, "data: event"+string(rune('0'+i))+"\n\n")
			w.(http.Flusher).Flush()
		}
	}))
	defer node.Close()
	f := newTestFleet(t, []runtime.Object{nodeAt(t, "n1", node.URL), sandboxObj(t, "sb_aaaaaaaaaa", "n1", "ready", t0)}, lease("n1", t0))
	srv := httptest.NewServer(f.c.Handler())
	defer srv.Close()

	pr, pw := io.Pipe()
	go func() {
		io.WriteString(pw, `{"memory":true,`)
		time.Sleep(300 * time.Millisecond) // tested: the rest comes after the node's header
		io.WriteString(pw, `"count":6}`)
		pw.Close()
	}()
	req, _ := http.NewRequest("POST", srv.URL+"/v1/sandboxes/sb_aaaaaaaaaa/fork", pr)
	req.ContentLength = int64(len(`{"memory":true,"count":6}`))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil || strings.Count(string(b), "data: event") != 3 {
		t.Errorf("the stream through the controller: %q, %v; want its 3 events", b, err)
	}
	select {
	case got := <-gotBody:
		if got != `{"memory":true,"count":6}` {
			t.Errorf("the node got the body %q", got)
		}
	case <-time.After(5 * time.Second):
		t.Error("the node never got the whole body")
	}
}
