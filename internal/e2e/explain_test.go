package e2e

import (
	"bufio"
	"encoding/json"
	"slices"
	"strings"
	"testing"

	"sbx.dev/sbx/internal/explain"
)

// parseExplain reads `sbx --json explain`: progress lines, then the
// explained object last.
func parseExplain(t *testing.T, out string) (progress []explain.Progress, res explain.Explained) {
	t.Helper()
	var lines []string
	sc := bufio.NewScanner(strings.NewReader(out))
	sc.Buffer(make([]byte, 1<<20), 16<<20)
	for sc.Scan() {
		lines = append(lines, sc.Text())
	}
	if len(lines) == 0 {
		t.Fatal("explain printed nothing")
	}
	for _, l := range lines[:len(lines)-1] {
		var p explain.Progress
		if err := json.Unmarshal([]byte(l), &p); err != nil {
			t.Fatalf("progress line %q: %v", l, err)
		}
		progress = append(progress, p)
	}
	if err := json.Unmarshal([]byte(lines[len(lines)-1]), &res); err != nil || res.Event != "explained" {
		t.Fatalf("last line %q: %v, want the explained event", lines[len(lines)-1], err)
	}
	return progress, res
}

// explainTop runs explain on sandbox id and returns what it found, with a
// log of its findings; it checks what holds of any explain: a line per
// run, counts that add up, no sandbox left behind.
func explainTop(t *testing.T, d *daemon, id string, n string, test ...string) explain.Explained {
	t.Helper()
	before := sandboxIDs(t, d)
	out := d.must(t, append([]string{"--json", "explain", id, "-n", n, "--"}, test...)...)
	progress, res := parseExplain(t, out)
	runs := 0
	for _, p := range progress {
		if p.Event == "run" {
			runs++
		}
	}
	if runs != res.Runs || len(res.RunList) != res.Runs {
		t.Errorf("%d run lines and %d runs listed, want %d", runs, len(res.RunList), res.Runs)
	}
	if got := sandboxIDs(t, d); !slices.Equal(got, before) {
		t.Errorf("sandboxes after explain: %v, want those before: %v", got, before)
	}
	t.Logf("%d/%d failed, rate %+v, dropped %d, empty %d, note %q", res.Failed, res.Runs, res.Rate, res.Dropped, res.Empty, res.Note)
	for i, f := range res.Divergence {
		t.Logf("%d. %s [%s] failing %d passing %d score %.2f example %+v", i+1, f.Summary, f.Resource, f.Failing, f.Passing, f.Score, f.Example)
	}
	return res
}

// TestExplainExample: on the bundled example the top finding is its port,
// 8099 (examples/flaky/service.py): the test's connect came before the
// server's bind.
func TestExplainExample(t *testing.T) {
	d := shared
	id := d.newSandbox(t, "--template", "base")
	dir := copyExample(t)
	d.must(t, "scp", "-r", dir+"/.", id+":/work")
	res := explainTop(t, d, id, "16", "cd /work && ./test.sh")
	if res.Failed == 0 || res.Failed == res.Runs {
		t.Fatalf("%d of %d runs failed: nothing to compare (note %q)", res.Failed, res.Runs, res.Note)
	}
	if len(res.Divergence) == 0 {
		t.Fatal("no divergence found")
	}
	top := res.Divergence[0]
	if top.Resource != "port 8099" || !strings.Contains(top.Summary, ":8099") {
		t.Errorf("top finding %q on %q, want port 8099", top.Summary, top.Resource)
	}
	if len(top.Example.Events) == 0 {
		t.Errorf("top finding has no example events")
	}
}
