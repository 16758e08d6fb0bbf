package server

import (
	"bufio"
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"sbx.dev/sbx/api"
)

// listManager lists fixed sandboxes and follows events until its context ends.
type listManager struct {
	fakeManager
	gotAfter  int64
	gotSignal int
}

func (f *listManager) List(ctx context.Context) ([]api.Sandbox, error) {
	return []api.Sandbox{
		{ID: "sb_aaaaaaaaaa", Name: "web", State: api.StateReady, Meta: map[string]string{"team": "core", "tier": "1"}},
		{ID: "sb_cccccccccc", State: api.StateStopped, Parent: "sb_aaaaaaaaaa", Meta: map[string]string{"team": "core"}},
		{ID: "sb_dddddddddd", State: api.StateReady, Parent: "sb_aaaaaaaaaa"},
	}, nil
}

func (f *listManager) Get(ctx context.Context, ref string) (*api.Sandbox, error) {
	id, err := f.resolve(ref)
	if err != nil {
		return nil, err
	}
	return &api.Sandbox{ID: id, State: api.StateReady}, nil
}

func (f *listManager) Events(ctx context.Context, ref string, after int64, follow bool, emit func(api.Event) error) error {
	f.gotAfter = after
	if err := emit(api.Event{Seq: after + 1, SandboxID: ref, Type: api.EventCreated}); err != nil {
		return err
	}
	if follow {
		<-ctx.Done()
	}
	return nil
}

func (f *listManager) Signal(ctx context.Context, ref, execID string, sig int) error {
	f.gotSignal = sig
	if execID != "ex_1" {
		return api.Errorf(api.ErrNotFound, "exec %s not found", execID)
	}
	return nil
}

func TestListFilters(t *testing.T) {
	ts := newTestServer(t, &listManager{}, "")
	tests := []struct {
		name   string
		query  string
		status int
		want   []string
	}{
		{"all", "", 200, []string{"sb_aaaaaaaaaa", "sb_cccccccccc", "sb_dddddddddd"}},
		{"meta", "?meta=team%3Dcore", 200, []string{"sb_aaaaaaaaaa", "sb_cccccccccc"}},
		{"two metas all hold", "?meta=team%3Dcore&meta=tier%3D1", 200, []string{"sb_aaaaaaaaaa"}},
		{"meta empty value", "?meta=team%3D", 200, []string{}},
		{"parent by name", "?parent=web", 200, []string{"sb_cccccccccc", "sb_dddddddddd"}},
		{"parent and state", "?parent=sb_aaaaaaaaaa&state=ready", 200, []string{"sb_dddddddddd"}},
		{"states any holds", "?state=ready&state=stopped", 200, []string{"sb_aaaaaaaaaa", "sb_cccccccccc", "sb_dddddddddd"}},
		{"unknown parent", "?parent=nosuch", 200, []string{}},
		{"bad meta", "?meta=team", 400, nil},
		{"bad state", "?state=running", 400, nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			resp, body := do(t, "GET", ts.URL+"/v1/sandboxes"+tc.query, "", "")
			if resp.StatusCode != tc.status {
				t.Fatalf("status: got %d, want %d (%s)", resp.StatusCode, tc.status, body)
			}
			if tc.status != 200 {
				return
			}
			var sbs []api.Sandbox
			if err := json.Unmarshal([]byte(body), &sbs); err != nil {
				t.Fatal(err)
			}
			got := []string{}
			for _, sb := range sbs {
				got = append(got, sb.ID)
			}
			if d := cmp.Diff(tc.want, got); d != "" {
				t.Errorf("ids (-want +got):\n%s", d)
			}
		})
	}
}

func TestSignalRoute(t *testing.T) {
	m := &listManager{}
	ts := newTestServer(t, m, "")
	resp, body := do(t, "POST", ts.URL+"/v1/sandboxes/web/execs/ex_1/signal", "", `{"signal":9}`)
	if resp.StatusCode != http.StatusNoContent || m.gotSignal != 9 {
		t.Errorf("signal 9: status %d (%s), manager got %d", resp.StatusCode, body, m.gotSignal)
	}
	resp, _ = do(t, "POST", ts.URL+"/v1/sandboxes/web/execs/ex_1/signal", "", "")
	if resp.StatusCode != http.StatusNoContent || m.gotSignal != 0 {
		t.Errorf("no body: status %d, manager got %d, want 0 (SIGTERM)", resp.StatusCode, m.gotSignal)
	}
	resp, body = do(t, "POST", ts.URL+"/v1/sandboxes/web/execs/ex_2/signal", "", `{"signal":9}`)
	if resp.StatusCode != http.StatusNotFound {
		t.Errorf("unknown exec: status %d (%s), want 404", resp.StatusCode, body)
	}
	resp, body = do(t, "POST", ts.URL+"/v1/sandboxes/web/execs/ex_1/signal", "", `{"signal":"KILL"}`)
	if resp.StatusCode != http.StatusBadRequest {
		t.Errorf("a signal name: status %d (%s), want 400", resp.StatusCode, body)
	}
}

func TestEventsAfter(t *testing.T) {
	m := &listManager{}
	ts := newTestServer(t, m, "")
	resp, body := do(t, "GET", ts.URL+"/v1/sandboxes/web/events?after=41", "", "")
	if resp.StatusCode != 200 || m.gotAfter != 41 || !strings.Contains(body, `"seq":42`) {
		t.Errorf("after=41: status %d, manager got %d, body %q", resp.StatusCode, m.gotAfter, body)
	}
	for _, bad := range []string{"-1", "x", "1.5"} {
		resp, body := do(t, "GET", ts.URL+"/v1/sandboxes/web/events?after="+bad, "", "")
		if resp.StatusCode != http.StatusBadRequest || !strings.Contains(body, "sequence number") {
			t.Errorf("after=%s: status %d %q, want 400 naming a sequence number", bad, resp.StatusCode, body)
		}
	}
}

// A follow stream ends at once when the server closes, with an error of
// kind unavailable, instead of holding the shutdown.
func TestCloseEndsFollow(t *testing.T) {
	s := New(Config{Manager: &listManager{}})
	ts := httptest.NewUnstartedServer(s.Handler(""))
	ts.Config.BaseContext = s.BaseContext
	ts.Start()
	t.Cleanup(ts.Close)
	resp, err := http.Get(ts.URL + "/v1/sandboxes/web/events?follow=1")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	br := bufio.NewReader(resp.Body)
	line, _ := br.ReadString('\n')
	if !strings.HasPrefix(line, "event: event") {
		t.Fatalf("first line %q, want the first event", line)
	}
	start := time.Now()
	s.Close()
	var rest strings.Builder
	for {
		l, err := br.ReadString('\n')
		rest.WriteString(l)
		if err != nil {
			break
		}
	}
	if took := time.Since(start); took > 2*time.Second {
		t.Errorf("the stream ended %s after Close, want at once", took)
	}
	if !strings.Contains(rest.String(), "event: error") || !strings.Contains(rest.String(), `"code":"unavailable"`) || !strings.Contains(rest.String(), "shutting down") {
		t.Errorf("after Close the stream said %q, want an unavailable error saying sbxd is shutting down", rest.String())
	}
}
