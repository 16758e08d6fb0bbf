// Package server is sbxd's HTTP edge: routing, auth, errors, streaming.
package server

import (
	"context"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"time"

	"sbx.dev/sbx/api"
)

// Manager is the slice of the sandbox manager the server uses.
type Manager interface {
	Create(ctx context.Context, req api.CreateRequest) (*api.Sandbox, error)
	Get(ctx context.Context, ref string) (*api.Sandbox, error)
	List(ctx context.Context) ([]api.Sandbox, error)
	Delete(ctx context.Context, ref string, withSnapshots bool) (*api.DeleteResult, error)
	Snapshot(ctx context.Context, ref string, req api.SnapshotRequest) (*api.Snapshot, error)
	Snapshots(ctx context.Context) ([]api.Snapshot, error)
	GetSnapshot(ctx context.Context, name string) (*api.Snapshot, error)
	DeleteSnapshot(ctx context.Context, name string) error
	// Storage (storage.go in internal/sandbox): deletes that keep freezes,
	// promoted snapshots, what uses the data dir, and pruning it.
	DeleteWith(ctx context.Context, ref string, o api.DeleteOptions) (*api.DeleteResult, error)
	Keep(ctx context.Context, name string) (*api.Snapshot, error)
	// Push and pull (transfer.go in internal/sandbox): a snapshot to and
	// from an OCI registry.
	PushSnapshot(ctx context.Context, name string, req api.PushRequest) (*api.PushResult, error)
	PullSnapshot(ctx context.Context, req api.PullRequest) (*api.PullResult, error)
	PushSandbox(ctx context.Context, ref string, req api.PushRequest) (*api.PushResult, error)
	AdoptSandbox(ctx context.Context, req api.AdoptRequest) (*api.Sandbox, error)
	Storage(ctx context.Context) (*api.Storage, error)
	Prune(ctx context.Context, req api.PruneRequest) (*api.PruneResult, error)
	Fork(ctx context.Context, ref string, req api.ForkRequest, emit func(api.ForkEvent) error) ([]api.Sandbox, error)
	Stop(ctx context.Context, ref string, wait bool) (*api.Sandbox, error)
	Resume(ctx context.Context, ref string, requireMemory bool) (*api.Sandbox, error)
	Events(ctx context.Context, ref string, after int64, follow bool, emit func(api.Event) error) error
	SetTTL(ctx context.Context, ref string, ttl time.Duration) (*api.Sandbox, error)
	SetPersistent(ctx context.Context, ref string, persistent bool) (*api.Sandbox, error)
	// Lifecycle and reach (ports.go, logs.go, pty.go in internal/sandbox).
	Ports(ctx context.Context, ref string) ([]api.Port, error)
	// Preview publications (preview.go in internal/sandbox).
	Publish(ctx context.Context, ref string, port int, private bool) (id string, since int64, err error)
	Unpublish(ctx context.Context, ref string, port int) error
	Previews(ctx context.Context, ref string) (id string, ps []api.Preview, err error)
	Dial(ctx context.Context, ref string, port int) (net.Conn, error)
	Lease(ctx context.Context, ref string) (release func(), err error)
	PTY(ctx context.Context, ref string, cmd, env []string, cwd, user string, cols, rows int) (master *os.File, wait func() (int, error), err error)
	Logs(ctx context.Context, ref, stream string, follow bool, tail int, emit func(api.LogEvent) error) error
	Metrics(ctx context.Context, ref string) (*api.Metrics, error)
	// Pools are the warm pools: per template, the size kept and how many are ready.
	Pools(ctx context.Context) (map[string][2]int, error)
	Exec(ctx context.Context, ref string, req api.ExecRequest) (*api.Exec, error)
	Execs(ctx context.Context, ref string) ([]api.Exec, error)
	GetExec(ctx context.Context, ref, execID string) (*api.Exec, error)
	Signal(ctx context.Context, ref, execID string, sig int) error
	Output(ctx context.Context, ref, execID string, follow bool, emit func(api.ExecEvent) error) error
	ReadFile(ctx context.Context, ref, path string, asTar bool, w io.Writer) error
	WriteFile(ctx context.Context, ref, path string, r io.Reader, size int64, mode string) error
	WriteTar(ctx context.Context, ref, path string, r io.Reader) error
	Stat(ctx context.Context, ref, path string) (*api.FileInfo, error)
	ReadDir(ctx context.Context, ref, path, after string, limit int) ([]api.FileInfo, error)
	MkdirAll(ctx context.Context, ref, path, mode string) error
	Remove(ctx context.Context, ref, path string, recursive bool) error
	Rename(ctx context.Context, ref, from, to string) error
	Creating(ctx context.Context, ref string) bool
	// Visible is nil unless ref is a sandbox no request may address: a warm
	// pool's, not taken yet (api.ErrNotFound, as for none).
	Visible(ctx context.Context, ref string) error
	// Trace is what runtime monitoring kept of a monitored sandbox (trace.go).
	Trace(ctx context.Context, ref string) (*api.Trace, error)
	// Templates: a removal says what still holds the version; a change
	// has the versions nothing holds collected.
	RemoveTemplate(ctx context.Context, name string) (*api.Template, error)
	TemplateChanged(ctx context.Context)
}

// Templates is the slice of the template store the server uses.
type Templates interface {
	List() ([]api.Template, error)
	Resolve(name string) (api.Template, error)
	Build(ctx context.Context, name string, force bool, packages []string, progress func(msg string)) (api.Template, error)
	Import(ctx context.Context, name string, tar io.Reader, force bool, progress func(msg string)) (api.Template, error)
	PutLayer(ctx context.Context, diffID string, r io.Reader, progress func(msg string)) (existed bool, err error)
	ImportImage(ctx context.Context, name string, config []byte, source string, force bool, progress func(msg string)) (t api.Template, missing []string, err error)
	Remove(name string) (api.Template, error)
}

// maxImageBody bounds POST /v1/templates/{name}/image: an image config
// (at most 4 MiB) in base64.
const maxImageBody = 8 << 20

// Config wires a Server.
type Config struct {
	Manager   Manager
	Templates Templates
	Logger    *slog.Logger
	Version   string
}

// Server serves the API.
type Server struct {
	m   Manager
	t   Templates
	log *slog.Logger
	cfg Config
	// proxy is the preview proxy whose URLs the API hands out, if any.
	proxy *Proxy
	// base is every request's context (BaseContext); Close cancels it,
	// which ends the streams that follow.
	base  context.Context
	close context.CancelFunc
}

// maxJSONBody bounds every JSON request body.
const maxJSONBody = 1 << 20

// New returns a Server.
func New(cfg Config) *Server {
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	base, cancel := context.WithCancel(context.Background())
	return &Server{m: cfg.Manager, t: cfg.Templates, log: cfg.Logger, cfg: cfg, base: base, close: cancel}
}

// BaseContext is the base of every request's context: set it as the
// http.Server's BaseContext, so that Close reaches the handlers.
func (s *Server) BaseContext(net.Listener) context.Context { return s.base }

// Close cancels every request's context: a stream that follows (events,
// logs, an exec's output) ends at once with an "error" event of kind
// unavailable saying sbxd is shutting down, instead of holding the
// shutdown until its deadline. sbxd calls it once the captures in flight
// have ended, before it shuts its listeners.
func (s *Server) Close() { s.close() }

// closing reports whether Close was called.
func (s *Server) closing() bool { return s.base.Err() != nil }

// errShuttingDown is what a stream cut by Close says.
var errShuttingDown = api.Errorf(api.ErrUnavailable, "sbxd is shutting down; follow again once it is back (what the stream followed goes on)")

// visible refuses, as not found, a request to a sandbox that is not a
// user's yet (a warm pool's): its id shows in the storage report, and a
// command run in it would be in the sandbox the next create is given.
func (s *Server) visible(h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if err := s.m.Visible(r.Context(), r.PathValue("id")); err != nil {
			s.fail(w, r, err)
			return
		}
		h(w, r)
	}
}

// Handler returns the API's handler. With a token, every request must carry
// it as a bearer token (the TCP listener); without, none is asked (the unix
// socket, whose mode is what guards it).
func (s *Server) Handler(token string) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/health", s.health)
	// a fleet's controller serves the nodes; one sbxd has none
	mux.HandleFunc("GET /v1/nodes", s.notAFleet)
	mux.HandleFunc("GET /v1/nodes/{name}", s.notAFleet)
	mux.HandleFunc("POST /v1/nodes/{name}/cordon", s.notAFleet)
	mux.HandleFunc("POST /v1/nodes/{name}/uncordon", s.notAFleet)
	mux.HandleFunc("POST /v1/nodes/{name}/drain", s.notAFleet)
	mux.HandleFunc("GET /v1/sandboxes", s.list)
	mux.HandleFunc("POST /v1/sandboxes", s.create)
	mux.HandleFunc("GET /v1/sandboxes/{id}", s.visible(s.get))
	mux.HandleFunc("DELETE /v1/sandboxes/{id}", s.visible(s.delete))
	mux.HandleFunc("POST /v1/sandboxes/{id}/exec", s.visible(s.exec))
	mux.HandleFunc("GET /v1/sandboxes/{id}/execs", s.visible(s.execs))
	mux.HandleFunc("GET /v1/sandboxes/{id}/execs/{exec}", s.visible(s.getExec))
	mux.HandleFunc("GET /v1/sandboxes/{id}/execs/{exec}/output", s.visible(s.output))
	mux.HandleFunc("POST /v1/sandboxes/{id}/execs/{exec}/signal", s.visible(s.signal))
	mux.HandleFunc("GET /v1/sandboxes/{id}/files", s.visible(s.readFile))
	mux.HandleFunc("PUT /v1/sandboxes/{id}/files", s.visible(s.writeFile))
	mux.HandleFunc("DELETE /v1/sandboxes/{id}/files", s.visible(s.removeFile))
	mux.HandleFunc("POST /v1/sandboxes/{id}/fs/mkdir", s.visible(s.mkdir))
	mux.HandleFunc("POST /v1/sandboxes/{id}/fs/rename", s.visible(s.rename))
	mux.HandleFunc("GET /v1/sandboxes/{id}/fs/stat", s.visible(s.stat))
	mux.HandleFunc("GET /v1/sandboxes/{id}/fs/ls", s.visible(s.readDir))
	mux.HandleFunc("POST /v1/sandboxes/{id}/snapshots", s.visible(s.snapshot))
	mux.HandleFunc("POST /v1/sandboxes/{id}/fork", s.visible(s.fork))
	mux.HandleFunc("POST /v1/sandboxes/{id}/stop", s.visible(s.stop))
	mux.HandleFunc("POST /v1/sandboxes/{id}/resume", s.visible(s.resume))
	// a stopped sandbox moving between nodes (a fleet's controller asks)
	mux.HandleFunc("POST /v1/sandboxes/{id}/push", s.visible(s.pushSandbox))
	mux.HandleFunc("POST /v1/sandboxes/adopt", s.adoptSandbox)
	mux.HandleFunc("GET /v1/sandboxes/{id}/events", s.visible(s.events))
	mux.HandleFunc("POST /v1/sandboxes/{id}/ttl", s.visible(s.setTTL))
	mux.HandleFunc("POST /v1/sandboxes/{id}/persist", s.visible(s.setPersistent))
	mux.HandleFunc("GET /v1/sandboxes/{id}/logs", s.visible(s.logs))
	mux.HandleFunc("GET /v1/sandboxes/{id}/metrics", s.visible(s.sandboxMetrics))
	mux.HandleFunc("GET /v1/sandboxes/{id}/ports", s.visible(s.ports))
	mux.HandleFunc("GET /v1/sandboxes/{id}/trace", s.visible(s.trace))
	mux.HandleFunc("POST /v1/sandboxes/{id}/preview", s.visible(s.preview))
	mux.HandleFunc("GET /v1/sandboxes/{id}/preview", s.visible(s.previews))
	mux.HandleFunc("DELETE /v1/sandboxes/{id}/preview/{port}", s.visible(s.unpreview))
	mux.HandleFunc("GET /v1/sandboxes/{id}/exec/pty", s.visible(s.pty))
	mux.HandleFunc("GET /v1/sandboxes/{id}/execs/{exec}/attach", s.visible(s.attach))
	mux.HandleFunc("GET /metrics", s.prometheus)
	mux.HandleFunc("GET /v1/snapshots", s.snapshots)
	mux.HandleFunc("GET /v1/snapshots/{name}", s.getSnapshot)
	mux.HandleFunc("DELETE /v1/snapshots/{name}", s.deleteSnapshot)
	mux.HandleFunc("POST /v1/snapshots/{name}/keep", s.keepSnapshot)
	mux.HandleFunc("POST /v1/snapshots/{name}/push", s.pushSnapshot)
	mux.HandleFunc("POST /v1/snapshots/pull", s.pullSnapshot)
	mux.HandleFunc("GET /v1/storage", s.storage)
	mux.HandleFunc("POST /v1/storage/prune", s.prune)
	mux.HandleFunc("GET /v1/templates", s.templates)
	mux.HandleFunc("GET /v1/templates/{name}", s.getTemplate)
	mux.HandleFunc("POST /v1/templates/{name}/build", s.buildTemplate)
	mux.HandleFunc("PUT /v1/templates/{name}", s.importTemplate)
	mux.HandleFunc("POST /v1/templates/{name}/image", s.importImage)
	mux.HandleFunc("PUT /v1/layers/{digest}", s.putLayer)
	mux.HandleFunc("DELETE /v1/templates/{name}", s.removeTemplate)
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		s.fail(w, r, api.Errorf(api.ErrNotFound, "no route %s %s", r.Method, r.URL.Path))
	})
	var h http.Handler = mux
	if token != "" {
		h = requireToken(token, h)
	}
	return s.logged(h)
}

func requireToken(token string, next http.Handler) http.Handler {
	want := []byte("Bearer " + token)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got := []byte(r.Header.Get("Authorization"))
		if subtle.ConstantTimeCompare(got, want) != 1 {
			// a client without the token is not kept: no keep-alive, no
			// reading the rest of its body
			dropAfterReply(w, r)
			writeError(w, api.Errorf(api.ErrUnauthorized, "a valid bearer token is required"))
			return
		}
		next.ServeHTTP(w, r)
	})
}

type statusWriter struct {
	http.ResponseWriter
	status int
}

func (w *statusWriter) WriteHeader(code int) {
	if w.status == 0 {
		w.status = code
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Write(b []byte) (int, error) {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	return w.ResponseWriter.Write(b)
}

func (w *statusWriter) Flush() {
	if f, ok := w.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

func (s *Server) logged(next http.Handler) http.Handler {
	reg := s.registry()
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		sw := &statusWriter{ResponseWriter: w}
		next.ServeHTTP(sw, r)
		d := time.Since(start)
		s.log.Debug("request", "method", r.Method, "path", r.URL.Path, "status", sw.status, "duration", d)
		// the mux set r.Pattern on this same request: count by route, not path
		s.observeRequest(reg, r, sw.status, d)
	})
}

// notAFleet answers the fleet's routes: this sbxd is one machine.
func (s *Server) notAFleet(w http.ResponseWriter, r *http.Request) {
	writeError(w, api.Errorf(api.ErrNotFound, "%s: this sbxd is one machine, not a fleet: it has no nodes; point --host (SBX_HOST) at the fleet's controller (sbx-controller)", r.URL.Path))
}

// fail answers err with its kind's status; errors of no kind are logged.
func (s *Server) fail(w http.ResponseWriter, r *http.Request, err error) {
	status, _ := api.StatusOf(err)
	if status >= 500 {
		s.log.Error("request failed", "method", r.Method, "path", r.URL.Path, "err", err)
	}
	writeError(w, err)
}

func writeError(w http.ResponseWriter, err error) {
	status, _ := api.StatusOf(err)
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(api.Envelope(err))
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

// decode reads a bounded JSON body into v.
func decode(w http.ResponseWriter, r *http.Request, v any) error {
	body := http.MaxBytesReader(w, r.Body, maxJSONBody)
	dec := json.NewDecoder(body)
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		var tooBig *http.MaxBytesError
		if errors.As(err, &tooBig) {
			return api.Errorf(api.ErrTooLarge, "request body is larger than %d bytes", maxJSONBody)
		}
		if fe := api.DecodeError(err); fe != err {
			return fe // a field that did not read names itself
		}
		return api.Errorf(api.ErrInvalid, "request body: %v", err)
	}
	if v, ok := v.(interface{ Validate() error }); ok {
		return v.Validate() // the request's fields, checked as the client checks them
	}
	return nil
}

// sse writes server-sent events.
type sse struct {
	w       http.ResponseWriter
	rc      *http.ResponseController
	started bool
}

func newSSE(w http.ResponseWriter) *sse {
	return &sse{w: w, rc: http.NewResponseController(w)}
}

func (e *sse) send(event string, v any) error {
	if !e.started {
		e.w.Header().Set("Content-Type", "text/event-stream")
		e.w.Header().Set("Cache-Control", "no-cache")
		e.w.WriteHeader(http.StatusOK)
		e.started = true
	}
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	if _, err := fmt.Fprintf(e.w, "event: %s\ndata: %s\n\n", event, b); err != nil {
		return err
	}
	return e.rc.Flush()
}

func (s *Server) health(w http.ResponseWriter, r *http.Request) {
	writeJSON(w, http.StatusOK, api.Health{Status: "ok", Version: s.cfg.Version})
}

// list answers the sandboxes, those that match every filter given:
// meta=K=V (repeatable: all must hold), parent=ID-or-name, state=S
// (repeatable: any may hold).
func (s *Server) list(w http.ResponseWriter, r *http.Request) {
	f, err := s.listFilter(r)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	sbs, err := s.m.List(r.Context())
	if err != nil {
		s.fail(w, r, err)
		return
	}
	out := make([]api.Sandbox, 0, len(sbs))
	for _, sb := range sbs {
		if f.match(sb) {
			out = append(out, sb)
		}
	}
	writeJSON(w, http.StatusOK, out)
}

func (s *Server) create(w http.ResponseWriter, r *http.Request) {
	var req api.CreateRequest
	if err := decode(w, r, &req); err != nil {
		s.fail(w, r, err)
		return
	}
	sb, err := s.m.Create(r.Context(), req)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusCreated, sb)
}

func (s *Server) get(w http.ResponseWriter, r *http.Request) {
	sb, err := s.m.Get(r.Context(), r.PathValue("id"))
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, sb)
}

func (s *Server) delete(w http.ResponseWriter, r *http.Request) {
	res, err := s.m.DeleteWith(r.Context(), r.PathValue("id"), api.DeleteOptions{WithSnapshots: boolParam(r, "withSnapshots"), KeepFreezes: boolParam(r, "keepFreezes")})
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, res)
}

func (s *Server) exec(w http.ResponseWriter, r *http.Request) {
	var req api.ExecRequest
	if err := decode(w, r, &req); err != nil {
		s.fail(w, r, err)
		return
	}
	id := r.PathValue("id")
	var out *sse
	if !req.Detach && s.m.Creating(r.Context(), id) {
		// the exec waits for the sandbox to be made, and says so
		out = newSSE(w)
		msg := fmt.Sprintf("sandbox %s is being created; the command starts once it is ready", id)
		if err := out.send("notice", api.ExecEvent{Event: "notice", Message: msg}); err != nil {
			return
		}
	}
	e, err := s.m.Exec(r.Context(), id, req)
	if err != nil {
		if out != nil {
			_ = out.send("error", api.ExecEvent{Event: "error", ErrorBody: api.Envelope(err)})
			return
		}
		s.fail(w, r, err)
		return
	}
	if req.Detach {
		writeJSON(w, http.StatusCreated, e)
		return
	}
	if out == nil {
		out = newSSE(w)
	}
	if err := out.send("started", api.ExecEvent{Event: "started", Exec: e}); err != nil {
		return
	}
	s.stream(r, out, id, e.ID, true)
}

// stream relays an exec's output as events; a client that goes away ends
// only the stream, never the exec. A stream that ends while the exec still
// runs (no follow) ends with "eof", so a client can tell it from a dropped
// connection.
func (s *Server) stream(r *http.Request, out *sse, id, execID string, follow bool) {
	exited := false
	err := s.m.Output(r.Context(), id, execID, follow, func(ev api.ExecEvent) error {
		exited = exited || ev.Event == "exit"
		return out.send(ev.Event, ev)
	})
	switch {
	case !exited && s.closing():
		cut := api.Errorf(api.ErrUnavailable, "sbxd is shutting down; exec %s goes on in sandbox %s: follow its output again once sbxd is back", execID, id)
		_ = out.send("error", api.ExecEvent{Event: "error", ErrorBody: api.Envelope(cut)})
	case err != nil && r.Context().Err() != nil:
		// the client left
	case err != nil && !out.started:
		s.fail(out.w, r, err)
	case err != nil:
		_ = out.send("error", api.ExecEvent{Event: "error", ErrorBody: api.Envelope(err)})
	case !exited:
		_ = out.send("eof", api.ExecEvent{Event: "eof"})
	}
}

// signal sends a signal to an exec's process group.
func (s *Server) signal(w http.ResponseWriter, r *http.Request) {
	var req api.SignalRequest
	if r.ContentLength != 0 {
		if err := decode(w, r, &req); err != nil {
			s.fail(w, r, err)
			return
		}
	}
	if err := s.m.Signal(r.Context(), r.PathValue("id"), r.PathValue("exec"), req.Signal); err != nil {
		s.fail(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func (s *Server) execs(w http.ResponseWriter, r *http.Request) {
	es, err := s.m.Execs(r.Context(), r.PathValue("id"))
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, es)
}

func (s *Server) getExec(w http.ResponseWriter, r *http.Request) {
	e, err := s.m.GetExec(r.Context(), r.PathValue("id"), r.PathValue("exec"))
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, e)
}

func (s *Server) output(w http.ResponseWriter, r *http.Request) {
	id, execID := r.PathValue("id"), r.PathValue("exec")
	// Check the exec exists first, so an unknown one is a 404, not a stream.
	if _, err := s.m.GetExec(r.Context(), id, execID); err != nil {
		s.fail(w, r, err)
		return
	}
	s.stream(r, newSSE(w), id, execID, boolParam(r, "follow"))
}

func boolParam(r *http.Request, name string) bool {
	switch strings.ToLower(r.URL.Query().Get(name)) {
	case "1", "true", "yes":
		return true
	}
	return false
}

// lazyWriter sends the status line only with the first byte, so that an
// error found before any byte still gets a proper error response.
type lazyWriter struct {
	w           http.ResponseWriter
	contentType string
	wrote       bool
}

func (l *lazyWriter) Write(b []byte) (int, error) {
	if !l.wrote {
		l.w.Header().Set("Content-Type", l.contentType)
		l.w.WriteHeader(http.StatusOK)
		l.wrote = true
	}
	return l.w.Write(b)
}

func (s *Server) readFile(w http.ResponseWriter, r *http.Request) {
	asTar := boolParam(r, "tar")
	ct := "application/octet-stream"
	if asTar {
		ct = "application/x-tar"
	}
	lw := &lazyWriter{w: w, contentType: ct}
	err := s.m.ReadFile(r.Context(), r.PathValue("id"), r.URL.Query().Get("path"), asTar, lw)
	switch {
	case err != nil && !lw.wrote:
		s.fail(w, r, err)
	case err != nil:
		// Half sent: break the connection so the client cannot take a
		// truncated file for a whole one.
		s.log.Warn("file download failed mid-stream", "path", r.URL.Query().Get("path"), "err", err)
		panic(http.ErrAbortHandler)
	case !lw.wrote:
		lw.Write(nil) // an empty file
	}
}

func (s *Server) writeFile(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	var err error
	if boolParam(r, "tar") {
		err = s.m.WriteTar(r.Context(), r.PathValue("id"), q.Get("path"), r.Body)
	} else {
		err = s.m.WriteFile(r.Context(), r.PathValue("id"), q.Get("path"), r.Body, r.ContentLength, q.Get("mode"))
	}
	if err != nil {
		s.fail(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// removeFile removes a file (recursive=1: a directory and all in it).
func (s *Server) removeFile(w http.ResponseWriter, r *http.Request) {
	if err := s.m.Remove(r.Context(), r.PathValue("id"), r.URL.Query().Get("path"), boolParam(r, "recursive")); err != nil {
		s.fail(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// mkdir makes a directory and its missing parents.
func (s *Server) mkdir(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	if err := s.m.MkdirAll(r.Context(), r.PathValue("id"), q.Get("path"), q.Get("mode")); err != nil {
		s.fail(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// rename renames a file or directory inside a sandbox.
func (s *Server) rename(w http.ResponseWriter, r *http.Request) {
	var req api.RenameRequest
	if err := decode(w, r, &req); err != nil {
		s.fail(w, r, err)
		return
	}
	if err := s.m.Rename(r.Context(), r.PathValue("id"), req.From, req.To); err != nil {
		s.fail(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func (s *Server) stat(w http.ResponseWriter, r *http.Request) {
	fi, err := s.m.Stat(r.Context(), r.PathValue("id"), r.URL.Query().Get("path"))
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, fi)
}

func (s *Server) readDir(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	limit := api.MaxListPage
	if v := q.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > api.MaxListPage {
			s.fail(w, r, api.Errorf(api.ErrInvalid, "limit %q: want a number of entries from 1 to %d", v, api.MaxListPage))
			return
		}
		limit = n
	}
	fis, err := s.m.ReadDir(r.Context(), r.PathValue("id"), q.Get("path"), q.Get("after"), limit)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, fis)
}

func (s *Server) templates(w http.ResponseWriter, r *http.Request) {
	ts, err := s.t.List()
	if err != nil {
		s.fail(w, r, err)
		return
	}
	if ts == nil {
		ts = []api.Template{}
	}
	writeJSON(w, http.StatusOK, ts)
}

func (s *Server) getTemplate(w http.ResponseWriter, r *http.Request) {
	t, err := s.t.Resolve(r.PathValue("name"))
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, t)
}

// progressStream runs a long template operation, relaying its progress.
// The last event is "done" with the template, "missing" with the layers an
// image import lacks, or "error".
func (s *Server) progressStream(w http.ResponseWriter, r *http.Request, op func(ctx context.Context, progress func(string)) (api.Template, []string, error)) {
	out := newSSE(w)
	gone := false
	progress := func(msg string) {
		if gone {
			return
		}
		if err := out.send("progress", api.Progress{Event: "progress", Message: msg}); err != nil {
			gone = true
		}
	}
	t, missing, err := op(r.Context(), progress)
	if err == nil && len(missing) == 0 {
		// the version the name pointed at before may be held by nothing now
		s.m.TemplateChanged(r.Context())
	}
	switch {
	case err != nil && !out.started:
		s.fail(w, r, err)
	case err != nil:
		_ = out.send("error", api.Progress{Event: "error", ErrorBody: api.Envelope(err)})
	case len(missing) > 0:
		_ = out.send("missing", api.Progress{Event: "missing", Missing: missing})
	default:
		_ = out.send("done", api.Progress{Event: "done", Done: true, Template: &t})
	}
}

// buildTemplate builds a template. The build goes on if the client leaves:
// a half-built template is worse than a finished one nobody watched.
func (s *Server) buildTemplate(w http.ResponseWriter, r *http.Request) {
	name, force := r.PathValue("name"), boolParam(r, "force")
	var pkgs []string
	if p := r.URL.Query().Get("packages"); p != "" {
		pkgs = strings.Split(p, ",")
	}
	s.progressStream(w, r, func(ctx context.Context, p func(string)) (api.Template, []string, error) {
		t, err := s.t.Build(context.WithoutCancel(ctx), name, force, pkgs, p)
		return t, nil, err
	})
}

// importTemplate makes a template from a rootfs tar in the body.
func (s *Server) importTemplate(w http.ResponseWriter, r *http.Request) {
	name, force := r.PathValue("name"), boolParam(r, "force")
	// progress is written while the body is still read
	_ = http.NewResponseController(w).EnableFullDuplex()
	s.progressStream(w, r, func(ctx context.Context, p func(string)) (api.Template, []string, error) {
		// An import reads the client's body: when the client leaves, it ends.
		t, err := s.t.Import(ctx, name, r.Body, force, p)
		return t, nil, err
	})
}

// importImage makes a template from an image config whose layers are in
// the store, or says which are missing.
func (s *Server) importImage(w http.ResponseWriter, r *http.Request) {
	var req api.ImageImport
	body := http.MaxBytesReader(w, r.Body, maxImageBody)
	if err := json.NewDecoder(body).Decode(&req); err != nil {
		var tooBig *http.MaxBytesError
		if errors.As(err, &tooBig) {
			s.fail(w, r, api.Errorf(api.ErrTooLarge, "request body is larger than %d bytes", maxImageBody))
			return
		}
		s.fail(w, r, api.Errorf(api.ErrInvalid, "request body: %v", err))
		return
	}
	name := r.PathValue("name")
	s.progressStream(w, r, func(ctx context.Context, p func(string)) (api.Template, []string, error) {
		return s.t.ImportImage(context.WithoutCancel(ctx), name, req.Config, req.Source, req.Force, p)
	})
}

// putLayer stores an image layer from the body, by its diff ID.
func (s *Server) putLayer(w http.ResponseWriter, r *http.Request) {
	digest := r.PathValue("digest")
	// progress is written while the body is still read
	_ = http.NewResponseController(w).EnableFullDuplex()
	out := newSSE(w)
	existed, err := s.t.PutLayer(r.Context(), digest, r.Body, func(msg string) {
		_ = out.send("progress", api.Progress{Event: "progress", Message: msg})
	})
	switch {
	case err != nil && !out.started:
		s.fail(w, r, err)
	case err != nil:
		_ = out.send("error", api.Progress{Event: "error", ErrorBody: api.Envelope(err)})
	default:
		msg := "stored"
		if existed {
			msg = "there already"
		}
		_ = out.send("done", api.Progress{Event: "done", Done: true, Message: msg})
	}
}

func (s *Server) removeTemplate(w http.ResponseWriter, r *http.Request) {
	t, err := s.m.RemoveTemplate(r.Context(), r.PathValue("name"))
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, t)
}

func (s *Server) snapshot(w http.ResponseWriter, r *http.Request) {
	var req api.SnapshotRequest
	if err := decode(w, r, &req); err != nil {
		s.fail(w, r, err)
		return
	}
	sn, err := s.m.Snapshot(r.Context(), r.PathValue("id"), req)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusCreated, sn)
}

func (s *Server) snapshots(w http.ResponseWriter, r *http.Request) {
	sns, err := s.m.Snapshots(r.Context())
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, sns)
}

func (s *Server) getSnapshot(w http.ResponseWriter, r *http.Request) {
	sn, err := s.m.GetSnapshot(r.Context(), r.PathValue("name"))
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, sn)
}

func (s *Server) deleteSnapshot(w http.ResponseWriter, r *http.Request) {
	if err := s.m.DeleteSnapshot(r.Context(), r.PathValue("name")); err != nil {
		s.fail(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// fork streams a fork's progress. Errors found before the fork starts
// (bad count, unknown parent) are plain error responses.
func (s *Server) fork(w http.ResponseWriter, r *http.Request) {
	var req api.ForkRequest
	if err := decode(w, r, &req); err != nil {
		s.fail(w, r, err)
		return
	}
	out := newSSE(w)
	_, err := s.m.Fork(r.Context(), r.PathValue("id"), req, func(ev api.ForkEvent) error {
		return out.send(ev.Event, ev)
	})
	switch {
	case err != nil && !out.started:
		s.fail(w, r, err)
	case err != nil:
		_ = out.send("error", api.ForkEvent{Event: "error", ErrorBody: api.Envelope(err)})
	}
}

func (s *Server) stop(w http.ResponseWriter, r *http.Request) {
	wait := boolParam(r, "wait")
	sb, err := s.m.Stop(r.Context(), r.PathValue("id"), wait)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	status := http.StatusOK
	if !wait {
		status = http.StatusAccepted
	}
	writeJSON(w, status, sb)
}

func (s *Server) resume(w http.ResponseWriter, r *http.Request) {
	var req api.ResumeRequest
	if r.ContentLength != 0 {
		if err := decode(w, r, &req); err != nil {
			s.fail(w, r, err)
			return
		}
	}
	sb, err := s.m.Resume(r.Context(), r.PathValue("id"), req.RequireMemory)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, sb)
}

func (s *Server) events(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	var after int64
	if a := r.URL.Query().Get("after"); a != "" {
		n, err := strconv.ParseInt(a, 10, 64)
		if err != nil || n < 0 {
			s.fail(w, r, api.Errorf(api.ErrInvalid, "after: %q is not a sequence number (0 or more)", a))
			return
		}
		after = n
	}
	out := newSSE(w)
	err := s.m.Events(r.Context(), id, after, boolParam(r, "follow"), func(ev api.Event) error {
		return out.send("event", ev)
	})
	s.endFollow(w, r, out, err)
}

// endFollow ends a stream of events or logs: "eof" when it sent all, an
// "error" event (the envelope) when it failed after its first event or sbxd
// is shutting down, an error response when it failed before; nothing when
// the client left.
func (s *Server) endFollow(w http.ResponseWriter, r *http.Request, out *sse, err error) {
	switch {
	case s.closing() && out.started:
		_ = out.send("error", api.Envelope(errShuttingDown))
	case err != nil && !out.started:
		s.fail(w, r, err)
	case err != nil && r.Context().Err() == nil:
		_ = out.send("error", api.Envelope(err))
	case err == nil:
		_ = out.send("eof", map[string]string{})
	}
}

func (s *Server) setTTL(w http.ResponseWriter, r *http.Request) {
	var req api.TTLRequest
	if err := decode(w, r, &req); err != nil {
		s.fail(w, r, err)
		return
	}
	sb, err := s.m.SetTTL(r.Context(), r.PathValue("id"), req.TTL.D())
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, sb)
}

func (s *Server) setPersistent(w http.ResponseWriter, r *http.Request) {
	var req api.PersistRequest
	if err := decode(w, r, &req); err != nil {
		s.fail(w, r, err)
		return
	}
	sb, err := s.m.SetPersistent(r.Context(), r.PathValue("id"), req.Persistent)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, sb)
}
