package sandbox

import (
	"cmp"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"
)

// keepAgents is how many agent builds sbxd keeps besides the current one
// and those its sandboxes, images and freeze slots name: a node of a fleet
// in a rolling upgrade restores memory moved from nodes still on the
// release before (placement sends it only where its build is).
const keepAgents = 2

// collectAgents removes the agent directories (DATA_DIR/agent/v/KEY) that
// nothing here needs any more: not the current build, not one a sandbox
// booted on (its note), a memory image was captured with (AGENT) or a
// freeze slot was armed for (slot.json), and not among the keepAgents
// newest others. It runs at start, once leftovers are gone and before
// anything is captured, pulled or booted: nothing names a build between
// its look and its removal. A directory it cannot read stops it: a
// reference it could not see would be a build removed under an image.
// Damaged builds set aside (.damaged-N) are kept: a running sandbox may
// mount one.
func (m *Manager) collectAgents() error {
	named := map[string]bool{m.agentKey: true}
	noteFile := func(p string) error {
		b, err := os.ReadFile(p)
		if errors.Is(err, fs.ErrNotExist) {
			return nil
		}
		if err != nil {
			return err
		}
		if k := strings.TrimSpace(string(b)); validAgentKey(k) {
			named[k] = true
		}
		return nil
	}
	each := func(root string, visit func(dir string) error) error {
		ents, err := os.ReadDir(root)
		if errors.Is(err, fs.ErrNotExist) {
			return nil
		}
		if err != nil {
			return err
		}
		for _, e := range ents {
			if e.IsDir() {
				if err := visit(filepath.Join(root, e.Name())); err != nil {
					return err
				}
			}
		}
		return nil
	}
	err := errors.Join(
		each(m.sandboxesDir(), func(d string) error { return noteFile(filepath.Join(d, sandboxAgentFile)) }),
		each(m.images.root, func(d string) error { return noteFile(filepath.Join(d, imageAgentFile)) }),
		each(m.freezes.freezeRoot(), func(sb string) error {
			return each(sb, func(slot string) error {
				if _, err := os.Stat(filepath.Join(slot, slotMetaFile)); err != nil && !errors.Is(err, fs.ErrNotExist) {
					return err
				}
				if k := readSlotMeta(slot).Agent; validAgentKey(k) {
					named[k] = true
				}
				return nil
			})
		}),
	)
	if err != nil {
		return err
	}
	versions := filepath.Join(m.agentRoot(), "v")
	ents, err := os.ReadDir(versions)
	if err != nil {
		return err
	}
	type build struct {
		key string
		at  time.Time
	}
	// what a removal cut short left, before a build of its name goes aside again
	if err := removeGone(versions); err != nil {
		return err
	}
	var spare []build
	for _, e := range ents {
		k := e.Name()
		if !validAgentKey(k) || k == agentLegacy || named[k] {
			continue
		}
		var at time.Time
		if fi, err := os.Stat(filepath.Join(versions, k, agentComplete)); err == nil {
			at = fi.ModTime()
		}
		spare = append(spare, build{k, at})
	}
	slices.SortFunc(spare, func(a, b build) int { return cmp.Or(b.at.Compare(a.at), strings.Compare(a.key, b.key)) })
	// each goes aside first, under a name no key has, then away: a
	// removal cut short leaves no directory that looks whole and is not,
	// and the next start finishes it
	for _, b := range spare[min(keepAgents, len(spare)):] {
		if err := os.Rename(filepath.Join(versions, b.key), filepath.Join(versions, b.key+agentGoneSuffix)); err != nil {
			return err
		}
		m.log.Info("removing an agent build nothing here runs or was captured with", "agent", b.key)
	}
	return removeGone(versions)
}

// removeGone removes the agent directories set aside under versions.
func removeGone(versions string) error {
	gone, _ := filepath.Glob(filepath.Join(versions, "*"+agentGoneSuffix))
	for _, d := range gone {
		if err := os.RemoveAll(d); err != nil {
			return err
		}
	}
	return nil
}

// agentGoneSuffix marks an agent directory being removed.
const agentGoneSuffix = ".gone"
