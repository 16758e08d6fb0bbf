package template

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestCodeDigest(t *testing.T) {
	a := []byte("package p\n\nfunc f() int { return 1 }\n")
	commented := []byte("package p\n\n// f says one.\nfunc f() int {\n\treturn 1 // one\n}\n")
	other := []byte("package p\n\nfunc f() int { return 2 }\n")
	if codeDigest(a) != codeDigest(commented) {
		t.Errorf("comments and layout changed the digest: %s, %s", codeDigest(a), codeDigest(commented))
	}
	if codeDigest(a) == codeDigest(other) {
		t.Errorf("other code, same digest %s", codeDigest(a))
	}
	if codeDigest(a, other) == codeDigest(other, a) {
		t.Errorf("files in another order, same digest")
	}
	if r := recipe(); len(r) != 12 || r != codeDigest(buildCode, fsCode) {
		t.Errorf("recipe() = %q, want 12 hex digits of build.go and fs.go", r)
	}
}

// TestBuildOtherCode: a tiny made by other code (here, one whose skeleton
// still had /etc/hosts, as an older sbx's did) is built again by a build
// without force, and a build after that is cached; the same content made
// by other code is reused and then says it is this recipe's.
func TestBuildOtherCode(t *testing.T) {
	needBusybox(t)
	s, dir := openStore(t)
	ctx := context.Background()
	cur, err := s.Build(ctx, Tiny, false, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	if what, digest := splitRecipe(cur.Source); what != tinySource || digest != recipe() {
		t.Fatalf("tiny's source %q: want %q and this recipe %s", cur.Source, tinySource, recipe())
	}

	// an older sbx's tiny: other content, another version, another recipe
	oldVer := "sha256:" + strings.Repeat("0", 64)
	oldDir := filepath.Join(dir, "versions", digestDir(oldVer))
	if err := os.Rename(filepath.Join(dir, "versions", digestDir(cur.Version)), oldDir); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(oldDir, "rootfs/etc/hosts"), []byte("127.0.0.1 localhost\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	m, err := s.readMeta(oldVer)
	if err != nil {
		t.Fatal(err)
	}
	m.Source = tinySource + recipeSep + "000000000000"
	if err := writeMeta(filepath.Join(oldDir, metaFile), m); err != nil {
		t.Fatal(err)
	}
	if err := s.point(Tiny, oldVer); err != nil {
		t.Fatal(err)
	}

	var rec recorder
	nw, err := s.Build(ctx, Tiny, false, nil, rec.add)
	if err != nil {
		t.Fatal(err)
	}
	if rec.has("cached") || !rec.has("other code") || nw.Version != cur.Version {
		t.Fatalf("build over a tiny made by other code: version %s, progress %q; want it built again (%s), saying why", nw.Version, rec.msgs, cur.Version)
	}
	root, err := s.Rootfs(Tiny)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Lstat(filepath.Join(root, "etc/hosts")); err == nil {
		t.Errorf("the rebuilt tiny has the old code's /etc/hosts")
	}
	var again recorder
	if _, err := s.Build(ctx, Tiny, false, nil, again.add); err != nil || !again.has("cached") {
		t.Errorf("second build: %v, progress %q; want cached", err, again.msgs)
	}

	// the same content, recorded as made by other code: reused, and then
	// this recipe's
	m, err = s.readMeta(cur.Version)
	if err != nil {
		t.Fatal(err)
	}
	m.Source = tinySource + recipeSep + "000000000000"
	if err := writeMeta(filepath.Join(dir, "versions", digestDir(cur.Version), metaFile), m); err != nil {
		t.Fatal(err)
	}
	var reuse recorder
	if t2, err := s.Build(ctx, Tiny, false, nil, reuse.add); err != nil || !reuse.has("reused") || t2.Source != cur.Source {
		t.Fatalf("build over the same content made by other code: %+v, %v, progress %q; want it reused with this recipe's source", t2, err, reuse.msgs)
	}
	var third recorder
	if _, err := s.Build(ctx, Tiny, false, nil, third.add); err != nil || !third.has("cached") {
		t.Errorf("build after the reuse: %v, progress %q; want cached", err, third.msgs)
	}
}
