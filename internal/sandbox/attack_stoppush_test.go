package sandbox

import (
	"context"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/registry"

	"sbx.dev/sbx/api"
)

// Attacks on the background push of stop images (stoppush.go): a registry
// that answers wrong, at length, or not at all.

// stopPushManager is a test manager pushing its stop images to srv, its
// retries 10 ms apart.
func stopPushManager(t *testing.T, srv *httptest.Server) *Manager {
	t.Helper()
	m, _ := newTestManager(t, time.Hour)
	m.cfg.HostFacts = func() (HostFacts, error) { return testFacts, nil }
	m.cfg.StopRepository = strings.TrimPrefix(srv.URL, "http://") + "/sbx/stops"
	m.cfg.After = func(time.Duration) <-chan time.Time { return time.After(10 * time.Millisecond) }
	return m
}

func metaOf(t *testing.T, m *Manager, id string) map[string]string {
	t.Helper()
	got, err := m.cfg.Store.Sandbox(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	return got.Meta
}

// TestAttackStopPushRegistryAnswers: a registry that answers a push 404
// (a project not made yet, as Harbor says it) was taken for a sandbox no
// longer stopped: the push was given up for good, its meta saying nothing,
// so its node going down lost it for the fleet ("its node pushes none").
// One answering with a long error put all of it in the sandbox's meta,
// past any meta value's bound.
func TestAttackStopPushRegistryAnswers(t *testing.T) {
	for _, tc := range []struct {
		name   string
		status int
		body   string
	}{
		{"404", http.StatusNotFound, `{"errors":[{"code":"NAME_UNKNOWN","message":"project sbx not found"}]}`},
		{"a long error", http.StatusServiceUnavailable, `{"errors":[{"code":"UNAVAILABLE","message":"` + strings.Repeat("x", 60<<10) + `"}]}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			reg := registry.New(registry.Logger(log.New(io.Discard, "", 0)))
			var bad atomic.Bool
			bad.Store(true)
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if bad.Load() && r.URL.Path != "/v2/" && r.Method != http.MethodHead {
					w.Header().Set("Content-Type", "application/json")
					w.WriteHeader(tc.status)
					io.WriteString(w, tc.body)
					return
				}
				reg.ServeHTTP(w, r)
			}))
			defer srv.Close()
			m := stopPushManager(t, srv)
			sb := stoppedSandbox(t, m, "kept")
			m.pushStopSoon(sb.ID, sb.Image)
			waitUntil(t, "the why in its meta", func() bool { return metaOf(t, m, sb.ID)[api.MetaImagePending] != "" })
			if why := metaOf(t, m, sb.ID)[api.MetaImagePending]; len(why) > 1024 {
				t.Errorf("the why is %d bytes, past a meta value's 1024", len(why))
			}
			bad.Store(false)
			waitUntil(t, "the ref in its meta", func() bool { return strings.Contains(metaOf(t, m, sb.ID)[api.MetaImageRef], "@sha256:") })
		})
	}
}

// TestAttackStopPushHangs: a registry that takes a push and never answers.
// The background push held the sandbox's claim for as long, so a delete or
// resume of it waited for good: a push nobody asked for blocked what its
// user asked.
func TestAttackStopPushHangs(t *testing.T) {
	var asked atomic.Bool
	hang := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/v2/" {
			w.WriteHeader(http.StatusOK)
			return
		}
		asked.Store(true)
		select {
		case <-hang:
		case <-r.Context().Done():
		}
	}))
	defer srv.Close()
	defer close(hang)
	m := stopPushManager(t, srv)
	sb := stoppedSandbox(t, m, "hung")
	m.pushStopSoon(sb.ID, sb.Image)
	waitUntil(t, "the push under way", asked.Load)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := m.Delete(ctx, sb.ID, false); err != nil {
		t.Fatalf("delete with a push hanging: %v", err)
	}
	if _, err := m.cfg.Store.Sandbox(context.Background(), sb.ID); err == nil {
		t.Errorf("sandbox %s is left after its delete", sb.ID)
	}
}

// TestAttackAdoptOthersImage: an adopt told which sandbox the artifact
// must hold (the fleet's resume of a sandbox whose node is down, its ref
// read from an object anyone with kubectl writes) is refused, nothing
// left, when the artifact holds another.
func TestAttackAdoptOthersImage(t *testing.T) {
	ctx := context.Background()
	reg := httptest.NewServer(registry.New(registry.Logger(log.New(io.Discard, "", 0))))
	defer reg.Close()
	m := stopPushManager(t, reg)
	other := stoppedSandbox(t, m, "other")
	res, err := m.PushSandbox(ctx, other.ID, api.PushRequest{Ref: strings.TrimPrefix(reg.URL, "http://") + "/sbx/stops:x"})
	if err != nil {
		t.Fatal(err)
	}
	b := stopPushManager(t, reg)
	if got, err := b.AdoptSandbox(ctx, api.AdoptRequest{Ref: res.Ref, ID: "sb_mineaaaaaa"}); err == nil {
		t.Fatalf("adopted %s for sb_mineaaaaaa", got.ID)
	}
	if sbs, _ := b.cfg.Store.Sandboxes(ctx); len(sbs) != 0 {
		t.Errorf("an adopt refused left %d sandboxes", len(sbs))
	}
	if got, err := b.AdoptSandbox(ctx, api.AdoptRequest{Ref: res.Ref, ID: other.ID}); err != nil || got.ID != other.ID {
		t.Errorf("adopt of its own: %+v %v", got, err)
	}
}
