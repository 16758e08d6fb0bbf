package client

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"errors"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/random"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"sbx.dev/sbx/api"
)

func writeTarOf(t *testing.T, dst, dir string, gz bool) {
	t.Helper()
	f, err := os.Create(dst)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var w io.Writer = f
	var zw *gzip.Writer
	if gz {
		zw = gzip.NewWriter(f)
		w = zw
	}
	if err := writeTar(w, dir); err != nil {
		t.Fatal(err)
	}
	if zw != nil {
		zw.Close()
	}
}

// TestOpenSource: each form of IMAGE is recognised as what it is.
func TestOpenSource(t *testing.T) {
	tmp := t.TempDir()
	img, err := random.Image(1024, 2)
	if err != nil {
		t.Fatal(err)
	}
	cf, _ := img.ConfigFile()
	cf = cf.DeepCopy()
	cf.OS = "linux"
	img, _ = mutate.ConfigFile(img, cf)
	ociDir := filepath.Join(tmp, "oci")
	p, err := layout.Write(ociDir, empty.Index)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.AppendImage(img); err != nil {
		t.Fatal(err)
	}
	ociTar := filepath.Join(tmp, "oci.tar")
	writeTarOf(t, ociTar, ociDir, false)
	tag, _ := name.NewTag("example.test/x:1")
	docker := filepath.Join(tmp, "docker.tar")
	if err := tarball.WriteToFile(docker, tag, img); err != nil {
		t.Fatal(err)
	}
	dockerGz := filepath.Join(tmp, "docker.tar.gz")
	{
		var b bytes.Buffer
		zw := gzip.NewWriter(&b)
		raw, _ := os.ReadFile(docker)
		zw.Write(raw)
		zw.Close()
		os.WriteFile(dockerGz, b.Bytes(), 0o644)
	}
	rootfs := filepath.Join(tmp, "rootfs")
	os.MkdirAll(filepath.Join(rootfs, "etc"), 0o755)
	os.WriteFile(filepath.Join(rootfs, "etc", "manifest.json"), []byte("{}"), 0o644) // not at the top: still a rootfs
	rootTar := filepath.Join(tmp, "rootfs.tar")
	writeTarOf(t, rootTar, rootfs, false)
	rootTgz := filepath.Join(tmp, "rootfs.tgz")
	writeTarOf(t, rootTgz, rootfs, true)
	dockerBytes, _ := os.ReadFile(docker)

	tests := []struct {
		name, src string
		stdin     []byte
		kind      string
	}{
		{"oci layout", ociDir, nil, SourceOCILayout},
		{"oci layout, explicit", "oci:" + ociDir, nil, SourceOCILayout},
		{"oci archive", ociTar, nil, SourceOCIArchive},
		{"oci archive, explicit", "oci-archive:" + ociTar, nil, SourceOCIArchive},
		{"docker archive", docker, nil, SourceDocker},
		{"docker archive, explicit with tag", "docker-archive:" + docker + ":example.test/x:1", nil, SourceDocker},
		{"gzipped docker archive", dockerGz, nil, SourceDocker},
		{"docker archive on stdin", "-", dockerBytes, SourceDocker},
		{"rootfs directory", rootfs, nil, SourceRootfsDir},
		{"rootfs tar", rootTar, nil, SourceRootfsTar},
		{"rootfs tar.gz", rootTgz, nil, SourceRootfsTar},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			src, err := openSource(context.Background(), tc.src, templateOptions{stdin: bytes.NewReader(tc.stdin)}, func(api.Progress) {})
			if err != nil {
				t.Fatalf("openSource(%q): %v", tc.src, err)
			}
			defer src.close()
			if src.kind != tc.kind {
				t.Fatalf("openSource(%q) = %s, want %s", tc.src, src.kind, tc.kind)
			}
			if src.img != nil {
				raw, err := src.img.RawConfigFile()
				want, _ := img.RawConfigFile()
				if err != nil || !bytes.Equal(raw, want) {
					t.Errorf("config = %q, %v; want the image's, byte for byte", raw, err)
				}
				ls, err := src.img.Layers()
				if err != nil || len(ls) != 2 {
					t.Errorf("layers: %d, %v", len(ls), err)
				}
			}
		})
	}
	// a spooled stdin leaves no temporary file
	before, _ := filepath.Glob(filepath.Join(os.TempDir(), "sbx-import-*"))
	src, err := openSource(context.Background(), "-", templateOptions{stdin: bytes.NewReader(dockerBytes)}, func(api.Progress) {})
	if err != nil {
		t.Fatal(err)
	}
	src.close()
	if after, _ := filepath.Glob(filepath.Join(os.TempDir(), "sbx-import-*")); len(after) != len(before) {
		t.Errorf("temporary files %q after close, want %q", after, before)
	}

	for _, bad := range []struct{ src, says string }{
		{"./missing.tar", "no such file"},
		{"/nonexistent/dir", "no such file"},
		{"Not A Ref!", "neither a file"},
		{"", "no image given"},
		{"oci:" + rootfs, "not an OCI image layout"},
		{"docker-archive:" + rootTar, "docker-save"},
	} {
		_, err := openSource(context.Background(), bad.src, templateOptions{}, func(api.Progress) {})
		if !errors.Is(err, api.ErrInvalid) || !strings.Contains(err.Error(), bad.says) {
			t.Errorf("openSource(%q) = %v, want api.ErrInvalid saying %q", bad.src, err, bad.says)
		}
	}
}

// TestWriteTar: a directory's tar keeps hard links as links and attributes.
func TestWriteTar(t *testing.T) {
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "a"), []byte("data"), 0o4755)
	os.Chmod(filepath.Join(dir, "a"), 0o4755|fs.ModeSetuid)
	os.Link(filepath.Join(dir, "a"), filepath.Join(dir, "b"))
	os.Symlink("/etc/passwd", filepath.Join(dir, "c"))
	var buf bytes.Buffer
	if err := writeTar(&buf, dir); err != nil {
		t.Fatal(err)
	}
	tr := tar.NewReader(&buf)
	got := map[string]*tar.Header{}
	for {
		h, err := tr.Next()
		if err != nil {
			break
		}
		got[h.Name] = h
	}
	if h := got["a"]; h == nil || h.Typeflag != tar.TypeReg || h.Mode&0o4000 == 0 {
		t.Errorf("a = %+v, want a setuid file", h)
	}
	if h := got["b"]; h == nil || h.Typeflag != tar.TypeLink || h.Linkname != "a" {
		t.Errorf("b = %+v, want a hard link to a", h)
	}
	if h := got["c"]; h == nil || h.Typeflag != tar.TypeSymlink || h.Linkname != "/etc/passwd" {
		t.Errorf("c = %+v, want a symlink", h)
	}
}
