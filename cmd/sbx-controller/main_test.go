package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestNodeTokenNeverTheAPIs (attack30): the controller never sends the
// fleet's API token to the nodes. Without a node token of their own it
// refuses to start, and a --node-token-file holding the API's token is
// refused too.
func TestNodeTokenNeverTheAPIs(t *testing.T) {
	dir := t.TempDir()
	api := filepath.Join(dir, "api-token")
	same := filepath.Join(dir, "node-token")
	for _, p := range []string{api, same} {
		if err := os.WriteFile(p, []byte("0123456789abcdef0123456789abcdef\n"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	kc := filepath.Join(dir, "kubeconfig")
	if err := os.WriteFile(kc, []byte("apiVersion: v1\nkind: Config\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--kubeconfig", kc, "--token-file", api, "--listen", "127.0.0.1:0"}, "give --node-token-key"},
		{[]string{"--kubeconfig", kc, "--token-file", api, "--node-token-file", same, "--listen", "127.0.0.1:0"}, "holds the fleet's API token"},
		{[]string{"--kubeconfig", kc, "--token-file", api, "--node-token-file", same, "--node-token-key", api, "--listen", "127.0.0.1:0"}, "holds the fleet's API token"},
	} {
		err := run(c.args)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("sbx-controller %s: %v, want refused saying %q", strings.Join(c.args, " "), err, c.want)
		}
	}
}
