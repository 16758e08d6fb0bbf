package controller

import (
	"io"
	"net/http"
	"net/http/httptest"
	"os/exec"
	"strings"
	"sync"
	"testing"

	"k8s.io/apimachinery/pkg/runtime"
)

// TestNodeTokenOfIsOpenssl: the controller derives a node's token as
// scripts/fleet.sh does with openssl (printf NAME | openssl dgst -sha256
// -hmac KEY): a difference would lock the controller out of every node.
func TestNodeTokenOfIsOpenssl(t *testing.T) {
	if _, err := exec.LookPath("openssl"); err != nil {
		t.Skip("no openssl")
	}
	for _, name := range []string{"node-1", "node-15", "a.b-c"} {
		key := "Qx3k9ZpL0aBcDeFgHiJkLmNoPqRsTuVw"
		cmd := exec.Command("openssl", "dgst", "-sha256", "-hmac", key, "-r")
		cmd.Stdin = strings.NewReader(name)
		out, err := cmd.Output()
		if err != nil {
			t.Fatal(err)
		}
		want, _, _ := strings.Cut(string(out), " ")
		if got := NodeTokenOf([]byte(key), name); got != want {
			t.Errorf("NodeTokenOf(%s) = %s, openssl says %s", name, got, want)
		}
	}
	if NodeTokenOf([]byte("k"), "node-1") == NodeTokenOf([]byte("k"), "node-2") {
		t.Error("two nodes share a token")
	}
}

// TestProxyGivesEachNodeItsOwnToken: with a node token key, a request to a
// sandbox goes on to its node with that node's token, never another's nor
// the fleet's shared one.
func TestProxyGivesEachNodeItsOwnToken(t *testing.T) {
	var mu sync.Mutex
	got := map[string]string{}
	serve := func(name string) *httptest.Server {
		return httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			mu.Lock()
			got[name] = r.Header.Get("Authorization")
			mu.Unlock()
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusCreated)
			io.WriteString(w, `{"id":"ex_1","sandboxId":"sb_aaaaaaaaaa","cmd":["true"],"state":"running","startedAt":"2026-12-01T10:00:00Z"}`)
		}))
	}
	n1, n2 := serve("n1"), serve("n2")
	defer n1.Close()
	defer n2.Close()
	f := newTestFleet(t, []runtime.Object{
		nodeAt(t, "n1", n1.URL), nodeAt(t, "n2", n2.URL),
		sandboxObj(t, "sb_aaaaaaaaaa", "n1", "ready", t0),
		sandboxObj(t, "sb_bbbbbbbbbb", "n2", "ready", t0),
	}, lease("n1", t0), lease("n2", t0))
	f.c.cfg.NodeToken = "shared-token"
	f.c.cfg.NodeTokenKey = []byte("the-fleet-key-0123456789")
	srv := httptest.NewServer(f.c.Handler())
	defer srv.Close()
	for _, id := range []string{"sb_aaaaaaaaaa", "sb_bbbbbbbbbb"} {
		resp, err := http.Post(srv.URL+"/v1/sandboxes/"+id+"/exec", "application/json", strings.NewReader(`{"cmd":["true"]}`))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusCreated {
			t.Fatalf("exec in %s: %d", id, resp.StatusCode)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	for _, n := range []string{"n1", "n2"} {
		if want := "Bearer " + NodeTokenOf(f.c.cfg.NodeTokenKey, n); got[n] != want {
			t.Errorf("node %s was sent %q, want its own %q", n, got[n], want)
		}
	}
}
