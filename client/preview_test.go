package client

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
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
		{"private default ttl", []PreviewOption{PrivatePreview(0)}, api.PreviewRequest{Port: 8080, Private: true}},
		{"private ttl", []PreviewOption{PrivatePreview(90 * time.Minute)}, api.PreviewRequest{Port: 8080, Private: true, TTL: "1h30m0s"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p, err := c.Preview(context.Background(), "sb_1", 8080, tc.opts...)
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
	if _, err := c.Preview(context.Background(), "sb_2", 1); err == nil {
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
	ps, err := c.Ports(context.Background(), "sb_1")
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]api.Port{{Proto: "tcp", Address: "0.0.0.0", Port: 8080, Pid: 7, Command: "httpd"}}, ps); diff != "" {
		t.Errorf("(-want +got):\n%s", diff)
	}
	if _, err := c.Ports(context.Background(), "sb_x"); !errors.Is(err, api.ErrNotFound) {
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
	if err := c.WithdrawPreview(ctx, "web", 8080); err != nil {
		t.Fatal(err)
	}
	if err := c.WithdrawPreview(ctx, "web", 9); !errors.Is(err, api.ErrNotFound) {
		t.Errorf("withdraw of a port not published: %v, want ErrNotFound", err)
	}
	ps, err := c.Previews(ctx, "web")
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
	sb, err := c.Create(context.Background(), WithNetwork("none"))
	if err != nil {
		t.Fatal(err)
	}
	if got.Network != "none" || sb.Network != "none" {
		t.Errorf("sent network %q, got back %q; want none", got.Network, sb.Network)
	}
}
