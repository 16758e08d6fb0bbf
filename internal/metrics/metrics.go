// Package metrics is a tiny registry of counters, gauges and histograms that
// writes the Prometheus text exposition format (version 0.0.4).
package metrics

import (
	"fmt"
	"io"
	"math"
	"sort"
	"strconv"
	"strings"
	"sync"
)

// ContentType is the Content-Type of what WriteText writes.
const ContentType = "text/plain; version=0.0.4; charset=utf-8"

// Default is the registry sbxd serves at /metrics unless it is given another.
var Default = NewRegistry()

// Registry holds metric families by name. Its methods are safe for
// concurrent use.
type Registry struct {
	mu       sync.Mutex
	families map[string]*family
}

// NewRegistry returns an empty registry.
func NewRegistry() *Registry {
	return &Registry{families: map[string]*family{}}
}

type kind string

const (
	counterKind   kind = "counter"
	gaugeKind     kind = "gauge"
	histogramKind kind = "histogram"
)

type family struct {
	name, help string
	kind       kind
	labels     []string
	buckets    []float64 // histograms: upper bounds, ascending, without +Inf
	series     map[string]*series
}

type series struct {
	values []string
	value  float64 // counters and gauges
	counts []uint64
	sum    float64
	count  uint64
}

// family returns the family name, registering it on first use. Asking
// again with the same name returns the same family; asking with another
// kind or other labels panics, as that is a programming error.
func (r *Registry) family(name, help string, k kind, buckets []float64, labels []string) *family {
	r.mu.Lock()
	defer r.mu.Unlock()
	if f, ok := r.families[name]; ok {
		if f.kind != k || strings.Join(f.labels, ",") != strings.Join(labels, ",") {
			panic(fmt.Sprintf("metrics: %s registered as a %s with labels %v", name, f.kind, f.labels))
		}
		return f
	}
	f := &family{name: name, help: help, kind: k, labels: labels, buckets: buckets, series: map[string]*series{}}
	r.families[name] = f
	return f
}

// get returns the series of f for values; r.mu must be held.
func (f *family) get(values []string) *series {
	if len(values) != len(f.labels) {
		panic(fmt.Sprintf("metrics: %s takes %d label values, got %d", f.name, len(f.labels), len(values)))
	}
	key := strings.Join(values, "\xff")
	s, ok := f.series[key]
	if !ok {
		s = &series{values: append([]string(nil), values...)}
		if f.kind == histogramKind {
			s.counts = make([]uint64, len(f.buckets))
		}
		f.series[key] = s
	}
	return s
}

// Counter is a family of counters that only go up.
type Counter struct {
	r *Registry
	f *family
}

// Counter returns the counter family name with the given label names.
func (r *Registry) Counter(name, help string, labels ...string) *Counter {
	return &Counter{r: r, f: r.family(name, help, counterKind, nil, labels)}
}

// Add adds v (negative values are ignored) to the series of labelValues.
func (c *Counter) Add(v float64, labelValues ...string) {
	if v < 0 {
		return
	}
	c.r.mu.Lock()
	defer c.r.mu.Unlock()
	c.f.get(labelValues).value += v
}

// Inc adds one to the series of labelValues.
func (c *Counter) Inc(labelValues ...string) { c.Add(1, labelValues...) }

// Gauge is a family of values that go up and down.
type Gauge struct {
	r *Registry
	f *family
}

// Gauge returns the gauge family name with the given label names.
func (r *Registry) Gauge(name, help string, labels ...string) *Gauge {
	return &Gauge{r: r, f: r.family(name, help, gaugeKind, nil, labels)}
}

// Set sets the series of labelValues to v.
func (g *Gauge) Set(v float64, labelValues ...string) {
	g.r.mu.Lock()
	defer g.r.mu.Unlock()
	g.f.get(labelValues).value = v
}

// Reset forgets every series of the gauge, for a gauge rebuilt whole from
// a fresh reading (series that are gone must not linger).
func (g *Gauge) Reset() {
	g.r.mu.Lock()
	defer g.r.mu.Unlock()
	g.f.series = map[string]*series{}
}

// Histogram is a family of histograms with fixed buckets.
type Histogram struct {
	r *Registry
	f *family
}

// DurationBuckets are upper bounds in seconds for request and capture times.
var DurationBuckets = []float64{0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120}

// Histogram returns the histogram family name with the given buckets
// (upper bounds; sorted here, +Inf is implied) and label names.
func (r *Registry) Histogram(name, help string, buckets []float64, labels ...string) *Histogram {
	b := append([]float64(nil), buckets...)
	sort.Float64s(b)
	if n := len(b); n > 0 && math.IsInf(b[n-1], 1) {
		b = b[:n-1]
	}
	return &Histogram{r: r, f: r.family(name, help, histogramKind, b, labels)}
}

// Observe records v in the series of labelValues.
func (h *Histogram) Observe(v float64, labelValues ...string) {
	h.r.mu.Lock()
	defer h.r.mu.Unlock()
	s := h.f.get(labelValues)
	for i, ub := range h.f.buckets {
		if v <= ub {
			s.counts[i]++
		}
	}
	s.sum += v
	s.count++
}

// WriteText writes every family in the text format: families sorted by
// name, series by their label values, histogram buckets cumulative.
func (r *Registry) WriteText(w io.Writer) error {
	r.mu.Lock()
	var b strings.Builder
	names := make([]string, 0, len(r.families))
	for n := range r.families {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		r.families[n].write(&b)
	}
	r.mu.Unlock()
	_, err := io.WriteString(w, b.String())
	return err
}

func (f *family) write(b *strings.Builder) {
	fmt.Fprintf(b, "# HELP %s %s\n", f.name, escapeHelp(f.help))
	fmt.Fprintf(b, "# TYPE %s %s\n", f.name, f.kind)
	keys := make([]string, 0, len(f.series))
	for k := range f.series {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		s := f.series[k]
		switch f.kind {
		case histogramKind:
			for i, ub := range f.buckets {
				fmt.Fprintf(b, "%s_bucket%s %d\n", f.name, labelText(f.labels, s.values, "le", formatFloat(ub)), s.counts[i])
			}
			fmt.Fprintf(b, "%s_bucket%s %d\n", f.name, labelText(f.labels, s.values, "le", "+Inf"), s.count)
			fmt.Fprintf(b, "%s_sum%s %s\n", f.name, labelText(f.labels, s.values, "", ""), formatFloat(s.sum))
			fmt.Fprintf(b, "%s_count%s %d\n", f.name, labelText(f.labels, s.values, "", ""), s.count)
		default:
			fmt.Fprintf(b, "%s%s %s\n", f.name, labelText(f.labels, s.values, "", ""), formatFloat(s.value))
		}
	}
}

// labelText is `{a="x",b="y"}` (with extra=extraValue last when extra is
// set), or "" when there are no labels.
func labelText(names, values []string, extra, extraValue string) string {
	if len(names) == 0 && extra == "" {
		return ""
	}
	var b strings.Builder
	b.WriteByte('{')
	for i, n := range names {
		if i > 0 {
			b.WriteByte(',')
		}
		fmt.Fprintf(&b, "%s=\"%s\"", n, escapeLabel(values[i]))
	}
	if extra != "" {
		if len(names) > 0 {
			b.WriteByte(',')
		}
		fmt.Fprintf(&b, "%s=\"%s\"", extra, escapeLabel(extraValue))
	}
	b.WriteByte('}')
	return b.String()
}

var (
	labelEscaper = strings.NewReplacer(`\`, `\\`, `"`, `\"`, "\n", `\n`)
	helpEscaper  = strings.NewReplacer(`\`, `\\`, "\n", `\n`)
)

func escapeLabel(s string) string { return labelEscaper.Replace(s) }
func escapeHelp(s string) string  { return helpEscaper.Replace(s) }

func formatFloat(v float64) string {
	switch {
	case math.IsInf(v, 1):
		return "+Inf"
	case math.IsInf(v, -1):
		return "-Inf"
	case math.IsNaN(v):
		return "NaN"
	}
	return strconv.FormatFloat(v, 'g', -1, 64)
}
