// Package metrics is sbxd's registry of counters, gauges and histograms,
// on Prometheus' client library, written in the text exposition format
// (version 0.0.4). Its small surface (a family by name, label values as
// strings) keeps the Prometheus types out of the rest of sbxd.
package metrics

import (
	"fmt"
	"io"
	"math"
	"sort"
	"strings"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/common/expfmt"
)

// ContentType is the Content-Type of what WriteText writes.
const ContentType = "text/plain; version=0.0.4; charset=utf-8"

// Default is the registry sbxd serves at /metrics unless it is given
// another. It holds the Go runtime's metrics (go_*) and the process's
// (process_*) too.
var Default = func() *Registry {
	r := NewRegistry()
	r.reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return r
}()

// Registry holds metric families by name. Its methods are safe for
// concurrent use.
type Registry struct {
	reg      *prometheus.Registry
	mu       sync.Mutex
	families map[string]family
}

// family is what a name was registered as: asking for it again with
// another kind or other labels is a programming error.
type family struct {
	kind   string
	labels string
	vec    prometheus.Collector
}

// NewRegistry returns an empty registry (without the Go and process
// metrics of Default).
func NewRegistry() *Registry {
	return &Registry{reg: prometheus.NewPedanticRegistry(), families: map[string]family{}}
}

// family returns the collector registered as name, making and registering
// it with mk on first use; it panics when name was registered otherwise.
func (r *Registry) family(name, kind string, labels []string, mk func() prometheus.Collector) prometheus.Collector {
	r.mu.Lock()
	defer r.mu.Unlock()
	key := strings.Join(labels, ",")
	if f, ok := r.families[name]; ok {
		if f.kind != kind || f.labels != key {
			panic(fmt.Sprintf("metrics: %s registered as a %s with labels [%s]", name, f.kind, f.labels))
		}
		return f.vec
	}
	vec := mk()
	r.reg.MustRegister(vec)
	r.families[name] = family{kind: kind, labels: key, vec: vec}
	return vec
}

// Counter is a family of counters that only go up.
type Counter struct{ vec *prometheus.CounterVec }

// Counter returns the counter family name with the given label names.
func (r *Registry) Counter(name, help string, labels ...string) *Counter {
	vec := r.family(name, "counter", labels, func() prometheus.Collector {
		return prometheus.NewCounterVec(prometheus.CounterOpts{Name: name, Help: help}, labels)
	})
	return &Counter{vec: vec.(*prometheus.CounterVec)}
}

// Add adds v (negative values are ignored) to the series of labelValues.
func (c *Counter) Add(v float64, labelValues ...string) {
	if v < 0 || math.IsNaN(v) {
		return
	}
	c.vec.WithLabelValues(labelValues...).Add(v)
}

// Inc adds one to the series of labelValues.
func (c *Counter) Inc(labelValues ...string) { c.Add(1, labelValues...) }

// Gauge is a family of values that go up and down.
type Gauge struct{ vec *prometheus.GaugeVec }

// Gauge returns the gauge family name with the given label names.
func (r *Registry) Gauge(name, help string, labels ...string) *Gauge {
	vec := r.family(name, "gauge", labels, func() prometheus.Collector {
		return prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: name, Help: help}, labels)
	})
	return &Gauge{vec: vec.(*prometheus.GaugeVec)}
}

// Set sets the series of labelValues to v.
func (g *Gauge) Set(v float64, labelValues ...string) { g.vec.WithLabelValues(labelValues...).Set(v) }

// Reset forgets every series of the gauge, for a gauge rebuilt whole from
// a fresh reading (series that are gone must not linger).
func (g *Gauge) Reset() { g.vec.Reset() }

// Histogram is a family of histograms with fixed buckets.
type Histogram struct{ vec *prometheus.HistogramVec }

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
	vec := r.family(name, "histogram", labels, func() prometheus.Collector {
		return prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: name, Help: help, Buckets: b}, labels)
	})
	return &Histogram{vec: vec.(*prometheus.HistogramVec)}
}

// Observe records v in the series of labelValues.
func (h *Histogram) Observe(v float64, labelValues ...string) {
	h.vec.WithLabelValues(labelValues...).Observe(v)
}

// WriteText writes every family that has a series, in the text format:
// families sorted by name, series by their label values, histogram
// buckets cumulative.
func (r *Registry) WriteText(w io.Writer) error {
	mfs, err := r.reg.Gather()
	if err != nil {
		return fmt.Errorf("metrics: %w", err)
	}
	enc := expfmt.NewEncoder(w, expfmt.NewFormat(expfmt.TypeTextPlain))
	for _, mf := range mfs {
		if err := enc.Encode(mf); err != nil {
			return fmt.Errorf("metrics: %w", err)
		}
	}
	return nil
}
