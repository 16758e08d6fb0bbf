package runsc

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"sbx.dev/sbx/internal/wire/agentwire"
)

// A checkpoint's state file (checkpoint.img) starts with runsc's magic, an
// 8-byte big-endian length and that many bytes of JSON metadata, which
// holds the specs the sandbox was checkpointed with
// (gvisor.dev/gvisor/pkg/state/statefile).
const (
	stateFile        = "checkpoint.img"
	stateMagic       = "\x67\x56\x69\x73\x6f\x72\x53\x46"
	specsMetadataKey = "container_specs"
	// maxStateMetadata bounds what is read of an image's metadata (runsc's
	// own limit is 16 MiB; the specs of one container take a few KiB).
	maxStateMetadata = 4 << 20
)

// keepImageCapabilities makes the bundle's capabilities those the image
// was taken with, when they differ: runsc refuses to restore an image into
// a spec whose capabilities changed, and images taken before defaultCaps
// was narrowed must still restore. Capabilities outside legacyCaps are
// never taken from an image. The restored processes keep the capabilities
// they had in any case; the spec's only have to agree.
//
// Rlimits too, and mounts: runsc refuses a restore whose mounts (by destination, type
// and options) differ from the image's, so the bundle gets the image's
// mounts, each with this sandbox's source (sbx's mounts have changed over
// time: /run/sbx appeared, /etc's files stopped being bound).
func keepImageCapabilities(bundle, imageDir string) error {
	if err := CheckImageSpec(imageDir); err != nil {
		return err
	}
	old, err := imageSpec(imageDir)
	if err != nil || old == nil || old.Process == nil {
		// no readable metadata: let runsc judge the image
		return nil
	}
	caps := old.Process.Capabilities
	path := filepath.Join(bundle, "config.json")
	b, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	var spec specs.Spec
	if err := json.Unmarshal(b, &spec); err != nil {
		return fmt.Errorf("bundle %s: %w", bundle, err)
	}
	changed := false
	if spec.Process != nil && caps != nil && !sameCaps(spec.Process.Capabilities, caps) {
		spec.Process.Capabilities = caps
		changed = true
	}
	if spec.Process != nil && !reflect.DeepEqual(spec.Process.Rlimits, old.Process.Rlimits) {
		// the limits of every process are part of what runsc compares
		// (sbx's soft limit on open files went from 1<<20 to 1024); the
		// restored processes keep their own limits in any case
		spec.Process.Rlimits = old.Process.Rlimits
		changed = true
	}
	if mounts, ok := fitMounts(old.Mounts, spec.Mounts); ok {
		spec.Mounts = mounts
		changed = true
	}
	if !changed {
		return nil
	}
	b, err = json.MarshalIndent(&spec, "", "  ")
	if err != nil {
		return err
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

// CheckImageSpec holds the specs an image's checkpoint was taken with to
// what a sandbox of sbx's has ever had, since a restore gives its bundle
// their capabilities, rlimits and mounts (keepImageCapabilities), and an
// image pulled from another node is that node's word: capabilities of
// legacyCaps; a mount where the bundle has one of the same kind, read-only
// where the bundle's is; any other a mount of no host files (tmpfs, proc:
// it keeps the image's source, which a bind would serve the sandbox) or a
// bind of an /etc file sbx once bound (given the sandbox's own). An image
// whose metadata this cannot read is runsc's to judge: its restore takes
// the bundle as sbx wrote it.
func CheckImageSpec(imageDir string) error {
	all, err := imageSpecs(imageDir)
	if err != nil {
		return nil
	}
	ours := map[string]specs.Mount{}
	for _, m := range Spec(SpecOptions{ChannelDir: "/"}).Mounts {
		ours[m.Destination] = m
	}
	for _, spec := range all {
		if spec == nil {
			continue
		}
		if p := spec.Process; p != nil && p.Capabilities != nil {
			caps := p.Capabilities
			for _, set := range [][]string{caps.Bounding, caps.Effective, caps.Permitted, caps.Inheritable, caps.Ambient} {
				for _, c := range set {
					if !slices.Contains(legacyCaps, c) {
						return fmt.Errorf("image %s asks for capability %s, which no sbx sandbox ever had", imageDir, c)
					}
				}
			}
		}
		for _, m := range spec.Mounts {
			if err := checkImageMount(m, ours); err != nil {
				return fmt.Errorf("image %s mounts %.64q (%.16q of %.64q): %w", imageDir, m.Destination, m.Type, m.Source, err)
			}
		}
	}
	return nil
}

// legacyEtc are the files sbx once bound into /etc (fitMounts binds the
// sandbox's own).
var legacyEtc = []string{"/etc/resolv.conf", "/etc/hosts", "/etc/hostname"}

func checkImageMount(m specs.Mount, ours map[string]specs.Mount) error {
	bind := isBind(m)
	if o, ok := ours[m.Destination]; ok {
		switch {
		case m.Type != o.Type || bind != isBind(o):
			return fmt.Errorf("a sandbox of sbx's has a %s mount there", o.Type)
		case slices.Contains(o.Options, "ro") && (!slices.Contains(m.Options, "ro") || slices.Contains(m.Options, "rw")):
			return errors.New("a sandbox of sbx's has it read-only")
		}
		return nil
	}
	switch {
	case bind && slices.Contains(legacyEtc, m.Destination):
		return nil
	case bind:
		return errors.New("a bind of the host's files no sandbox of sbx's has")
	case !slices.Contains([]string{"tmpfs", "proc", "sysfs", "devpts", "mqueue"}, m.Type):
		return errors.New("a kind of mount no sandbox of sbx's has")
	}
	return nil
}

// isBind reports whether a mount serves host files (its source), as runsc
// takes it: a bind by its type or its options.
func isBind(m specs.Mount) bool {
	return m.Type == "bind" || slices.Contains(m.Options, "bind") || slices.Contains(m.Options, "rbind")
}

func sameCaps(a, b *specs.LinuxCapabilities) bool {
	if a == nil || b == nil {
		return a == b
	}
	return slices.Equal(a.Bounding, b.Bounding) && slices.Equal(a.Effective, b.Effective) &&
		slices.Equal(a.Permitted, b.Permitted) && slices.Equal(a.Inheritable, b.Inheritable) &&
		slices.Equal(a.Ambient, b.Ambient)
}

// fitMounts returns the image's mounts with the sources of the bundle's
// (a source may differ across a restore; the rest may not), and whether
// that changes the bundle's. The files sbx once bound into /etc come from
// the directory now bound at RunSbx/etc.
func fitMounts(image, bundle []specs.Mount) ([]specs.Mount, bool) {
	src := map[string]string{}
	for _, m := range bundle {
		src[m.Destination] = m.Source
	}
	out := make([]specs.Mount, 0, len(image))
	for _, m := range image {
		switch s, ok := src[m.Destination]; {
		case ok:
			m.Source = s
		case m.Destination == agentwire.ChannelDir:
			// an exec channel the bundle has none of: never the image's
			// source (the host directory of another sandbox, or anything a
			// pulled image names); runsc refuses the restore instead
			continue
		case strings.HasPrefix(m.Destination, "/etc/") && src[RunSbx+"/etc"] != "":
			m.Source = filepath.Join(src[RunSbx+"/etc"], filepath.Base(m.Destination))
		}
		out = append(out, m)
	}
	return out, !reflect.DeepEqual(out, bundle)
}

// imageCapabilities returns the capabilities of the first process of the
// container an image was taken of, or nil if the image does not say.
func imageCapabilities(imageDir string) (*specs.LinuxCapabilities, error) {
	spec, err := imageSpec(imageDir)
	if err != nil || spec == nil || spec.Process == nil {
		return nil, err
	}
	return spec.Process.Capabilities, nil
}

// imageSpec returns the spec of the container an image was taken of, or
// nil if the image does not say.
func imageSpec(imageDir string) (*specs.Spec, error) {
	all, err := imageSpecs(imageDir)
	if err != nil {
		return nil, err
	}
	// one container per sandbox
	ids := slices.Sorted(maps.Keys(all))
	for _, id := range ids {
		if spec := all[id]; spec != nil && spec.Process != nil {
			return spec, nil
		}
	}
	return nil, nil
}

// imageSpecs returns the specs of the containers an image was taken of,
// by container, or nil if the image does not say.
func imageSpecs(imageDir string) (map[string]*specs.Spec, error) {
	f, err := os.Open(filepath.Join(imageDir, stateFile))
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var head [len(stateMagic) + 8]byte
	if _, err := io.ReadFull(f, head[:]); err != nil {
		return nil, err
	}
	if string(head[:len(stateMagic)]) != stateMagic {
		return nil, errors.New("not a runsc state file")
	}
	n := binary.BigEndian.Uint64(head[len(stateMagic):])
	if n > maxStateMetadata {
		return nil, fmt.Errorf("state metadata of %d bytes is over %d", n, maxStateMetadata)
	}
	raw := make([]byte, n)
	if _, err := io.ReadFull(f, raw); err != nil {
		return nil, err
	}
	var meta map[string]string
	if err := json.Unmarshal(raw, &meta); err != nil {
		return nil, err
	}
	s, ok := meta[specsMetadataKey]
	if !ok {
		return nil, nil
	}
	var all map[string]*specs.Spec
	if err := json.Unmarshal([]byte(s), &all); err != nil {
		return nil, err
	}
	return all, nil
}
