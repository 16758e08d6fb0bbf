package server

import (
	"net/http"

	"sbx.dev/sbx/api"
)

// ports lists the TCP ports listening inside a sandbox.
func (s *Server) ports(w http.ResponseWriter, r *http.Request) {
	ps, err := s.m.Ports(r.Context(), r.PathValue("id"))
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, ps)
}

// preview answers the preview URL of a port (not yet implemented).
func (s *Server) preview(w http.ResponseWriter, r *http.Request) {
	s.fail(w, r, api.Errorf(api.ErrUnavailable, "preview URLs are not implemented yet"))
}
