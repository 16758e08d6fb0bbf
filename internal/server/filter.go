package server

import (
	"net/http"
	"strings"

	"sbx.dev/sbx/api"
)

// listFilter is what GET /v1/sandboxes is asked to keep.
type listFilter struct {
	meta   map[string]string
	parent string // an id, resolved from a name
	states map[api.State]bool
}

// listFilter reads the filters of a list request: meta=K=V (all must
// hold), parent=ID-or-name, state=S (any may hold). A bad one is
// api.ErrInvalid; an unknown parent matches nothing, as there is none.
func (s *Server) listFilter(r *http.Request) (listFilter, error) {
	q := r.URL.Query()
	var f listFilter
	for _, kv := range q["meta"] {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || k == "" {
			return f, api.Errorf(api.ErrInvalid, "meta: %q is not KEY=VALUE", kv)
		}
		if f.meta == nil {
			f.meta = map[string]string{}
		}
		if old, dup := f.meta[k]; dup && old != v {
			return f, api.Errorf(api.ErrInvalid, "meta: key %q is given twice with different values", k)
		}
		f.meta[k] = v
	}
	for _, st := range q["state"] {
		if !api.State(st).Valid() {
			return f, api.Errorf(api.ErrInvalid, "state: %q is not a state (%s)", st, stateList())
		}
		if f.states == nil {
			f.states = map[api.State]bool{}
		}
		f.states[api.State(st)] = true
	}
	if p := q.Get("parent"); p != "" {
		f.parent = p
		if sb, err := s.m.Get(r.Context(), p); err == nil {
			f.parent = sb.ID
		}
	}
	return f, nil
}

func (f listFilter) match(sb api.Sandbox) bool {
	for k, v := range f.meta {
		if got, ok := sb.Meta[k]; !ok || got != v {
			return false
		}
	}
	if f.parent != "" && sb.Parent != f.parent {
		return false
	}
	if f.states != nil && !f.states[sb.State] {
		return false
	}
	return true
}

// stateList is api.States for a message: "creating, ready, ...".
func stateList() string {
	s := make([]string, len(api.States))
	for i, st := range api.States {
		s[i] = string(st)
	}
	return strings.Join(s, ", ")
}
