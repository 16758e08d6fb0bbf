package client

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"

	"sbx.dev/sbx/api"
)

// TestAttack2ReadDirLyingPages: what a sandbox answers to fs ls may be
// anything (its agent can be replaced from inside); sbxd passes on pages of
// up to 16 MiB, and the client gathers them up to 1<<20 entries. Pages of
// 5,000 entries with long paths, each moving on, make the CLI hold
// gigabytes (1<<20 entries of 3 KiB: 3 GiB) before it calls the listing
// endless. The client should bound what it gathers by size too; here it
// must give up before 256 MiB has been served.
func TestAttack2ReadDirLyingPages(t *testing.T) {
	const bound = 256 << 20
	var served atomic.Int64
	long := strings.Repeat("p", 3000)
	c := newTest(t, func(w http.ResponseWriter, r *http.Request) {
		if served.Load() > bound {
			writeErr(w, api.ErrUnavailable, "the test's bound")
			return
		}
		after := r.URL.Query().Get("after")
		page := make([]api.FileInfo, api.MaxListPage)
		for i := range page {
			name := fmt.Sprintf("%s%06d", after, i)
			page[i] = api.FileInfo{Name: name, Path: "/" + long + name}
		}
		b, _ := json.Marshal(page)
		served.Add(int64(len(b)))
		w.Header().Set("Content-Type", "application/json")
		w.Write(b)
	})
	_, err := c.Sandbox("sb_1").Files().ReadDir(context.Background(), "/d")
	if served.Load() > bound {
		t.Errorf("a listing that keeps moving on: the client took %d MiB (%v) and would go on to 1<<20 entries; want it to stop within a size bound", served.Load()>>20, err)
	}
	if err == nil {
		t.Errorf("no error for a listing that never ends")
	}
}

// TestAttack2ReadDirStuckPages: pages that repeat or go back end the
// listing with an error at once.
func TestAttack2ReadDirStuckPages(t *testing.T) {
	for name, mk := range map[string]func(after string) string{
		"repeats":    func(after string) string { return "m" },
		"goes back":  func(after string) string { return "a" },
		"empty name": func(after string) string { return "" },
	} {
		t.Run(name, func(t *testing.T) {
			var calls atomic.Int64
			c := newTest(t, func(w http.ResponseWriter, r *http.Request) {
				calls.Add(1)
				page := make([]api.FileInfo, api.MaxListPage)
				for i := range page {
					page[i] = api.FileInfo{Name: mk(r.URL.Query().Get("after"))}
				}
				w.Header().Set("Content-Type", "application/json")
				json.NewEncoder(w).Encode(page)
			})
			_, err := c.Sandbox("sb_1").Files().ReadDir(context.Background(), "/d")
			if err == nil || calls.Load() > 3 {
				t.Errorf("%d pages asked, err %v; want an error within 3 pages", calls.Load(), err)
			}
		})
	}
}
