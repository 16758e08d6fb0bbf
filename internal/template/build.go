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
	"regexp"
	"sort"
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
	"bash", "python3", "python3-pytest", "procps", "iproute2", "lsof", "strace", "ltrace", "gdb", "curl", "ca-certificates", "git", "sudo",
}

// baseSuite is the Debian release the base template is built from.
const baseSuite = "bookworm"

// The user base runs commands as.
const (
	baseUser = "user"
	baseUID  = 1000
	baseHome = "/home/user"
)

// The recipes: a template's Source says which made it, with the digest of
// the code that did (recipe.go), and a build of a template made by another
// recipe or other code builds it again.
const (
	tinySource = "build tiny (busybox-static)"
	baseSource = "build base v2 (mmdebstrap " + baseSuite + " minbase; user, sudo)"
)

// maxPackages bounds --packages.
const maxPackages = 200

var packageRE = regexp.MustCompile(`^[a-z0-9][a-z0-9+.-]{1,99}$`)

// ValidPackages checks Debian package names (policy §5.6.1: lowercase
// letters, digits, '+', '-' and '.', two or more, starting with a letter or
// digit) and returns them sorted, without repeats: api.ErrInvalid otherwise.
func ValidPackages(pkgs []string) ([]string, error) {
	if len(pkgs) > maxPackages {
		return nil, api.Errorf(api.ErrInvalid, "%d packages: at most %d", len(pkgs), maxPackages)
	}
	seen := map[string]bool{}
	var out []string
	for _, p := range pkgs {
		if !packageRE.MatchString(p) {
			return nil, api.Errorf(api.ErrInvalid, "invalid package name %q: Debian names are two or more of a-z, 0-9, '+', '-' and '.', starting with a letter or digit", p)
		}
		if !seen[p] {
			seen[p] = true
			out = append(out, p)
		}
	}
	sort.Strings(out)
	return out, nil
}

// Build builds template name and returns it: tiny (busybox), base (Debian
// with the usual tools and a user), or, with packages, any other name as
// base plus those Debian packages. If name already holds what this recipe
// makes and force is false it returns it at once, saying "cached"; a tiny or
// base made by an older recipe is built again. A build makes a new version
// and points name at it only once it is complete: a failed or cancelled
// build changes nothing, and sandboxes on the old version keep it. Content
// that is already a version is reused, and the progress says so. Builds of
// one name take turns. Errors: api.ErrInvalid for a bad name or package,
// api.ErrConflict if name holds something else (an import) and force is
// false, api.ErrUnavailable when the host lacks the build tool.
func (s *Store) Build(ctx context.Context, name string, force bool, packages []string, progress func(msg string)) (api.Template, error) {
	progress = orNop(progress)
	if err := ValidName(name); err != nil {
		return api.Template{}, err
	}
	pkgs, err := ValidPackages(packages)
	if err != nil {
		return api.Template{}, err
	}
	var source string
	var defaults api.TemplateDefaults
	var fill func(ctx context.Context, rootfs string) error
	switch {
	case name == Tiny && len(pkgs) == 0:
		source = tinySource
		fill = func(ctx context.Context, rootfs string) error { return buildTiny(ctx, rootfs, progress) }
	case name == Base && len(pkgs) == 0, len(pkgs) > 0 && name != Tiny && name != Base:
		source = baseSource
		if len(pkgs) > 0 {
			source = "build base + " + strings.Join(pkgs, ",") + " (mmdebstrap " + baseSuite + " minbase; user, sudo)"
		}
		defaults = api.TemplateDefaults{User: baseUser, WorkDir: baseHome}
		fill = func(ctx context.Context, rootfs string) error { return buildBase(ctx, rootfs, pkgs, progress) }
	case len(pkgs) > 0:
		return api.Template{}, api.Errorf(api.ErrInvalid, "template %s is built without extra packages; give the template with packages another name", name)
	default:
		return api.Template{}, api.Errorf(api.ErrInvalid, "cannot build template %q: %q, %q and templates with packages are built; others are imported", name, Tiny, Base)
	}
	unlock, err := s.lock(ctx, name)
	if err != nil {
		return api.Template{}, err
	}
	defer unlock()
	source = withRecipe(source)
	if t, err := s.Resolve(name); err == nil && !force {
		what, _ := splitRecipe(t.Source)
		switch {
		case t.Source == source:
			progress("cached")
			return t, nil
		case what == strings.TrimSuffix(source, recipeSep+recipe()),
			(name == Tiny || name == Base) && strings.HasPrefix(t.Source, "build "+name):
			progress(fmt.Sprintf("%s was made by other code (%s; this sbx's recipe is %s); building it again", name, t.Source, recipe()))
			force = true
		default:
			return api.Template{}, api.Errorf(api.ErrConflict, "template %s exists (%s); build again with force to point it at the new version (sandboxes on the old one keep it)", name, t.Source)
		}
	}
	progress("building " + name)
	t, reused, err := s.make(ctx, name, source, defaults, force, "build", progress, fill)
	if err != nil {
		return api.Template{}, fmt.Errorf("build template %s: %w", name, err)
	}
	if reused {
		progress(fmt.Sprintf("built %s: the same content as version %s, which is reused", name, short(t.Version)))
	} else {
		progress(fmt.Sprintf("built %s (%d MB), version %s", name, t.Size>>20, short(t.Version)))
	}
	return t, nil
}

// make runs fill on the rootfs of a new version in a fresh work directory,
// adds what the platform needs, computes the version, and installs it as
// name. It reports whether that content was a version already.
func (s *Store) make(ctx context.Context, name, source string, defaults api.TemplateDefaults, force bool, verb string, progress func(string), fill func(ctx context.Context, rootfs string) error) (t api.Template, reused bool, err error) {
	l, err := s.newLease()
	if err != nil {
		return api.Template{}, false, err
	}
	defer func() {
		if rerr := l.release(); rerr != nil {
			err = errors.Join(err, fmt.Errorf("clean up: %w", rerr))
		}
	}()
	ver := filepath.Join(l.work, "version")
	if err := os.Mkdir(ver, 0o755); err != nil {
		return api.Template{}, false, err
	}
	rootfs := filepath.Join(ver, rootfsDir)
	if err := fill(ctx, rootfs); err != nil {
		return api.Template{}, false, err
	}
	if err := ctx.Err(); err != nil {
		return api.Template{}, false, err
	}
	progress("preparing mount points")
	if err := addSkeleton(rootfs); err != nil {
		return api.Template{}, false, fmt.Errorf("add mount points: %w", err)
	}
	progress("computing the version")
	v, err := treeDigest(rootfs)
	if err != nil {
		return api.Template{}, false, err
	}
	size, err := diskUsage(rootfs)
	if err != nil {
		return api.Template{}, false, fmt.Errorf("measure rootfs: %w", err)
	}
	m := meta{Template: api.Template{Name: name, Version: v, Size: size, CreatedAt: time.Now().UTC().Truncate(time.Second), Source: source, Defaults: defaults}}
	// the rootfs must be on disk before the version is
	if err := syncFS(ver); err != nil {
		return api.Template{}, false, err
	}
	if err := writeMeta(filepath.Join(ver, metaFile), m); err != nil {
		return api.Template{}, false, err
	}
	reused, err = s.install(l, name, ver, v, force, verb)
	if err != nil {
		return api.Template{}, false, err
	}
	if reused {
		old, err := s.readMeta(v)
		if err != nil {
			return api.Template{}, false, err
		}
		if old.Source != source && strings.HasPrefix(old.Source, "build ") {
			// the same content, made again by this recipe: the version
			// says so, or every build after an upgrade would build again
			old.Source = source
			if err := s.critical(func() error { return writeMeta(filepath.Join(s.versionPath(v), metaFile), old) }); err != nil {
				return api.Template{}, false, err
			}
		}
		t = old.Template
	} else {
		t = m.Template
	}
	t.Name = name
	return t, reused, nil
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
// options, streaming its output to progress: base's packages and extra, and
// the user commands run as.
func buildBase(ctx context.Context, rootfs string, extra []string, progress func(string)) error {
	bin, err := exec.LookPath("mmdebstrap")
	if err != nil {
		return api.Errorf(api.ErrUnavailable, "mmdebstrap is missing; run `apt-get install mmdebstrap`")
	}
	pkgs := append(append([]string(nil), basePackages...), extra...)
	args := []string{"--variant=minbase", "--include=" + strings.Join(pkgs, ",")}
	args = append(args, userHooks()...)
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
	var tail, missing []string
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		line := sc.Text()
		progress(line)
		if _, p, ok := strings.Cut(line, "Unable to locate package "); ok {
			missing = append(missing, strings.TrimSpace(p))
		}
		if tail = append(tail, line); len(tail) > 10 {
			tail = tail[1:]
		}
	}
	r.Close()
	if err := cmd.Wait(); err != nil {
		if ctx.Err() != nil {
			return fmt.Errorf("mmdebstrap: %w", ctx.Err())
		}
		if len(missing) > 0 {
			return api.Errorf(api.ErrInvalid, "Debian %s has no package %s; check the names with `apt-cache search`", baseSuite, strings.Join(missing, ", "))
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

// userHooks are mmdebstrap's hooks that add base's user: uid and gid 1000,
// a home of its own, and sudo without a password.
func userHooks() []string {
	sudoers := "/etc/sudoers.d/" + baseUser
	return []string{
		fmt.Sprintf(`--customize-hook=chroot "$1" groupadd --gid %d %s`, baseUID, baseUser),
		fmt.Sprintf(`--customize-hook=chroot "$1" useradd --uid %d --gid %d --create-home --home-dir %s --shell /bin/bash %s`, baseUID, baseUID, baseHome, baseUser),
		fmt.Sprintf(`--customize-hook=echo '%s ALL=(ALL:ALL) NOPASSWD: ALL' > "$1%s" && chmod 0440 "$1%s"`, baseUser, sudoers, sudoers),
	}
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
