package main

import (
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"sbx.dev/sbx/api"
)

func TestPreviewOptions(t *testing.T) {
	tests := []struct {
		name    string
		pos     []string
		private bool
		ttl     time.Duration
		wantN   int
		wantErr bool
	}{
		{"public", []string{"sb_1", "8080"}, false, 0, 0, false},
		{"private", []string{"sb_1", "8080"}, true, 0, 1, false},
		{"private ttl", []string{"sb_1", "8080"}, true, time.Hour, 1, false},
		{"ttl without private", []string{"sb_1", "8080"}, false, time.Hour, 0, true},
		{"negative ttl", []string{"sb_1", "8080"}, true, -time.Hour, 0, true},
		{"no port", []string{"sb_1"}, false, 0, 0, true},
		{"port not a number", []string{"sb_1", "http"}, false, 0, 0, true},
		{"port zero", []string{"sb_1", "0"}, false, 0, 0, true},
		{"port too big", []string{"sb_1", "65536"}, false, 0, 0, true},
		{"extra", []string{"sb_1", "80", "x"}, false, 0, 0, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			opts, err := previewOptions(tc.pos, tc.private, tc.ttl)
			if tc.wantErr {
				var ue *usageError
				if !errors.As(err, &ue) {
					t.Fatalf("got %v, want a usage error", err)
				}
				return
			}
			if err != nil || len(opts) != tc.wantN {
				t.Errorf("got %d options, %v; want %d", len(opts), err, tc.wantN)
			}
		})
	}
}

func TestPreviewAndPortsCommands(t *testing.T) {
	var got api.PreviewRequest
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/sandboxes/{id}/preview", func(w http.ResponseWriter, r *http.Request) {
		json.NewDecoder(r.Body).Decode(&got)
		json.NewEncoder(w).Encode(api.Preview{URL: "http://8080-sb_1.localhost:8181/"})
	})
	mux.HandleFunc("GET /v1/sandboxes/{id}/ports", func(w http.ResponseWriter, r *http.Request) {
		json.NewEncoder(w).Encode([]api.Port{{Proto: "tcp", Address: "0.0.0.0", Port: 8080, Pid: 7, Command: "httpd"}})
	})
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	host := "tcp://" + strings.TrimPrefix(srv.URL, "http://")

	var out, errb strings.Builder
	if code := run([]string{"--host", host, "preview", "sb_1", "8080", "--private", "--ttl", "2h"}, nil, &out, &errb); code != 0 {
		t.Fatalf("preview: exit %d: %s", code, errb.String())
	}
	if out.String() != "http://8080-sb_1.localhost:8181/\n" || !got.Private || got.TTL == nil || *got.TTL != api.Duration(2*time.Hour) {
		t.Errorf("got %q, request %+v", out.String(), got)
	}
	out.Reset()
	if code := run([]string{"--host", host, "ports", "sb_1"}, nil, &out, &errb); code != 0 {
		t.Fatalf("ports: exit %d: %s", code, errb.String())
	}
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	if len(lines) != 2 || strings.Join(strings.Fields(lines[0]), " ") != "PROTO ADDRESS PORT PID COMMAND" || strings.Join(strings.Fields(lines[1]), " ") != "tcp 0.0.0.0 8080 7 httpd" {
		t.Errorf("got table %q", out.String())
	}
	out.Reset()
	if code := run([]string{"--host", host, "--json", "ports", "sb_1"}, nil, &out, &errb); code != 0 {
		t.Fatalf("ports --json: exit %d", code)
	}
	var ps struct{ Ports []api.Port }
	if err := json.Unmarshal([]byte(out.String()), &ps); err != nil || len(ps.Ports) != 1 || ps.Ports[0].Port != 8080 {
		t.Errorf("got %q: %v", out.String(), err)
	}
}
