package template

import (
	"context"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"sbx.dev/sbx/api"
)

// TestBuildBase runs the real mmdebstrap build; it takes a minute and needs
// Debian's mirrors, so it runs only with SBX_TEST_BASE=1.
func TestBuildBase(t *testing.T) {
	if os.Getenv("SBX_TEST_BASE") != "1" {
		t.Skip("set SBX_TEST_BASE=1 to build the base template")
	}
	s, _ := openStore(t)
	var rec recorder
	start := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	tmpl, err := s.Build(ctx, Base, false, nil, rec.add)
	if err != nil {
		t.Fatalf("Build base: %v\nprogress:\n%s", err, strings.Join(rec.msgs, "\n"))
	}
	t.Logf("built base in %v: %d MB", time.Since(start).Round(time.Second), tmpl.Size>>20)
	if !rec.has("I: success") {
		t.Errorf("progress did not stream mmdebstrap's output: %q", rec.msgs)
	}
	rootfs, err := s.Rootfs(Base)
	if err != nil {
		t.Fatal(err)
	}
	for _, prog := range []string{"bash", "python3", "ps", "ip", "lsof", "strace", "gdb", "curl", "git"} {
		found := false
		for _, d := range []string{"usr/bin", "usr/sbin", "bin", "sbin"} {
			if _, err := os.Lstat(filepath.Join(rootfs, d, prog)); err == nil {
				found = true
				break
			}
		}
		if !found {
			t.Errorf("base has no %s", prog)
		}
	}
	if m, _ := filepath.Glob(filepath.Join(rootfs, "var/lib/apt/lists/*_*")); len(m) > 0 {
		t.Errorf("apt lists left behind: %q", m)
	}
	checkSkeleton(t, rootfs)
	if got, want := tmpl.Defaults, (api.TemplateDefaults{User: "user", WorkDir: "/home/user"}); !cmp.Equal(got, want) {
		t.Errorf("defaults = %+v, want %+v", got, want)
	}
	for _, f := range []struct{ path, line string }{
		{"etc/passwd", "user:x:1000:1000::/home/user:/bin/bash"},
		{"etc/group", "user:x:1000:"},
		{"etc/sudoers.d/user", "user ALL=(ALL:ALL) NOPASSWD: ALL"},
	} {
		b, err := os.ReadFile(filepath.Join(rootfs, f.path))
		if err != nil || !strings.Contains(string(b), f.line) {
			t.Errorf("/%s = %q, %v; want a line %q", f.path, b, err, f.line)
		}
	}
	if fi, err := os.Stat(filepath.Join(rootfs, "etc/sudoers.d/user")); err != nil || fi.Mode().Perm() != 0o440 {
		t.Errorf("/etc/sudoers.d/user: %v, %v; want mode 0440", fi, err)
	}
	if fi, err := os.Stat(filepath.Join(rootfs, "home/user")); err != nil || fi.Sys().(*syscall.Stat_t).Uid != 1000 || fi.Sys().(*syscall.Stat_t).Gid != 1000 {
		t.Errorf("/home/user: %v; want a directory owned by 1000:1000", err)
	}
	if fi, err := os.Stat(filepath.Join(rootfs, "usr/bin/sudo")); err != nil || fi.Mode()&fs.ModeSetuid == 0 {
		t.Errorf("/usr/bin/sudo: %v; want a setuid binary", err)
	}
	if os.Geteuid() == 0 {
		out, err := exec.Command("chroot", rootfs, "python3", "-c", "import pytest; print(pytest.__name__)").CombinedOutput()
		if err != nil || strings.TrimSpace(string(out)) != "pytest" {
			t.Errorf("chroot python3 -c 'import pytest' = %q, %v", out, err)
		}
	}
	if os.Geteuid() == 0 {
		out, err := exec.Command("chroot", rootfs, "python3", "-c", "print('hi')").CombinedOutput()
		if err != nil || strings.TrimSpace(string(out)) != "hi" {
			t.Errorf("chroot python3 = %q, %v", out, err)
		}
	}
	if mounts, err := mountsUnder(filepath.Dir(filepath.Dir(rootfs))); err != nil || len(mounts) > 0 {
		t.Errorf("mounts left under the store: %q, %v", mounts, err)
	}
}

// TestBuildBaseCancel cancels a base build while mmdebstrap has the chroot's
// /proc, /sys and /dev mounted: nothing may be left, least of all a mount.
func TestBuildBaseCancel(t *testing.T) {
	if os.Getenv("SBX_TEST_BASE") != "1" {
		t.Skip("set SBX_TEST_BASE=1 to build the base template")
	}
	s, dir := openStore(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	start := time.Now()
	_, err := s.Build(ctx, Base, false, nil, func(m string) {
		t.Logf("%v %s", time.Since(start).Round(time.Millisecond), m)
		if strings.Contains(m, "installing") {
			cancel()
		}
	})
	if err == nil || ctx.Err() == nil {
		t.Fatalf("Build = %v, want a cancelled build", err)
	}
	noLeftovers(t, dir)
	if mounts, err := mountsUnder(dir); err != nil || len(mounts) > 0 {
		t.Errorf("mounts left under the store: %q, %v", mounts, err)
	}
	if _, err := os.Stat("/dev/null"); err != nil {
		t.Errorf("host /dev/null: %v", err)
	}
}
