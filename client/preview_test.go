package client

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"sbx.dev/sbx/api"
)

func TestPreview(t *testing.T) {
	var got api.PreviewRequest
	c := newTest(t, func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost || r.URL.Path != "/v1/sandboxes/sb_1/preview" {
			writeErr(w, api.ErrNotFound, "no route "+r.URL.Path)
			return
		}
		got = api.PreviewRequest{}
		json.NewDecoder(r.Body).Decode(&got)
		json.NewEncoder(w).Encode(api.Preview{URL: "http://8080-sb_1.localhost:8181/"})
	})
	tests := []struct {
		name string
		opts []PreviewOption
		want api.PreviewRequest
	}{
		{"public", nil, api.PreviewRequest{Port: 8080}},
		{"private default ttl", []PreviewOption{Private(0)}, api.PreviewRequest{Port: 8080, Private: true}},
		{"private ttl", []PreviewOption{Private(90 * time.Minute)}, api.PreviewRequest{Port: 8080, Private: true, TTL: api.DurationOf(90 * time.Minute)}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p, err := c.Sandbox("sb_1").Preview(context.Background(), 8080, tc.opts...)
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("request (-want +got):\n%s", diff)
			}
			if p.URL != "http://8080-sb_1.localhost:8181/" {
				t.Errorf("got %q", p.URL)
			}
		})
	}
	if _, err := c.Sandbox("sb_2").Preview(context.Background(), 1); err == nil {
		t.Error("got no error for an unknown route")
	}
}

func TestPorts(t *testing.T) {
	c := newTest(t, func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/v1/sandboxes/sb_1/ports" {
			writeErr(w, api.ErrNotFound, "sandbox not found")
			return
		}
		json.NewEncoder(w).Encode([]api.Port{{Proto: "tcp", Address: "0.0.0.0", Port: 8080, Pid: 7, Command: "httpd"}})
	})
	ps, err := c.Sandbox("sb_1").Ports(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]api.Port{{Proto: "tcp", Address: "0.0.0.0", Port: 8080, Pid: 7, Command: "httpd"}}, ps); diff != "" {
		t.Errorf("(-want +got):\n%s", diff)
	}
	if _, err := c.Sandbox("sb_x").Ports(context.Background()); !errors.Is(err, api.ErrNotFound) {
		t.Errorf("got %v, want ErrNotFound", err)
	}
}

func TestWithdrawAndListPreviews(t *testing.T) {
	var calls []string
	c := newTest(t, func(w http.ResponseWriter, r *http.Request) {
		calls = append(calls, r.Method+" "+r.URL.Path)
		switch {
		case r.Method == http.MethodDelete && r.URL.Path == "/v1/sandboxes/web/preview/8080":
			w.WriteHeader(http.StatusNoContent)
		case r.Method == http.MethodGet && r.URL.Path == "/v1/sandboxes/web/preview":
			json.NewEncoder(w).Encode([]api.Preview{{URL: "http://3000-sb_1.localhost:8181/", Port: 3000, Private: true}})
		default:
			writeErr(w, api.ErrNotFound, "port 9 of sandbox web is not published")
		}
	})
	ctx := context.Background()
	if err := c.Sandbox("web").WithdrawPreview(ctx, 8080); err != nil {
		t.Fatal(err)
	}
	if err := c.Sandbox("web").WithdrawPreview(ctx, 9); !errors.Is(err, api.ErrNotFound) {
		t.Errorf("withdraw of a port not published: %v, want ErrNotFound", err)
	}
	ps, err := c.Sandbox("web").Previews(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]api.Preview{{URL: "http://3000-sb_1.localhost:8181/", Port: 3000, Private: true}}, ps); diff != "" {
		t.Errorf("(-want +got):\n%s", diff)
	}
	if want := []string{"DELETE /v1/sandboxes/web/preview/8080", "DELETE /v1/sandboxes/web/preview/9", "GET /v1/sandboxes/web/preview"}; !cmp.Equal(want, calls) {
		t.Errorf("calls %v, want %v", calls, want)
	}
}

func TestWithNetwork(t *testing.T) {
	var got api.CreateRequest
	c := newTest(t, func(w http.ResponseWriter, r *http.Request) {
		json.NewDecoder(r.Body).Decode(&got)
		w.WriteHeader(http.StatusCreated)
		json.NewEncoder(w).Encode(api.Sandbox{ID: "sb_1", Network: got.Network})
	})
	sb, err := c.Create(context.Background(), WithNetwork(NetworkNone))
	if err != nil {
		t.Fatal(err)
	}
	if got.Network != "none" || sb.Network != "none" {
		t.Errorf("sent network %q, got back %q; want none", got.Network, sb.Network)
	}
}

func TestWaitPort(t *testing.T) {
	asked := 0
	c := newTest(t, func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/v1/sandboxes/sb_1/ports":
			asked++
			ps := []api.Port{{Proto: "tcp", Address: "0.0.0.0", Port: 22}}
			if asked >= 3 {
				ps = append(ps, api.Port{Proto: "tcp", Address: "127.0.0.1", Port: 8080, Pid: 9})
			}
			json.NewEncoder(w).Encode(ps)
		case "/v1/sandboxes/sb_stopped/ports":
			writeErr(w, api.ErrConflict, "sandbox sb_stopped is stopped")
		default:
			writeErr(w, api.ErrNotFound, "no route")
		}
	})
	ctx := context.Background()
	p, err := c.Sandbox("sb_1").WaitPort(ctx, 8080, PollEvery(time.Millisecond))
	if err != nil || p.Port != 8080 || p.Pid != 9 || asked != 3 {
		t.Fatalf("got %+v, %v after %d looks; want port 8080 on the third", p, err, asked)
	}
	if _, err := c.Sandbox("sb_stopped").WaitPort(ctx, 8080); !errors.Is(err, api.ErrConflict) {
		t.Errorf("stopped: got %v, want ErrConflict at once", err)
	}
	if _, err := c.Sandbox("sb_1").WaitPort(ctx, 70000); !errors.Is(err, api.ErrInvalid) {
		t.Errorf("port 70000: got %v, want ErrInvalid", err)
	}
	short, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel()
	if _, err := c.Sandbox("sb_1").WaitPort(short, 9999, PollEvery(5*time.Millisecond)); !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "9999") {
		t.Errorf("never listening: got %v, want the deadline, naming the port", err)
	}
}

// PreviewClient reaches a preview URL through its domain alone: the proxy
// routes by the host name, which the request keeps.
func TestPreviewClient(t *testing.T) {
	var gotHost string
	proxy := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		gotHost = r.Host
		io.WriteString(w, "hello from the sandbox")
	}))
	defer proxy.Close()
	_, port, _ := net.SplitHostPort(strings.TrimPrefix(proxy.URL, "http://"))
	// no resolver answers for 8080-sb_abc.localhost: only "localhost" is looked up
	url := "http://8080-sb_abcdefghij.localhost:" + port + "/x"
	resp, err := PreviewClient().Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if string(b) != "hello from the sandbox" || gotHost != "8080-sb_abcdefghij.localhost:"+port {
		t.Errorf("got %q with Host %q", b, gotHost)
	}
	for in, want := range map[string]string{
		"8080-sb_x.localhost:8181":          "localhost:8181",
		"3000-sb_x.preview.example.com:443": "preview.example.com:443",
		"example.com:80":                    "example.com:80",
		"www.example.com:80":                "www.example.com:80",
		"localhost:8181":                    "localhost:8181",
		"no-port":                           "no-port",
		"80-x.:1":                           "80-x.:1",
	} {
		if got := previewTarget(in); got != want {
			t.Errorf("previewTarget(%q) = %q, want %q", in, got, want)
		}
	}
}
