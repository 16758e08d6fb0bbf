package client

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"sbx.dev/sbx/api"
)

// seen is one request as a fake sbxd saw it.
type seen struct {
	Method, Path, Query, Body string
}

func TestCaptureCalls(t *testing.T) {
	ctx := context.Background()
	created := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	tests := []struct {
		name   string
		status int
		answer any
		call   func(c *Client) (any, error)
		want   seen
		wantV  any
	}{
		{"snapshot memory", 201, api.Snapshot{Name: "s1", SandboxID: "sb_1", Memory: true, Paused: api.DurationOf(120 * time.Millisecond), CreatedAt: created},
			func(c *Client) (any, error) { return c.Sandbox("sb_1").Snapshot(ctx, "s1", WithMemory()) },
			seen{"POST", "/v1/sandboxes/sb_1/snapshots", "", `{"name":"s1","memory":true}`},
			&api.Snapshot{Name: "s1", SandboxID: "sb_1", Memory: true, Paused: api.DurationOf(120 * time.Millisecond), CreatedAt: created}},
		{"snapshot disk", 201, api.Snapshot{Name: "s2"},
			func(c *Client) (any, error) { return c.Sandbox("web").Snapshot(ctx, "s2") },
			seen{"POST", "/v1/sandboxes/web/snapshots", "", `{"name":"s2"}`},
			&api.Snapshot{Name: "s2"}},
		{"snapshots", 200, []api.Snapshot{{Name: "a"}, {Name: "b"}},
			func(c *Client) (any, error) { return c.Snapshots(ctx) },
			seen{"GET", "/v1/snapshots", "", ""},
			[]api.Snapshot{{Name: "a"}, {Name: "b"}}},
		{"get snapshot", 200, api.Snapshot{Name: "a b"},
			func(c *Client) (any, error) { return c.GetSnapshot(ctx, "a b") },
			seen{"GET", "/v1/snapshots/a%20b", "", ""},
			&api.Snapshot{Name: "a b"}},
		{"delete snapshot", 204, nil,
			func(c *Client) (any, error) { return nil, c.DeleteSnapshot(ctx, "a") },
			seen{"DELETE", "/v1/snapshots/a", "", ""},
			nil},
		{"delete with snapshots", 200, api.DeleteResult{ID: "sb_1", Snapshots: []string{"a", "b"}},
			func(c *Client) (any, error) { return c.Sandbox("sb_1").Delete(ctx, WithSnapshots()) },
			seen{"DELETE", "/v1/sandboxes/sb_1", "withSnapshots=1", ""},
			&api.DeleteResult{ID: "sb_1", Snapshots: []string{"a", "b"}}},
		{"delete keeping freezes", 200, api.DeleteResult{ID: "sb_1"},
			func(c *Client) (any, error) { return c.Sandbox("sb_1").Delete(ctx, KeepFreezes(), WithSnapshots()) },
			seen{"DELETE", "/v1/sandboxes/sb_1", "keepFreezes=1&withSnapshots=1", ""},
			&api.DeleteResult{ID: "sb_1"}},
		{"keep snapshot", 200, api.Snapshot{Name: "freeze-a b", Kept: true},
			func(c *Client) (any, error) { return c.KeepSnapshot(ctx, "freeze-a b") },
			seen{"POST", "/v1/snapshots/freeze-a%20b/keep", "", ""},
			&api.Snapshot{Name: "freeze-a b", Kept: true}},
		{"storage", 200, api.Storage{Used: 42, Max: 100, Totals: map[string]int64{"orphan": 2}},
			func(c *Client) (any, error) { return c.Storage(ctx) },
			seen{"GET", "/v1/storage", "", ""},
			&api.Storage{Used: 42, Max: 100, Totals: map[string]int64{"orphan": 2}}},
		{"prune", 200, api.PruneResult{Removed: []api.StorageItem{{Kind: "orphan", ID: "im_1", Bytes: 9}}, Reclaimed: 9},
			func(c *Client) (any, error) {
				return c.Prune(ctx, api.PruneRequest{Orphans: true, Freezes: true, OlderThan: api.Duration(2 * time.Hour), DryRun: true})
			},
			seen{"POST", "/v1/storage/prune", "", `{"orphans":true,"freezes":true,"olderThan":"2h0m0s","dryRun":true}`},
			&api.PruneResult{Removed: []api.StorageItem{{Kind: "orphan", ID: "im_1", Bytes: 9}}, Reclaimed: 9}},
		{"stop", 202, api.Sandbox{ID: "sb_1", State: api.StateStopping},
			func(c *Client) (any, error) { return c.Sandbox("sb_1").Stop(ctx, NoWait()) },
			seen{"POST", "/v1/sandboxes/sb_1/stop", "", ""},
			&api.Sandbox{ID: "sb_1", State: api.StateStopping}},
		{"stop wait", 200, api.Sandbox{ID: "sb_1", State: api.StateStopped},
			func(c *Client) (any, error) { return c.Sandbox("sb_1").Stop(ctx) },
			seen{"POST", "/v1/sandboxes/sb_1/stop", "wait=1", ""},
			&api.Sandbox{ID: "sb_1", State: api.StateStopped}},
		{"resume", 200, api.Sandbox{ID: "sb_1", MemoryRestored: true},
			func(c *Client) (any, error) { return c.Sandbox("sb_1").Resume(ctx) },
			seen{"POST", "/v1/sandboxes/sb_1/resume", "", `{}`},
			&api.Sandbox{ID: "sb_1", MemoryRestored: true}},
		{"resume require memory", 200, api.Sandbox{ID: "sb_1", MemoryRestored: true},
			func(c *Client) (any, error) { return c.Sandbox("sb_1").Resume(ctx, RequireMemory()) },
			seen{"POST", "/v1/sandboxes/sb_1/resume", "", `{"requireMemory":true}`},
			&api.Sandbox{ID: "sb_1", MemoryRestored: true}},
		{"create from", 201, api.Sandbox{ID: "sb_2", From: "s1", MemoryRestored: true},
			func(c *Client) (any, error) { return c.Create(ctx, WithFrom("s1"), WithName("n")) },
			seen{"POST", "/v1/sandboxes", "", `{"name":"n","from":"s1"}`},
			&api.Sandbox{ID: "sb_2", From: "s1", MemoryRestored: true}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var got seen
			c := newTest(t, func(w http.ResponseWriter, r *http.Request) {
				b, _ := io.ReadAll(r.Body)
				got = seen{r.Method, r.URL.EscapedPath(), r.URL.RawQuery, string(b)}
				w.WriteHeader(tc.status)
				if tc.answer != nil {
					json.NewEncoder(w).Encode(tc.answer)
				}
			})
			v, err := tc.call(c)
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("request (-want +got):\n%s", diff)
			}
			if tc.wantV != nil {
				if diff := cmp.Diff(tc.wantV, v); diff != "" {
					t.Errorf("answer (-want +got):\n%s", diff)
				}
			}
		})
	}
}

func TestCaptureErrors(t *testing.T) {
	c := newTest(t, func(w http.ResponseWriter, r *http.Request) {
		writeErr(w, api.ErrConflict, "sandbox sb_1 is running; run `sbx stop sb_1` first")
	})
	ctx := context.Background()
	calls := map[string]func() error{
		"resume":   func() error { _, err := c.Sandbox("sb_1").Resume(ctx, RequireMemory()); return err },
		"stop":     func() error { _, err := c.Sandbox("sb_1").Stop(ctx); return err },
		"snapshot": func() error { _, err := c.Sandbox("sb_1").Snapshot(ctx, "s", WithMemory()); return err },
		"fork":     func() error { _, err := c.Sandbox("sb_1").Fork(ctx, WithCount(2)); return err },
		"events":   func() error { return c.Sandbox("sb_1").Events(ctx, func(api.Event) error { return nil }) },
	}
	for name, call := range calls {
		t.Run(name, func(t *testing.T) {
			if err := call(); !errors.Is(err, api.ErrConflict) {
				t.Errorf("got %v, want ErrConflict", err)
			}
		})
	}
}

func TestForkEvents(t *testing.T) {
	ready := func(id string) api.ForkEvent {
		return api.ForkEvent{Event: "sandbox.ready", Sandbox: &api.Sandbox{ID: id}}
	}
	tests := []struct {
		name    string
		events  []api.ForkEvent
		wantErr string
		kind    error
		wantSbs []api.Sandbox
		deleted []string
	}{
		{"done", []api.ForkEvent{
			{Event: "sandbox.forking", IDs: []string{"sb_a"}}, ready("sb_a"),
			{Event: "done", Sandboxes: []api.Sandbox{{ID: "sb_a"}}},
		}, "", nil, []api.Sandbox{{ID: "sb_a"}}, nil},
		{"done without list", []api.ForkEvent{
			{Event: "sandbox.forking", IDs: []string{"sb_a"}}, ready("sb_a"), {Event: "done"},
		}, "", nil, []api.Sandbox{{ID: "sb_a"}}, nil},
		{"error", []api.ForkEvent{
			{Event: "sandbox.forking", IDs: []string{"sb_a"}}, {Event: "error", ErrorBody: errFrame("checkpoint failed: no space", "")},
		}, "checkpoint failed: no space", nil, nil, []string{"sb_a"}},
		{"cut", []api.ForkEvent{{Event: "sandbox.forking", IDs: []string{"sb_a"}}, ready("sb_a")},
			"sb_a", api.ErrUnavailable, nil, []string{"sb_a"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var req api.ForkRequest
			var deleted []string
			c := newTest(t, func(w http.ResponseWriter, r *http.Request) {
				if r.Method == "DELETE" {
					deleted = append(deleted, strings.TrimPrefix(r.URL.Path, "/v1/sandboxes/"))
					writeErr(w, api.ErrNotFound, "gone")
					return
				}
				if r.Method != "POST" || r.URL.Path != "/v1/sandboxes/sb_1/fork" {
					t.Errorf("got %s %s", r.Method, r.URL.Path)
				}
				json.NewDecoder(r.Body).Decode(&req)
				for _, ev := range tc.events {
					sse(w, ev.Event, ev)
				}
			})
			var got []api.ForkEvent
			sbs, err := c.Sandbox("sb_1").Fork(context.Background(), WithName("x"), WithMemory(), WithTTL(5*time.Minute),
				WithMeta("k", "v"), WithForkEvents(func(ev api.ForkEvent) error {
					got = append(got, ev)
					return nil
				}))
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("got %v, want an error containing %q", err, tc.wantErr)
				}
				if tc.kind != nil && !errors.Is(err, tc.kind) {
					t.Errorf("got %v, want an error of kind %v", err, tc.kind)
				}
			} else if err != nil {
				t.Fatal(err)
			}
			// an "error" event ends the stream as the error, not as an event
			wantEvents := tc.events
			if n := len(wantEvents); n > 0 && wantEvents[n-1].Event == "error" {
				wantEvents = wantEvents[:n-1]
			}
			if diff := cmp.Diff(wantEvents, got); diff != "" {
				t.Errorf("events (-want +got):\n%s", diff)
			}
			want := api.ForkRequest{Name: "x", Memory: true, Count: 1, TTL: api.DurationOf(5 * time.Minute), Meta: map[string]string{"k": "v"}}
			if diff := cmp.Diff(want, req); diff != "" {
				t.Errorf("request (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(tc.wantSbs, sbs); diff != "" {
				t.Errorf("Fork (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(tc.deleted, deleted); diff != "" {
				t.Errorf("children deleted after a failure (-want +got):\n%s", diff)
			}
		})
	}
}

// A handler that stops the fork ends it, and the child it announced is
// deleted: Fork returns its children or leaves none.
func TestForkEventsStop(t *testing.T) {
	release := make(chan struct{})
	defer close(release)
	var deleted []string
	c := newTest(t, func(w http.ResponseWriter, r *http.Request) {
		if r.Method == "DELETE" {
			deleted = append(deleted, strings.TrimPrefix(r.URL.Path, "/v1/sandboxes/"))
			json.NewEncoder(w).Encode(api.DeleteResult{})
			return
		}
		sse(w, "sandbox.forking", api.ForkEvent{IDs: []string{"sb_a"}})
		select { // hold the stream open, as a fork that takes its time
		case <-release:
		case <-r.Context().Done():
		}
	})
	stop := errors.New("stop")
	_, err := c.Sandbox("sb_1").Fork(context.Background(), WithForkEvents(func(ev api.ForkEvent) error {
		if ev.Event != "sandbox.forking" || len(ev.IDs) != 1 {
			t.Errorf("got %+v", ev)
		}
		return stop
	}))
	if !errors.Is(err, stop) {
		t.Fatalf("got %v, want the handler's error", err)
	}
	if diff := cmp.Diff([]string{"sb_a"}, deleted); diff != "" {
		t.Errorf("deleted (-want +got):\n%s", diff)
	}
}

// forkFake is a fake sbxd that forks and deletes, counting the calls.
type forkFake struct {
	mu      sync.Mutex
	calls   []string // "PARENT COUNT"
	live    map[string]bool
	next    int
	failAt  int  // 1-based fork call that fails, 0 for none
	failRaw bool // fail before the stream (an ErrorBody) rather than with an "error" event
}

func (f *forkFake) handle(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	defer f.mu.Unlock()
	id := strings.Split(strings.TrimPrefix(r.URL.Path, "/v1/sandboxes/"), "/")[0]
	switch {
	case r.Method == "DELETE":
		if !f.live[id] {
			writeErr(w, api.ErrNotFound, "sandbox "+id+" not found")
			return
		}
		delete(f.live, id)
		json.NewEncoder(w).Encode(api.DeleteResult{ID: id})
	case r.Method == "POST" && strings.HasSuffix(r.URL.Path, "/fork"):
		var req api.ForkRequest
		json.NewDecoder(r.Body).Decode(&req)
		if !req.Memory {
			writeErr(w, api.ErrInvalid, "want a memory fork")
			return
		}
		f.calls = append(f.calls, fmt.Sprintf("%s %d", id, req.Count))
		if len(f.calls) == f.failAt && f.failRaw {
			writeErr(w, api.ErrUnavailable, "no room")
			return
		}
		var ids []string
		for range req.Count {
			f.next++
			ids = append(ids, fmt.Sprintf("sb_%d", f.next))
		}
		sse(w, "sandbox.forking", api.ForkEvent{IDs: ids})
		if len(f.calls) == f.failAt {
			sse(w, "error", api.ForkEvent{ErrorBody: errFrame("checkpoint failed", "")}) // and no child is left
			return
		}
		var sbs []api.Sandbox
		for _, id := range ids {
			f.live[id] = true
			sbs = append(sbs, api.Sandbox{ID: id, MemoryRestored: true})
			sse(w, "sandbox.ready", api.ForkEvent{Sandbox: &sbs[len(sbs)-1]})
		}
		sse(w, "done", api.ForkEvent{Sandboxes: sbs})
	default:
		writeErr(w, api.ErrInvalid, "unexpected "+r.Method+" "+r.URL.Path)
	}
}

func TestForkTree(t *testing.T) {
	tests := []struct {
		name      string
		n         int
		failAt    int
		failRaw   bool
		wantCalls []string
		wantErr   error
	}{
		{"one call", 5, 0, false, []string{"sb_0 5"}, nil},
		{"exactly 16", 16, 0, false, []string{"sb_0 16"}, nil},
		{"17", 17, 0, false, []string{"sb_0 16", "sb_1 1"}, nil},
		{"40 breadth-first", 40, 0, false, []string{"sb_0 16", "sb_1 16", "sb_2 8"}, nil},
		{"third level", 16 + 16*16 + 3, 0, false, func() []string {
			calls := []string{"sb_0 16"}
			for i := 1; i <= 16; i++ {
				calls = append(calls, fmt.Sprintf("sb_%d 16", i))
			}
			return append(calls, "sb_17 3")
		}(), nil},
		{"40 fails on the last call", 40, 3, false, []string{"sb_0 16", "sb_1 16", "sb_2 8"}, nil},
		{"40 refused on the second call", 40, 2, true, []string{"sb_0 16", "sb_1 16"}, api.ErrUnavailable},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := &forkFake{live: map[string]bool{"sb_0": true}, failAt: tc.failAt, failRaw: tc.failRaw}
			c := newTest(t, f.handle)
			sbs, err := c.Sandbox("sb_0").Fork(context.Background(), WithCount(tc.n), WithMemory())
			f.mu.Lock()
			defer f.mu.Unlock()
			if diff := cmp.Diff(tc.wantCalls, f.calls); diff != "" {
				t.Errorf("calls (-want +got):\n%s", diff)
			}
			if tc.failAt == 0 {
				if err != nil {
					t.Fatal(err)
				}
				if len(sbs) != tc.n || len(f.live) != tc.n+1 {
					t.Errorf("got %d sandboxes, %d live, want %d and %d", len(sbs), len(f.live), tc.n, tc.n+1)
				}
				seenIDs := map[string]bool{}
				for _, sb := range sbs {
					if !f.live[sb.ID] || seenIDs[sb.ID] {
						t.Errorf("%s returned twice or not live", sb.ID)
					}
					seenIDs[sb.ID] = true
				}
				return
			}
			if err == nil || sbs != nil {
				t.Fatalf("got %d sandboxes, %v; want an error", len(sbs), err)
			}
			if tc.wantErr != nil && !errors.Is(err, tc.wantErr) {
				t.Errorf("got %v, want errors.Is %v", err, tc.wantErr)
			}
			if diff := cmp.Diff(map[string]bool{"sb_0": true}, f.live); diff != "" {
				t.Errorf("live after a failure, want only the parent (-want +got):\n%s", diff)
			}
		})
	}
}

func TestForkTreeInvalid(t *testing.T) {
	c := newTest(t, func(w http.ResponseWriter, r *http.Request) { t.Errorf("unexpected %s", r.URL) })
	if _, err := c.Sandbox("sb_0").Fork(context.Background(), WithCount(-1), WithMemory()); !errors.Is(err, api.ErrInvalid) {
		t.Errorf("got %v, want ErrInvalid", err)
	}
	if _, err := c.Sandbox("sb_0").Fork(context.Background(), WithCount(20), WithName("x")); !errors.Is(err, api.ErrInvalid) {
		t.Errorf("a name for 20 children: got %v, want ErrInvalid", err)
	}
}

func TestEvents(t *testing.T) {
	t0 := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	evs := []api.Event{
		{Seq: 1, SandboxID: "sb_1", Time: t0, Type: "created"},
		{Seq: 2, SandboxID: "sb_1", Time: t0.Add(time.Second), Type: "snapshot", Detail: map[string]any{"outcome": "ok", "sizeBytes": float64(42)}},
	}
	tests := []struct {
		name    string
		follow  bool
		after   int64
		tail    func(w io.Writer)
		wantErr string
		kind    error
	}{
		{"all", false, 0, func(w io.Writer) { sse(w, "eof", map[string]string{}) }, "", nil},
		{"after", false, 7, func(w io.Writer) { sse(w, "eof", map[string]string{}) }, "", nil},
		{"follow broken", true, 0, func(w io.Writer) { io.WriteString(w, ": keep-alive\n\n") }, "the last event seen was 2", api.ErrUnavailable},
		{"shut down", true, 0, func(w io.Writer) {
			sse(w, "error", map[string]string{"error": "sbxd is shutting down", "code": "unavailable"})
		}, "the last event seen was 2", api.ErrUnavailable},
		{"error", true, 0, func(w io.Writer) { sse(w, "error", map[string]string{"error": "journal unreadable"}) }, "journal unreadable", nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := newTest(t, func(w http.ResponseWriter, r *http.Request) {
				want := ""
				if tc.follow {
					want = "follow=1"
				}
				if tc.after > 0 {
					want = "after=7"
				}
				if r.Method != "GET" || r.URL.Path != "/v1/sandboxes/sb_1/events" || r.URL.RawQuery != want {
					t.Errorf("got %s %s", r.Method, r.URL)
				}
				for _, ev := range evs {
					sse(w, "event", ev)
				}
				tc.tail(w)
			})
			var got []api.Event
			opts := []EventsOption{After(tc.after)}
			if tc.follow {
				opts = append(opts, Follow())
			}
			err := c.Sandbox("sb_1").Events(context.Background(), func(ev api.Event) error {
				got = append(got, ev)
				return nil
			}, opts...)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("got %v, want an error containing %q", err, tc.wantErr)
				}
				var se *StreamError
				if tc.kind != nil && (!errors.Is(err, tc.kind) || !errors.As(err, &se) || se.LastSeq != 2) {
					t.Errorf("got %#v, want a *StreamError of kind %v with LastSeq 2", err, tc.kind)
				}
			} else if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(evs, got); diff != "" {
				t.Errorf("events (-want +got):\n%s", diff)
			}
		})
	}
}

// TestStreamErrorKinds: an "error" event of the events and logs streams
// keeps its api kind, so errors.Is works as it does on a plain response.
func TestStreamErrorKinds(t *testing.T) {
	for _, tc := range []struct {
		name string
		data string
		kind error
		msg  string
	}{
		{"not found", `{"error":{"code":"not_found","message":"sandbox sb_x: not found"}}`, api.ErrNotFound, "sandbox sb_x: not found"},
		{"in a frame", `{"event":"error","error":{"code":"conflict","message":"taken"}}`, api.ErrConflict, "taken"},
		{"no code", `{"error":{"message":"boom"}}`, nil, "boom"},
		{"old flat", `{"error":"sandbox sb_x: not found","code":"not_found"}`, api.ErrNotFound, "sandbox sb_x: not found"},
		{"old flat, no code", `{"error":"boom"}`, nil, "boom"},
		{"no message", `{}`, nil, "the server reported an error without a message"},
		{"not json", `<html>`, nil, "the server reported an error without a message"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := streamError([]byte(tc.data))
			if err == nil || !strings.Contains(err.Error(), tc.msg) {
				t.Fatalf("got %v, want %q", err, tc.msg)
			}
			if tc.kind != nil && !errors.Is(err, tc.kind) {
				t.Errorf("got %v, want errors.Is %v", err, tc.kind)
			}
		})
	}
}
