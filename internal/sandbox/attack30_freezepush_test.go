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
)

// TestAttack30NamedSnapshotPushedUnasked: a freeze is told from a named
// snapshot by its name alone ("freeze-" prefix; the record has no mark),
// and ValidName lets a user name a snapshot freeze-ANYTHING. So a user's
// `sbx snapshot SB freeze-mine --memory` (its memory: keys, tokens) is
// pushed to the fleet's registry unasked at sbxd's next start
// (pushFreezesLeft), against freezepush.go's "Named snapshots are pushed
// when asked", and outlives a `snapshot rm` there.
func TestAttack30NamedSnapshotPushedUnasked(t *testing.T) {
	ctx := context.Background()
	if err := ValidName("freeze-mine"); err != nil {
		t.Skipf("freeze- names are reserved now: %v", err)
	}
	reg := registry.New(registry.Logger(log.New(io.Discard, "", 0)))
	var uploads atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPut || r.Method == http.MethodPost || r.Method == http.MethodPatch {
			uploads.Add(1)
		}
		reg.ServeHTTP(w, r)
	}))
	defer srv.Close()
	m, _ := newTestManager(t, time.Hour)
	m.cfg.HostFacts = func() (HostFacts, error) { return testFacts, nil }
	m.cfg.StopRepository = strings.TrimPrefix(srv.URL, "http://") + "/sbx/stops"
	m.cfg.After = func(time.Duration) <-chan time.Time { return time.After(10 * time.Millisecond) }

	// what Manager.Snapshot records for a user's named snapshot with its
	// memory (snapshotRecord): the same record a freeze has
	mine := namedSnapshot(t, m, "freeze-mine")
	if err := m.pushFreezesLeft(ctx); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(3 * time.Second)
	for time.Now().Before(deadline) {
		got, err := m.GetSnapshot(ctx, mine.Name)
		if err != nil {
			t.Fatal(err)
		}
		if got.Ref != "" {
			t.Fatalf("the user's snapshot %q was pushed unasked to the fleet's registry: %s (%d uploads)", mine.Name, got.Ref, uploads.Load())
		}
		time.Sleep(50 * time.Millisecond)
	}
	if n := uploads.Load(); n > 0 {
		t.Fatalf("the user's snapshot %q: %d uploads to the fleet's registry, unasked", mine.Name, n)
	}
}
