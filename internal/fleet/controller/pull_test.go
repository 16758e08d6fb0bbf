package controller

import (
	"context"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/google/go-containerregistry/pkg/registry"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"sbx.dev/sbx/internal/fleet/v1alpha1"
	"sbx.dev/sbx/internal/snapstore"
)

const (
	runscA = "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"
	runscB = "bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb"
)

// pullNode is a ready SandboxNode at url with runsc sha256 runsc, disk free
// and the layers it holds.
func pullNode(t *testing.T, name, url, runsc string, free int64, cordoned bool, layers ...string) runtime.Object {
	return unstr(t, &v1alpha1.SandboxNode{
		TypeMeta:   metav1.TypeMeta{APIVersion: v1alpha1.APIVersion, Kind: v1alpha1.KindSandboxNode},
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec:       v1alpha1.SandboxNodeSpec{Unschedulable: cordoned},
		Status: v1alpha1.SandboxNodeStatus{
			Address: "tcp://" + strings.TrimPrefix(url, "http://"), RunscSHA256: runsc, CPUFeatures: []string{"fpu", "sse4_2"}, CacheLineBytes: 64,
			Capacity: v1alpha1.Capacity{CPUs: 2, MemoryBytes: 8 << 30, DiskFreeBytes: free}, Layers: layers,
			Conditions: []metav1.Condition{{Type: v1alpha1.ConditionReady, Status: metav1.ConditionTrue, Reason: v1alpha1.ReasonAgentPublishing, LastTransitionTime: metav1.NewTime(t0)}},
		},
	})
}

// TestPullPlaced: a pull through the controller goes to a node where its
// memory restores, holding most of its files and its template; a cordoned
// node is passed over; a memory image no node restores goes where it fits
// otherwise (it becomes a disk snapshot there); a registry the controller
// cannot read leaves the pull to the first ready node, which says why; no
// node with room is refused, saying why.
func TestPullPlaced(t *testing.T) {
	reg := httptest.NewServer(registry.New(registry.Logger(log.New(io.Discard, "", 0))))
	defer reg.Close()
	dir := t.TempDir()
	os.MkdirAll(filepath.Join(dir, "memory"), 0o700)
	os.WriteFile(filepath.Join(dir, "disk.tar"), []byte("disk"), 0o600)
	os.WriteFile(filepath.Join(dir, "memory", "pages.img"), []byte("pages"), 0o600)
	st, err := snapstore.Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	host := strings.TrimPrefix(reg.URL, "http://")
	tv := "sha256:" + strings.Repeat("7", 64)
	push := func(tag, runsc string) (string, snapstore.Manifest) {
		ref, man, err := st.Push(context.Background(), host+"/sbx/p:"+tag, dir, snapstore.Manifest{Name: "p", Memory: true, RunscSHA256: runsc,
			CPUFeatures: []string{"fpu"}, CacheLineBytes: 64, Template: "tiny", TemplateVersion: tv}, nil)
		if err != nil {
			t.Fatal(err)
		}
		return ref, man
	}
	refA, manA := push("a", runscA)
	refB, _ := push("b", runscB+"c") // a runsc no node has
	_ = refB
	var pages string
	for _, f := range manA.Files {
		if f.Path == "memory/pages.img" {
			pages = f.Digest
		}
	}

	var mu sync.Mutex
	got := map[string][]string{}
	serve := func(name string) *httptest.Server {
		return httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			b, _ := io.ReadAll(r.Body)
			mu.Lock()
			got[name] = append(got[name], r.URL.Path+" "+string(b))
			mu.Unlock()
			io.WriteString(w, `{"snapshot":{"name":"p","id":"im_1","template":"tiny","createdAt":"2026-12-01T10:00:00Z","sizeBytes":1},"ref":"x","pulledBytes":0}`)
		}))
	}
	s1, s2, s3, s4 := serve("n1"), serve("n2"), serve("n3"), serve("n4")
	defer s1.Close()
	defer s2.Close()
	defer s3.Close()
	defer s4.Close()

	for _, tc := range []struct {
		name  string
		nodes []runtime.Object
		body  string
		want  string // the node the pull reaches, "" for none
		code  int
		says  string
	}{
		{"where the memory restores, holding its layers", []runtime.Object{
			pullNode(t, "n1", s1.URL, runscB, 1<<30, false, pages, tv),
			pullNode(t, "n2", s2.URL, runscA, 1<<30, false),
			pullNode(t, "n3", s3.URL, runscA, 1<<30, false, pages, tv),
			pullNode(t, "n4", s4.URL, runscA, 1<<30, true, pages, tv),
		}, `{"ref":"` + refA + `"}`, "n3", 200, ""},
		{"the one holding layers cordoned", []runtime.Object{
			pullNode(t, "n1", s1.URL, runscB, 1<<30, false, pages, tv),
			pullNode(t, "n2", s2.URL, runscA, 1<<30, false),
			pullNode(t, "n3", s3.URL, runscA, 1<<30, true, pages, tv),
		}, `{"ref":"` + refA + `","name":"q"}`, "n2", 200, ""},
		{"a memory image no node restores", []runtime.Object{
			pullNode(t, "n1", s1.URL, runscA, 1<<30, false),
			pullNode(t, "n2", s2.URL, runscA, 1<<30, false, pages, tv),
		}, `{"ref":"` + refB + `"}`, "n2", 200, ""},
		{"a registry the controller cannot read", []runtime.Object{
			pullNode(t, "n1", s1.URL, runscA, 1<<30, false),
			pullNode(t, "n2", s2.URL, runscA, 1<<30, false, pages, tv),
		}, `{"ref":"127.0.0.1:1/sbx/p:a"}`, "n1", 200, ""},
		{"no node with room", []runtime.Object{
			pullNode(t, "n1", s1.URL, runscA, 3, false),
			pullNode(t, "n2", s2.URL, runscA, 0, false),
		}, `{"ref":"` + refA + `"}`, "", 503, "too little disk"},
	} {
		mu.Lock()
		got = map[string][]string{}
		mu.Unlock()
		f := newTestFleet(t, tc.nodes, lease("n1", t0), lease("n2", t0), lease("n3", t0), lease("n4", t0))
		srv := httptest.NewServer(f.c.Handler())
		resp, err := http.Post(srv.URL+"/v1/snapshots/pull", "application/json", strings.NewReader(tc.body))
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		srv.Close()
		if resp.StatusCode != tc.code || !strings.Contains(string(b), tc.says) {
			t.Errorf("%s: %d %s, want %d saying %q", tc.name, resp.StatusCode, b, tc.code, tc.says)
		}
		mu.Lock()
		for n, reqs := range got {
			if n != tc.want {
				t.Errorf("%s: node %s got %v, want the pull on %q", tc.name, n, reqs, tc.want)
			} else if len(reqs) != 1 || reqs[0] != "/v1/snapshots/pull "+tc.body {
				t.Errorf("%s: node %s got %v, want the pull, body whole", tc.name, n, reqs)
			}
		}
		if tc.want != "" && len(got[tc.want]) == 0 {
			t.Errorf("%s: the pull never reached %s", tc.name, tc.want)
		}
		mu.Unlock()
	}
}
