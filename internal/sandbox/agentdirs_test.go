package sandbox

import (
	"os"
	"path/filepath"
	"testing"
)

// TestAgentVersions: each agent is installed into a directory of its own,
// never written again; an image names the agent it was captured with and
// a restore mounts that one, while fresh boots mount the newest.
func TestAgentVersions(t *testing.T) {
	m, _ := newTestManager(t, 0)
	oldKey, oldDir := m.agentFor("")
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
	if err := noteImageAgent(sbDir, m.images.dir(img)); err != nil {
		t.Fatal(err)
	}

	// sbx is upgraded: a new agent at the same path
	if err := os.WriteFile(m.cfg.AgentBinary, []byte("#!/bin/true\n# the next release\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := m.installAgent(); err != nil {
		t.Fatal(err)
	}
	newKey, newDir := m.agentFor("")
	if newKey == oldKey || newDir == oldDir {
		t.Fatalf("the new agent went to %s (%s), the old one's directory", newDir, newKey)
	}
	if b, err := os.ReadFile(filepath.Join(oldDir, "sbx-agent")); err != nil || string(b) != string(oldBody) {
		t.Errorf("the old agent's binary changed under its sandboxes: %q, %v", b, err)
	}
	if key, dir := m.agentFor(img); key != oldKey || dir != oldDir {
		t.Errorf("a restore of the image mounts %s (%s), want the agent it was captured with, %s", dir, key, oldDir)
	}

	// installing the same agent again changes nothing
	if err := m.installAgent(); err != nil {
		t.Fatal(err)
	}
	if k, _ := m.agentFor(""); k != newKey {
		t.Errorf("a second install of the same agent gave %s, want %s", k, newKey)
	}

	// an image naming no agent (taken before the notes), one whose agent
	// this host lacks, and one whose note is not a key: this sbxd's
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
		if key, dir := m.agentFor(img); key != newKey || dir != newDir {
			t.Errorf("%s: a restore mounts %s (%s), want this sbxd's %s", name, dir, key, newDir)
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
	if err := noteImageAgent(legacyDir, m.images.dir(img)); err != nil {
		t.Fatal(err)
	}
	if key, _ := m.agentFor(img); key != newKey {
		t.Errorf("a legacy image with no legacy agent left restores on %s, want %s", key, newKey)
	}
	if err := os.WriteFile(filepath.Join(m.agentRoot(), "sbx-agent"), oldBody, 0o755); err != nil {
		t.Fatal(err)
	}
	if key, dir := m.agentFor(img); key != agentLegacy || dir != m.agentRoot() {
		t.Errorf("a legacy image restores on %s (%s), want the legacy agent in %s", dir, key, m.agentRoot())
	}
}
