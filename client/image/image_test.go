package image

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"net/http/httptest"
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
	"sbx.dev/sbx/client"
)

// writeTarOf writes a tar of dir's contents (directories and regular
// files) to dst, gzipped if gz.
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
	tw := tar.NewWriter(w)
	err = filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || p == dir {
			return err
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		h, err := tar.FileInfoHeader(fi, "")
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		h.Name = filepath.ToSlash(rel)
		if d.IsDir() {
			h.Name += "/"
		}
		if err := tw.WriteHeader(h); err != nil {
			return err
		}
		if !fi.Mode().IsRegular() {
			return nil
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		_, err = tw.Write(b)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	if zw != nil {
		zw.Close()
	}
}

// TestOpen: each form of IMAGE is recognised as what it is.
func TestOpen(t *testing.T) {
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
	ociTgz := filepath.Join(tmp, "oci.tar.gz")
	writeTarOf(t, ociTgz, ociDir, true)
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
	// Docker 25's docker save: an OCI layout with a manifest.json beside it
	both := filepath.Join(tmp, "both")
	os.CopyFS(both, os.DirFS(ociDir))
	os.WriteFile(filepath.Join(both, "manifest.json"), []byte("[]"), 0o644)
	bothTar := filepath.Join(tmp, "both.tar")
	writeTarOf(t, bothTar, both, false)
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
		{"oci layout", ociDir, nil, OCILayout},
		{"oci layout, explicit", "oci:" + ociDir, nil, OCILayout},
		{"oci archive", ociTar, nil, OCIArchive},
		{"oci archive, explicit", "oci-archive:" + ociTar, nil, OCIArchive},
		{"gzipped oci archive", ociTgz, nil, OCIArchive},
		{"gzipped oci archive, explicit", "oci-archive:" + ociTgz, nil, OCIArchive},
		{"oci archive with a manifest.json", bothTar, nil, OCIArchive},
		{"docker archive", docker, nil, DockerArchive},
		{"docker archive, explicit with tag", "docker-archive:" + docker + ":example.test/x:1", nil, DockerArchive},
		{"gzipped docker archive", dockerGz, nil, DockerArchive},
		{"docker archive on stdin", "-", dockerBytes, DockerArchive},
		{"rootfs directory", rootfs, nil, RootfsDir},
		{"rootfs tar", rootTar, nil, RootfsTar},
		{"rootfs tar.gz", rootTgz, nil, RootfsTar},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			src, err := open(context.Background(), tc.src, optionsOf([]Option{WithStdin(bytes.NewReader(tc.stdin))}))
			if err != nil {
				t.Fatalf("open(%q): %v", tc.src, err)
			}
			defer src.close()
			if src.kind != tc.kind {
				t.Fatalf("open(%q) = %s, want %s", tc.src, src.kind, tc.kind)
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
				for i, l := range ls {
					rc, err := l.Compressed()
					if err != nil {
						t.Fatalf("layer %d: %v", i, err)
					}
					n, err := io.Copy(io.Discard, rc)
					rc.Close()
					if size, _ := l.Size(); err != nil || n != size {
						t.Errorf("layer %d: read %d bytes, %v; want %d", i, n, err, size)
					}
				}
			}
		})
	}
	// a spooled stdin, an unpacked archive leave no temporary file
	for _, tc := range []struct {
		src   string
		stdin []byte
	}{{"-", dockerBytes}, {ociTar, nil}, {ociTgz, nil}, {dockerGz, nil}} {
		before, _ := filepath.Glob(filepath.Join(os.TempDir(), "sbx-import-*"))
		src, err := open(context.Background(), tc.src, optionsOf([]Option{WithStdin(bytes.NewReader(tc.stdin))}))
		if err != nil {
			t.Fatal(err)
		}
		src.close()
		if after, _ := filepath.Glob(filepath.Join(os.TempDir(), "sbx-import-*")); len(after) != len(before) {
			t.Errorf("%s: temporary files %q after close, want %q", tc.src, after, before)
		}
	}

	for _, bad := range []struct{ src, says string }{
		{"./missing.tar", "no such file"},
		{"/nonexistent/dir", "no such file"},
		{"Not A Ref!", "neither a file"},
		{"", "no image given"},
		{"oci:" + rootfs, "not an OCI image layout"},
		{"docker-archive:" + rootTar, "docker-save"},
		{"oci-archive:" + rootTar, "index.json"},
	} {
		_, err := open(context.Background(), bad.src, options{progress: func(api.Progress) {}})
		if !errors.Is(err, api.ErrInvalid) || !strings.Contains(err.Error(), bad.says) {
			t.Errorf("open(%q) = %v, want api.ErrInvalid saying %q", bad.src, err, bad.says)
		}
	}
}

// TestOpenBounds: what is read whole of an image (index.json, a manifest,
// a config) is refused past 4 MiB, before it is read.
func TestOpenBounds(t *testing.T) {
	img, err := random.Image(1024, 1)
	if err != nil {
		t.Fatal(err)
	}
	cf, _ := img.ConfigFile()
	cf = cf.DeepCopy()
	cf.OS = "linux"
	cf.Config.Env = []string{"BIG=" + strings.Repeat("x", maxMeta)}
	big, _ := mutate.ConfigFile(img, cf)
	dir := filepath.Join(t.TempDir(), "oci")
	p, err := layout.Write(dir, empty.Index)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.AppendImage(big); err != nil {
		t.Fatal(err)
	}
	_, err = open(context.Background(), dir, optionsOf(nil))
	if !errors.Is(err, api.ErrInvalid) || !strings.Contains(err.Error(), "config") || !strings.Contains(err.Error(), fmt.Sprint(maxMeta)) {
		t.Errorf("a %d MiB config: %v, want api.ErrInvalid saying it is larger than %d bytes", len(cf.Config.Env[0])>>20, err, maxMeta)
	}
	idx := filepath.Join(dir, "index.json")
	raw, _ := os.ReadFile(idx)
	os.WriteFile(idx, append(raw, bytes.Repeat([]byte(" "), maxMeta)...), 0o644)
	_, err = open(context.Background(), dir, optionsOf(nil))
	if !errors.Is(err, api.ErrInvalid) || !strings.Contains(err.Error(), "index.json is larger than") {
		t.Errorf("a 4 MiB index.json: %v, want api.ErrInvalid saying it is larger", err)
	}
}

// TestImportStreams: a rootfs tar on standard input reaches sbxd as it is,
// chunked.
func TestImportStreams(t *testing.T) {
	var te []string
	var body []byte
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		te = r.TransferEncoding
		body, _ = io.ReadAll(r.Body)
		w.Header().Set("Content-Type", "text/event-stream")
		fmt.Fprintf(w, "event: done\ndata: {\"done\":true,\"template\":{\"name\":\"mine\"}}\n\n")
	}))
	t.Cleanup(srv.Close)
	c, err := client.New("tcp://" + strings.TrimPrefix(srv.URL, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	var tb bytes.Buffer
	tw := tar.NewWriter(&tb)
	tw.WriteHeader(&tar.Header{Name: "etc/", Typeflag: tar.TypeDir, Mode: 0o755})
	tw.Close()
	if _, err := Import(context.Background(), c, "mine", "-", WithStdin(bytes.NewReader(tb.Bytes()))); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(body, tb.Bytes()) || len(te) != 1 || te[0] != "chunked" {
		t.Errorf("got body %q transfer-encoding %v", body, te)
	}
}
