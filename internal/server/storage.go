package server

import (
	"net/http"

	"sbx.dev/sbx/api"
)

// The storage routes (issue 22): promote a snapshot, say what uses the
// data dir, prune it.

func (s *Server) keepSnapshot(w http.ResponseWriter, r *http.Request) {
	sn, err := s.m.Keep(r.Context(), r.PathValue("name"))
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, sn)
}

func (s *Server) pushSnapshot(w http.ResponseWriter, r *http.Request) {
	var req api.PushRequest
	if err := decode(w, r, &req); err != nil {
		s.fail(w, r, err)
		return
	}
	res, err := s.m.PushSnapshot(r.Context(), r.PathValue("name"), req)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, res)
}

func (s *Server) pushSandbox(w http.ResponseWriter, r *http.Request) {
	var req api.PushRequest
	if err := decode(w, r, &req); err != nil {
		s.fail(w, r, err)
		return
	}
	res, err := s.m.PushSandbox(r.Context(), r.PathValue("id"), req)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, res)
}

func (s *Server) adoptSandbox(w http.ResponseWriter, r *http.Request) {
	var req api.AdoptRequest
	if err := decode(w, r, &req); err != nil {
		s.fail(w, r, err)
		return
	}
	sb, err := s.m.AdoptSandbox(r.Context(), req)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, sb)
}

func (s *Server) pullSnapshot(w http.ResponseWriter, r *http.Request) {
	var req api.PullRequest
	if err := decode(w, r, &req); err != nil {
		s.fail(w, r, err)
		return
	}
	res, err := s.m.PullSnapshot(r.Context(), req)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusCreated, res)
}

func (s *Server) storage(w http.ResponseWriter, r *http.Request) {
	st, err := s.m.Storage(r.Context())
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, st)
}

func (s *Server) prune(w http.ResponseWriter, r *http.Request) {
	var req api.PruneRequest
	if err := decode(w, r, &req); err != nil {
		s.fail(w, r, err)
		return
	}
	res, err := s.m.Prune(r.Context(), req)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, res)
}
