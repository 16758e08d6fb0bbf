package e2e

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"sbx.dev/sbx/api"
)

// soakTime is how long TestSoak22 runs: SBX_SOAK (a duration; `make soak`
// gives 10m), else a minute, so that make test plays it too.
func soakTime(t *testing.T) time.Duration {
	if s := os.Getenv("SBX_SOAK"); s != "" {
		d, err := time.ParseDuration(s)
		if err != nil || d <= 0 {
			t.Fatalf("SBX_SOAK=%q: want a duration such as 10m", s)
		}
		return d
	}
	return time.Minute
}

// rssOf is a process's resident memory, in bytes.
func rssOf(pid int) int64 {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		return 0
	}
	for _, l := range strings.Split(string(b), "\n") {
		if f := strings.Fields(l); len(f) >= 2 && f[0] == "VmRSS:" {
			kb, _ := strconv.ParseInt(f[1], 10, 64)
			return kb << 10
		}
	}
	return 0
}

// hostileLoop is what each soak sandbox runs as root, for good: a sparse
// file far past its disk, a freeze per boot, forged verdicts, and files
// made and removed. (Its output floods come from execs of their own: a
// detached command's output is kept inside the sandbox, in its memory,
// unbounded; README, Known limits.)
const hostileLoop = `truncate -s 20G /tmp/keep-sparse
slot=$(tr '\0' '\n' < /proc/gvisor/spec_environ | sed -n 's/^SBX_FREEZE_SLOT=//p')
i=0
while :; do
  i=$((i+1))
  slot=$(tr '\0' '\n' < /proc/gvisor/spec_environ | sed -n 's/^SBX_FREEZE_SLOT=//p')
  printf '\036sbx-freeze {"slot":"%s","result":"frozen","pid":%s,"uid":0}\n' "$slot" "$i" > /proc/1/fd/1
  printf '\036sbx-freeze {"slot":"%s","result":"failed","pid":%s,"uid":0}\n' "$slot" "$i" > /proc/1/fd/1
  truncate -s 50G /tmp/sparse-$i; rm -f /tmp/sparse-$i
  /.sbx/freeze --no-hold --reason soak >/dev/null 2>&1
  dd if=/dev/urandom of=/tmp/churn bs=64k count=16 2>/dev/null; rm -f /tmp/churn
  usleep 100000
done`

// TestSoak22: hostile sandboxes for soakTime (sparse files past their
// disk, a freeze each boot, forged freeze verdicts, output floods) while
// sbxd snapshots, stops and resumes, and forks them: the data dir stays
// within --storage-max, sbxd's memory stays flat, what is refused is
// refused with a clear error, and every snapshot recorded restores.
// (Issue 22.)
func TestSoak22(t *testing.T) {
	if testing.Short() {
		t.Skip("long")
	}
	const budget = 1200 << 20
	d, err := startDaemon([]string{"--storage-max", strconv.Itoa(budget), "--freeze-max-count", "3", "--freeze-min-interval", "1s"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.stop(true) })
	t.Cleanup(func() { keepLogs(t, d) })

	var sbs []string
	for i := range 3 {
		id := d.newSandbox(t, "--name", fmt.Sprintf("soak%d", i), "--disk", "256M", "--memory", "512M")
		if _, err := sdk(d.client).ExecDetached(context.Background(), id, api.ExecRequest{Cmd: []string{"sh", "-c", hostileLoop}, User: "root", Detach: true}); err != nil {
			t.Fatal(err)
		}
		sbs = append(sbs, id)
	}
	time.Sleep(3 * time.Second) // the loops are under way; sbxd has warmed up
	pid := d.cmd.Process.Pid
	base := rssOf(pid)
	var peakRSS, peakDisk int64
	sample := func() {
		peakRSS = max(peakRSS, rssOf(pid))
		peakDisk = max(peakDisk, duOf(d.dir))
	}
	// what a capture may be refused for: the budget, the quota, a sandbox
	// busy with another capture
	refusal := func(r result) bool {
		s := r.stderr + r.stdout
		return strings.Contains(s, "storage") || strings.Contains(s, "budget") || strings.Contains(s, "quota") ||
			strings.Contains(s, "no space") || strings.Contains(s, "not ready") || strings.Contains(s, "conflict")
	}
	var refused, done int
	var unexpected []string
	run := func(args ...string) result {
		r := d.sbx(t, args...)
		switch {
		case r.code == 0:
			done++
		case refusal(r):
			refused++
		default:
			unexpected = append(unexpected, fmt.Sprintf("sbx %s: exit %d %s", strings.Join(args, " "), r.code, strings.TrimSpace(r.stderr)))
		}
		return r
	}
	deadline := time.Now().Add(soakTime(t))
	for n := 0; time.Now().Before(deadline); n++ {
		id := sbs[n%len(sbs)]
		switch n % 4 {
		case 0:
			run("snapshot", "--memory", id, fmt.Sprintf("soak-%d", n))
			// an output flood: 20 MB, of which sbxd keeps the head and tail
			if r := d.sbx(t, "exec", id, "--", "sh", "-c", `head -c 20000000 /dev/zero | tr '\0' x`); r.code != 0 {
				unexpected = append(unexpected, fmt.Sprintf("an output flood in %s: exit %d %s", id, r.code, r.stderr))
			}
		case 1:
			run("snapshot", id, fmt.Sprintf("soak-disk-%d", n))
		case 2:
			if r := run("stop", id, "--wait"); r.code == 0 {
				d.must(t, "resume", id)
			}
		case 3:
			if r := run("fork", "--memory", "--wait", "--count", "2", id); r.code == 0 {
				for _, c := range strings.Fields(r.stdout) {
					if strings.HasPrefix(c, "sb_") {
						d.sbx(t, "rm", "-f", c)
					}
				}
			}
		}
		// old snapshots go, as a user's would: at most six kept
		if n%6 == 5 {
			sns, _ := d.client.Snapshots(context.Background())
			for i := 0; i+6 < len(sns); i++ {
				if strings.HasPrefix(sns[i].Name, "soak-") {
					d.sbx(t, "snapshot", "rm", sns[i].Name)
				}
			}
		}
		sample()
	}
	sample()
	t.Logf("soak: %d captures done, %d refused; sbxd RSS %d MiB at the start, %d MiB at its peak; data dir %d MiB at its peak (budget %d MiB)",
		done, refused, base>>20, peakRSS>>20, peakDisk>>20, budget>>20)
	for _, u := range unexpected {
		t.Errorf("unexpected failure: %s", u)
	}
	if done == 0 {
		t.Errorf("no capture worked in the soak")
	}
	// the running sandboxes' own disks (upper dirs, each within its 256M
	// limit) are not what the budget bounds: they are given to it
	if limit := int64(budget) + 3*(256<<20) + (64 << 20); peakDisk > limit {
		t.Errorf("the data dir held %d MiB at its peak, past the budget (%d MiB) and the sandboxes' own disks", peakDisk>>20, limit>>20)
	}
	if peakRSS-base > 64<<20 {
		t.Errorf("sbxd's RSS grew from %d MiB to %d MiB: want it flat (within 64 MiB)", base>>20, peakRSS>>20)
	}
	// every snapshot recorded restores
	sns, err := d.client.Snapshots(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for _, sn := range sns {
		r := d.sbx(t, "new", "--from", sn.Name)
		id := strings.TrimSpace(r.stdout)
		if r.code != 0 || !strings.HasPrefix(id, "sb_") {
			t.Errorf("snapshot %s (memory %v) does not restore: exit %d %s", sn.Name, sn.Memory, r.code, r.stderr)
			continue
		}
		if x := d.sbx(t, "exec", id, "--", "true"); x.code != 0 {
			t.Errorf("a sandbox from %s does not answer: exit %d %s", sn.Name, x.code, x.stderr)
		}
		d.sbx(t, "rm", "-f", id)
	}
	t.Logf("soak: %d snapshots restored", len(sns))
	checkConsistent(t, d)
	deleteEverything(t, d)
	checkNoLeaks(t, d)
}
