package server

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"sbx.dev/sbx/api"
)

func TestPreviewRoute(t *testing.T) {
	now := time.Unix(1_700_000_000, 0)
	p, err := NewProxy(ProxyConfig{Manager: &fakeNet{}, Domain: "preview.example", Port: 8181, Secret: testSecret, Now: func() time.Time { return now }})
	if err != nil {
		t.Fatal(err)
	}
	fm := &fakeManager{}
	s := New(Config{Manager: fm})
	s.SetPreview(p)
	ts := httptest.NewServer(s.Handler(""))
	t.Cleanup(ts.Close)
	tests := []struct {
		name, id, body string
		status         int
		wantURL        string
		wantExpiry     bool
	}{
		{"public", testID, `{"port":8080}`, 200, "http://8080-" + testID + ".preview.example:8181/", false},
		{"private", testID, `{"port":3000,"private":true,"ttl":"10m"}`, 200, "http://3000-" + testID + ".preview.example:8181/?sbx_token=", true},
		{"private default ttl", testID, `{"port":3001,"private":true}`, 200, "http://3001-" + testID + ".preview.example:8181/?sbx_token=", true},
		{"unknown sandbox", "sb_zzzzzzzzzz", `{"port":8080}`, 404, "", false},
		{"port zero", testID, `{"port":0}`, 400, "", false},
		{"port too big", testID, `{"port":70000}`, 400, "", false},
		{"ttl without private", testID, `{"port":80,"ttl":"1h"}`, 400, "", false},
		{"bad ttl", testID, `{"port":80,"private":true,"ttl":"soon"}`, 400, "", false},
		{"ttl too long", testID, `{"port":80,"private":true,"ttl":"9999h"}`, 400, "", false},
		{"by name", "web", `{"port":8081}`, 200, "http://8081-" + testID + ".preview.example:8181/", false},
		{"a private port made public", testID, `{"port":3000}`, 409, "", false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			resp, body := do(t, http.MethodPost, ts.URL+"/v1/sandboxes/"+tc.id+"/preview", "", tc.body)
			if resp.StatusCode != tc.status {
				t.Fatalf("got %d %s, want %d", resp.StatusCode, body, tc.status)
			}
			if tc.status != 200 {
				return
			}
			var pv api.Preview
			if err := json.Unmarshal([]byte(body), &pv); err != nil {
				t.Fatal(err)
			}
			if !strings.HasPrefix(pv.URL, tc.wantURL) || (pv.URL != tc.wantURL) == !tc.wantExpiry {
				t.Errorf("got URL %q, want %q", pv.URL, tc.wantURL)
			}
			if (pv.ExpiresAt != nil) != tc.wantExpiry {
				t.Errorf("got expiry %v, want one: %v", pv.ExpiresAt, tc.wantExpiry)
			}
		})
	}
	want := map[int]bool{8080: false, 8081: false, 3000: true, 3001: true}
	if diff := cmp.Diff(want, fm.published); diff != "" {
		t.Errorf("publications (-want +got):\n%s", diff)
	}

	// the list, with URLs; then withdrawals
	resp, body := do(t, http.MethodGet, ts.URL+"/v1/sandboxes/"+testID+"/preview", "", "")
	var ps []api.Preview
	if resp.StatusCode != 200 || json.Unmarshal([]byte(body), &ps) != nil || len(ps) != 4 || ps[0].URL != "http://3000-"+testID+".preview.example:8181/" || !ps[0].Private {
		t.Errorf("list: %d %s", resp.StatusCode, body)
	}
	for _, tc := range []struct {
		name, path string
		status     int
	}{
		{"withdraw", "/v1/sandboxes/" + testID + "/preview/8080", 204},
		{"withdraw again", "/v1/sandboxes/" + testID + "/preview/8080", 404},
		{"not a port", "/v1/sandboxes/" + testID + "/preview/http", 400},
		{"unknown sandbox", "/v1/sandboxes/sb_zzzzzzzzzz/preview/8081", 404},
	} {
		if resp, body := do(t, http.MethodDelete, ts.URL+tc.path, "", ""); resp.StatusCode != tc.status {
			t.Errorf("%s: got %d %s, want %d", tc.name, resp.StatusCode, body, tc.status)
		}
	}
	if _, ok := fm.published[8080]; ok {
		t.Errorf("8080 still published after its withdrawal")
	}
}

func TestPreviewRouteOff(t *testing.T) {
	ts := newTestServer(t, &fakeManager{}, "")
	resp, body := do(t, http.MethodPost, ts.URL+"/v1/sandboxes/"+testID+"/preview", "", `{"port":8080}`)
	if resp.StatusCode != http.StatusServiceUnavailable || !strings.Contains(body, "--preview-listen") {
		t.Errorf("got %d %s, want 503 naming --preview-listen", resp.StatusCode, body)
	}
}
