package sandbox

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"

	"sbx.dev/sbx/api"
	"sbx.dev/sbx/internal/runsc"
	"sbx.dev/sbx/internal/store"
)

// minMemory is the smallest memory limit a sandbox boots with.
const minMemory = 64 << 20

// Create makes and starts a sandbox, from a template or (req.From) a
// snapshot. Bad fields are api.ErrInvalid naming the field, an unknown
// template or snapshot api.ErrNotFound, a taken name api.ErrConflict.
func (m *Manager) Create(ctx context.Context, req api.CreateRequest) (*api.Sandbox, error) {
	if req.Name != "" {
		if err := ValidName(req.Name); err != nil {
			return nil, err
		}
	}
	ttl, err := ParseDuration("ttl", req.TTL)
	if err != nil {
		return nil, err
	}
	mem, err := ParseSize("memory", req.Memory)
	if err != nil {
		return nil, err
	}
	if mem != 0 && mem < minMemory {
		return nil, api.Errorf(api.ErrInvalid, "memory: %s is below the minimum of %s", req.Memory, fmtBytes(minMemory))
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
	now := m.now()
	sb := &store.Sandbox{
		ID: newID("sb_"), Name: req.Name, Template: req.Template, State: api.StateCreating,
		CreatedAt: now, TTL: ttl, Meta: req.Meta, CPUs: req.CPUs, Memory: mem, LastActivity: now,
		Network: req.Network,
	}
	var b bootSpec
	if req.From != "" {
		sn, err := m.cfg.Store.Snapshot(ctx, req.From)
		if err != nil {
			return nil, err
		}
		if req.Template != "" && req.Template != sn.Template {
			return nil, api.Errorf(api.ErrInvalid, "template: snapshot %s is of template %s; leave --template out", sn.Name, sn.Template)
		}
		if !m.imageComplete(sn.ID) {
			return nil, api.Errorf(api.ErrUnavailable, "snapshot %s has no complete image on disk", sn.Name)
		}
		// a memory image restores into the network it was taken with
		if sn.Memory && req.Network != "" && req.Network != sn.Network {
			return nil, api.Errorf(api.ErrInvalid, "network: snapshot %s carries its memory, which restores only into the network it was taken with; leave --network out", sn.Name)
		}
		if sn.Network != "" {
			sb.Network = sn.Network
		}
		// A memory image carries its limits; a disk one takes the snapshot's unless asked.
		sb.Template, sb.Source = sn.Template, sn.Name
		if sn.Memory || req.CPUs == 0 {
			sb.CPUs = sn.CPUs
		}
		if sn.Memory || mem == 0 {
			sb.Memory = sn.MemLimit
		}
		if sn.Memory {
			b.image = m.imageMem(sn.ID)
			sb.MemoryRestored = true
			sb.Disk = sn.Disk // the restore names the disk its checkpoint had
		} else if sb.Disk, err = m.newDisk(m.imageDisk(sn.ID)); err != nil {
			return nil, err
		}
	}
	if sb.Template == "" {
		sb.Template = m.cfg.DefaultTemplate
	}
	if b.rootfs, err = m.rootfs(sb.Template); err != nil {
		return nil, err
	}
	// locked before the record exists: a delete that finds the record
	// waits for the create to end
	unlock := m.lock(sb.ID)
	defer unlock()
	if err := m.cfg.Store.CreateSandbox(ctx, sb); err != nil {
		m.releaseDisk(context.WithoutCancel(ctx), sb.Disk)
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
	if err := m.started(ctx, sb, "created", map[string]any{"template": sb.Template, "from": sb.Source}); err != nil {
		return nil, err
	}
	return toAPI(sb), nil
}

// rootfs returns a template's root filesystem, free of symlinks (runsc
// mounts safely: every path it is given must be free of them).
func (m *Manager) rootfs(template string) (string, error) {
	rootfs, err := m.cfg.Templates.Rootfs(template)
	if err != nil {
		return "", err
	}
	if rootfs, err = filepath.EvalSymlinks(rootfs); err != nil {
		return "", fmt.Errorf("template %s: %w", template, err)
	}
	return rootfs, nil
}

// started records a booted sandbox as running and watches it, with an
// event unless event is "".
func (m *Manager) started(ctx context.Context, sb *store.Sandbox, event string, detail map[string]any) error {
	sb.State = api.StateReady
	if err := m.cfg.Store.SetRuntime(ctx, sb.ID, api.StateReady, sb.MemoryRestored, sb.ResumeReason, sb.Image); err != nil {
		return err
	}
	m.watch(ctx, sb.ID)
	if event != "" {
		detail["memoryRestored"] = sb.MemoryRestored
		m.event(ctx, sb.ID, event, detail)
	}
	return nil
}

// bootSpec says what a sandbox boots from: a template's rootfs (and the
// sandbox's disk, if it has one), or a memory image to restore.
type bootSpec struct {
	rootfs string
	image  string
	// background lets runsc load a restored image's pages after it returns.
	background bool
}

// boot gives the sandbox its network, files and runsc sandbox. A network
// that exists already (a stopped sandbox's) is kept.
func (m *Manager) boot(ctx context.Context, sb *store.Sandbox, b bootSpec) error {
	dir := m.sandboxDir(sb.ID)
	etc, upper := filepath.Join(dir, "etc"), filepath.Join(dir, "upper")
	// A stale overlay store (of a stopped sandbox) must not be reused.
	if err := os.RemoveAll(upper); err != nil {
		return err
	}
	for _, d := range []string{etc, upper, filepath.Join(dir, "execs")} {
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
		netns = nw.Path
	}
	var annotations map[string]string
	if sb.Disk != "" {
		annotations = map[string]string{"dev.gvisor.tar.rootfs.upper": sb.Disk}
	}
	bundle := filepath.Join(dir, "bundle")
	err := runsc.WriteBundle(bundle, runsc.SpecOptions{
		Hostname:    sb.ID,
		Rootfs:      b.rootfs,
		AgentDir:    m.agentDir(),
		EtcDir:      etc,
		NetNS:       netns,
		CgroupsPath: m.cgroupsPath(sb.ID),
		CPUs:        sb.CPUs,
		Memory:      sb.Memory,
		Annotations: annotations,
	})
	if err != nil {
		return err
	}
	console, err := os.OpenFile(filepath.Join(dir, "console.log"), os.O_CREATE|os.O_RDWR|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	defer console.Close()
	run := runsc.RunOptions{Bundle: bundle, Console: console, Overlay: upper, Network: sb.Network}
	if b.image != "" {
		return m.cfg.Runtime.Restore(ctx, sb.ID, runsc.RestoreOptions{RunOptions: run, ImageDir: b.image, Background: b.background})
	}
	return m.cfg.Runtime.Run(ctx, sb.ID, run)
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

// Delete removes a sandbox whatever its state: its runsc sandbox, network,
// files and record. Its events stay. Named snapshots stay unless
// withSnapshots; its hibernation image becomes an orphan, swept later.
func (m *Manager) Delete(ctx context.Context, ref string, withSnapshots bool) (*api.DeleteResult, error) {
	sb, err := m.cfg.Store.Sandbox(ctx, ref)
	if err != nil {
		return nil, err
	}
	unlock := m.lock(sb.ID)
	defer unlock()
	ctx = context.WithoutCancel(ctx)
	if err := m.destroy(ctx, sb.ID); err != nil {
		return nil, fmt.Errorf("delete %s: %w", sb.ID, err)
	}
	if err := m.cfg.Store.OrphanImages(ctx, sb.ID, m.now()); err != nil {
		m.log.Error("mark images orphaned", "sandbox", sb.ID, "err", err)
	}
	res := &api.DeleteResult{ID: sb.ID}
	if withSnapshots {
		sns, err := m.cfg.Store.Snapshots(ctx, sb.ID)
		if err != nil {
			return nil, err
		}
		for _, sn := range sns {
			if err := m.deleteSnapshot(ctx, sn); err != nil {
				return res, fmt.Errorf("delete %s: snapshot %s: %w", sb.ID, sn.Name, err)
			}
			res.Snapshots = append(res.Snapshots, sn.Name)
		}
	}
	m.event(ctx, sb.ID, "deleted", map[string]any{"snapshotsRemoved": res.Snapshots})
	return res, nil
}

// destroy removes everything of a sandbox; each step tolerates a missing part.
func (m *Manager) destroy(ctx context.Context, id string) error {
	var disk string
	if sb, err := m.cfg.Store.Sandbox(ctx, id); err == nil {
		disk = sb.Disk
	}
	defer m.releaseDisk(ctx, disk)
	var errs []error
	m.unwatch(id)
	if err := m.cfg.Runtime.Delete(ctx, id); err != nil {
		errs = append(errs, err)
	}
	m.removeCgroups(id)
	if err := m.cfg.Networks.Delete(id); err != nil {
		errs = append(errs, fmt.Errorf("network: %w", err))
	}
	if len(errs) > 0 {
		// Keep the record and files: the sandbox may still be there.
		return errors.Join(errs...)
	}
	m.forgetExecs(id)
	if err := os.RemoveAll(m.sandboxDir(id)); err != nil {
		return err
	}
	return m.cfg.Store.DeleteSandbox(ctx, id)
}
