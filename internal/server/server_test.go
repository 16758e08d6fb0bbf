package server

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"sort"
	"strings"
	"testing"

	"sbx.dev/sbx/api"
)

// fakeManager answers from fixed values; the server's own logic (routing,
// errors, auth, limits, streaming) is what these tests are about.
type fakeManager struct {
	Manager // methods not overridden panic: a test calling them is wrong
	readErr error
	readOut string
	gotReq  api.CreateRequest
	// published ports of sb_aaaaaaaaaa (named "web"): true if private
	published map[int]bool
	// hidden is a sandbox Visible refuses (a warm pool's)
	hidden string
}

// Visible: the fake has no warm pool; a test of a pooled id sets hidden.
func (f *fakeManager) Visible(ctx context.Context, ref string) error {
	if f.hidden != "" && ref == f.hidden {
		return api.Errorf(api.ErrNotFound, "sandbox %s not found", ref)
	}
	return nil
}

func (f *fakeManager) resolve(ref string) (string, error) {
	if ref == "sb_aaaaaaaaaa" || ref == "web" {
		return "sb_aaaaaaaaaa", nil
	}
	return "", api.Errorf(api.ErrNotFound, "sandbox %s not found", ref)
}

func (f *fakeManager) Publish(ctx context.Context, ref string, port int, private bool) (string, int64, error) {
	id, err := f.resolve(ref)
	if err != nil {
		return "", 0, err
	}
	if f.published == nil {
		f.published = map[int]bool{}
	}
	if f.published[port] && !private {
		return "", 0, api.Errorf(api.ErrConflict, "port %d is published private", port)
	}
	f.published[port] = f.published[port] || private
	return id, 0, nil
}

func (f *fakeManager) Unpublish(ctx context.Context, ref string, port int) error {
	if _, err := f.resolve(ref); err != nil {
		return err
	}
	if _, ok := f.published[port]; !ok {
		return api.Errorf(api.ErrNotFound, "port %d is not published", port)
	}
	delete(f.published, port)
	return nil
}

func (f *fakeManager) Previews(ctx context.Context, ref string) (string, []api.Preview, error) {
	id, err := f.resolve(ref)
	if err != nil {
		return "", nil, err
	}
	var ps []api.Preview
	for port, private := range f.published {
		ps = append(ps, api.Preview{Port: port, Private: private})
	}
	sort.Slice(ps, func(i, j int) bool { return ps[i].Port < ps[j].Port })
	return id, ps, nil
}

func (f *fakeManager) Get(ctx context.Context, ref string) (*api.Sandbox, error) {
	if ref == "sb_aaaaaaaaaa" {
		return &api.Sandbox{ID: ref, State: api.StateReady}, nil
	}
	return nil, api.Errorf(api.ErrNotFound, "sandbox %s not found", ref)
}

func (f *fakeManager) Create(ctx context.Context, req api.CreateRequest) (*api.Sandbox, error) {
	f.gotReq = req
	return &api.Sandbox{ID: "sb_bbbbbbbbbb"}, nil
}

func (f *fakeManager) ReadFile(ctx context.Context, ref, path string, asTar bool, w io.Writer) error {
	if f.readOut != "" {
		w.Write([]byte(f.readOut))
	}
	return f.readErr
}

func (f *fakeManager) Exec(ctx context.Context, ref string, req api.ExecRequest) (*api.Exec, error) {
	return &api.Exec{ID: "ex_1", SandboxID: ref, Cmd: req.Cmd, State: api.ExecRunning, Pid: 7}, nil
}

func newTestServer(t *testing.T, m Manager, token string) *httptest.Server {
	t.Helper()
	s := New(Config{Manager: m})
	ts := httptest.NewServer(s.Handler(token))
	t.Cleanup(ts.Close)
	return ts
}

func do(t *testing.T, method, url, token, body string) (*http.Response, string) {
	t.Helper()
	req, _ := http.NewRequest(method, url, strings.NewReader(body))
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp, string(b)
}

func TestErrors(t *testing.T) {
	ts := newTestServer(t, &fakeManager{}, "")
	tests := []struct {
		name   string
		method string
		path   string
		body   string
		status int
		code   string
		msg    string
	}{
		{"unknown sandbox", "GET", "/v1/sandboxes/nope", "", 404, "not_found", "sandbox nope not found"},
		{"bad field", "POST", "/v1/sandboxes", `{"ttl":"soon"}`, 400, "invalid", `ttl: "soon" is not a duration`},
		{"bad json", "POST", "/v1/sandboxes", `{"ttl":`, 400, "invalid", "request body"},
		{"unknown field", "POST", "/v1/sandboxes", `{"colour":"red"}`, 400, "invalid", "colour"},
		{"too large", "POST", "/v1/sandboxes", `{"name":"` + strings.Repeat("x", 2<<20) + `"}`, 413, "too_large", "larger than"},
		{"no route", "GET", "/v2/everything", "", 404, "not_found", "no route"},
		{"wrong method", "PATCH", "/v1/sandboxes", "", 404, "not_found", "no route"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			resp, body := do(t, tc.method, ts.URL+tc.path, "", tc.body)
			if resp.StatusCode != tc.status {
				t.Errorf("status = %d, want %d (%s)", resp.StatusCode, tc.status, body)
			}
			var eb api.ErrorBody
			if err := json.Unmarshal([]byte(body), &eb); err != nil {
				t.Fatalf("body is not an error body: %q", body)
			}
			if eb.Error.Code != tc.code || !strings.Contains(eb.Error.Message, tc.msg) {
				t.Errorf("error = %+v, want code %s and a message with %q", eb.Error, tc.code, tc.msg)
			}
		})
	}
}

func TestToken(t *testing.T) {
	ts := newTestServer(t, &fakeManager{}, "s3cret")
	tests := []struct {
		token  string
		status int
	}{
		{"", 401},
		{"wrong", 401},
		{"s3cret", 200},
	}
	for _, tc := range tests {
		resp, body := do(t, "GET", ts.URL+"/v1/sandboxes/sb_aaaaaaaaaa", tc.token, "")
		if resp.StatusCode != tc.status {
			t.Errorf("token %q: status %d, want %d (%s)", tc.token, resp.StatusCode, tc.status, body)
		}
		// a client without the token is not kept connected
		if resp.Close != (tc.status == 401) {
			t.Errorf("token %q: connection closed %v, want %v", tc.token, resp.Close, tc.status == 401)
		}
	}
}

func TestReadFile(t *testing.T) {
	t.Run("error before any byte is an error response", func(t *testing.T) {
		ts := newTestServer(t, &fakeManager{readErr: api.Errorf(api.ErrNotFound, "/x does not exist")}, "")
		resp, body := do(t, "GET", ts.URL+"/v1/sandboxes/sb_a/files?path=/x", "", "")
		if resp.StatusCode != 404 || !strings.Contains(body, "does not exist") {
			t.Errorf("got %d %q", resp.StatusCode, body)
		}
	})
	t.Run("bytes stream", func(t *testing.T) {
		ts := newTestServer(t, &fakeManager{readOut: "content"}, "")
		resp, body := do(t, "GET", ts.URL+"/v1/sandboxes/sb_a/files?path=/x", "", "")
		if resp.StatusCode != 200 || body != "content" {
			t.Errorf("got %d %q", resp.StatusCode, body)
		}
	})
	t.Run("a failure mid-stream breaks the connection", func(t *testing.T) {
		ts := newTestServer(t, &fakeManager{readOut: "half", readErr: errors.New("agent died")}, "")
		resp, err := http.Get(ts.URL + "/v1/sandboxes/sb_a/files?path=/x")
		if err == nil {
			_, err = io.ReadAll(resp.Body)
			resp.Body.Close()
		}
		if err == nil {
			t.Errorf("a truncated download read as complete")
		}
	})
}

func TestExecDetach(t *testing.T) {
	ts := newTestServer(t, &fakeManager{}, "")
	resp, body := do(t, "POST", ts.URL+"/v1/sandboxes/sb_a/exec", "", `{"cmd":["sleep","9"],"detach":true}`)
	if resp.StatusCode != 201 {
		t.Fatalf("status %d %s", resp.StatusCode, body)
	}
	var e api.Exec
	json.Unmarshal([]byte(body), &e)
	if e.ID != "ex_1" || e.Pid != 7 {
		t.Errorf("exec = %+v", e)
	}
}

// TestPooledIsNotAddressable: every route of a sandbox refuses, as not
// found, one that Visible hides (a warm pool's, not taken), before its
// handler runs.
func TestPooledIsNotAddressable(t *testing.T) {
	ts := newTestServer(t, &fakeManager{hidden: "sb_pooledxxxx"}, "")
	for _, c := range []struct{ method, path string }{
		{"GET", "/v1/sandboxes/sb_pooledxxxx"},
		{"POST", "/v1/sandboxes/sb_pooledxxxx/exec"},
		{"GET", "/v1/sandboxes/sb_pooledxxxx/files?path=/x"},
		{"POST", "/v1/sandboxes/sb_pooledxxxx/fork"},
		{"POST", "/v1/sandboxes/sb_pooledxxxx/stop"},
		{"DELETE", "/v1/sandboxes/sb_pooledxxxx"},
		{"GET", "/v1/sandboxes/sb_pooledxxxx/events"},
	} {
		req, err := http.NewRequest(c.method, ts.URL+c.path, strings.NewReader("{}"))
		if err != nil {
			t.Fatal(err)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusNotFound {
			t.Errorf("%s %s: %d, want 404", c.method, c.path, resp.StatusCode)
		}
	}
}
