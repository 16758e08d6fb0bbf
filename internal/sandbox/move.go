package sandbox

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"time"

	"sbx.dev/sbx/api"
	"sbx.dev/sbx/internal/snapstore"
	"sbx.dev/sbx/internal/store"
)

// A stopped sandbox moves between nodes as an artifact of the registry:
// its node pushes its hibernation image with its record (PushSandbox),
// and another node adopts it (AdoptSandbox): the same id, name, meta and
// limits, stopped, with its memory. Neither node deletes anything: the
// fleet's controller decides which copy is the sandbox (the one its
// object is bound to) and has the other deleted.

// movedSandbox is what a stopped sandbox's record holds beyond what a
// snapshot's does (transferRecord).
type movedSandbox struct {
	ID           string            `json:"id"`
	Name         string            `json:"name,omitempty"`
	TTL          time.Duration     `json:"ttl,omitempty"`
	Meta         map[string]string `json:"meta,omitempty"`
	Persistent   bool              `json:"persistent,omitempty"`
	Parent       string            `json:"parent,omitempty"`
	Source       string            `json:"source,omitempty"`
	LastActivity time.Time         `json:"lastActivity"`
}

// moveRecord is a pushed stopped sandbox's record: a snapshot's, which a
// pull reads, and the sandbox's.
type moveRecord struct {
	transferRecord
	Sandbox *movedSandbox `json:"sandbox,omitempty"`
}

// movingPrefix names the snapshot an adopt pulls into before the image
// becomes the sandbox's: one a crash left behind is taken again.
const movingPrefix = "moving-"

// PushSandbox pushes stopped sandbox ref's hibernation image, with its
// record, to req.Ref, for another node to adopt. The sandbox stays here,
// stopped, and is claimed while it is pushed: it is not resumed or
// deleted under the push.
func (m *Manager) PushSandbox(ctx context.Context, ref string, req api.PushRequest) (*api.PushResult, error) {
	return m.pushSandbox(ctx, ref, req, nil)
}

// pushSandbox is PushSandbox, its claim yielding (claims.claimYielding)
// when yield is not nil.
func (m *Manager) pushSandbox(ctx context.Context, ref string, req api.PushRequest, yield func()) (*api.PushResult, error) {
	if err := req.Validate(); err != nil {
		return nil, err
	}
	sb, err := m.cfg.Store.Sandbox(ctx, ref)
	if err != nil {
		return nil, err
	}
	if pooled(sb) {
		return nil, api.Errorf(api.ErrNotFound, "sandbox %s not found", ref)
	}
	unlock, err := m.claims.claimYielding(ctx, sb.ID, "push", yield)
	if err != nil {
		return nil, err
	}
	defer unlock()
	if sb, err = m.cfg.Store.Sandbox(ctx, sb.ID); err != nil {
		return nil, err
	}
	if err := requireState(sb, api.StateStopped); err != nil {
		return nil, err
	}
	if !m.images.isComplete(sb.Image) || !fileExists(m.images.mem(sb.Image)) {
		return nil, api.Errorf(api.ErrUnavailable, "sandbox %s has no complete hibernation image with its memory on disk", sb.ID)
	}
	if m.cfg.HostFacts == nil {
		return nil, api.Errorf(api.ErrUnavailable, "push %s: this sbxd does not know its runsc and CPU, which another node needs to restore the memory", sb.ID)
	}
	f, err := m.cfg.HostFacts()
	if err != nil {
		return nil, fmt.Errorf("push %s: %w", sb.ID, err)
	}
	t, err := m.transferStore()
	if err != nil {
		return nil, err
	}
	agent := notedAgent(m.images.dir(sb.Image))
	rec, _ := json.Marshal(moveRecord{
		transferRecord: transferRecord{SandboxID: sb.ID, CreatedAt: sb.CreatedAt, CPUs: sb.CPUs, MemLimit: sb.Memory,
			Pids: sb.Pids, DiskLimit: sb.DiskLimit, Network: sb.Network, Disk: sb.Disk, Agent: agent},
		Sandbox: &movedSandbox{ID: sb.ID, Name: sb.Name, TTL: sb.TTL, Meta: sb.Meta, Persistent: sb.Persistent,
			Parent: sb.Parent, Source: sb.Source, LastActivity: sb.LastActivity},
	})
	man := snapstore.Manifest{Name: movingPrefix + sb.ID, Memory: true, Template: sb.Template, TemplateVersion: sb.TemplateVersion,
		Record: rec, RunscSHA256: f.RunscSHA256, CPUFeatures: f.CPUFeatures, CacheLineBytes: f.CacheLineBytes, Agent: agent}
	skip := func(p string) bool { return p == completeFile }
	pushed, files, err := t.store.Push(ctx, req.Ref, m.images.dir(sb.Image), man, skip, t.opts...)
	if err != nil {
		return nil, registryError("push", req.Ref, err)
	}
	res := &api.PushResult{Ref: pushed, Files: len(files.Files), Memory: true}
	for _, f := range files.Files {
		res.Bytes += f.Size
	}
	m.event(ctx, sb.ID, "pushed", map[string]any{"ref": pushed, "bytes": res.Bytes})
	m.log.Info("pushed a stopped sandbox", "sandbox", sb.ID, "ref", pushed, "files", res.Files, "bytes", res.Bytes)
	return res, nil
}

// AdoptSandbox records here the stopped sandbox another node pushed to
// req.Ref (PushSandbox), under its id, name and meta, with its memory,
// which must restore here (the same runsc build, CPU features and cache
// line). It is idempotent: a sandbox adopted from that very artifact is
// answered as it is. Any other sandbox of that id here is a conflict.
func (m *Manager) AdoptSandbox(ctx context.Context, req api.AdoptRequest) (*api.Sandbox, error) {
	if err := req.Validate(); err != nil {
		return nil, err
	}
	t, err := m.transferStore()
	if err != nil {
		return nil, err
	}
	man, ref, err := snapstore.Fetch(ctx, req.Ref, t.opts...)
	if err != nil {
		return nil, registryError("adopt", req.Ref, err)
	}
	var rec moveRecord
	if err := json.Unmarshal(man.Record, &rec); err != nil || rec.Sandbox == nil || !man.Memory {
		return nil, api.Errorf(api.ErrInvalid, "adopt %s: it is not a stopped sandbox's image (a snapshot's is pulled: sbx snapshot pull)", req.Ref)
	}
	ms := rec.Sandbox
	if !sandboxIDRE.MatchString(ms.ID) || ms.ID != rec.SandboxID || man.Name != movingPrefix+ms.ID {
		return nil, api.Errorf(api.ErrInvalid, "adopt %s: its record names sandbox %q, which is no sandbox id", req.Ref, ms.ID)
	}
	if req.ID != "" && ms.ID != req.ID {
		return nil, api.Errorf(api.ErrInvalid, "adopt %s: it holds sandbox %s, not %s", req.Ref, ms.ID, req.ID)
	}
	if ms.Name != "" {
		if err := ValidName(ms.Name); err != nil {
			return nil, api.Errorf(api.ErrInvalid, "adopt %s: %v", req.Ref, err)
		}
	}
	// the meta is the registry's word, held as a create's is; sbxd's own
	// keys of the other node are kept (the fleet's object), but a pool's
	// mark is not
	meta := maps.Clone(ms.Meta)
	if meta == nil {
		meta = map[string]string{}
	}
	delete(meta, api.MetaPool)
	delete(meta, api.MetaImageRef) // the other node's push: this node's own goes as its stops do
	delete(meta, api.MetaImagePending)
	meta[api.MetaAdopted] = ref
	if err := checkMeta(meta); err != nil {
		return nil, api.Errorf(api.ErrInvalid, "adopt %s: %v", req.Ref, err)
	}
	if left := m.memoryFits(man); left != "" && !req.WithoutMemory {
		return nil, api.Errorf(api.ErrConflict, "adopt %s: its memory does not restore on this node: %s", req.Ref, left)
	}
	unlock, err := m.claim(ctx, ms.ID, "adopt")
	if err != nil {
		return nil, err
	}
	defer unlock()
	if sb, err := m.cfg.Store.Sandbox(ctx, ms.ID); err == nil {
		if sb.ID == ms.ID && sb.Meta[api.MetaAdopted] == ref && sb.State == api.StateStopped {
			return m.Get(ctx, sb.ID) // adopted already: an adopt asked again
		}
		if sb.ID == ms.ID {
			return nil, api.Errorf(api.ErrConflict, "adopt %s: sandbox %s is on this node already (%s)", req.Ref, ms.ID, sb.State)
		}
	}
	if ms.Name != "" {
		if sb, err := m.cfg.Store.Sandbox(ctx, ms.Name); err == nil && sb.Name == ms.Name {
			return nil, api.Errorf(api.ErrConflict, "adopt %s: name %q is taken here by sandbox %s", req.Ref, ms.Name, sb.ID)
		}
	}
	ctx = context.WithoutCancel(ctx) // once pulled, the record is made or the pull undone
	name := movingPrefix + ms.ID
	if sn, err := m.cfg.Store.Snapshot(ctx, name); err == nil {
		// an adopt a crash cut short: pulled again (the content store
		// holds its files), not trusted
		if err := m.deleteSnapshot(ctx, sn); err != nil {
			return nil, fmt.Errorf("adopt %s: remove what an earlier adopt left: %w", req.Ref, err)
		}
	}
	pulled, err := m.PullSnapshot(ctx, api.PullRequest{Ref: ref, Name: name})
	if err != nil {
		return nil, err
	}
	sn, err := m.cfg.Store.Snapshot(ctx, name)
	if err != nil {
		return nil, err
	}
	undo := func(why error) (*api.Sandbox, error) {
		if err := m.deleteSnapshot(ctx, sn); err != nil {
			m.log.Warn("adopt: remove the pulled image", "snapshot", name, "err", err)
		}
		return nil, why
	}
	if sn.SandboxID != ms.ID || (!sn.Memory && !req.WithoutMemory) {
		return undo(api.Errorf(api.ErrConflict, "adopt %s: its memory stayed behind: %s", req.Ref, pulled.MemoryLeft))
	}
	var reason string
	if !sn.Memory { // asked for: it boots from its disk, and says why
		reason = "its memory stayed on the node it came from: " + pulled.MemoryLeft
	}
	now := m.now()
	last := ms.LastActivity
	if last.IsZero() || last.After(now) {
		last = now
	}
	sb := &store.Sandbox{
		ID: ms.ID, Name: ms.Name, Template: sn.Template, State: api.StateStopped, Reason: reason, CreatedAt: rec.CreatedAt,
		TTL: ms.TTL, Meta: meta, CPUs: sn.CPUs, Memory: sn.MemLimit, LastActivity: last,
		Source: ms.Source, Parent: ms.Parent, Image: sn.ID, Persistent: ms.Persistent, Disk: sn.Disk,
		TemplateVersion: sn.TemplateVersion, Pids: sn.Pids, DiskLimit: sn.DiskLimit, Network: sn.Network,
	}
	if sb.CreatedAt.IsZero() || sb.CreatedAt.After(now) {
		sb.CreatedAt = now
	}
	crashPoint("adopt:pulled")
	// One transaction: the snapshot's image becomes the sandbox's
	// hibernation image, and no snapshot is left to name it.
	err = m.cfg.Store.Update(ctx, func(tx *store.Store) error {
		if err := tx.CreateSandbox(ctx, sb); err != nil {
			return err
		}
		if sb.Persistent { // not a create's: its own column
			if err := tx.SetPersistent(ctx, sb.ID, true); err != nil {
				return err
			}
		}
		if err := tx.AddImage(ctx, &store.Image{ID: sn.ID, SandboxID: sb.ID, Kind: "hibernation", CreatedAt: now}); err != nil {
			return err
		}
		if err := tx.AddEvent(ctx, sb.ID, "adopted", map[string]any{"ref": ref, "pulledBytes": pulled.PulledBytes}); err != nil {
			return err
		}
		return tx.DeleteSnapshot(ctx, name)
	})
	if err != nil {
		var kind *api.Error
		if errors.As(err, &kind) {
			return undo(err)
		}
		return undo(fmt.Errorf("adopt %s: %w", req.Ref, err))
	}
	m.log.Info("adopted a stopped sandbox", "sandbox", sb.ID, "ref", ref, "pulledBytes", pulled.PulledBytes)
	m.pushStopSoon(sb.ID, sb.Image)
	return m.Get(ctx, sb.ID)
}
