package server

import (
	"net/http"
	"strconv"

	"sbx.dev/sbx/api"
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
	switch {
	case err != nil && !out.started:
		s.fail(w, r, err)
	case err != nil && r.Context().Err() == nil:
		_, code := api.StatusOf(err)
		_ = out.send("error", map[string]string{"error": err.Error(), "code": code})
	case err == nil:
		_ = out.send("eof", map[string]string{})
	}
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

// prometheus serves sbxd's metrics in the Prometheus text format (not yet).
func (s *Server) prometheus(w http.ResponseWriter, r *http.Request) {
	s.fail(w, r, api.Errorf(api.ErrUnavailable, "/metrics is not implemented yet"))
}
