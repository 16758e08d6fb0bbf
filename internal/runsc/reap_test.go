package runsc

import (
	"context"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// TestReapSandboxes: a process named "exe" (as runsc's sandbox and gofer
// are) orphaned to this subreaper is reaped once it ends, found among this
// process's children rather than by a look at every process; another
// orphan of this process is left to whoever waits for it.
func TestReapSandboxes(t *testing.T) {
	if !haveChildrenFiles() {
		t.Skip("the kernel keeps no children lists (CONFIG_PROC_CHILDREN): the sweep of /proc is all there is")
	}
	sleep, err := exec.LookPath("sleep")
	if err != nil {
		t.Skip("no sleep")
	}
	dir := t.TempDir()
	exe := filepath.Join(dir, "exe")
	copyFile(t, sleep, exe)
	other := filepath.Join(dir, "other")
	copyFile(t, sleep, other)

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if err := ReapSandboxes(ctx); err != nil {
		t.Fatal(err)
	}
	noSubreaperAfter(t)
	// each started in the background by a shell that exits at once: an
	// orphan, re-parented to this process
	orphan := func(prog, secs string) int {
		t.Helper()
		out, err := exec.Command("/bin/sh", "-c", prog+" "+secs+" </dev/null >/dev/null 2>&1 & echo $!").Output()
		if err != nil {
			t.Fatal(err)
		}
		pid, err := strconv.Atoi(strings.TrimSpace(string(out)))
		if err != nil {
			t.Fatal(err)
		}
		return pid
	}
	sandbox := orphan(exe, "0.3")
	bystander := orphan(other, "0.3")
	defer func() {
		p, _ := os.FindProcess(bystander)
		_, _ = p.Wait() // this test's own: reaped here
	}()
	deadline := time.Now().Add(2 * time.Second)
	for {
		pids, ok := childPids()
		if !ok {
			t.Fatal("childPids: no children lists, though the kernel has them")
		}
		if slices.Contains(pids, strconv.Itoa(sandbox)) && slices.Contains(pids, strconv.Itoa(bystander)) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the orphans %d and %d are not among this process's children %v", sandbox, bystander, pids)
		}
		time.Sleep(10 * time.Millisecond)
	}
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if _, err := os.Stat(filepath.Join("/proc", strconv.Itoa(sandbox))); os.IsNotExist(err) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the ended sandbox process %d was not reaped: %s", sandbox, procState(sandbox))
		}
	}
	// the other ended too, and is still there for its waiter
	time.Sleep(300 * time.Millisecond)
	if st := procState(bystander); st != "Z" {
		t.Errorf("the other orphan is %q, want a zombie left for its own waiter", st)
	}
}

// noSubreaperAfter makes this test process a subreaper no more once t
// ends: the later tests' runsc sandboxes would be orphaned to it, and with
// no one reaping them every runsc delete waited its minute out.
func noSubreaperAfter(t *testing.T) {
	t.Cleanup(func() {
		if err := unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 0, 0, 0, 0); err != nil {
			t.Errorf("stop being a subreaper: %v", err)
		}
	})
}

func procState(pid int) string {
	b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "stat"))
	if err != nil {
		return "gone"
	}
	s := string(b)
	if j := strings.LastIndexByte(s, ')'); j >= 0 {
		if f := strings.Fields(s[j+1:]); len(f) > 0 {
			return f[0]
		}
	}
	return "?"
}

func copyFile(t *testing.T, from, to string) {
	t.Helper()
	in, err := os.Open(from)
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close()
	out, err := os.OpenFile(to, os.O_CREATE|os.O_WRONLY, 0o755)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(out, in); err != nil {
		t.Fatal(err)
	}
	if err := out.Close(); err != nil {
		t.Fatal(err)
	}
}
