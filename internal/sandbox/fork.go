package sandbox

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"runtime"
	"sync"

	"sbx.dev/sbx/api"
	"sbx.dev/sbx/internal/store"
)

// Fork makes 1 to api.MaxForks new sandboxes from a ready one, now. By
// default each boots fresh on a copy of the parent's disk; with req.Memory
// each carries on the parent's processes and memory. It emits
// "sandbox.forking" with the new ids before any work, "sandbox.captured"
// once the parent's state is taken, then, once every child has booted,
// "sandbox.ready" for each child and "done". All or nothing, also across a
// crash of sbxd: the children stay creating until all have booted, then one
// transaction makes them all ready and closes the fork's journal entry; a
// fork found unfinished after a restart is undone whole. If one child
// fails, none is left and the error names the cause. The parent keeps
// running. The fork goes on when emit fails (the client left).
func (m *Manager) Fork(ctx context.Context, ref string, req api.ForkRequest, emit func(api.ForkEvent) error) ([]api.Sandbox, error) {
	// the count, the name's use, the ttl and the delay are checked at the
	// edge (api.ForkRequest.Validate); the name's spelling is the store's
	count := max(req.Count, 1)
	if req.Name != "" {
		if err := ValidName(req.Name); err != nil {
			return nil, err
		}
	}
	if err := checkMeta(req.Meta); err != nil {
		return nil, err
	}
	if err := checkCPUs(req.CPUs, runtime.NumCPU()); err != nil {
		return nil, err
	}
	parent, err := m.running(ctx, ref)
	if err != nil {
		return nil, err
	}
	netDelay, netLoss := parent.NetDelay, parent.NetLoss
	if req.Shape != nil {
		if netDelay, netLoss, err = parseShape(req.Shape, parent.Network); err != nil {
			return nil, err
		}
	}
	// storage.go: refused past the storage budget before any child is told of
	if err := m.storage.captureRoom(ctx, kindFork, parent.ID, req.Memory); err != nil {
		return nil, err
	}
	ttl := parent.TTL // not given: the parent's; 0 is none
	if req.TTL != nil {
		ttl = req.TTL.D()
	}
	meta, err := mergeMeta(parent.Meta, req.Meta)
	if err != nil {
		return nil, err
	}
	rootfs, err := m.rootfs(parent)
	if err != nil {
		return nil, err
	}
	// Records first: names are claimed and ids exist before anyone is told.
	// Each child is claimed before its record exists and until the fork
	// ends (an all-or-nothing undo included), so a delete, stop or capture
	// of a child still being made waits for it; else the boot would go on
	// after a delete and leave a sandbox no record names.
	now := m.now()
	children := make([]*store.Sandbox, count)
	ids := make([]string, count)
	release := make([]func(), 0, count)
	for i := range children {
		c := &store.Sandbox{
			ID: newID("sb_"), Template: parent.Template, State: api.StateCreating, CreatedAt: now,
			TTL: ttl, Meta: meta, CPUs: parent.CPUs, Memory: parent.Memory, LastActivity: now,
			Parent: parent.ID, MemoryRestored: req.Memory, TemplateVersion: parent.TemplateVersion,
			Pids: parent.Pids, DiskLimit: parent.DiskLimit, Network: parent.Network,
			NetDelay: netDelay, NetLoss: netLoss,
		}
		if req.Memory {
			c.Disk = parent.Disk // the restore names the disk the checkpoint had
		}
		if req.CPUs > 0 {
			c.CPUs = req.CPUs
		}
		if i == 0 {
			c.Name = req.Name
		}
		r, _ := m.claims.tryClaim(c.ID, "create") // a new id: nothing holds it
		release = append(release, r)
		children[i], ids[i] = c, c.ID
	}
	// released however the fork ends, a panic included: a claim left
	// behind would hold every later delete or stop of the children
	defer func() {
		for _, r := range release {
			r()
		}
	}()
	err = m.cfg.Store.Update(ctx, func(tx *store.Store) error {
		for _, c := range children {
			if err := tx.CreateSandbox(ctx, c); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	ctx = context.WithoutCancel(ctx)
	gone := false
	send := func(ev api.ForkEvent) {
		if !gone && emit(ev) != nil {
			gone = true // the client left; the fork goes on
		}
	}
	send(api.ForkEvent{Event: "sandbox.forking", IDs: ids})

	start := m.now()
	out, size, err := m.fork(ctx, parent, children, rootfs, req.Memory, req.Monitor, send)
	m.captureEvent(ctx, parent.ID, "forked", start, size, err, map[string]any{"children": ids, "memory": req.Memory})
	if err != nil {
		return nil, fmt.Errorf("fork %s: %w", parent.ID, err)
	}
	return out, nil
}

// fork captures parent and boots the children, which the caller claims.
func (m *Manager) fork(ctx context.Context, parent *store.Sandbox, children []*store.Sandbox, rootfs string, withMemory, monitor bool, send func(api.ForkEvent)) ([]api.Sandbox, int64, error) {
	undo := func() {
		for _, c := range children {
			if err := m.destroy(ctx, c.ID); err != nil {
				m.log.Error("undo failed fork", "sandbox", c.ID, "err", err)
			}
		}
	}
	// Capture the parent under its claim: no other capture, stop or delete
	// of it meanwhile. The children boot from the image after.
	claimed, err := m.claim(ctx, parent.ID, kindFork)
	if err != nil {
		undo()
		return nil, 0, err
	}
	unlock := sync.OnceFunc(claimed) // early, once captured; deferred for a panic
	defer unlock()
	if _, err := m.running(ctx, parent.ID); err != nil {
		unlock()
		undo()
		return nil, 0, err
	}
	ids := make([]string, len(children))
	for i, c := range children {
		ids[i] = c.ID
	}
	c, err := m.journal.beginCapture(ctx, kindFork, parent.ID, withMemory, map[string]any{"children": ids})
	if err != nil {
		unlock()
		undo()
		return nil, 0, err
	}
	defer c.end()
	size, _, err := m.capture(ctx, c, parent.ID, captureKind{memory: withMemory, scratch: true, diskLimit: parent.DiskLimit})
	unlock()
	if err != nil {
		undo()
		return nil, 0, err
	}
	// from here on the journal entry concerns the children only
	c.step(ctx, stepCaptured)
	// what the children will be is fixed: a caller ordering its own steps
	// after the fork (sbx hunt) may go on while they boot
	send(api.ForkEvent{Event: "sandbox.captured"})
	img := c.img
	closed, kept := false, false
	defer func() {
		if !kept {
			_ = m.images.remove(img)
		}
		if !closed {
			c.abandon(ctx)
		}
	}()
	undo = func() {
		for _, ch := range children {
			if err := m.destroy(ctx, ch.ID); err != nil {
				m.log.Error("undo failed fork", "sandbox", ch.ID, "err", err)
			}
		}
	}
	m.touch(ctx, parent.ID)

	b := bootSpec{rootfs: rootfs, monitor: monitor}
	if withMemory {
		b.image, b.from = m.images.mem(img), img
		b.onDemand = m.cfg.ForkPagesOnDemand
	} else {
		// One disk for all the children: the parent's disk as of now.
		disk, err := m.storage.newDisk(m.images.disk(img))
		if err != nil {
			undo()
			return nil, 0, err
		}
		for _, c := range children {
			c.Disk = disk
			if err := m.cfg.Store.SetDisk(ctx, c.ID, disk); err != nil {
				undo()
				return nil, 0, err
			}
		}
	}
	rctx := c.watched(ctx)
	var wg sync.WaitGroup
	errs := make([]error, len(children))
	for i, child := range children {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := m.boot(rctx, child, b); err != nil {
				errs[i] = fmt.Errorf("child %s: %w", child.ID, err)
			}
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		undo()
		return nil, 0, err
	}
	crashPoint("fork:booted")
	// All booted: all ready at once, with the journal entry closed. Forks
	// that load their pages on demand keep the image: it is recorded
	// retired, and goes once none of them reads it (sweep.go).
	err = m.cfg.Store.Update(ctx, func(tx *store.Store) error {
		for _, child := range children {
			if err := m.readyIn(ctx, tx, child, "created", map[string]any{"parent": parent.ID, "memory": withMemory}); err != nil {
				return err
			}
			if b.onDemand {
				if err := tx.SetPagesImage(ctx, child.ID, img); err != nil {
					return err
				}
			}
		}
		if b.onDemand {
			now := m.now()
			if err := tx.AddImage(ctx, &store.Image{ID: img, SandboxID: parent.ID, Kind: "fork", CreatedAt: now}); err != nil {
				return err
			}
			if err := tx.RetireImage(ctx, img, now, now); err != nil {
				return err
			}
		}
		return c.closeIn(ctx, tx)
	})
	if err != nil {
		undo()
		return nil, 0, err
	}
	closed, kept = true, b.onDemand
	out := make([]api.Sandbox, len(children))
	for i, child := range children {
		m.watch(ctx, child.ID)
		out[i] = *m.toAPI(child)
	}
	for i := range out {
		send(api.ForkEvent{Event: "sandbox.ready", Sandbox: &out[i]})
	}
	send(api.ForkEvent{Event: "done", Sandboxes: out})
	return out, size, nil
}

// pagesAllLoaded notes that sandbox id holds every page of its memory: a
// checkpoint of it has just read them all, so the image a memory fork
// loads on demand is no longer read by it, and may go once no other fork
// reads it.
func (m *Manager) pagesAllLoaded(ctx context.Context, id string) {
	sb, err := m.cfg.Store.Sandbox(ctx, id)
	if err != nil || sb.PagesImage == "" {
		return
	}
	if err := m.cfg.Store.SetPagesImage(ctx, id, ""); err != nil {
		m.log.Warn("forget the image a fork loaded its memory from", "sandbox", id, "image", sb.PagesImage, "err", err)
		return
	}
	m.sweepSoon(0)
}

// mergeMeta is a child's metadata: the parent's, with the fork's keys
// added or replacing the parent's. The result is held to the same limits
// as a create's. The fleet's object (api.MetaObject) is the parent's own:
// a child is not what that object asked for.
func mergeMeta(parent, fork map[string]string) (map[string]string, error) {
	_, obj := parent[api.MetaObject]
	if _, uid := parent[api.MetaObjectUID]; obj || uid || parent[api.MetaPool] != "" || parent[api.MetaAdopted] != "" ||
		parent[api.MetaImageRef] != "" || parent[api.MetaImagePending] != "" {
		parent = maps.Clone(parent)
		delete(parent, api.MetaObject)
		delete(parent, api.MetaObjectUID)
		delete(parent, api.MetaObjectNamespace)
		delete(parent, api.MetaAdopted) // the parent's move, not the child's
		delete(parent, api.MetaImageRef)
		delete(parent, api.MetaImagePending)
		delete(parent, api.MetaPool) // a pool's sandbox is no one's to fork, but never pass it on
	}
	if len(fork) == 0 {
		return parent, nil
	}
	out := make(map[string]string, len(parent)+len(fork))
	for k, v := range parent {
		out[k] = v
	}
	for k, v := range fork {
		out[k] = v
	}
	if err := checkMeta(out); err != nil {
		return nil, fmt.Errorf("meta merged with the parent's: %w", err)
	}
	return out, nil
}
