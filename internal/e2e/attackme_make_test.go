package e2e

import (
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"testing"
)

// Attacks on the Makefile's $(BIN)/runsc (the shared patched copy of
// gVisor under $(dirname GOCACHE)/sbx-gvisor). A fake go stands in for the
// real one: `go env GOCACHE` names a directory of the test's, `go build`
// checks that the copy it is given is complete and patched, and the rest
// (mod download, list) is the real go. Nothing of runsc is compiled.

func attackmeRoot(t *testing.T) string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..")
}

// fakeGo writes the fake go into dir; cache is where the copies go.
func fakeGo(t *testing.T, dir, cache string) string {
	t.Helper()
	real, err := exec.LookPath("go")
	if err != nil {
		real = "/usr/local/go/bin/go"
	}
	script := `#!/bin/sh
case "$1" in
env) [ "$2" = GOCACHE ] && { echo "` + cache + `/go-build"; exit 0; } ;;
build)
	mod=$3; out=$5
	copy=$(sed -n 's/^replace gvisor.dev\/gvisor => //p' "$mod")
	[ -e "$copy/.sbx-complete" ] || { echo "fake go: $copy not complete" >&2; exit 3; }
	[ -f "$copy/pkg/sentry/kernel/sbx_init.go" ] || [ -n "$FAKE_NO_05" ] || { echo "fake go: $copy not patched" >&2; exit 4; }
	sleep "${FAKE_BUILD_SLEEP:-0}"
	[ -f "$copy/runsc/main.go" ] || { echo "fake go: $copy lost its files during the build" >&2; exit 5; }
	echo "$copy" > "$out"; exit 0 ;;
esac
exec ` + real + ` "$@"
`
	p := filepath.Join(dir, "go")
	if err := os.WriteFile(p, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	return p
}

func makeRunsc(root, goBin, bin string, env []string, patches ...string) *exec.Cmd {
	args := []string{"-s", "-C", root, "GO=" + goBin, "BIN=" + bin, bin + "/runsc"}
	if patches != nil {
		args = append(args, "RUNSC_PATCHES="+strings.Join(patches, " "))
	}
	cmd := exec.Command("make", args...)
	cmd.Env = append(os.Environ(), env...)
	return cmd
}

func allPatches(t *testing.T, root string) []string {
	ps, _ := filepath.Glob(filepath.Join(root, "third_party", "gvisor", "patches", "*.patch"))
	if len(ps) < 5 {
		t.Fatalf("patches: %v", ps)
	}
	return ps
}

// TestAttackMeMakeTwoWorktrees: two worktrees with different patches build
// at once (or one after the other): each build's copy must stay whole
// while the other's go build reads it, and both stay for the next build.
// The recipe removed every other "$ver-*" on each build: the other
// worktree's copy in use, and its .tmp copy being patched.
func TestAttackMeMakeTwoWorktrees(t *testing.T) {
	root := attackmeRoot(t)
	dir := t.TempDir()
	cache := filepath.Join(dir, "cache")
	goBin := fakeGo(t, dir, cache)
	all := allPatches(t, root)
	var wg sync.WaitGroup
	outs := make([]string, 2)
	errs := make([]error, 2)
	sets := [][]string{all, all[:4]}
	for i := range sets {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			env := []string{"FAKE_BUILD_SLEEP=4"}
			if i == 1 {
				env = append(env, "FAKE_NO_05=1")
			}
			b, err := makeRunsc(root, goBin, filepath.Join(dir, "bin"+string(rune('a'+i))), env, sets[i]...).CombinedOutput()
			outs[i], errs[i] = string(b), err
		}(i)
	}
	wg.Wait()
	for i := range sets {
		if errs[i] != nil {
			t.Errorf("build %d of two at once: %v\n%s", i, errs[i], outs[i])
		}
	}
	copies, _ := filepath.Glob(filepath.Join(cache, "sbx-gvisor", "*"))
	complete := 0
	for _, c := range copies {
		if _, err := os.Stat(filepath.Join(c, ".sbx-complete")); err == nil {
			complete++
		}
	}
	if complete != 2 {
		t.Errorf("after two builds with different patches, copies %v (%d complete); want both complete copies kept", copies, complete)
	}
}

// TestAttackMeMakeBadPatch: a patch that does not apply stops the build,
// naming it, and leaves no copy marked complete.
func TestAttackMeMakeBadPatch(t *testing.T) {
	root := attackmeRoot(t)
	dir := t.TempDir()
	cache := filepath.Join(dir, "cache")
	goBin := fakeGo(t, dir, cache)
	bad := filepath.Join(dir, "99-bad.patch")
	os.WriteFile(bad, []byte("--- a/runsc/main.go\n+++ b/runsc/main.go\n@@ -1,3 +1,3 @@\n-not there\n+x\n a\n b\n"), 0o644)
	b, err := makeRunsc(root, goBin, filepath.Join(dir, "bin"), nil, append(allPatches(t, root), bad)...).CombinedOutput()
	if err == nil || !strings.Contains(string(b), "99-bad.patch does not apply") {
		t.Errorf("a patch that does not apply: err=%v\n%s\nwant the build stopped naming it", err, b)
	}
	if m, _ := filepath.Glob(filepath.Join(cache, "sbx-gvisor", "*", ".sbx-complete")); len(m) != 0 {
		t.Errorf("a copy is marked complete after a failed patch: %v", m)
	}
	if _, err := os.Stat(filepath.Join(dir, "bin", "runsc")); err == nil {
		t.Errorf("bin/runsc made despite the failed patch")
	}
}

// TestAttackMeMakeInterrupted: a build killed at several instants (during
// the copy, the patches, the go build) leaves no copy marked complete that
// lacks files, and the next build succeeds.
func TestAttackMeMakeInterrupted(t *testing.T) {
	root := attackmeRoot(t)
	dir := t.TempDir()
	cache := filepath.Join(dir, "cache")
	goBin := fakeGo(t, dir, cache)
	for _, ms := range []string{"0.3", "0.8", "1.5", "3"} {
		cmd := makeRunsc(root, goBin, filepath.Join(dir, "bin"), []string{"FAKE_BUILD_SLEEP=5"})
		cmd.SysProcAttr = newPgid()
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		exec.Command("sleep", ms).Run()
		killPgid(cmd.Process.Pid)
		cmd.Wait()
		for _, c := range mustGlob(filepath.Join(cache, "sbx-gvisor", "*", ".sbx-complete")) {
			if _, err := os.Stat(filepath.Join(filepath.Dir(c), "runsc", "main.go")); err != nil {
				t.Errorf("killed after %ss: %s is marked complete without its files", ms, filepath.Dir(c))
			}
		}
	}
	if b, err := makeRunsc(root, goBin, filepath.Join(dir, "bin"), nil).CombinedOutput(); err != nil {
		t.Errorf("the build after the interrupted ones: %v\n%s", err, b)
	}
	if left := append(mustGlob(filepath.Join(cache, "sbx-gvisor", "*.tmp*")), mustGlob(filepath.Join(cache, "sbx-gvisor", "*.old*"))...); len(left) != 0 {
		for _, l := range left {
			pid := l[strings.LastIndex(l, "p")+1:]
			st, _ := os.ReadFile("/proc/" + pid + "/status")
			cmdl, _ := os.ReadFile("/proc/" + pid + "/cmdline")
			t.Logf("%s: %.80q %q", pid, st, cmdl)
		}
		t.Errorf("the next build left the killed builds' copies: %v", left)
	}
	// a copy without its mark (left by hand or an old recipe) is replaced,
	// not built against
	copies := mustGlob(filepath.Join(cache, "sbx-gvisor", "*"))
	if len(copies) != 1 {
		t.Fatalf("copies: %v", copies)
	}
	os.Remove(filepath.Join(copies[0], ".sbx-complete"))
	os.RemoveAll(filepath.Join(copies[0], "runsc"))
	if b, err := makeRunsc(root, goBin, filepath.Join(dir, "bin2"), nil).CombinedOutput(); err != nil {
		t.Errorf("a build over a copy without its mark: %v\n%s", err, b)
	}
}

func mustGlob(p string) []string { m, _ := filepath.Glob(p); return m }

func newPgid() *syscall.SysProcAttr { return &syscall.SysProcAttr{Setpgid: true} }

func killPgid(pid int) { syscall.Kill(-pid, syscall.SIGKILL) }
