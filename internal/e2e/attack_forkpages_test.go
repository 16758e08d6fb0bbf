package e2e

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"sbx.dev/sbx/api"
	"sbx.dev/sbx/client"
	"sbx.dev/sbx/internal/store"
)

// Attacks on memory forks that load their pages on demand (gVisor patch 10,
// sbxd --fork-pages-on-demand): the memory a fork reads must be its
// parent's, byte for byte, whatever the fork does to it, and the fork's
// image must live exactly as long as a fork reads it.

// atkWork is a workload that lays out memory of every kind a fork restores
// on demand, each page its own bytes (its region's tag and its index):
//
//	anon    64 MiB private anonymous (madvise and concurrent writes)
//	remap    8 MiB private anonymous (mremap'd elsewhere in a fork)
//	unmap    8 MiB private anonymous (its middle munmap'd in a fork)
//	shared  16 MiB shared anonymous
//	shm     16 MiB file in /dev/shm, tmp 16 MiB in /tmp (tmpfs)
//	overlay 16 MiB file on the root overlay (its filestore), gone 32 MiB
//	        more there, which a fork may delete unread
//	sparse 256 MiB private anonymous, one page written per MiB
//
// Run with "expect" it prints each region's digest computed from scratch
// (a digest of the 1 MiB chunks' digests). Run with no argument it lays the
// memory out, writes "PID" to /tmp/atk.ready and waits: on SIGUSR1 it reads
// "COMMAND TOKEN" from /tmp/atk.cmd, runs it and writes its result to
// /tmp/atk.out.TOKEN. The commands: verify (every region's digest, hashed
// by 8 threads at once: concurrent faults), dontneed (madvise DONTNEED of
// single pages in the middle of huge pages and of whole huge pages never
// read since the restore, which must then read zeros), remap (mremap to a
// new place: the same bytes there, zeros past the old end), unmap (munmap
// of the middle; the rest keeps its bytes), churn (4 threads rewrite half of
// anon while 4 hash the other half: pages written while they load; then
// every rewritten page is checked, and anon written back), gone (unlink the
// overlay file "gone" without reading it).
const atkWork = `
import ctypes, hashlib, os, signal, sys, threading, time
P, H, MB = 4096, 2 << 20, 1 << 20
libc = ctypes.CDLL(None, use_errno=True)
libc.mmap.restype = ctypes.c_void_p
libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
libc.mremap.restype = ctypes.c_void_p
libc.mremap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p]
libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
FAIL = ctypes.c_void_p(-1).value
SIZES = {"anon": 64*MB, "remap": 8*MB, "unmap": 8*MB, "shared": 16*MB, "shm": 16*MB, "tmp": 16*MB, "overlay": 16*MB, "gone": 32*MB, "sparse": 256*MB}
TAGS = {"anon": 1, "remap": 2, "unmap": 3, "shared": 4, "shm": 5, "tmp": 6, "overlay": 7, "gone": 9, "sparse": 8}
FILES = {"shm": "/dev/shm/atk", "tmp": "/tmp/atk", "overlay": "/var/tmp/atk", "gone": "/var/tmp/atk-gone"}
ORDER = ["anon", "remap", "unmap", "shared", "shm", "tmp", "overlay", "gone", "sparse"]
ZERO = bytes(P)

def pat(tag, i):
    return ((tag << 40) | (i + 1)).to_bytes(8, "little") * (P // 8)

def page(name, i):
    if name == "sparse":
        return pat(8, i) if i % 256 == 0 else ZERO
    return pat(TAGS[name], i)

def expect(name):
    h = hashlib.sha256()
    for c in range(SIZES[name] // MB):
        ch = hashlib.sha256()
        for i in range(c * 256, (c + 1) * 256):
            ch.update(page(name, i))
        h.update(ch.digest())
    return h.hexdigest()

if sys.argv[1:] == ["expect"]:
    print(" ".join("%s=%s" % (n, expect(n)) for n in ORDER))
    sys.exit(0)

def mapping(size, flags):
    a = libc.mmap(None, size, 3, flags, -1, 0)
    if a in (None, FAIL):
        raise OSError(ctypes.get_errno(), "mmap")
    return a

def view(a, size):
    return memoryview((ctypes.c_char * size).from_address(a)).cast("B")

MEM = {}
for n in ("anon", "remap", "unmap"):
    MEM[n] = mapping(SIZES[n], 0x22)
MEM["shared"] = mapping(SIZES["shared"], 0x21)
MEM["sparse"] = mapping(SIZES["sparse"], 0x4022)
for n, a in MEM.items():
    for i in range(SIZES[n] // P):
        if n != "sparse" or i % 256 == 0:
            ctypes.memmove(a + i * P, page(n, i), P)
for n, path in FILES.items():
    with open(path, "wb") as f:
        for i in range(SIZES[n] // P):
            f.write(page(n, i))
DONE = set()

def pool(jobs, threads=8):
    out = [None] * len(jobs)
    it = iter(range(len(jobs)))
    lock = threading.Lock()
    def work():
        while True:
            with lock:
                k = next(it, None)
            if k is None:
                return
            out[k] = jobs[k]()
    ts = [threading.Thread(target=work) for _ in range(threads)]
    for t in ts: t.start()
    for t in ts: t.join()
    return out

def chunk_mem(a, c):
    return lambda: hashlib.sha256(view(a + c * MB, MB)).digest()

def chunk_file(fd, c):
    return lambda: hashlib.sha256(os.pread(fd, MB, c * MB)).digest()

def verify():
    jobs, spans, fds = [], [], []
    for n in ORDER:
        if n in DONE:
            continue
        start = len(jobs)
        if n in FILES:
            fd = os.open(FILES[n], os.O_RDONLY)
            fds.append(fd)
            jobs += [chunk_file(fd, c) for c in range(SIZES[n] // MB)]
        else:
            jobs += [chunk_mem(MEM[n], c) for c in range(SIZES[n] // MB)]
        spans.append((n, start, len(jobs)))
    ds = pool(jobs)
    for fd in fds:
        os.close(fd)
    return "verify " + " ".join("%s=%s" % (n, hashlib.sha256(b"".join(ds[s:e])).hexdigest()) for n, s, e in spans)

def dontneed():
    a, size = MEM["anon"], SIZES["anon"]
    first = (a + H - 1) // H * H
    bad, n = [], 0
    for j in range(12):
        p = first + 2 * j * H + (5 + j) * P
        i = (p - a) // P
        if libc.madvise(p, P, 4) != 0:
            return "dontneed madvise errno %d" % ctypes.get_errno()
        n += 1
        if ctypes.string_at(p, P) != ZERO:
            bad.append("page%d" % i)
        ctypes.memmove(p, pat(1, i), P)
    for j in (25, 27):
        b = first + j * H
        if libc.madvise(b, H, 4) != 0:
            return "dontneed madvise errno %d" % ctypes.get_errno()
        n += 1
        if ctypes.string_at(b, H).count(0) != H:
            bad.append("huge%d" % ((b - a) // P))
        for k in range(H // P):
            ctypes.memmove(b + k * P, pat(1, (b - a) // P + k), P)
    return "dontneed checked=%d bad=%d %s" % (n, len(bad), ",".join(bad))

def remap():
    a, size = MEM["remap"], SIZES["remap"]
    dst = mapping(2 * size, 0x22)
    b = libc.mremap(a, size, 2 * size, 3, dst)
    if b in (None, FAIL):
        return "remap errno %d" % ctypes.get_errno()
    MEM["remap"] = b
    tail = ctypes.string_at(b + size, size).count(0) == size
    return "remap moved=%s tailzero=%s" % (b != a, tail)

def unmap():
    a = MEM["unmap"]
    if libc.munmap(a + 2 * MB, 4 * MB) != 0:
        return "unmap errno %d" % ctypes.get_errno()
    DONE.add("unmap")
    bad = [i for i in list(range(0, 512)) + list(range(1536, 2048)) if ctypes.string_at(a + i * P, P) != pat(3, i)]
    return "unmap bad=%d" % len(bad)

def churn():
    a, size = MEM["anon"], SIZES["anon"]
    half = size // P // 2
    def writer(lo, hi):
        return lambda: [ctypes.memmove(a + i * P, pat(11, i), P) for i in range(lo, hi)] and None
    q = half // 4
    jobs = [writer(half + k * q, half + (k + 1) * q) for k in range(4)]
    jobs += [chunk_mem(a, c) for c in range(half * P // MB)]
    pool(jobs, 8)
    bad = [i for i in range(half, 2 * half) if ctypes.string_at(a + i * P, P) != pat(11, i)]
    for i in range(half, 2 * half):
        ctypes.memmove(a + i * P, pat(1, i), P)
    return "churn bad=%d" % len(bad)

def gone():
    os.unlink(FILES["gone"])
    DONE.add("gone")
    return "gone ok"

CMDS = {"verify": verify, "dontneed": dontneed, "remap": remap, "unmap": unmap, "churn": churn, "gone": gone}

def handle(*_):
    try:
        cmd, tok = open("/tmp/atk.cmd").read().split()
    except Exception:
        return
    try:
        res = CMDS[cmd]()
    except Exception as e:
        res = "%s error %r" % (cmd, e)
    with open("/tmp/atk.out.%s.tmp" % tok, "w") as f:
        f.write("%d %s\n" % (os.getpid(), res))
    os.rename("/tmp/atk.out.%s.tmp" % tok, "/tmp/atk.out.%s" % tok)

signal.signal(signal.SIGUSR1, handle)
with open("/tmp/atk.ready.tmp", "w") as f:
    f.write("%d\n" % os.getpid())
os.rename("/tmp/atk.ready.tmp", "/tmp/atk.ready")
while True:
    time.sleep(3600)
`

// atk is the workload running in a sandbox and in every memory fork of it.
type atk struct {
	pid    string
	expect map[string]string // each region's digest, from scratch
}

// startAtk starts atkWork in sandbox id (template base) and checks that
// it holds what it should.
func startAtk(t *testing.T, d *daemon, id string) *atk {
	t.Helper()
	d.must(t, "exec", id, "--", "sh", "-c", "cat > /tmp/atk.py <<'EOF'\n"+atkWork+"EOF")
	out := strings.TrimSpace(d.must(t, "exec", id, "--", "python3", "/tmp/atk.py", "expect"))
	a := &atk{expect: parseDigests(out)}
	if len(a.expect) != 9 {
		t.Fatalf("atk expect printed %q", out)
	}
	d.must(t, "exec", "--detach", id, "--", "python3", "/tmp/atk.py")
	waitFor(t, "atk to lay its memory out in "+id, 3*time.Minute, func() bool {
		r := d.sbx(t, "exec", id, "--", "cat", "/tmp/atk.ready")
		a.pid = strings.TrimSpace(r.stdout)
		return r.code == 0 && a.pid != ""
	})
	a.verify(t, d, id, "the sandbox it was started in")
	return a
}

func parseDigests(s string) map[string]string {
	out := map[string]string{}
	for _, f := range strings.Fields(s) {
		if k, v, ok := strings.Cut(f, "="); ok {
			out[k] = v
		}
	}
	return out
}

// do runs one command of atk's in sandbox id and returns its result (the
// words after the command's name).
func (a *atk) do(t *testing.T, d *daemon, id, cmd string) string {
	t.Helper()
	tok := randHex(6)
	d.must(t, "exec", id, "--", "sh", "-c", fmt.Sprintf("echo %s %s > /tmp/atk.cmd.tmp && mv /tmp/atk.cmd.tmp /tmp/atk.cmd && kill -USR1 %s", cmd, tok, a.pid))
	var res string
	waitFor(t, "atk's "+cmd+" in "+id, 4*time.Minute, func() bool {
		r := d.sbx(t, "exec", id, "--", "cat", "/tmp/atk.out."+tok)
		if r.code != 0 {
			return false
		}
		pid, rest, _ := strings.Cut(strings.TrimSpace(r.stdout), " ")
		if pid != a.pid {
			t.Fatalf("%s in %s: answered by pid %s, want the workload's %s (its memory is not the parent's)", cmd, id, pid, a.pid)
		}
		res = strings.TrimPrefix(rest, cmd+" ")
		return true
	})
	return res
}

// verify checks, in sandbox id, that every region the workload holds has
// its bytes.
func (a *atk) verify(t *testing.T, d *daemon, id, what string) {
	t.Helper()
	got := parseDigests(a.do(t, d, id, "verify"))
	if len(got) == 0 {
		t.Errorf("%s (%s): verify returned nothing", what, id)
	}
	var bad []string
	for k, v := range got {
		if a.expect[k] != v {
			bad = append(bad, k)
		}
	}
	sort.Strings(bad)
	if len(bad) > 0 {
		t.Errorf("%s (%s): the memory of regions %v differs from the parent's (a page loaded wrong, or lost)", what, id, bad)
	}
}

// atkForks makes n memory forks of id with the Go client.
func atkForks(t *testing.T, d *daemon, id string, n int) []string {
	t.Helper()
	kids, err := sdk(d.client).Fork(context.Background(), id, api.ForkRequest{Memory: true, Count: n})
	if err != nil {
		t.Fatalf("fork --memory of %s: %v", id, err)
	}
	var ids []string
	for _, k := range kids {
		ids = append(ids, k.ID)
	}
	return ids
}

// imageHolders lists the host processes holding a file of image img open
// (matched by its id: a process in another mount namespace sees another
// path).
func imageHolders(img string) []string {
	var out []string
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		fds, _ := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
		for _, fd := range fds {
			l, err := os.Readlink(fmt.Sprintf("/proc/%d/fd/%s", pid, fd.Name()))
			if err == nil && strings.Contains(l, "/"+img+"/") {
				cmd, _ := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid))
				out = append(out, fmt.Sprintf("pid %d (%s) fd %s -> %s", pid, strings.TrimSpace(string(cmd)), fd.Name(), l))
			}
		}
	}
	return out
}

// imagesLeft lists the image dirs and records of d (none once everything
// is deleted and swept).
func imagesLeft(t testing.TB, d *daemon) []string {
	t.Helper()
	var left []string
	ents, _ := os.ReadDir(filepath.Join(d.dir, "images"))
	for _, e := range ents {
		left = append(left, "dir "+e.Name())
	}
	st, err := store.Open(filepath.Join(d.dir, "state.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	ims, _ := st.Images(context.Background())
	for _, im := range ims {
		left = append(left, fmt.Sprintf("record %s (%s of %s)", im.ID, im.Kind, im.SandboxID))
	}
	return left
}

// waitNoImages waits for every image of d to be gone, files and records.
func waitNoImages(t *testing.T, d *daemon, limit time.Duration) {
	t.Helper()
	deadline := time.Now().Add(limit)
	for {
		left := imagesLeft(t, d)
		if len(left) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Errorf("images left %s after every sandbox and snapshot was deleted (sbxd --orphan-grace 2s): %v", limit, left)
			return
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// shmemTHP sets the host's shmem transparent huge pages (what runsc reads
// to back application memory with huge pages) for the test, and puts it
// back after.
func shmemTHP(t *testing.T, mode string) {
	t.Helper()
	const p = "/sys/kernel/mm/transparent_hugepage/shmem_enabled"
	b, err := os.ReadFile(p)
	if err != nil {
		t.Skipf("no %s: %v", p, err)
	}
	cur := ""
	for _, f := range strings.Fields(string(b)) {
		if strings.HasPrefix(f, "[") {
			cur = strings.Trim(f, "[]")
		}
	}
	if cur == mode {
		return
	}
	if err := os.WriteFile(p, []byte(mode), 0); err != nil {
		t.Skipf("set %s to %s: %v", p, mode, err)
	}
	t.Logf("host %s: %s (was %s, put back at the end)", p, mode, cur)
	t.Cleanup(func() {
		if err := os.WriteFile(p, []byte(cur), 0); err != nil {
			t.Errorf("put %s back to %s: %v", p, cur, err)
		}
	})
}

// TestAttackForkPagesMadviseDontneed: madvise(MADV_DONTNEED) on private
// anonymous memory must read back zeros, in a fork as anywhere. In a fork
// whose pages load on demand, the pages madvised were never read since the
// restore: still in the image. With application huge pages (the host's
// shmem_enabled allows them), gVisor's madvise of part of a huge page
// decommits it in the memory file (MemoryFile.Decommit) without cancelling
// its pending load, so the next touch loads the parent's bytes over the
// zeros. Run with the host as it is, and with shmem_enabled=always (set for
// the test, put back after).
func TestAttackForkPagesMadviseDontneed(t *testing.T) {
	for _, mode := range []string{"host", "always"} {
		t.Run("thp-"+mode, func(t *testing.T) {
			if mode != "host" {
				shmemTHP(t, mode)
			}
			d, err := startDaemon(nil)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { d.stop(true) })
			id := d.newSandbox(t, "--template", "base", "--memory", "2G")
			a := startAtk(t, d, id)
			// the control: the parent itself (no restore, nothing to load)
			if got := a.do(t, d, id, "dontneed"); !strings.HasPrefix(got, "checked=14 bad=0") {
				t.Fatalf("in the parent: dontneed %q, want 14 ranges checked, all zeros", got)
			}
			kids := atkForks(t, d, id, 2)
			got := a.do(t, d, kids[0], "dontneed")
			if !strings.HasPrefix(got, "checked=14 bad=0") {
				t.Errorf("in a memory fork (pages on demand): dontneed %q: pages madvised DONTNEED read back the parent's bytes, not zeros", got)
			}
			a.verify(t, d, kids[0], "a fork after madvise(DONTNEED)")
			// and a fork that loaded every page before (a verify) is not affected
			a.verify(t, d, kids[1], "a fork read whole")
			if got := a.do(t, d, kids[1], "dontneed"); !strings.HasPrefix(got, "checked=14 bad=0") {
				t.Errorf("in a memory fork read whole first: dontneed %q, want all zeros", got)
			}
			deleteEverything(t, d)
			checkNoLeaks(t, d)
		})
	}
}

// TestAttackForkPagesMemoryOps: whatever a fork does to memory it restored
// on demand keeps every byte its parent had: mremap to a new place, munmap
// of a middle part, 4 threads writing pages while 4 read others (pages
// written while they load), 8 threads hashing every region at once
// (concurrent faults on the same image), files in /dev/shm, /tmp and on
// the root overlay (whose filestore is loaded on demand too), sparse
// memory. Four forks do it at once.
func TestAttackForkPagesMemoryOps(t *testing.T) {
	d, err := startDaemon(nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.stop(true) })
	id := d.newSandbox(t, "--template", "base", "--memory", "2G")
	a := startAtk(t, d, id)
	kids := atkForks(t, d, id, 4)
	var wg sync.WaitGroup
	for i, k := range kids {
		wg.Add(1)
		go func() {
			defer wg.Done()
			switch i {
			case 0:
				if got := a.do(t, d, k, "remap"); got != "moved=True tailzero=True" {
					t.Errorf("fork %s: mremap: %q, want moved with its tail zero", k, got)
				}
				if got := a.do(t, d, k, "unmap"); got != "bad=0" {
					t.Errorf("fork %s: after munmap of the middle: %q, want the rest intact", k, got)
				}
			case 1:
				if got := a.do(t, d, k, "churn"); got != "bad=0" {
					t.Errorf("fork %s: pages written while they load: %q, want every write kept", k, got)
				}
			}
			a.verify(t, d, k, fmt.Sprintf("fork %d, after its memory operations", i))
		}()
	}
	wg.Wait()
	a.verify(t, d, id, "the parent, after its forks")
	deleteEverything(t, d)
	checkNoLeaks(t, d)
}

// TestAttackForkPagesChain: a fork of a fork of a fork, the ancestors
// deleted while the descendants read their images, a stop and resume in
// the middle, a memory snapshot taken while the fork is loading its pages
// (a verify runs in it meanwhile), a sandbox from that snapshot: each has
// its parent's bytes, and every image goes once nothing reads it.
func TestAttackForkPagesChain(t *testing.T) {
	d := forkPagesDaemon(t)
	p := d.newSandbox(t, "--template", "base", "--memory", "2G")
	a := startAtk(t, d, p)
	f1 := atkForks(t, d, p, 1)[0]
	img1 := pagesImageOf(t, d, f1)
	f2 := atkForks(t, d, f1, 1)[0]
	img2 := pagesImageOf(t, d, f2)
	if img1 == "" || img2 == "" || img1 == img2 {
		t.Fatalf("fork images %q and %q: want two, one per fork", img1, img2)
	}
	if got := pagesImageOf(t, d, f1); got != "" {
		t.Errorf("fork %s, captured with its memory for its own fork, still holds %q", f1, got)
	}
	// the parent and the first fork go while the second reads its image
	for _, id := range []string{p, f1} {
		if err := deleteSandbox(context.Background(), d.client, id); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, "the first fork image to go (its only reader captured all its pages)", 30*time.Second, func() bool {
		_, err := os.Stat(filepath.Join(d.dir, "images", img1))
		return os.IsNotExist(err)
	})
	if _, err := os.Stat(filepath.Join(d.dir, "images", img2, "COMPLETE")); err != nil {
		t.Fatalf("the image fork %s reads: %v", f2, err)
	}
	f3 := atkForks(t, d, f2, 2)
	a.verify(t, d, f2, "a fork of a fork, its ancestors deleted")
	d.must(t, "stop", "--wait", f3[0])
	d.must(t, "resume", f3[0])
	a.verify(t, d, f3[0], "a fork of a fork of a fork, stopped and resumed")

	// a memory snapshot of f3[1] while it loads its pages
	done := make(chan struct{})
	go func() {
		defer close(done)
		a.verify(t, d, f3[1], "a fork of a fork of a fork, read during a memory snapshot of it")
	}()
	time.Sleep(300 * time.Millisecond)
	d.must(t, "snapshot", f3[1], "while-loading", "--memory")
	<-done
	from := d.newSandbox(t, "--from", "while-loading")
	a.verify(t, d, from, "a sandbox from a memory snapshot of a fork taken while it loaded")
	a.verify(t, d, f3[1], "the fork after its memory snapshot")

	checkConsistent(t, d)
	endForkPages(t, d)
}

// TestAttackForkPagesImageClosedAfterCapture: once a fork is captured with
// its memory, sbxd drops its hold on the fork image and removes it when no
// other fork holds it. No process may still hold a file of it: a pages
// file deleted but held open is disk no `sbx df` shows and no prune
// reclaims, for the fork's whole life. gVisor's on-demand loader closes
// the pages file only once its list of memory files with pages to load is
// empty (allLoaded); a memory file's last unloaded pages freed unread
// (cancelWasteLoad, which never takes the memory file off that list) keep
// it open forever. The fork here deletes, unread, a file of its root
// overlay after reading everything else there: the overlay's filestore is
// such a memory file.
func TestAttackForkPagesImageClosedAfterCapture(t *testing.T) {
	d := forkPagesDaemon(t)
	p := d.newSandbox(t, "--template", "base", "--memory", "2G")
	a := startAtk(t, d, p)
	cases := []struct {
		name string
		prep func(k string)
	}{
		{"read as it comes", func(k string) { a.verify(t, d, k, "a fork before its memory snapshot") }},
		{"an overlay file deleted unread, the rest read", func(k string) {
			// every file of the root overlay but "gone", read (its pages loaded)
			d.must(t, "exec", k, "--", "sh", "-c", "find / -xdev -type f ! -name atk-gone -exec cat {} + > /dev/null 2>&1; true")
			if got := a.do(t, d, k, "gone"); got != "ok" {
				t.Fatalf("unlink in %s: %q", k, got)
			}
		}},
	}
	for _, c := range cases {
		t.Run(strings.ReplaceAll(c.name, " ", "-"), func(t *testing.T) {
			k := atkForks(t, d, p, 1)[0]
			img := pagesImageOf(t, d, k)
			dir := filepath.Join(d.dir, "images", img)
			if len(imageHolders(img)) == 0 {
				t.Fatalf("no process holds a file of image %s while fork %s reads it: this test cannot see who holds it", img, k)
			}
			c.prep(k)
			name := "cap-" + randHex(3)
			d.must(t, "snapshot", k, name, "--memory")
			waitFor(t, "the fork image to go once its fork holds every page", 30*time.Second, func() bool {
				_, err := os.Stat(dir)
				return os.IsNotExist(err)
			})
			// the loader ends as the checkpoint's last page is in
			time.Sleep(2 * time.Second)
			if h := imageHolders(img); len(h) > 0 {
				t.Errorf("the fork image was removed (sbxd: no fork reads it) but is still held open, its disk not freed: %v", h)
			}
			a.verify(t, d, k, "the fork after its memory snapshot")
			if err := deleteSandbox(context.Background(), d.client, k); err != nil {
				t.Fatal(err)
			}
			if err := d.client.DeleteSnapshot(context.Background(), name); err != nil {
				t.Fatal(err)
			}
		})
	}
	endForkPages(t, d)
}

// TestAttackForkPagesFreezeReleases: a freeze from inside a fork
// (/.sbx/freeze) is a capture of it with its memory: gVisor's checkpoint
// loads every page first, so the fork reads its image no more. The README:
// the image is removed when the last fork that reads it is deleted,
// stopped, or captured with its memory.
func TestAttackForkPagesFreezeReleases(t *testing.T) {
	d := forkPagesDaemon(t)
	p := d.newSandbox(t, "--template", "base", "--memory", "1G")
	startPageHolder(t, d, p)
	pid, want := readHeld(t, d, p, 0)
	k := atkForks(t, d, p, 1)[0]
	img := pagesImageOf(t, d, k)
	name := freezeIn(t, d, k, "")
	waitSnapshot(t, d, name, 30*time.Second)
	cp := d.newSandbox(t, "--from", name)
	d.must(t, "exec", cp, "--", "kill", "-USR1", pid)
	if gotPid, got := readHeld(t, d, cp, 1); gotPid != pid || got != want {
		t.Errorf("a sandbox from a freeze of a fork: holder %s holds %s, want %s holding %s", gotPid, got, pid, want)
	}
	if got := pagesImageOf(t, d, k); got != "" {
		t.Errorf("fork %s froze itself (a checkpoint of every page), yet still holds the fork image %q: it stays on disk until the fork is deleted", k, got)
	}
	time.Sleep(3 * time.Second)
	if _, err := os.Stat(filepath.Join(d.dir, "images", img)); err == nil {
		t.Errorf("the fork image %s is kept after its only fork froze itself", img)
	}
	endForkPages(t, d)
}

// TestAttackForkPagesManyReadAtOnce: 8 forks of a sandbox holding 256 MiB
// all read every page at once (each a hostile root touching all its
// memory): each gets every byte, none fails, and each then holds its
// parent's memory by its cgroup. (16 took two minutes of the suite here,
// on 2 cores, and found nothing 8 do not.)
func TestAttackForkPagesManyReadAtOnce(t *testing.T) {
	d := forkPagesDaemon(t)
	ctx := context.Background()
	p := d.newSandbox(t, "--template", "base", "--memory", "1G")
	startPageHolder(t, d, p)
	pid, want := readHeld(t, d, p, 0)
	const n = 8
	kids := atkForks(t, d, p, n)
	start := time.Now()
	var wg sync.WaitGroup
	for _, k := range kids {
		wg.Add(1)
		go func() {
			defer wg.Done()
			d.must(t, "exec", k, "--", "kill", "-USR1", pid)
		}()
	}
	wg.Wait()
	for _, k := range kids {
		gotPid, got := readHeld(t, d, k, 1)
		if gotPid != pid || got != want {
			t.Errorf("fork %s: holder %s holds %s, want %s holding %s", k, gotPid, got, pid, want)
		}
	}
	t.Logf("%d forks read 256 MiB each at once in %s", n, time.Since(start).Round(time.Millisecond))
	for _, k := range kids {
		info := d.info(t, k)
		if info.State != api.StateReady {
			t.Errorf("fork %s is %s (%s) after reading its memory", k, info.State, info.Reason)
		}
		if m, err := d.client.Sandbox(k).Metrics(ctx); err == nil && m.MemoryBytes < 256<<20 {
			t.Errorf("fork %s read 256 MiB and holds %d MiB by its cgroup", k, m.MemoryBytes>>20)
		}
	}
	endForkPages(t, d)
}

// TestAttackForkPagesOOMWhileLoading: a fork that passes its memory limit
// while it loads pages (a hostile root allocating while its parent's
// memory loads) is stopped by the kernel and reported out of memory; its
// siblings, reading the same image, keep every byte; and the image goes
// once every fork is deleted, the dead one included.
func TestAttackForkPagesOOMWhileLoading(t *testing.T) {
	d := forkPagesDaemon(t)
	p := d.newSandbox(t, "--template", "base", "--memory", "512M")
	startPageHolder(t, d, p)
	pid, want := readHeld(t, d, p, 0)
	kids := atkForks(t, d, p, 3)
	img := pagesImageOf(t, d, kids[0])
	// the hog holds 320 MiB, then the holder loads its 256 MiB
	d.must(t, "exec", "--detach", kids[0], "--", "python3", "-c",
		"import time\nb = bytearray(320 << 20)\nfor i in range(0, len(b), 4096): b[i] = 1\nopen('/tmp/hog', 'w').write('x')\ntime.sleep(3600)")
	waitFor(t, "the hog to hold its memory", 60*time.Second, func() bool {
		return d.sbx(t, "exec", kids[0], "--", "cat", "/tmp/hog").code == 0
	})
	// The holder's read loads 256 MiB more than the limit leaves. The kill
	// may itself be cut by the kernel's stop (so its result proves
	// nothing); it is sent again while the holder has not read and the
	// fork still runs, as an exec under a loaded host may fail on its own.
	memOf := func() int64 {
		m, err := d.client.Sandbox(kids[0]).Metrics(context.Background())
		if err != nil {
			return -1
		}
		return m.MemoryBytes
	}
	deadline := time.Now().Add(2 * time.Minute)
	for d.info(t, kids[0]).State == api.StateReady {
		if time.Now().After(deadline) {
			t.Fatalf("the fork past its limit still runs after 2m0s: it holds %d MiB by its cgroup (limit 512 MiB)", memOf()>>20)
		}
		r := d.sbx(t, "exec", kids[0], "--", "sh", "-c", "cat /tmp/held.1 2>/dev/null || kill -USR1 "+pid)
		if r.code == 0 && strings.TrimSpace(r.stdout) != "" {
			time.Sleep(2 * time.Second) // the kernel's stop may still be on its way
			if d.info(t, kids[0]).State == api.StateReady {
				t.Fatalf("a fork holding 320 MiB of its own read its 256 MiB on a limit of 512 MiB and runs on (holds %d MiB by its cgroup): %s", memOf()>>20, r.stdout)
			}
			break
		}
		time.Sleep(3 * time.Second)
	}
	if st := d.info(t, kids[0]).State; st != api.StateError {
		t.Fatalf("the fork past its limit is %s, want %s", st, api.StateError)
	}
	if info := d.info(t, kids[0]); !strings.Contains(info.Reason, "out of memory") {
		t.Errorf("the fork past its limit: %s (%s), want out of memory", info.State, info.Reason)
	}
	for _, k := range kids[1:] {
		d.must(t, "exec", k, "--", "kill", "-USR1", pid)
		if gotPid, got := readHeld(t, d, k, 1); gotPid != pid || got != want {
			t.Errorf("sibling %s of a fork killed out of memory: holder %s holds %s, want %s holding %s", k, gotPid, got, pid, want)
		}
	}
	if _, err := os.Stat(filepath.Join(d.dir, "images", img)); err != nil {
		t.Errorf("the fork image while two forks read it: %v", err)
	}
	endForkPages(t, d)
}

// TestAttackForkPagesCLI: what a user types. `sbx fork --memory --count 17
// --wait` grows a tree (16 children, then a fork of a child); `sbx df`
// counts each fork image once; `sbx prune` and an orphan budget of one
// byte (sbxd --orphan-max 1) leave the images forks read; `sbx rm` of many
// forks at once; each image goes with the last fork that reads it.
func TestAttackForkPagesCLI(t *testing.T) {
	d, err := startDaemon([]string{"--orphan-grace", "2s", "--orphan-max", "1"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.stop(true) })
	p := d.newSandbox(t, "--template", "tiny", "--memory", "128M")
	h := startHolderTiny(t, d, p)
	const count = 17
	out := d.must(t, "fork", "--memory", "--count", strconv.Itoa(count), "--wait", p)
	// each id as sbxd names it, then "ready ID"
	var kids []string
	seen := map[string]bool{}
	for _, f := range strings.Fields(out) {
		if idRE.MatchString(f) && !seen[f] {
			seen[f] = true
			kids = append(kids, f)
		}
	}
	if len(kids) != count {
		t.Fatalf("sbx fork --memory --count %d --wait printed %d ids: %q", count, len(kids), out)
	}
	images := map[string][]string{}
	for _, k := range kids {
		img := pagesImageOf(t, d, k)
		images[img] = append(images[img], k)
	}
	t.Logf("%d forks read %d images (%d are forks of forks, whose parents hold every page)", count, len(images), len(kids)-len(images[pagesImageOf(t, d, kids[0])]))
	var st api.Storage
	d.jsonOut(t, &st, "df")
	for img, readers := range images {
		if img == "" {
			continue
		}
		size := duOf(filepath.Join(d.dir, "images", img)) - 64<<10 // give or take its directories
		n := 0
		for _, it := range st.Sandboxes {
			for _, r := range readers {
				if it.ID == r && it.Bytes >= size {
					n++
				}
			}
		}
		if n != 1 {
			t.Errorf("sbx df counts fork image %s (%d bytes) with %d of its %d forks, want exactly one", img, size, n, len(readers))
		}
		for _, o := range st.Orphans {
			if o.ID == img {
				t.Errorf("sbx df lists fork image %s, which %d forks read, as an orphan", img, len(readers))
			}
		}
	}
	d.must(t, "prune")
	time.Sleep(2 * time.Second) // the orphan budget's sweep
	for img := range images {
		if img == "" {
			continue
		}
		if _, err := os.Stat(filepath.Join(d.dir, "images", img, "COMPLETE")); err != nil {
			t.Errorf("fork image %s after sbx prune and the orphan budget, its forks alive: %v", img, err)
		}
	}
	// the first, the last (a fork of a fork) and one between: each
	// checkMemory waits for its holder to count (seconds), 17 took a minute
	for _, k := range []string{kids[0], kids[len(kids)/2], kids[len(kids)-1]} {
		checkMemory(t, d, k, h)
	}
	// rm all but one at once, then the last
	last := kids[len(kids)-1]
	d.must(t, append([]string{"rm", "-y"}, kids[:len(kids)-1]...)...)
	checkMemory(t, d, last, h)
	lastImg := pagesImageOf(t, d, last)
	if lastImg != "" {
		if _, err := os.Stat(filepath.Join(d.dir, "images", lastImg, "COMPLETE")); err != nil {
			t.Errorf("the image the last fork reads, after sbx rm of the others: %v", err)
		}
	}
	d.must(t, "rm", "-y", last, p)
	waitNoImages(t, d, 30*time.Second)
	checkNoLeaks(t, d)
}

// TestAttackForkPagesRestartOnDemandOff: sbxd restarted with
// --fork-pages-on-demand=false while forks read an image: the image stays,
// the forks keep their memory, a new fork loads every page (no hold), and
// the image goes with the last fork that reads it.
func TestAttackForkPagesRestartOnDemandOff(t *testing.T) {
	extra := []string{"--orphan-grace", "2s"}
	d, err := startDaemon(extra)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.stop(true) })
	p := d.newSandbox(t, "--template", "tiny", "--memory", "256M")
	h := startHolderTiny(t, d, p)
	kids := atkForks(t, d, p, 2)
	img := pagesImageOf(t, d, kids[0])
	d.kill(syscall.SIGKILL)
	if err := d.start(append(extra, "--fork-pages-on-demand=false")); err != nil {
		t.Fatal(err)
	}
	for _, k := range kids {
		checkMemory(t, d, k, h)
	}
	if _, err := os.Stat(filepath.Join(d.dir, "images", img, "COMPLETE")); err != nil {
		t.Fatalf("the fork image after a restart with --fork-pages-on-demand=false: %v", err)
	}
	more := atkForks(t, d, p, 1)
	if got := pagesImageOf(t, d, more[0]); got != "" {
		t.Errorf("a fork made with --fork-pages-on-demand=false holds %q", got)
	}
	checkMemory(t, d, more[0], h)
	for _, k := range kids {
		if err := deleteSandbox(context.Background(), d.client, k); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, "the fork image to go with its last fork", 30*time.Second, func() bool {
		_, err := os.Stat(filepath.Join(d.dir, "images", img))
		return os.IsNotExist(err)
	})
	checkConsistent(t, d)
	endForkPages(t, d)
}

// forkCrashState is what one crash of the fork-pages fuzz works on.
type forkCrashState struct {
	parent string
	kids   []string
	h      holder
	name   string
}

// TestAttackForkPagesCrash kills sbxd (SIGKILL) at random instants during a
// memory fork, a delete, a stop, a memory snapshot of a fork and a memory
// fork of a fork, restarts it, and checks: records and runsc agree; every
// fork left has its parent's memory (a stopped one after a resume that
// requires it); every image a fork reads is there, whole; and once
// everything is deleted, no image is left, file or record (no leak).
// SBX_ATTACK_CRASH_OFFSETS sets the offsets per operation (default 1, a
// new random one each run), SBX_CRASH_SEED the seed.
func TestAttackForkPagesCrash(t *testing.T) {
	offsets := 1
	if v := os.Getenv("SBX_ATTACK_CRASH_OFFSETS"); v != "" {
		if n, err := strconv.Atoi(v); err == nil && n > 0 {
			offsets = n
		}
	}
	seed := uint64(time.Now().UnixNano())
	if v := os.Getenv("SBX_CRASH_SEED"); v != "" {
		seed, _ = strconv.ParseUint(v, 10, 64)
	}
	t.Logf("SBX_CRASH_SEED=%d, %d offsets per operation", seed, offsets)
	rng := rand.New(rand.NewPCG(seed, seed>>1))
	extra := []string{"--orphan-grace", "2s"}
	d, err := startDaemon(extra)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.stop(true) })
	ctx := context.Background()

	withForks := func(n int) func(t *testing.T) forkCrashState {
		return func(t *testing.T) forkCrashState {
			sb, err := d.client.Create(ctx, client.WithTemplate("tiny"), client.WithMemoryLimit(256<<20))
			if err != nil {
				t.Fatalf("create: %v", err)
			}
			s := forkCrashState{parent: sb.ID, h: startHolderTiny(t, d, sb.ID)}
			if n > 0 {
				s.kids = atkForks(t, d, sb.ID, n)
			}
			return s
		}
	}
	type op struct {
		name  string
		setup func(t *testing.T) forkCrashState
		run   func(ctx context.Context, s *forkCrashState) error
	}
	ops := []op{
		{"fork --memory x4", withForks(0), func(ctx context.Context, s *forkCrashState) error {
			_, err := sdk(d.client).Fork(ctx, s.parent, api.ForkRequest{Memory: true, Count: 4})
			return err
		}},
		{"delete a fork", withForks(2), func(ctx context.Context, s *forkCrashState) error {
			return deleteSandbox(ctx, d.client, s.kids[0])
		}},
		{"stop a fork", withForks(2), func(ctx context.Context, s *forkCrashState) error {
			_, err := d.client.Sandbox(s.kids[0]).Stop(ctx)
			return err
		}},
		{"snapshot --memory of a fork", withForks(2), func(ctx context.Context, s *forkCrashState) error {
			s.name = "fz-" + randHex(4)
			_, err := d.client.Sandbox(s.kids[0]).Snapshot(ctx, s.name, memOpt(true)...)
			return err
		}},
		{"fork --memory of a fork", withForks(1), func(ctx context.Context, s *forkCrashState) error {
			_, err := sdk(d.client).Fork(ctx, s.kids[0], api.ForkRequest{Memory: true, Count: 2})
			return err
		}},
	}
	check := func(t *testing.T, s forkCrashState) {
		t.Helper()
		sbs := checkConsistent(t, d)
		for _, sb := range sbs {
			if sb.State == api.StateStopped {
				if _, err := d.client.Sandbox(sb.ID).Resume(ctx, client.RequireMemory()); err != nil {
					t.Errorf("resume --require-memory of %s after the crash: %v", sb.ID, err)
					continue
				}
			}
			if img := pagesImageOf(t, d, sb.ID); img != "" {
				if _, err := os.Stat(filepath.Join(d.dir, "images", img, "COMPLETE")); err != nil {
					t.Errorf("%s reads the fork image %s, which is not whole: %v", sb.ID, img, err)
				}
			}
			checkMemory(t, d, sb.ID, s.h)
		}
		if s.name != "" {
			if sn, err := sdk(d.client).GetSnapshot(ctx, s.name); err == nil && sn.Memory {
				from, err := d.client.Create(ctx, client.WithFrom(s.name))
				if err != nil {
					t.Errorf("a sandbox from snapshot %s kept after the crash: %v", s.name, err)
				} else {
					checkMemory(t, d, from.ID, s.h)
				}
			}
		}
		deleteEverything(t, d)
		waitNoImages(t, d, 30*time.Second)
		checkNoLeaks(t, d)
	}
	for _, o := range ops {
		t.Run(strings.ReplaceAll(o.name, " ", "_"), func(t *testing.T) {
			s := o.setup(t)
			start := time.Now()
			if err := o.run(ctx, &s); err != nil {
				t.Fatalf("%s without a crash: %v", o.name, err)
			}
			dur := time.Since(start)
			check(t, s)
			for i := 0; i < offsets && !t.Failed(); i++ {
				at := time.Duration((float64(i) + rng.Float64()) / float64(offsets) * 1.25 * float64(dur))
				s := o.setup(t)
				cctx, cancel := context.WithCancel(ctx)
				done := make(chan error, 1)
				go func() { done <- o.run(cctx, &s) }()
				select {
				case <-done:
					done = nil
				case <-time.After(at):
				}
				d.kill(syscall.SIGKILL)
				if done != nil {
					select {
					case <-done:
					case <-time.After(30 * time.Second):
						t.Fatalf("%s: the client did not return after sbxd died", o.name)
					}
				}
				cancel()
				if err := d.start(extra); err != nil {
					t.Fatalf("restart after a crash %s into %s: %v", at, o.name, err)
				}
				check(t, s)
				if t.Failed() {
					t.Logf("%s: crash %s into it (undisturbed %s); replay with SBX_CRASH_SEED=%d", o.name, at.Round(time.Millisecond), dur.Round(time.Millisecond), seed)
				}
			}
		})
	}
}

// TestAttackForkPagesCaptureOverLimit: a fork that loads its pages on
// demand holds, by its cgroup, only what it touched: its processes may use
// the rest of its memory limit for new memory. A memory capture of it (a
// snapshot --memory, a stop) loads every page it never touched first (the
// checkpoint reads them all), into the same cgroup: past its limit, the
// kernel kills the sandbox in the middle of the capture. The contract: a
// capture that fails leaves the source running (README, Captures), and a
// stop never loses the sandbox. Here the fork uses, by its cgroup, 64 MiB
// less than its limit before the capture: well within it, as sbx reports.
func TestAttackForkPagesCaptureOverLimit(t *testing.T) {
	for _, capture := range []string{"snapshot", "stop"} {
		t.Run(capture, func(t *testing.T) {
			d, err := startDaemon([]string{"--orphan-grace", "2s"})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { d.stop(true) })
			ctx := context.Background()
			const limit = 512 << 20
			p := d.newSandbox(t, "--template", "base", "--memory", "512M")
			d.must(t, "exec", p, "--", "sh", "-c", "cat > /tmp/holder.py <<'EOF'\n"+pageHolder+"EOF")
			d.must(t, "exec", "--detach", p, "--", "python3", "/tmp/holder.py")
			pid, want := readHeld(t, d, p, 0)
			k := atkForks(t, d, p, 1)[0]
			m, err := d.client.Sandbox(k).Metrics(ctx)
			if err != nil {
				t.Fatal(err)
			}
			hog := (limit-m.MemoryBytes)>>20 - 64
			t.Logf("the fork holds %d MiB of its 512 MiB; a process in it takes %d MiB more", m.MemoryBytes>>20, hog)
			d.must(t, "exec", "--detach", k, "--", "python3", "-c", fmt.Sprintf(
				"import os, time\nb = bytearray(%d << 20)\nfor i in range(0, len(b), 4096): b[i] = 1\nopen('/tmp/hog', 'w').write(str(os.getpid()))\ntime.sleep(3600)", hog))
			waitFor(t, "the hog to hold its memory", 2*time.Minute, func() bool {
				return d.sbx(t, "exec", k, "--", "cat", "/tmp/hog").code == 0
			})
			if m, err = d.client.Sandbox(k).Metrics(ctx); err == nil {
				t.Logf("before the %s the fork holds %d MiB by its cgroup (limit 512 MiB)", capture, m.MemoryBytes>>20)
			}
			if info := d.info(t, k); info.State != api.StateReady {
				t.Fatalf("the fork before any capture: %s (%s)", info.State, info.Reason)
			}
			var r result
			switch capture {
			case "snapshot":
				r = d.sbx(t, "snapshot", k, "over", "--memory")
			case "stop":
				r = d.sbx(t, "stop", "--wait", k)
			}
			t.Logf("sbx %s: exit %d %s%s", capture, r.code, r.stdout, r.stderr)
			info := d.info(t, k)
			switch {
			case r.code == 0 && capture == "stop":
				if _, err := d.client.Sandbox(k).Resume(ctx, client.RequireMemory()); err != nil {
					t.Errorf("resume --require-memory after the stop: %v", err)
				}
			case info.State != api.StateReady:
				t.Errorf("a %s --memory of a fork using %d MiB under its limit left it %s (%s): the capture loaded its untouched pages into its cgroup and the kernel killed it; sbx said: %s",
					capture, 64, info.State, info.Reason, strings.TrimSpace(r.stderr))
			}
			if d.info(t, k).State == api.StateReady {
				// the hog goes first: with it, the fork's whole memory is
				// more than its limit (the pages it never touched count
				// once loaded), and a read of every page would pass it
				d.must(t, "exec", k, "--", "sh", "-c", "kill -9 $(cat /tmp/hog)")
				d.must(t, "exec", k, "--", "kill", "-USR1", pid)
				if gotPid, got := readHeld(t, d, k, 1); gotPid != pid || got != want {
					t.Errorf("after the %s: holder %s holds %s, want %s holding %s", capture, gotPid, got, pid, want)
				}
			}
			deleteEverything(t, d)
			waitNoImages(t, d, 30*time.Second)
			checkNoLeaks(t, d)
		})
	}
}

// TestAttackForkPagesStorageMaxUnderestimate: before a capture, sbxd
// checks that what it may write fits the disk and --storage-max
// (storage.go, expectedCapture): for memory, what the sandbox's memory
// cgroup holds. A fork that loads its pages on demand holds only what it
// touched, yet a checkpoint of it writes every page of its memory: the
// estimate misses the pages still in the fork image, and a capture the
// budget cannot hold goes through. Here the budget has room for what sbxd
// estimates and 96 MiB more, and the snapshot writes about 256 MiB.
func TestAttackForkPagesStorageMaxUnderestimate(t *testing.T) {
	extra := []string{"--orphan-grace", "2s"}
	d, err := startDaemon(extra)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.stop(true) })
	ctx := context.Background()
	p := d.newSandbox(t, "--template", "base", "--memory", "1G")
	startPageHolder(t, d, p)
	readHeld(t, d, p, 0)
	k := atkForks(t, d, p, 1)[0]
	var st api.Storage
	d.jsonOut(t, &st, "df")
	m, err := d.client.Sandbox(k).Metrics(ctx)
	if err != nil {
		t.Fatal(err)
	}
	budget := st.Used + m.MemoryBytes + 96<<20
	t.Logf("df: %d MiB used; the fork's cgroup %d MiB; --storage-max %d MiB", st.Used>>20, m.MemoryBytes>>20, budget>>20)
	d.kill(syscall.SIGKILL) // its sandboxes run on
	if err := d.start(append(extra, "--storage-max", strconv.FormatInt(budget, 10))); err != nil {
		t.Fatal(err)
	}
	r := d.sbx(t, "snapshot", k, "over-budget", "--memory")
	d.jsonOut(t, &st, "df")
	t.Logf("sbx snapshot --memory of the fork: exit %d %s; df then: %d MiB used of %d MiB", r.code, strings.TrimSpace(r.stderr), st.Used>>20, budget>>20)
	if r.code == 0 && st.Used > budget {
		t.Errorf("a memory snapshot of a fork went through sbxd --storage-max %d MiB and left the data dir holding %d MiB: "+
			"its estimate (the fork's memory cgroup, %d MiB) misses the pages still in the fork image", budget>>20, st.Used>>20, m.MemoryBytes>>20)
	}
	endForkPages(t, d)
}

// forkPagesDaemon starts an sbxd for an attack on on-demand forks, whose
// orphan images go after 2 s; the test's end stops it.
func forkPagesDaemon(t *testing.T) *daemon {
	t.Helper()
	d, err := startDaemon([]string{"--orphan-grace", "2s"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.stop(true) })
	t.Cleanup(func() { keepLogs(t, d) })
	return d
}

// startPageHolder starts pageHolder (256 MiB, every page different) in p.
func startPageHolder(t *testing.T, d *daemon, p string) {
	t.Helper()
	d.must(t, "exec", p, "--", "sh", "-c", "cat > /tmp/holder.py <<'EOF'\n"+pageHolder+"EOF")
	d.must(t, "exec", "--detach", p, "--", "python3", "/tmp/holder.py")
}

// endForkPages deletes everything of d and checks that no image, file or
// record, and nothing else of it is left.
func endForkPages(t *testing.T, d *daemon) {
	t.Helper()
	deleteEverything(t, d)
	waitNoImages(t, d, 30*time.Second)
	checkNoLeaks(t, d)
}
