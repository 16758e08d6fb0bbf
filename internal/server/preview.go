package server

import (
	"net/http"
	"strconv"
	"time"

	"sbx.dev/sbx/api"
)

// defaultPreviewTTL is a private preview's token lifetime when none is asked.
const defaultPreviewTTL = time.Hour

// SetPreview makes s answer POST /v1/sandboxes/{id}/preview with URLs of p;
// call it before serving. Without it, that route answers api.ErrUnavailable
// (sbxd runs without --preview-listen).
func (s *Server) SetPreview(p *Proxy) { s.proxy = p }

// ports lists the TCP ports listening inside a sandbox.
func (s *Server) ports(w http.ResponseWriter, r *http.Request) {
	ps, err := s.m.Ports(r.Context(), r.PathValue("id"))
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, ps)
}

// preview publishes a port of a sandbox on the preview proxy and answers
// its URL; a private one carries a signed, expiring token. Publishing is
// durable (it outlives a restart, a stop and a resume) and is not activity:
// using the URL is.
func (s *Server) preview(w http.ResponseWriter, r *http.Request) {
	p := s.proxy
	if p == nil {
		s.fail(w, r, errPreviewOff)
		return
	}
	var req api.PreviewRequest
	if err := decode(w, r, &req); err != nil {
		s.fail(w, r, err)
		return
	}
	ttl := defaultPreviewTTL // decode checked the port and ttl (api.PreviewRequest.Validate)
	if req.TTL != nil {
		ttl = req.TTL.D()
	}
	// a name is resolved by the manager; preview hosts carry the id
	id, since, err := s.m.Publish(r.Context(), r.PathValue("id"), req.Port, req.Private)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	if !req.Private {
		writeJSON(w, http.StatusOK, api.Preview{URL: p.URL(id, req.Port), Port: req.Port})
		return
	}
	u, exp := p.TokenURL(id, req.Port, since, ttl)
	writeJSON(w, http.StatusOK, api.Preview{URL: u, ExpiresAt: &exp, Port: req.Port, Private: true})
}

var errPreviewOff = api.Errorf(api.ErrUnavailable, "preview URLs are off: sbxd runs without --preview-listen")

// unpreview withdraws a published port: from then on the proxy answers 404
// for it. It works with the proxy off too (publications are the manager's).
func (s *Server) unpreview(w http.ResponseWriter, r *http.Request) {
	port, err := strconv.Atoi(r.PathValue("port"))
	if err != nil {
		s.fail(w, r, api.Errorf(api.ErrInvalid, "port: %q is not a TCP port (1-65535)", r.PathValue("port")))
		return
	}
	if err := s.m.Unpublish(r.Context(), r.PathValue("id"), port); err != nil {
		s.fail(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// previews lists the ports published of a sandbox, with their URLs (a
// private one's without a token: ask for one with POST).
func (s *Server) previews(w http.ResponseWriter, r *http.Request) {
	id, ps, err := s.m.Previews(r.Context(), r.PathValue("id"))
	if err != nil {
		s.fail(w, r, err)
		return
	}
	if s.proxy != nil {
		for i := range ps {
			ps[i].URL = s.proxy.URL(id, ps[i].Port)
		}
	}
	writeJSON(w, http.StatusOK, ps)
}

// trace answers what runtime monitoring kept of a monitored sandbox.
// Reading it is inspection, not activity.
func (s *Server) trace(w http.ResponseWriter, r *http.Request) {
	tr, err := s.m.Trace(r.Context(), r.PathValue("id"))
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, tr)
}
