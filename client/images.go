package client

import (
	"archive/tar"
	"compress/gzip"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
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
	"github.com/google/go-containerregistry/pkg/v1/partial"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
	"sbx.dev/sbx/api"
)

// What ImportTemplate found a source to be.
const (
	SourceRootfsDir  = "rootfs directory"
	SourceRootfsTar  = "rootfs tar"
	SourceOCILayout  = "OCI layout"
	SourceOCIArchive = "OCI archive"
	SourceDocker     = "docker-save archive"
	SourceRegistry   = "registry"
)

// ImportTemplate makes template name from source, which is any of:
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
// itself (WithProgress). Errors: api.ErrInvalid for a source that is none of these, and
// sbxd's errors (api.ErrConflict if name exists and WithForce is not given).
func (c *Client) ImportTemplate(ctx context.Context, name, source string, opts ...TemplateOption) (*api.Template, error) {
	o := templateOpts(opts)
	progress := o.progress
	src, err := openSource(ctx, source, o, progress)
	if err != nil {
		return nil, fmt.Errorf("import template %s: %w", name, err)
	}
	defer src.close()
	switch src.kind {
	case SourceRootfsDir, SourceRootfsTar:
		t, err := c.importTar(ctx, name, src.rootfs, o.force, progress)
		if err != nil {
			return nil, fmt.Errorf("import template %s: %w", name, err)
		}
		return t, nil
	}
	t, err := c.importImage(ctx, name, src, o.force, progress)
	if err != nil {
		return nil, fmt.Errorf("import template %s from %s: %w", name, src.kind, err)
	}
	return t, nil
}

// source is an opened import source.
type source struct {
	kind   string
	desc   string    // what the template's Source says
	rootfs io.Reader // a rootfs tar stream, for the rootfs kinds
	img    v1.Image  // for the image kinds
	close  func()
}

// looksLikePath says whether s is meant as a file, not a registry reference.
var looksLikePath = regexp.MustCompile(`^(\.{0,2}/|~)|\.(tar|tgz|tar\.gz|tar\.zst)$`)

func openSource(ctx context.Context, src string, o templateOptions, progress func(api.Progress)) (*source, error) {
	if src == "" {
		return nil, api.Errorf(api.ErrInvalid, "no image given: name an OCI layout, an archive, a directory, a registry reference or - for standard input")
	}
	if rest, ok := strings.CutPrefix(src, "docker://"); ok {
		return openRegistry(ctx, rest, o, progress)
	}
	for prefix, kind := range map[string]string{"oci:": SourceOCILayout, "oci-archive:": SourceOCIArchive, "docker-archive:": SourceDocker} {
		if rest, ok := strings.CutPrefix(src, prefix); ok {
			p, ref := splitRef(rest)
			return openImageFile(kind, p, ref, o)
		}
	}
	if src == "-" {
		return openStdin(o, progress)
	}
	fi, err := os.Stat(src)
	switch {
	case err == nil && fi.IsDir():
		if _, err := os.Stat(filepath.Join(src, "oci-layout")); err == nil {
			return openImageFile(SourceOCILayout, src, "", o)
		}
		pr := tarDir(src)
		return &source{kind: SourceRootfsDir, rootfs: pr, close: func() { pr.Close() }}, nil
	case err == nil:
		return openFile(src, o, progress)
	case !errors.Is(err, os.ErrNotExist) || looksLikePath.MatchString(src):
		return nil, api.Errorf(api.ErrInvalid, "%s: %v", src, err)
	}
	return openRegistry(ctx, src, o, progress)
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
func openStdin(o templateOptions, progress func(api.Progress)) (*source, error) {
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
		progress(api.Progress{Event: "progress", Message: fmt.Sprintf("reading standard input: %d MB", n>>20)})
	}})
	if err != nil {
		cleanup()
		return nil, fmt.Errorf("read standard input: %w", err)
	}
	if n == 0 {
		cleanup()
		return nil, api.Errorf(api.ErrInvalid, "standard input is empty: pipe an archive in, as `docker save IMAGE | sbx template import NAME -`")
	}
	s, err := openFile(f.Name(), o, progress)
	if err != nil {
		cleanup()
		return nil, err
	}
	s.desc = strings.Replace(s.desc, f.Name(), "stdin", 1)
	inner := s.close
	s.close = func() { inner(); cleanup() }
	return s, nil
}

// openFile tells an image archive from a rootfs tar by its first entry:
// archives start with their blobs, oci-layout, index.json, manifest.json or
// a layer directory named by a digest, a root filesystem never does. A
// gzipped archive is unpacked to a temporary file first.
func openFile(p string, o templateOptions, progress func(api.Progress)) (*source, error) {
	f, err := os.Open(p)
	if err != nil {
		return nil, err
	}
	in, gz, err := maybeGunzip(f)
	if err != nil {
		f.Close()
		return nil, err
	}
	var isImage bool
	if gz {
		first, err := tar.NewReader(in).Next()
		isImage = err == nil && archiveEntry.MatchString(strings.TrimPrefix(first.Name, "./"))
	} else {
		isImage = hasTopLevel(f, "manifest.json", "oci-layout")
	}
	f.Close()
	if !isImage {
		// not an image archive: the server reads it as a rootfs tar (or says why not)
		rf, err := os.Open(p)
		if err != nil {
			return nil, err
		}
		return &source{kind: SourceRootfsTar, rootfs: rf, close: func() { rf.Close() }}, nil
	}
	if !gz {
		return openArchive(p, o)
	}
	tmp, err := os.CreateTemp("", "sbx-import-*.tar")
	if err != nil {
		return nil, err
	}
	cleanup := func() { tmp.Close(); os.Remove(tmp.Name()) }
	progress(api.Progress{Event: "progress", Message: "decompressing " + p})
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
		return nil, api.Errorf(api.ErrInvalid, "decompress %s: %v", p, err)
	}
	s, err := openArchive(tmp.Name(), o)
	if err != nil {
		cleanup()
		return nil, err
	}
	s.desc = strings.Replace(s.desc, tmp.Name(), p, 1)
	inner := s.close
	s.close = func() { inner(); cleanup() }
	return s, nil
}

// archiveEntry matches the first entries of image archives: docker save's
// (a layer directory, or blobs/ since Docker 25), podman's and skopeo's
// (a layer tar or the config named by its digest), go-containerregistry's
// (the config named sha256:<hex>), an OCI archive's.
var archiveEntry = regexp.MustCompile(`^(blobs(/|$)|oci-layout$|index\.json$|manifest\.json$|repositories$|(sha256:)?[0-9a-f]{64}(/|$|\.json$|\.tar(\.gz)?$))`)

// hasTopLevel says whether the uncompressed tar f has one of the names at
// its top; the reader seeks past contents, so it costs a read per entry.
func hasTopLevel(f *os.File, names ...string) bool {
	tr := tar.NewReader(f)
	for {
		hdr, err := tr.Next()
		if err != nil {
			return false
		}
		n := path.Clean(strings.TrimPrefix(hdr.Name, "./"))
		for _, want := range names {
			if n == want {
				return true
			}
		}
	}
}

func maybeGunzip(f *os.File) (io.Reader, bool, error) {
	var magic [2]byte
	n, _ := io.ReadFull(f, magic[:])
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		return nil, false, err
	}
	if n == 2 && magic[0] == 0x1f && magic[1] == 0x8b {
		zr, err := gzip.NewReader(f)
		if err != nil {
			return nil, false, api.Errorf(api.ErrInvalid, "read gzip %s: %v", f.Name(), err)
		}
		return zr, true, nil
	}
	return f, false, nil
}

// openArchive opens the uncompressed archive p: an OCI archive if it holds
// oci-layout, else a docker-save archive.
func openArchive(p string, o templateOptions) (*source, error) {
	idx, err := indexTar(p)
	if err != nil {
		return nil, err
	}
	if _, ok := idx.entries["oci-layout"]; ok {
		return openOCI(SourceOCIArchive, p, idx, "", o)
	}
	if _, ok := idx.entries["manifest.json"]; ok {
		return openImageFile(SourceDocker, p, "", o)
	}
	idx.close()
	return nil, api.Errorf(api.ErrInvalid, "%s is an archive with neither oci-layout nor manifest.json: not an OCI or docker-save archive", p)
}

func openImageFile(kind, p, ref string, o templateOptions) (*source, error) {
	switch kind {
	case SourceOCILayout:
		fi, err := os.Stat(filepath.Join(p, "oci-layout"))
		if err != nil || !fi.Mode().IsRegular() {
			return nil, api.Errorf(api.ErrInvalid, "%s is not an OCI image layout: it has no oci-layout file", p)
		}
		return openOCI(kind, p, dirBlobs(p), ref, o)
	case SourceOCIArchive:
		idx, err := indexTar(p)
		if err != nil {
			return nil, err
		}
		return openOCI(kind, p, idx, ref, o)
	}
	var tag *name.Tag
	if ref != "" {
		t, err := name.NewTag(ref)
		if err != nil {
			return nil, api.Errorf(api.ErrInvalid, "docker-archive %s: tag %q: %v", p, ref, err)
		}
		tag = &t
	}
	img, err := tarball.ImageFromPath(p, tag)
	if err != nil {
		return nil, api.Errorf(api.ErrInvalid, "read docker-save archive %s: %v", p, err)
	}
	desc := "docker-archive:" + p
	if ref != "" {
		desc += ":" + ref
	}
	return &source{kind: SourceDocker, desc: desc, img: img, close: func() {}}, nil
}

// openRegistry opens an image in a registry; its layers are fetched as
// they are sent.
func openRegistry(ctx context.Context, ref string, o templateOptions, progress func(api.Progress)) (*source, error) {
	r, err := name.ParseReference(ref)
	if err != nil {
		return nil, api.Errorf(api.ErrInvalid, "%s is neither a file, a directory nor an image reference: %v", ref, err)
	}
	plat, err := o.platformOf()
	if err != nil {
		return nil, err
	}
	progress(api.Progress{Event: "progress", Message: "fetching the manifest of " + r.Name()})
	img, err := remote.Image(r, remote.WithContext(ctx), remote.WithAuthFromKeychain(authn.DefaultKeychain), remote.WithPlatform(*plat))
	if err != nil {
		return nil, fmt.Errorf("pull %s (is the registry reachable? are you logged in, with `docker login`?): %w", r.Name(), err)
	}
	return &source{kind: SourceRegistry, desc: r.Name(), img: img, close: func() {}}, nil
}

// importImage sends the image's config, then the layers sbxd asks for,
// then the config again.
func (c *Client) importImage(ctx context.Context, tname string, src *source, force bool, progress func(api.Progress)) (*api.Template, error) {
	cfg, err := src.img.RawConfigFile()
	if err != nil {
		return nil, fmt.Errorf("read the image's config: %w", err)
	}
	req := api.ImageImport{Config: cfg, Source: src.desc, Force: force}
	for range 3 {
		t, missing, err := c.postImage(ctx, tname, req, progress)
		if err != nil || t != nil {
			return t, err
		}
		for i, d := range missing {
			if err := c.sendLayer(ctx, src, d, fmt.Sprintf("layer %d/%d", i+1, len(missing)), progress); err != nil {
				return nil, err
			}
		}
	}
	return nil, errors.New("sbxd still lacks layers after they were sent (is a collection running?); try again")
}

func (c *Client) postImage(ctx context.Context, tname string, req api.ImageImport, progress func(api.Progress)) (*api.Template, []string, error) {
	b, err := json.Marshal(req)
	if err != nil {
		return nil, nil, err
	}
	resp, err := c.send(ctx, request{
		method: http.MethodPost, path: "/v1/templates/" + url.PathEscape(tname) + "/image",
		body: strings.NewReader(string(b)), size: int64(len(b)), ctype: "application/json", accept: "text/event-stream",
	})
	if err != nil {
		return nil, nil, err
	}
	defer resp.Body.Close()
	var missing []string
	t, err := readProgress(resp.Body, tname, func(p api.Progress) {
		if p.Event == "missing" {
			missing = p.Missing
			return
		}
		progress(p)
	})
	if len(missing) > 0 {
		return nil, missing, nil
	}
	return t, nil, err
}

// sendLayer uploads the layer whose diff ID is diffID as it reads it: as
// stored (compressed) when it can, uncompressed from a docker-save archive
// (whose layers are stored so).
func (c *Client) sendLayer(ctx context.Context, src *source, diffID, what string, progress func(api.Progress)) error {
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
	if src.kind == SourceDocker {
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
	resp, err := c.send(ctx, request{
		method: http.MethodPut, path: "/v1/layers/" + url.PathEscape(diffID),
		body: body, size: -1, ctype: "application/octet-stream", accept: "text/event-stream",
	})
	if err != nil {
		return fmt.Errorf("%s %s: %w", what, short, err)
	}
	defer resp.Body.Close()
	if _, err := readProgress(resp.Body, diffID, progress); err != nil {
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

// blobStore reads the files of an OCI layout, in a directory or an archive.
type blobStore interface {
	open(p string) (io.ReadCloser, error)
	close()
}

type dirBlobs string

func (d dirBlobs) open(p string) (io.ReadCloser, error) { return os.Open(filepath.Join(string(d), p)) }
func (d dirBlobs) close()                               {}

// openOCI picks the image of the layout for the platform (and ref, the
// org.opencontainers.image.ref.name annotation, if given).
func openOCI(kind, p string, bs blobStore, ref string, o templateOptions) (*source, error) {
	plat, err := o.platformOf()
	if err != nil {
		bs.close()
		return nil, err
	}
	raw, err := readBlob(bs, "index.json", 4<<20)
	if err != nil {
		bs.close()
		return nil, api.Errorf(api.ErrInvalid, "%s %s: read index.json: %v", kind, p, err)
	}
	var found []v1.Descriptor
	var seen []string
	if err := walkIndex(bs, raw, ref, plat, 0, &found, &seen); err != nil {
		bs.close()
		return nil, api.Errorf(api.ErrInvalid, "%s %s: %v", kind, p, err)
	}
	switch {
	case len(found) == 0:
		bs.close()
		return nil, api.Errorf(api.ErrInvalid, "%s %s holds no image for %s%s (it holds: %s)", kind, p, plat, refNote(ref), strings.Join(seen, ", "))
	case len(found) > 1:
		bs.close()
		return nil, api.Errorf(api.ErrInvalid, "%s %s holds %d images for %s (%s): name one as %s:PATH:REF", kind, p, len(found), plat, strings.Join(seen, ", "), map[string]string{SourceOCILayout: "oci", SourceOCIArchive: "oci-archive"}[kind])
	}
	manifest, err := readBlob(bs, blobPath(found[0].Digest), 4<<20)
	if err != nil {
		bs.close()
		return nil, api.Errorf(api.ErrInvalid, "%s %s: read manifest: %v", kind, p, err)
	}
	img, err := partial.CompressedToImage(&ociImage{bs: bs, raw: manifest, mt: found[0].MediaType})
	if err != nil {
		bs.close()
		return nil, api.Errorf(api.ErrInvalid, "%s %s: %v", kind, p, err)
	}
	desc := map[string]string{SourceOCILayout: "oci:", SourceOCIArchive: "oci-archive:"}[kind] + p
	if ref != "" {
		desc += ":" + ref
	}
	return &source{kind: kind, desc: desc, img: img, close: bs.close}, nil
}

func refNote(ref string) string {
	if ref == "" {
		return ""
	}
	return " named " + ref
}

// walkIndex collects the image manifests of an index (and of the indexes it
// names) that fit the platform and ref.
func walkIndex(bs blobStore, raw []byte, ref string, plat *v1.Platform, depth int, found *[]v1.Descriptor, seen *[]string) error {
	if depth > 4 {
		return errors.New("indexes nest too deep")
	}
	var im v1.IndexManifest
	if err := json.Unmarshal(raw, &im); err != nil {
		return fmt.Errorf("read index: %w", err)
	}
	for _, d := range im.Manifests {
		r := d.Annotations["org.opencontainers.image.ref.name"]
		if depth == 0 && ref != "" && r != ref && d.Annotations["io.containerd.image.name"] != ref {
			if r != "" {
				*seen = append(*seen, r)
			}
			continue
		}
		switch {
		case d.MediaType.IsIndex():
			b, err := readBlob(bs, blobPath(d.Digest), 4<<20)
			if err != nil {
				return err
			}
			if err := walkIndex(bs, b, "", plat, depth+1, found, seen); err != nil {
				return err
			}
		case d.MediaType.IsImage():
			what := d.Digest.String()[:19]
			if r != "" {
				what = r
			}
			if d.Platform != nil {
				what += " " + d.Platform.String()
			}
			*seen = append(*seen, what)
			if d.Platform == nil || d.Platform.Satisfies(*plat) {
				*found = append(*found, d)
			}
		}
	}
	return nil
}

func blobPath(h v1.Hash) string { return path.Join("blobs", h.Algorithm, h.Hex) }

func readBlob(bs blobStore, p string, max int64) ([]byte, error) {
	rc, err := bs.open(p)
	if err != nil {
		return nil, err
	}
	defer rc.Close()
	b, err := io.ReadAll(io.LimitReader(rc, max+1))
	if err != nil {
		return nil, err
	}
	if int64(len(b)) > max {
		return nil, fmt.Errorf("%s is larger than %d bytes", p, max)
	}
	return b, nil
}

// ociImage is an image of an OCI layout, read blob by blob.
type ociImage struct {
	bs  blobStore
	raw []byte
	mt  types.MediaType
}

func (i *ociImage) RawManifest() ([]byte, error)        { return i.raw, nil }
func (i *ociImage) MediaType() (types.MediaType, error) { return i.mt, nil }
func (i *ociImage) RawConfigFile() ([]byte, error) {
	m, err := v1.ParseManifest(strings.NewReader(string(i.raw)))
	if err != nil {
		return nil, err
	}
	return readBlob(i.bs, blobPath(m.Config.Digest), 4<<20)
}
func (i *ociImage) LayerByDigest(h v1.Hash) (partial.CompressedLayer, error) {
	m, err := v1.ParseManifest(strings.NewReader(string(i.raw)))
	if err != nil {
		return nil, err
	}
	for _, l := range m.Layers {
		if l.Digest == h {
			return &ociLayer{bs: i.bs, desc: l}, nil
		}
	}
	return nil, fmt.Errorf("the manifest has no layer %s", h)
}

type ociLayer struct {
	bs   blobStore
	desc v1.Descriptor
}

func (l *ociLayer) Digest() (v1.Hash, error)            { return l.desc.Digest, nil }
func (l *ociLayer) Size() (int64, error)                { return l.desc.Size, nil }
func (l *ociLayer) MediaType() (types.MediaType, error) { return l.desc.MediaType, nil }
func (l *ociLayer) Compressed() (io.ReadCloser, error)  { return l.bs.open(blobPath(l.desc.Digest)) }

// tarIndex reads the files of an uncompressed tar in place, by offset.
type tarIndex struct {
	f       *os.File
	entries map[string][2]int64 // name -> offset, size
}

func indexTar(p string) (*tarIndex, error) {
	f, err := os.Open(p)
	if err != nil {
		return nil, err
	}
	idx := &tarIndex{f: f, entries: map[string][2]int64{}}
	tr := tar.NewReader(f) // skips file contents by seeking
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			f.Close()
			return nil, api.Errorf(api.ErrInvalid, "read archive %s: %v", p, err)
		}
		if hdr.Typeflag != tar.TypeReg {
			continue
		}
		off, err := f.Seek(0, io.SeekCurrent)
		if err != nil {
			f.Close()
			return nil, err
		}
		idx.entries[path.Clean(strings.TrimPrefix(hdr.Name, "./"))] = [2]int64{off, hdr.Size}
	}
	return idx, nil
}

func (t *tarIndex) open(p string) (io.ReadCloser, error) {
	e, ok := t.entries[p]
	if !ok {
		return nil, fmt.Errorf("the archive has no %s", p)
	}
	return io.NopCloser(io.NewSectionReader(t.f, e[0], e[1])), nil
}

func (t *tarIndex) close() { t.f.Close() }

// templateOptions are what TemplateOption set.
type templateOptions struct {
	force    bool
	packages []string
	stdin    io.Reader
	platform string
	progress func(api.Progress)
}

func templateOpts(opts []TemplateOption) templateOptions {
	var o templateOptions
	for _, f := range opts {
		f.applyTemplate(&o)
	}
	if o.progress == nil {
		o.progress = func(api.Progress) {}
	}
	return o
}

func (o templateOptions) platformOf() (*v1.Platform, error) {
	if o.platform == "" {
		return &v1.Platform{OS: "linux", Architecture: runtime.GOARCH}, nil
	}
	p, err := v1.ParsePlatform(o.platform)
	if err != nil {
		return nil, api.Errorf(api.ErrInvalid, "platform %q: %v; want os/arch, as linux/amd64", o.platform, err)
	}
	return p, nil
}
