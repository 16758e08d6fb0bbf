package e2e

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"sbx.dev/sbx/api"
	"sbx.dev/sbx/client"
)

// TestTemplateBaseUser: base has the user commands run as (uid 1000, its
// own home, sudo without a password) and says so in its defaults, and has
// pytest.
func TestTemplateBaseUser(t *testing.T) {
	d := shared
	tm, err := d.client.Template(context.Background(), "base")
	if err != nil {
		t.Fatal(err)
	}
	if tm.Defaults.User != "user" || tm.Defaults.WorkDir != "/home/user" || !strings.HasPrefix(tm.Version, "sha256:") {
		t.Errorf("base = %+v, want user, /home/user and a version", tm)
	}
	id := d.newSandbox(t, "--template", "base")
	for cmd, want := range map[string]string{
		"getent passwd user | cut -d: -f3,4,6":              "1000:1000:/home/user\n",
		"stat -c '%u:%g %a' /home/user":                     "1000:1000 755\n",
		"stat -c '%a %U' /usr/bin/sudo /etc/sudoers.d/user": "4755 root\n440 root\n",
		"cat /etc/sudoers.d/user":                           "user ALL=(ALL:ALL) NOPASSWD: ALL\n",
		"python3 -c 'import pytest; print(1)'":              "1\n",
	} {
		if got := d.must(t, "exec", id, "--user", "root", "--", "/bin/sh", "-c", cmd); got != want {
			t.Errorf("%s = %q, want %q", cmd, got, want)
		}
	}
	// commands run as user by default, at home, and sudo works without a password
	for cmd, want := range map[string]string{
		"id -un; pwd; echo $HOME": "user\n/home/user\n/home/user\n",
		"touch ~/x && echo ok":    "ok\n",
		"sudo -n id -u":           "0\n",
		"touch /root/x 2>&1 || :": "touch: cannot touch '/root/x': Permission denied\n",
	} {
		if got := d.must(t, "exec", id, "--", "/bin/sh", "-c", cmd); got != want {
			t.Errorf("as the default user, %s = %q, want %q", cmd, got, want)
		}
	}
}

// TestTemplateBuildPackages: `template build NAME --packages` is base plus
// those packages; a second build is cached; bad and unknown names get clear
// errors.
func TestTemplateBuildPackages(t *testing.T) {
	d := privateDaemon(t)
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	for _, bad := range [][]string{{"jq;rm"}, {"-o=Dpkg::Options"}, {"JQ"}} {
		if _, err := d.client.BuildTemplate(ctx, "tools", client.WithPackages(bad...)); !errors.Is(err, api.ErrInvalid) || !strings.Contains(err.Error(), "invalid package name") {
			t.Errorf("packages %q = %v, want api.ErrInvalid naming the package", bad, err)
		}
	}
	if _, err := d.client.BuildTemplate(ctx, "base", client.WithPackages("jq")); !errors.Is(err, api.ErrInvalid) {
		t.Errorf("base with packages = %v, want api.ErrInvalid", err)
	}
	start := time.Now()
	tm, err := d.client.BuildTemplate(ctx, "tools", client.WithPackages("jq"))
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("built base + jq in %v (%d MB)", time.Since(start).Round(time.Second), tm.Size>>20)
	if !strings.Contains(tm.Source, "jq") || tm.Defaults.User != "user" {
		t.Errorf("tools = %+v, want jq in its source and base's user", tm)
	}
	id := d.newSandbox(t, "--template", "tools")
	if got := d.must(t, "exec", id, "--", "/bin/sh", "-c", "echo '{\"a\":7}' | jq .a; command -v gdb; command -v git"); got != "7\n/usr/bin/gdb\n/usr/bin/git\n" {
		t.Errorf("jq and base's tools = %q", got)
	}
	var msgs []string
	again, err := d.client.BuildTemplate(ctx, "tools", client.WithProgress(func(p api.Progress) { msgs = append(msgs, p.Message) }), client.WithPackages("jq"))
	if err != nil || again.Version != tm.Version || !strings.Contains(strings.Join(msgs, " "), "cached") {
		t.Errorf("second build = %+v, %v, progress %q; want the cached one", again, err, msgs)
	}
	if _, err := d.client.BuildTemplate(ctx, "tools", client.WithPackages("jq", "tree")); !errors.Is(err, api.ErrConflict) {
		t.Errorf("other packages under the same name without --force = %v, want api.ErrConflict", err)
	}
	if _, err := d.client.BuildTemplate(ctx, "nosuch", client.WithPackages("sbx-no-such-package")); !errors.Is(err, api.ErrInvalid) || !strings.Contains(err.Error(), "sbx-no-such-package") {
		t.Errorf("an unknown package = %v, want api.ErrInvalid naming it", err)
	}
	if _, err := d.client.Template(ctx, "nosuch"); !errors.Is(err, api.ErrNotFound) {
		t.Errorf("the failed build left a template: %v", err)
	}
}
