package e2e

import (
	"context"
	"errors"
	"regexp"
	"strings"
	"testing"
	"time"

	"sbx.dev/sbx/api"
)

var idRE = regexp.MustCompile(`^sb_[a-z2-7]{10}$`)

func TestSandboxLifecycle(t *testing.T) {
	d := shared
	name := "life-" + randHex(3)
	id := d.newSandbox(t, "--template", "tiny", "--name", name, "--ttl", "30m", "--meta", "team=core", "--meta", "run=7")

	list := d.list(t)
	found := false
	for _, sb := range list {
		if sb.ID == id {
			found = true
		}
	}
	if !found {
		t.Errorf("sbx list does not show %s", id)
	}
	var sb api.Sandbox
	sb = d.info(t, name) // a name works wherever an id does
	if sb.ID != id || sb.State != api.StateReady || sb.TTL != api.Duration(30*time.Minute) || sb.Meta["team"] != "core" || sb.Meta["run"] != "7" {
		t.Errorf("info %s = %+v", name, sb)
	}
	if out := d.must(t, "info", id); !strings.Contains(out, name) {
		t.Errorf("human info does not show the name:\n%s", out)
	}

	// A taken name is a conflict, and it loses nothing.
	r := d.sbx(t, "new", "--template", "tiny", "--name", name)
	if r.code != 1 || !strings.Contains(r.stderr, "taken") {
		t.Errorf("taken name: exit %d, stderr %q; want 1 and a message saying it is taken", r.code, r.stderr)
	}
	if _, err := d.client.Sandbox(id).Info(context.Background()); err != nil {
		t.Errorf("the first sandbox is gone after a conflicting create: %v", err)
	}

	d.must(t, "delete", "--yes", name)
	r = d.sbx(t, "info", id)
	if r.code != 1 || !strings.Contains(r.stderr, "sandbox "+id+" not found") {
		t.Errorf("info after delete: exit %d, stderr %q", r.code, r.stderr)
	}
	_, err := d.client.Sandbox(id).Info(context.Background())
	if !errors.Is(err, api.ErrNotFound) {
		t.Errorf("client Get after delete: %v, want ErrNotFound", err)
	}
}

func TestBadInput(t *testing.T) {
	d := shared
	tests := []struct {
		name string
		args []string
		code int
		want string
	}{
		{"unknown id", []string{"info", "sb_aaaaaaaaaa"}, 1, "sandbox sb_aaaaaaaaaa not found"},
		{"unknown name", []string{"exec", "no-such-box", "--", "true"}, 1, "sandbox no-such-box not found"},
		{"unknown delete", []string{"delete", "--yes", "nope"}, 1, "not found"},
		{"bad ttl", []string{"new", "--template", "tiny", "--ttl", "soon"}, 2, "--ttl"},          // a usage error: sbx reads durations
		{"bad memory", []string{"new", "--template", "tiny", "--memory", "lots"}, 2, "--memory"}, // a usage error: sbx reads sizes
		{"bad name", []string{"new", "--template", "tiny", "--name", "no spaces"}, 1, "name"},
		{"unknown template", []string{"new", "--template", "nope"}, 1, "template nope not found"},
		{"no command", []string{"exec"}, 2, ""},
		{"unknown verb", []string{"frobnicate"}, 2, ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := d.sbx(t, tc.args...)
			if r.code != tc.code {
				t.Errorf("exit = %d, want %d (stderr %q)", r.code, tc.code, r.stderr)
			}
			if !strings.Contains(r.stderr, tc.want) {
				t.Errorf("stderr = %q, want it to contain %q", r.stderr, tc.want)
			}
		})
	}
	// The API names the field and uses the right status.
	status, body := d.rawAPI(t, "POST", "/v1/sandboxes", map[string]any{"template": "tiny", "ttl": "nope"})
	if status != 400 || !strings.Contains(string(body), `ttl: \"nope\" is not a duration`) {
		t.Errorf("bad ttl through the API: %d %s, want 400 naming ttl", status, body)
	}
}
