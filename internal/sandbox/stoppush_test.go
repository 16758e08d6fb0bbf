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

// TestStopImagePushedLater: with the fleet's registry down, a stop image
// stays on its node, the sandbox's meta says why, and the push is tried
// again until the registry is back; then the ref is in its meta and the
// why is gone. A push whose sandbox moved on (resumed: another image)
// records nothing.
func TestStopImagePushedLater(t *testing.T) {
	ctx := context.Background()
	m, down := fleetManagerRegistryDown(t)
	sb := stoppedSandbox(t, m, "kept")

	m.pushStopSoon(sb.ID, sb.Image)
	meta := func() map[string]string {
		got, err := m.cfg.Store.Sandbox(ctx, sb.ID)
		if err != nil {
			t.Fatal(err)
		}
		return got.Meta
	}
	waitUntil(t, "the why in its meta", func() bool { return strings.Contains(meta()[api.MetaImagePending], "not in the fleet's registry yet") })
	if meta()[api.MetaImageRef] != "" {
		t.Fatalf("a ref with the registry down: %v", meta())
	}
	if got, _ := m.cfg.Store.Sandbox(ctx, sb.ID); got.State != api.StateStopped || !m.images.isComplete(got.Image) {
		t.Fatalf("the sandbox with its push failing: %+v, want stopped with its image here", got)
	}
	down.Store(false)
	waitUntil(t, "the ref in its meta", func() bool { return strings.Contains(meta()[api.MetaImageRef], "@sha256:") })
	if why := meta()[api.MetaImagePending]; why != "" {
		t.Errorf("pushed, and its meta still says %q", why)
	}
	// the ref is another node's to adopt
	b, _ := newTestManager(t, time.Hour)
	b.cfg.HostFacts = m.cfg.HostFacts
	if got, err := b.AdoptSandbox(ctx, api.AdoptRequest{Ref: meta()[api.MetaImageRef]}); err != nil || got.ID != sb.ID {
		t.Fatalf("adopt from the pushed ref: %+v %v", got, err)
	}

	// the image changed under a push (resumed and stopped again): its ref
	// is not recorded on the new one
	if ok, err := m.cfg.Store.SetMetaKey(ctx, sb.ID, api.StateStopped, "im_other", api.MetaImageRef, "stale"); err != nil || ok {
		t.Errorf("a ref set on another image: %v %v", ok, err)
	}
}

func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("gave up waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestStopPushYields: a delete of a stopped sandbox whose stop image is
// being pushed to a registry that never answers does not wait behind the
// push: the push is cut, and the delete is done.
func TestStopPushYields(t *testing.T) {
	hung := make(chan struct{})
	var asked atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		asked.Add(1)
		select {
		case <-hung:
		case <-r.Context().Done():
		}
	}))
	defer srv.Close()
	defer close(hung)
	m, _ := newTestManager(t, time.Hour)
	m.cfg.HostFacts = func() (HostFacts, error) { return testFacts, nil }
	m.cfg.StopRepository = strings.TrimPrefix(srv.URL, "http://") + "/sbx/stops"
	m.cfg.After = func(time.Duration) <-chan time.Time { return time.After(10 * time.Millisecond) }
	sb := stoppedSandbox(t, m, "")
	m.pushStopSoon(sb.ID, sb.Image)
	waitUntil(t, "the push to reach the registry", func() bool { return asked.Load() > 0 })
	done := make(chan error, 1)
	go func() {
		_, err := m.Delete(context.Background(), sb.ID, false)
		done <- err
	}()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("delete during a push: %v", err)
		}
	case <-time.After(30 * time.Second): // a liveness bound: the registry never answers
		t.Fatal("a delete waited behind a push to a registry that does not answer")
	}
	if _, err := m.cfg.Store.Sandbox(context.Background(), sb.ID); err == nil {
		t.Error("the sandbox is still recorded after its delete")
	}
}

// fleetManagerRegistryDown is a test manager in a fleet whose registry
// answers 503 until down is set false; its retries wait 10 ms.
func fleetManagerRegistryDown(t *testing.T) (*Manager, *atomic.Bool) {
	t.Helper()
	reg := registry.New(registry.Logger(log.New(io.Discard, "", 0)))
	down := new(atomic.Bool)
	down.Store(true)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if down.Load() {
			http.Error(w, "down for maintenance", http.StatusServiceUnavailable)
			return
		}
		reg.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	m, _ := newTestManager(t, time.Hour)
	m.cfg.HostFacts = func() (HostFacts, error) { return testFacts, nil }
	m.cfg.StopRepository = strings.TrimPrefix(srv.URL, "http://") + "/sbx/stops"
	m.cfg.After = func(time.Duration) <-chan time.Time { return time.After(10 * time.Millisecond) }
	return m, down
}
