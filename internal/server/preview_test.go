package server

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"sbx.dev/sbx/api"
)

func TestPreviewRoute(t *testing.T) {
	now := time.Unix(1_700_000_000, 0)
	p, err := NewProxy(ProxyConfig{Manager: &fakeNet{}, Domain: "preview.example", Port: 8181, Secret: testSecret, Now: func() time.Time { return now }})
	if err != nil {
		t.Fatal(err)
	}
	s := New(Config{Manager: &fakeManager{}})
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
	if !p.isPrivate(target{testID, 3000}) || p.isPrivate(target{testID, 8080}) {
		t.Errorf("private marks: %v, want 3000 only", p.private)
	}
}

func TestPreviewRouteOff(t *testing.T) {
	ts := newTestServer(t, &fakeManager{}, "")
	resp, body := do(t, http.MethodPost, ts.URL+"/v1/sandboxes/"+testID+"/preview", "", `{"port":8080}`)
	if resp.StatusCode != http.StatusServiceUnavailable || !strings.Contains(body, "--preview-listen") {
		t.Errorf("got %d %s, want 503 naming --preview-listen", resp.StatusCode, body)
	}
}
