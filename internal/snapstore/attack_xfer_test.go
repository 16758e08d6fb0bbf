package snapstore

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
)

// pushed pushes files and fetches the manifest back.
func pushed(t *testing.T, r *reg, repo string, files map[string][]byte) (string, Manifest) {
	t.Helper()
	ctx := context.Background()
	a, _ := Open(t.TempDir())
	ref, _, err := a.Push(ctx, r.ref(repo), image(t, files), Manifest{Name: "x"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	m, _, err := Fetch(ctx, ref)
	if err != nil {
		t.Fatal(err)
	}
	return ref, m
}

// TestAttackXferStoreSymlink: a store entry that is a symlink named like a
// digest counts as held (Has stats through it), and the pull links the
// symlink itself into the image: the image's file is a link to anywhere.
func TestAttackXferStoreSymlink(t *testing.T) {
	r := newReg(t)
	ref, m := pushed(t, r, "sbx/s:1", map[string][]byte{"disk.tar": []byte("the real disk")})
	b, _ := Open(t.TempDir())
	secret := filepath.Join(t.TempDir(), "secret")
	os.WriteFile(secret, []byte("not the disk"), 0o600)
	p, _ := b.path(m.Files[0].Digest)
	if err := os.Symlink(secret, p); err != nil {
		t.Fatal(err)
	}
	dst := filepath.Join(t.TempDir(), "im")
	if _, err := b.Pull(context.Background(), ref, m, dst); err != nil {
		return // refused: fine
	}
	fi, err := os.Lstat(filepath.Join(dst, "disk.tar"))
	if err != nil || !fi.Mode().IsRegular() {
		t.Errorf("the pulled disk.tar is %v (%v), want a regular file", fi.Mode(), err)
	}
	if got, _ := os.ReadFile(filepath.Join(dst, "disk.tar")); string(got) != "the real disk" {
		t.Errorf("the pulled disk.tar reads %q", got)
	}
}

// TestAttackXferStoreTruncated: a store file cut short after it was
// stored (the pushing node's store shares the image's inode, 0600) is
// still taken as the digest's: the pull makes an image of the wrong bytes.
func TestAttackXferStoreTruncated(t *testing.T) {
	r := newReg(t)
	ctx := context.Background()
	a, _ := Open(t.TempDir())
	src := image(t, map[string][]byte{"disk.tar": randBytes(4 << 10)})
	ref, _, err := a.Push(ctx, r.ref("sbx/tr:1"), src, Manifest{Name: "x"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	m, _, _ := Fetch(ctx, ref)
	// the source image's file, written after the push: the store's too
	if err := os.Truncate(filepath.Join(src, "disk.tar"), 100); err != nil {
		t.Fatal(err)
	}
	dst := filepath.Join(t.TempDir(), "im")
	if _, err := a.Pull(ctx, ref, m, dst); err != nil {
		return
	}
	if fi, err := os.Stat(filepath.Join(dst, "disk.tar")); err != nil || fi.Size() != m.Files[0].Size {
		t.Errorf("the pulled disk.tar has %d bytes, the manifest says %d", fi.Size(), m.Files[0].Size)
	}
}

// TestAttackXferConcurrentSameDir: pulls into one dir at once share the
// temp dir dir.pull; one's RemoveAll takes another's half-made image, and
// a pull may rename someone else's partial dir into place and succeed.
func TestAttackXferConcurrentSameDir(t *testing.T) {
	r := newReg(t)
	files := map[string][]byte{}
	for i := 0; i < 300; i++ {
		files[fmt.Sprintf("f/%03d", i)] = []byte(fmt.Sprint(i))
	}
	ref, m := pushed(t, r, "sbx/c:1", files)
	b, _ := Open(t.TempDir())
	// fill the store first: the race is in assembling
	if _, err := b.Pull(context.Background(), ref, m, filepath.Join(t.TempDir(), "warm")); err != nil {
		t.Fatal(err)
	}
	for round := 0; round < 20; round++ {
		dst := filepath.Join(t.TempDir(), "im")
		var wg sync.WaitGroup
		errs := make([]error, 6)
		for i := range errs {
			wg.Add(1)
			go func() { defer wg.Done(); _, errs[i] = b.Pull(context.Background(), ref, m, dst) }()
		}
		wg.Wait()
		ok := 0
		for _, err := range errs {
			if err == nil {
				ok++
			}
		}
		ents, _ := os.ReadDir(filepath.Join(dst, "f"))
		if ok > 0 && len(ents) != len(files) {
			t.Fatalf("round %d: %d pulls succeeded, the image holds %d of %d files", round, ok, len(ents), len(files))
		}
		if ok > 1 {
			t.Fatalf("round %d: %d pulls into one dir succeeded", round, ok)
		}
	}
}

// TestAttackXferDigestMismatch: a registry answering a pull by digest
// with another manifest is refused.
func TestAttackXferDigestMismatch(t *testing.T) {
	r := newReg(t)
	ref, _ := pushed(t, r, "sbx/d:1", map[string][]byte{"disk.tar": []byte("d")})
	r.mu.Lock()
	r.tamper = func(p string, body []byte) []byte {
		if strings.Contains(p, "/manifests/") {
			return bytes.Replace(body, []byte(`"schemaVersion":2`), []byte(`"schemaVersion":2 `), 1)
		}
		return body
	}
	r.mu.Unlock()
	if _, _, err := Fetch(context.Background(), ref); err == nil {
		t.Error("a manifest of another digest than the one asked for was taken")
	}
}

// TestAttackXferHang: a registry that stops sending mid-blob holds a pull
// only as long as its context.
func TestAttackXferHang(t *testing.T) {
	r := newReg(t)
	ref, m := pushed(t, r, "sbx/h:1", map[string][]byte{"disk.tar": randBytes(64 << 10)})
	hex := strings.TrimPrefix(m.Files[0].Digest, "sha256:")
	hang := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		if strings.Contains(req.URL.Path, hex) && req.Method == http.MethodGet {
			w.Header().Set("Content-Length", fmt.Sprint(m.Files[0].Size))
			w.WriteHeader(200)
			w.Write(make([]byte, 1000))
			w.(http.Flusher).Flush()
			<-req.Context().Done()
			return
		}
		http.Redirect(w, req, r.URL+req.URL.Path, http.StatusTemporaryRedirect)
	}))
	defer hang.Close()
	ref = strings.Replace(ref, strings.TrimPrefix(r.URL, "http://"), strings.TrimPrefix(hang.URL, "http://"), 1)
	b, _ := Open(t.TempDir())
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	done := make(chan error, 1)
	go func() { _, err := b.Pull(ctx, ref, m, filepath.Join(t.TempDir(), "im")); done <- err }()
	select {
	case err := <-done:
		if err == nil {
			t.Error("a pull of a blob that never came succeeded")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("a pull outlived its context by 8 s")
	}
	if ents, _ := os.ReadDir(filepath.Join(b.dir, "sha256")); len(ents) != 0 {
		t.Errorf("the hung pull left %d entries in the store", len(ents))
	}
}

// TestAttackXferPullNewParent: a pull into a dir whose parent is not made
// yet still works (the temp dir is made beside it).
func TestAttackXferPullNewParent(t *testing.T) {
	r := newReg(t)
	ref, m := pushed(t, r, "sbx/np:1", map[string][]byte{"disk.tar": []byte("d")})
	b, _ := Open(t.TempDir())
	if _, err := b.Pull(context.Background(), ref, m, filepath.Join(t.TempDir(), "a", "b", "im")); err != nil {
		t.Fatal(err)
	}
}

// TestAttackXferPushSpecial: a symlink or a fifo in the pushed directory is
// refused, not followed or read.
func TestAttackXferPushSpecial(t *testing.T) {
	r := newReg(t)
	a, _ := Open(t.TempDir())
	for _, mk := range []func(dir string) error{
		func(dir string) error { return os.Symlink("/etc/passwd", filepath.Join(dir, "disk.tar")) },
		func(dir string) error { return os.Symlink("/etc", filepath.Join(dir, "memory")) },
		func(dir string) error { return syscall.Mkfifo(filepath.Join(dir, "disk.tar"), 0o600) },
	} {
		dir := t.TempDir()
		if err := mk(dir); err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		if _, _, err := a.Push(ctx, r.ref("sbx/sp:1"), dir, Manifest{Name: "x"}, nil); err == nil {
			t.Errorf("a push of %s succeeded", dir)
		}
		cancel()
	}
}

// TestAttackXferOddPaths: paths check lets through are linked inside the
// image or refused, never outside it.
func TestAttackXferOddPaths(t *testing.T) {
	r := newReg(t)
	ref, m := pushed(t, r, "sbx/op:1", map[string][]byte{"disk.tar": []byte("d")})
	b, _ := Open(t.TempDir())
	h, _ := v1.NewHash(m.Files[0].Digest)
	layers := []v1.Descriptor{{MediaType: FileMediaType, Digest: h, Size: m.Files[0].Size}}
	for _, p := range []string{"a\x00/../../x", "x/", "./x", "a/./b", strings.Repeat("a", 300), "…/..", "..a", "a..", "\u202e.."} {
		bad := Manifest{Schema: Schema, Files: []File{{Path: p, Size: m.Files[0].Size, Digest: m.Files[0].Digest}}}
		if bad.check(layers) != nil {
			continue
		}
		root := t.TempDir()
		dst := filepath.Join(root, "in", "im")
		b.Pull(context.Background(), ref, bad, dst)
		filepath.WalkDir(root, func(q string, d os.DirEntry, err error) error {
			if err == nil && !d.IsDir() && !strings.HasPrefix(q, dst+string(filepath.Separator)) {
				t.Errorf("path %q put %s outside the image", p, q)
			}
			return nil
		})
	}
}
