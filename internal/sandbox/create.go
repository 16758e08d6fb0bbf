package sandbox

import (
	"cmp"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"runtime"

	"sbx.dev/sbx/api"
	"sbx.dev/sbx/internal/runsc"
	"sbx.dev/sbx/internal/store"
	"sbx.dev/sbx/internal/wire/freezewire"
)

// minMemory is the smallest memory limit a sandbox boots with.
const minMemory = 64 << 20

// Create makes and starts a sandbox, from a template or (req.From) a
// snapshot. Bad fields are api.ErrInvalid naming the field, an unknown
// template or snapshot api.ErrNotFound, a taken name api.ErrConflict.
// A create of a template with a warm pool is served from it when it can
// be (pool.go).
func (m *Manager) Create(ctx context.Context, req api.CreateRequest) (*api.Sandbox, error) {
	if req.Name != "" {
		if err := ValidName(req.Name); err != nil {
			return nil, err
		}
	}
	if err := checkMeta(req.Meta); err != nil {
		return nil, err
	}
	if _, ok := req.Meta[api.MetaPool]; ok {
		// the pool's own boots come through create; a caller of Create
		// (the API, the fleet's agent) may not make a sandbox the pool's
		return nil, api.Errorf(api.ErrInvalid, "meta: %s is sbxd's: it marks a sandbox of its warm pool", api.MetaPool)
	}
	if err := m.checkRoom("create"); err != nil {
		return nil, err
	}
	if sb, err := m.pool.take(ctx, cmp.Or(req.Template, m.cfg.DefaultTemplate), req); sb != nil || err != nil {
		return sb, err
	}
	return m.create(ctx, req)
}

// create boots a sandbox for req.
func (m *Manager) create(ctx context.Context, req api.CreateRequest) (*api.Sandbox, error) {
	if req.Name != "" {
		if err := ValidName(req.Name); err != nil {
			return nil, err
		}
	}
	ttl := req.TTL.D() // checked at the edge: api.CreateRequest.Validate
	if err := m.checkRoom("create"); err != nil {
		return nil, err
	}
	mem, err := ParseSize("memory", req.Memory)
	if err != nil {
		return nil, err
	}
	disk, err := ParseSize("disk", req.Disk)
	if err != nil {
		return nil, err
	}
	if err := checkCPUs(req.CPUs, runtime.NumCPU()); err != nil {
		return nil, err
	}
	if err := checkMeta(req.Meta); err != nil {
		return nil, err
	}
	if err := checkNetwork(req.Network); err != nil {
		return nil, err
	}
	netDelay, netLoss, err := parseShape(req.Shape, req.Network)
	if err != nil {
		return nil, err
	}
	now := m.now()
	sb := &store.Sandbox{
		ID: newID("sb_"), Name: req.Name, Template: req.Template, State: api.StateCreating,
		CreatedAt: now, TTL: ttl, Meta: req.Meta, CPUs: req.CPUs, Memory: mem, LastActivity: now,
		Pids: req.Pids, DiskLimit: disk, Network: req.Network, NetDelay: netDelay, NetLoss: netLoss,
	}
	b := bootSpec{monitor: req.Monitor}
	if req.ForkOf != "" && req.From == "" {
		return nil, api.Errorf(api.ErrInvalid, "forkOf: only with from, the snapshot of the sandbox it names")
	}
	if req.From != "" {
		sn, err := m.cfg.Store.Snapshot(ctx, req.From)
		if err != nil {
			return nil, err
		}
		if req.Template != "" && req.Template != sn.Template {
			return nil, api.Errorf(api.ErrInvalid, "template: snapshot %s is of template %s; leave the template out", sn.Name, sn.Template)
		}
		if !m.images.isComplete(sn.ID) {
			return nil, api.Errorf(api.ErrUnavailable, "snapshot %s has no complete image on disk", sn.Name)
		}
		// a memory image restores into the network it was taken with
		if sn.Memory && req.Network != "" && req.Network != sn.Network {
			return nil, api.Errorf(api.ErrInvalid, "network: snapshot %s carries its memory, which restores only into the network it was taken with; leave the network out", sn.Name)
		}
		if sn.Network != "" {
			sb.Network = sn.Network
		}
		if sb.Network == NetworkNone && (netDelay != 0 || netLoss != 0) {
			return nil, api.Errorf(api.ErrInvalid, "netShape: snapshot %s has network %q, which sends nothing out to shape", sn.Name, NetworkNone)
		}
		// A memory image carries its limits; a disk one takes the snapshot's unless asked.
		sb.Template, sb.Source, sb.TemplateVersion = sn.Template, sn.Name, sn.TemplateVersion
		if req.ForkOf != "" {
			if req.ForkOf != sn.SandboxID {
				return nil, api.Errorf(api.ErrInvalid, "forkOf: snapshot %s is not of sandbox %q", sn.Name, req.ForkOf)
			}
			sb.Parent = sn.SandboxID
		}
		if sn.Memory || req.CPUs == 0 {
			sb.CPUs = sn.CPUs
		}
		if sn.Memory || mem == 0 {
			sb.Memory = sn.MemLimit
		}
		if sn.Memory || req.Pids == 0 {
			sb.Pids = sn.Pids
		}
		if sn.Memory || disk == 0 {
			sb.DiskLimit = sn.DiskLimit
		}
		if sn.Memory {
			if err := m.images.checkMemory(sn.ID); err != nil {
				return nil, api.Errorf(api.ErrUnavailable, "snapshot %s cannot be restored: %v (changed after it was taken); nothing was created", sn.Name, err)
			}
			if _, _, err := m.agentFor(sn.ID); err != nil {
				return nil, api.Errorf(api.ErrConflict, "snapshot %s cannot be restored here: %v; nothing was created", sn.Name, err)
			}
			b.image, b.from = m.images.mem(sn.ID), sn.ID
			sb.MemoryRestored = true
			sb.Disk = sn.Disk // the restore names the disk its checkpoint had
		} else if sb.Disk, err = m.storage.newDisk(m.images.disk(sn.ID)); err != nil {
			return nil, err
		}
	}
	if sb.Memory, sb.Pids, sb.DiskLimit, err = m.cfg.Limits.resolve(sb.Memory, sb.Pids, sb.DiskLimit, hostMemory()); err != nil {
		return nil, err
	}
	if sb.Template == "" {
		sb.Template = m.cfg.DefaultTemplate
	}
	if sb.TemplateVersion == "" {
		t, release, err := m.resolveTemplate(sb.Template)
		if err != nil {
			m.storage.releaseDisk(context.WithoutCancel(ctx), sb.Disk)
			return nil, err
		}
		defer release() // once the record holds it
		sb.TemplateVersion = t.Version
	}
	if b.rootfs, err = m.rootfs(sb); err != nil {
		m.storage.releaseDisk(context.WithoutCancel(ctx), sb.Disk)
		return nil, err
	}
	// claimed before the record exists: a delete that finds the record
	// waits for the create to end
	unlock, ok := m.claims.tryClaim(sb.ID, "create") // a new id: nothing holds it
	if !ok {
		return nil, fmt.Errorf("create %s: the new id is claimed", sb.ID)
	}
	defer unlock()
	if err := m.cfg.Store.CreateSandbox(ctx, sb); err != nil {
		m.storage.releaseDisk(context.WithoutCancel(ctx), sb.Disk)
		return nil, err
	}
	// Once started, a create finishes or is undone whatever the client does.
	ctx = context.WithoutCancel(ctx)
	if err := m.boot(ctx, sb, b); err != nil {
		if derr := m.destroy(ctx, sb.ID); derr != nil {
			m.log.Error("undo failed create", "sandbox", sb.ID, "err", derr)
		}
		return nil, fmt.Errorf("create %s: %w", sb.ID, err)
	}
	event := "created"
	if pooled(sb) {
		event = "pooled" // "created" once a create takes it
	}
	if err := m.started(ctx, sb, event, map[string]any{"template": sb.Template, "from": sb.Source}); err != nil {
		if derr := m.destroy(ctx, sb.ID); derr != nil {
			m.log.Error("undo failed create", "sandbox", sb.ID, "err", derr)
		}
		return nil, fmt.Errorf("create %s: %w", sb.ID, err)
	}
	return m.toAPI(sb), nil
}

// started moves a booted sandbox from creating to ready, with an event
// unless event is "", and watches it.
func (m *Manager) started(ctx context.Context, sb *store.Sandbox, event string, detail map[string]any) error {
	err := m.cfg.Store.Update(ctx, func(tx *store.Store) error {
		return m.readyIn(ctx, tx, sb, event, detail)
	})
	if err != nil {
		return err
	}
	m.watch(ctx, sb.ID)
	return nil
}

// readyIn records in tx that a booted sandbox is ready: creating to ready.
func (m *Manager) readyIn(ctx context.Context, tx *store.Store, sb *store.Sandbox, event string, detail map[string]any) error {
	if err := moveIn(ctx, tx, sb.ID, moveBooted, store.Change{}); err != nil {
		return err
	}
	sb.State = api.StateReady
	if event == "" {
		return nil
	}
	detail["memoryRestored"] = sb.MemoryRestored
	return tx.AddEvent(ctx, sb.ID, event, detail)
}

// bootSpec says what a sandbox boots from: a template's rootfs (and the
// sandbox's disk, if it has one), or a memory image to restore.
type bootSpec struct {
	rootfs string
	image  string
	// from is the id of the image restored ("" for a boot from the template).
	from string
	// background lets runsc load a restored image's pages after it returns.
	background bool
	// onDemand loads a restored image's pages only when the sandbox uses
	// them: runsc reads the image for the sandbox's life (a memory fork's).
	onDemand bool
	// monitor boots the sandbox with runtime monitoring.
	monitor bool
}

// boot gives the sandbox its network, files and runsc sandbox. A network
// that exists already (a stopped sandbox's) is kept.
func (m *Manager) boot(ctx context.Context, sb *store.Sandbox, b bootSpec) error {
	dir := m.sandboxDir(sb.ID)
	// the agent its image's processes run, or this sbxd's
	agentKey, agentDir, err := m.agentFor(b.from)
	if err != nil {
		return err
	}
	etc, upper := filepath.Join(dir, "etc"), filepath.Join(dir, "upper")
	// A stale overlay store (of a stopped sandbox) must not be reused.
	if err := os.RemoveAll(upper); err != nil {
		return err
	}
	// the freezes' confirmations (freezewire.ConfirmDir) from the boot
	// on: a capture taken while a freeze command looked for its own saves
	// the directory as one the sandbox saw, and a restore whose etc had
	// none (made at the first confirmation) failed ("failed to walk
	// \"freezes\"", TestAttack22bCaptureRace)
	for _, d := range []string{etc, upper, filepath.Join(dir, "execs"), filepath.Join(etc, freezewire.ConfirmSubdir)} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return err
		}
	}
	if err := writeEtc(etc, sb.ID); err != nil {
		return err
	}
	var netns string // network none: runsc makes a namespace of its own
	if sb.Network != NetworkNone {
		nw, err := m.cfg.Networks.Get(sb.ID)
		if err != nil {
			if nw, err = m.cfg.Networks.Create(sb.ID); err != nil {
				return fmt.Errorf("network: %w", err)
			}
		} else if err := m.cfg.Networks.Rearm(sb.ID); err != nil {
			// the last runsc took eth0's address; without it, no eth0 inside
			return fmt.Errorf("network: %w", err)
		}
		if err := m.applyShape(sb); err != nil {
			return fmt.Errorf("network: %w", err)
		}
		netns = nw.Path
	}
	slot, annotations, env, err := m.freezes.armFreeze(ctx, sb, b.from, agentKey)
	if err != nil {
		return err
	}
	// noted for the images taken of it (noteImageAgent); after the freezes
	// of its earlier boots were settled, which read the note of theirs
	if err := writeSynced(filepath.Join(dir, sandboxAgentFile), []byte(agentKey+"\n")); err != nil {
		return err
	}
	if sb.Disk != "" {
		annotations["dev.gvisor.tar.rootfs.upper"] = sb.Disk
	}
	bundle := filepath.Join(dir, "bundle")
	err = runsc.WriteBundle(bundle, runsc.SpecOptions{
		Hostname:    sb.ID,
		Rootfs:      b.rootfs,
		AgentDir:    agentDir,
		EtcDir:      etc,
		NetNS:       netns,
		CgroupsPath: m.cgroupsPath(sb.ID),
		CPUs:        sb.CPUs,
		Memory:      sb.Memory,
		Pids:        sb.Pids,
		Annotations: annotations,
		Env:         env,
		ChannelDir:  m.channelDir(sb.ID),
	})
	if err != nil {
		return err
	}
	run := runsc.RunOptions{Bundle: bundle, Console: filepath.Join(dir, "console.log"), ConsoleHead: m.cfg.OutputHead, ConsoleTail: m.cfg.OutputTail,
		Overlay: upper, OverlaySize: sb.DiskLimit, Network: sb.Network, FreezeDir: m.freezes.freezeDir(sb.ID), Channel: m.channelDir(sb.ID),
		PIDFile: m.pidFile(sb.ID)}
	if b.monitor {
		// the sink connects while runsc creates the sandbox: listen first
		if run.PodInitConfig, err = m.monitors.start(sb.ID, dir); err != nil {
			return err
		}
	} else {
		m.monitors.stop(sb.ID) // an earlier boot's (a resume boots unmonitored)
	}
	if b.image != "" {
		err = m.cfg.Runtime.Restore(ctx, sb.ID, runsc.RestoreOptions{RunOptions: run, ImageDir: b.image, Background: b.background, PagesOnDemand: b.onDemand})
	} else {
		err = m.cfg.Runtime.Run(ctx, sb.ID, run)
	}
	if err != nil {
		return err
	}
	if err := m.freezes.slots.watch(sb.ID, slot, m.freezes.slotDir(sb.ID, slot)); err != nil {
		m.log.Warn("cannot watch a freeze slot", "sandbox", sb.ID, "err", err)
	}
	return nil
}

// writeEtc writes the files bound over the template's /etc.
func writeEtc(dir, id string) error {
	resolv, err := os.ReadFile("/etc/resolv.conf")
	if err != nil {
		resolv = nil
	}
	files := map[string]string{
		"resolv.conf": string(resolv),
		"hosts":       "127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n10.88.0.2\t" + id + "\n",
		"hostname":    id + "\n",
	}
	for name, content := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644); err != nil {
			return err
		}
	}
	return nil
}
