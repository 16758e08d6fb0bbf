package sandbox

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"math"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"time"

	"sbx.dev/sbx/api"
	"sbx.dev/sbx/internal/cgroup"
	"sbx.dev/sbx/internal/store"
)

// What sbxd stores is bounded (issue 22): freezes by their sandbox's
// quota (quota.go), everything together by --storage-max, orphans by
// --orphan-max. `sbx df` shows what uses the data dir (Storage), `sbx
// prune` reclaims it (Prune). Freezes belong to their sandbox: a delete
// takes them, unless asked to keep them or they were promoted (Keep).

// storageOwner owns the storage budget: what the data dir holds and what
// may be added to it (--storage-max), the orphan images (--orphan-max) and
// each sandbox's freezes (their quota, quota.go), `sbx df` and `sbx
// prune`, and the sandboxes' disks (disks.go). It holds no lock: its state
// is what sbxd was started with; it sees the rest of the manager only
// through storageHost.
type storageOwner struct {
	host       storageHost
	log        *slog.Logger
	dataDir    string
	storageMax int64       // --storage-max (0: no bound)
	orphanMax  int64       // --orphan-max (0: no bound)
	quota      FreezeQuota // each sandbox's freezes (quota.go)
	images     imageFiles  // the images' files, to look in and to remove
}

// storageHost is what the storage owner needs of the rest of the manager.
type storageHost interface {
	// what the store records: sandboxes, snapshots, images, intents, disks
	Sandboxes(ctx context.Context) ([]*store.Sandbox, error)
	Snapshots(ctx context.Context, sandboxID string) ([]*store.Snapshot, error)
	KeepSnapshot(ctx context.Context, name string) error
	Images(ctx context.Context) ([]*store.Image, error)
	DeleteImage(ctx context.Context, id string) error
	Intents(ctx context.Context) ([]*store.Intent, error)
	DiskInUse(ctx context.Context, disk string) (bool, error)
	// a snapshot as the API shows it, and its delete with its image and
	// disk (snapshot.go)
	GetSnapshot(ctx context.Context, name string) (*api.Snapshot, error)
	deleteSnapshot(ctx context.Context, sn *store.Snapshot) error
	// a template version, for when it was made
	templateVersion(version string) (api.Template, error)
	// room on the data dir's disk for any new work (limits.go)
	checkRoom(what string) error
	// what a capture of a running sandbox may write: its overlay's upper
	// layer, the files its runsc process holds open there, its memory,
	// and a memory fork's pages still in its parent's image
	Sandbox(ctx context.Context, ref string) (*store.Sandbox, error)
	sandboxDir(id string) string
	sandboxPid(id string) (int, bool)
	cgroupOf(id string) cgroup.Group
	// a sandbox's freeze slots, which count as its own (freeze.go)
	freezeDir(id string) string
	// the image sweep, to look again once a delete took freezes (sweep.go)
	sweepSoon(d time.Duration)
	event(ctx context.Context, id, typ string, detail map[string]any)
	now() time.Time
}

// storageHost, as the manager gives it.
type managerStorageHost struct {
	*store.Store
	m *Manager
}

func (h managerStorageHost) checkRoom(what string) error     { return h.m.checkRoom(what) }
func (h managerStorageHost) sandboxDir(id string) string     { return h.m.sandboxDir(id) }
func (h managerStorageHost) cgroupOf(id string) cgroup.Group { return h.m.cgroupOf(id) }
func (h managerStorageHost) sandboxPid(id string) (int, bool) {
	w, ok := h.m.watcher.get(id)
	return w.Pid, ok
}
func (h managerStorageHost) GetSnapshot(ctx context.Context, name string) (*api.Snapshot, error) {
	return h.m.GetSnapshot(ctx, name)
}
func (h managerStorageHost) deleteSnapshot(ctx context.Context, sn *store.Snapshot) error {
	return h.m.deleteSnapshot(ctx, sn)
}
func (h managerStorageHost) templateVersion(version string) (api.Template, error) {
	return h.m.cfg.Templates.Version(version)
}
func (h managerStorageHost) freezeDir(id string) string { return h.m.freezes.freezeDir(id) }
func (h managerStorageHost) sweepSoon(d time.Duration)  { h.m.sweepSoon(d) }
func (h managerStorageHost) event(ctx context.Context, id, typ string, detail map[string]any) {
	h.m.event(ctx, id, typ, detail)
}
func (h managerStorageHost) now() time.Time { return h.m.now() }

// The facade: what server calls, and what freeze.go asks.

// Keep: see storageOwner.keep.
func (m *Manager) Keep(ctx context.Context, name string) (*api.Snapshot, error) {
	return m.storage.keep(ctx, name)
}

// Storage: see storageOwner.usage.
func (m *Manager) Storage(ctx context.Context) (*api.Storage, error) { return m.storage.usage(ctx) }

// Prune: see storageOwner.prune.
func (m *Manager) Prune(ctx context.Context, req api.PruneRequest) (*api.PruneResult, error) {
	return m.storage.prune(ctx, req)
}

// DeleteOptions say what a delete takes besides the sandbox.
type DeleteOptions = api.DeleteOptions

// untrackedGrace is how long an image dir no record names is left alone:
// a capture makes its dir a moment before it journals it.
const untrackedGrace = 10 * time.Minute

// flag reads a boolean of the operation's journal entry.
func (c *inFlight) flag(k string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	v, _ := c.detail[k].(bool)
	return v
}

// freezesGoing returns the freezes of sandbox id that go with it: those not
// promoted, and not in sns already. With keepFreezes in the delete's
// journal entry none go, and every freeze of it is marked kept.
func (s *storageOwner) freezesGoing(ctx context.Context, c *inFlight, id string, sns []*store.Snapshot) ([]*store.Snapshot, error) {
	fzs, err := s.freezesOf(ctx, id)
	if err != nil {
		return nil, err
	}
	if c.flag("keepFreezes") {
		for _, sn := range fzs {
			if err := s.host.KeepSnapshot(ctx, sn.Name); err != nil {
				return nil, err
			}
		}
		return nil, nil
	}
	going := map[string]bool{}
	for _, sn := range sns {
		going[sn.Name] = true
	}
	var out []*store.Snapshot
	for _, sn := range fzs {
		if !sn.Kept && !going[sn.Name] {
			out = append(out, sn)
		}
	}
	return out, nil
}

// removeFreezes removes the freezes of deleted sandbox id, naming them in
// res, and has the sweep look at what the delete orphaned.
func (s *storageOwner) removeFreezes(ctx context.Context, id string, res *api.DeleteResult, fzs []*store.Snapshot) error {
	defer s.host.sweepSoon(0)
	for _, sn := range fzs {
		if err := s.host.deleteSnapshot(ctx, sn); err != nil {
			return fmt.Errorf("delete %s: freeze %s: %w", id, sn.Name, err)
		}
		res.Freezes = append(res.Freezes, sn.Name)
	}
	return nil
}

// keep promotes snapshot name (a freeze, above all): it outlives its
// sandbox, counts in no freeze quota, and `sbx prune --freezes` leaves it.
// An unknown name is api.ErrNotFound.
func (s *storageOwner) keep(ctx context.Context, name string) (*api.Snapshot, error) {
	if err := s.host.KeepSnapshot(ctx, name); err != nil {
		return nil, err
	}
	return s.host.GetSnapshot(ctx, name)
}

// du counts the blocks of files on the host, each inode once.
type du struct{ seen map[[2]uint64]bool }

func newDU() *du { return &du{seen: map[[2]uint64]bool{}} }

// of is the bytes under p not counted before.
func (u *du) of(p string) int64 {
	var total int64
	_ = filepath.WalkDir(p, func(_ string, d fs.DirEntry, err error) error {
		if err != nil {
			return nil
		}
		fi, err := d.Info()
		if err != nil {
			return nil
		}
		if st, ok := fi.Sys().(*syscall.Stat_t); ok {
			k := [2]uint64{uint64(st.Dev), st.Ino}
			if u.seen[k] {
				return nil
			}
			u.seen[k] = true
		}
		total += allocated(fi)
		return nil
	})
	return total
}

// dataDirBytes is what the data dir holds on the host, its template store
// too (which may be a link to a directory elsewhere).
func (s *storageOwner) dataDirBytes() int64 {
	u := newDU()
	return u.of(s.templatesDir()+"/") + u.of(s.dataDir)
}

func (s *storageOwner) templatesDir() string { return filepath.Join(s.dataDir, "templates") }

// freeBytes is what the data dir's file system has free (-1: unknown).
func (s *storageOwner) freeBytes() int64 {
	var fs syscall.Statfs_t
	if err := syscall.Statfs(s.dataDir, &fs); err != nil {
		return -1
	}
	return int64(fs.Bavail) * fs.Bsize
}

// allows refuses, with an api.ErrConflict saying what to do, work
// that would take the data dir past --storage-max: need is what it may
// write (0 for what is written already, a freeze).
func (s *storageOwner) allows(ctx context.Context, what string, need int64) error {
	if s.storageMax <= 0 {
		return nil
	}
	used := s.dataDirBytes()
	if used+need <= s.storageMax {
		return nil
	}
	const todo = "`sbx df` shows what uses it; free some with `sbx prune --orphans --freezes`, `sbx snapshot rm` or `sbx delete`"
	if need == 0 {
		return api.Errorf(api.ErrConflict, "%s: sbxd's storage budget is full: its data dir holds %s, more than sbxd --storage-max %s; it is not kept: %s", what, fmtBytes(used), fmtBytes(s.storageMax), todo)
	}
	return api.Errorf(api.ErrConflict, "%s: sbxd's storage budget is full: its data dir holds %s of sbxd --storage-max %s, and this capture may write up to %s more; nothing was captured and the sandbox runs on: %s", what, fmtBytes(used), fmtBytes(s.storageMax), fmtBytes(need), todo)
}

// expectedCapture is what a capture of running sandbox id may write: its
// disk's changes (the blocks its overlay's file store holds), and with
// memory what its memory cgroup holds, and the pages a memory fork has not
// loaded yet (unloaded).
func (s *storageOwner) expectedCapture(id string, memory bool, unloaded int64) int64 {
	upper := filepath.Join(s.host.sandboxDir(id), "upper")
	n := diskUsage(upper)
	if pid, ok := s.host.sandboxPid(id); ok {
		n += openUnder(pid, upper)
	}
	if memory {
		if b, ok := s.host.cgroupOf(id).MemoryCurrent(); ok {
			n += b
		}
		n += unloaded
	}
	return n
}

// unloadedPages bounds what memory fork id still reads from its parent's
// image (pages on demand, gVisor patch 10): a memory capture loads all of
// it first, into the fork's memory cgroup, and writes it. While the fork's
// runsc holds a file of that image open some pages are unloaded, how many
// sbxd cannot see: it counts the image's whole; once runsc closed it (every
// page loaded), none.
func (s *storageOwner) unloadedPages(ctx context.Context, id string) int64 {
	sb, err := s.host.Sandbox(ctx, id)
	if err != nil || sb.PagesImage == "" {
		return 0
	}
	pid, ok := s.host.sandboxPid(id)
	if !ok {
		return 0
	}
	return openUnder(pid, s.images.dir(sb.PagesImage))
}

// captureRoom is the check a capture (snapshot, stop, fork) makes before it
// starts: room on the data dir's disk for what it may write, as for any new
// work (checkRoom), and within --storage-max; and, with memory, room in a
// memory fork's memory limit for the pages the capture loads.
func (s *storageOwner) captureRoom(ctx context.Context, kind, id string, memory bool) error {
	if err := s.host.checkRoom(kind); err != nil {
		return err
	}
	var unloaded int64
	if memory {
		unloaded = s.unloadedPages(ctx, id)
	}
	if unloaded > 0 {
		g := s.host.cgroupOf(id)
		cur, ok1 := g.MemoryCurrent()
		limit, ok2 := g.MemoryMax()
		if ok1 && ok2 && limit < math.MaxInt64 && cur+unloaded > limit {
			return api.Errorf(api.ErrConflict, "%s of %s with its memory: it is a memory fork that still reads up to %s of its memory from its parent's image, and a capture loads all of it first: with the %s its memory cgroup holds, that may pass its memory limit of %s, and the kernel would stop it in the middle of the capture. Nothing was captured and the sandbox runs on: a snapshot or a fork without --memory keeps its disk, `sbx rm` ends it", kind, id, fmtBytes(unloaded), fmtBytes(cur), fmtBytes(limit))
		}
	}
	need := s.expectedCapture(id, memory, unloaded)
	if free := s.freeBytes(); free >= 0 && free-need < minFree {
		return api.Errorf(api.ErrUnavailable, "%s of %s: sbxd's data dir %s has %s free, and this capture may write up to %s (sbxd keeps %s free); nothing was captured and the sandbox runs on: free some space there (`sbx df`, `sbx prune`)", kind, id, s.dataDir, fmtBytes(free), fmtBytes(need), fmtBytes(minFree))
	}
	return s.allows(ctx, kind+" of "+id, need)
}

// usage says what uses the data dir, by owner: sandboxes (their files,
// outputs, freeze slots, hibernation images and disks), snapshots,
// freezes, template versions and orphan images.
func (s *storageOwner) usage(ctx context.Context) (*api.Storage, error) {
	v, err := s.view(ctx)
	if err != nil {
		return nil, err
	}
	u := newDU()
	out := &api.Storage{
		DataDir: s.dataDir, Max: s.storageMax, OrphanMax: s.orphanMax, Free: max(s.freeBytes(), 0),
		Totals:    map[string]int64{},
		Sandboxes: []api.StorageItem{}, Snapshots: []api.StorageItem{}, Freezes: []api.StorageItem{},
		Templates: []api.StorageItem{}, Orphans: []api.StorageItem{},
	}
	bySandbox := map[string]*api.StorageItem{}
	for _, sb := range v.sandboxes {
		it := &api.StorageItem{Kind: api.StorageSandbox, ID: sb.ID, Name: sb.Name, CreatedAt: sb.CreatedAt}
		if t := sb.Meta[api.MetaPool]; t != "" {
			it.Name = "(warm pool of " + t + ")" // what holds the space, though no list shows it
		}
		it.Bytes += u.of(s.host.sandboxDir(sb.ID)) + u.of(s.host.freezeDir(sb.ID))
		if sb.Image != "" {
			it.Bytes += u.of(s.images.dir(sb.Image))
		}
		// the image its memory is loaded from: counted once, with the
		// first of the forks that read it
		if sb.PagesImage != "" {
			it.Bytes += u.of(s.images.dir(sb.PagesImage))
		}
		bySandbox[sb.ID] = it
	}
	for _, sb := range v.sandboxes {
		if sb.Disk != "" {
			bySandbox[sb.ID].Bytes += u.of(sb.Disk)
		}
	}
	// a snapshot's image, and the disk it names unless a sandbox has it
	for _, sn := range v.snapshots {
		it := api.StorageItem{Kind: api.StorageSnapshot, ID: sn.ID, Name: sn.Name, SandboxID: sn.SandboxID, CreatedAt: sn.CreatedAt, Kept: sn.Kept}
		it.Bytes = u.of(s.images.dir(sn.ID))
		if sn.Disk != "" {
			it.Bytes += u.of(sn.Disk)
		}
		if s.isFreeze(sn) {
			it.Kind = api.StorageFreeze
			out.Freezes = append(out.Freezes, it)
		} else {
			out.Snapshots = append(out.Snapshots, it)
		}
	}
	for _, sb := range v.sandboxes {
		for _, im := range v.images {
			if im.SandboxID == sb.ID && im.OrphanedAt.IsZero() {
				bySandbox[sb.ID].Bytes += u.of(s.images.dir(im.ID))
			}
		}
		out.Sandboxes = append(out.Sandboxes, *bySandbox[sb.ID])
	}
	for _, o := range s.orphans(ctx, v) {
		o.Bytes = u.of(s.images.dir(o.ID))
		out.Orphans = append(out.Orphans, o)
	}
	tdir := s.templatesDir()
	// a name is a link to the version it points at
	names := map[string][]string{}
	if ents, err := os.ReadDir(filepath.Join(tdir, "names")); err == nil {
		for _, e := range ents {
			if v, err := os.Readlink(filepath.Join(tdir, "names", e.Name())); err == nil {
				names[v] = append(names[v], e.Name())
			}
		}
	}
	if ents, err := os.ReadDir(filepath.Join(tdir, "versions")); err == nil {
		for _, e := range ents {
			ver := strings.Replace(e.Name(), "-", ":", 1)
			it := api.StorageItem{Kind: api.StorageTemplate, ID: ver, Name: strings.Join(names[ver], ","), Bytes: u.of(filepath.Join(tdir, "versions", e.Name()))}
			if t, err := s.host.templateVersion(ver); err == nil {
				it.CreatedAt = t.CreatedAt
			}
			out.Templates = append(out.Templates, it)
		}
	}
	// the rest of the template store (layers, names, work in progress)
	tmplRest := u.of(tdir + "/")
	for kind, items := range map[string][]api.StorageItem{
		api.StorageSandbox: out.Sandboxes, api.StorageSnapshot: out.Snapshots, api.StorageFreeze: out.Freezes,
		api.StorageTemplate: out.Templates, api.StorageOrphan: out.Orphans,
	} {
		out.Totals[kind] = 0
		for _, it := range items {
			out.Totals[kind] += it.Bytes
		}
	}
	out.Totals[api.StorageTemplate] += tmplRest
	out.Totals[api.StorageOther] = u.of(s.dataDir) // the database, runsc's state, the agent, leftovers
	for _, n := range out.Totals {
		out.Used += n
	}
	return out, nil
}

// view is what the store records, read once for Storage and Prune.
type view struct {
	sandboxes []*store.Sandbox
	snapshots []*store.Snapshot
	images    []*store.Image
	intents   []*store.Intent
}

func (s *storageOwner) view(ctx context.Context) (*view, error) {
	var v view
	var err error
	if v.sandboxes, err = s.host.Sandboxes(ctx); err != nil {
		return nil, fmt.Errorf("storage: %w", err)
	}
	if v.snapshots, err = s.host.Snapshots(ctx, ""); err != nil {
		return nil, fmt.Errorf("storage: %w", err)
	}
	if v.images, err = s.host.Images(ctx); err != nil {
		return nil, fmt.Errorf("storage: %w", err)
	}
	if v.intents, err = s.host.Intents(ctx); err != nil {
		return nil, fmt.Errorf("storage: %w", err)
	}
	return &v, nil
}

// orphans are the images no sandbox or snapshot owns, oldest first:
// those recorded as orphaned (a retired one of a sandbox that lives, only
// once its retire time has passed: runsc may read it until then), and dirs
// no record names (left by a crash) once untrackedGrace has passed and no
// capture in flight names them.
func (s *storageOwner) orphans(ctx context.Context, v *view) []api.StorageItem {
	live := map[string]bool{}
	for _, sb := range v.sandboxes {
		live[sb.ID] = true
	}
	owned := map[string]bool{}
	for _, sn := range v.snapshots {
		owned[sn.ID] = true
	}
	for _, sb := range v.sandboxes {
		owned[sb.Image] = true
		owned[sb.PagesImage] = true // read by a sandbox, not an orphan yet
	}
	for _, in := range v.intents {
		owned[in.ID] = true
	}
	var out []api.StorageItem
	for _, im := range v.images {
		if owned[im.ID] && im.OrphanedAt.IsZero() {
			continue
		}
		retiring := live[im.SandboxID] && (im.RetireAt.IsZero() || s.host.now().Before(im.RetireAt))
		if !im.OrphanedAt.IsZero() && !owned[im.ID] && !retiring {
			out = append(out, api.StorageItem{Kind: api.StorageOrphan, ID: im.ID, SandboxID: im.SandboxID, CreatedAt: im.CreatedAt})
		}
		owned[im.ID] = true
	}
	ents, _ := os.ReadDir(s.images.root)
	for _, e := range ents {
		if !e.IsDir() || owned[e.Name()] {
			continue
		}
		fi, err := e.Info()
		if err != nil || s.host.now().Sub(fi.ModTime()) < untrackedGrace {
			continue
		}
		out = append(out, api.StorageItem{Kind: api.StorageOrphan, ID: e.Name(), CreatedAt: fi.ModTime()})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].CreatedAt.Before(out[j].CreatedAt) })
	return out
}

// removeOrphan removes an orphan image and its record, with an event in
// the stream of the sandbox it came from.
func (s *storageOwner) removeOrphan(ctx context.Context, o api.StorageItem, typ string, detail map[string]any) error {
	if err := s.images.remove(o.ID); err != nil {
		return fmt.Errorf("remove orphan image %s: %w", o.ID, err)
	}
	if err := s.host.DeleteImage(ctx, o.ID); err != nil {
		return fmt.Errorf("remove orphan image %s: %w", o.ID, err)
	}
	if o.SandboxID != "" {
		d := map[string]any{"image": o.ID, "bytes": o.Bytes}
		for k, v := range detail {
			d[k] = v
		}
		s.host.event(ctx, o.SandboxID, typ, d)
	}
	s.log.Info("removed an orphan image", "image", o.ID, "sandbox", o.SandboxID, "bytes", o.Bytes, "why", typ)
	return nil
}

// prune removes what nobody asked to keep, and says what: orphan images
// (before their grace ends), freezes not promoted (with req.Freezes), only
// those older than req.OlderThan if given. With req.DryRun it only says.
// A bad duration is api.ErrInvalid.
func (s *storageOwner) prune(ctx context.Context, req api.PruneRequest) (*api.PruneResult, error) {
	older := req.OlderThan.D() // checked at the edge: api.PruneRequest.Validate
	if !req.Orphans && !req.Freezes {
		req.Orphans = true
	}
	ctx = context.WithoutCancel(ctx)
	v, err := s.view(ctx)
	if err != nil {
		return nil, err
	}
	now := s.host.now()
	oldEnough := func(t time.Time) bool { return older == 0 || now.Sub(t) >= older }
	res := &api.PruneResult{Removed: []api.StorageItem{}, DryRun: req.DryRun}
	if req.Orphans {
		for _, o := range s.orphans(ctx, v) {
			if !oldEnough(o.CreatedAt) {
				continue
			}
			o.Bytes = newDU().of(s.images.dir(o.ID))
			if !req.DryRun {
				if err := s.removeOrphan(ctx, o, EventPruned, map[string]any{"reason": "sbx prune --orphans"}); err != nil {
					return res, err
				}
			}
			res.Removed = append(res.Removed, o)
			res.Reclaimed += o.Bytes
		}
	}
	if req.Freezes {
		for _, sn := range v.snapshots {
			if sn.Kept || !s.isFreeze(sn) || !oldEnough(sn.CreatedAt) {
				continue
			}
			it := api.StorageItem{Kind: api.StorageFreeze, ID: sn.ID, Name: sn.Name, SandboxID: sn.SandboxID, CreatedAt: sn.CreatedAt, Bytes: newDU().of(s.images.dir(sn.ID))}
			if !req.DryRun {
				if err := s.host.deleteSnapshot(ctx, sn); err != nil && !errors.Is(err, api.ErrNotFound) {
					return res, fmt.Errorf("prune freeze %s: %w", sn.Name, err)
				}
				s.host.event(ctx, sn.SandboxID, EventPruned, map[string]any{"snapshot": sn.Name, "bytes": it.Bytes, "reason": "sbx prune --freezes"})
			}
			res.Removed = append(res.Removed, it)
			res.Reclaimed += it.Bytes
		}
	}
	return res, nil
}

// The events storage adds to a sandbox's stream (deleted ones' included).
const (
	EventPruned = api.EventPruned
	EventSwept  = api.EventSwept
)

// sweep is the sweep's part for storage: orphans past --orphan-max
// go, oldest first, each with an event; a freeze that outlived its
// sandbox without being kept (a crash between the delete and its
// freezes) goes too.
func (s *storageOwner) sweep(ctx context.Context) {
	v, err := s.view(ctx)
	if err != nil {
		s.log.Error("sweep storage", "err", err)
		return
	}
	live := map[string]bool{}
	for _, sb := range v.sandboxes {
		live[sb.ID] = true
	}
	for _, sn := range v.snapshots {
		if !sn.Kept && !live[sn.SandboxID] && s.isFreeze(sn) {
			if err := s.host.deleteSnapshot(ctx, sn); err != nil {
				s.log.Error("sweep a freeze whose sandbox is gone", "snapshot", sn.Name, "err", err)
				continue
			}
			s.host.event(ctx, sn.SandboxID, EventSwept, map[string]any{"snapshot": sn.Name, "reason": "a freeze goes with its sandbox, which is deleted"})
		}
	}
	if s.orphanMax <= 0 {
		return
	}
	orph := s.orphans(ctx, v)
	var total int64
	for i := range orph {
		orph[i].Bytes = newDU().of(s.images.dir(orph[i].ID))
		total += orph[i].Bytes
	}
	for _, o := range orph {
		if total <= s.orphanMax {
			return
		}
		reason := fmt.Sprintf("orphan images held %s, more than sbxd --orphan-max %s: the oldest go first, before their grace ends", fmtBytes(total), fmtBytes(s.orphanMax))
		if err := s.removeOrphan(ctx, o, EventSwept, map[string]any{"reason": reason}); err != nil {
			s.log.Error("sweep orphans past their budget", "err", err)
			continue
		}
		total -= o.Bytes
	}
}
