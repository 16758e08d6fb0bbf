package explain

import (
	"strings"
	"testing"

	"sbx.dev/sbx/internal/explain/analyze"
	"sbx.dev/sbx/internal/flaky"
)

func TestVerdicts(t *testing.T) {
	knob := func(name, v string, failed, runs int) Knob {
		lo, hi := flaky.Wilson(failed, runs)
		return Knob{Knob: name, Value: v, Failed: failed, Runs: runs, Rate: float64(failed) / float64(runs), Low: lo, High: hi}
	}
	got := Verdicts([]Knob{
		knob("cpus", "0.25", 8, 8), knob("cpus", "1", 3, 8), knob("cpus", "2", 0, 8),
		knob("GOMAXPROCS", "(unchanged)", 2, 8), knob("GOMAXPROCS", "1", 3, 8),
		knob("PYTHONHASHSEED", "(unchanged)", 0, 8), knob("PYTHONHASHSEED", "0", 0, 8),
	})
	if len(got) != 3 {
		t.Fatalf("got %d verdicts, want 3: %+v", len(got), got)
	}
	for _, tc := range []struct {
		i       int
		changes bool
		summary string
	}{
		{0, true, "cpus: timing-dependent: 100% [68, 100] at 0.25, 0% [0, 32] at 2"},
		{1, false, "GOMAXPROCS: no change beyond chance"},
		{2, false, "0% [0, 32] at every value"},
	} {
		if v := got[tc.i]; v.Changes != tc.changes || !strings.Contains(v.Summary, tc.summary) {
			t.Errorf("verdict %d: got %+v, want changes=%v and %q", tc.i, v, tc.changes, tc.summary)
		}
	}
}

func TestRunsToProve(t *testing.T) {
	for _, tc := range []struct {
		p, alpha float64
		want     int
	}{
		{0.4, 0.01, 10}, // 0.6^9 = 0.0101, 0.6^10 = 0.006
		{0.4, 0.05, 6},  // 0.6^5 = 0.078, 0.6^6 = 0.047
		{0.5, 0.01, 7},
		{0.75, 0.01, 4},
		{1, 0.01, 1},
		{0, 0.01, 0},
		{0.1, 0.05, 29},
	} {
		if got := RunsToProve(tc.p, tc.alpha); got != tc.want {
			t.Errorf("RunsToProve(%v, %v) = %d, want %d", tc.p, tc.alpha, got, tc.want)
		}
	}
}

func TestWriteReport(t *testing.T) {
	r := &Explained{
		Runs: 4, Failed: 2, Rate: Rate{Rate: 0.5, Low: 0.15, High: 0.85},
		Divergence: []analyze.Finding{{Summary: "connect(127.0.0.1:8765) failed ECONNREFUSED", Resource: "port 8765", Failing: 2, Passing: 0, FailingRuns: 2, PassingRuns: 2, P: 0.33,
			Example: analyze.Example{Run: 1, Failed: true, Events: []analyze.ExampleEvent{{AtMs: 250, Pid: 7, Process: "curl", Event: "connect(127.0.0.1:8765) failed ECONNREFUSED"}}}}},
		Knobs:           []Knob{{Knob: "cpus", Value: "0.25", Runs: 8, Failed: 8, Rate: 1, Low: 0.68, High: 1}},
		PointOfNoReturn: &PointOfNoReturn{AtMs: 500, Certain: true, Curve: []CurvePoint{{AtMs: 0, Runs: 8, Failed: 4, Rate: 0.5}, {AtMs: 500, Runs: 8, Failed: 8, Rate: 1}}},
		Timelines: []TimelineRun{
			{Run: 1, Failed: true, Events: []analyze.ExampleEvent{{AtMs: 250, Process: "curl", Event: "connect(127.0.0.1:8765) failed ECONNREFUSED"}, {AtMs: 300, Process: "<script>alert(1)</script>", Event: "open(/x) ok"}}},
			{Run: 0, Events: []analyze.ExampleEvent{{AtMs: 100, Process: "python3", Event: "bind(127.0.0.1:8765) ok"}}},
		},
	}
	var b strings.Builder
	if err := WriteReport(&b, r); err != nil {
		t.Fatal(err)
	}
	page := b.String()
	for _, want := range []string{`<svg id="curve"`, `class="point"`, `<svg id="knobs"`, `<svg id="timelines"`, `class="marked"`, `class="interval"`, "connect(127.0.0.1:8765) failed ECONNREFUSED", "&lt;script&gt;"} {
		if !strings.Contains(page, want) {
			t.Errorf("report lacks %q", want)
		}
	}
	for _, bad := range []string{"<script", "http://", "https://"} {
		if strings.Contains(page, bad) {
			t.Errorf("report holds %q: it must be inert and fetch nothing", bad)
		}
	}
}

func TestPointOfNoReturnOf(t *testing.T) {
	pt := func(at float64, failed, runs int) CurvePoint {
		return CurvePoint{AtMs: at, Failed: failed, Runs: runs, Rate: float64(failed) / float64(max(runs, 1))}
	}
	for _, tc := range []struct {
		name  string
		curve []CurvePoint
		at    float64 // -1: none
		note  string
	}{
		{"jump", []CurvePoint{pt(0, 4, 8), pt(250, 5, 8), pt(500, 8, 8), pt(750, 8, 8)}, 500, "between 250 ms and 500 ms"},
		{"seeded", []CurvePoint{pt(0, 8, 8), pt(250, 8, 8)}, 0, "decided before the test started: replay its seed"},
		{"never certain", []CurvePoint{pt(0, 4, 8), pt(250, 5, 8)}, -1, "no offset tried made the failure certain"},
		{"dips again", []CurvePoint{pt(0, 8, 8), pt(250, 4, 8), pt(500, 8, 8)}, 500, "between 250 ms and 500 ms"},
		{"empty points skipped", []CurvePoint{pt(0, 3, 8), pt(250, 0, 0), pt(500, 8, 8)}, 500, "between 0 ms and 500 ms"},
		// certain at the first offset tried, which is not the start: that
		// says nothing of the start ("replay its seed" was a guess)
		{"first offset later", []CurvePoint{pt(500, 8, 8), pt(1000, 8, 8)}, 500, "certain by 500 ms, the earliest offset measured"},
		{"first measured later", []CurvePoint{pt(0, 0, 0), pt(500, 8, 8)}, 500, "certain by 500 ms, the earliest offset measured"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			at, note := PointOfNoReturnOf(tc.curve)
			switch {
			case tc.at < 0 && at != nil, tc.at >= 0 && (at == nil || *at != tc.at):
				t.Errorf("at %v, want %v", at, tc.at)
			case !strings.Contains(note, tc.note):
				t.Errorf("note %q, want %q", note, tc.note)
			}
		})
	}
}
