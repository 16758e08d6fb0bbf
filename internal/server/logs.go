package server

import (
	"bytes"
	"net/http"
	"strconv"
	"strings"
	"time"

	"sbx.dev/sbx/api"
	"sbx.dev/sbx/internal/metrics"
)

// logs streams one of a sandbox's logs.
func (s *Server) logs(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	tail := 0
	if t := q.Get("tail"); t != "" {
		n, err := strconv.Atoi(t)
		if err != nil || n < 0 {
			s.fail(w, r, api.Errorf(api.ErrInvalid, "tail: %q is not a count of lines", t))
			return
		}
		tail = n
	}
	out := newSSE(w)
	err := s.m.Logs(r.Context(), r.PathValue("id"), q.Get("stream"), boolParam(r, "follow"), tail, func(ev api.LogEvent) error {
		return out.send("log", ev)
	})
	s.endFollow(w, r, out, err)
}

// sandboxMetrics answers a sandbox's resource use.
func (s *Server) sandboxMetrics(w http.ResponseWriter, r *http.Request) {
	m, err := s.m.Metrics(r.Context(), r.PathValue("id"))
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, m)
}

// registry is where the server counts requests and what /metrics serves:
// the manager's registry when it has one, else metrics.Default.
func (s *Server) registry() *metrics.Registry {
	if r, ok := s.m.(interface{ MetricsRegistry() *metrics.Registry }); ok {
		if reg := r.MetricsRegistry(); reg != nil {
			return reg
		}
	}
	return metrics.Default
}

// sandboxStates are the states /metrics always reports, zero or not.
var sandboxStates = api.States

// prometheus serves sbxd's metrics in the Prometheus text format: sandboxes
// by state (read now), captures, reaper actions and API requests (counted
// since sbxd started).
func (s *Server) prometheus(w http.ResponseWriter, r *http.Request) {
	sbs, err := s.m.List(r.Context())
	if err != nil {
		s.fail(w, r, err)
		return
	}
	reg := s.registry()
	byState := map[api.State]int{}
	for _, st := range sandboxStates {
		byState[st] = 0
	}
	for _, sb := range sbs {
		byState[sb.State]++
	}
	g := reg.Gauge("sbx_sandboxes", "Sandboxes by state.", "state")
	g.Reset()
	for st, n := range byState {
		g.Set(float64(n), string(st))
	}
	pools, err := s.m.Pools(r.Context())
	if err != nil {
		s.fail(w, r, err)
		return
	}
	size := reg.Gauge("sbx_warm_pool_size", "Sandboxes each warm pool keeps booted and unclaimed (sbxd --warm): its template, and the limits that are not sbxd's defaults.", "template", "limits")
	ready := reg.Gauge("sbx_warm_pool_ready", "Sandboxes of each warm pool ready to be taken now.", "template", "limits")
	size.Reset()
	ready.Reset()
	for key, p := range pools {
		t, limits, _ := strings.Cut(key, ":")
		size.Set(float64(p[0]), t, limits)
		ready.Set(float64(p[1]), t, limits)
	}
	var b bytes.Buffer
	if err := reg.WriteText(&b); err != nil {
		s.fail(w, r, err)
		return
	}
	w.Header().Set("Content-Type", metrics.ContentType)
	_, _ = w.Write(b.Bytes())
}

// observeRequest counts an API request by route pattern and status.
func (s *Server) observeRequest(reg *metrics.Registry, r *http.Request, status int, d time.Duration) {
	route := r.Pattern
	if route == "" || route == "/" {
		// Refused before routing (no token) or no route: one series, not one per path.
		route = "other"
	}
	if status == 0 {
		status = http.StatusOK
	}
	code := strconv.Itoa(status)
	reg.Counter("sbx_api_requests_total", "API requests by route and status.", "route", "status").Inc(route, code)
	reg.Histogram("sbx_api_request_duration_seconds", "API request latencies by route and status (streams: until they end).",
		metrics.DurationBuckets, "route", "status").Observe(d.Seconds(), route, code)
}
