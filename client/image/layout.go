package image

import (
	"archive/tar"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"strings"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"sbx.dev/sbx/api"
)

// maxMeta bounds what is read whole of an image: index.json, an index, a
// manifest, a config. Layers are streamed, and sbxd bounds them.
const maxMeta = 4 << 20

// openLayoutDir opens the OCI image layout in the directory p.
func openLayoutDir(p, ref string, o options) (*source, error) {
	fi, err := os.Stat(filepath.Join(p, "oci-layout"))
	if err != nil || !fi.Mode().IsRegular() {
		return nil, api.Errorf(api.ErrInvalid, "%s is not an OCI image layout: it has no oci-layout file", p)
	}
	return openLayout(OCILayout, p, p, ref, o)
}

// openOCIArchive unpacks the OCI archive p (a tar of a layout, gzipped or
// not) into a temporary directory and opens the layout there:
// go-containerregistry's layout reads a directory.
func openOCIArchive(p, shown, ref string, o options) (*source, error) {
	dir, err := os.MkdirTemp("", "sbx-import-*")
	if err != nil {
		return nil, err
	}
	cleanup := func() { os.RemoveAll(dir) }
	if err := unpackLayout(p, shown, dir, o); err != nil {
		cleanup()
		return nil, err
	}
	return withCleanup(openLayout(OCIArchive, dir, shown, ref, o))(cleanup)
}

// layoutName matches the files of an OCI layout: its marker, its index and
// its blobs (blobs/ALGORITHM/ENCODED, as the image spec spells them). No
// name it matches can leave the directory.
var layoutName = regexp.MustCompile(`^(oci-layout|index\.json|blobs/[a-z0-9]+([+._-][a-z0-9]+)*/[a-zA-Z0-9=_-]+)$`)

// unpackLayout writes the regular files of the archive p that a layout
// holds into dir; anything else in it (directories, a docker save's
// manifest.json, links) is left out. As in any tar, a later entry of a name
// replaces an earlier one.
func unpackLayout(p, shown, dir string, o options) error {
	f, err := os.Open(p)
	if err != nil {
		return err
	}
	defer f.Close()
	in, gz, err := maybeGunzip(f, shown)
	if err != nil {
		return err
	}
	if gz {
		o.progress(api.Progress{Event: "progress", Message: "decompressing " + shown})
	}
	tr := tar.NewReader(in)
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return api.Errorf(api.ErrInvalid, "read archive %s: %v", shown, err)
		}
		n := path.Clean(strings.TrimPrefix(hdr.Name, "./"))
		if hdr.Typeflag != tar.TypeReg || !layoutName.MatchString(n) {
			continue
		}
		dst := filepath.Join(dir, filepath.FromSlash(n))
		if err := os.MkdirAll(filepath.Dir(dst), 0o700); err != nil {
			return err
		}
		out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
		if err != nil {
			return err
		}
		_, err = io.Copy(out, tr)
		if cerr := out.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return api.Errorf(api.ErrInvalid, "read archive %s: %s: %v", shown, n, err)
		}
	}
}

// openLayout picks the image of the layout in dir for the platform (and
// ref, the org.opencontainers.image.ref.name annotation, if given) with
// go-containerregistry's layout. shown is the source as the user named it.
func openLayout(kind, dir, shown, ref string, o options) (*source, error) {
	plat, err := o.platformOf()
	if err != nil {
		return nil, err
	}
	if err := small(dir, "index.json"); err != nil {
		return nil, api.Errorf(api.ErrInvalid, "%s %s: read index.json: %v", kind, shown, err)
	}
	ii, err := layout.ImageIndexFromPath(dir)
	if err != nil {
		return nil, api.Errorf(api.ErrInvalid, "%s %s: read index.json: %v", kind, shown, err)
	}
	var found []candidate
	var seen []string
	if err := walkIndex(dir, ii, ref, plat, 0, &found, &seen); err != nil {
		return nil, api.Errorf(api.ErrInvalid, "%s %s: %v", kind, shown, err)
	}
	switch {
	case len(found) == 0:
		return nil, api.Errorf(api.ErrInvalid, "%s %s holds no image for %s%s (it holds: %s)", kind, shown, plat, refNote(ref), strings.Join(seen, ", "))
	case len(found) > 1:
		return nil, api.Errorf(api.ErrInvalid, "%s %s holds %d images for %s (%s): name one as %s:PATH:REF", kind, shown, len(found), plat, strings.Join(seen, ", "), map[string]string{OCILayout: "oci", OCIArchive: "oci-archive"}[kind])
	}
	d := found[0].desc
	if err := small(dir, blobPath(d.Digest)); err != nil {
		return nil, api.Errorf(api.ErrInvalid, "%s %s: read manifest: %v", kind, shown, err)
	}
	img, err := found[0].index.Image(d.Digest)
	if err != nil {
		return nil, api.Errorf(api.ErrInvalid, "%s %s: %v", kind, shown, err)
	}
	m, err := img.Manifest()
	if err != nil {
		return nil, api.Errorf(api.ErrInvalid, "%s %s: read manifest: %v", kind, shown, err)
	}
	if err := small(dir, blobPath(m.Config.Digest)); err != nil {
		return nil, api.Errorf(api.ErrInvalid, "%s %s: read config: %v", kind, shown, err)
	}
	desc := map[string]string{OCILayout: "oci:", OCIArchive: "oci-archive:"}[kind] + shown
	if ref != "" {
		desc += ":" + ref
	}
	return &source{kind: kind, desc: desc, img: img, close: func() {}}, nil
}

func refNote(ref string) string {
	if ref == "" {
		return ""
	}
	return " named " + ref
}

// candidate is an image manifest of an index.
type candidate struct {
	index v1.ImageIndex
	desc  v1.Descriptor
}

// walkIndex collects the image manifests of an index (and of the indexes it
// names) that fit the platform and ref.
func walkIndex(dir string, ii v1.ImageIndex, ref string, plat *v1.Platform, depth int, found *[]candidate, seen *[]string) error {
	if depth > 4 {
		return errors.New("indexes nest too deep")
	}
	im, err := ii.IndexManifest()
	if err != nil {
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
			if err := small(dir, blobPath(d.Digest)); err != nil {
				return err
			}
			child, err := ii.ImageIndex(d.Digest)
			if err != nil {
				return err
			}
			if err := walkIndex(dir, child, "", plat, depth+1, found, seen); err != nil {
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
				*found = append(*found, candidate{index: ii, desc: d})
			}
		}
	}
	return nil
}

func blobPath(h v1.Hash) string { return path.Join("blobs", h.Algorithm, h.Hex) }

// small fails unless the file p of the layout in dir is at most maxMeta
// bytes: go-containerregistry reads it whole.
func small(dir, p string) error {
	fi, err := os.Stat(filepath.Join(dir, filepath.FromSlash(p)))
	if errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("there is no %s", p)
	}
	if err != nil {
		return err
	}
	if fi.Size() > maxMeta {
		return fmt.Errorf("%s is larger than %d bytes", p, maxMeta)
	}
	return nil
}
