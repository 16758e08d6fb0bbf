package client

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/google/go-cmp/cmp"

	"sbx.dev/sbx/api"
)

func TestFileCalls(t *testing.T) {
	var got []string
	c := newTest(t, func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		got = append(got, r.Method+" "+r.URL.Path+"?"+r.URL.RawQuery+" "+string(b))
		w.WriteHeader(http.StatusNoContent)
	})
	ctx := context.Background()
	f := c.Sandbox("sb_1").Files()
	steps := []error{
		f.MkdirAll(ctx, "/a/b"),
		f.MkdirAll(ctx, "~/c", WithMode(0o700)),
		f.Remove(ctx, "/a/b"),
		f.RemoveAll(ctx, "/a"),
		f.Rename(ctx, "/x", "/y z"),
		f.WriteString(ctx, "/s", "hi"),
		f.WriteFile(ctx, "/b", []byte{1, 2}, WithMode(0o600)),
	}
	for i, err := range steps {
		if err != nil {
			t.Errorf("step %d: %v", i, err)
		}
	}
	want := []string{
		"POST /v1/sandboxes/sb_1/fs/mkdir?path=%2Fa%2Fb ",
		"POST /v1/sandboxes/sb_1/fs/mkdir?mode=0700&path=~%2Fc ",
		"DELETE /v1/sandboxes/sb_1/files?path=%2Fa%2Fb ",
		"DELETE /v1/sandboxes/sb_1/files?path=%2Fa&recursive=1 ",
		`POST /v1/sandboxes/sb_1/fs/rename? {"from":"/x","to":"/y z"}`,
		"PUT /v1/sandboxes/sb_1/files?path=%2Fs hi",
		"PUT /v1/sandboxes/sb_1/files?mode=0600&path=%2Fb \x01\x02",
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("requests (-want +got):\n%s", diff)
	}
}

func TestReadFileLimit(t *testing.T) {
	c := newTest(t, func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, strings.Repeat("x", 1000))
	})
	f := c.Sandbox("sb_1").Files()
	if b, err := f.ReadFile(context.Background(), "/f", 1000); err != nil || len(b) != 1000 {
		t.Errorf("at the limit: got %d bytes, %v", len(b), err)
	}
	if _, err := f.ReadFile(context.Background(), "/f", 999); !errors.Is(err, api.ErrTooLarge) {
		t.Errorf("past the limit: got %v, want ErrTooLarge", err)
	}
}

// A downloaded symlink gets its target's mode, or 0644; never the link's 0777.
func TestDownloadModes(t *testing.T) {
	old := syscall.Umask(0o022)
	defer syscall.Umask(old)
	infos := map[string]api.FileInfo{
		"/d/link":   {Name: "link", Path: "/d/link", Mode: "Lrwxrwxrwx", Link: "target"},
		"/d/target": {Name: "target", Path: "/d/target", Mode: "-rwxr-x---"},
		"/d/dangle": {Name: "dangle", Path: "/d/dangle", Mode: "Lrwxrwxrwx", Link: "/nowhere"},
		"/d/plain":  {Name: "plain", Path: "/d/plain", Mode: "-rw-rw-rw-"},
	}
	c := newTest(t, func(w http.ResponseWriter, r *http.Request) {
		p := r.URL.Query().Get("path")
		switch r.URL.Path {
		case "/v1/sandboxes/sb_1/fs/stat":
			fi, ok := infos[p]
			if !ok {
				writeErr(w, api.ErrNotFound, p+" does not exist")
				return
			}
			json.NewEncoder(w).Encode(fi)
		case "/v1/sandboxes/sb_1/files":
			io.WriteString(w, "content")
		}
	})
	dir := t.TempDir()
	f := c.Sandbox("sb_1").Files()
	for remote, want := range map[string]os.FileMode{"/d/link": 0o750, "/d/dangle": 0o644, "/d/plain": 0o644} {
		local := filepath.Join(dir, filepath.Base(remote))
		if _, err := f.Download(context.Background(), remote, local); err != nil {
			t.Fatalf("%s: %v", remote, err)
		}
		checkMode(t, local, want)
	}
}
