package controller

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"

	"sbx.dev/sbx/api"
	"sbx.dev/sbx/client"
	"sbx.dev/sbx/internal/fleet/v1alpha1"
)

// Attacks on the controller's routing of one sandbox's requests (issue 24,
// second round): proxy.go's sandboxNode and forwardOr, http.go's
// getSandbox.

// TestAttack24bSameNameTwoNodes: sbx names are unique on a node, not in
// the fleet: two creates named web may be placed on two nodes. A request
// to "web" then went to whichever was made first, so `sbx rm web` deleted
// one of the two at random to the user. It must be refused, naming both
// ids; an id still reaches its own node.
func TestAttack24bSameNameTwoNodes(t *testing.T) {
	var mu sync.Mutex
	var got []string
	asked := func() []string {
		mu.Lock()
		defer mu.Unlock()
		return append([]string(nil), got...)
	}
	n1 := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		got = append(got, "n1 "+r.Method+" "+r.URL.Path)
		mu.Unlock()
		w.WriteHeader(http.StatusNoContent)
	}))
	defer n1.Close()
	n2 := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		got = append(got, "n2 "+r.Method+" "+r.URL.Path)
		mu.Unlock()
		w.WriteHeader(http.StatusNoContent)
	}))
	defer n2.Close()
	a := sandboxObj(t, "sb_aaaaaaaaaa", "n1", "ready", t0)
	b := sandboxObj(t, "sb_bbbbbbbbbb", "n2", "ready", t0.Add(time.Minute))
	for _, u := range []map[string]any{a.Object, b.Object} {
		u["spec"].(map[string]any)["name"] = "web"
	}
	f := newTestFleet(t, []runtime.Object{nodeAt(t, "n1", n1.URL), nodeAt(t, "n2", n2.URL), a, b}, lease("n1", t0), lease("n2", t0))
	srv := httptest.NewServer(f.c.Handler())
	defer srv.Close()
	do := func(method, path string) (int, string) {
		t.Helper()
		req, _ := http.NewRequest(method, srv.URL+path, nil)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(body)
	}
	if code, body := do("DELETE", "/v1/sandboxes/web"); code != http.StatusConflict || !strings.Contains(body, "sb_aaaaaaaaaa") || !strings.Contains(body, "sb_bbbbbbbbbb") {
		t.Errorf("DELETE web, a name of a sandbox on n1 and of one on n2: %d %s; the nodes were asked %q", code, body, asked())
	}
	if g := asked(); len(g) != 0 {
		t.Errorf("an ambiguous name reached a node: %q", g)
	}
	if code, _ := do("DELETE", "/v1/sandboxes/sb_bbbbbbbbbb"); code != http.StatusNoContent || !slices.Equal(asked(), []string{"n2 DELETE /v1/sandboxes/sb_bbbbbbbbbb"}) {
		t.Errorf("DELETE by id: %d; the nodes were asked %q", code, asked())
	}
}

// TestAttack24bSilentNode: a node whose sbxd is stopped (SIGSTOP, a hung
// host) still has its socket accept, and its Lease holds for up to 15 s
// more. sbx info through the controller is to say what the fleet knows
// when the node is silent; it hung for as long as the client waited
// (http.DefaultTransport has no response header timeout).
func TestAttack24bSilentNode(t *testing.T) {
	release := make(chan struct{})
	node := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-release:
		case <-r.Context().Done():
		}
	}))
	defer node.Close()
	defer close(release)
	f := newTestFleet(t, []runtime.Object{nodeAt(t, "n1", node.URL), sandboxObj(t, "sb_aaaaaaaaaa", "n1", "ready", t0)}, lease("n1", t0))
	if f.c.infoWait <= 0 || f.c.infoWait > 10*time.Second {
		t.Errorf("sbx info waits %s for a silent node", f.c.infoWait)
	}
	f.c.infoWait = 300 * time.Millisecond // the test's, not to wait the default
	srv := httptest.NewServer(f.c.Handler())
	defer srv.Close()
	cl := &http.Client{Timeout: 20 * time.Second}
	start := time.Now()
	resp, err := cl.Get(srv.URL + "/v1/sandboxes/sb_aaaaaaaaaa")
	if err != nil {
		t.Fatalf("sbx info of a sandbox on a silent node: no answer after %s: %v", time.Since(start).Round(time.Second), err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(body), "sb_aaaaaaaaaa") {
		t.Errorf("sbx info of a sandbox on a silent node: %d %s after %s", resp.StatusCode, body, time.Since(start))
	}
}

// TestAttack24bUnixNodeConnections: requests to a node at unix://PATH
// each made a new http.Transport, whose kept-alive connection was never
// used again nor closed by the controller: one open connection (and two
// goroutines) per request, until the node's idle timeout.
func TestAttack24bUnixNodeConnections(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "sbxd.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	var conns atomic.Int32
	node := &http.Server{
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusNoContent) }),
		ConnState: func(_ net.Conn, st http.ConnState) {
			if st == http.StateNew {
				conns.Add(1)
			}
		},
	}
	go node.Serve(l)
	defer node.Close()
	n := nodeObj(t, "n1")
	if err := unstructured.SetNestedField(n.Object, "unix://"+sock, "status", "address"); err != nil {
		t.Fatal(err)
	}
	f := newTestFleet(t, []runtime.Object{n, sandboxObj(t, "sb_aaaaaaaaaa", "n1", "ready", t0)}, lease("n1", t0))
	srv := httptest.NewServer(f.c.Handler())
	defer srv.Close()
	for range 20 {
		resp, err := http.Post(srv.URL+"/v1/sandboxes/sb_aaaaaaaaaa/stop", "", nil)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusNoContent {
			t.Fatalf("stop through the fleet: %d", resp.StatusCode)
		}
	}
	if c := conns.Load(); c > 2 {
		t.Errorf("20 requests in turn to a node at unix://: %d connections to it, want them kept alive and reused", c)
	}
}

// TestAttack24bDotSegments: a path whose escaped form hides . or ..
// segments (%2F, %2E) passes the controller's mux as one sandbox's (or a
// template's), and was sent on decoded: the node that holds sb_aaaaaaaaaa
// was asked for a path naming sb_bbbbbbbbbb, of another node. It is
// refused at the controller.
func TestAttack24bDotSegments(t *testing.T) {
	var mu sync.Mutex
	var got []string
	node := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		got = append(got, r.RequestURI)
		mu.Unlock()
		w.WriteHeader(http.StatusNoContent)
	}))
	defer node.Close()
	f := newTestFleet(t, []runtime.Object{nodeAt(t, "n1", node.URL), sandboxObj(t, "sb_aaaaaaaaaa", "n1", "ready", t0),
		sandboxObj(t, "sb_bbbbbbbbbb", "n2", "ready", t0)}, lease("n1", t0))
	srv := httptest.NewServer(f.c.Handler())
	defer srv.Close()
	for _, p := range []string{
		"/v1/sandboxes/sb_aaaaaaaaaa/execs/x%2F..%2F..%2F..%2Fsb_bbbbbbbbbb%2Fstop",
		"/v1/sandboxes/sb_aaaaaaaaaa/%2E%2E/sb_bbbbbbbbbb/stop",
		"/v1/sandboxes/sb_aaaaaaaaaa/..%2Fsb_bbbbbbbbbb/stop",
		"/v1/templates/%2E%2E/sandboxes/sb_bbbbbbbbbb/stop",
	} {
		c, err := net.Dial("tcp", srv.Listener.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		// by hand: the Go client would clean the path
		io.WriteString(c, "POST "+p+" HTTP/1.1\r\nHost: fleet\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		c.Close()
		if resp.StatusCode != http.StatusBadRequest {
			t.Errorf("POST %s: %d, want 400", p, resp.StatusCode)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if len(got) != 0 {
		t.Errorf("the node of sb_aaaaaaaaaa was asked %q", got)
	}
}

// TestAttack24bCreateTakenName: a create through the fleet named as a
// sandbox of the fleet is refused, as one sbxd refuses a taken name: it was
// asked, placed on the other node (whose sbxd has no such name), and made,
// so the fleet had two sandboxes of one name. A name only a refused
// object asked for is free.
func TestAttack24bCreateTakenName(t *testing.T) {
	a := sandboxObj(t, "sb_aaaaaaaaaa", "n1", "ready", t0)
	a.Object["spec"].(map[string]any)["name"] = "web"
	refused := unstr(t, &v1alpha1.Sandbox{
		TypeMeta:   metav1.TypeMeta{APIVersion: v1alpha1.APIVersion, Kind: v1alpha1.KindSandbox},
		ObjectMeta: metav1.ObjectMeta{Name: "req-refused", Namespace: v1alpha1.DefaultNamespace},
		Spec:       v1alpha1.SandboxSpec{Template: "missing", Name: "db", NodeName: "n1"},
		Status:     v1alpha1.SandboxStatus{State: "error", Reason: "node n1 could not make it: template missing not found"},
	})
	f := newTestFleet(t, []runtime.Object{nodeObj(t, "n1"), nodeObj(t, "n2"), a, refused}, lease("n1", t0), lease("n2", t0))
	srv := httptest.NewServer(f.c.Handler())
	defer srv.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	c, err := client.New(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	_, err = c.Create(ctx, client.WithTemplate("tiny"), client.WithName("web"))
	if !errors.Is(err, api.ErrConflict) {
		t.Errorf("a create named web, the name of sb_aaaaaaaaaa: %v, want a conflict", err)
	}
	l, _ := f.dyn.Resource(v1alpha1.SandboxesResource).Namespace(v1alpha1.DefaultNamespace).List(ctx, metav1.ListOptions{})
	if n := len(l.Items); n != 2 {
		t.Errorf("%d objects after a create of a taken name, want the 2 there were", n)
	}
	// db was only refused: its create is asked (and waits here, no node
	// making anything: the wait ends with the context)
	short, cancelShort := context.WithTimeout(ctx, 300*time.Millisecond)
	defer cancelShort()
	_, err = c.Create(short, client.WithTemplate("tiny"), client.WithName("db"))
	if errors.Is(err, api.ErrConflict) {
		t.Errorf("a create named db, asked before by an object its node refused: %v", err)
	}
}
