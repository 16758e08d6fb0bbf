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

// Create makes and starts a sandbox. Bad fields are api.ErrInvalid naming
// the field, an unknown template api.ErrNotFound, a taken name api.ErrConflict.
func (m *Manager) Create(ctx context.Context, req api.CreateRequest) (*api.Sandbox, error) {
	if req.Template == "" {
		req.Template = m.cfg.DefaultTemplate
	}
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
	rootfs, err := m.cfg.Templates.Rootfs(req.Template)
	if err != nil {
		return nil, err
	}
	// runsc mounts safely: every path it is given must be free of symlinks.
	if rootfs, err = filepath.EvalSymlinks(rootfs); err != nil {
		return nil, fmt.Errorf("template %s: %w", req.Template, err)
	}
	now := m.now()
	sb := &store.Sandbox{
		ID: newID("sb_"), Name: req.Name, Template: req.Template, State: api.StateCreating,
		CreatedAt: now, TTL: ttl, Meta: req.Meta, CPUs: req.CPUs, Memory: mem, LastActivity: now,
	}
	if err := m.cfg.Store.CreateSandbox(ctx, sb); err != nil {
		return nil, err
	}
	unlock := m.lock(sb.ID)
	defer unlock()
	// Once started, a create finishes or is undone whatever the client does.
	ctx = context.WithoutCancel(ctx)
	if err := m.boot(ctx, sb, rootfs); err != nil {
		if derr := m.destroy(ctx, sb.ID); derr != nil {
			m.log.Error("undo failed create", "sandbox", sb.ID, "err", derr)
		}
		return nil, fmt.Errorf("create %s: %w", sb.ID, err)
	}
	sb.State = api.StateRunning
	if err := m.cfg.Store.SetState(ctx, sb.ID, api.StateRunning, ""); err != nil {
		return nil, err
	}
	m.watch(ctx, sb.ID)
	m.event(ctx, sb.ID, "created", map[string]any{"template": sb.Template})
	return toAPI(sb), nil
}

// boot gives the sandbox its network, files and runsc sandbox.
func (m *Manager) boot(ctx context.Context, sb *store.Sandbox, rootfs string) error {
	dir := m.sandboxDir(sb.ID)
	etc := filepath.Join(dir, "etc")
	for _, d := range []string{etc, filepath.Join(dir, "upper"), filepath.Join(dir, "execs")} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return err
		}
	}
	if err := writeEtc(etc, sb.ID); err != nil {
		return err
	}
	nw, err := m.cfg.Networks.Create(sb.ID)
	if err != nil {
		return fmt.Errorf("network: %w", err)
	}
	bundle := filepath.Join(dir, "bundle")
	err = runsc.WriteBundle(bundle, runsc.SpecOptions{
		Hostname:    sb.ID,
		Rootfs:      rootfs,
		AgentDir:    m.agentDir(),
		EtcDir:      etc,
		NetNS:       nw.Path,
		CgroupsPath: m.cgroupsPath(sb.ID),
		CPUs:        sb.CPUs,
		Memory:      sb.Memory,
	})
	if err != nil {
		return err
	}
	console, err := os.OpenFile(filepath.Join(dir, "console.log"), os.O_CREATE|os.O_RDWR|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	defer console.Close()
	return m.cfg.Runtime.Run(ctx, sb.ID, runsc.RunOptions{Bundle: bundle, Console: console, Overlay: filepath.Join(dir, "upper")})
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
// files and record. Its events stay.
func (m *Manager) Delete(ctx context.Context, ref string) (*api.DeleteResult, error) {
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
	m.event(ctx, sb.ID, "deleted", nil)
	return &api.DeleteResult{ID: sb.ID}, nil
}

// destroy removes everything of a sandbox; each step tolerates a missing part.
func (m *Manager) destroy(ctx context.Context, id string) error {
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
