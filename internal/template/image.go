package template

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"sbx.dev/sbx/api"
)

// maxConfig bounds an image's config (they are kilobytes).
const maxConfig = 4 << 20

// PutLayer stores the image layer whose diff ID (the digest of the
// uncompressed tar) is diffID, reading it from r: a tar, compressed with
// gzip or zstd or not. If the store has it already, r is not read and
// existed is true. The content must have that digest. Layers are kept
// unpacked, once, and versions made from images hard-link their files, so
// templates share them. Errors: api.ErrInvalid for a bad digest, a digest
// that does not match, or a layer that is refused (see extract).
func (s *Store) PutLayer(ctx context.Context, diffID string, r io.Reader, progress func(string)) (existed bool, err error) {
	progress = orNop(progress)
	if !digestRE.MatchString(diffID) {
		return false, api.Errorf(api.ErrInvalid, "invalid layer digest %q: want sha256: and 64 hex digits", diffID)
	}
	l, err := s.newLease(refLayer + diffID)
	if err != nil {
		return false, err
	}
	defer func() {
		if rerr := l.release(); rerr != nil {
			err = errors.Join(err, fmt.Errorf("clean up: %w", rerr))
		}
	}()
	dst := s.layerPath(diffID)
	if s.touchLayer(dst) {
		progress("layer " + short(diffID) + " is there already")
		return true, nil
	}
	work := filepath.Join(l.work, "layer")
	lim := s.importLimits()
	got, err := extract(ctx, work, r, true, progress, unpackBound{max: lim.Layer, what: "the layer limit (sbxd --max-layer-size)", reserve: lim.Reserve})
	if err != nil {
		return false, fmt.Errorf("layer %s: %w", short(diffID), err)
	}
	if got != diffID {
		return false, api.Errorf(api.ErrInvalid, "layer %s: its content's digest is %s; the upload is damaged, or the image's config names another layer", short(diffID), got)
	}
	if err := syncFS(work); err != nil {
		return false, err
	}
	err = s.critical(func() error {
		if err := os.Rename(work, dst); err != nil {
			if errors.Is(err, fs.ErrExist) || errors.Is(err, syscall.ENOTEMPTY) {
				existed = true // another upload of it won
				return nil
			}
			return fmt.Errorf("install layer %s: %w", short(diffID), err)
		}
		now := time.Now()
		os.Chtimes(dst, now, now) // the start of its grace
		return syncDir(filepath.Dir(dst))
	})
	return existed, err
}

// touchLayer reports whether the layer at dst is there, and if so restarts
// its grace, so that Collect leaves it until the version made from it holds it.
func (s *Store) touchLayer(dst string) bool {
	ok := false
	s.critical(func() error {
		if _, err := os.Lstat(dst); err == nil {
			ok = true
			now := time.Now()
			os.Chtimes(dst, now, now)
		}
		return nil
	})
	return ok
}

// ImportImage makes a version of template name from an image's config (its
// raw bytes, as the manifest names them) and the layers its rootfs lists,
// which must be in the store (PutLayer), and points name at it. The version
// is the config's digest, the image ID: it names the layers' contents and
// the defaults, whatever the compression or the registry. If some layers are
// missing it returns them and does nothing else; the caller uploads them and
// calls again. An image that is a version already is reused at once, and
// the progress says so. The config's Env, WorkingDir, User, Entrypoint and
// Cmd become the template's defaults. Errors: api.ErrInvalid for a bad name
// or config or an image for another OS or architecture, api.ErrConflict if
// name points at another version and force is false.
func (s *Store) ImportImage(ctx context.Context, name string, config []byte, source string, force bool, progress func(string)) (t api.Template, missing []string, err error) {
	progress = orNop(progress)
	if err := ValidName(name); err != nil {
		return api.Template{}, nil, err
	}
	cf, err := parseConfig(config)
	if err != nil {
		return api.Template{}, nil, err
	}
	sum := sha256.Sum256(config)
	v := "sha256:" + hex.EncodeToString(sum[:])
	var layers, refs []string
	seen := map[string]bool{}
	for _, d := range cf.RootFS.DiffIDs {
		layers = append(layers, d.String())
		if !seen[d.String()] {
			seen[d.String()] = true
			refs = append(refs, refLayer+d.String())
		}
	}
	unlock, err := s.lock(ctx, name)
	if err != nil {
		return api.Template{}, nil, err
	}
	defer unlock()
	l, err := s.newLease(append(refs, v)...)
	if err != nil {
		return api.Template{}, nil, err
	}
	defer func() {
		if rerr := l.release(); rerr != nil {
			err = errors.Join(err, fmt.Errorf("clean up: %w", rerr))
		}
	}()
	var have bool
	err = s.critical(func() error {
		if err := s.checkReplace(name, v, force, "import"); err != nil {
			return err
		}
		if _, err := os.Lstat(s.versionPath(v)); err == nil {
			have = true
			return s.point(name, v)
		}
		for _, r := range refs {
			d := strings.TrimPrefix(r, refLayer)
			if _, err := os.Lstat(s.layerPath(d)); errors.Is(err, fs.ErrNotExist) {
				missing = append(missing, d)
			}
		}
		return nil
	})
	if err != nil {
		return api.Template{}, nil, fmt.Errorf("import template %s: %w", name, err)
	}
	if have {
		t, err := s.Resolve(name)
		if err == nil {
			progress(fmt.Sprintf("image %s is here already; %s points at it (nothing to send)", short(v), name))
		}
		return t, nil, err
	}
	if len(missing) > 0 {
		return api.Template{}, missing, nil
	}

	ver := filepath.Join(l.work, "version")
	if err := os.Mkdir(ver, 0o755); err != nil {
		return api.Template{}, nil, err
	}
	rootfs := filepath.Join(ver, rootfsDir)
	progress(fmt.Sprintf("putting %d layers together", len(layers)))
	var paths []string
	for _, d := range layers {
		paths = append(paths, s.layerPath(d))
	}
	lim := s.importLimits()
	bound := &budget{dir: filepath.Dir(rootfs), max: lim.Image, what: "the image limit (sbxd --max-image-size)", reserve: lim.Reserve}
	if err := compose(ctx, rootfs, paths, bound); err != nil {
		return api.Template{}, nil, fmt.Errorf("import template %s: %w", name, err)
	}
	progress("preparing mount points")
	if err := addSkeleton(rootfs); err != nil {
		return api.Template{}, nil, fmt.Errorf("import template %s: add mount points: %w", name, err)
	}
	size, err := diskUsage(rootfs)
	if err != nil {
		return api.Template{}, nil, fmt.Errorf("import template %s: measure rootfs: %w", name, err)
	}
	if source == "" {
		source = "image"
	}
	m := meta{
		Template: api.Template{Name: name, Version: v, Size: size, CreatedAt: time.Now().UTC().Truncate(time.Second), Source: source, Defaults: imageDefaults(cf)},
		Layers:   layers,
	}
	if err := syncFS(ver); err != nil {
		return api.Template{}, nil, err
	}
	if err := writeMeta(filepath.Join(ver, metaFile), m); err != nil {
		return api.Template{}, nil, err
	}
	reused, err := s.install(l, name, ver, v, force, "import")
	if err != nil {
		return api.Template{}, nil, fmt.Errorf("import template %s: %w", name, err)
	}
	if t, err = s.Resolve(name); err != nil {
		return api.Template{}, nil, err
	}
	if reused {
		progress(fmt.Sprintf("image %s was imported meanwhile; %s points at it", short(v), name))
	} else {
		progress(fmt.Sprintf("imported %s (%d MB), version %s", name, t.Size>>20, short(v)))
	}
	return t, nil, nil
}

// parseConfig reads an image config and checks it is one sbx can run.
func parseConfig(config []byte) (*v1.ConfigFile, error) {
	if len(config) == 0 {
		return nil, api.Errorf(api.ErrInvalid, "the image's config is empty")
	}
	if len(config) > maxConfig {
		return nil, api.Errorf(api.ErrInvalid, "the image's config is %d bytes; at most %d", len(config), maxConfig)
	}
	cf, err := v1.ParseConfigFile(bytes.NewReader(config))
	if err != nil {
		return nil, api.Errorf(api.ErrInvalid, "read the image's config: %s", err)
	}
	if cf.OS != "" && cf.OS != "linux" {
		return nil, api.Errorf(api.ErrInvalid, "the image is for %s; sbx runs linux images", cf.OS)
	}
	if cf.Architecture != "" && cf.Architecture != runtime.GOARCH {
		return nil, api.Errorf(api.ErrInvalid, "the image is for %s; this host runs %s: import the %s variant (platform linux/%s)", cf.Architecture, runtime.GOARCH, runtime.GOARCH, runtime.GOARCH)
	}
	if len(cf.RootFS.DiffIDs) == 0 {
		return nil, api.Errorf(api.ErrInvalid, "the image has no layers")
	}
	for _, d := range cf.RootFS.DiffIDs {
		if !digestRE.MatchString(d.String()) {
			return nil, api.Errorf(api.ErrInvalid, "the image's config names layer %q: sbx takes sha256 digests", d.String())
		}
	}
	return cf, nil
}

// imageDefaults are the template defaults an image's config gives.
func imageDefaults(cf *v1.ConfigFile) api.TemplateDefaults {
	c := cf.Config
	return api.TemplateDefaults{User: c.User, Env: c.Env, WorkDir: c.WorkingDir, Entrypoint: c.Entrypoint, Cmd: c.Cmd}
}
