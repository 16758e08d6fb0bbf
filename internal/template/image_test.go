package template

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"sbx.dev/sbx/api"
)

// testImage builds an image of the layers (tars) with go-containerregistry
// and returns it with its config.
func testImage(t *testing.T, cfg v1.Config, arch string, layers ...[]byte) (v1.Image, []byte) {
	t.Helper()
	var ls []v1.Layer
	for _, b := range layers {
		l, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(b)), nil })
		if err != nil {
			t.Fatal(err)
		}
		ls = append(ls, l)
	}
	img, err := mutate.AppendLayers(empty.Image, ls...)
	if err != nil {
		t.Fatal(err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture, cf.Config = "linux", arch, cfg
	if img, err = mutate.ConfigFile(img, cf); err != nil {
		t.Fatal(err)
	}
	raw, err := img.RawConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	return img, raw
}

// putImage sends the image's layers that the store lacks, then makes the
// template, as the client does.
func putImage(t *testing.T, s *Store, name string, img v1.Image, raw []byte, force bool, progress func(string)) (api.Template, error) {
	t.Helper()
	ctx := context.Background()
	tm, missing, err := s.ImportImage(ctx, name, raw, "test image", force, progress)
	if err != nil || len(missing) == 0 {
		return tm, err
	}
	for _, d := range missing {
		h, _ := v1.NewHash(d)
		l, err := img.LayerByDiffID(h)
		if err != nil {
			t.Fatal(err)
		}
		rc, err := l.Compressed() // gzipped, as a registry sends it
		if err != nil {
			t.Fatal(err)
		}
		_, err = s.PutLayer(ctx, d, rc, progress)
		rc.Close()
		if err != nil {
			return api.Template{}, err
		}
	}
	tm, missing, err = s.ImportImage(ctx, name, raw, "test image", force, progress)
	if err == nil && len(missing) > 0 {
		t.Fatalf("still missing %q after the upload", missing)
	}
	return tm, err
}

func withXattr(h *tar.Header, k, v string) *tar.Header {
	h.PAXRecords = map[string]string{"SCHILY.xattr." + k: v}
	h.Format = tar.FormatPAX
	return h
}

func owned(h *tar.Header, uid, gid int) *tar.Header {
	h.Uid, h.Gid = uid, gid
	return h
}

// TestImageLayers: a multi-layer image is put together as Docker shows it:
// whiteouts, an opaque directory, a symlink chain, a hard link, a setuid
// file, attributes and owners kept; its config becomes the defaults; the
// layers' files are shared, not copied; the same image again is instant.
func TestImageLayers(t *testing.T) {
	host := t.TempDir()
	l1 := tarBytes(t, false, []entry{
		{hdr: dir("etc/", 0o755)},
		{hdr: file("etc/keep", 0o644), body: "old\n"},
		{hdr: file("etc/gone", 0o644), body: "deleted later\n"},
		{hdr: dir("opq/", 0o755)},
		{hdr: file("opq/a", 0o644), body: "a"},
		{hdr: file("opq/b", 0o644), body: "b"},
		{hdr: dir("data/", 0o755)},
		{hdr: file("data/x", 0o644), body: "x"},
		{hdr: dir("bin/", 0o755)},
		{hdr: file("bin/tool", 0o4755), body: "#!/bin/sh\n"},
		{hdr: symlink("bin/l1", "l2")},
		{hdr: symlink("bin/l2", "/bin/l3")},
		{hdr: symlink("bin/l3", "tool")},
		{hdr: hardlink("bin/hard", "bin/tool")},
		{hdr: withXattr(file("bin/capped", 0o755), "user.sbx", "kept")},
		{hdr: dir("home/", 0o755)},
		{hdr: owned(dir("home/user/", 0o750), 1000, 1000)},
		{hdr: owned(file("home/user/.profile", 0o600), 1000, 1000), body: "export A=1\n"},
		{hdr: symlink("was-link", host)}, // replaced by a directory in the next layer
		{hdr: dir("was-dir/", 0o755)},
		{hdr: file("was-dir/inside", 0o644), body: "i"},
	})
	l2 := tarBytes(t, true, []entry{
		{hdr: dir("etc/", 0o700)},
		{hdr: file("etc/.wh.gone", 0o644)},
		{hdr: file("etc/keep", 0o644), body: "new\n"},
		{hdr: dir("opq/", 0o755)},
		{hdr: file("opq/.wh..wh..opq", 0o644)},
		{hdr: file("opq/c", 0o644), body: "c"},
		{hdr: dir("data/", 0o755)},
		{hdr: file("data/y", 0o644), body: "y"},
		{hdr: dir("was-link/", 0o755)},
		{hdr: file("was-link/f", 0o644), body: "in the image"},
		{hdr: file("was-dir", 0o644), body: "a file now"},
		{hdr: file(".wh.nothing-there", 0o644)},
	})
	cfg := v1.Config{
		User: "1000:1000", WorkingDir: "/home/user",
		Env:        []string{"PATH=/usr/local/bin:/usr/bin:/bin", "FOO=bar"},
		Entrypoint: []string{"/bin/tool"}, Cmd: []string{"--help"},
	}
	img, raw := testImage(t, cfg, runtime.GOARCH, l1, l2)
	s, sdir := openStore(t)
	var rec recorder
	tm, err := putImage(t, s, "img", img, raw, false, rec.add)
	if err != nil {
		t.Fatalf("import: %v", err)
	}
	id, _ := img.ConfigName()
	if tm.Version != id.String() || tm.Name != "img" || tm.Source != "test image" {
		t.Errorf("template = %+v, want version %s (the image ID)", tm, id)
	}
	want := api.TemplateDefaults{User: "1000:1000", WorkDir: "/home/user", Env: cfg.Env, Entrypoint: cfg.Entrypoint, Cmd: cfg.Cmd}
	if diff := cmp.Diff(want, tm.Defaults); diff != "" {
		t.Errorf("defaults (-want +got):\n%s", diff)
	}
	rootfs, err := s.Rootfs("img")
	if err != nil {
		t.Fatal(err)
	}
	read := func(p string) string {
		b, err := os.ReadFile(filepath.Join(rootfs, p))
		if err != nil {
			return "error: " + err.Error()
		}
		return string(b)
	}
	for p, want := range map[string]string{
		"etc/keep": "new\n", "opq/c": "c", "data/x": "x", "data/y": "y",
		"was-link/f": "in the image", "was-dir": "a file now", "home/user/.profile": "export A=1\n",
	} {
		if got := read(p); got != want {
			t.Errorf("/%s = %q, want %q", p, got, want)
		}
	}
	for _, p := range []string{"etc/gone", "etc/.wh.gone", "opq/a", "opq/b", "opq/.wh..wh..opq", ".wh.nothing-there", "was-dir/inside"} {
		if _, err := os.Lstat(filepath.Join(rootfs, p)); err == nil {
			t.Errorf("/%s: %v, want it gone", p, err)
		}
	}
	if got := entries(t, filepath.Join(rootfs, "opq")); !slices.Equal(got, []string{"c"}) {
		t.Errorf("opaque /opq holds %q, want just c", got)
	}
	for l, target := range map[string]string{"bin/l1": "l2", "bin/l2": "/bin/l3", "bin/l3": "tool"} {
		if got, err := os.Readlink(filepath.Join(rootfs, l)); err != nil || got != target {
			t.Errorf("readlink /%s = %q, %v; want %q", l, got, err, target)
		}
	}
	tool, _ := os.Stat(filepath.Join(rootfs, "bin/tool"))
	if tool.Mode()&(fs.ModeSetuid|fs.ModePerm) != fs.ModeSetuid|0o755 {
		t.Errorf("/bin/tool mode = %v, want setuid 0755", tool.Mode())
	}
	if hard, err := os.Stat(filepath.Join(rootfs, "bin/hard")); err != nil || !os.SameFile(tool, hard) {
		t.Errorf("/bin/hard is not /bin/tool: %v", err)
	}
	if v, err := getXattr(filepath.Join(rootfs, "bin/capped"), "user.sbx"); err != nil || string(v) != "kept" {
		t.Errorf("user.sbx of /bin/capped = %q, %v; want kept", v, err)
	}
	for p, want := range map[string][3]uint32{"home/user": {1000, 1000, 0o750}, "home/user/.profile": {1000, 1000, 0o600}, "etc": {0, 0, 0o700}} {
		fi, err := os.Lstat(filepath.Join(rootfs, p))
		if err != nil {
			t.Errorf("/%s: %v", p, err)
			continue
		}
		st := fi.Sys().(*syscall.Stat_t)
		if got := [3]uint32{st.Uid, st.Gid, st.Mode & 0o7777}; got != want {
			t.Errorf("/%s uid, gid, mode = %o, want %o", p, got, want)
		}
	}
	if fi, err := os.Lstat(filepath.Join(rootfs, "was-link")); err != nil || !fi.IsDir() {
		t.Errorf("/was-link: %v, want the directory of the upper layer", err)
	}
	if es, _ := os.ReadDir(host); len(es) != 0 {
		t.Errorf("the host directory a symlink pointed at holds %d entries", len(es))
	}
	checkSkeleton(t, rootfs)

	// the layer's file and the rootfs's are one inode: stored once
	l1id, _ := img.Layers()
	d1, _ := l1id[0].DiffID()
	inLayer, err := os.Stat(filepath.Join(sdir, "layers", digestDir(d1.String()), "bin/tool"))
	if err != nil || !os.SameFile(inLayer, tool) {
		t.Errorf("/bin/tool is not the layer's file: %v", err)
	}

	// the same image again: no layer is asked for, and it says so
	start := time.Now()
	_, missing, err := s.ImportImage(context.Background(), "img2", raw, "again", false, rec.add)
	if err != nil || len(missing) != 0 {
		t.Fatalf("second import = %q, %v", missing, err)
	}
	if d := time.Since(start); d > time.Second {
		t.Errorf("second import took %v", d)
	}
	if !rec.has("already") {
		t.Errorf("second import progress %q, want it to say the image is there already", rec.msgs)
	}
	if tm2, _ := s.Resolve("img2"); tm2.Version != tm.Version {
		t.Errorf("img2 = %s, want %s", tm2.Version, tm.Version)
	}
	// and under its own name without --force: it points there already
	if _, missing, err := s.ImportImage(context.Background(), "img", raw, "again", false, nil); err != nil || len(missing) > 0 {
		t.Errorf("re-import under the same name = %q, %v", missing, err)
	}

	// an image sharing the first layer asks only for its own
	_, raw3 := testImage(t, v1.Config{}, runtime.GOARCH, l1, tarBytes(t, false, []entry{{hdr: file("third", 0o644), body: "3"}}))
	_, missing, err = s.ImportImage(context.Background(), "img3", raw3, "", false, nil)
	if err != nil || len(missing) != 1 || missing[0] == d1.String() {
		t.Errorf("image sharing a layer: missing %q, %v; want only its second layer", missing, err)
	}

	// layers go only once no version links to them (and their grace is over)
	saved := layerGrace
	layerGrace = 0
	t.Cleanup(func() { layerGrace = saved })
	for _, n := range []string{"img", "img2"} {
		if _, err := s.Remove(n); err != nil {
			t.Fatal(err)
		}
	}
	if removed, err := s.Collect(nil); err != nil || len(removed) != 1 {
		t.Errorf("Collect = %q, %v; want the image's version", removed, err)
	}
	if got := entries(t, filepath.Join(sdir, "layers")); len(got) != 0 {
		t.Errorf("layers after Collect: %q, want none", got)
	}
	noWork(t, sdir)
}

// TestImageHostile: layers that try to write outside the template, or
// smuggle devices in, are refused or neutralized; the host is untouched.
func TestImageHostile(t *testing.T) {
	host := t.TempDir()
	tests := []struct {
		name   string
		layers [][]byte
		says   string // "" if the import succeeds, neutralized
		check  func(t *testing.T, rootfs string)
	}{
		{name: "dotdot", layers: [][]byte{tarBytes(t, false, []entry{{hdr: file("../../evil", 0o644), body: "x"}})}, says: `entry "../../evil"`},
		{name: "dotdot in a hard link", layers: [][]byte{tarBytes(t, false, []entry{{hdr: hardlink("pw", "../../../etc/passwd")}})}, says: "must not contain"},
		{name: "hard link to the host", layers: [][]byte{tarBytes(t, false, []entry{{hdr: hardlink("pw", "/etc/passwd")}})}, says: "not in the archive"},
		{name: "write through an absolute symlink", layers: [][]byte{tarBytes(t, false, []entry{{hdr: symlink("out", host)}, {hdr: file("out/pwned", 0o644), body: "x"}})}, says: "symbolic link"},
		{
			name: "write through a lower layer's symlink",
			layers: [][]byte{
				tarBytes(t, false, []entry{{hdr: symlink("out", host)}, {hdr: symlink("etc", "/etc")}}),
				tarBytes(t, false, []entry{{hdr: file("out/pwned", 0o644), body: "x"}, {hdr: file("etc/.wh.passwd", 0o644)}}),
			},
			check: func(t *testing.T, rootfs string) {
				if fi, err := os.Lstat(filepath.Join(rootfs, "out")); err != nil || !fi.IsDir() {
					t.Errorf("/out: %v; want the upper layer's directory in place of the symlink", err)
				}
			},
		},
		{
			name: "mount points that are not directories",
			layers: [][]byte{tarBytes(t, false, []entry{
				{hdr: file(".sbx", 0o755), body: "#!/bin/sh\n"},
				{hdr: symlink("proc", "/")},
				{hdr: symlink("dev", host)},
			})},
			check: func(t *testing.T, rootfs string) {
				for _, p := range []string{".sbx", "proc", "dev"} {
					if fi, err := os.Lstat(filepath.Join(rootfs, p)); err != nil || !fi.IsDir() {
						t.Errorf("/%s: %v; want a directory for the runtime to mount on", p, err)
					}
				}
			},
		},
		{
			name: "devices and a whiteout of the parent",
			layers: [][]byte{
				tarBytes(t, false, []entry{
					{hdr: &tar.Header{Typeflag: tar.TypeBlock, Name: "dev/sda", Mode: 0o666, Devmajor: 8}},
					{hdr: &tar.Header{Typeflag: tar.TypeChar, Name: "mem", Mode: 0o666, Devmajor: 1, Devminor: 1}},
					{hdr: file("keep", 0o644), body: "k"},
				}),
				tarBytes(t, false, []entry{{hdr: file(".wh.", 0o644)}, {hdr: file("sub/.wh..", 0o644)}, {hdr: file(".wh..wh.plnk", 0o644)}}),
			},
			check: func(t *testing.T, rootfs string) {
				for _, p := range []string{"dev/sda", "mem"} {
					if _, err := os.Lstat(filepath.Join(rootfs, p)); !errors.Is(err, fs.ErrNotExist) {
						t.Errorf("/%s: %v, want no device", p, err)
					}
				}
				if _, err := os.Stat(filepath.Join(rootfs, "keep")); err != nil {
					t.Errorf("/keep: %v; a whiteout of nothing removed it", err)
				}
			},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			img, raw := testImage(t, v1.Config{}, runtime.GOARCH, tc.layers...)
			s, sdir := openStore(t)
			tm, err := putImage(t, s, "bad", img, raw, false, nil)
			if tc.says != "" {
				if !errors.Is(err, api.ErrInvalid) || !strings.Contains(err.Error(), tc.says) {
					t.Fatalf("import = %v, want api.ErrInvalid saying %s", err, tc.says)
				}
				noLeftovers(t, sdir)
			} else {
				if err != nil {
					t.Fatalf("import = %v, want it neutralized", err)
				}
				rootfs, _ := s.VersionRootfs(tm.Version)
				tc.check(t, rootfs)
			}
			if es, _ := os.ReadDir(host); len(es) != 0 {
				t.Errorf("the host directory holds %d entries", len(es))
			}
			if _, err := os.Stat("/etc/passwd"); err != nil {
				t.Errorf("host /etc/passwd: %v", err)
			}
			if _, err := os.Lstat(filepath.Join(filepath.Dir(sdir), "evil")); !errors.Is(err, fs.ErrNotExist) {
				t.Errorf("a file was written beside the store: %v", err)
			}
		})
	}
}

// TestImageErrors: bad configs and damaged layers get clear errors.
func TestImageErrors(t *testing.T) {
	s, sdir := openStore(t)
	ctx := context.Background()
	layer := tarBytes(t, false, []entry{{hdr: file("f", 0o644), body: "f"}})
	_, arm := testImage(t, v1.Config{}, "s390x", layer)
	img, raw := testImage(t, v1.Config{}, runtime.GOARCH, layer)
	ls, _ := img.Layers()
	diff, _ := ls[0].DiffID()
	other := "sha256:" + strings.Repeat("a", 64)
	tests := []struct {
		name string
		op   func() error
		kind error
		says string
	}{
		{"other arch", func() error { _, _, err := s.ImportImage(ctx, "x", arm, "", false, nil); return err }, api.ErrInvalid, "s390x"},
		{"not json", func() error { _, _, err := s.ImportImage(ctx, "x", []byte("nope"), "", false, nil); return err }, api.ErrInvalid, "config"},
		{"empty config", func() error { _, _, err := s.ImportImage(ctx, "x", nil, "", false, nil); return err }, api.ErrInvalid, "empty"},
		{"no layers", func() error {
			_, _, err := s.ImportImage(ctx, "x", []byte(`{"os":"linux","rootfs":{"type":"layers"}}`), "", false, nil)
			return err
		}, api.ErrInvalid, "no layers"},
		{"bad name", func() error { _, _, err := s.ImportImage(ctx, "X", raw, "", false, nil); return err }, api.ErrInvalid, "invalid template name"},
		{"bad layer digest", func() error { _, err := s.PutLayer(ctx, "sha256:../x", bytes.NewReader(layer), nil); return err }, api.ErrInvalid, "invalid layer digest"},
		{"damaged layer", func() error { _, err := s.PutLayer(ctx, other, bytes.NewReader(layer), nil); return err }, api.ErrInvalid, "damaged"},
		{"truncated layer", func() error { _, err := s.PutLayer(ctx, diff.String(), bytes.NewReader(layer[:700]), nil); return err }, api.ErrInvalid, ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.op()
			if !errors.Is(err, tc.kind) || !strings.Contains(err.Error(), tc.says) {
				t.Fatalf("got %v, want %v saying %q", err, tc.kind, tc.says)
			}
		})
	}
	if got := entries(t, filepath.Join(sdir, "layers")); len(got) != 0 {
		t.Errorf("layers after failed uploads: %q", got)
	}
	noLeftovers(t, sdir)
	// a name pointing elsewhere is not moved without force
	if _, err := s.Import(ctx, "taken", tarOf(t, false, []entry{{hdr: file("g", 0o644), body: "g"}}), false, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := putImage(t, s, "taken", img, raw, false, nil); !errors.Is(err, api.ErrConflict) {
		t.Errorf("image over another name = %v, want api.ErrConflict", err)
	}
	if tm, err := putImage(t, s, "taken", img, raw, true, nil); err != nil || tm.Version != mustConfigName(t, img) {
		t.Errorf("forced image over a name = %+v, %v", tm, err)
	}
}

func mustConfigName(t *testing.T, img v1.Image) string {
	h, err := img.ConfigName()
	if err != nil {
		t.Fatal(err)
	}
	return h.String()
}
