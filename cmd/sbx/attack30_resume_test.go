package main

import (
	"encoding/json"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"sbx.dev/sbx/api"
)

// TestAttack30ResumeWaitIsQuoted: the why of a fleet's 102 answer is built
// from SandboxNode status fields that node agents write (placement.Why),
// and the controller (progressOf) only blanks C0 controls; a hostile
// controller, or anything that speaks for it, sends whatever it likes.
// `sbx resume` prints Sbx-Waiting to the terminal as it came, so a bidi
// override and a C1 CSI (U+009B) reach the terminal raw — unlike every other name the CLI prints
// (hostile_test.go). It also prints every 102 it hears, however many: the
// controller sends at most 8 (maxProgress), and a hostile one floods the
// terminal.
func TestAttack30ResumeWaitIsQuoted(t *testing.T) {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/sandboxes/{id}/resume", func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get(api.HeaderProgress) == "102" {
			for i := range 20 {
				// what progressOf lets through from a node's status: a
				// bidi override and a C1 CSI (Go's client itself refuses
				// a C0 ESC in a header, so only these reach sbx)
				why := "waiting up to 2m0s for a node where its memory restores: n2: \u202eexe.txt\u009b[2J" + strings.Repeat("y", i)
				w.Header().Set(api.HeaderWaiting, why)
				w.WriteHeader(http.StatusProcessing)
				w.Header().Del(api.HeaderWaiting)
			}
		}
		json.NewEncoder(w).Encode(api.Sandbox{ID: r.PathValue("id"), State: api.StateReady, MemoryRestored: true})
	})
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	host := "tcp://" + srv.Listener.Addr().(*net.TCPAddr).String()
	code, out, errOut := sbx(host, "resume", "sb_far", "--require-memory")
	if code != 0 {
		t.Fatalf("exit %d: %s%s", code, out, errOut)
	}
	inert(t, "sbx resume's wait", errOut)
	if n := strings.Count(errOut, "sbx: resume sb_far:"); n > 8 {
		t.Errorf("sbx resume printed %d waits; the controller sends at most 8 (maxProgress)", n)
	}
}

// TestAttack30SnapshotInfoRefPending: a freeze the fleet's registry
// refused keeps the registry's own words in its record (freezepush.go:
// "kept here, not in the fleet's registry yet (ERR)"), and `sbx snapshot
// info` prints "ref pending" — and "ref", "node" — raw: a hostile
// registry's error text retitles the window, clears the screen and forges
// rows.
func TestAttack30SnapshotInfoRefPending(t *testing.T) {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/snapshots/{name}", func(w http.ResponseWriter, r *http.Request) {
		json.NewEncoder(w).Encode(api.Snapshot{Name: r.PathValue("name"), ID: "img1", SandboxID: "sb_1", Memory: true,
			RefPending: "kept here, not in the fleet's registry yet (push: registry says " + pwn + "): sbxd pushes it again in 1s"})
	})
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	host := "tcp://" + srv.Listener.Addr().(*net.TCPAddr).String()
	code, out, errOut := sbx(host, "snapshot", "info", "freeze-1")
	if code != 0 {
		t.Fatalf("exit %d: %s%s", code, out, errOut)
	}
	inert(t, "sbx snapshot info", out)
	if n := strings.Count(out, "\n"); n != 6 {
		t.Errorf("%d lines, want 6 (name, id, sandbox, memory, size, ref pending): a registry's words forged a row:\n%s", n, out)
	}
}
