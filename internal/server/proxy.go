package server

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"sbx.dev/sbx/api"
)

// The preview proxy serves http://PORT-ID.DOMAIN[:PROXYPORT]/ on a listener
// of its own (never the API's): it reverse-proxies HTTP and WebSocket
// upgrades to PORT inside sandbox ID. Raw TCP is not exposed.
//
// Only sandbox ids name a sandbox in a preview host, never names: a name
// would be a second key for the same port, and privacy is kept per id.
//
// Publication: the proxy serves only the ports a user published
// (PreviewManager.Published, kept by the manager across restarts). Any other
// port, and any unknown sandbox, is 404, alike, before anything else is
// done: no dial, no activity lease.
//
// Privacy: a port published private answers only a request with a token
// signed by the daemon's secret for that sandbox and port, unexpired,
// given as ?sbx_token=... or as the sbx_preview cookie the proxy sets when
// it first sees a valid token (so a page's follow-up requests work).
// Requests without one are refused 403. A port stays private until it is
// withdrawn; issuing a new private URL is how to share it again.

const (
	// TokenParam is the query parameter carrying a private preview's token.
	TokenParam = "sbx_token"
	// CookieName is the cookie the proxy sets from a valid token; it is
	// never forwarded into the sandbox.
	CookieName = "sbx_preview"
)

// PreviewManager is the slice of the sandbox manager the preview proxy uses.
type PreviewManager interface {
	// Published reports whether port of sandbox id is published, whether
	// privately, and since when (a publication's generation: a port
	// withdrawn and published again is a new one, which the tokens of the
	// old one do not open): api.ErrNotFound for a port not published or a
	// sandbox that does not exist. It must not count as activity.
	Published(ctx context.Context, id string, port int) (private bool, since int64, err error)
	Dial(ctx context.Context, ref string, port int) (net.Conn, error)
	Lease(ctx context.Context, ref string) (release func(), err error)
}

// ProxyConfig wires a Proxy.
type ProxyConfig struct {
	Manager PreviewManager
	// Domain is the domain preview hosts end with ("localhost").
	Domain string
	// Port is the proxy's port as URLs name it; 80 is left out of them.
	Port int
	// Secret signs private previews' tokens; at least 32 bytes.
	Secret []byte
	// Linger keeps a sandbox's activity lease open this long after its last
	// proxied request ends, so a page's burst of requests takes one lease.
	Linger time.Duration
	Logger *slog.Logger
	Now    func() time.Time
}

// Proxy is the preview proxy, an http.Handler for the preview listener.
type Proxy struct {
	cfg ProxyConfig
	rp  *httputil.ReverseProxy
	log *slog.Logger

	mu     sync.Mutex
	leases map[string]*sharedLease
}

// target is one port of one sandbox.
type target struct {
	ID   string `json:"id"`
	Port int    `json:"port"`
	// Since is the publication's generation, which a token is signed for.
	Since int64 `json:"-"`
}

type targetKey struct{}

// NewProxy returns a Proxy.
func NewProxy(cfg ProxyConfig) (*Proxy, error) {
	if len(cfg.Secret) < 32 {
		return nil, errors.New("preview proxy: the secret must be at least 32 bytes")
	}
	if cfg.Domain == "" {
		return nil, errors.New("preview proxy: a domain is required")
	}
	cfg.Domain = strings.ToLower(strings.Trim(cfg.Domain, "."))
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	p := &Proxy{cfg: cfg, log: cfg.Logger, leases: map[string]*sharedLease{}}
	tr := &http.Transport{
		// The address is "ID:PORT" (set by rewrite); connections are pooled per sandbox port.
		DialContext: func(ctx context.Context, _, addr string) (net.Conn, error) {
			host, port, _ := net.SplitHostPort(addr)
			n, _ := strconv.Atoi(port)
			c, err := cfg.Manager.Dial(ctx, host, n)
			if err != nil {
				return nil, &dialError{target: target{ID: host, Port: n}, err: err}
			}
			return c, nil
		},
		MaxIdleConnsPerHost: 64,
		// idle connections into sandboxes hold descriptors too: bounded
		// in all, whatever the number of sandboxes and ports
		MaxIdleConns:          MaxIdleUpstream,
		IdleConnTimeout:       30 * time.Second,
		ResponseHeaderTimeout: 0, // a long poll inside is the app's business
		ForceAttemptHTTP2:     false,
	}
	p.rp = &httputil.ReverseProxy{
		Rewrite:       p.rewrite,
		Transport:     tr,
		ErrorHandler:  p.proxyError,
		FlushInterval: -1, // stream as the app writes (server-sent events, long polls)
		ErrorLog:      slog.NewLogLogger(cfg.Logger.Handler(), slog.LevelDebug),
	}
	return p, nil
}

// URL returns the preview URL of port in sandbox id (no token).
func (p *Proxy) URL(id string, port int) string {
	host := fmt.Sprintf("%d-%s.%s", port, id, p.cfg.Domain)
	if p.cfg.Port != 0 && p.cfg.Port != 80 {
		host += ":" + strconv.Itoa(p.cfg.Port)
	}
	return "http://" + host + "/"
}

// MaxIdleUpstream bounds the idle connections the proxy keeps into
// sandboxes, in all.
const MaxIdleUpstream = 64

// TokenURL returns the URL of port in sandbox id carrying a token valid for
// ttl, and when it expires; the token opens the publication of generation
// since only (PreviewManager.Published). Only a port published private
// asks for one.
func (p *Proxy) TokenURL(id string, port int, since int64, ttl time.Duration) (string, time.Time) {
	exp := p.cfg.Now().Add(ttl).Truncate(time.Second)
	return p.URL(id, port) + "?" + TokenParam + "=" + p.sign(target{id, port, since}, exp), exp
}

// sign returns the token "EXPIRY.MAC" for t until exp (unix seconds).
func (p *Proxy) sign(t target, exp time.Time) string {
	e := strconv.FormatInt(exp.Unix(), 10)
	return e + "." + base64.RawURLEncoding.EncodeToString(p.mac(t, e))
}

func (p *Proxy) mac(t target, exp string) []byte {
	h := hmac.New(sha256.New, p.cfg.Secret)
	fmt.Fprintf(h, "sbx-preview\x00%s\x00%d\x00%d\x00%s", t.ID, t.Port, t.Since, exp)
	return h.Sum(nil)
}

// verify checks that tok was signed for t and has not expired; it returns
// the expiry.
func (p *Proxy) verify(tok string, t target) (time.Time, error) {
	e, m, ok := strings.Cut(tok, ".")
	if !ok {
		return time.Time{}, errors.New("malformed token")
	}
	sec, err := strconv.ParseInt(e, 10, 64)
	if err != nil {
		return time.Time{}, errors.New("malformed token")
	}
	got, err := base64.RawURLEncoding.DecodeString(m)
	if err != nil || !hmac.Equal(got, p.mac(t, e)) {
		return time.Time{}, errors.New("token not valid for this sandbox and port")
	}
	exp := time.Unix(sec, 0)
	if !p.cfg.Now().Before(exp) {
		return time.Time{}, errors.New("token expired")
	}
	return exp, nil
}

var hostRE = regexp.MustCompile(`^([0-9]{1,5})-(sb_[a-z2-7]+)$`)

// parseHost splits a preview host "PORT-ID.DOMAIN[:port]" (any case).
func parseHost(host, domain string) (target, bool) {
	host = strings.ToLower(host)
	if h, _, err := net.SplitHostPort(host); err == nil {
		host = h
	}
	host = strings.TrimSuffix(host, ".")
	label, ok := strings.CutSuffix(host, "."+domain)
	if !ok {
		return target{}, false
	}
	m := hostRE.FindStringSubmatch(label)
	if m == nil {
		return target{}, false
	}
	port, err := strconv.Atoi(m[1])
	if err != nil || port < 1 || port > 65535 {
		return target{}, false
	}
	return target{ID: m[2], Port: port}, true
}

// ServeHTTP proxies one request (or upgraded connection) into a sandbox.
// What it refuses on its own (404, 403) ends the connection: a client that
// asks for what is not there is not kept.
func (p *Proxy) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	t, ok := parseHost(r.Host, p.cfg.Domain)
	if !ok {
		refuse(w, r, fmt.Sprintf("%s is not a preview address; want http://PORT-ID.%s/", r.Host, p.cfg.Domain), http.StatusNotFound)
		return
	}
	private, since, err := p.cfg.Manager.Published(r.Context(), t.ID, t.Port)
	t.Since = since
	switch {
	case errors.Is(err, api.ErrNotFound):
		// one answer for an unknown sandbox and an unpublished port: the
		// proxy tells nobody which sandboxes exist
		refuse(w, r, fmt.Sprintf("nothing is published at %s; publish the port with `sbx preview ID PORT`", r.Host), http.StatusNotFound)
		return
	case err != nil:
		p.log.Warn("preview proxy: look up publication", "sandbox", t.ID, "port", t.Port, "err", err)
		refuse(w, r, "cannot look up this preview now; try again", http.StatusServiceUnavailable)
		return
	}
	tok, fromQuery := tokenOf(r)
	if tok != "" || private {
		exp, err := p.verify(tok, t)
		switch {
		case err == nil && fromQuery:
			// the cookie is the host's own (no Domain), so it reaches this sandbox port only
			http.SetCookie(w, &http.Cookie{
				Name: CookieName, Value: tok, Path: "/", Expires: exp,
				HttpOnly: true, SameSite: http.SameSiteLaxMode,
			})
		case err != nil && private:
			msg := "this preview is private: open it with the URL `sbx preview " + t.ID + " " + strconv.Itoa(t.Port) + " --private` prints"
			if tok != "" {
				msg += " (" + err.Error() + ")"
			}
			refuse(w, r, msg, http.StatusForbidden)
			return
		}
	}
	release, err := p.lease(r.Context(), t.ID)
	if err != nil {
		p.plainError(w, t, err)
		return
	}
	// held until ServeHTTP returns, which for an upgrade is when the connection closes
	defer release()
	// the body is the transport's until it ends: without full duplex the
	// server reads and closes what is left of it as the answer's header
	// goes out, and the transport, still reading it, drops the connection
	// to the app in the middle of its answer (the fleet controller's fork
	// streams broke so)
	_ = http.NewResponseController(w).EnableFullDuplex()
	p.rp.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), targetKey{}, t)))
}

// refuse answers msg in plain text and closes the connection after it.
func refuse(w http.ResponseWriter, r *http.Request, msg string, status int) {
	dropAfterReply(w, r)
	http.Error(w, msg, status)
}

// tokenOf returns the token a request carries: the query's, else the cookie's.
func tokenOf(r *http.Request) (tok string, fromQuery bool) {
	if v := r.URL.Query().Get(TokenParam); v != "" {
		return v, true
	}
	if c, err := r.Cookie(CookieName); err == nil {
		return c.Value, false
	}
	return "", false
}

// rewrite points the outbound request at the sandbox port and strips what
// is the proxy's or the caller's own: credentials, sbx's token and cookie.
func (p *Proxy) rewrite(pr *httputil.ProxyRequest) {
	t := pr.In.Context().Value(targetKey{}).(target)
	pr.Out.URL.Scheme = "http"
	pr.Out.URL.Host = net.JoinHostPort(t.ID, strconv.Itoa(t.Port))
	pr.Out.Host = pr.In.Host // apps build their own links from it
	pr.SetXForwarded()
	pr.Out.Header.Del("Authorization")
	stripCookie(pr.Out.Header, CookieName)
	pr.Out.URL.RawQuery = stripParam(pr.Out.URL.RawQuery, TokenParam)
}

// stripCookie removes the cookie name from h's Cookie headers, leaving the
// others byte for byte.
func stripCookie(h http.Header, name string) {
	var kept []string
	for _, line := range h.Values("Cookie") {
		var parts []string
		for _, c := range strings.Split(line, ";") {
			c = strings.TrimSpace(c)
			n, _, _ := strings.Cut(c, "=")
			if c == "" || strings.TrimSpace(n) == name {
				continue
			}
			parts = append(parts, c)
		}
		if len(parts) > 0 {
			kept = append(kept, strings.Join(parts, "; "))
		}
	}
	h.Del("Cookie")
	for _, v := range kept {
		h.Add("Cookie", v)
	}
}

// stripParam removes the parameter name from a raw query, leaving the
// others as they were encoded.
func stripParam(raw, name string) string {
	if raw == "" {
		return raw
	}
	var kept []string
	for _, kv := range strings.Split(raw, "&") {
		k, _, _ := strings.Cut(kv, "=")
		if uk, err := url.QueryUnescape(k); err == nil && uk == name {
			continue
		}
		kept = append(kept, kv)
	}
	return strings.Join(kept, "&")
}

// dialError is a failure to connect into a sandbox.
type dialError struct {
	target target
	err    error
}

func (e *dialError) Error() string {
	return fmt.Sprintf("dial port %d in sandbox %s: %v", e.target.Port, e.target.ID, e.err)
}
func (e *dialError) Unwrap() error { return e.err }

// proxyError answers a failed proxied request in plain text.
func (p *Proxy) proxyError(w http.ResponseWriter, r *http.Request, err error) {
	if r.Context().Err() != nil {
		return // the caller left
	}
	t, _ := r.Context().Value(targetKey{}).(target)
	p.plainError(w, t, err)
}

func (p *Proxy) plainError(w http.ResponseWriter, t target, err error) {
	var de *dialError
	isDial := errors.As(err, &de)
	switch status, _ := api.StatusOf(err); {
	case status != http.StatusInternalServerError:
		// a kind the manager gave (unknown sandbox, stopped sandbox)
		if isDial {
			err = de.err
		}
		http.Error(w, err.Error(), status)
	case errors.Is(err, syscall.ECONNREFUSED):
		http.Error(w, fmt.Sprintf("nothing listens on port %d in sandbox %s", t.Port, t.ID), http.StatusBadGateway)
	case isDial:
		http.Error(w, fmt.Sprintf("cannot reach port %d in sandbox %s: %v", t.Port, t.ID, de.err), http.StatusBadGateway)
	case errors.Is(err, net.ErrClosed):
		// sbx ended the connection: the sandbox stopped or went
		http.Error(w, fmt.Sprintf("sandbox %s stopped or was deleted while this request to port %d was open", t.ID, t.Port), http.StatusBadGateway)
	default:
		p.log.Debug("preview proxy", "sandbox", t.ID, "port", t.Port, "err", err)
		http.Error(w, fmt.Sprintf("port %d in sandbox %s: %v", t.Port, t.ID, err), http.StatusBadGateway)
	}
}

// sharedLease is one activity lease shared by a sandbox's requests in flight.
type sharedLease struct {
	n       int
	release func()
	timer   *time.Timer
}

// lease takes the sandbox's activity lease for one request: the first
// request takes it from the manager, the last gives it back (after Linger).
func (p *Proxy) lease(ctx context.Context, id string) (func(), error) {
	if p.join(id) {
		return p.leaveFunc(id), nil
	}
	rel, err := p.cfg.Manager.Lease(ctx, id)
	if err != nil {
		return nil, err
	}
	p.mu.Lock()
	if l := p.leases[id]; l != nil {
		// another request took one meanwhile: share that
		p.joinLocked(l)
		p.mu.Unlock()
		rel()
		return p.leaveFunc(id), nil
	}
	p.leases[id] = &sharedLease{n: 1, release: rel}
	p.mu.Unlock()
	return p.leaveFunc(id), nil
}

func (p *Proxy) join(id string) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	l := p.leases[id]
	if l == nil {
		return false
	}
	p.joinLocked(l)
	return true
}

func (p *Proxy) joinLocked(l *sharedLease) {
	l.n++
	if l.timer != nil {
		l.timer.Stop()
		l.timer = nil
	}
}

func (p *Proxy) leaveFunc(id string) func() {
	var once sync.Once
	return func() { once.Do(func() { p.leave(id) }) }
}

func (p *Proxy) leave(id string) {
	p.mu.Lock()
	l := p.leases[id]
	l.n--
	if l.n > 0 {
		p.mu.Unlock()
		return
	}
	if p.cfg.Linger <= 0 {
		delete(p.leases, id)
		p.mu.Unlock()
		l.release()
		return
	}
	l.timer = time.AfterFunc(p.cfg.Linger, func() {
		p.mu.Lock()
		if p.leases[id] != l || l.n > 0 {
			p.mu.Unlock()
			return
		}
		delete(p.leases, id)
		p.mu.Unlock()
		l.release()
	})
	p.mu.Unlock()
}
