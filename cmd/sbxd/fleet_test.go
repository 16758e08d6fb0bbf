package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestFleetAgentConfig: what is wrong in the flags stops sbxd with a
// message naming the flag; what is right makes an agent without reaching
// any apiserver (none listens at the kubeconfig's address).
func TestFleetAgentConfig(t *testing.T) {
	dir := t.TempDir()
	runscPath := filepath.Join(dir, "runsc")
	kc := filepath.Join(dir, "kubeconfig")
	if err := os.WriteFile(runscPath, []byte("not really runsc"), 0o755); err != nil {
		t.Fatal(err)
	}
	kubeconfig := "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster: {server: 'https://127.0.0.1:1'}\n" +
		"users:\n- name: u\n  user: {token: x}\ncontexts:\n- name: c\n  context: {cluster: c, user: u}\ncurrent-context: c\n"
	if err := os.WriteFile(kc, []byte(kubeconfig), 0o600); err != nil {
		t.Fatal(err)
	}
	base := config{runsc: runscPath, dataDir: dir, socket: filepath.Join(dir, "s.sock"), fleetKubeconfig: kc, nodeName: "node-1"}
	for _, tc := range []struct {
		name    string
		edit    func(c *config)
		wantErr string
	}{
		{"ok", func(c *config) {}, ""},
		{"bad node name", func(c *config) { c.nodeName = "Node_1" }, "--node-name"},
		// attack30: views are named NODE.ID; node-1.x's would be node-1's
		{"dotted node name", func(c *config) { c.nodeName = "node-1.x" }, "--node-name"},
		{"no kubeconfig", func(c *config) { c.fleetKubeconfig = filepath.Join(dir, "missing") }, "kubeconfig"},
		{"no runsc", func(c *config) { c.runsc = filepath.Join(dir, "missing") }, "runsc"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := base
			tc.edit(&c)
			node, err := nodeName(c)
			if err == nil {
				_, err = fleetAgent(c, node, nil, nil, nil)
			}
			switch {
			case tc.wantErr == "" && err != nil:
				t.Errorf("got %v, want no error", err)
			case tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)):
				t.Errorf("got %v, want an error naming %s", err, tc.wantErr)
			}
		})
	}
}
