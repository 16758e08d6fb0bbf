package e2e

import (
	"context"
	"strings"
	"testing"
	"time"
)

// sparseMemory is a program that lays out 96 MiB of anonymous memory the
// way a memory capture finds it hardest to tell data from holes: pages
// never touched, pages with one byte set anywhere in them (the first, the
// last), whole pages written, pages written and then zeroed again, and
// runs of each. It writes the memory's digest to /tmp/sparse.0, then, on
// each SIGUSR1, the digest of what it holds then to /tmp/sparse.N. Run
// with "expect" it prints the digest the layout must have, from scratch.
const sparseMemory = `
import hashlib, mmap, os, signal, sys, time
N, P = 96 << 20, 4096
m = mmap.mmap(-1, N)
for i in range(N // P):
    o = i * P
    if i % 7 == 0:
        m[o + (i * 37) % P] = i % 251 + 1
    if i % 11 == 0:
        m[o + P - 1] = 0xff
    if i % 13 == 0:
        m[o:o + P] = bytes([i % 256 or 1]) * P
    if i % 17 == 0:
        m[o:o + P] = bytes(P)
    if 6000 <= i < 6400:
        m[o] = 1
def digest():
    return hashlib.sha256(m).hexdigest()
if sys.argv[1:] == ["expect"]:
    print(digest())
    sys.exit(0)
n = [0]
def dump(*_):
    with open("/tmp/sparse.%d.tmp" % n[0], "w") as f:
        f.write("%d %s\n" % (os.getpid(), digest()))
    os.rename("/tmp/sparse.%d.tmp" % n[0], "/tmp/sparse.%d" % n[0])
    n[0] += 1
signal.signal(signal.SIGUSR1, dump)
dump()
while True:
    time.sleep(3600)
`

// TestCaptureSparseMemory: a capture of a sandbox's memory (stop and
// resume, a memory fork, a freeze and a copy of it) brings back every page
// a process holds, byte for byte, however sparse: runsc's capture reads
// only the parts of the memory file that hold data (third_party/gvisor's
// pgalloc patch), and this is the test that it skips nothing else.
func TestCaptureSparseMemory(t *testing.T) {
	d, err := startDaemon(nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.stop(true) })
	id := d.newSandbox(t, "--template", "base")
	d.must(t, "exec", id, "--", "sh", "-c", "cat > /tmp/sparse.py <<'EOF'\n"+sparseMemory+"EOF")
	want := strings.TrimSpace(d.must(t, "exec", id, "--", "python3", "/tmp/sparse.py", "expect"))
	d.must(t, "exec", "--detach", id, "--", "python3", "/tmp/sparse.py")
	first := readSparse(t, d, id, 0)
	if first.digest != want {
		t.Fatalf("the holder's memory %s, want %s before any capture", first.digest, want)
	}
	// check asks the holder in sb for the digest of its memory now
	check := func(sb, what string, n int) {
		t.Helper()
		d.must(t, "exec", sb, "--", "kill", "-USR1", first.pid)
		got := readSparse(t, d, sb, n)
		if got.pid != first.pid || got.digest != want {
			t.Errorf("after %s: the holder (pid %s) holds %s, want pid %s holding %s", what, got.pid, got.digest, first.pid, want)
		}
	}

	d.must(t, "stop", id)
	d.must(t, "resume", id)
	check(id, "a stop and resume with memory", 1)

	out := strings.Fields(d.must(t, "fork", "--memory", id))
	if len(out) == 0 {
		t.Fatal("fork --memory printed no child")
	}
	child := out[0]
	t.Cleanup(func() { _ = sdk(d.client).Delete(context.Background(), child) })
	check(child, "a memory fork", 2)

	name := freezeIn(t, d, id, "")
	waitSnapshot(t, d, name, 10*time.Second)
	check(id, "a freeze (the original)", 2)
	cp := d.newSandbox(t, "--from", name)
	check(cp, "a freeze (a copy of it)", 2) // its memory is from before the original's second dump

	checkConsistent(t, d)
	deleteEverything(t, d)
	checkNoLeaks(t, d)
}

type sparseDump struct{ pid, digest string }

// readSparse waits for the holder's dump number n in sandbox id.
func readSparse(t *testing.T, d *daemon, id string, n int) sparseDump {
	t.Helper()
	var out sparseDump
	path := "/tmp/sparse." + string(rune('0'+n))
	waitFor(t, "the holder's "+path+" in "+id, 60*time.Second, func() bool {
		r := d.sbx(t, "exec", id, "--", "cat", path)
		f := strings.Fields(r.stdout)
		if r.code != 0 || len(f) != 2 {
			return false
		}
		out = sparseDump{pid: f[0], digest: f[1]}
		return true
	})
	return out
}
