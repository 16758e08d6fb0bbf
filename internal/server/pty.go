package server

import (
	"net/http"

	"sbx.dev/sbx/api"
)

// pty serves an interactive terminal over a WebSocket (not yet).
func (s *Server) pty(w http.ResponseWriter, r *http.Request) {
	s.fail(w, r, api.Errorf(api.ErrUnavailable, "the PTY is not implemented yet"))
}

// attach re-attaches a WebSocket to a running exec (not yet).
func (s *Server) attach(w http.ResponseWriter, r *http.Request) {
	s.fail(w, r, api.Errorf(api.ErrUnavailable, "attach is not implemented yet"))
}
