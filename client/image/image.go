// Package image makes sbx templates from container images and root
// filesystems: OCI layouts and archives, docker-save archives, registries,
// directories and tars. It reads images with go-containerregistry and
// sends them with the import calls of package client, which links none of
// it.
package image

import (
	"archive/tar"
	"compress/gzip"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"sbx.dev/sbx/api"
	"sbx.dev/sbx/client"
)

// What Import found a source to be.
const (
	RootfsDir     = "rootfs directory"
	RootfsTar     = "rootfs tar"
	OCILayout     = "OCI layout"
	OCIArchive    = "OCI archive"
	DockerArchive = "docker-save archive"
	Registry      = "registry"
)

// Option configures Import.
type Option func(*options)

type options struct {
	force    bool
	stdin    io.Reader
	platform string
	progress func(api.Progress)
}

// WithForce points an existing name at the new version (sandboxes made on
// the old one keep it).
func WithForce() Option { return func(o *options) { o.force = true } }

// WithStdin is what the source "-" reads (default os.Stdin): a tar of a
// root filesystem, or an image archive.
func WithStdin(r io.Reader) Option { return func(o *options) { o.stdin = r } }

// WithPlatform picks the platform of a multi-platform image
// ("linux/amd64"); the default is linux and this machine's architecture.
func WithPlatform(p string) Option { return func(o *options) { o.platform = p } }

// WithProgress hands each progress event of the import to fn: sbxd's, and
// the upload's own.
func WithProgress(fn func(api.Progress)) Option { return func(o *options) { o.progress = fn } }

func optionsOf(opts []Option) options {
	var o options
	for _, f := range opts {
		f(&o)
	}
	if o.progress == nil {
		o.progress = func(api.Progress) {}
	}
	return o
}

// templateOptions are the client's options for a step of the import.
func (o options) templateOptions() []client.TemplateOption {
	opts := []client.TemplateOption{client.WithProgress(o.progress)}
	if o.force {
		opts = append(opts, client.WithForce())
	}
	return opts
}

func (o options) platformOf() (*v1.Platform, error) {
	if o.platform == "" {
		return &v1.Platform{OS: "linux", Architecture: runtime.GOARCH}, nil
	}
	p, err := v1.ParsePlatform(o.platform)
	if err != nil {
		return nil, api.Errorf(api.ErrInvalid, "platform %q: %v; want os/arch, as linux/amd64", o.platform, err)
	}
	return p, nil
}

// Import makes template name on c's sbxd from source, which is any of:
//   - "-": standard input (WithStdin; os.Stdin otherwise), spooled to a
//     temporary file, then taken as a file;
//   - a directory: an OCI image layout if it holds an oci-layout file,
//     otherwise a root filesystem;
//   - a file: an OCI archive (a tar of a layout), a `docker save` archive
//     (either one gzipped or not), or else a root filesystem tar;
//   - a registry reference (registry/repo:tag or repo@sha256:...), pulled with
//     the credentials of ~/.docker/config.json (or $DOCKER_CONFIG) and the
//     credential helpers it names;
//   - one of those forms made explicit: oci:DIR[:REF], oci-archive:FILE[:REF],
//     docker-archive:FILE[:TAG], docker://REF.
//
// An image's layers are sent only if sbxd lacks them, so importing an image
// sbxd has is instant; the template's version is then the image ID (the
// digest of its config). Progress events come from sbxd and from the upload
// itself (WithProgress). Errors: api.ErrInvalid for a source that is none of
// these, and sbxd's errors (api.ErrConflict if name exists and WithForce is
// not given).
func Import(ctx context.Context, c *client.Client, name, source string, opts ...Option) (*api.Template, error) {
	o := optionsOf(opts)
	src, err := open(ctx, source, o)
	if err != nil {
		return nil, fmt.Errorf("import template %s: %w", name, err)
	}
	defer src.close()
	var t *api.Template
	switch src.kind {
	case RootfsDir:
		t, err = c.ImportRootfsDir(ctx, name, src.dir, o.templateOptions()...)
	case RootfsTar:
		t, err = c.ImportRootfs(ctx, name, src.rootfs, o.templateOptions()...)
	default:
		if t, err = importImage(ctx, c, name, src, o); err != nil {
			return nil, fmt.Errorf("import template %s from %s: %w", name, src.kind, err)
		}
	}
	if err != nil {
		return nil, fmt.Errorf("import template %s: %w", name, err)
	}
	return t, nil
}

// source is an opened import source.
type source struct {
	kind   string
	desc   string    // what the template's Source says
	dir    string    // for a rootfs directory
	rootfs io.Reader // a rootfs tar stream
	img    v1.Image  // for the image kinds
	close  func()
}

// looksLikePath says whether s is meant as a file, not a registry reference.
var looksLikePath = regexp.MustCompile(`^(\.{0,2}/|~)|\.(tar|tgz|tar\.gz|tar\.zst)$`)

func open(ctx context.Context, src string, o options) (*source, error) {
	if src == "" {
		return nil, api.Errorf(api.ErrInvalid, "no image given: name an OCI layout, an archive, a directory, a registry reference or - for standard input")
	}
	if rest, ok := strings.CutPrefix(src, "docker://"); ok {
		return openRegistry(ctx, rest, o)
	}
	for prefix, kind := range map[string]string{"oci:": OCILayout, "oci-archive:": OCIArchive, "docker-archive:": DockerArchive} {
		if rest, ok := strings.CutPrefix(src, prefix); ok {
			p, ref := splitRef(rest)
			switch kind {
			case OCILayout:
				return openLayoutDir(p, ref, o)
			case OCIArchive:
				return openOCIArchive(p, p, ref, o)
			}
			return openDocker(p, p, ref)
		}
	}
	if src == "-" {
		return openStdin(o)
	}
	fi, err := os.Stat(src)
	switch {
	case err == nil && fi.IsDir():
		if _, err := os.Stat(filepath.Join(src, "oci-layout")); err == nil {
			return openLayoutDir(src, "", o)
		}
		return &source{kind: RootfsDir, dir: src, close: func() {}}, nil
	case err == nil:
		return openFile(src, src, o)
	case !errors.Is(err, os.ErrNotExist) || looksLikePath.MatchString(src):
		return nil, api.Errorf(api.ErrInvalid, "%s: %v", src, err)
	}
	return openRegistry(ctx, src, o)
}

// splitRef splits "path:ref" at the first colon after which what is before
// is a file or a directory (a ref may hold colons: repo:tag).
func splitRef(s string) (p, ref string) {
	if _, err := os.Stat(s); err == nil {
		return s, ""
	}
	for i := 0; i < len(s); i++ {
		if s[i] != ':' {
			continue
		}
		if _, err := os.Stat(s[:i]); err == nil {
			return s[:i], s[i+1:]
		}
	}
	return s, ""
}

// openStdin spools standard input to a temporary file: an archive must be
// read out of order (docker save writes its manifest last).
func openStdin(o options) (*source, error) {
	f, err := os.CreateTemp("", "sbx-import-*.tar")
	if err != nil {
		return nil, err
	}
	cleanup := func() { f.Close(); os.Remove(f.Name()) }
	in := o.stdin
	if in == nil {
		in = os.Stdin
	}
	n, err := io.Copy(f, &countingReader{r: in, every: 64 << 20, report: func(n int64) {
		o.progress(api.Progress{Event: "progress", Message: fmt.Sprintf("reading standard input: %d MB", n>>20)})
	}})
	if err != nil {
		cleanup()
		return nil, fmt.Errorf("read standard input: %w", err)
	}
	if n == 0 {
		cleanup()
		return nil, api.Errorf(api.ErrInvalid, "standard input is empty: pipe an archive in, as `docker save IMAGE | sbx template import NAME -`")
	}
	return withCleanup(openFile(f.Name(), "stdin", o))(cleanup)
}

// withCleanup runs cleanup when the source is closed, or at once if it
// could not be opened.
func withCleanup(s *source, err error) func(cleanup func()) (*source, error) {
	return func(cleanup func()) (*source, error) {
		if err != nil {
			cleanup()
			return nil, err
		}
		inner := s.close
		s.close = func() { inner(); cleanup() }
		return s, nil
	}
}

// openFile tells an image archive from a rootfs tar by its first entry:
// archives start with their blobs, oci-layout, index.json, manifest.json or
// a layer directory named by a digest, a root filesystem never does. A
// gzipped archive is unpacked to a temporary file first. shown is p as the
// user named it.
func openFile(p, shown string, o options) (*source, error) {
	f, err := os.Open(p)
	if err != nil {
		return nil, err
	}
	in, gz, err := maybeGunzip(f, shown)
	if err != nil {
		f.Close()
		return nil, err
	}
	var isImage bool
	if gz {
		first, err := tar.NewReader(in).Next()
		isImage = err == nil && archiveEntry.MatchString(strings.TrimPrefix(first.Name, "./"))
	} else {
		top := topLevel(f, "manifest.json", "oci-layout")
		isImage = top["manifest.json"] || top["oci-layout"]
	}
	f.Close()
	if !isImage {
		// not an image archive: the server reads it as a rootfs tar (or says why not)
		rf, err := os.Open(p)
		if err != nil {
			return nil, err
		}
		return &source{kind: RootfsTar, rootfs: rf, close: func() { rf.Close() }}, nil
	}
	if !gz {
		return openArchive(p, shown, o)
	}
	tmp, err := os.CreateTemp("", "sbx-import-*.tar")
	if err != nil {
		return nil, err
	}
	cleanup := func() { tmp.Close(); os.Remove(tmp.Name()) }
	o.progress(api.Progress{Event: "progress", Message: "decompressing " + shown})
	f, err = os.Open(p)
	if err == nil {
		zr, zerr := gzip.NewReader(f)
		if err = zerr; err == nil {
			_, err = io.Copy(tmp, zr)
		}
		f.Close()
	}
	if err != nil {
		cleanup()
		return nil, api.Errorf(api.ErrInvalid, "decompress %s: %v", shown, err)
	}
	return withCleanup(openArchive(tmp.Name(), shown, o))(cleanup)
}

// archiveEntry matches the first entries of image archives: docker save's
// (a layer directory, or blobs/ since Docker 25), podman's and skopeo's
// (a layer tar or the config named by its digest), go-containerregistry's
// (the config named sha256:<hex>), an OCI archive's.
var archiveEntry = regexp.MustCompile(`^(blobs(/|$)|oci-layout$|index\.json$|manifest\.json$|repositories$|(sha256:)?[0-9a-f]{64}(/|$|\.json$|\.tar(\.gz)?$))`)

// topLevel says which of the names the uncompressed tar f has at its top;
// the reader seeks past contents, so it costs a read per entry.
func topLevel(f *os.File, names ...string) map[string]bool {
	found := map[string]bool{}
	tr := tar.NewReader(f)
	for {
		hdr, err := tr.Next()
		if err != nil {
			return found
		}
		n := path.Clean(strings.TrimPrefix(hdr.Name, "./"))
		for _, want := range names {
			if n == want {
				found[n] = true
			}
		}
	}
}

func maybeGunzip(f *os.File, shown string) (io.Reader, bool, error) {
	var magic [2]byte
	n, _ := io.ReadFull(f, magic[:])
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		return nil, false, err
	}
	if n == 2 && magic[0] == 0x1f && magic[1] == 0x8b {
		zr, err := gzip.NewReader(f)
		if err != nil {
			return nil, false, api.Errorf(api.ErrInvalid, "read gzip %s: %v", shown, err)
		}
		return zr, true, nil
	}
	return f, false, nil
}

// openArchive opens the uncompressed archive p: an OCI archive if it holds
// oci-layout (as Docker 25's do beside their manifest.json), else a
// docker-save archive.
func openArchive(p, shown string, o options) (*source, error) {
	f, err := os.Open(p)
	if err != nil {
		return nil, err
	}
	top := topLevel(f, "oci-layout", "manifest.json")
	f.Close()
	switch {
	case top["oci-layout"]:
		return openOCIArchive(p, shown, "", o)
	case top["manifest.json"]:
		return openDocker(p, shown, "")
	}
	return nil, api.Errorf(api.ErrInvalid, "%s is an archive with neither oci-layout nor manifest.json: not an OCI or docker-save archive", shown)
}

// openDocker opens a docker-save archive with go-containerregistry's
// tarball: the image tagged tag, or the only one.
func openDocker(p, shown, ref string) (*source, error) {
	var tag *name.Tag
	if ref != "" {
		t, err := name.NewTag(ref)
		if err != nil {
			return nil, api.Errorf(api.ErrInvalid, "docker-archive %s: tag %q: %v", shown, ref, err)
		}
		tag = &t
	}
	img, err := tarball.ImageFromPath(p, tag)
	if err != nil {
		return nil, api.Errorf(api.ErrInvalid, "read docker-save archive %s: %v", shown, err)
	}
	desc := "docker-archive:" + shown
	if ref != "" {
		desc += ":" + ref
	}
	return &source{kind: DockerArchive, desc: desc, img: img, close: func() {}}, nil
}

// openRegistry opens an image in a registry; its layers are fetched as
// they are sent.
func openRegistry(ctx context.Context, ref string, o options) (*source, error) {
	r, err := name.ParseReference(ref)
	if err != nil {
		return nil, api.Errorf(api.ErrInvalid, "%s is neither a file, a directory nor an image reference: %v", ref, err)
	}
	plat, err := o.platformOf()
	if err != nil {
		return nil, err
	}
	o.progress(api.Progress{Event: "progress", Message: "fetching the manifest of " + r.Name()})
	img, err := remote.Image(r, remote.WithContext(ctx), remote.WithAuthFromKeychain(authn.DefaultKeychain), remote.WithPlatform(*plat))
	if err != nil {
		return nil, fmt.Errorf("pull %s (is the registry reachable? are you logged in, with `docker login`?): %w", r.Name(), err)
	}
	return &source{kind: Registry, desc: r.Name(), img: img, close: func() {}}, nil
}

// importImage sends the image's config, then the layers sbxd asks for,
// then the config again.
func importImage(ctx context.Context, c *client.Client, tname string, src *source, o options) (*api.Template, error) {
	cfg, err := src.img.RawConfigFile()
	if err != nil {
		return nil, fmt.Errorf("read the image's config: %w", err)
	}
	for range 3 {
		t, missing, err := c.ImportImageConfig(ctx, tname, cfg, src.desc, o.templateOptions()...)
		if err != nil || t != nil {
			return t, err
		}
		for i, d := range missing {
			if err := sendLayer(ctx, c, src, d, fmt.Sprintf("layer %d/%d", i+1, len(missing)), o.progress); err != nil {
				return nil, err
			}
		}
	}
	return nil, errors.New("sbxd still lacks layers after they were sent (is a collection running?); try again")
}

// sendLayer uploads the layer whose diff ID is diffID as it reads it: as
// stored (compressed) when it can, uncompressed from a docker-save archive
// (whose layers are stored so).
func sendLayer(ctx context.Context, c *client.Client, src *source, diffID, what string, progress func(api.Progress)) error {
	h, err := v1.NewHash(diffID)
	if err != nil {
		return fmt.Errorf("sbxd asked for layer %q: %w", diffID, err)
	}
	l, err := src.img.LayerByDiffID(h)
	if err != nil {
		return fmt.Errorf("%s %s: %w", what, diffID, err)
	}
	var rc io.ReadCloser
	total := int64(-1)
	if src.kind == DockerArchive {
		rc, err = l.Uncompressed()
	} else {
		rc, err = l.Compressed()
		if n, serr := l.Size(); serr == nil {
			total = n
		}
	}
	if err != nil {
		return fmt.Errorf("%s %s: %w", what, diffID, err)
	}
	defer rc.Close()
	short := diffID
	if len(short) > 19 {
		short = short[:19]
	}
	start := time.Now()
	body := &countingReader{r: rc, every: 32 << 20, report: func(n int64) {
		msg := fmt.Sprintf("%s %s: %d MB", what, short, n>>20)
		if total > 0 {
			msg = fmt.Sprintf("%s %s: %d of %d MB", what, short, n>>20, total>>20)
		}
		if s := time.Since(start).Seconds(); s > 1 {
			msg += fmt.Sprintf(" (%.0f MB/s)", float64(n>>20)/s)
		}
		progress(api.Progress{Event: "progress", Message: msg})
	}}
	if err := c.UploadLayer(ctx, diffID, body, client.WithProgress(progress)); err != nil {
		return fmt.Errorf("%s %s: %w", what, short, err)
	}
	return nil
}

// countingReader reports every so many bytes read.
type countingReader struct {
	r        io.Reader
	n, every int64
	next     int64
	report   func(n int64)
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += int64(n)
	if c.n >= c.next && c.report != nil {
		c.report(c.n)
		c.next = c.n + c.every
	}
	return n, err
}
