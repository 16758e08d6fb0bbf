package sandbox

import (
	"os"
	"path/filepath"
	"slices"
	"syscall"
	"testing"

	"sbx.dev/sbx/api"
	"sbx.dev/sbx/internal/agent/hooks"
	"sbx.dev/sbx/internal/store"
)

// TestAgentVersions: each agent is installed into a directory of its own,
// never written again; an image names the agent it was captured with and
// a restore mounts that one, while fresh boots mount the newest.
func TestAgentVersions(t *testing.T) {
	// a strict umask: the install must not depend on the caller's
	defer syscall.Umask(syscall.Umask(0o077))
	m, _ := newTestManager(t, 0)
	oldKey, oldDir, _ := m.agentFor("")
	oldBody, err := os.ReadFile(filepath.Join(oldDir, "sbx-agent"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Readlink(filepath.Join(oldDir, "freeze")); err != nil {
		t.Errorf("no freeze command beside the agent: %v", err)
	}

	// a sandbox booted on it, and a memory image of it
	sbDir := m.sandboxDir("sb_old")
	if err := os.MkdirAll(sbDir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(sbDir, sandboxAgentFile), []byte(oldKey+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	img, err := m.images.make(true)
	if err != nil {
		t.Fatal(err)
	}
	if err := noteImageAgent("", sbDir, m.images.dir(img)); err != nil {
		t.Fatal(err)
	}

	// sbx is upgraded: a new agent at the same path
	if err := os.WriteFile(m.cfg.AgentBinary, []byte("#!/bin/true\n# the next release\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := m.installAgent(); err != nil {
		t.Fatal(err)
	}
	newKey, newDir, _ := m.agentFor("")
	if newKey == oldKey || newDir == oldDir {
		t.Fatalf("the new agent went to %s (%s), the old one's directory", newDir, newKey)
	}
	if b, err := os.ReadFile(filepath.Join(oldDir, "sbx-agent")); err != nil || string(b) != string(oldBody) {
		t.Errorf("the old agent's binary changed under its sandboxes: %q, %v", b, err)
	}
	if key, dir, err := m.agentFor(img); err != nil || key != oldKey || dir != oldDir {
		t.Errorf("a restore of the image mounts %s (%s, %v), want the agent it was captured with, %s", dir, key, err, oldDir)
	}

	// installing the same agent again changes nothing: not a file
	before, err := os.Stat(filepath.Join(newDir, "sbx-agent"))
	if err != nil {
		t.Fatal(err)
	}
	if err := m.installAgent(); err != nil {
		t.Fatal(err)
	}
	if k, _, _ := m.agentFor(""); k != newKey {
		t.Errorf("a second install of the same agent gave %s, want %s", k, newKey)
	}
	if after, err := os.Stat(filepath.Join(newDir, "sbx-agent")); err != nil || !os.SameFile(before, after) {
		t.Errorf("a second install of the same agent wrote its binary again")
	}
	// a fleet places memory by the builds a node holds, the current first,
	// and by the one a sandbox's processes run on
	if got := m.Agents(); !slices.Equal(got, []string{newKey, oldKey}) {
		t.Errorf("agents held: %v, want %v", got, []string{newKey, oldKey})
	}
	if got := m.agentOf(&store.Sandbox{ID: "sb_old", State: api.StateReady}); got != oldKey {
		t.Errorf("a sandbox booted on the old agent says it runs %q, want %s", got, oldKey)
	}
	if got := m.agentOf(&store.Sandbox{ID: "sb_gone", State: api.StateStopped, Image: img}); got != oldKey {
		t.Errorf("a sandbox stopped into an image of the old agent says it runs %q, want %s", got, oldKey)
	}
	if got := m.agentOf(&store.Sandbox{ID: "sb_new", State: api.StateCreating}); got != "" {
		t.Errorf("a sandbox not booted yet says it runs %q", got)
	}

	// an image naming no agent (taken before the notes; no legacy agent
	// here), one whose agent this host lacks, and one whose note is not a
	// key: refused, its init would wake up on another binary
	for name, note := range map[string]string{"none": "", "missing": "0123456789abcdef", "escape": "../../../etc"} {
		img, err := m.images.make(true)
		if err != nil {
			t.Fatal(err)
		}
		if note != "" {
			if err := os.WriteFile(filepath.Join(m.images.dir(img), imageAgentFile), []byte(note+"\n"), 0o600); err != nil {
				t.Fatal(err)
			}
		}
		if key, dir, err := m.agentFor(img); err == nil {
			t.Errorf("%s: a restore mounts %s (%s), want it refused", name, dir, key)
		}
	}

	// a sandbox booted before the notes runs the legacy agent, right in
	// DATA_DIR/agent: its images say so, and restore on it while it is there
	legacyDir := m.sandboxDir("sb_legacy")
	if err := os.MkdirAll(legacyDir, 0o700); err != nil {
		t.Fatal(err)
	}
	img, err = m.images.make(true)
	if err != nil {
		t.Fatal(err)
	}
	if err := noteImageAgent("", legacyDir, m.images.dir(img)); err != nil {
		t.Fatal(err)
	}
	if _, _, err := m.agentFor(img); err == nil {
		t.Errorf("a legacy image with no legacy agent left restores")
	}
	if err := os.WriteFile(filepath.Join(m.agentRoot(), "sbx-agent"), oldBody, 0o755); err != nil {
		t.Fatal(err)
	}
	if key, dir, err := m.agentFor(img); err != nil || key != agentLegacy || dir != m.agentRoot() {
		t.Errorf("a legacy image restores on %s (%s, %v), want the legacy agent in %s", dir, key, err, m.agentRoot())
	}
	// not published: a legacy image's memory restores only where it was
	// taken (each node's legacy agent may be another release's)
	if got := m.Agents(); !slices.Equal(got, []string{newKey, oldKey}) {
		t.Errorf("agents held with the legacy one: %v, want the named builds alone", got)
	}
	if got := m.agentOf(&store.Sandbox{ID: "sb_legacy", State: api.StateReady}); got != agentLegacy {
		t.Errorf("a sandbox booted before the notes says it runs %q, want %s", got, agentLegacy)
	}
	// with a legacy agent here, an image with no note restores on it, but
	// one whose note is not a key (cut short, damaged) is still refused
	for name, note := range map[string]string{"empty": "", "cut": "0123456", "escape": "../../../etc"} {
		img, err := m.images.make(true)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(m.images.dir(img), imageAgentFile), []byte(note), 0o600); err != nil {
			t.Fatal(err)
		}
		if key, dir, err := m.agentFor(img); err == nil {
			t.Errorf("%s note: a restore mounts %s (%s), want it refused", name, dir, key)
		}
	}

	// an agent directory whose files are not what its name says (a crash
	// kept the rename, not the data) is written again
	if err := os.WriteFile(filepath.Join(newDir, "sbx-agent"), nil, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := m.installAgent(); err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(filepath.Join(newDir, "sbx-agent")); err != nil || len(b) == 0 {
		t.Errorf("a damaged agent directory was kept: %q, %v", b, err)
	}
	// set aside, not removed: a sandbox may mount it still
	if aside, _ := filepath.Glob(newDir + ".damaged-*"); len(aside) != 1 {
		t.Errorf("the damaged agent directory set aside: %v, want one", aside)
	}
	// and what a killed install left is removed
	if err := os.MkdirAll(filepath.Join(m.agentRoot(), "v", "fedcba9876543210.tmp"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := m.installAgent(); err != nil {
		t.Fatal(err)
	}
	if fileExists(filepath.Join(m.agentRoot(), "v", "fedcba9876543210.tmp")) {
		t.Errorf("a killed install's temporary directory is left")
	}
	// neither a damaged directory nor a half-made one is a build held
	if err := os.MkdirAll(filepath.Join(m.agentRoot(), "v", "0123456789abcdef"), 0o755); err != nil {
		t.Fatal(err)
	}
	if got := m.Agents(); !slices.Equal(got, []string{newKey, oldKey}) {
		t.Errorf("agents held after a damaged and a half-made directory: %v", got)
	}
	// every user inside reads the hooks
	for name := range hooks.Files {
		for d := filepath.Dir(filepath.Join(newDir, filepath.FromSlash(name))); d != newDir; d = filepath.Dir(d) {
			if fi, err := os.Stat(d); err != nil || fi.Mode().Perm() != 0o755 {
				t.Errorf("%s: %v %v, want 0755", d, fi.Mode(), err)
			}
		}
	}
}
