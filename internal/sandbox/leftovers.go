package sandbox

import (
	"context"
	"os"
	"path/filepath"
	"strings"

	"sbx.dev/sbx/internal/cgroup"
)

// removeLeftovers removes what no record names: a crash at any instant may
// leave a runsc sandbox, namespace, cgroup or directory that the journal
// did not know of yet (made just before its record, or just after the
// record went). It runs at start, after the journal and the sandboxes are
// reconciled, before any freeze is settled and before sbxd serves, so
// nothing should be made meanwhile. Even so, the directories are listed
// before the records are read: what is made in between (its record or
// journal entry first, then its directory) is not listed, so not removed.
func (m *Manager) removeLeftovers(ctx context.Context) error {
	dirs := []string{m.sandboxesDir(), m.freezes.freezeRoot(), m.images.root, m.storage.disksDir()}
	listed := make([][]os.DirEntry, len(dirs))
	for i, dir := range dirs {
		listed[i], _ = os.ReadDir(dir)
	}
	sbs, err := m.cfg.Store.Sandboxes(ctx)
	if err != nil {
		return err
	}
	known := map[string]bool{}
	disks := map[string]bool{}
	images := map[string]bool{}
	for _, sb := range sbs {
		known[sb.ID] = true
		disks[sb.Disk] = true
		images[sb.Image] = true
		images[sb.PagesImage] = true // a memory fork's, read by runsc
	}
	sns, err := m.cfg.Store.Snapshots(ctx, "")
	if err != nil {
		return err
	}
	for _, sn := range sns {
		images[sn.ID] = true
		disks[sn.Disk] = true
	}
	ims, err := m.cfg.Store.Images(ctx)
	if err != nil {
		return err
	}
	for _, im := range ims {
		images[im.ID] = true
	}
	ins, err := m.cfg.Store.Intents(ctx)
	if err != nil {
		return err
	}
	for _, in := range ins {
		images[in.ID] = true
	}
	testHookLeftoversRead()
	// runsc sandboxes, with their processes and cgroups
	if sts, err := m.cfg.Runtime.List(ctx); err == nil {
		for _, st := range sts {
			id := st.ID
			if !known[id] && strings.HasPrefix(id, "sb_") {
				m.log.Info("removing a runsc sandbox no record names", "sandbox", id)
				if err := m.destroyRuntimeKeepNetwork(ctx, id); err != nil {
					m.log.Warn("remove a leftover runsc sandbox", "sandbox", id, "err", err)
				}
			}
		}
	}
	for _, id := range m.cgroupIDs() {
		if !known[id] {
			if err := m.killCgroup(id); err == nil {
				m.removeCgroups(id)
			}
		}
	}
	if ids, err := m.cfg.Networks.List(); err == nil {
		for _, id := range ids {
			if !known[id] {
				m.log.Info("removing a network no record names", "sandbox", id)
				if err := m.cfg.Networks.Delete(id); err != nil {
					m.log.Warn("remove a leftover network", "sandbox", id, "err", err)
				}
			}
		}
	}
	keep := []func(name string) bool{
		func(name string) bool { return known[name] },
		func(name string) bool { return known[name] },
		func(name string) bool { return images[name] },
		func(name string) bool { return disks[filepath.Join(m.storage.disksDir(), name)] },
	}
	for i, dir := range dirs {
		removeUnnamed(dir, listed[i], keep[i])
	}
	return nil
}

// testHookLeftoversRead runs once removeLeftovers has read the records
// (a unit test makes something meanwhile).
var testHookLeftoversRead = func() {}

// removeUnnamed removes the entries of dir, as listed before the records
// were read, that keep says nothing names.
func removeUnnamed(dir string, ents []os.DirEntry, keep func(name string) bool) {
	for _, e := range ents {
		if !keep(e.Name()) {
			_ = os.RemoveAll(filepath.Join(dir, e.Name()))
		}
	}
}

// cgroupIDs lists the sandboxes that have a cgroup of this daemon.
func (m *Manager) cgroupIDs() []string {
	var ids []string
	for _, name := range cgroup.Host.Group(cgroup.Parent(m.cfg.Tag)).Children() {
		if strings.HasPrefix(name, "sb_") {
			ids = append(ids, name)
		}
	}
	return ids
}
