package e2e

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// What runsc's boot and gofer log (gVisor patch 18): each time the /proc
// umounter runs from its memfd, and each time `runsc umount` runs instead
// (the memfd cannot be executed, or the helper did not start).
const (
	umounterHelper   = "the umount helper started"
	umounterFallback = "starting runsc umount"
)

// TestUmounterFallback: runsc starts the /proc umounter of its boot and its
// gofer from a sealed memfd (patch 18), a helper of a few system calls in
// place of a whole runsc start. On a host that allows it the helper runs,
// in the boot and in the gofer, and `runsc umount` does not. A host that
// forbids executing memfds (vm.memfd_noexec=2) must not stop a sandbox:
// runsc takes `runsc umount` as before, and a create, an exec, a memory
// fork and a stop and resume with memory all work.
//
// The knob is the host's (its initial PID namespace's, which sbxd's runsc
// processes inherit); the test only raises it, and puts it back. Were the
// test killed before its cleanup, the host would stay at 2, the safe side:
// sandboxes start, through the fallback.
func TestUmounterFallback(t *testing.T) {
	const knob = "/proc/sys/vm/memfd_noexec"
	old, err := os.ReadFile(knob)
	if err != nil {
		t.Skipf("this kernel has no %s (before 6.3): its memfds are executable, the helper's path is the only one", knob)
	}
	t.Cleanup(func() {
		if err := os.WriteFile(knob, old, 0); err != nil {
			t.Errorf("restore %s to %q: %v", knob, strings.TrimSpace(string(old)), err)
		}
	})
	logs := t.TempDir()
	d, err := startDaemon([]string{"--runsc-debug-log", logs + "/"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.stop(true) })

	// Allowed (0, or 1: a memfd asked for as MFD_EXEC may still be run):
	// the boot and the gofer each start the helper, and no runsc umount.
	if v := strings.TrimSpace(string(old)); v == "0" || v == "1" {
		first := d.newSandbox(t, "--template", "tiny")
		if out := d.must(t, "exec", first, "--", "echo", "helper"); out != "helper\n" {
			t.Fatalf("exec with the helper: %q", out)
		}
		if n := logsSaying(t, logs, umounterHelper); n < 2 {
			t.Errorf("%d runsc logs say %q after a create, want the boot's and the gofer's", n, umounterHelper)
		}
		if n := logsSaying(t, logs, umounterFallback); n != 0 {
			t.Fatalf("%d runsc logs say %q on a host that executes memfds", n, umounterFallback)
		}
	} else {
		t.Logf("%s is %s here: only the fallback is tried", knob, v)
	}

	// Forbidden: every runsc start (boot, gofer; create, fork, restore) takes
	// the fallback and the sandbox answers.
	if err := os.WriteFile(knob, []byte("2"), 0); err != nil {
		t.Fatal(err)
	}
	id := d.newSandbox(t, "--template", "tiny")
	if out := d.must(t, "exec", id, "--", "echo", "fallback"); out != "fallback\n" {
		t.Fatalf("exec with the fallback: %q", out)
	}
	d.must(t, "exec", id, "--", "sh", "-c", "echo kept > /tmp/mark")
	kids := forkMemory(t, d, id, 1)
	if len(kids) != 1 {
		t.Fatalf("memory fork with the fallback: %v", kids)
	}
	if out := d.must(t, "exec", kids[0], "--", "cat", "/tmp/mark"); out != "kept\n" {
		t.Errorf("the memory fork's /tmp/mark: %q", out)
	}
	d.must(t, "stop", id, "--wait")
	d.must(t, "resume", id)
	if out := d.must(t, "exec", id, "--", "cat", "/tmp/mark"); out != "kept\n" {
		t.Errorf("after stop and resume with the fallback, /tmp/mark: %q", out)
	}
	// create, fork and resume: a boot and a gofer each, all taking the fallback
	if n := logsSaying(t, logs, umounterFallback); n < 6 {
		t.Errorf("%d runsc logs say %q after a create, a fork and a resume with vm.memfd_noexec=2, want 6 or more", n, umounterFallback)
	}
}

// logsSaying counts the files in dir that contain s.
func logsSaying(t *testing.T, dir, s string) int {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(dir, "*"))
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		if strings.Contains(string(b), s) {
			n++
		}
	}
	return n
}
