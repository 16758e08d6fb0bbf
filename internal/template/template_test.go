package template

import (
	"context"
	"errors"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"sbx.dev/sbx/api"
)

func TestValidName(t *testing.T) {
	tests := []struct {
		name string
		in   string
		ok   bool
	}{
		{"simple", "base", true},
		{"digits first", "1x", true},
		{"punctuation", "py3.12_slim-v2", true},
		{"63 chars", strings.Repeat("a", 63), true},
		{"64 chars", strings.Repeat("a", 64), false},
		{"empty", "", false},
		{"uppercase", "Base", false},
		{"leading dot", ".tmp-x", false},
		{"leading dash", "-x", false},
		{"slash", "a/b", false},
		{"dotdot", "..", false},
		{"space", "a b", false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := ValidName(tc.in)
			if got := err == nil; got != tc.ok {
				t.Fatalf("ValidName(%q) = %v, want ok=%v", tc.in, err, tc.ok)
			}
			if err != nil && !errors.Is(err, api.ErrInvalid) {
				t.Errorf("ValidName(%q) = %v, want api.ErrInvalid", tc.in, err)
			}
		})
	}
}

// recorder collects progress messages.
type recorder struct {
	mu   sync.Mutex
	msgs []string
}

func (r *recorder) add(m string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.msgs = append(r.msgs, m)
}

func (r *recorder) has(sub string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.ContainsFunc(r.msgs, func(m string) bool { return strings.Contains(m, sub) })
}

func openStore(t *testing.T) (*Store, string) {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "templates")
	s, err := Open(dir)
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	return s, dir
}

// entries returns the names in the store's directory.
func entries(t *testing.T, dir string) []string {
	t.Helper()
	es, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range es {
		out = append(out, e.Name())
	}
	return out
}

func needBusybox(t *testing.T) {
	t.Helper()
	if err := checkStatic(busyboxPath); err != nil {
		t.Skipf("no static busybox: %v", err)
	}
}

func TestBuildTiny(t *testing.T) {
	needBusybox(t)
	s, dir := openStore(t)
	ctx := context.Background()

	var first recorder
	tmpl, err := s.Build(ctx, Tiny, false, first.add)
	if err != nil {
		t.Fatalf("Build: %v", err)
	}
	if tmpl.Name != Tiny || tmpl.Size <= 0 || tmpl.CreatedAt.IsZero() {
		t.Errorf("Build = %+v, want name tiny, a size and a time", tmpl)
	}
	if first.has("cached") {
		t.Errorf("first build said cached: %q", first.msgs)
	}
	rootfs, err := s.Rootfs(Tiny)
	if err != nil {
		t.Fatalf("Rootfs: %v", err)
	}
	if want := filepath.Join(dir, Tiny, "rootfs"); rootfs != want {
		t.Errorf("Rootfs = %q, want %q", rootfs, want)
	}
	if !filepath.IsAbs(rootfs) {
		t.Errorf("Rootfs = %q, want an absolute path", rootfs)
	}

	busybox := filepath.Join(rootfs, "bin/busybox")
	for _, p := range []string{"/bin/sh", "/bin/sleep", "/bin/echo", "/bin/cat", "/bin/nc", "/bin/httpd", "/bin/wget", "/usr/bin/env", "/sbin/ip"} {
		got, err := filepath.EvalSymlinks(filepath.Join(rootfs, p))
		if err != nil || got != busybox {
			t.Errorf("%s resolves to %q, %v; want %q", p, got, err, busybox)
		}
	}
	if l, err := os.Readlink(filepath.Join(rootfs, "bin/sh")); err != nil || l != "busybox" {
		t.Errorf("readlink /bin/sh = %q, %v; want busybox", l, err)
	}
	checkSkeleton(t, rootfs)
	if b, err := os.ReadFile(filepath.Join(rootfs, "etc/passwd")); err != nil || !strings.HasPrefix(string(b), "root:x:0:0:") {
		t.Errorf("/etc/passwd = %q, %v; want a root entry", b, err)
	}
	if os.Geteuid() == 0 {
		out, err := exec.Command("chroot", rootfs, "/bin/sh", "-c", "echo hello from $(basename $0)").CombinedOutput()
		if err != nil || strings.TrimSpace(string(out)) != "hello from sh" {
			t.Errorf("chroot sh = %q, %v", out, err)
		}
	}

	var second recorder
	start := time.Now()
	cached, err := s.Build(ctx, Tiny, false, second.add)
	if err != nil {
		t.Fatalf("cached Build: %v", err)
	}
	if d := time.Since(start); d > time.Second {
		t.Errorf("cached Build took %v", d)
	}
	if !second.has("cached") {
		t.Errorf("cached Build progress = %q, want \"cached\"", second.msgs)
	}
	if diff := cmp.Diff(tmpl, cached); diff != "" {
		t.Errorf("cached Build (-want +got):\n%s", diff)
	}

	// mark the old rootfs to tell a rebuild from the cache
	marker := filepath.Join(rootfs, "old-marker")
	if err := os.WriteFile(marker, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	var third recorder
	if _, err := s.Build(ctx, Tiny, true, third.add); err != nil {
		t.Fatalf("forced Build: %v", err)
	}
	if third.has("cached") {
		t.Errorf("forced Build said cached: %q", third.msgs)
	}
	if _, err := os.Lstat(marker); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("after a forced build the old rootfs is still there: %v", err)
	}
	if got, want := entries(t, dir), []string{Tiny}; !slices.Equal(got, want) {
		t.Errorf("store holds %q, want %q", got, want)
	}
	list, err := s.List()
	if err != nil {
		t.Fatal(err)
	}
	if len(list) != 1 || list[0].Name != Tiny {
		t.Errorf("List = %+v, want just tiny", list)
	}
}

func checkSkeleton(t *testing.T, rootfs string) {
	t.Helper()
	for _, d := range skeletonDirs {
		fi, err := os.Lstat(filepath.Join(rootfs, d.name))
		if err != nil || !fi.IsDir() {
			t.Errorf("/%s: %v, want a directory", d.name, err)
		}
	}
	if fi, err := os.Stat(filepath.Join(rootfs, "tmp")); err != nil || fi.Mode()&(fs.ModePerm|fs.ModeSticky) != 0o777|fs.ModeSticky {
		t.Errorf("/tmp mode = %v, %v; want 1777", fi.Mode(), err)
	}
	for _, f := range skeletonFiles {
		fi, err := os.Lstat(filepath.Join(rootfs, f))
		if err != nil || !fi.Mode().IsRegular() {
			t.Errorf("/%s: %v, want a regular file", f, err)
		}
	}
}

func TestBuildConcurrent(t *testing.T) {
	needBusybox(t)
	s, _ := openStore(t)
	var wg sync.WaitGroup
	recs := make([]recorder, 2)
	errs := make([]error, 2)
	for i := range 2 {
		wg.Go(func() { _, errs[i] = s.Build(context.Background(), Tiny, false, recs[i].add) })
	}
	wg.Wait()
	if errs[0] != nil || errs[1] != nil {
		t.Fatalf("Build errors: %v, %v", errs[0], errs[1])
	}
	if n := btoi(recs[0].has("cached")) + btoi(recs[1].has("cached")); n != 1 {
		t.Errorf("%d of 2 concurrent builds said cached, want 1: %q / %q", n, recs[0].msgs, recs[1].msgs)
	}
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}

func TestBuildFailureKeepsOld(t *testing.T) {
	needBusybox(t)
	s, dir := openStore(t)
	old, err := s.Build(context.Background(), Tiny, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	saved := busyboxPath
	busyboxPath = filepath.Join(t.TempDir(), "no-busybox")
	t.Cleanup(func() { busyboxPath = saved })

	_, err = s.Build(context.Background(), Tiny, true, nil)
	if !errors.Is(err, api.ErrUnavailable) || !strings.Contains(err.Error(), "apt-get install busybox-static") {
		t.Fatalf("Build without busybox = %v, want api.ErrUnavailable saying apt-get install busybox-static", err)
	}
	got, err := s.Get(Tiny)
	if err != nil {
		t.Fatalf("Get after failed build: %v", err)
	}
	if diff := cmp.Diff(old, got); diff != "" {
		t.Errorf("template after failed build (-want +got):\n%s", diff)
	}
	if got, want := entries(t, dir), []string{Tiny}; !slices.Equal(got, want) {
		t.Errorf("store holds %q, want %q", got, want)
	}
}

func TestErrors(t *testing.T) {
	s, _ := openStore(t)
	ctx := context.Background()
	tests := []struct {
		name string
		op   func() error
		kind error
		says string
	}{
		{"get missing", func() error { _, err := s.Get("nope"); return err }, api.ErrNotFound, "sbx template build nope"},
		{"rootfs missing", func() error { _, err := s.Rootfs("nope"); return err }, api.ErrNotFound, "not found"},
		{"remove missing", func() error { return s.Remove("nope") }, api.ErrNotFound, "not found"},
		{"get bad name", func() error { _, err := s.Get("../x"); return err }, api.ErrInvalid, "invalid template name"},
		{"remove bad name", func() error { return s.Remove("A") }, api.ErrInvalid, "invalid template name"},
		{"build unknown", func() error { _, err := s.Build(ctx, "ubuntu", false, nil); return err }, api.ErrInvalid, "sbx template import"},
		{"import bad name", func() error { _, err := s.Import(ctx, "X", strings.NewReader(""), nil); return err }, api.ErrInvalid, "invalid template name"},
		{"import empty", func() error { _, err := s.Import(ctx, "x", strings.NewReader(""), nil); return err }, api.ErrInvalid, "empty"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.op()
			if !errors.Is(err, tc.kind) {
				t.Fatalf("got %v, want kind %v", err, tc.kind)
			}
			if !strings.Contains(err.Error(), tc.says) {
				t.Errorf("got %q, want it to say %q", err, tc.says)
			}
		})
	}
}

func TestRemove(t *testing.T) {
	s, dir := openStore(t)
	ctx := context.Background()
	for _, n := range []string{"b", "a"} {
		if _, err := s.Import(ctx, n, tarOf(t, false, []entry{{hdr: file("hello", 0o644), body: "hi"}}), nil); err != nil {
			t.Fatal(err)
		}
	}
	// an incomplete directory is not a template
	if err := os.MkdirAll(filepath.Join(dir, "c", "rootfs"), 0o755); err != nil {
		t.Fatal(err)
	}
	names := func() []string {
		list, err := s.List()
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, tm := range list {
			out = append(out, tm.Name)
		}
		return out
	}
	if diff := cmp.Diff([]string{"a", "b"}, names()); diff != "" {
		t.Errorf("List (-want +got):\n%s", diff)
	}
	if _, err := s.Get("c"); !errors.Is(err, api.ErrNotFound) {
		t.Errorf("Get(incomplete) = %v, want api.ErrNotFound", err)
	}
	if err := s.Remove("a"); err != nil {
		t.Fatalf("Remove: %v", err)
	}
	if _, err := s.Get("a"); !errors.Is(err, api.ErrNotFound) {
		t.Errorf("Get after Remove = %v, want api.ErrNotFound", err)
	}
	if err := s.Remove("a"); !errors.Is(err, api.ErrNotFound) {
		t.Errorf("second Remove = %v, want api.ErrNotFound", err)
	}
	if err := s.Remove("c"); err != nil {
		t.Errorf("Remove(incomplete) = %v", err)
	}
	if diff := cmp.Diff([]string{"b"}, entries(t, dir)); diff != "" {
		t.Errorf("store dir (-want +got):\n%s", diff)
	}
}

func TestOpenRecovers(t *testing.T) {
	dir := t.TempDir()
	mk := func(p string) {
		if err := os.MkdirAll(filepath.Join(dir, p), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	mk(".tmp-base-123/rootfs/etc") // an interrupted build
	mk(".rm-gone-abc/rootfs")      // an interrupted removal
	mk(".old-lost-abc/rootfs/bin") // a forced build that crashed between its renames
	mk(".old-kept-abc/rootfs/old") // one that crashed after them
	mk("kept/rootfs/new")          //
	if _, err := Open(dir); err != nil {
		t.Fatalf("Open: %v", err)
	}
	if diff := cmp.Diff([]string{"kept", "lost"}, entries(t, dir)); diff != "" {
		t.Errorf("store dir after Open (-want +got):\n%s", diff)
	}
	if _, err := os.Stat(filepath.Join(dir, "lost/rootfs/bin")); err != nil {
		t.Errorf("restored template: %v", err)
	}
	if _, err := os.Stat(filepath.Join(dir, "kept/rootfs/new")); err != nil {
		t.Errorf("current template: %v", err)
	}
}

func TestFilterAptOptions(t *testing.T) {
	dump := `Acquire::cdrom::mount "/media/cdrom/";
Acquire::Check-Valid-Until "false";
Acquire::http::Proxy "http://proxy:3128";
Acquire::http::Proxy::deb.example.org "DIRECT";
Acquire::https "";
APT::Architecture "amd64";
`
	want := []string{
		`Acquire::Check-Valid-Until "false";`,
		`Acquire::http::Proxy "http://proxy:3128";`,
		`Acquire::http::Proxy::deb.example.org "DIRECT";`,
	}
	if diff := cmp.Diff(want, filterAptOptions(dump)); diff != "" {
		t.Errorf("filterAptOptions (-want +got):\n%s", diff)
	}
}
