package e2e

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"sbx.dev/sbx/api"
	"sbx.dev/sbx/internal/cgroup"
)

// TestBaseTemplate: a sandbox from base has the tools the brief promises.
func TestBaseTemplate(t *testing.T) {
	d := shared
	id := d.newSandbox(t, "--template", "base")
	for _, tool := range []string{"bash", "python3", "ps", "ip", "lsof", "strace", "gdb", "curl", "git"} {
		if r := d.sbx(t, "exec", id, "--", "sh", "-c", "command -v "+tool); r.code != 0 {
			t.Errorf("base lacks %s: %s", tool, r.stderr)
		}
	}
	if out := d.must(t, "exec", id, "--", "python3", "-c", "print(6*7)"); out != "42\n" {
		t.Errorf("python3 printed %q", out)
	}
}

// TestLimits: --memory and --cpus are enforced; allocating past the limit
// does not succeed, the host is fine, and sbx says what happened.
func TestLimits(t *testing.T) {
	d := shared
	id := d.newSandbox(t, "--template", "base", "--memory", "256M", "--cpus", "1")
	var sb api.Sandbox
	sb = d.info(t, id)
	if sb.Memory != 256<<20 || sb.CPUs != 1 {
		t.Errorf("info = memory %d cpus %v", sb.Memory, sb.CPUs)
	}
	r := d.sbx(t, "exec", id, "--timeout", "60s", "--", "python3", "-c", "b = bytearray(1024*1024*1024); b[::4096] = b'x' * len(b[::4096]); print('allocated')")
	if r.code == 0 || strings.Contains(r.stdout, "allocated") {
		t.Errorf("allocating 1 GiB under a 256 MiB limit succeeded: exit %d %q", r.code, r.stdout)
	}
	// The daemon is fine and still answers.
	if _, err := d.client.Health(context.Background()); err != nil {
		t.Fatalf("sbxd after the out-of-memory exec: %v", err)
	}
	// gVisor's memory is one cgroup. Past the limit either the kernel stops
	// the whole sandbox, and sbx says so rather than keep a sandbox whose
	// execs fail; or gVisor refuses the allocation first (the program gets
	// ENOMEM, a MemoryError) and the sandbox runs on. Which one is the
	// kernel's race (about 2 runs in 5 here stay ready); either way sbx
	// must tell the truth: reported out of memory and refusing execs
	// clearly, or ready and answering.
	oom := pollUntil(10*time.Second, func() bool {
		sb, err := d.client.Sandbox(id).Info(context.Background())
		return err == nil && sb.State == api.StateError && strings.Contains(sb.Reason, "out of memory")
	})
	r = d.sbx(t, "exec", id, "--", "true")
	// for a failure's reader: whether the host kernel killed anything in
	// the sandbox's memory cgroup (a copier's runsc exec is in it)
	oomControl, _ := os.ReadFile(filepath.Join("/sys/fs/cgroup/memory", cgroup.Path(d.tag, id), "memory.oom_control"))
	t.Logf("the sandbox's memory.oom_control after the allocation: %q", oomControl)
	switch sb := d.info(t, id); {
	case oom:
		if r.code != 1 || !strings.Contains(r.stderr, "out of memory") {
			t.Errorf("exec in the sandbox the kernel stopped: exit %d %q, want a clear error", r.code, r.stderr)
		}
	case sb.State == api.StateReady:
		if r.code != 0 {
			t.Errorf("the sandbox is ready after the refused allocation, but an exec fails: exit %d %q", r.code, r.stderr)
		}
	default:
		t.Errorf("after the allocation past its limit the sandbox is %s (%q): want out of memory, or ready and answering", sb.State, sb.Reason)
	}
}

// TestCPULimit: --cpus becomes the sandbox cgroup's CFS quota.
func TestCPULimit(t *testing.T) {
	d := shared
	id := d.newSandbox(t, "--template", "tiny", "--cpus", "0.5")
	b, err := os.ReadFile(filepath.Join("/sys/fs/cgroup/cpu", "sbx-"+d.tag, id, "cpu.cfs_quota_us"))
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.TrimSpace(string(b)); got != "50000" {
		t.Errorf("cpu.cfs_quota_us = %s, want 50000 (half of a 100000 period)", got)
	}
	r := d.sbx(t, "new", "--template", "tiny", "--cpus", "1000")
	if r.code != 1 || !strings.Contains(r.stderr, "cpus") {
		t.Errorf("--cpus 1000: exit %d %q", r.code, r.stderr)
	}
}

// TestBigFile: a 1 GiB file goes in and out while sbxd's resident memory
// grows by less than 64 MiB.
func TestBigFile(t *testing.T) {
	if testing.Short() {
		t.Skip("1 GiB transfer")
	}
	d := shared
	id := d.newSandbox(t, "--template", "tiny")
	dir := t.TempDir()
	src := filepath.Join(dir, "big")
	f, err := os.Create(src)
	if err != nil {
		t.Fatal(err)
	}
	const size = 1 << 30
	// Random-ish content, cheaply: a repeated 1 MiB block with a counter.
	block := make([]byte, 1<<20)
	for i := range block {
		block[i] = byte(i*7 + i>>8)
	}
	for i := 0; i < size>>20; i++ {
		copy(block, fmt.Sprintf("%08d", i))
		f.Write(block)
	}
	f.Close()
	before := rss(t, d)
	peak := before
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			select {
			case <-stop:
				return
			case <-time.After(100 * time.Millisecond):
				if r := rss(t, d); r > peak {
					peak = r
				}
			}
		}
	}()
	d.must(t, "scp", src, id+":/tmp/big")
	back := filepath.Join(dir, "back")
	d.must(t, "scp", id+":/tmp/big", back)
	close(stop)
	<-done
	if grow := peak - before; grow > 64<<20 {
		t.Errorf("sbxd grew by %d MiB during a 1 GiB transfer, want < 64 MiB", grow>>20)
	}
	if !sameFile(t, src, back) {
		t.Errorf("1 GiB round trip changed the file")
	}
}

func rss(t *testing.T, d *daemon) int64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", d.cmd.Process.Pid))
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(line, "VmRSS:") {
			f := strings.Fields(line)
			kb, _ := strconv.ParseInt(f[1], 10, 64)
			return kb << 10
		}
	}
	return 0
}

func sameFile(t *testing.T, a, b string) bool {
	fa, err := os.Open(a)
	if err != nil {
		t.Fatal(err)
	}
	defer fa.Close()
	fb, err := os.Open(b)
	if err != nil {
		t.Fatal(err)
	}
	defer fb.Close()
	ba, bb := make([]byte, 1<<20), make([]byte, 1<<20)
	for {
		na, ea := io.ReadFull(fa, ba)
		nb, _ := io.ReadFull(fb, bb)
		if na != nb || !bytes.Equal(ba[:na], bb[:nb]) {
			return false
		}
		if ea != nil {
			return true
		}
	}
}

// TestClientVanishes: a client that disconnects in the middle of an upload
// or an exec leaves sbxd healthy and no half-written file in place of an
// old one; the exec goes on.
func TestClientVanishes(t *testing.T) {
	d := shared
	id := d.newSandbox(t, "--template", "tiny")
	d.must(t, "exec", id, "--", "sh", "-c", "echo original > /tmp/precious")
	dir := t.TempDir()
	big := filepath.Join(dir, "big")
	f, _ := os.Create(big)
	f.Truncate(512 << 20)
	f.Close()

	// Kill the uploading client half-way.
	cmd := exec.Command(filepath.Join(binDir, "sbx"), "scp", big, id+":/tmp/precious")
	cmd.Env = append(os.Environ(), "SBX_HOST=unix://"+d.socket)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(300 * time.Millisecond) // tested: the client dies 300 ms into the upload
	cmd.Process.Kill()
	cmd.Wait()
	waitFor(t, "the aborted upload to be cleaned up", 20*time.Second, func() bool {
		r := d.sbx(t, "exec", id, "--", "sh", "-c", "ls -a /tmp | grep -c sbx-tmp")
		return strings.TrimSpace(r.stdout) == "0"
	})
	if out := d.must(t, "exec", id, "--", "cat", "/tmp/precious"); out != "original\n" {
		t.Errorf("after an aborted upload /tmp/precious = %q, want the old content", out)
	}

	// Kill a client following an exec; the exec goes on and its output is kept.
	cmd = exec.Command(filepath.Join(binDir, "sbx"), "exec", id, "--", "sh", "-c", "sleep 1; echo done > /tmp/after; echo out")
	cmd.Env = append(os.Environ(), "SBX_HOST=unix://"+d.socket)
	cmd.Start()
	time.Sleep(300 * time.Millisecond) // tested: the client dies 300 ms into the exec
	cmd.Process.Kill()
	cmd.Wait()
	waitFor(t, "the exec to finish without its client", 20*time.Second, func() bool {
		r := d.sbx(t, "exec", id, "--", "cat", "/tmp/after")
		return r.stdout == "done\n"
	})
	if _, err := d.client.Health(context.Background()); err != nil {
		t.Fatalf("sbxd unhealthy after clients vanished: %v", err)
	}
}
