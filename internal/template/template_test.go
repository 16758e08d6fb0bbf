package template

import (
	"context"
	"errors"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
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
	tmpl, err := s.Build(ctx, Tiny, false, nil, first.add)
	if err != nil {
		t.Fatalf("Build: %v", err)
	}
	if tmpl.Name != Tiny || tmpl.Size <= 0 || tmpl.CreatedAt.IsZero() || ValidVersion(tmpl.Version) != nil {
		t.Errorf("Build = %+v, want name tiny, a size, a time and a version", tmpl)
	}
	if tmpl.Defaults.User != "" {
		t.Errorf("tiny's user = %q, want root", tmpl.Defaults.User)
	}
	if first.has("cached") {
		t.Errorf("first build said cached: %q", first.msgs)
	}
	rootfs, err := s.Rootfs(Tiny)
	if err != nil {
		t.Fatalf("Rootfs: %v", err)
	}
	if want := filepath.Join(dir, "versions", digestDir(tmpl.Version), "rootfs"); rootfs != want {
		t.Errorf("Rootfs = %q, want %q", rootfs, want)
	}
	if vr, err := s.VersionRootfs(tmpl.Version); err != nil || vr != rootfs {
		t.Errorf("VersionRootfs = %q, %v; want %q", vr, err, rootfs)
	}
	if real, err := filepath.EvalSymlinks(rootfs); err != nil || real != rootfs {
		t.Errorf("Rootfs %q resolves to %q, %v: want no symlinks", rootfs, real, err)
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
	cached, err := s.Build(ctx, Tiny, false, nil, second.add)
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

	// the same content built again is the same version, reused
	var third recorder
	again, err := s.Build(ctx, Tiny, true, nil, third.add)
	if err != nil {
		t.Fatalf("forced Build: %v", err)
	}
	if third.has("cached") || !third.has("reused") {
		t.Errorf("forced Build progress = %q, want a build that says its content is reused", third.msgs)
	}
	if diff := cmp.Diff(tmpl, again); diff != "" {
		t.Errorf("forced Build of the same content (-want +got):\n%s", diff)
	}
	if got := versionsIn(t, dir); len(got) != 1 {
		t.Errorf("store holds versions %q, want one", got)
	}
	noWork(t, dir)
	list, err := s.List()
	if err != nil {
		t.Fatal(err)
	}
	if len(list) != 1 || list[0].Name != Tiny || list[0].Version != tmpl.Version {
		t.Errorf("List = %+v, want just tiny", list)
	}
}

// TestBuildNewVersion: a build of different content makes a new version;
// the old one's rootfs stays, whole, until Collect, which takes it only
// when nothing uses it.
func TestBuildNewVersion(t *testing.T) {
	needBusybox(t)
	s, dir := openStore(t)
	ctx := context.Background()
	old, err := s.Build(ctx, Tiny, false, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	oldRootfs, _ := s.VersionRootfs(old.Version)

	// a different busybox (a copy with a byte more) makes different content
	fake := filepath.Join(t.TempDir(), "busybox")
	b, err := os.ReadFile(busyboxPath)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(fake, append(b, 0), 0o755); err != nil {
		t.Fatal(err)
	}
	saved := busyboxPath
	busyboxPath = fake
	t.Cleanup(func() { busyboxPath = saved })

	var rec recorder
	nw, err := s.Build(ctx, Tiny, true, nil, rec.add)
	if err != nil {
		t.Fatal(err)
	}
	if nw.Version == old.Version || rec.has("reused") {
		t.Fatalf("rebuild of other content: version %s (was %s), progress %q; want a new version", nw.Version, old.Version, rec.msgs)
	}
	if cur, _ := s.Resolve(Tiny); cur.Version != nw.Version {
		t.Errorf("tiny points at %s, want the new %s", cur.Version, nw.Version)
	}
	if _, err := os.Stat(filepath.Join(oldRootfs, "bin/busybox")); err != nil {
		t.Errorf("the old version's rootfs lost its files: %v", err)
	}
	if v, err := s.Version(old.Version); err != nil || v.Version != old.Version || v.Name != "" {
		t.Errorf("Version(old) = %+v, %v", v, err)
	}

	// Collect keeps what inUse says is used, then removes it when not
	removed, err := s.Collect(func(v string) bool { return v == old.Version })
	if err != nil || len(removed) != 0 {
		t.Fatalf("Collect with the old version in use = %q, %v; want nothing removed", removed, err)
	}
	var asked []string
	removed, err = s.Collect(func(v string) bool { asked = append(asked, v); return false })
	if err != nil || !slices.Equal(removed, []string{old.Version}) {
		t.Fatalf("Collect = %q, %v; want [%s]", removed, err, old.Version)
	}
	if slices.Contains(asked, nw.Version) {
		t.Errorf("Collect asked about %s, which a name points at", nw.Version)
	}
	if _, err := os.Stat(oldRootfs); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("the collected version's rootfs: %v, want it gone", err)
	}
	if _, err := s.Version(old.Version); !errors.Is(err, api.ErrNotFound) {
		t.Errorf("Version(collected) = %v, want api.ErrNotFound", err)
	}
	if _, err := s.Rootfs(Tiny); err != nil {
		t.Errorf("Rootfs(tiny) after Collect: %v", err)
	}
	noWork(t, dir)
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
		wg.Go(func() { _, errs[i] = s.Build(context.Background(), Tiny, false, nil, recs[i].add) })
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
	old, err := s.Build(context.Background(), Tiny, false, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	saved := busyboxPath
	busyboxPath = filepath.Join(t.TempDir(), "no-busybox")
	t.Cleanup(func() { busyboxPath = saved })

	_, err = s.Build(context.Background(), Tiny, true, nil, nil)
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
	if got := versionsIn(t, dir); len(got) != 1 {
		t.Errorf("store holds versions %q, want one", got)
	}
	noWork(t, dir)
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
		{"get missing", func() error { _, err := s.Get("nope"); return err }, api.ErrNotFound, "template nope not found; build it or import"},
		{"rootfs missing", func() error { _, err := s.Rootfs("nope"); return err }, api.ErrNotFound, "not found"},
		{"remove missing", func() error { _, err := s.Remove("nope"); return err }, api.ErrNotFound, "not found"},
		{"get bad name", func() error { _, err := s.Get("../x"); return err }, api.ErrInvalid, "invalid template name"},
		{"remove bad name", func() error { _, err := s.Remove("A"); return err }, api.ErrInvalid, "invalid template name"},
		{"version malformed", func() error { _, err := s.Version("sha256:xyz"); return err }, api.ErrInvalid, "invalid template version"},
		{"version path", func() error { _, err := s.VersionRootfs("../../etc"); return err }, api.ErrInvalid, "invalid template version"},
		{"version missing", func() error { _, err := s.Version("sha256:" + strings.Repeat("0", 64)); return err }, api.ErrNotFound, "not found"},
		{"build unknown", func() error { _, err := s.Build(ctx, "ubuntu", false, nil, nil); return err }, api.ErrInvalid, "others are imported"},
		{"build bad name", func() error { _, err := s.Build(ctx, "Ubuntu", false, []string{"jq"}, nil); return err }, api.ErrInvalid, "invalid template name"},
		{"build base with packages", func() error { _, err := s.Build(ctx, Base, false, []string{"jq"}, nil); return err }, api.ErrInvalid, "another name"},
		{"build bad package", func() error { _, err := s.Build(ctx, "tools", false, []string{"jq;rm"}, nil); return err }, api.ErrInvalid, "invalid package name"},
		{"build option package", func() error {
			_, err := s.Build(ctx, "tools", false, []string{"--allow-unauthenticated"}, nil)
			return err
		}, api.ErrInvalid, "invalid package name"},
		{"import bad name", func() error { _, err := s.Import(ctx, "X", strings.NewReader(""), false, nil); return err }, api.ErrInvalid, "invalid template name"},
		{"import empty", func() error { _, err := s.Import(ctx, "x", strings.NewReader(""), false, nil); return err }, api.ErrInvalid, "empty"},
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

func TestValidPackages(t *testing.T) {
	got, err := ValidPackages([]string{"jq", "g++", "libc6-dev", "python3.11", "jq"})
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]string{"g++", "jq", "libc6-dev", "python3.11"}, got); diff != "" {
		t.Errorf("ValidPackages (-want +got):\n%s", diff)
	}
	for _, bad := range []string{"", "a", "Jq", "-o", "jq=1.6", "a b", "x/y", "../x", "pkg:amd64", strings.Repeat("a", 101)} {
		if _, err := ValidPackages([]string{bad}); !errors.Is(err, api.ErrInvalid) {
			t.Errorf("ValidPackages(%q) = %v, want api.ErrInvalid", bad, err)
		}
	}
	if _, err := ValidPackages(make([]string, maxPackages+1)); !errors.Is(err, api.ErrInvalid) {
		t.Errorf("ValidPackages of %d = %v, want api.ErrInvalid", maxPackages+1, err)
	}
}

func TestRemove(t *testing.T) {
	s, dir := openStore(t)
	ctx := context.Background()
	var made []api.Template
	for _, n := range []string{"b", "a"} {
		tm, err := s.Import(ctx, n, tarOf(t, false, []entry{{hdr: file("hello", 0o644), body: "hi " + n}}), false, nil)
		if err != nil {
			t.Fatal(err)
		}
		made = append(made, tm)
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
	rootfs, _ := s.Rootfs("a")
	got, err := s.Remove("a")
	if err != nil {
		t.Fatalf("Remove: %v", err)
	}
	if got.Name != "a" || got.Version != made[1].Version {
		t.Errorf("Remove = %+v, want a at %s", got, made[1].Version)
	}
	if _, err := s.Get("a"); !errors.Is(err, api.ErrNotFound) {
		t.Errorf("Get after Remove = %v, want api.ErrNotFound", err)
	}
	if _, err := s.Remove("a"); !errors.Is(err, api.ErrNotFound) {
		t.Errorf("second Remove = %v, want api.ErrNotFound", err)
	}
	// the name is gone, the version's files are not
	if b, err := os.ReadFile(filepath.Join(rootfs, "hello")); err != nil || string(b) != "hi a" {
		t.Errorf("the removed name's rootfs: %q, %v; want it whole until Collect", b, err)
	}
	if v, err := s.Version(made[1].Version); err != nil || v.Version != made[1].Version {
		t.Errorf("Version of the removed name's version = %+v, %v", v, err)
	}
	if diff := cmp.Diff([]string{"b"}, names()); diff != "" {
		t.Errorf("List after Remove (-want +got):\n%s", diff)
	}
	removed, err := s.Collect(nil)
	if err != nil || !slices.Equal(removed, []string{made[1].Version}) {
		t.Errorf("Collect = %q, %v; want [%s]", removed, err, made[1].Version)
	}
	if got := versionsIn(t, dir); !slices.Equal(got, []string{made[0].Version}) {
		t.Errorf("versions after Collect = %q, want b's only", got)
	}
}

// TestImportSameContent: the same tree imported twice, under two names, is
// one version.
func TestImportSameContent(t *testing.T) {
	s, sdir := openStore(t)
	ctx := context.Background()
	es := []entry{{hdr: dir("etc/", 0o755)}, {hdr: file("etc/x", 0o644), body: "same"}}
	a, err := s.Import(ctx, "a", tarOf(t, false, es), false, nil)
	if err != nil {
		t.Fatal(err)
	}
	var rec recorder
	b, err := s.Import(ctx, "b", tarOf(t, true, es), false, rec.add)
	if err != nil {
		t.Fatal(err)
	}
	if a.Version != b.Version || !rec.has("reused") {
		t.Errorf("versions %s and %s, progress %q; want one version, reused", a.Version, b.Version, rec.msgs)
	}
	// a different mode is different content
	es[1].hdr.Mode = 0o600
	c, err := s.Import(ctx, "a", tarOf(t, false, es), true, nil)
	if err != nil {
		t.Fatal(err)
	}
	if c.Version == a.Version {
		t.Errorf("a different mode gave the same version")
	}
	if got := versionsIn(t, sdir); len(got) != 2 {
		t.Errorf("versions = %q, want two", got)
	}
	if _, err := s.Import(ctx, "a", tarOf(t, false, es), false, nil); !errors.Is(err, api.ErrConflict) || !strings.Contains(err.Error(), "with force") {
		t.Errorf("import over a name without force = %v, want api.ErrConflict saying to import with force", err)
	}
}

// TestOpenMigrates: a store of the old layout (<name>/rootfs and
// template.json) is migrated in place, with its leftovers handled as the old
// sbx did; the templates keep their names and contents.
func TestOpenMigrates(t *testing.T) {
	dir := t.TempDir()
	mk := func(p, meta string) {
		if err := os.MkdirAll(filepath.Join(dir, p, "rootfs", "etc"), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, p, "rootfs", "etc", "name"), []byte(p), 0o644); err != nil {
			t.Fatal(err)
		}
		if meta != "" {
			if err := os.WriteFile(filepath.Join(dir, p, "template.json"), []byte(meta), 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}
	mk(".tmp-base-123", "")                                  // an interrupted build
	mk(".rm-gone-abc", `{"name":"gone"}`)                    // an interrupted removal
	mk(".old-lost-abc", `{"name":"lost","source":"import"}`) // a forced build that crashed between its renames
	mk(".old-kept-abc", `{"name":"kept","source":"import"}`) // one that crashed after them
	mk("kept", `{"name":"kept","source":"import","sizeBytes":5}`)
	mk("tmp", `{"name":"tmp","source":"import"}`) // a template named like a directory of the new layout
	mk("half", "")                                // never complete
	s, err := Open(dir)
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	list, err := s.List()
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, tm := range list {
		got = append(got, tm.Name)
		if ValidVersion(tm.Version) != nil || tm.Source != "import" {
			t.Errorf("migrated %+v, want a version and the old source", tm)
		}
		rootfs, err := s.Rootfs(tm.Name)
		if err != nil {
			t.Fatal(err)
		}
		if b, err := os.ReadFile(filepath.Join(rootfs, "etc/name")); err != nil || !strings.Contains(string(b), tm.Name) {
			t.Errorf("%s's /etc/name = %q, %v", tm.Name, b, err)
		}
		checkSkeleton(t, rootfs)
	}
	if diff := cmp.Diff([]string{"kept", "lost", "tmp"}, got); diff != "" {
		t.Errorf("templates after migration (-want +got):\n%s", diff)
	}
	for _, e := range entries(t, dir) {
		if !slices.Contains([]string{".lock", "half", "layers", "names", "tmp", "versions"}, e) {
			t.Errorf("left in the store's directory: %s", e)
		}
	}
	noWork(t, dir)
	// opening again changes nothing
	before := versionsIn(t, dir)
	if _, err := Open(dir); err != nil {
		t.Fatal(err)
	}
	if after := versionsIn(t, dir); !slices.Equal(before, after) {
		t.Errorf("versions after a second Open = %q, want %q", after, before)
	}
}

// TestOpenMigratesAfterCrash: a migration interrupted after the name was
// pointed but before its version was moved in carries on at the next Open.
func TestOpenMigratesAfterCrash(t *testing.T) {
	dir := t.TempDir()
	if err := os.MkdirAll(filepath.Join(dir, ".migrate-web", "rootfs", "srv"), 0o755); err != nil {
		t.Fatal(err)
	}
	os.WriteFile(filepath.Join(dir, ".migrate-web", "template.json"), []byte(`{"name":"web","source":"import"}`), 0o644)
	os.MkdirAll(filepath.Join(dir, "names"), 0o700)
	os.Symlink("sha256:"+strings.Repeat("1", 64), filepath.Join(dir, "names", "web")) // a stale pointer from the crashed run
	s, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	// the stale pointer is kept (it was there first) but points at nothing:
	// Resolve says so, and the migrated version is there to point it at
	if _, err := s.Resolve("web"); !errors.Is(err, api.ErrNotFound) {
		t.Errorf("Resolve = %v, want api.ErrNotFound for a pointer at a missing version", err)
	}
	if vs := versionsIn(t, dir); len(vs) != 1 {
		t.Errorf("versions = %q, want the migrated one", vs)
	}
}

// TestOpenClearsDeadWork: the work of an operation whose process died is
// removed at Open; a live one's (its lease locked) is left alone.
func TestOpenClearsDeadWork(t *testing.T) {
	s, dir := openStore(t)
	live, err := s.newLease("sha256:" + strings.Repeat("2", 64))
	if err != nil {
		t.Fatal(err)
	}
	defer live.release()
	os.WriteFile(filepath.Join(live.work, "partial"), []byte("x"), 0o644)
	dead := filepath.Join(dir, "tmp", "deadbeef")
	os.MkdirAll(filepath.Join(dead, "version", "rootfs"), 0o755)
	os.WriteFile(dead+".lease", []byte("version sha256:"+strings.Repeat("3", 64)+"\n"), 0o600)
	os.MkdirAll(filepath.Join(dir, "tmp", "orphan"), 0o755) // no lease at all
	if _, err := Open(dir); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{dead, dead + ".lease", filepath.Join(dir, "tmp", "orphan")} {
		if _, err := os.Lstat(p); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("%s: %v, want it removed", p, err)
		}
	}
	if _, err := os.Stat(filepath.Join(live.work, "partial")); err != nil {
		t.Errorf("a live operation's work was removed: %v", err)
	}
}

// TestCollectSparesWorkInProgress: a version an operation holds (in this
// process or another) is never collected, nor are the layers it reads.
func TestCollectSparesWorkInProgress(t *testing.T) {
	s, dir := openStore(t)
	ctx := context.Background()
	tm, err := s.Import(ctx, "x", tarOf(t, false, []entry{{hdr: file("f", 0o644), body: "x"}}), false, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Remove("x"); err != nil {
		t.Fatal(err)
	}
	// another process's lease: a second Store on the same directory
	other, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	l, err := other.newLease(tm.Version)
	if err != nil {
		t.Fatal(err)
	}
	if removed, err := s.Collect(nil); err != nil || len(removed) != 0 {
		t.Errorf("Collect while leased = %q, %v; want nothing removed", removed, err)
	}
	l.release()
	if removed, err := s.Collect(nil); err != nil || len(removed) != 1 {
		t.Errorf("Collect after the lease ended = %q, %v; want the version removed", removed, err)
	}
}

// TestPointerIsAtomic: at every instant of many repoints, the name resolves
// to one of the versions, never to nothing.
func TestPointerIsAtomic(t *testing.T) {
	s, _ := openStore(t)
	ctx := context.Background()
	var vs []string
	for i := range 2 {
		tm, err := s.Import(ctx, "flip", tarOf(t, false, []entry{{hdr: file("f", 0o644), body: strconv.Itoa(i)}}), true, nil)
		if err != nil {
			t.Fatal(err)
		}
		vs = append(vs, tm.Version)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := range 200 {
			if err := s.critical(func() error { return s.point("flip", vs[i%2]) }); err != nil {
				t.Error(err)
				return
			}
		}
	}()
	for {
		select {
		case <-done:
			return
		default:
		}
		tm, err := s.Resolve("flip")
		if err != nil || !slices.Contains(vs, tm.Version) {
			t.Fatalf("Resolve during repoints = %+v, %v", tm, err)
		}
	}
}

// versionsIn lists the versions in the store at dir.
func versionsIn(t *testing.T, dir string) []string {
	t.Helper()
	var out []string
	for _, e := range entries(t, filepath.Join(dir, "versions")) {
		out = append(out, dirDigest(e))
	}
	return out
}

// noWork fails if an operation left work or a lease behind.
func noWork(t *testing.T, dir string) {
	t.Helper()
	if got := entries(t, filepath.Join(dir, "tmp")); len(got) != 0 {
		t.Errorf("tmp holds %q, want nothing", got)
	}
}

// noLeftovers fails unless the store holds no name, version or work.
func noLeftovers(t *testing.T, dir string) {
	t.Helper()
	for _, d := range []string{"names", "versions", "tmp"} {
		if got := entries(t, filepath.Join(dir, d)); len(got) != 0 {
			t.Errorf("%s holds %q, want nothing", d, got)
		}
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

// TestCriticalExcludes: critical's flock alone (no mutex) lets one caller
// at a time in, within this process as across processes.
func TestCriticalExcludes(t *testing.T) {
	s, err := Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	var in, most atomic.Int32
	var wg sync.WaitGroup
	for i := 0; i < 8; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := 0; j < 20; j++ {
				err := s.critical(func() error {
					n := in.Add(1)
					if n > most.Load() {
						most.Store(n)
					}
					time.Sleep(100 * time.Microsecond) // a window for another to come in
					in.Add(-1)
					return nil
				})
				if err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	if most.Load() != 1 {
		t.Errorf("%d callers were in critical at once, want 1", most.Load())
	}
}
