package e2e

import (
	"context"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"sbx.dev/sbx/api"
	"sbx.dev/sbx/client"
)

// TestDiskLimit: a sandbox sees ENOSPC at its disk limit, and the host's
// disk holds no more of it than the limit; its other files are fine.
func TestDiskLimit(t *testing.T) {
	d := shared
	ctx := context.Background()
	sb, err := d.client.Create(ctx, client.WithTemplate("tiny"), client.WithDiskLimit(64<<20))
	if err != nil {
		t.Fatal(err)
	}
	id := sb.ID
	t.Cleanup(func() { deleteSandbox(context.Background(), d.client, id) })
	r := d.sbx(t, "exec", id, "--", "sh", "-c", "dd if=/dev/zero of=/big bs=1M count=200 2>&1; echo rc=$?")
	if !strings.Contains(r.stdout, "No space left on device") || strings.Contains(r.stdout, "rc=0") {
		t.Errorf("writing 200 MiB under a 64 MiB disk limit: %q, want ENOSPC", r.stdout)
	}
	upper := filepath.Join(d.dir, "sandboxes", id, "upper")
	if n := duBytes(upper); n > 80<<20 {
		t.Errorf("the sandbox holds %d MiB of the host's disk, past its 64 MiB limit", n>>20)
	}
	// what it can write, it writes
	d.must(t, "exec", id, "--", "sh", "-c", "rm /big; echo ok > /small && cat /small")
	if out := d.must(t, "exec", id, "--", "cat", "/small"); out != "ok\n" {
		t.Errorf("after freeing space: %q", out)
	}
	for _, bad := range []string{"1K", "lots", "-1G", "9999T"} {
		// the API takes sizes as strings; the Go client's are bytes
		status, body := d.rawAPI(t, "POST", "/v1/sandboxes", api.CreateRequest{Template: "tiny", Disk: bad})
		if status != 400 || !strings.Contains(string(body), "disk") {
			t.Errorf("create with disk %s: %d %s, want 400 naming disk", bad, status, body)
		}
	}
	if _, err := d.client.Create(ctx, client.WithTemplate("tiny"), client.WithDiskLimit(1<<10)); !errors.Is(err, api.ErrInvalid) || !strings.Contains(err.Error(), "disk") {
		t.Errorf("create with a 1K disk through the client: %v, want ErrInvalid naming disk", err)
	}
}

func duBytes(dir string) int64 {
	out, err := exec.Command("du", "-sb", dir).Output()
	if err != nil {
		return 0
	}
	var n int64
	for _, c := range strings.Fields(string(out))[0] {
		n = n*10 + int64(c-'0')
	}
	return n
}

// TestOutputCapped: an exec that floods its output keeps the head and the
// tail and says what it dropped, and neither the data dir nor sbxd's memory
// grows with it.
func TestOutputCapped(t *testing.T) {
	d, err := startDaemon([]string{"--output-head", "1M", "--output-tail", "64K"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.stop(true) })
	ctx := context.Background()
	sb, err := d.client.Create(ctx, client.WithTemplate("tiny"))
	if err != nil {
		t.Fatal(err)
	}
	before := rss(t, d)
	var out strings.Builder
	e, err := sdk(d.client).Exec(ctx, sb.ID, api.ExecRequest{Cmd: []string{"sh", "-c", "echo FIRST; yes 0123456789 | head -c 300000000; echo; echo LAST"}, Timeout: api.Duration(2 * time.Minute)}, &out, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if e.ExitCode == nil || *e.ExitCode != 0 {
		t.Fatalf("exit %v", e.ExitCode)
	}
	s := out.String()
	if !strings.HasPrefix(s, "FIRST\n") || !strings.HasSuffix(s, "LAST\n") || !strings.Contains(s, "bytes of stdout dropped") {
		t.Errorf("the output keeps neither its head, its tail, nor a word of what was dropped (%d bytes)", len(s))
	}
	if len(s) > 1<<20+64<<10+4096 {
		t.Errorf("the client got %d bytes of a capped 1M+64K output", len(s))
	}
	file := filepath.Join(d.dir, "sandboxes", sb.ID, "execs", e.ID, "stdout")
	if fi, err := os.Stat(file); err != nil || fi.Size() > 1<<20+64<<10+4096 {
		t.Errorf("the output file: %v %v, want at most the budget", fi.Size(), err)
	}
	if grew := rss(t, d) - before; grew > 64<<20 {
		t.Errorf("sbxd's RSS grew %d MiB through a 300 MB output", grew>>20)
	}
}

// TestDataDirFull: with the data dir full, an exec that ends is recorded
// as ended at once (sbxd keeps room for its database), a new exec is
// refused with a clear error, and once there is room all goes on.
func TestDataDirFull(t *testing.T) {
	d, err := newDaemon()
	if err != nil {
		t.Fatal(err)
	}
	// a small filesystem of its own for the whole data dir
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size=200m", "sbx-e2e-datadir", d.dir).CombinedOutput(); err != nil {
		t.Fatalf("mount a small tmpfs: %v %s", err, out)
	}
	if err := os.Symlink(templateCache(), filepath.Join(d.dir, "templates")); err != nil {
		t.Fatal(err)
	}
	if err := d.start(nil); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		d.stop(true)
		exec.Command("umount", "-l", d.dir).Run()
		// under the tmpfs, newDaemon's own symlink and dir were still there
		os.Remove(filepath.Join(d.dir, "templates"))
		os.Remove(d.dir)
	})
	ctx := context.Background()
	sb, err := d.client.Create(ctx, client.WithTemplate("tiny"))
	if err != nil {
		t.Fatal(err)
	}
	e, err := sdk(d.client).ExecDetached(ctx, sb.ID, api.ExecRequest{Cmd: []string{"sh", "-c", "sleep 2; echo done"}, Detach: true})
	if err != nil {
		t.Fatal(err)
	}
	// fill what is left
	fill := filepath.Join(d.dir, "fill")
	exec.Command("dd", "if=/dev/zero", "of="+fill, "bs=1M", "count=1000").Run()
	var st syscall.Statfs_t
	syscall.Statfs(d.dir, &st)
	if free := int64(st.Bavail) * st.Bsize; free > 1<<20 {
		t.Fatalf("the data dir still has %d bytes free", free)
	}
	// the exec's end is known (and stored, from the reserve)
	waitFor(t, "the exec to be recorded as ended on a full disk", 30*time.Second, func() bool {
		got, err := sdk(d.client).GetExec(ctx, sb.ID, e.ID)
		return err == nil && got.State == api.ExecExited
	})
	// a new exec: a clear error, no exec left running
	_, err = sdk(d.client).ExecDetached(ctx, sb.ID, api.ExecRequest{Cmd: []string{"true"}, Detach: true})
	if err == nil || !strings.Contains(err.Error(), "full") {
		t.Errorf("exec on a full data dir: %v, want an error saying the data dir is full", err)
	}
	execs, _ := d.client.Sandbox(sb.ID).Execs(ctx)
	for _, x := range execs {
		if x.State == api.ExecRunning {
			t.Errorf("exec %s stays running on a full data dir", x.ID)
		}
	}
	// room again: all goes on, and the end was kept
	os.Remove(fill)
	var out strings.Builder
	if _, err := sdk(d.client).Exec(ctx, sb.ID, api.ExecRequest{Cmd: []string{"echo", "back"}}, &out, io.Discard); err != nil || out.String() != "back\n" {
		t.Errorf("exec once there is room: %q %v", out.String(), err)
	}
	d.kill(syscall.SIGTERM)
	if err := d.start(nil); err != nil {
		t.Fatal(err)
	}
	got, err := sdk(d.client).GetExec(ctx, sb.ID, e.ID)
	if err != nil || got.State != api.ExecExited || got.ExitCode == nil || *got.ExitCode != 0 {
		t.Errorf("after a restart, the exec that ended on a full disk: %+v %v", got, err)
	}
}

// TestDataDirLock: a second sbxd on the same data dir refuses to start,
// and says which one holds it.
func TestDataDirLock(t *testing.T) {
	d := shared
	second := &daemon{dir: d.dir, socket: filepath.Join(t.TempDir(), "s.sock"), tag: d.tag, logPath: filepath.Join(t.TempDir(), "log")}
	cmd := exec.Command(filepath.Join(binDir, "sbxd"), "--data-dir", second.dir, "--socket", second.socket, "--tag", second.tag,
		"--runsc", filepath.Join(binDir, "runsc"), "--agent", filepath.Join(binDir, "sbx-agent"), "--preview-listen", "")
	out, err := cmd.CombinedOutput()
	if err == nil || !strings.Contains(string(out), "in use by sbxd pid") {
		t.Errorf("a second sbxd on one data dir: %v %s, want a refusal naming the first", err, out)
	}
	if _, err := d.client.Health(context.Background()); err != nil {
		t.Errorf("the first sbxd after the second tried: %v", err)
	}
}
