package sandbox

import (
	"context"
	"errors"
	"fmt"
	"os"
	"syscall"
	"time"

	"sbx.dev/sbx/api"
	"sbx.dev/sbx/internal/procfs"
	"sbx.dev/sbx/internal/store"
)

// Delete removes a sandbox whatever its state: its runsc sandbox, network,
// files and record. Its events stay. Named snapshots stay unless
// withSnapshots; its freezes go (DeleteWith keeps them); its hibernation
// image becomes an orphan, swept later.
// The delete is journaled: once it has begun, a crash of sbxd does not
// leave half a sandbox, the restart finishes it.
func (m *Manager) Delete(ctx context.Context, ref string, withSnapshots bool) (*api.DeleteResult, error) {
	return m.DeleteWith(ctx, ref, DeleteOptions{WithSnapshots: withSnapshots})
}

// DeleteWith is Delete with its options (storage.go).
func (m *Manager) DeleteWith(ctx context.Context, ref string, o DeleteOptions) (*api.DeleteResult, error) {
	sb, err := m.cfg.Store.Sandbox(ctx, ref)
	if err != nil {
		return nil, err
	}
	unlock, err := m.claim(ctx, sb.ID, kindDelete)
	if err != nil {
		return nil, err
	}
	defer unlock()
	return m.deleteLocked(context.WithoutCancel(ctx), sb.ID, o, nil)
}

// deleteLocked deletes sandbox id, which the caller claims, with an
// extra event (the reaper's) recorded in the same transaction as the
// record's removal.
func (m *Manager) deleteLocked(ctx context.Context, id string, o DeleteOptions, extra *store.Event) (*api.DeleteResult, error) {
	if _, err := m.cfg.Store.Sandbox(ctx, id); err != nil {
		return nil, err // deleted meanwhile
	}
	c, err := m.journal.beginOp(ctx, kindDelete, id, map[string]any{"withSnapshots": o.WithSnapshots, "keepFreezes": o.KeepFreezes})
	if err != nil {
		return nil, err
	}
	defer c.end()
	m.freezes.noteSlot(ctx, id) // a freeze done by now is kept
	if err := m.destroyRuntime(ctx, id); err != nil {
		// The sandbox may still be there: keep its record, say why.
		c.abandon(ctx)
		reason := "delete failed: " + err.Error() + "; delete it again"
		_ = m.move(ctx, id, moveDeleteFailed, store.Change{Reason: reason})
		return nil, fmt.Errorf("delete %s: %w", id, err)
	}
	return m.finishDelete(ctx, c, id, o.WithSnapshots, extra)
}

// finishDelete removes what is left of a sandbox whose runtime is gone: its
// files and, in one transaction, its record, its images' ownership, the
// journal entry and the "deleted" event; then its snapshots if asked.
func (m *Manager) finishDelete(ctx context.Context, c *inFlight, id string, withSnapshots bool, extra *store.Event) (*api.DeleteResult, error) {
	var disk, name, pages string
	if sb, err := m.cfg.Store.Sandbox(ctx, id); err == nil {
		disk, name, pages = sb.Disk, sb.Name, sb.PagesImage
		// a freeze it took is a named snapshot, which outlives it
		m.freezes.settleFreezesLocked(ctx, sb, false)
	}
	m.execs.table.forget(id)
	if err := os.RemoveAll(m.sandboxDir(id)); err != nil {
		return nil, fmt.Errorf("delete %s: %w", id, err)
	}
	if err := os.RemoveAll(m.freezes.freezeDir(id)); err != nil {
		return nil, fmt.Errorf("delete %s: %w", id, err)
	}
	res := &api.DeleteResult{ID: id}
	var sns []*store.Snapshot
	if withSnapshots {
		var err error
		if sns, err = m.cfg.Store.Snapshots(ctx, id); err != nil {
			return nil, err
		}
		for _, sn := range sns {
			res.Snapshots = append(res.Snapshots, sn.Name)
		}
	}
	// storage.go: its freezes go with it, unless kept
	fzs, err := m.storage.freezesGoing(ctx, c, id, sns)
	if err != nil {
		return nil, fmt.Errorf("delete %s: %w", id, err)
	}
	err = m.cfg.Store.Update(ctx, func(tx *store.Store) error {
		if extra != nil {
			if err := tx.AddEvent(ctx, id, extra.Type, extra.Detail); err != nil {
				return err
			}
		}
		if err := tx.DeleteSandbox(ctx, id); err != nil {
			return err
		}
		if err := tx.OrphanImages(ctx, id, m.now()); err != nil {
			return err
		}
		if err := c.closeIn(ctx, tx); err != nil {
			return err
		}
		removed := res.Snapshots
		if removed == nil {
			removed = []string{} // none, not null
		}
		detail := map[string]any{"snapshotsRemoved": removed}
		if name != "" {
			detail["name"] = name // its events are found by the name it had
		}
		return tx.AddEvent(ctx, id, "deleted", detail)
	})
	if err != nil {
		return nil, fmt.Errorf("delete %s: %w", id, err)
	}
	// the followers of its execs' output look again: their execs are gone
	// now (woken before, by forget, they found them still recorded)
	m.execs.table.broadcast()
	m.storage.releaseDisk(ctx, disk)
	if pages != "" {
		m.sweepSoon(0) // the fork's image it read may be read by none now
	}
	defer m.TemplateChanged(ctx) // its template version may be held by nothing now
	for _, sn := range sns {
		if err := m.deleteSnapshot(ctx, sn); err != nil {
			return res, fmt.Errorf("delete %s: snapshot %s: %w", id, sn.Name, err)
		}
	}
	// storage.go: removed after the record, as its named snapshots are
	if err := m.storage.removeFreezes(ctx, id, res, fzs); err != nil {
		return res, err
	}
	return res, nil
}

// destroy removes everything of a sandbox whose creation is being undone:
// its runtime, files, disk and record. Each step tolerates a missing part.
func (m *Manager) destroy(ctx context.Context, id string) error {
	var disk string
	if sb, err := m.cfg.Store.Sandbox(ctx, id); err == nil {
		disk = sb.Disk
	}
	if err := m.destroyRuntime(ctx, id); err != nil {
		// Keep the record and files: the sandbox may still be there.
		return err
	}
	m.execs.table.forget(id)
	if err := os.RemoveAll(m.sandboxDir(id)); err != nil {
		return err
	}
	if err := os.RemoveAll(m.freezes.freezeDir(id)); err != nil {
		return err
	}
	if err := m.cfg.Store.DeleteSandbox(ctx, id); err != nil {
		return err
	}
	m.storage.releaseDisk(ctx, disk)
	return nil
}

// destroyRuntime removes a sandbox's runsc sandbox, whatever processes of
// it are left (a runsc killed half-way leaves some), its cgroups and its
// network. Each step tolerates a missing part.
func (m *Manager) destroyRuntime(ctx context.Context, id string) error {
	m.unwatch(id)
	defer m.previews.closeAll(id)
	err := m.cfg.Runtime.Delete(ctx, id)
	kerr := m.killCgroup(id)
	m.monitors.stop(id)
	if err != nil && kerr == nil {
		// with nothing of it left running, a delete that failed half-way
		// (a runsc killed during the last one) completes
		err = m.cfg.Runtime.Delete(ctx, id)
	}
	m.removeCgroups(id)
	if nerr := m.cfg.Networks.Delete(id); nerr != nil {
		err = errors.Join(err, fmt.Errorf("network: %w", nerr))
	}
	return errors.Join(err, kerr)
}

// killCgroup kills every process left in a sandbox's cgroups (runsc puts
// the sandbox and its gofer there) and waits, bounded, until they are gone.
func (m *Manager) killCgroup(id string) error {
	deadline := time.Now().Add(10 * time.Second)
	for {
		pids := m.cgroupPids(id)
		if len(pids) == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("processes %v of sandbox %s survive SIGKILL", pids, id)
		}
		for _, pid := range pids {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func (m *Manager) cgroupEmpty(id string) bool { return len(m.cgroupPids(id)) == 0 }

// cgroupPids lists the live processes in a sandbox's cgroups (zombies,
// which a SIGKILL cannot end and whose parent reaps them, are left out).
func (m *Manager) cgroupPids(id string) []int {
	var pids []int
	for _, pid := range m.cgroupOf(id).Pids() {
		if !zombie(pid) {
			pids = append(pids, pid)
		}
	}
	return pids
}

func zombie(pid int) bool {
	st, err := procfs.ReadStat(pid)
	return err != nil || st.Gone() // not there: gone
}
