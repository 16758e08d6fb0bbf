package sandbox

import (
	"context"
	"fmt"
	"path/filepath"
	"sort"
	"sync"

	"sbx.dev/sbx/api"
	"sbx.dev/sbx/internal/store"
)

// Templates are versioned (DESIGN §2): a name points at a version, a
// content digest, and every sandbox and snapshot records the version it
// was made on and holds it for as long as it lives. Rebuilding or removing
// a name never changes what an existing sandbox sees; a version's files go
// only when nothing holds it.

// versionLeases are the versions held by creates in flight, between the
// name's resolution and the record that holds the version.
type versionLeases struct {
	mu sync.Mutex
	n  map[string]int
	// defaults caches each version's defaults (a version never changes).
	defaults map[string]api.TemplateDefaults
}

// takeLocked holds version; the caller holds mu.
func (v *versionLeases) takeLocked(version string) func() {
	if v.n == nil {
		v.n = map[string]int{}
	}
	v.n[version]++
	var once sync.Once
	return func() {
		once.Do(func() {
			v.mu.Lock()
			defer v.mu.Unlock()
			if v.n[version]--; v.n[version] <= 0 {
				delete(v.n, version)
			}
		})
	}
}

func (v *versionLeases) held(version string) bool {
	v.mu.Lock()
	defer v.mu.Unlock()
	return v.n[version] > 0
}

// resolveTemplate returns the version name points at now, held until
// release is called (once the sandbox's record holds it).
func (m *Manager) resolveTemplate(name string) (api.Template, func(), error) {
	// Resolved, leased, then resolved again, with no lock held across the
	// reads: a collection that judged the version unheld before the lease
	// (a rebuild moved the name meanwhile) may be removing it, and the
	// second read sees that: the name moved, or the version is gone. Then
	// again, with the name's version of now.
	for try := 0; ; try++ {
		t, err := m.cfg.Templates.Resolve(name)
		if err != nil {
			return api.Template{}, nil, err
		}
		m.versions.mu.Lock()
		release := m.versions.takeLocked(t.Version)
		m.versions.mu.Unlock()
		again, err := m.cfg.Templates.Resolve(name)
		if err == nil && again.Version == t.Version {
			return t, release, nil
		}
		release()
		if err != nil {
			return api.Template{}, nil, err
		}
		if try == 8 {
			return api.Template{}, nil, api.Errorf(api.ErrConflict, "template %s: it is being rebuilt, again and again; try again", name)
		}
	}
}

// rootfs returns the root filesystem of a sandbox's template version, free
// of symlinks (runsc mounts safely: every path it is given must be free of
// them). A sandbox made before templates had versions is given the
// version its template's name points at.
func (m *Manager) rootfs(sb *store.Sandbox) (string, error) {
	if sb.TemplateVersion == "" {
		t, err := m.cfg.Templates.Resolve(sb.Template)
		if err != nil {
			return "", err
		}
		sb.TemplateVersion = t.Version
		if err := m.cfg.Store.SetTemplateVersion(context.Background(), sb.ID, t.Version); err != nil {
			return "", err
		}
	}
	rootfs, err := m.cfg.Templates.VersionRootfs(sb.TemplateVersion)
	if err != nil {
		return "", fmt.Errorf("template %s (version %s): %w", sb.Template, shortVersion(sb.TemplateVersion), err)
	}
	if rootfs, err = filepath.EvalSymlinks(rootfs); err != nil {
		return "", fmt.Errorf("template %s: %w", sb.Template, err)
	}
	return rootfs, nil
}

func shortVersion(v string) string {
	if len(v) > 19 {
		return v[:19]
	}
	return v
}

// defaults are what a command in sb gets unless it asks otherwise: its
// template version's defaults (a user, a working directory, environment).
func (m *Manager) defaults(sb *store.Sandbox) api.TemplateDefaults {
	if sb.TemplateVersion == "" {
		return api.TemplateDefaults{}
	}
	m.versions.mu.Lock()
	d, ok := m.versions.defaults[sb.TemplateVersion]
	m.versions.mu.Unlock()
	if ok {
		return d
	}
	t, err := m.cfg.Templates.Version(sb.TemplateVersion)
	if err != nil {
		m.log.Warn("read a template version's defaults", "version", sb.TemplateVersion, "err", err)
		return api.TemplateDefaults{}
	}
	m.versions.mu.Lock()
	if m.versions.defaults == nil {
		m.versions.defaults = map[string]api.TemplateDefaults{}
	}
	m.versions.defaults[sb.TemplateVersion] = t.Defaults // a version never changes
	m.versions.mu.Unlock()
	return t.Defaults
}

// defaultUser is the user a request names when it names none: who runs a
// command, whose home ~ is, who owns the files it makes. "" is root.
func (m *Manager) defaultUser(sb *store.Sandbox) string { return m.defaults(sb).User }

// versionsInUse returns a test of whether a version is held, by a record
// or by a create in flight, asked afresh for each version (a create may
// record a version at any moment while Collect runs), and the holders
// of each version as of now.
func (m *Manager) versionsInUse(ctx context.Context) (func(string) bool, map[string][]string, error) {
	held, err := m.cfg.Store.TemplateVersionsInUse(ctx)
	if err != nil {
		return nil, nil, err
	}
	return func(v string) bool {
		// the lease first: a create releases it only once its record holds v
		if m.versions.held(v) {
			return true
		}
		used, err := m.cfg.Store.TemplateVersionHeld(context.WithoutCancel(ctx), v)
		return err != nil || used // when it cannot tell, keep it
	}, held, nil
}

// collectTemplates removes the template versions nothing holds any more.
func (m *Manager) collectTemplates(ctx context.Context) {
	inUse, _, err := m.versionsInUse(ctx)
	if err != nil {
		m.log.Warn("collect template versions", "err", err)
		return
	}
	removed, err := m.cfg.Templates.Collect(inUse)
	if err != nil {
		m.log.Warn("collect template versions", "err", err)
	}
	for _, v := range removed {
		m.log.Info("removed a template version nothing holds", "version", v)
	}
}

// RemoveTemplate removes a template's name and says which sandboxes and
// snapshots still hold the version it pointed at (its files stay until
// the last of them goes). An unknown name is api.ErrNotFound.
func (m *Manager) RemoveTemplate(ctx context.Context, name string) (*api.Template, error) {
	t, err := m.cfg.Templates.Remove(name)
	if err != nil {
		return nil, err
	}
	_, held, err := m.versionsInUse(ctx)
	if err != nil {
		return nil, err
	}
	t.HeldBy = held[t.Version]
	sort.Strings(t.HeldBy)
	go m.collectTemplates(context.WithoutCancel(ctx))
	return &t, nil
}

// TemplateChanged has the versions a rebuild or an import left without a
// name collected, unless something holds them.
func (m *Manager) TemplateChanged(ctx context.Context) {
	go m.collectTemplates(context.WithoutCancel(ctx))
}
