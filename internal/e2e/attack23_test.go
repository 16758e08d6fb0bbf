package e2e

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// Attacks on `sbx explain` (issue 23's "Bad input", and more).

// TestAttack23PNRHang: a test that hangs, under --timeout, with the point
// of no return on. Its children (memory forks of a captured run) carry
// the hang on and no exec of sbxd's times them out there; explain waited
// 2 minutes for each and then failed as a whole, the rate it had measured
// lost. A hang is a failure wherever it runs, and explain answers.
func TestAttack23PNRHang(t *testing.T) {
	d := shared
	id := d.newSandbox(t, "--template", "tiny")
	before := sandboxIDs(t, d)
	out := d.must(t, "--json", "explain", id, "-n", "2", "--timeout", "2", "--knob-runs", "0",
		"--offsets", "500", "--pnr-parents", "1", "--pnr-ways", "2", "--", "sleep", "600")
	_, res := parseExplain(t, out)
	if got := sandboxIDs(t, d); !slices.Equal(got, before) {
		t.Errorf("sandboxes after explain: %v, want those before: %v", got, before)
	}
	if res.Failed != res.Runs || !strings.Contains(res.Note, "every run of 2 failed") {
		t.Errorf("%d/%d failed, note %q: want every run failed", res.Failed, res.Runs, res.Note)
	}
	pn := res.PointOfNoReturn
	if pn == nil || len(pn.Curve) != 1 {
		t.Fatalf("point of no return %+v, want one point", pn)
	}
	if p := pn.Curve[0]; p.Parents != 1 || p.Runs != 2 || p.Failed != 2 {
		t.Errorf("curve point %+v: want 2 of 2 forks of the hung run failed (killed at the timeout)", p)
	}
}

// TestAttack23ReportPath: --report to a directory, or under one that does
// not exist, is refused before any fork is made (it was found out after
// every run, which lost them all, and left PATH.tmp behind).
func TestAttack23ReportPath(t *testing.T) {
	d := shared
	id := d.newSandbox(t, "--template", "tiny")
	dir := t.TempDir()
	before := sandboxIDs(t, d)
	for _, path := range []string{dir, filepath.Join(dir, "no-such-dir", "r.html")} {
		r := d.sbx(t, "explain", id, "-n", "2", "--knob-runs", "0", "--pnr-parents", "0", "--report", path, "--", "true")
		if r.code == 0 || !strings.Contains(r.stderr, "report") {
			t.Errorf("--report %s: exit %d, stderr %q: want a refusal that names the report", path, r.code, r.stderr)
		}
		if strings.Contains(r.stdout, "failed: rate") {
			t.Errorf("--report %s: it ran the test before refusing: %q", path, r.stdout)
		}
	}
	if left, _ := filepath.Glob(filepath.Join(filepath.Dir(dir), filepath.Base(dir)+"*.tmp")); len(left) > 0 {
		t.Errorf("left behind: %v", left)
	}
	if ents, _ := os.ReadDir(dir); len(ents) > 0 {
		t.Errorf("left in the directory: %v", ents)
	}
	if got := sandboxIDs(t, d); !slices.Equal(got, before) {
		t.Errorf("sandboxes after explain: %v, want those before: %v", got, before)
	}
}

// TestAttack23BadNumbers: NaN passes `ms < 0 || ms > max` and `v <= 0`:
// --offsets NaN became an offset of -292 years, --cpus NaN a fork request
// JSON cannot carry (found after every run). Both are usage errors.
func TestAttack23BadNumbers(t *testing.T) {
	d := shared
	for _, flags := range [][]string{
		{"--offsets", "NaN"}, {"--offsets", "0,nan"}, {"--cpus", "NaN"}, {"--cpus", "0.5,+Inf"}, {"--knob-runs", "1", "--cpus", "nan"},
	} {
		r := d.sbx(t, append(append([]string{"explain", "sb_aaaaaaaaaa", "-n", "2"}, flags...), "--", "true")...)
		if r.code != 2 || !strings.Contains(r.stderr, flags[len(flags)-2]) {
			t.Errorf("%v: exit %d, stderr %q: want a usage error (2) naming the flag", flags, r.code, r.stderr)
		}
	}
}

// TestAttack23RunCounts: -n as pytest -n and docker habits type it. -n 0
// and 1 are refused; -n 100000 is refused up front too: explain keeps
// every run's trace for the analysis (at least 2000 events each, so
// 200 million events), where flake-rate keeps none.
func TestAttack23RunCounts(t *testing.T) {
	d := shared
	for _, flags := range [][]string{{"-n", "0"}, {"-n", "1"}, {"-n", "100000"}, {"-n", "-3"}, {"--parallel", "0"}, {"-n", "x"}} {
		r := d.sbx(t, append(append([]string{"explain", "sb_aaaaaaaaaa"}, flags...), "--", "true")...)
		if r.code != 2 || !strings.Contains(r.stderr, flags[0]) {
			t.Errorf("%v: exit %d, stderr %q: want a usage error (2) naming the flag", flags, r.code, r.stderr)
		}
	}
}
