// Package snapstore carries sbx's captures between nodes through an OCI
// registry. A capture on disk is a directory of files (an image: disk.tar,
// memory/...); pushed, it is an OCI artifact whose config is a Manifest
// (what a node must be to restore it, and every file with its digest) and
// whose layers are the files themselves, one blob each, uncompressed:
// gVisor's pages do not compress well, and a blob per file lets a registry
// and a node keep each file once.
//
// A node keeps what it pulls in a content store (Store: DIR/sha256/HEX,
// one read-only file per digest) and puts a pulled image together from it
// with hard links, so a file already on the node is never pulled again and
// takes no second copy of its space. Everything pulled is verified against
// its digest and size before it is used, and a manifest's paths are held
// inside the image's directory: the registry is not trusted.
package snapstore

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strings"
	"syscall"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/partial"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// The artifact's media types.
const (
	ArtifactType    = "application/vnd.sbx.snapshot.v1"
	ConfigMediaType = "application/vnd.sbx.snapshot.config.v1+json"
	FileMediaType   = "application/vnd.sbx.snapshot.file.v1"
	// PathAnnotation, on a file's layer, is its path in the image.
	PathAnnotation = "dev.sbx.snapshot.path"
)

// Schema is the Manifest's version.
const Schema = 1

// Bounds on what a pull accepts from a registry.
const (
	maxConfig = 1 << 20
	maxFiles  = 4096
)

// Manifest is what a pushed capture says of itself.
type Manifest struct {
	Schema int `json:"schema"`
	// Name is the snapshot's name on the node that pushed it.
	Name string `json:"name"`
	// Memory says the image holds the sandbox's memory: it restores only
	// where RunscSHA256 is runsc's digest, the CPU has every one of
	// CPUFeatures, and the cache line is CacheLineBytes.
	Memory         bool     `json:"memory"`
	RunscSHA256    string   `json:"runscSHA256,omitempty"`
	CPUFeatures    []string `json:"cpuFeatures,omitempty"`
	CacheLineBytes int      `json:"cacheLineBytes,omitempty"`
	// Agent is the build of sbx's in-sandbox agent the memory's processes
	// run on (a key, or "legacy"): a node without it restores the disk
	// alone. Record carries it too; this copy is the fleet's to place by.
	Agent string `json:"agent,omitempty"`
	// Template and TemplateVersion (the template's digest) are what the
	// image's disk changes are changes to.
	Template        string `json:"template"`
	TemplateVersion string `json:"templateVersion"`
	// Record is the rest of the snapshot's record, as sbxd keeps it (its
	// limits, network, where it was taken): sbxd's to read.
	Record json.RawMessage `json:"record,omitempty"`
	// Files are the image's regular files, each a layer of the artifact.
	Files []File `json:"files"`
}

// File is one file of an image. A pulled image's files are read-only
// (0400, root's): a capture is never written again.
type File struct {
	Path   string `json:"path"` // slash-separated, below the image's directory
	Size   int64  `json:"size"`
	Digest string `json:"digest"`
}

// Store is a node's content store: DIR/sha256/HEX, one file per digest.
type Store struct{ dir string }

// Open opens (making it if need be) the content store in dir.
func Open(dir string) (*Store, error) {
	if err := os.MkdirAll(filepath.Join(dir, "sha256"), 0o700); err != nil {
		return nil, err
	}
	return &Store{dir: dir}, nil
}

// path is where the store keeps the file of digest d ("sha256:HEX").
func (s *Store) path(d string) (string, error) {
	hexd, ok := strings.CutPrefix(d, "sha256:")
	if !ok || len(hexd) != 64 || strings.Trim(hexd, "0123456789abcdef") != "" {
		return "", fmt.Errorf("digest %q: want sha256: and 64 lowercase hex digits", d)
	}
	return filepath.Join(s.dir, "sha256", hexd), nil
}

// Has reports whether the store holds the file of digest d: a regular
// file (not a symlink, which a pull would link as it is).
func (s *Store) Has(d string) bool { return s.holds(d, -1) }

// holds reports whether the store holds the file of digest d, of size
// bytes (any, if size < 0): a file cut short since it was stored is not
// the digest's.
func (s *Store) holds(d string, size int64) bool {
	p, err := s.path(d)
	if err != nil {
		return false
	}
	fi, err := os.Lstat(p)
	return err == nil && fi.Mode().IsRegular() && (size < 0 || fi.Size() == size)
}

// Digests are the digests the store holds, as a node publishes them.
func (s *Store) Digests() ([]string, error) {
	ents, err := os.ReadDir(filepath.Join(s.dir, "sha256"))
	if err != nil {
		return nil, err
	}
	var out []string
	for _, e := range ents {
		if d := "sha256:" + e.Name(); e.Type().IsRegular() && s.Has(d) {
			out = append(out, d)
		}
	}
	return out, nil
}

// Prune removes the files no image links to any more (a link count of
// one: the store's own), and returns the bytes it gave back. A file a pull
// has fetched but not yet linked has a count of one too: the caller keeps
// Prune and Pull apart.
func (s *Store) Prune() (int64, error) {
	ents, err := os.ReadDir(filepath.Join(s.dir, "sha256"))
	if err != nil {
		return 0, err
	}
	var freed int64
	for _, e := range ents {
		p := filepath.Join(s.dir, "sha256", e.Name())
		fi, err := os.Lstat(p)
		if err != nil {
			continue
		}
		if nlink(fi) == 1 || !fi.Mode().IsRegular() {
			if os.Remove(p) == nil {
				freed += fi.Size()
			}
		}
	}
	return freed, nil
}

// Push pushes the regular files under dir (but those skip says to leave,
// by their slash-separated path; skip may be nil) as an artifact to ref (a
// tag or a repository), with m as its config (m.Files is filled in here),
// and returns the artifact by digest (REPO@sha256:...) and the manifest as
// pushed. A file the registry holds already is not sent again. Each file is
// also kept in the store, so that a pull of what this node pushed takes
// nothing from the registry.
func (s *Store) Push(ctx context.Context, ref string, dir string, m Manifest, skip func(path string) bool, opts ...remote.Option) (string, Manifest, error) {
	return s.PushWith(ctx, ref, dir, nil, m, skip, opts...)
}

// PushWith is Push with more files: extra maps a path in the artifact to
// a regular file of the host (a freeze's disk, which its image only
// names), pushed after dir's unless dir has that path.
func (s *Store) PushWith(ctx context.Context, ref string, dir string, extra map[string]string, m Manifest, skip func(path string) bool, opts ...remote.Option) (string, Manifest, error) {
	r, err := name.ParseReference(ref)
	if err != nil {
		return "", m, fmt.Errorf("push: %w", err)
	}
	opts = append([]remote.Option{remote.WithContext(ctx)}, opts...)
	m.Schema = Schema
	m.Files = nil
	var layers []v1.Descriptor
	have := map[string]bool{}
	add := func(p, rel string) error {
		l, err := newFileLayer(p)
		if err != nil {
			return err
		}
		if err := remote.WriteLayer(r.Context(), l, opts...); err != nil {
			return fmt.Errorf("push %s: %w", rel, err)
		}
		s.keep(p, l.digest.String())
		have[rel] = true
		m.Files = append(m.Files, File{Path: rel, Size: l.size, Digest: l.digest.String()})
		layers = append(layers, v1.Descriptor{MediaType: FileMediaType, Size: l.size, Digest: l.digest,
			Annotations: map[string]string{PathAnnotation: rel}})
		return nil
	}
	err = filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		if !d.Type().IsRegular() {
			return fmt.Errorf("%s is not a regular file", p)
		}
		rel, err := filepath.Rel(dir, p)
		if err != nil {
			return err
		}
		if skip != nil && skip(filepath.ToSlash(rel)) {
			return nil
		}
		return add(p, filepath.ToSlash(rel))
	})
	if err != nil {
		return "", m, fmt.Errorf("push %s: %w", dir, err)
	}
	rels := make([]string, 0, len(extra))
	for rel := range extra {
		rels = append(rels, rel)
	}
	sort.Strings(rels)
	for _, rel := range rels {
		if have[rel] {
			continue
		}
		if fi, err := os.Lstat(extra[rel]); err != nil || !fi.Mode().IsRegular() {
			return "", m, fmt.Errorf("push %s: %s is not a regular file (%v)", rel, extra[rel], err)
		}
		if err := add(extra[rel], rel); err != nil {
			return "", m, fmt.Errorf("push %s: %w", dir, err)
		}
	}
	cfg, err := json.Marshal(m)
	if err != nil {
		return "", m, err
	}
	cl := &bytesLayer{b: cfg, mt: ConfigMediaType}
	if err := remote.WriteLayer(r.Context(), cl, opts...); err != nil {
		return "", m, fmt.Errorf("push the manifest: %w", err)
	}
	cd, _ := cl.Digest()
	man := v1.Manifest{SchemaVersion: 2, MediaType: types.OCIManifestSchema1, ArtifactType: ArtifactType,
		Config: v1.Descriptor{MediaType: ConfigMediaType, Size: int64(len(cfg)), Digest: cd}, Layers: layers}
	if layers == nil {
		man.Layers = []v1.Descriptor{}
	}
	raw, err := json.Marshal(man)
	if err != nil {
		return "", m, err
	}
	if err := remote.Put(r, rawManifest(raw), opts...); err != nil {
		return "", m, fmt.Errorf("push %s: %w", ref, err)
	}
	md, _, _ := v1.SHA256(bytes.NewReader(raw))
	return r.Context().Digest(md.String()).String(), m, nil
}

// keep links the pushed file p into the store under digest d (best
// effort: another filesystem, or a store that has it, leaves it be).
func (s *Store) keep(p, d string) {
	dst, err := s.path(d)
	if err != nil || s.Has(d) {
		return
	}
	_ = os.Link(p, dst)
}

// Fetch reads the manifest of the artifact ref and checks it: a pull's
// first step, so that a node can say whether it can restore it before it
// takes any of its files. It returns the artifact by digest.
func Fetch(ctx context.Context, ref string, opts ...remote.Option) (Manifest, string, error) {
	r, err := name.ParseReference(ref)
	if err != nil {
		return Manifest{}, "", fmt.Errorf("pull: %w", err)
	}
	opts = append([]remote.Option{remote.WithContext(ctx)}, opts...)
	desc, err := remote.Get(r, opts...)
	if err != nil {
		return Manifest{}, "", fmt.Errorf("pull %s: %w", ref, err)
	}
	if d, ok := r.(name.Digest); ok && d.DigestStr() != desc.Digest.String() {
		return Manifest{}, "", fmt.Errorf("pull %s: the registry answered with %s", ref, desc.Digest)
	}
	var man v1.Manifest
	if err := json.Unmarshal(desc.Manifest, &man); err != nil {
		return Manifest{}, "", fmt.Errorf("pull %s: its manifest: %w", ref, err)
	}
	if man.Config.MediaType != ConfigMediaType {
		return Manifest{}, "", fmt.Errorf("pull %s: not an sbx snapshot (its config is %q, want %s)", ref, man.Config.MediaType, ConfigMediaType)
	}
	if man.Config.Size > maxConfig {
		return Manifest{}, "", fmt.Errorf("pull %s: its config is %d bytes, more than %d", ref, man.Config.Size, maxConfig)
	}
	repo := r.Context()
	cfg, err := fetchBlob(repo, man.Config, maxConfig, opts)
	if err != nil {
		return Manifest{}, "", fmt.Errorf("pull %s: its config: %w", ref, err)
	}
	var m Manifest
	if err := json.Unmarshal(cfg, &m); err != nil {
		return Manifest{}, "", fmt.Errorf("pull %s: its config: %w", ref, err)
	}
	if err := m.check(man.Layers); err != nil {
		return Manifest{}, "", fmt.Errorf("pull %s: %w", ref, manifestError{err})
	}
	return m, repo.Digest(desc.Digest.String()).String(), nil
}

// check holds a pulled manifest to what a pull relies on: a known schema,
// files with clean relative paths inside the image, once each, and one
// layer each of the same digest and size.
func (m Manifest) check(layers []v1.Descriptor) error {
	if m.Schema != Schema {
		return fmt.Errorf("manifest schema %d, this sbx reads %d", m.Schema, Schema)
	}
	if len(m.Files) > maxFiles || len(m.Files) != len(layers) {
		return fmt.Errorf("the manifest lists %d files for %d layers", len(m.Files), len(layers))
	}
	seen := map[string]bool{}
	for i, f := range m.Files {
		if f.Path == "" || path.IsAbs(f.Path) || path.Clean(f.Path) != f.Path || f.Path == "." || strings.HasPrefix(f.Path, "../") || f.Path == ".." || strings.ContainsFunc(f.Path, badPathRune) {
			return fmt.Errorf("file %q: not a clean path inside the image", f.Path)
		}
		if seen[f.Path] {
			return fmt.Errorf("file %q is listed twice", f.Path)
		}
		seen[f.Path] = true
		l := layers[i]
		if l.Digest.String() != f.Digest || l.Size != f.Size || f.Size < 0 || l.MediaType != FileMediaType {
			return fmt.Errorf("file %q: the manifest says %s (%d bytes), its layer %s (%d bytes, %s)", f.Path, f.Digest, f.Size, l.Digest, l.Size, l.MediaType)
		}
	}
	// a file's directory may not be another file
	for p := range seen {
		for d := path.Dir(p); d != "."; d = path.Dir(d) {
			if seen[d] {
				return fmt.Errorf("file %q is inside file %q", p, d)
			}
		}
	}
	return nil
}

// badPathRune: no file of an image is named with a backslash or a control
// character (a NUL, which no link takes; a terminal's escape, shown in
// every error naming the file).
func badPathRune(r rune) bool { return r == '\\' || r < 0x20 || r == 0x7f }

// ErrManifest is what a pull's error wraps when the artifact is not an sbx
// snapshot a node takes (an unknown schema, files that lie): the
// registry's fault, not the node's.
var ErrManifest = errors.New("not an sbx snapshot a node takes")

// manifestError is an error of a manifest's check: ErrManifest.
type manifestError struct{ err error }

func (e manifestError) Error() string        { return e.err.Error() }
func (e manifestError) Unwrap() error        { return e.err }
func (e manifestError) Is(target error) bool { return target == ErrManifest }

// Pull puts the image of artifact ref (as Fetch read it: m) together in
// dir, which must not exist: each file from the store if it holds it,
// else from the registry, verified. dir is made whole or not at all.
// It returns how many bytes came from the registry.
func (s *Store) Pull(ctx context.Context, ref string, m Manifest, dir string, opts ...remote.Option) (int64, error) {
	r, err := name.ParseReference(ref)
	if err != nil {
		return 0, fmt.Errorf("pull: %w", err)
	}
	opts = append([]remote.Option{remote.WithContext(ctx)}, opts...)
	var pulled int64
	for _, f := range m.Files {
		if s.holds(f.Digest, f.Size) {
			continue
		}
		d, err := v1.NewHash(f.Digest)
		if err != nil {
			return pulled, err
		}
		n, err := s.fetch(r.Context(), v1.Descriptor{Digest: d, Size: f.Size}, opts)
		pulled += n
		if err != nil {
			return pulled, fmt.Errorf("pull %s: %w", f.Path, err)
		}
	}
	if _, err := os.Lstat(dir); err == nil {
		return pulled, fmt.Errorf("pull: %s exists", dir)
	}
	// a temp dir of this pull's own: another pull into dir must not take
	// (or hand over) a half-made one
	if err := os.MkdirAll(filepath.Dir(dir), 0o700); err != nil {
		return pulled, err
	}
	tmp, err := os.MkdirTemp(filepath.Dir(dir), filepath.Base(dir)+".pull-*")
	if err != nil {
		return pulled, err
	}
	if err := s.assemble(tmp, m); err != nil {
		os.RemoveAll(tmp)
		return pulled, err
	}
	if err := os.Rename(tmp, dir); err != nil {
		os.RemoveAll(tmp)
		return pulled, err
	}
	return pulled, nil
}

// assemble links each file of m from the store into dir.
func (s *Store) assemble(dir string, m Manifest) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	for _, f := range m.Files {
		src, err := s.path(f.Digest)
		if err != nil {
			return err
		}
		dst := filepath.Join(dir, filepath.FromSlash(f.Path))
		if err := os.MkdirAll(filepath.Dir(dst), 0o700); err != nil {
			return err
		}
		if err := os.Link(src, dst); err != nil {
			return fmt.Errorf("pull %s: %w", f.Path, err)
		}
	}
	return nil
}

// fetch takes blob l from repo into the store, checking its size and
// digest as it comes; it returns the bytes read.
func (s *Store) fetch(repo name.Repository, l v1.Descriptor, opts []remote.Option) (int64, error) {
	dst, err := s.path(l.Digest.String())
	if err != nil {
		return 0, err
	}
	rl, err := remote.Layer(repo.Digest(l.Digest.String()), opts...)
	if err != nil {
		return 0, err
	}
	rc, err := rl.Compressed()
	if err != nil {
		return 0, err
	}
	defer rc.Close()
	tmp, err := os.CreateTemp(filepath.Dir(dst), ".pull-*")
	if err != nil {
		return 0, err
	}
	defer os.Remove(tmp.Name())
	h := sha256.New()
	n, err := io.Copy(io.MultiWriter(tmp, h), io.LimitReader(rc, l.Size+1))
	if err == nil && n != l.Size {
		err = fmt.Errorf("the registry sent %d bytes of %s, want %d", n, l.Digest, l.Size)
	}
	if got := "sha256:" + hex.EncodeToString(h.Sum(nil)); err == nil && got != l.Digest.String() {
		err = fmt.Errorf("the registry sent %s for %s", got, l.Digest)
	}
	if err == nil {
		err = tmp.Chmod(0o400)
	}
	if err == nil {
		err = tmp.Sync()
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return n, err
	}
	return n, os.Rename(tmp.Name(), dst)
}

// fetchBlob reads blob l of repo whole (at most max bytes), verified.
func fetchBlob(repo name.Repository, l v1.Descriptor, max int64, opts []remote.Option) ([]byte, error) {
	rl, err := remote.Layer(repo.Digest(l.Digest.String()), opts...)
	if err != nil {
		return nil, err
	}
	rc, err := rl.Compressed()
	if err != nil {
		return nil, err
	}
	defer rc.Close()
	b, err := io.ReadAll(io.LimitReader(rc, max+1))
	if err != nil {
		return nil, err
	}
	if int64(len(b)) != l.Size {
		return nil, fmt.Errorf("%d bytes, want %d", len(b), l.Size)
	}
	if d, _, _ := v1.SHA256(bytes.NewReader(b)); d != l.Digest {
		return nil, fmt.Errorf("digest %s, want %s", d, l.Digest)
	}
	return b, nil
}

// fileLayer is a file pushed as one blob, as it is.
type fileLayer struct {
	path   string
	digest v1.Hash
	size   int64
}

func newFileLayer(p string) (*fileLayer, error) {
	f, err := os.Open(p)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	d, n, err := v1.SHA256(f)
	if err != nil {
		return nil, err
	}
	return &fileLayer{path: p, digest: d, size: n}, nil
}

func (l *fileLayer) Digest() (v1.Hash, error)            { return l.digest, nil }
func (l *fileLayer) DiffID() (v1.Hash, error)            { return l.digest, nil }
func (l *fileLayer) Size() (int64, error)                { return l.size, nil }
func (l *fileLayer) MediaType() (types.MediaType, error) { return FileMediaType, nil }
func (l *fileLayer) Compressed() (io.ReadCloser, error)  { return os.Open(l.path) }
func (l *fileLayer) Uncompressed() (io.ReadCloser, error) {
	return os.Open(l.path)
}

// bytesLayer is a small blob held in memory (the config).
type bytesLayer struct {
	b  []byte
	mt types.MediaType
}

func (l *bytesLayer) Digest() (v1.Hash, error) {
	d, _, err := v1.SHA256(bytes.NewReader(l.b))
	return d, err
}
func (l *bytesLayer) DiffID() (v1.Hash, error)            { return l.Digest() }
func (l *bytesLayer) Size() (int64, error)                { return int64(len(l.b)), nil }
func (l *bytesLayer) MediaType() (types.MediaType, error) { return l.mt, nil }
func (l *bytesLayer) Compressed() (io.ReadCloser, error) {
	return io.NopCloser(bytes.NewReader(l.b)), nil
}
func (l *bytesLayer) Uncompressed() (io.ReadCloser, error) { return l.Compressed() }

// rawManifest is a manifest pushed as it is.
type rawManifest []byte

func (m rawManifest) RawManifest() ([]byte, error)        { return m, nil }
func (m rawManifest) MediaType() (types.MediaType, error) { return types.OCIManifestSchema1, nil }

var (
	_ v1.Layer                = (*fileLayer)(nil)
	_ v1.Layer                = (*bytesLayer)(nil)
	_ partial.CompressedLayer = (*fileLayer)(nil)
)

// nlink is a file's link count.
func nlink(fi fs.FileInfo) uint64 {
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		return uint64(st.Nlink)
	}
	return 0
}
