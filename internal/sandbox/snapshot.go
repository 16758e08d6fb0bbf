package sandbox

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"sbx.dev/sbx/api"
	"sbx.dev/sbx/internal/runsc"
	"sbx.dev/sbx/internal/store"
)

// captureKind says what a capture writes and how durably.
type captureKind struct {
	memory bool
	// scratch images live only while a fork boots its children: no disk
	// tar beside a memory image (the checkpoint holds the disk too), and
	// no sync (a crash loses nothing anyone was promised).
	scratch bool
	// last: the sandbox is to end after the capture (a stop). It is paused
	// before its memory is written and left paused, so that nothing it does
	// after its image (a freeze from inside, above all) is lost with it.
	last bool
	// diskLimit is the sandbox's disk limit: its disk capture is bounded by
	// it, and must restore within it.
	diskLimit int64
}

// capture writes a running sandbox's disk, and with memory its processes
// and memory, into the image of a journaled capture (see beginCapture),
// stepping the journal as it goes, and leaves the sandbox running (paused,
// with kind.last). paused is
// how long the sandbox was paused. On any failure the partial image and the
// journal entry are removed and the sandbox is running again.
func (m *Manager) capture(ctx context.Context, c *inFlight, id string, kind captureKind) (size int64, paused time.Duration, err error) {
	img := c.img
	defer func() {
		if err != nil {
			if rerr := m.images.remove(img); rerr != nil {
				m.log.Error("remove a partial image", "image", img, "err", rerr)
			}
			m.ensureRunning(ctx, id)
			c.abandon(ctx)
		}
	}()
	rctx := c.watched(ctx)
	if !(kind.scratch && kind.memory) {
		max := maxDiskTar(kind.diskLimit)
		if err := m.cfg.Runtime.TarUpper(rctx, id, m.images.disk(img), max); err != nil {
			if errors.Is(err, runsc.ErrTarTooBig) {
				return 0, 0, api.Errorf(api.ErrConflict, "write disk: its tar passed %s, more than a disk limit of %s allows (the disk's files and %s of headers); nothing was kept: remove files from its disk and capture again", fmtBytes(max), fmtBytes(kind.diskLimit), fmtBytes(diskTarSlack(kind.diskLimit)))
			}
			return 0, 0, fmt.Errorf("write disk: %w", err)
		}
		// a disk capture that cannot be restored is never a success
		if err := checkDiskTar(m.images.disk(img), kind.diskLimit); err != nil {
			return 0, 0, err
		}
		c.step(ctx, stepDiskWritten)
	}
	if kind.memory {
		crashPoint(c.kind + ":writing-memory")
		start := time.Now()
		if kind.last {
			if err := m.cfg.Runtime.Pause(rctx, id); err != nil {
				return 0, 0, fmt.Errorf("pause: %w", err)
			}
		}
		err := m.cfg.Runtime.Checkpoint(runsc.WithTimeout(rctx, m.captureTimeout(id)), id, m.images.mem(img), true)
		paused = time.Since(start)
		m.execs.captured(id)
		if err != nil {
			return 0, 0, fmt.Errorf("write memory: %w", err)
		}
		if err := verifyCheckpoint(m.images.mem(img)); err != nil {
			return 0, 0, err
		}
		// its processes wake up on the agent they run now, not this
		// sbxd's of the day of the restore
		if err := noteImageAgent("", m.sandboxDir(id), m.images.dir(img)); err != nil {
			return 0, 0, fmt.Errorf("note the image's agent: %w", err)
		}
		c.step(ctx, stepMemoryWritten)
		m.pagesAllLoaded(ctx, id)
	}
	if size, err = m.images.complete(img, !kind.scratch); err != nil {
		return 0, 0, err
	}
	c.step(ctx, stepComplete)
	crashPoint(c.kind + ":after-sync")
	return size, paused, nil
}

// captureTimeout is how long a checkpoint of sandbox id may take: runsc's
// default for a call, and a second more for every 4 MiB the sandbox's
// cgroup holds (its memory and its files' page cache, more than the
// checkpoint writes), up to captureTimeoutMax. A checkpoint writes at
// hundreds of MB/s here, but a host whose disk is busy with another tenant
// has been seen writing 2-5 MB/s for minutes; a capture cut off by its
// timeout fails (nothing is lost, but nothing is kept), so a big sandbox
// is given the time a slow disk needs.
func (m *Manager) captureTimeout(id string) time.Duration {
	mem, _ := m.cgroupOf(id).MemoryCurrent()
	return captureTimeoutFor(mem)
}

// captureTimeoutMax bounds captureTimeout below the time a restarted sbxd
// waits for a capture it finds running (captureWaitLimit).
const captureTimeoutMax = 20 * time.Minute

func captureTimeoutFor(mem int64) time.Duration {
	const slowDisk = 4 << 20 // bytes a second
	d := runsc.DefaultTimeout + time.Duration(max(mem, 0)/slowDisk)*time.Second
	return min(d, captureTimeoutMax)
}

// verifyCheckpoint checks that runsc left a whole checkpoint: its state
// file and its pages, none of them empty.
func verifyCheckpoint(dir string) error {
	for _, f := range []string{"checkpoint.img", "pages_meta.img", "pages.img"} {
		fi, err := os.Stat(filepath.Join(dir, f))
		if err != nil {
			return fmt.Errorf("verify image: %w", err)
		}
		if fi.Size() == 0 && f == "checkpoint.img" {
			return fmt.Errorf("verify image: %s is empty", f)
		}
	}
	return nil
}

// ensureRunning resumes a sandbox a failed capture left paused.
func (m *Manager) ensureRunning(ctx context.Context, id string) {
	st, err := m.cfg.Runtime.State(ctx, id)
	if err != nil || st.Status != runsc.StatusPaused {
		return
	}
	if err := m.cfg.Runtime.Resume(ctx, id); err != nil {
		m.log.Error("resume a sandbox after a failed capture", "sandbox", id, "err", err)
	}
}

// captureEvent records a capture's start, end, duration, size and outcome.
func (m *Manager) captureEvent(ctx context.Context, id, typ string, start time.Time, size int64, err error, extra map[string]any) {
	end := m.now()
	d := map[string]any{
		"start": start.UTC().Format(time.RFC3339Nano), "end": end.UTC().Format(time.RFC3339Nano),
		"durationMs": end.Sub(start).Milliseconds(), "sizeBytes": size, "outcome": "ok",
	}
	if err != nil {
		d["outcome"], d["error"] = "error", err.Error()
	}
	for k, v := range extra {
		d[k] = v
	}
	m.event(ctx, id, typ, d)
	m.metrics.observeCapture(typ, end.Sub(start), err)
}

// Snapshot saves a running sandbox's disk, and with req.Memory its
// processes and memory, under a unique name. The sandbox keeps running (with
// memory it is paused while the memory is written). A taken name is
// api.ErrConflict; a sandbox that is not running, api.ErrConflict saying why.
func (m *Manager) Snapshot(ctx context.Context, ref string, req api.SnapshotRequest) (*api.Snapshot, error) {
	if err := ValidName(req.Name); err != nil {
		return nil, err
	}
	if taken, err := m.cfg.Store.SnapshotNameTaken(ctx, req.Name); err != nil {
		return nil, err
	} else if taken {
		return nil, api.Errorf(api.ErrConflict, "snapshot name %q is taken", req.Name)
	}
	sb, err := m.running(ctx, ref)
	if err != nil {
		return nil, err
	}
	unlock, err := m.claim(ctx, sb.ID, kindSnapshot)
	if err != nil {
		return nil, err
	}
	defer unlock()
	ctx = context.WithoutCancel(ctx)
	if sb, err = m.running(ctx, sb.ID); err != nil {
		return nil, err
	}
	start := m.now()
	c, err := m.journal.beginCapture(ctx, "snapshot", sb.ID, req.Memory, map[string]any{"name": req.Name})
	if err != nil {
		return nil, err
	}
	defer c.end()
	size, paused, err := m.capture(ctx, c, sb.ID, captureKind{memory: req.Memory, diskLimit: sb.DiskLimit})
	img := c.img
	extra := map[string]any{"name": req.Name, "memory": req.Memory, "pausedMs": paused.Milliseconds()}
	if err != nil {
		m.captureEvent(ctx, sb.ID, "snapshot", start, 0, err, extra)
		return nil, fmt.Errorf("snapshot %s: %w", sb.ID, err)
	}
	sn := m.snapshotRecord(sb, req.Name, img, req.Memory, size, paused)
	err = m.cfg.Store.Update(ctx, func(tx *store.Store) error {
		if err := tx.CreateSnapshot(ctx, sn); err != nil {
			return err
		}
		return c.closeIn(ctx, tx)
	})
	if err != nil {
		_ = m.images.remove(img)
		c.abandon(ctx)
		m.captureEvent(ctx, sb.ID, "snapshot", start, 0, err, extra)
		return nil, err
	}
	m.touch(ctx, sb.ID)
	m.captureEvent(ctx, sb.ID, "snapshot", start, size, nil, extra)
	return m.snapshotAPI(sn), nil
}

// snapshotRecord is the record of a snapshot of sb in image img.
func (m *Manager) snapshotRecord(sb *store.Sandbox, name, img string, memory bool, size int64, paused time.Duration) *store.Snapshot {
	return &store.Snapshot{
		Name: name, ID: img, SandboxID: sb.ID, Template: sb.Template, Memory: memory,
		CPUs: sb.CPUs, MemLimit: sb.Memory, CreatedAt: m.now(), Size: size, Paused: paused,
		Disk: sb.Disk, TemplateVersion: sb.TemplateVersion, Pids: sb.Pids, DiskLimit: sb.DiskLimit,
	}
}

func (m *Manager) snapshotAPI(sn *store.Snapshot) *api.Snapshot {
	a := &api.Snapshot{
		Name: sn.Name, ID: sn.ID, SandboxID: sn.SandboxID, Template: sn.Template,
		Memory: sn.Memory, CreatedAt: sn.CreatedAt, Size: sn.Size, Kept: sn.Kept, Node: m.cfg.Node, Ref: sn.Ref, RefPending: sn.RefPending,
	}
	if sn.Memory {
		a.Paused = api.DurationOf(sn.Paused.Round(time.Millisecond))
	}
	return a
}

// Snapshots lists every snapshot.
func (m *Manager) Snapshots(ctx context.Context) ([]api.Snapshot, error) {
	sns, err := m.cfg.Store.Snapshots(ctx, "")
	if err != nil {
		return nil, err
	}
	out := make([]api.Snapshot, 0, len(sns))
	for _, sn := range sns {
		out = append(out, *m.snapshotAPI(sn))
	}
	return out, nil
}

// GetSnapshot returns one snapshot (api.ErrNotFound if none).
func (m *Manager) GetSnapshot(ctx context.Context, name string) (*api.Snapshot, error) {
	sn, err := m.cfg.Store.Snapshot(ctx, name)
	if err != nil {
		return nil, err
	}
	return m.snapshotAPI(sn), nil
}

// DeleteSnapshot removes a snapshot and its image. Sandboxes made from it
// are not affected.
func (m *Manager) DeleteSnapshot(ctx context.Context, name string) error {
	sn, err := m.cfg.Store.Snapshot(ctx, name)
	if err != nil {
		return err
	}
	return m.deleteSnapshot(context.WithoutCancel(ctx), sn)
}

func (m *Manager) deleteSnapshot(ctx context.Context, sn *store.Snapshot) error {
	// The record goes first: a snapshot is never listed without its image.
	if err := m.cfg.Store.DeleteSnapshot(ctx, sn.Name); err != nil {
		return err
	}
	m.storage.releaseDisk(ctx, sn.Disk)
	m.TemplateChanged(ctx)
	return m.images.remove(sn.ID)
}
