package e2e

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"sbx.dev/sbx/api"
	"sbx.dev/sbx/internal/store"
)

// pageHolder holds 256 MiB of anonymous memory, every page of it different
// (its own offset in its first bytes), writes "PID DIGEST" of it to
// /tmp/held.0 and, on each SIGUSR1, again to /tmp/held.N.
const pageHolder = `
import hashlib, os, signal, time
N, P = 256 << 20, 4096
b = bytearray(N)
for o in range(0, N, P):
    b[o:o + 8] = o.to_bytes(8, "little")
n = [0]
def dump(*_):
    p = "/tmp/held.%d" % n[0]
    with open(p + ".tmp", "w") as f:
        f.write("%d %s\n" % (os.getpid(), hashlib.sha256(b).hexdigest()))
    os.rename(p + ".tmp", p)
    n[0] += 1
signal.signal(signal.SIGUSR1, dump)
dump()
while True:
    time.sleep(3600)
`

// readHeld waits for the holder's dump number n in sandbox id.
func readHeld(t *testing.T, d *daemon, id string, n int) (pid, digest string) {
	t.Helper()
	path := "/tmp/held." + string(rune('0'+n))
	waitFor(t, "the holder's "+path+" in "+id, 60*time.Second, func() bool {
		r := d.sbx(t, "exec", id, "--", "cat", path)
		f := strings.Fields(r.stdout)
		if r.code != 0 || len(f) != 2 {
			return false
		}
		pid, digest = f[0], f[1]
		return true
	})
	return pid, digest
}

// pagesImageOf reads, from sbxd's own records, the image sandbox id loads
// its memory from on demand ("" if none).
func pagesImageOf(t *testing.T, d *daemon, id string) string {
	t.Helper()
	st, err := store.Open(filepath.Join(d.dir, "state.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	sb, err := st.Sandbox(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	return sb.PagesImage
}

// TestMemoryForksLoadPagesOnDemand: memory forks load each page of memory
// from the fork's image only when they use it (gVisor patch 10, sbxd
// --fork-pages-on-demand, the default). Four forks of a sandbox holding
// 256 MiB of written memory each hold far less than it while idle, by their
// cgroups' own accounting; every byte is there when a fork reads it; a fork
// stops and resumes with it, and forks again; and the fork's image is kept
// while a fork reads it, then goes.
func TestMemoryForksLoadPagesOnDemand(t *testing.T) {
	d, err := startDaemon(nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.stop(true) })
	ctx := context.Background()
	id := d.newSandbox(t, "--template", "base", "--memory", "1G")
	d.must(t, "exec", id, "--", "sh", "-c", "cat > /tmp/holder.py <<'EOF'\n"+pageHolder+"EOF")
	d.must(t, "exec", "--detach", id, "--", "python3", "/tmp/holder.py")
	pid, want := readHeld(t, d, id, 0)
	memOf := func(id string) int64 {
		t.Helper()
		m, err := d.client.Sandbox(id).Metrics(ctx)
		if err != nil {
			t.Fatalf("metrics of %s: %v", id, err)
		}
		return m.MemoryBytes
	}
	parent := memOf(id)
	if parent < 256<<20 {
		t.Fatalf("the parent holds %d MiB by its cgroup, want 256 MiB or more", parent>>20)
	}

	kids, err := sdk(d.client).Fork(ctx, id, api.ForkRequest{Memory: true, Count: 4})
	if err != nil {
		t.Fatal(err)
	}
	img := pagesImageOf(t, d, kids[0].ID)
	if img == "" {
		t.Fatalf("fork %s loads no pages on demand", kids[0].ID)
	}
	for _, k := range kids {
		if got := pagesImageOf(t, d, k.ID); got != img {
			t.Errorf("fork %s loads its pages from %q, want the fork's image %q", k.ID, got, img)
		}
		// idle, a fork holds what it touched: not the parent's 256 MiB
		m := memOf(k.ID)
		t.Logf("fork %s holds %d MiB by its cgroup, its parent %d MiB", k.ID, m>>20, parent>>20)
		if m > parent-160<<20 {
			t.Errorf("idle fork %s holds %d MiB, its parent %d MiB: want at least 160 MiB less (its pages stay in the image)", k.ID, m>>20, parent>>20)
		}
	}
	imageDir := filepath.Join(d.dir, "images", img)
	if _, err := os.Stat(imageDir); err != nil {
		t.Fatalf("the fork's image while its forks read it: %v", err)
	}

	// every page is there when read, and then held by the fork
	check := func(sb, what string, n int) {
		t.Helper()
		d.must(t, "exec", sb, "--", "kill", "-USR1", pid)
		gotPid, got := readHeld(t, d, sb, n)
		if gotPid != pid || got != want {
			t.Errorf("after %s: the holder (pid %s) holds %s, want pid %s holding %s", what, gotPid, got, pid, want)
		}
	}
	check(kids[0].ID, "a memory fork, read on demand", 1)
	if m := memOf(kids[0].ID); m < 256<<20 {
		t.Errorf("a fork that read its 256 MiB holds %d MiB by its cgroup: the accounting above sees nothing", m>>20)
	}
	d.must(t, "stop", "--wait", kids[1].ID)
	if got := pagesImageOf(t, d, kids[1].ID); got != "" {
		t.Errorf("a stopped fork still reads %q", got)
	}
	d.must(t, "resume", kids[1].ID)
	check(kids[1].ID, "a stop and resume of a fork", 1)
	grand, err := sdk(d.client).Fork(ctx, kids[2].ID, api.ForkRequest{Memory: true})
	if err != nil {
		t.Fatal(err)
	}
	check(grand[0].ID, "a memory fork of a fork", 1)
	check(kids[3].ID, "the last fork, read after the others", 1)

	for _, k := range kids {
		if err := deleteSandbox(ctx, d.client, k.ID); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, "the fork's image to go once no fork reads it", 30*time.Second, func() bool {
		_, err := os.Stat(imageDir)
		return os.IsNotExist(err)
	})
	checkConsistent(t, d)
	deleteEverything(t, d)
	checkNoLeaks(t, d)
}
