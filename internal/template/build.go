package template

import (
	"bufio"
	"context"
	"debug/elf"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"sbx.dev/sbx/api"
)

// The templates Build knows.
const (
	Tiny = "tiny"
	Base = "base"
)

// busyboxPath is where Debian's busybox-static puts busybox.
var busyboxPath = "/bin/busybox"

// basePackages are what the base template adds to Debian's minbase.
var basePackages = []string{
	"bash", "python3", "procps", "iproute2", "lsof", "strace", "gdb", "curl", "ca-certificates", "git",
}

// baseSuite is the Debian release the base template is built from.
const baseSuite = "bookworm"

// Build builds template name, one of Tiny and Base, and returns it. If it
// is already complete and force is false it returns it at once, saying
// "cached". A forced build replaces the old template only once the new
// one is complete; a failed or cancelled build leaves nothing behind.
// Builds of one name take turns. Errors: api.ErrInvalid for any other
// name, api.ErrUnavailable when the host lacks the build tool.
func (s *Store) Build(ctx context.Context, name string, force bool, progress func(msg string)) (api.Template, error) {
	progress = orNop(progress)
	var source string
	var fill func(ctx context.Context, rootfs string) error
	switch name {
	case Tiny:
		source = "build tiny (busybox-static)"
		fill = func(ctx context.Context, rootfs string) error { return buildTiny(ctx, rootfs, progress) }
	case Base:
		source = "build base (mmdebstrap " + baseSuite + " minbase)"
		fill = func(ctx context.Context, rootfs string) error { return buildBase(ctx, rootfs, progress) }
	default:
		return api.Template{}, api.Errorf(api.ErrInvalid, "cannot build template %q: sbx builds %q and %q; `sbx template import` makes others", name, Tiny, Base)
	}
	unlock, err := s.lock(ctx, name)
	if err != nil {
		return api.Template{}, err
	}
	defer unlock()
	if !force {
		if t, err := s.Get(name); err == nil {
			progress("cached")
			return t, nil
		}
	}
	progress("building " + name)
	t, err := s.create(ctx, name, source, progress, fill)
	if err != nil {
		return api.Template{}, fmt.Errorf("build template %s: %w", name, err)
	}
	progress(fmt.Sprintf("built %s (%d MB)", name, t.Size>>20))
	return t, nil
}

// buildTiny makes a busybox rootfs: /bin holds busybox and a link for each
// of its applets, and /sbin, /usr/bin and /usr/sbin link to /bin.
func buildTiny(ctx context.Context, rootfs string, progress func(string)) error {
	if err := checkStatic(busyboxPath); err != nil {
		return err
	}
	out, err := exec.CommandContext(ctx, busyboxPath, "--list").Output()
	if err != nil {
		return fmt.Errorf("%s --list: %w", busyboxPath, err)
	}
	for _, d := range []string{"", "bin", "etc", "usr"} {
		if err := os.Mkdir(filepath.Join(rootfs, d), 0o755); err != nil {
			return err
		}
	}
	if err := copyFile(busyboxPath, filepath.Join(rootfs, "bin/busybox"), 0o755); err != nil {
		return err
	}
	n := 0
	for _, applet := range strings.Fields(string(out)) {
		if applet == "busybox" || strings.ContainsAny(applet, "/\x00") || applet == "." || applet == ".." {
			continue
		}
		if err := os.Symlink("busybox", filepath.Join(rootfs, "bin", applet)); err != nil {
			return err
		}
		n++
	}
	progress(fmt.Sprintf("linked %d busybox applets", n))
	links := []struct{ name, target string }{
		{"sbin", "bin"},
		{"usr/bin", "../bin"},
		{"usr/sbin", "../bin"},
	}
	for _, l := range links {
		if err := os.Symlink(l.target, filepath.Join(rootfs, l.name)); err != nil {
			return err
		}
	}
	files := []struct{ name, data string }{
		{"etc/passwd", "root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n"},
		{"etc/group", "root:x:0:\nnogroup:x:65534:\n"},
	}
	for _, f := range files {
		if err := os.WriteFile(filepath.Join(rootfs, f.name), []byte(f.data), 0o644); err != nil {
			return err
		}
	}
	return nil
}

// checkStatic fails unless path is a statically linked executable: the
// tiny rootfs has no libraries for a dynamic one.
func checkStatic(path string) error {
	f, err := elf.Open(path)
	if errors.Is(err, os.ErrNotExist) {
		return api.Errorf(api.ErrUnavailable, "%s is missing; run `apt-get install busybox-static`", path)
	}
	if err != nil {
		return fmt.Errorf("read %s: %w", path, err)
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			return api.Errorf(api.ErrUnavailable, "%s is dynamically linked; run `apt-get install busybox-static`", path)
		}
	}
	return nil
}

func copyFile(src, dst string, mode os.FileMode) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, mode)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}

// buildBase runs mmdebstrap with the host's apt sources and network
// options, streaming its output to progress.
func buildBase(ctx context.Context, rootfs string, progress func(string)) error {
	bin, err := exec.LookPath("mmdebstrap")
	if err != nil {
		return api.Errorf(api.ErrUnavailable, "mmdebstrap is missing; run `apt-get install mmdebstrap`")
	}
	args := []string{"--variant=minbase", "--include=" + strings.Join(basePackages, ",")}
	for _, o := range hostAptOptions(ctx) {
		args = append(args, "--aptopt="+o)
	}
	args = append(args, baseSuite, rootfs)
	// mmdebstrap copies each sources file given in place of a mirror;
	// with none it falls back to deb.debian.org
	args = append(args, hostSources("/etc/apt")...)

	cmd := exec.CommandContext(ctx, bin, args...)
	// on SIGTERM mmdebstrap finishes its current phase (up to half a
	// minute) and unmounts the chroot's /proc, /sys and /dev; a SIGKILL
	// would leave them mounted (removeTree copes, but it is the backstop)
	cmd.Cancel = func() error { return cmd.Process.Signal(syscall.SIGTERM) }
	cmd.WaitDelay = 2 * time.Minute
	r, w, err := os.Pipe()
	if err != nil {
		return err
	}
	cmd.Stdout, cmd.Stderr = w, w
	if err := cmd.Start(); err != nil {
		r.Close()
		w.Close()
		return fmt.Errorf("start mmdebstrap: %w", err)
	}
	w.Close()
	var tail []string
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		line := sc.Text()
		progress(line)
		if tail = append(tail, line); len(tail) > 10 {
			tail = tail[1:]
		}
	}
	r.Close()
	if err := cmd.Wait(); err != nil {
		if ctx.Err() != nil {
			return fmt.Errorf("mmdebstrap: %w", ctx.Err())
		}
		return fmt.Errorf("mmdebstrap: %w: %s", err, strings.Join(tail, "\n"))
	}
	// apt's lists and caches are a third of a fresh system and a sandbox
	// that wants packages runs apt-get update anyway
	for _, g := range []string{"var/lib/apt/lists/*_*", "var/cache/apt/*.bin", "var/cache/apt/archives/*.deb"} {
		m, _ := filepath.Glob(filepath.Join(rootfs, g))
		for _, p := range m {
			if err := os.RemoveAll(p); err != nil {
				return err
			}
		}
	}
	return nil
}

// hostSources returns the host's apt sources files under etc.
func hostSources(etc string) []string {
	var out []string
	if fi, err := os.Stat(filepath.Join(etc, "sources.list")); err == nil && fi.Size() > 0 {
		out = append(out, filepath.Join(etc, "sources.list"))
	}
	for _, pat := range []string{"*.list", "*.sources"} {
		m, _ := filepath.Glob(filepath.Join(etc, "sources.list.d", pat))
		out = append(out, m...)
	}
	return out
}

// aptNetworkOptions are the host apt options a build needs to reach the
// host's mirrors the way the host does (a proxy, a pinned snapshot).
var aptNetworkOptions = []string{
	"acquire::check-valid-until",
	"acquire::check-date",
	"acquire::http::proxy",
	"acquire::https::proxy",
	"acquire::ftp::proxy",
	"acquire::retries",
	"acquire::forceipv4",
	"acquire::forceipv6",
}

// hostAptOptions returns the host's network-related apt options as
// apt.conf lines, or none if apt-config is missing.
func hostAptOptions(ctx context.Context) []string {
	out, err := exec.CommandContext(ctx, "apt-config", "dump").Output()
	if err != nil {
		return nil
	}
	return filterAptOptions(string(out))
}

func filterAptOptions(dump string) []string {
	var opts []string
	for _, line := range strings.Split(dump, "\n") {
		key, val, ok := strings.Cut(line, " ")
		if !ok || val == `""` || val == `"";` {
			continue
		}
		k := strings.ToLower(key)
		for _, o := range aptNetworkOptions {
			if k == o || strings.HasPrefix(k, o+"::") {
				opts = append(opts, line)
				break
			}
		}
	}
	return opts
}
