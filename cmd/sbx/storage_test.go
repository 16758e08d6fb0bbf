package main

import (
	"bytes"
	"encoding/json"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"sbx.dev/sbx/api"
)

// TestStorageVerbs: df, prune, snapshot keep and delete --keep-freezes
// against a fake sbxd: what each sends, prints and exits with.
func TestStorageVerbs(t *testing.T) {
	var mu sync.Mutex
	var got []string // METHOD path?query body
	mux := http.NewServeMux()
	note := func(r *http.Request) string {
		var b bytes.Buffer
		b.ReadFrom(r.Body)
		s := r.Method + " " + r.URL.Path
		if r.URL.RawQuery != "" {
			s += "?" + r.URL.RawQuery
		}
		s += " " + strings.TrimSpace(b.String())
		mu.Lock()
		got = append(got, s)
		mu.Unlock()
		return b.String()
	}
	created := time.Now().Add(-2 * time.Hour)
	mux.HandleFunc("GET /v1/storage", func(w http.ResponseWriter, r *http.Request) {
		note(r)
		json.NewEncoder(w).Encode(api.Storage{DataDir: "/var/lib/sbx", Used: 3 << 30, Max: 10 << 30, Free: 50 << 30,
			Totals:    map[string]int64{"sandbox": 1 << 20, "freeze": 2 << 30, "orphan": 1 << 30},
			Sandboxes: []api.StorageItem{{Kind: "sandbox", ID: "sb_1", Name: "web", Bytes: 1 << 20, CreatedAt: created}},
			Freezes:   []api.StorageItem{{Kind: "freeze", ID: "im_f", Name: "freeze-web-abcd", SandboxID: "sb_1", Bytes: 2 << 30, Kept: true}},
			Orphans:   []api.StorageItem{{Kind: "orphan", ID: "im_o", SandboxID: "sb_gone", Bytes: 1 << 30, CreatedAt: created}},
		})
	})
	mux.HandleFunc("POST /v1/storage/prune", func(w http.ResponseWriter, r *http.Request) {
		var req api.PruneRequest
		json.Unmarshal([]byte(note(r)), &req)
		json.NewEncoder(w).Encode(api.PruneResult{DryRun: req.DryRun, Reclaimed: 1 << 30,
			Removed: []api.StorageItem{{Kind: "orphan", ID: "im_o", SandboxID: "sb_gone", Bytes: 1 << 30}}})
	})
	mux.HandleFunc("POST /v1/snapshots/{name}/keep", func(w http.ResponseWriter, r *http.Request) {
		note(r)
		if r.PathValue("name") != "freeze-web-abcd" {
			status, code := api.StatusOf(api.ErrNotFound)
			w.WriteHeader(status)
			json.NewEncoder(w).Encode(api.ErrorBody{Error: &api.ErrorDetail{Code: code, Message: "snapshot " + r.PathValue("name") + " not found"}})
			return
		}
		json.NewEncoder(w).Encode(api.Snapshot{Name: r.PathValue("name"), Kept: true})
	})
	mux.HandleFunc("DELETE /v1/sandboxes/{id}", func(w http.ResponseWriter, r *http.Request) {
		note(r)
		res := api.DeleteResult{ID: r.PathValue("id")}
		if r.URL.Query().Get("keepFreezes") != "1" {
			res.Freezes = []string{"freeze-web-abcd"}
		}
		json.NewEncoder(w).Encode(res)
	})
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	host := "tcp://" + srv.Listener.Addr().(*net.TCPAddr).String()

	tests := []struct {
		name     string
		args     []string
		code     int
		sent     string // the request, "" for none
		out, err string // substrings of stdout and stderr
	}{
		{"df", []string{"df"}, 0, "GET /v1/storage ", "freeze (kept)", ""},
		{"df totals", []string{"df"}, 0, "GET /v1/storage ", "3.0G of 10.0G (sbxd --storage-max), 50.0G free on /var/lib/sbx", ""},
		{"df json", []string{"--json", "df"}, 0, "GET /v1/storage ", `"maxBytes": 10737418240`, ""},
		{"df args", []string{"df", "x"}, 2, "", "", "no arguments"},
		{"prune", []string{"prune"}, 0, "POST /v1/storage/prune {}", "removed orphan im_o of sb_gone, 1.0 GiB\nremoved 1, 1.0 GiB in all\n", ""},
		{"prune freezes older", []string{"prune", "--freezes", "--older-than", "3600", "--dry-run"}, 0,
			`POST /v1/storage/prune {"freezes":true,"olderThan":"1h0m0s","dryRun":true}`, "would remove orphan im_o", ""},
		{"prune bad duration", []string{"prune", "--older-than", "soon"}, 2, "", "", "--older-than"},
		{"keep", []string{"snapshot", "keep", "freeze-web-abcd"}, 0, "POST /v1/snapshots/freeze-web-abcd/keep ", "kept freeze-web-abcd\n", ""},
		{"keep unknown", []string{"snapshot", "keep", "nosuch"}, 1, "POST /v1/snapshots/nosuch/keep ", "", "snapshot nosuch not found"},
		{"keep none", []string{"snapshot", "keep"}, 2, "", "", "at least one snapshot name"},
		{"delete says its freezes", []string{"delete", "sb_1"}, 0, "DELETE /v1/sandboxes/sb_1 ", "sb_1\n", "removed the freezes of sb_1: freeze-web-abcd (--keep-freezes keeps them)"},
		{"delete keep freezes", []string{"delete", "--keep-freezes", "sb_1"}, 0, "DELETE /v1/sandboxes/sb_1?keepFreezes=1 ", "sb_1\n", ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			mu.Lock()
			got = nil
			mu.Unlock()
			var stdout, stderr bytes.Buffer
			code := run(append([]string{"--host", host}, tc.args...), strings.NewReader(""), &stdout, &stderr)
			if code != tc.code {
				t.Errorf("exit %d, want %d (stdout %q, stderr %q)", code, tc.code, stdout.String(), stderr.String())
			}
			mu.Lock()
			sent := strings.Join(got, "\n")
			mu.Unlock()
			if sent != tc.sent {
				t.Errorf("sent %q, want %q", sent, tc.sent)
			}
			if !strings.Contains(stdout.String(), tc.out) {
				t.Errorf("stdout %q, want %q in it", stdout.String(), tc.out)
			}
			if !strings.Contains(stderr.String(), tc.err) || (tc.err == "" && tc.code == 0 && stderr.Len() > 0) {
				t.Errorf("stderr %q, want %q", stderr.String(), tc.err)
			}
		})
	}
}
