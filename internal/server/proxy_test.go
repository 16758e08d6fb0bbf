package server

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/coder/websocket"
	"sbx.dev/sbx/api"
)

const testID = "sb_aaaaaaaaaa"

// fakeNet is a PreviewManager whose sandbox testID has port 8080 served by
// an httptest server; other ports refuse connections. The ports in
// published (true: private) are published; newFakeNet publishes 8080 and
// 9999.
type fakeNet struct {
	addr string // the httptest server behind port 8080

	mu        sync.Mutex
	published map[int]bool
	since     map[int]int64 // a publication's generation
	leases    int           // open
	taken     int           // ever
	released  int
	dials     int
}

func newFakeNet(addr string) *fakeNet {
	return &fakeNet{addr: addr, published: map[int]bool{8080: false, 9999: false}}
}

func (f *fakeNet) publish(port int, private bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.published[port] = private
}

// republish withdraws port and publishes it again: a new generation.
func (f *fakeNet) republish(port int, private bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.since == nil {
		f.since = map[int]int64{}
	}
	f.since[port]++
	f.published[port] = private
}

func (f *fakeNet) Published(ctx context.Context, id string, port int) (bool, int64, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	private, ok := f.published[port]
	if id != testID || !ok {
		return false, 0, api.Errorf(api.ErrNotFound, "port %d of sandbox %s is not published", port, id)
	}
	return private, f.since[port], nil
}

func (f *fakeNet) Dial(ctx context.Context, ref string, port int) (net.Conn, error) {
	f.mu.Lock()
	f.dials++
	f.mu.Unlock()
	if ref != testID {
		return nil, api.Errorf(api.ErrNotFound, "sandbox %s not found", ref)
	}
	addr := f.addr
	if port != 8080 {
		// a port nothing listens on: a real refusal
		l, _ := net.Listen("tcp", "127.0.0.1:0")
		addr = l.Addr().String()
		l.Close()
	}
	var d net.Dialer
	return d.DialContext(ctx, "tcp", addr)
}

func (f *fakeNet) Lease(ctx context.Context, ref string) (func(), error) {
	if ref != testID {
		return nil, api.Errorf(api.ErrNotFound, "sandbox %s not found", ref)
	}
	f.mu.Lock()
	f.leases++
	f.taken++
	f.mu.Unlock()
	return func() {
		f.mu.Lock()
		f.leases--
		f.released++
		f.mu.Unlock()
	}, nil
}

func (f *fakeNet) open() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.leases
}

// settled waits (up to 5 s) for the open leases to be want, and returns
// the counts then: the proxy gives a lease back after the client has the
// whole response, so a test cannot count at once.
func (f *fakeNet) settled(want int) (open, taken, released int) {
	deadline := time.Now().Add(5 * time.Second)
	for f.open() != want && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.leases, f.taken, f.released
}

// echoApp answers what it received: headers, query and path, as JSON; at
// /ws it echoes WebSocket messages; at /hold it waits for release.
func echoApp(t *testing.T, hold chan struct{}) *httptest.Server {
	mux := http.NewServeMux()
	mux.HandleFunc("/ws", func(w http.ResponseWriter, r *http.Request) {
		c, err := websocket.Accept(w, r, nil)
		if err != nil {
			return
		}
		defer c.CloseNow()
		for {
			typ, b, err := c.Read(r.Context())
			if err != nil {
				return
			}
			if err := c.Write(r.Context(), typ, b); err != nil {
				return
			}
		}
	})
	mux.HandleFunc("/hold", func(w http.ResponseWriter, r *http.Request) {
		<-hold
	})
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		json.NewEncoder(w).Encode(map[string]any{"header": r.Header, "query": r.URL.RawQuery, "host": r.Host, "path": r.URL.Path})
	})
	s := httptest.NewServer(mux)
	t.Cleanup(s.Close)
	return s
}

var testSecret = []byte("0123456789abcdef0123456789abcdef")

func newTestProxy(t *testing.T, now func() time.Time) (*Proxy, *fakeNet, *httptest.Server, chan struct{}) {
	t.Helper()
	hold := make(chan struct{})
	app := echoApp(t, hold)
	fn := newFakeNet(strings.TrimPrefix(app.URL, "http://"))
	p, err := NewProxy(ProxyConfig{Manager: fn, Domain: "localhost", Port: 8181, Secret: testSecret, Now: now})
	if err != nil {
		t.Fatal(err)
	}
	ps := httptest.NewServer(p)
	t.Cleanup(ps.Close)
	return p, fn, ps, hold
}

// get sends a request to the proxy at ps for host, with extra headers.
func get(t *testing.T, ps *httptest.Server, host, path string, hdr map[string]string) (*http.Response, string) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodGet, ps.URL+path, nil)
	req.Host = host
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp, string(b)
}

func TestParseHost(t *testing.T) {
	tests := []struct {
		name, host string
		want       target
		ok         bool
	}{
		{"plain", "8080-sb_aaaaaaaaaa.localhost", target{ID: testID, Port: 8080}, true},
		{"with port", "8080-sb_aaaaaaaaaa.localhost:8181", target{ID: testID, Port: 8080}, true},
		{"upper case", "3000-SB_AAAAAAAAAA.LOCALHOST:8181", target{ID: testID, Port: 3000}, true},
		{"trailing dot", "80-sb_aaaaaaaaaa.localhost.", target{ID: testID, Port: 80}, true},
		{"other domain", "8080-sb_aaaaaaaaaa.example.com", target{}, false},
		{"domain only", "localhost:8181", target{}, false},
		{"bare address", "127.0.0.1:8181", target{}, false},
		{"no port", "sb_aaaaaaaaaa.localhost", target{}, false},
		{"port zero", "0-sb_aaaaaaaaaa.localhost", target{}, false},
		{"port too big", "65536-sb_aaaaaaaaaa.localhost", target{}, false},
		{"a name, not an id", "8080-myapp.localhost", target{}, false},
		{"nested label", "8080-sb_aaaaaaaaaa.x.localhost", target{}, false},
		{"suffix trick", "8080-sb_aaaaaaaaaa.localhost.evil.com", target{}, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, ok := parseHost(tc.host, "localhost")
			if got != tc.want || ok != tc.ok {
				t.Errorf("got %v %v, want %v %v", got, ok, tc.want, tc.ok)
			}
		})
	}
}

func TestPreviewToken(t *testing.T) {
	now := time.Unix(1_700_000_000, 0)
	p, err := NewProxy(ProxyConfig{Manager: &fakeNet{}, Domain: "localhost", Secret: testSecret, Now: func() time.Time { return now }})
	if err != nil {
		t.Fatal(err)
	}
	tg := target{testID, 8080, 42}
	good := p.sign(tg, now.Add(time.Hour))
	other, _ := NewProxy(ProxyConfig{Manager: &fakeNet{}, Domain: "localhost", Secret: []byte("ffffffffffffffffffffffffffffffff"), Now: p.cfg.Now})
	exp, mac, _ := strings.Cut(good, ".")
	tests := []struct {
		name   string
		tok    string
		target target
		ok     bool
	}{
		{"valid", good, tg, true},
		{"other port", good, target{testID, 8081, 42}, false},
		{"other sandbox", good, target{"sb_bbbbbbbbbb", 8080, 42}, false},
		{"published again since", good, target{testID, 8080, 43}, false},
		{"expired", p.sign(tg, now.Add(-time.Second)), tg, false},
		{"expires now", p.sign(tg, now), tg, false},
		{"expiry moved", fmt.Sprint(now.Add(48*time.Hour).Unix()) + "." + mac, tg, false},
		{"other secret", other.sign(tg, now.Add(time.Hour)), tg, false},
		{"no mac", exp, tg, false},
		{"garbage", "x.y", tg, false},
		{"empty", "", tg, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := p.verify(tc.tok, tc.target)
			if (err == nil) != tc.ok {
				t.Errorf("got %v, want ok=%v", err, tc.ok)
			}
		})
	}
}

func TestStrip(t *testing.T) {
	tests := []struct {
		name, in, want string
	}{
		{"only ours", "sbx_preview=abc", ""},
		{"first", "sbx_preview=abc; a=1; b=\"x y\"", "a=1; b=\"x y\""},
		{"middle", "a=1;sbx_preview=abc;b=2", "a=1; b=2"},
		{"none", "a=1; b=2", "a=1; b=2"},
		{"lookalike kept", "sbx_preview2=1; xsbx_preview=2", "sbx_preview2=1; xsbx_preview=2"},
	}
	for _, tc := range tests {
		t.Run("cookie "+tc.name, func(t *testing.T) {
			h := http.Header{"Cookie": {tc.in}}
			stripCookie(h, CookieName)
			if got := h.Get("Cookie"); got != tc.want {
				t.Errorf("got %q, want %q", got, tc.want)
			}
		})
	}
	queries := []struct {
		name, in, want string
	}{
		{"only ours", "sbx_token=1.abc", ""},
		{"kept encoding", "q=a%20b&sbx_token=1.abc&x=%2F", "q=a%20b&x=%2F"},
		{"escaped name", "sbx%5Ftoken=1&a=2", "a=2"},
		{"repeated", "sbx_token=1&sbx_token=2&a", "a"},
	}
	for _, tc := range queries {
		t.Run("query "+tc.name, func(t *testing.T) {
			if got := stripParam(tc.in, TokenParam); got != tc.want {
				t.Errorf("got %q, want %q", got, tc.want)
			}
		})
	}
}

// seen decodes what the echo app received.
type seen struct {
	Header http.Header `json:"header"`
	Query  string      `json:"query"`
	Host   string      `json:"host"`
	Path   string      `json:"path"`
}

func TestProxyForwards(t *testing.T) {
	_, fn, ps, _ := newTestProxy(t, nil)
	host := "8080-" + testID + ".localhost:8181"
	resp, body := get(t, ps, host, "/a/b?q=1&sbx_token=junk", map[string]string{
		"Authorization": "Bearer secret",
		"Cookie":        "app=1; sbx_preview=junk",
		"X-App":         "kept",
	})
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("got %d %s, want 200", resp.StatusCode, body)
	}
	var s seen
	if err := json.Unmarshal([]byte(body), &s); err != nil {
		t.Fatalf("%v: %s", err, body)
	}
	if got := s.Header.Get("Authorization"); got != "" {
		t.Errorf("Authorization reached the app: %q", got)
	}
	if got := s.Header.Get("Cookie"); got != "app=1" {
		t.Errorf("got Cookie %q, want %q", got, "app=1")
	}
	if s.Query != "q=1" || s.Path != "/a/b" || s.Host != host {
		t.Errorf("got query %q path %q host %q, want q=1 /a/b %s", s.Query, s.Path, s.Host, host)
	}
	if s.Header.Get("X-App") != "kept" || s.Header.Get("X-Forwarded-Host") != host {
		t.Errorf("got X-App %q X-Forwarded-Host %q", s.Header.Get("X-App"), s.Header.Get("X-Forwarded-Host"))
	}
	if open, taken, _ := fn.settled(0); taken != 1 || open != 0 {
		t.Errorf("leases: taken %d, open %d; want 1, 0", taken, open)
	}
}

func TestProxyErrors(t *testing.T) {
	_, _, ps, _ := newTestProxy(t, nil)
	tests := []struct {
		name, host string
		status     int
		body       string
	}{
		{"nothing listens", "9999-" + testID + ".localhost", http.StatusBadGateway, "nothing listens on port 9999 in sandbox " + testID},
		{"unknown sandbox", "8080-sb_zzzzzzzzzz.localhost", http.StatusNotFound, "nothing is published at 8080-sb_zzzzzzzzzz.localhost"},
		{"unpublished port", "8081-" + testID + ".localhost", http.StatusNotFound, "nothing is published at 8081-" + testID + ".localhost"},
		{"not a preview host", "localhost:8181", http.StatusNotFound, "not a preview address"},
		{"api path on a bare host", "127.0.0.1", http.StatusNotFound, "not a preview address"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			resp, body := get(t, ps, tc.host, "/v1/sandboxes", nil)
			if resp.StatusCode != tc.status || !strings.Contains(body, tc.body) {
				t.Errorf("got %d %q, want %d %q", resp.StatusCode, body, tc.status, tc.body)
			}
			if ct := resp.Header.Get("Content-Type"); !strings.HasPrefix(ct, "text/plain") {
				t.Errorf("got Content-Type %q, want text/plain", ct)
			}
		})
	}
}

func TestProxyPrivate(t *testing.T) {
	now := time.Unix(1_700_000_000, 0)
	var mu sync.Mutex
	clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	p, fn, ps, _ := newTestProxy(t, clock)
	host := "8080-" + testID + ".localhost:8181"
	if resp, _ := get(t, ps, host, "/", nil); resp.StatusCode != http.StatusOK {
		t.Fatalf("public before: got %d, want 200", resp.StatusCode)
	}
	fn.publish(8080, true)
	fn.publish(8081, false)
	u, exp := p.TokenURL(testID, 8080, 0, time.Hour)
	if !strings.HasPrefix(u, "http://"+host+"/?sbx_token=") || !exp.Equal(now.Add(time.Hour)) {
		t.Fatalf("got %s until %s", u, exp)
	}
	tok := u[strings.Index(u, "=")+1:]

	resp, body := get(t, ps, host, "/", nil)
	if resp.StatusCode != http.StatusForbidden || !strings.Contains(body, "private") {
		t.Errorf("without token: got %d %q, want 403", resp.StatusCode, body)
	}
	if resp, _ := get(t, ps, "8081-"+testID+".localhost", "/", nil); resp.StatusCode == http.StatusForbidden {
		t.Errorf("another port of the sandbox became private")
	}
	if resp, _ := get(t, ps, host, "/?sbx_token=1.bad", nil); resp.StatusCode != http.StatusForbidden {
		t.Errorf("bad token: got %d, want 403", resp.StatusCode)
	}
	resp, body = get(t, ps, host, "/page?sbx_token="+tok, nil)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("with token: got %d %q, want 200", resp.StatusCode, body)
	}
	var cookie *http.Cookie
	for _, c := range resp.Cookies() {
		if c.Name == CookieName {
			cookie = c
		}
	}
	if cookie == nil || cookie.Value != tok || !cookie.HttpOnly || cookie.Domain != "" {
		t.Fatalf("got cookie %+v, want %s=token, HttpOnly, host-only", cookie, CookieName)
	}
	var s seen
	json.Unmarshal([]byte(body), &s)
	if s.Query != "" {
		t.Errorf("the token reached the app: query %q", s.Query)
	}
	// a follow-up request of the page carries only the cookie
	resp, body = get(t, ps, host, "/style.css", map[string]string{"Cookie": "a=1; " + CookieName + "=" + tok})
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("with cookie: got %d %q, want 200", resp.StatusCode, body)
	}
	json.Unmarshal([]byte(body), &s)
	if s.Header.Get("Cookie") != "a=1" {
		t.Errorf("got Cookie %q at the app, want a=1", s.Header.Get("Cookie"))
	}
	// the token is for port 8080 only
	fn.publish(9000, true)
	if resp, _ := get(t, ps, "9000-"+testID+".localhost", "/?sbx_token="+tok, nil); resp.StatusCode != http.StatusForbidden {
		t.Errorf("token of another port: got %d, want 403", resp.StatusCode)
	}
	// withdrawn and published private again: the old URL and cookie are
	// revoked for good, a new URL opens it
	fn.republish(8080, true)
	if resp, _ := get(t, ps, host, "/", map[string]string{"Cookie": CookieName + "=" + tok}); resp.StatusCode != http.StatusForbidden {
		t.Errorf("a token of a withdrawn publication: got %d, want 403", resp.StatusCode)
	}
	fn.mu.Lock()
	since := fn.since[8080]
	fn.mu.Unlock()
	u, _ = p.TokenURL(testID, 8080, since, time.Hour)
	tok = u[strings.Index(u, "=")+1:]
	if resp, body := get(t, ps, host, "/?sbx_token="+tok, nil); resp.StatusCode != http.StatusOK {
		t.Errorf("a token of the new publication: got %d %q, want 200", resp.StatusCode, body)
	}
	mu.Lock()
	now = now.Add(time.Hour)
	mu.Unlock()
	if resp, body := get(t, ps, host, "/", map[string]string{"Cookie": CookieName + "=" + tok}); resp.StatusCode != http.StatusForbidden || !strings.Contains(body, "expired") {
		t.Errorf("expired: got %d %q, want 403 expired", resp.StatusCode, body)
	}
}

// TestProxyUnpublished: a port not published, and a sandbox that does not
// exist, get the same 404, before any dial or activity lease, and the
// connection is closed after it.
func TestProxyUnpublished(t *testing.T) {
	_, fn, ps, _ := newTestProxy(t, nil)
	var bodies []string
	for _, host := range []string{"8081-" + testID + ".localhost", "8080-sb_zzzzzzzzzz.localhost"} {
		resp, body := get(t, ps, host, "/", map[string]string{"Cookie": CookieName + "=1.x"})
		if resp.StatusCode != http.StatusNotFound {
			t.Errorf("%s: got %d %q, want 404", host, resp.StatusCode, body)
		}
		if !resp.Close {
			t.Errorf("%s: the connection is kept open after a 404", host)
		}
		bodies = append(bodies, strings.Replace(body, host, "HOST", 1))
	}
	if bodies[0] != bodies[1] {
		t.Errorf("an unknown sandbox and an unpublished port answer differently: %q, %q", bodies[0], bodies[1])
	}
	// withdrawn while published: 404 from then on
	get(t, ps, "8080-"+testID+".localhost", "/", nil)
	fn.mu.Lock()
	delete(fn.published, 8080)
	fn.mu.Unlock()
	if resp, _ := get(t, ps, "8080-"+testID+".localhost", "/", nil); resp.StatusCode != http.StatusNotFound {
		t.Errorf("withdrawn port: got %d, want 404", resp.StatusCode)
	}
	_, taken, _ := fn.settled(0)
	fn.mu.Lock()
	dials := fn.dials
	fn.mu.Unlock()
	if taken != 1 || dials != 1 {
		t.Errorf("leases taken %d, dials %d; want 1 and 1 (the one published request only)", taken, dials)
	}
}

func TestProxyLease(t *testing.T) {
	_, fn, ps, hold := newTestProxy(t, nil)
	host := "8080-" + testID + ".localhost"
	done := make(chan struct{})
	go func() {
		defer close(done)
		get(t, ps, host, "/hold", nil)
	}()
	deadline := time.Now().Add(5 * time.Second)
	for fn.open() != 1 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	if fn.open() != 1 {
		t.Fatalf("during a request: %d leases open, want 1", fn.open())
	}
	close(hold)
	<-done
	if open, _, released := fn.settled(0); open != 0 || released != 1 {
		t.Errorf("after the request: %d open, %d released; want 0, 1", open, released)
	}
}

func TestProxyWebSocket(t *testing.T) {
	_, fn, ps, _ := newTestProxy(t, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	hc := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "tcp", strings.TrimPrefix(ps.URL, "http://"))
	}}}
	c, _, err := websocket.Dial(ctx, "ws://8080-"+testID+".localhost:8181/ws", &websocket.DialOptions{HTTPClient: hc})
	if err != nil {
		t.Fatal(err)
	}
	defer c.CloseNow()
	if err := c.Write(ctx, websocket.MessageText, []byte("hello")); err != nil {
		t.Fatal(err)
	}
	_, b, err := c.Read(ctx)
	if err != nil || string(b) != "hello" {
		t.Fatalf("got %q %v, want hello", b, err)
	}
	if fn.open() != 1 {
		t.Errorf("upgraded connection open: %d leases, want 1", fn.open())
	}
	c.Close(websocket.StatusNormalClosure, "")
	deadline := time.Now().Add(5 * time.Second)
	for fn.open() != 0 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	if fn.open() != 0 {
		t.Errorf("after close: %d leases open, want 0", fn.open())
	}
}

func TestProxyLeaseLinger(t *testing.T) {
	hold := make(chan struct{})
	app := echoApp(t, hold)
	fn := newFakeNet(strings.TrimPrefix(app.URL, "http://"))
	p, err := NewProxy(ProxyConfig{Manager: fn, Domain: "localhost", Secret: testSecret, Linger: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	ps := httptest.NewServer(p)
	t.Cleanup(ps.Close)
	for i := 0; i < 5; i++ {
		get(t, ps, "8080-"+testID+".localhost", "/", nil)
	}
	if fn.taken != 1 {
		t.Errorf("a burst of 5 requests took %d leases, want 1", fn.taken)
	}
	deadline := time.Now().Add(5 * time.Second)
	for fn.open() != 0 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	if fn.open() != 0 {
		t.Errorf("after the linger: %d leases open, want 0", fn.open())
	}
}
