package server

import (
	"net/http"
	"time"

	"sbx.dev/sbx/api"
)

// maxPreviewTTL bounds how long a private preview's token lives.
const maxPreviewTTL = 30 * 24 * time.Hour

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

// preview answers the preview URL of a port of a sandbox; a private one
// marks that port private and carries a signed, expiring token. Inspection
// only: asking for a URL is not activity, using it is.
func (s *Server) preview(w http.ResponseWriter, r *http.Request) {
	p := s.proxy
	if p == nil {
		s.fail(w, r, api.Errorf(api.ErrUnavailable, "preview URLs are off: sbxd runs without --preview-listen"))
		return
	}
	var req api.PreviewRequest
	if err := decode(w, r, &req); err != nil {
		s.fail(w, r, err)
		return
	}
	if req.Port < 1 || req.Port > 65535 {
		s.fail(w, r, api.Errorf(api.ErrInvalid, "port: %d is not a TCP port (1-65535)", req.Port))
		return
	}
	ttl := defaultPreviewTTL
	if req.TTL != "" {
		if !req.Private {
			s.fail(w, r, api.Errorf(api.ErrInvalid, "ttl: only a private preview expires; add private"))
			return
		}
		d, err := time.ParseDuration(req.TTL)
		if err != nil || d <= 0 || d > maxPreviewTTL {
			s.fail(w, r, api.Errorf(api.ErrInvalid, "ttl: %q is not a duration between 1s and %s", req.TTL, maxPreviewTTL))
			return
		}
		ttl = d
	}
	// a name is resolved here; preview hosts carry the id
	sb, err := s.m.Get(r.Context(), r.PathValue("id"))
	if err != nil {
		s.fail(w, r, err)
		return
	}
	if !req.Private {
		writeJSON(w, http.StatusOK, api.Preview{URL: p.URL(sb.ID, req.Port)})
		return
	}
	u, exp, err := p.Private(sb.ID, req.Port, ttl)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, api.Preview{URL: u, ExpiresAt: &exp})
}
