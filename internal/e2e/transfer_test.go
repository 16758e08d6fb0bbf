package e2e

import (
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"sbx.dev/sbx/api"
)

// startRegistry runs the distribution registry `make fleet-tools` builds
// (bin/.fleet-dir names where) on a loopback port of its own, with its
// storage in a temp dir, and returns its address. Without it the test is
// skipped, but not in CI, where make test builds it first.
func startRegistry(t testing.TB) string {
	t.Helper()
	fd, err := os.ReadFile(filepath.Join(binDir, ".fleet-dir"))
	if err != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("the registry is not built (bin/.fleet-dir: %v): make test builds it (make fleet-tools)", err)
		}
		t.Skip("the registry is not built: run `make fleet-tools`")
	}
	bin := filepath.Join(strings.TrimSpace(string(fd)), "registry")
	dir := t.TempDir()
	addr := freePort()
	cfg := fmt.Sprintf("version: 0.1\nlog:\n  level: warn\nstorage:\n  filesystem:\n    rootdirectory: %s\nhttp:\n  addr: %s\n", filepath.Join(dir, "data"), addr)
	if err := os.WriteFile(filepath.Join(dir, "registry.yml"), []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "serve", filepath.Join(dir, "registry.yml"))
	log, _ := os.Create(filepath.Join(dir, "registry.log"))
	cmd.Stdout, cmd.Stderr = log, log
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		log.Close()
	})
	waitFor(t, "the registry to answer", 30*time.Second, func() bool {
		resp, err := http.Get("http://" + addr + "/v2/")
		if err == nil {
			resp.Body.Close()
		}
		return err == nil && resp.StatusCode == http.StatusOK
	})
	return addr
}

// imageDirs counts the image directories of d's data dir.
func imageDirs(d *daemon) int {
	e, _ := os.ReadDir(filepath.Join(d.dir, "images"))
	return len(e)
}

// TestSnapshotPushPull: a snapshot taken on one sbxd is pushed to a real
// registry and pulled by another sbxd, which makes a sandbox from it with
// the files it had; a second pull of it fetches nothing; a snapshot with
// memory goes too, and is recorded on the other node without it, saying
// so, and boots from its disk there. Bad input is refused saying why and
// leaves nothing: an unknown snapshot, a taken name, a registry that does
// not answer, a reference with a scheme, an artifact that is not there.
func TestSnapshotPushPull(t *testing.T) {
	reg := startRegistry(t)
	a, b := ownDaemon(t), ownDaemon(t)
	id := a.newSandbox(t)
	marker := "moved-" + randHex(4)
	a.must(t, "exec", id, "--", "sh", "-c", "echo "+marker+" > /kept.txt && mkdir -p /deep/er && echo x > /deep/er/f")
	a.must(t, "snapshot", id, "disk-"+marker)
	h := startHolderTiny(t, a, id) // a process and its memory, for the memory snapshot
	a.must(t, "snapshot", id, "mem-"+marker, "--memory")

	var pushed api.PushResult
	a.jsonOut(t, &pushed, "snapshot", "push", "disk-"+marker, reg+"/sbx/e2e:disk")
	if !strings.HasPrefix(pushed.Ref, reg+"/sbx/e2e@sha256:") || pushed.Files == 0 || pushed.Bytes == 0 || pushed.Memory {
		t.Fatalf("push said %+v", pushed)
	}
	beforePull := imageDirs(b)
	var pulled api.PullResult
	b.jsonOut(t, &pulled, "snapshot", "pull", reg+"/sbx/e2e:disk")
	if pulled.Ref != pushed.Ref || pulled.Snapshot.Name != "disk-"+marker || pulled.PulledBytes == 0 || pulled.Snapshot.Memory || !pulled.Snapshot.Kept || pulled.MemoryLeft != "" {
		t.Errorf("pull said %+v (pushed %+v)", pulled, pushed)
	}
	if n := imageDirs(b); n != beforePull+1 {
		t.Errorf("the pull made %d image dirs, want 1", n-beforePull)
	}
	c := b.newSandbox(t, "--from", "disk-"+marker)
	if got := strings.TrimSpace(b.must(t, "exec", c, "--", "cat", "/kept.txt", "/deep/er/f")); got != marker+"\nx" {
		t.Errorf("a sandbox made on the other node from the pulled snapshot reads %q, want %q", got, marker+"\nx")
	}

	// again, by digest, under another name: nothing fetched
	var again api.PullResult
	b.jsonOut(t, &again, "snapshot", "pull", pushed.Ref, "--name", "again-"+marker)
	if again.PulledBytes != 0 || again.Snapshot.Name != "again-"+marker {
		t.Errorf("a second pull fetched %d bytes (%+v), want none", again.PulledBytes, again)
	}
	// the same name again: refused, nothing left
	before := imageDirs(b)
	if r := b.sbx(t, "snapshot", "pull", pushed.Ref); r.code == 0 || !strings.Contains(r.stderr, "taken") {
		t.Errorf("a pull under a taken name: exit %d %q, want refused saying taken", r.code, r.stderr)
	}
	if n := imageDirs(b); n != before {
		t.Errorf("a refused pull left %d image dirs", n-before)
	}

	// with memory: pushed whole, pulled whole, restored on the other node
	// with its processes and their memory (a restore names the pulling
	// node's own disk: gVisor patch 07)
	var mp api.PushResult
	a.jsonOut(t, &mp, "snapshot", "push", "mem-"+marker, reg+"/sbx/e2e:mem")
	if !mp.Memory || mp.Files <= pushed.Files {
		t.Errorf("the push of a memory snapshot said %+v, want memory and more files than the disk's %d", mp, pushed.Files)
	}
	var mpull api.PullResult
	b.jsonOut(t, &mpull, "snapshot", "pull", reg+"/sbx/e2e:mem")
	if !mpull.Snapshot.Memory || mpull.MemoryLeft != "" || !mpull.Snapshot.Kept {
		t.Fatalf("the pull of a memory snapshot said %+v, want it recorded kept, with its memory", mpull)
	}
	m := b.newSandbox(t, "--from", "mem-"+marker)
	checkMemory(t, b, m, h)
	if got := strings.TrimSpace(b.must(t, "exec", m, "--", "cat", "/kept.txt")); got != marker {
		t.Errorf("a sandbox from the pulled memory snapshot reads %q, want %q", got, marker)
	}
	checkNetwork(t, b, m, false)
	if mi := b.info(t, m); !mi.MemoryRestored {
		t.Errorf("the sandbox from the pulled memory snapshot says memoryRestored false: %+v", mi)
	}
	// a second sandbox from it: the image and its disk are this node's
	m2 := b.newSandbox(t, "--from", "mem-"+marker)
	checkMemory(t, b, m2, h)

	// bad input, each refused saying why
	for _, tc := range []struct {
		d    *daemon
		args []string
		want string
	}{
		{a, []string{"snapshot", "push", "no-such-" + marker, reg + "/sbx/e2e:x"}, "not found"},
		{a, []string{"snapshot", "push", "disk-" + marker, "http://" + reg + "/sbx/e2e:x"}, "scheme"},
		{a, []string{"snapshot", "push", "disk-" + marker, "127.0.0.1:1/sbx/e2e:x"}, "does not answer"},
		{b, []string{"snapshot", "pull", "127.0.0.1:1/sbx/e2e:x"}, "does not answer"},
		{b, []string{"snapshot", "pull", reg + "/sbx/e2e:no-such-tag"}, "no such artifact"},
		{b, []string{"snapshot", "pull", "Not A Ref"}, "blanks"},
	} {
		before := imageDirs(tc.d)
		r := tc.d.sbx(t, tc.args...)
		if r.code == 0 || !strings.Contains(r.stderr, tc.want) {
			t.Errorf("sbx %s: exit %d %q, want an error saying %q", strings.Join(tc.args, " "), r.code, r.stderr, tc.want)
		}
		if n := imageDirs(tc.d); n != before {
			t.Errorf("sbx %s left %d image dirs", strings.Join(tc.args, " "), n-before)
		}
	}
	for _, d := range []*daemon{a, b} {
		checkConsistent(t, d)
		deleteEverything(t, d)
		checkNoLeaks(t, d)
	}
}

// TestSnapshotPullCrash: sbxd killed once a pull has put the image
// together, before it records the snapshot: restarted, it has no snapshot
// of that name and no image a record names, and the same pull then works.
func TestSnapshotPullCrash(t *testing.T) {
	reg := startRegistry(t)
	bin := sbxdTestBuild(t)
	a, b := ownDaemon(t), ownDaemon(t)
	id := a.newSandbox(t)
	a.must(t, "exec", id, "--", "sh", "-c", "echo crash > /kept.txt")
	a.must(t, "snapshot", id, "crash-snap")
	a.must(t, "snapshot", "push", "crash-snap", reg+"/sbx/crash:1")

	b.kill(syscall.SIGTERM)
	b.bin, b.env = bin, []string{"SBX_TEST_CRASH_AT=pull:assembled"}
	if err := b.start(nil); err != nil {
		t.Fatal(err)
	}
	if r := b.sbx(t, "snapshot", "pull", reg+"/sbx/crash:1"); r.code == 0 {
		t.Fatalf("the pull succeeded: the crash hook did not fire")
	}
	b.waitExit(t, 60*time.Second)
	b.env = nil
	if err := b.start(nil); err != nil {
		t.Fatal(err)
	}
	if r := b.sbx(t, "snapshot", "info", "crash-snap"); r.code == 0 {
		t.Errorf("after the crash the snapshot is recorded: %s", r.stdout)
	}
	// the image the crash left, which no record names, went at the restart
	if n := imageDirs(b); n != 0 {
		t.Errorf("after the restart %d image dirs are left, want none", n)
	}
	var pulled api.PullResult
	b.jsonOut(t, &pulled, "snapshot", "pull", reg+"/sbx/crash:1")
	if pulled.Snapshot.Name != "crash-snap" || pulled.PulledBytes == 0 {
		t.Errorf("the pull after the crash said %+v", pulled)
	}
	c := b.newSandbox(t, "--from", "crash-snap")
	if got := strings.TrimSpace(b.must(t, "exec", c, "--", "cat", "/kept.txt")); got != "crash" {
		t.Errorf("a sandbox from the snapshot pulled after the crash reads %q", got)
	}
	for _, d := range []*daemon{a, b} {
		checkConsistent(t, d)
		deleteEverything(t, d)
		checkNoLeaks(t, d)
	}
}
