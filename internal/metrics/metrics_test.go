package metrics

import (
	"strings"
	"testing"
)

func TestWriteText(t *testing.T) {
	tests := []struct {
		name string
		fill func(r *Registry)
		want string
	}{
		{
			name: "counter with labels, sorted series",
			fill: func(r *Registry) {
				c := r.Counter("sbx_reaper_actions_total", "Sandboxes the reaper deleted.", "reason")
				c.Inc("lifetime")
				c.Inc("idle")
				c.Add(2, "idle")
				c.Add(-5, "idle") // ignored: counters only go up
			},
			want: `# HELP sbx_reaper_actions_total Sandboxes the reaper deleted.
# TYPE sbx_reaper_actions_total counter
sbx_reaper_actions_total{reason="idle"} 3
sbx_reaper_actions_total{reason="lifetime"} 1
`,
		},
		{
			name: "gauge without labels and with reset",
			fill: func(r *Registry) {
				g := r.Gauge("up", "Is it up.")
				g.Set(7)
				s := r.Gauge("sbx_sandboxes", "Sandboxes by state.", "state")
				s.Set(2, "gone")
				s.Reset()
				s.Set(1, "ready")
				s.Set(0, "stopped")
			},
			want: `# HELP sbx_sandboxes Sandboxes by state.
# TYPE sbx_sandboxes gauge
sbx_sandboxes{state="ready"} 1
sbx_sandboxes{state="stopped"} 0
# HELP up Is it up.
# TYPE up gauge
up 7
`,
		},
		{
			name: "histogram buckets are cumulative and end in +Inf",
			fill: func(r *Registry) {
				h := r.Histogram("d_seconds", "Durations.", []float64{1, 0.5}, "kind")
				h.Observe(0.2, "a")
				h.Observe(0.7, "a")
				h.Observe(3, "a")
			},
			want: `# HELP d_seconds Durations.
# TYPE d_seconds histogram
d_seconds_bucket{kind="a",le="0.5"} 1
d_seconds_bucket{kind="a",le="1"} 2
d_seconds_bucket{kind="a",le="+Inf"} 3
d_seconds_sum{kind="a"} 3.9
d_seconds_count{kind="a"} 3
`,
		},
		{
			name: "label values and help are escaped",
			fill: func(r *Registry) {
				r.Counter("c", "a \\ help\nline", "route").Inc("GET \"x\"\n\\")
			},
			want: `# HELP c a \\ help\nline
# TYPE c counter
c{route="GET \"x\"\n\\"} 1
`,
		},
		{
			name: "asking again returns the same family",
			fill: func(r *Registry) {
				r.Counter("c", "help", "a").Inc("x")
				r.Counter("c", "help", "a").Inc("x")
			},
			want: "# HELP c help\n# TYPE c counter\nc{a=\"x\"} 2\n",
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := NewRegistry()
			tc.fill(r)
			var b strings.Builder
			if err := r.WriteText(&b); err != nil {
				t.Fatal(err)
			}
			if got := b.String(); got != tc.want {
				t.Errorf("got\n%s\nwant\n%s", got, tc.want)
			}
		})
	}
}

func TestMismatchPanics(t *testing.T) {
	r := NewRegistry()
	r.Counter("c", "help", "a")
	defer func() {
		if recover() == nil {
			t.Error("registering c again as a gauge did not panic")
		}
	}()
	r.Gauge("c", "help", "a")
}

// TestDefaultRuntimeMetrics: what sbxd serves carries the Go runtime's
// and the process's metrics beside its own.
func TestDefaultRuntimeMetrics(t *testing.T) {
	Default.Counter("sbx_test_total", "A test counter.").Inc()
	var b strings.Builder
	if err := Default.WriteText(&b); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"\ngo_goroutines ", "\nprocess_open_fds ", "\nsbx_test_total 1\n"} {
		if !strings.Contains("\n"+b.String(), want) {
			t.Errorf("Default's text lacks %q", strings.TrimSpace(want))
		}
	}
}
