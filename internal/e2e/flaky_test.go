package e2e

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"sbx.dev/sbx/api"
	"sbx.dev/sbx/internal/flaky"
)

// seedTest fails when SEED%10 < 3: a failure probability of 30% over random seeds.
const seedTest = "test $((SEED % 10)) -ge 3"

// flakeOut is what `sbx --json flake-rate` printed: a line per run, then the summary.
type flakeOut struct {
	runs    []flaky.Run
	summary flaky.RateSummary
}

func parseFlakeRate(t *testing.T, out string) flakeOut {
	t.Helper()
	var lines []string
	sc := bufio.NewScanner(strings.NewReader(out))
	for sc.Scan() {
		lines = append(lines, sc.Text())
	}
	if len(lines) == 0 {
		t.Fatalf("flake-rate printed nothing")
	}
	var f flakeOut
	for _, l := range lines[:len(lines)-1] {
		var r flaky.Run
		if err := json.Unmarshal([]byte(l), &r); err != nil {
			t.Fatalf("run line %q: %v", l, err)
		}
		f.runs = append(f.runs, r)
	}
	if err := json.Unmarshal([]byte(lines[len(lines)-1]), &f.summary); err != nil {
		t.Fatalf("summary line %q: %v", lines[len(lines)-1], err)
	}
	slices.SortFunc(f.runs, func(a, b flaky.Run) int { return a.Run - b.Run })
	return f
}

// sandboxIDs lists the ids of d's sandboxes, sorted.
func sandboxIDs(t *testing.T, d *daemon) []string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	sbs, err := d.client.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, sb := range sbs {
		ids = append(ids, sb.ID)
	}
	slices.Sort(ids)
	return ids
}

// checkFlakeRate checks what can be checked exactly of n runs of seedTest:
// each run's outcome follows from its recorded seed, the seeds and forks are
// distinct, and the summary counts them. It returns the failing forks.
func checkFlakeRate(t *testing.T, f flakeOut, n int, parent string) []string {
	t.Helper()
	if len(f.runs) != n {
		t.Fatalf("got %d run lines, want %d", len(f.runs), n)
	}
	seeds := map[uint32]bool{}
	forks := map[string]bool{}
	var failed []string
	for i, r := range f.runs {
		if r.Run != i {
			t.Errorf("run lines number %d where %d was due", r.Run, i)
		}
		kept := !r.Pass && r.Sandbox == flaky.KeptName(r.Seed, 0) // --keep-failures: named after its seed
		if seeds[r.Seed] || forks[r.Sandbox] || r.Sandbox == parent || !idRE.MatchString(r.Sandbox) && !kept {
			t.Errorf("run %d: seed %d in %s: want a fresh seed in a fresh fork", i, r.Seed, r.Sandbox)
		}
		seeds[r.Seed], forks[r.Sandbox] = true, true
		if want := r.Seed%10 >= 3; r.Pass != want || (r.ExitCode == 0) != want {
			t.Errorf("run %d with seed %d: pass %v exit %d, want pass %v", i, r.Seed, r.Pass, r.ExitCode, want)
		}
		if !r.Pass {
			failed = append(failed, r.Sandbox)
		}
	}
	if f.summary.Runs != n || f.summary.Failures != len(failed) {
		t.Errorf("summary says %d/%d failed; the recorded seeds say %d/%d", f.summary.Failures, f.summary.Runs, len(failed), n)
	}
	lo, hi := flaky.Wilson(len(failed), n)
	if f.summary.Wilson95 != [2]float64{lo, hi} {
		t.Errorf("wilson95 %v, want [%v %v]", f.summary.Wilson95, lo, hi)
	}
	return failed
}

// TestFlakeRate measures a test that fails 30% of the time over 40 memory
// forks of a tiny sandbox.
func TestFlakeRate(t *testing.T) {
	d := shared
	parent := d.newSandbox(t, "--template", "tiny")
	before := sandboxIDs(t, d)

	// With random seeds the 95% interval holds 0.30 about 95% of the time;
	// three tries make a false alarm a 1-in-8000 event (two, 1 in 400,
	// came in a CI run: 19/40 then 18/40). The rest is exact.
	contains := false
	for try := 0; try < 3 && !contains; try++ {
		out := d.must(t, "--json", "flake-rate", parent, "-n", "40", "--", "sh", "-c", seedTest)
		f := parseFlakeRate(t, out)
		checkFlakeRate(t, f, 40, parent)
		if len(f.summary.Kept) != 0 {
			t.Errorf("kept %v without --keep-failures", f.summary.Kept)
		}
		if diff := slices.Compare(before, sandboxIDs(t, d)); diff != 0 {
			t.Errorf("sandboxes after flake-rate: %v, want those before: %v", sandboxIDs(t, d), before)
		}
		w := f.summary.Wilson95
		contains = w[0] <= 0.30 && 0.30 <= w[1]
		t.Logf("try %d: %d/40 failed, interval %v", try, f.summary.Failures, w)
	}
	if !contains {
		t.Errorf("the 95%% interval missed the true rate 0.30 three times in a row")
	}
}

func TestFlakeRateKeepFailures(t *testing.T) {
	d := shared
	parent := d.newSandbox(t, "--template", "tiny")
	before := sandboxIDs(t, d)
	// No failure in 20 runs at 30% is a 1-in-1250 event (it came in a CI
	// run); three tries make it 1 in 2·10⁹. A try without failures keeps
	// nothing, which is checked too.
	var (
		f      flakeOut
		failed []string
	)
	for try := 0; try < 3 && len(failed) == 0; try++ {
		out := d.must(t, "--json", "flake-rate", parent, "-n", "20", "--parallel", "6", "--keep-failures", "--", "sh", "-c", seedTest)
		f = parseFlakeRate(t, out)
		kept := slices.Clone(f.summary.Kept)
		t.Cleanup(func() {
			for _, id := range kept {
				_ = deleteSandbox(context.Background(), d.client, id)
			}
		})
		failed = checkFlakeRate(t, f, 20, parent)
		slices.Sort(kept)
		slices.Sort(failed)
		if !slices.Equal(kept, failed) {
			t.Errorf("kept %v, want the failing forks %v", kept, failed)
		}
		t.Logf("try %d: %d/20 failed", try, len(failed))
	}
	if len(failed) == 0 {
		t.Fatalf("no run failed in 3 tries of 20; the test proves nothing about kept failures")
	}
	// each failure is kept once, under its seed's name, with a ttl, alive
	var keptIDs []string
	for _, r := range f.runs {
		if r.Pass {
			continue
		}
		name := fmt.Sprintf("flake-%d", r.Seed)
		if r.Sandbox != name {
			t.Errorf("run %d (seed %d) kept as %q, want %q", r.Run, r.Seed, r.Sandbox, name)
		}
		sb := d.info(t, name)
		keptIDs = append(keptIDs, sb.ID)
		if sb.TTL != api.Duration(flaky.DefaultKeepTTL) || sb.State != api.StateReady || !sb.MemoryRestored {
			t.Errorf("kept %s: ttl %q state %s memory %v, want ttl %s, ready, with the failure's memory", name, sb.TTL, sb.State, sb.MemoryRestored, flaky.DefaultKeepTTL)
		}
		if out := d.must(t, "info", name); !strings.Contains(out, "name: "+name+"\n") {
			t.Errorf("sbx info %s does not show the seed's name:\n%s", name, out)
		}
		if r := d.sbx(t, "exec", name, "--", "true"); r.code != 0 {
			t.Errorf("kept fork %s does not run: exit %d: %s", name, r.code, r.stderr)
		}
	}
	want := slices.Sorted(slices.Values(append(slices.Clone(before), keptIDs...)))
	if got := sandboxIDs(t, d); !slices.Equal(got, want) {
		t.Errorf("sandboxes after: %v, want those before and the failures: %v", got, want)
	}

	// and the human output ends with the summary
	human := d.must(t, "flake-rate", parent, "-n", "3", "--", seedTest)
	lines := strings.Split(strings.TrimSpace(human), "\n")
	if last := lines[len(lines)-1]; !strings.Contains(last, "/3 failed: rate ") || !strings.Contains(last, "95% Wilson interval") {
		t.Errorf("human output ends with %q, want the summary", last)
	}
	if got := sandboxIDs(t, d); !slices.Equal(got, want) {
		t.Errorf("sandboxes after: %v, want %v", got, want)
	}
}

func TestFlakeRateFromSnapshot(t *testing.T) {
	d := shared
	id := d.newSandbox(t, "--template", "tiny")
	snap := "flaky-from-" + randHex(3)
	d.must(t, "snapshot", id, snap, "--memory")
	t.Cleanup(func() { _ = d.client.DeleteSnapshot(context.Background(), snap) })
	before := sandboxIDs(t, d)
	out := d.must(t, "--json", "flake-rate", "--from", snap, "-n", "5", "--", "sh", "-c", seedTest)
	checkFlakeRate(t, parseFlakeRate(t, out), 5, id)
	if got := sandboxIDs(t, d); !slices.Equal(got, before) {
		t.Errorf("sandboxes after: %v, want those before: %v", got, before)
	}
	// an unknown snapshot is an operational error: exit 1
	if r := d.sbx(t, "flake-rate", "--from", "no-such-snap", "-n", "2", "--", "true"); r.code != 1 {
		t.Errorf("flake-rate from an unknown snapshot: exit %d, want 1\n%s", r.code, r.stderr)
	}
}

func TestReplay(t *testing.T) {
	d := shared
	id := d.newSandbox(t, "--template", "tiny")
	snap := "flaky-replay-" + randHex(3)
	d.must(t, "snapshot", id, snap)
	t.Cleanup(func() { _ = d.client.DeleteSnapshot(context.Background(), snap) })
	before := sandboxIDs(t, d)

	tests := []struct {
		seed, pattern, count string
	}{
		{"17", "PPPPP", "0/5 failed"}, // 17%10 = 7: passes
		{"21", "FFFFF", "5/5 failed"}, // 21%10 = 1: fails
		{"12", "FFFFF", "5/5 failed"}, // 12%10 = 2: fails too
	}
	for _, tc := range tests {
		t.Run("seed "+tc.seed, func(t *testing.T) {
			out := d.must(t, "replay", snap, "--seed", tc.seed, "-n", "5", "--", "sh", "-c", seedTest)
			if want := tc.pattern + "\n" + tc.count + "\n"; out != want {
				t.Errorf("replay printed %q, want %q", out, want)
			}
		})
	}

	out := d.must(t, "--json", "replay", snap, "--seed", "21", "-n", "3", "--parallel", "2", "--", seedTest)
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 4 {
		t.Fatalf("replay --json printed %d lines, want 3 runs and a summary:\n%s", len(lines), out)
	}
	var s flaky.ReplaySummary
	if err := json.Unmarshal([]byte(lines[3]), &s); err != nil {
		t.Fatal(err)
	}
	if want := (flaky.ReplaySummary{Runs: 3, Failures: 3, Seed: 21, Pattern: "FFF"}); s != want {
		t.Errorf("summary %+v, want %+v", s, want)
	}
	if got := sandboxIDs(t, d); !slices.Equal(got, before) {
		t.Errorf("sandboxes after replay: %v, want those before: %v", got, before)
	}
	if r := d.sbx(t, "replay", "no-such-snap", "--seed", "1", "-n", "2", "--", "true"); r.code != 1 {
		t.Errorf("replay of an unknown snapshot: exit %d, want 1\n%s", r.code, r.stderr)
	}
}

// TestFlakeRateFromDiskSnapshot forks a sandbox made from a disk-only
// snapshot. Whatever happens, flake-rate must leave no sandbox behind.
func TestFlakeRateFromDiskSnapshot(t *testing.T) {
	d := shared
	id := d.newSandbox(t, "--template", "tiny")
	snap := "flaky-disk-" + randHex(3)
	d.must(t, "snapshot", id, snap)
	t.Cleanup(func() { _ = d.client.DeleteSnapshot(context.Background(), snap) })
	before := sandboxIDs(t, d)
	r := d.sbx(t, "--json", "flake-rate", "--from", snap, "-n", "5", "--", "sh", "-c", seedTest)
	if got := sandboxIDs(t, d); !slices.Equal(got, before) {
		t.Errorf("sandboxes after: %v, want those before: %v", got, before)
	}
	if r.code != 0 {
		// Known daemon bug (internal/sandbox): a sandbox booted from a disk
		// snapshot has the rootfs-upper tar annotation in its spec, and its
		// memory forks are restored without it, which runsc refuses.
		t.Fatalf("flake-rate from a disk snapshot: exit %d\n%s", r.code, r.stderr)
	}
	checkFlakeRate(t, parseFlakeRate(t, r.stdout), 5, id)
}
