package e2e

import (
	"archive/tar"
	"context"
	"crypto/sha256"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"

	"sbx.dev/sbx/client/image"
)

// dirLayer writes a tar of dir (owners, modes, symlinks, hard links) into
// the layout's blobs as an uncompressed layer.
func dirLayer(t *testing.T, blobs, dir string) *bigLayer {
	t.Helper()
	tmp, err := os.CreateTemp(blobs, "layer-")
	if err != nil {
		t.Fatal(err)
	}
	h := sha256.New()
	tw := tar.NewWriter(io.MultiWriter(tmp, h))
	type inode struct{ dev, ino uint64 }
	seen := map[inode]string{}
	err = filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || p == dir {
			return err
		}
		fi, err := d.Info()
		if err != nil || fi.Mode()&fs.ModeSocket != 0 {
			return err
		}
		link := ""
		if fi.Mode()&fs.ModeSymlink != 0 {
			link, _ = os.Readlink(p)
		}
		hdr, err := tar.FileInfoHeader(fi, link)
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		hdr.Name, hdr.Uname, hdr.Gname = rel, "", ""
		if d.IsDir() {
			hdr.Name += "/"
		}
		st := fi.Sys().(*syscall.Stat_t)
		if fi.Mode().IsRegular() && st.Nlink > 1 {
			k := inode{uint64(st.Dev), st.Ino}
			if first, ok := seen[k]; ok {
				hdr.Typeflag, hdr.Linkname, hdr.Size = tar.TypeLink, first, 0
			} else {
				seen[k] = rel
			}
		}
		if err := tw.WriteHeader(hdr); err != nil {
			return err
		}
		if hdr.Typeflag == tar.TypeReg {
			f, err := os.Open(p)
			if err != nil {
				return err
			}
			defer f.Close()
			_, err = io.Copy(tw, f)
			return err
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	fi, _ := tmp.Stat()
	tmp.Close()
	d := v1.Hash{Algorithm: "sha256", Hex: fmt.Sprintf("%x", h.Sum(nil))}
	p := filepath.Join(blobs, d.Hex)
	if err := os.Rename(tmp.Name(), p); err != nil {
		t.Fatal(err)
	}
	return &bigLayer{path: p, digest: d, size: fi.Size()}
}

// TestImageFlakyHunt: the flaky example, hunted and measured in a template
// imported from an image (a CI image: Debian with python3 and curl, made of
// base's files), as the README tells it.
func TestImageFlakyHunt(t *testing.T) {
	if testing.Short() {
		t.Skip("hunts in an imported image")
	}
	d := privateDaemon(t)
	ctx := context.Background()
	dir := filepath.Join(t.TempDir(), "ci-image")
	p, err := layout.Write(dir, empty.Index)
	if err != nil {
		t.Fatal(err)
	}
	blobs := filepath.Join(dir, "blobs", "sha256")
	os.MkdirAll(blobs, 0o755)
	img := imageOf(t, v1.Config{Env: []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}, WorkingDir: "/"},
		dirLayer(t, blobs, templateRootfs(t, shared, "base")))
	if err := p.AppendImage(img); err != nil {
		t.Fatal(err)
	}
	var pl progressLog
	tm, err := image.Import(ctx, d.client, "ci", dir, image.WithProgress(pl.add))
	if err != nil {
		t.Fatalf("import: %v\n%s", err, &pl)
	}
	t.Logf("imported the CI image: %d MB, version %s", tm.Size>>20, tm.Version[:19])

	// hunt the failure in it
	ex := copyExample(t)
	name := "img-hunt-" + randHex(3)
	huntCleanup(t, d, name)
	r := d.sbxDir(t, ex, "--json", "hunt", "--template", "ci", "--runs", "20", "--name", name, "--", "./test.sh")
	_, s := huntEvents(t, r)
	if !s.Failed || !s.Stopped {
		t.Fatalf("hunt in the imported image: %+v, want a captured failure", s)
	}
	t.Logf("hunt: run %d failed with seed %s, captured in %d ms", s.Run, s.Seed, s.CaptureMs)

	// then its flake rate, from a ready sandbox of the same template
	id := d.newSandbox(t, "--template", "ci")
	d.must(t, "scp", "-r", ex+"/.", id+":/work")
	out := d.must(t, "--json", "flake-rate", id, "-n", "8", "--parallel", "4", "--", "sh", "-c", "cd /work && ./test.sh")
	f := parseFlakeRate(t, out)
	if len(f.runs) != 8 || f.summary.Runs != 8 {
		t.Errorf("flake-rate: %d run lines, summary of %d runs; want 8", len(f.runs), f.summary.Runs)
	}
	if f.summary.Failures == 0 {
		t.Errorf("flake-rate in the imported image saw no failure in 8 runs: %+v", f.summary)
	}
	t.Logf("flake-rate: %d/8 failed", f.summary.Failures)
}
