package e2e

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"sbx.dev/sbx/api"
	"sbx.dev/sbx/internal/netns"
)

// previewDaemon starts an sbxd of its own whose preview proxy listens on a
// free port, and returns it with that address.
func previewDaemon(tb testing.TB) (*daemon, string) {
	tb.Helper()
	addr := freePort()
	d, err := startDaemon([]string{"--preview-listen", addr})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { d.stop(true) })
	return d, addr
}

// proxyClient sends every request to the proxy at addr, whatever the URL's
// host (which is what the proxy routes on): *.localhost needs no DNS.
func proxyClient(addr string) *http.Client {
	var dl net.Dialer
	return &http.Client{
		Transport: &http.Transport{
			DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
				return dl.DialContext(ctx, "tcp", addr)
			},
			MaxIdleConnsPerHost: 64,
		},
		Timeout:       10 * time.Second,
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}
}

func previewGet(t *testing.T, hc *http.Client, u string, hdr http.Header) (*http.Response, string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, u, nil)
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range hdr {
		req.Header[k] = v
	}
	resp, err := hc.Do(req)
	if err != nil {
		t.Fatalf("GET %s: %v", u, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp, string(b)
}

// headerEcho is a python3 server answering every GET with the request's
// headers and path as JSON.
const headerEcho = `
import http.server, json
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        b = json.dumps({"headers": {k.lower(): v for k, v in self.headers.items()}, "path": self.path}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(b)))
        self.end_headers()
        self.wfile.write(b)
    def log_message(self, *a):
        pass
http.server.ThreadingHTTPServer(("0.0.0.0", 8000), H).serve_forever()
`

func TestPreview(t *testing.T) {
	d, addr := previewDaemon(t)
	_, proxyPort, _ := net.SplitHostPort(addr)
	hc := proxyClient(addr)
	id := d.newSandbox(t, "--template", "tiny")
	d.must(t, "exec", id, "--detach", "--", "sh", "-c", "mkdir -p /w && echo hi > /w/i.txt && exec httpd -f -p 8080 -h /w")

	// ports lists the server, in the table and as JSON
	waitFor(t, "port 8080 in `sbx ports`", 20*time.Second, func() bool {
		var ps struct{ Ports []api.Port }
		d.jsonOut(t, &ps, "ports", id)
		for _, p := range ps.Ports {
			if p.Port == 8080 && p.Proto != "" {
				return true
			}
		}
		return false
	})
	if out := d.must(t, "ports", id); !strings.HasPrefix(out, "PROTO") || !strings.Contains(out, "8080") {
		t.Errorf("sbx ports printed %q, want a table with 8080", out)
	}

	// the preview URL reaches the server
	u := strings.TrimSpace(d.must(t, "preview", id, "8080"))
	if want := fmt.Sprintf("http://8080-%s.localhost:%s/", id, proxyPort); u != want {
		t.Fatalf("sbx preview printed %q, want %q", u, want)
	}
	before, err := d.client.Sandbox(id).Info(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(20 * time.Millisecond) // so that a touch is a later time than the last one
	resp, body := previewGet(t, hc, u+"i.txt", nil)
	if resp.StatusCode != http.StatusOK || body != "hi\n" {
		t.Fatalf("GET through the proxy: %d %q, want 200 hi", resp.StatusCode, body)
	}
	// proxy traffic is activity
	after, err := d.client.Sandbox(id).Info(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if !after.LastActivity.After(before.LastActivity) {
		t.Errorf("lastActivity %s did not move past %s with a proxied request", after.LastActivity, before.LastActivity)
	}

	// a port not published: 404; published with nothing on it: 502 saying
	// so; an unknown sandbox: 404; not a preview host: 404
	resp, body = previewGet(t, hc, fmt.Sprintf("http://9090-%s.localhost:%s/", id, proxyPort), nil)
	if resp.StatusCode != http.StatusNotFound || !strings.Contains(body, "nothing is published") {
		t.Errorf("unpublished port: %d %q, want 404", resp.StatusCode, body)
	}
	d.must(t, "preview", id, "9090")
	resp, body = previewGet(t, hc, fmt.Sprintf("http://9090-%s.localhost:%s/", id, proxyPort), nil)
	if want := "nothing listens on port 9090 in sandbox " + id; resp.StatusCode != http.StatusBadGateway || !strings.Contains(body, want) {
		t.Errorf("closed port: %d %q, want 502 %q", resp.StatusCode, body, want)
	}
	resp, body = previewGet(t, hc, fmt.Sprintf("http://8080-sb_aaaaaaaaaa.localhost:%s/", proxyPort), nil)
	if resp.StatusCode != http.StatusNotFound {
		t.Errorf("unknown sandbox: %d %q, want 404", resp.StatusCode, body)
	}
	resp, body = previewGet(t, hc, "http://"+addr+"/v1/sandboxes", nil)
	if resp.StatusCode != http.StatusNotFound || strings.Contains(body, id) {
		t.Errorf("the API through the proxy: %d %q, want 404", resp.StatusCode, body)
	}

	// private: refused without the token, allowed with it, then by its cookie
	var pv api.Preview
	d.jsonOut(t, &pv, "preview", id, "8080", "--private", "--ttl", "1h")
	if pv.ExpiresAt == nil || !strings.HasPrefix(pv.URL, u+"?sbx_token=") {
		t.Fatalf("private preview: %+v", pv)
	}
	if until := time.Until(*pv.ExpiresAt); until < 59*time.Minute || until > 61*time.Minute {
		t.Errorf("private preview expires in %s, want 1h", until)
	}
	resp, body = previewGet(t, hc, u+"i.txt", nil)
	if resp.StatusCode != http.StatusForbidden {
		t.Errorf("private without token: %d %q, want 403", resp.StatusCode, body)
	}
	pu, _ := url.Parse(pv.URL)
	pu.Path = "/i.txt"
	resp, body = previewGet(t, hc, pu.String(), nil)
	if resp.StatusCode != http.StatusOK || body != "hi\n" {
		t.Fatalf("private with token: %d %q, want 200 hi", resp.StatusCode, body)
	}
	var cookie string
	for _, c := range resp.Cookies() {
		if c.Name == "sbx_preview" {
			cookie = c.Name + "=" + c.Value
		}
	}
	if cookie == "" {
		t.Fatalf("no sbx_preview cookie set: %v", resp.Header["Set-Cookie"])
	}
	resp, body = previewGet(t, hc, u+"i.txt", http.Header{"Cookie": {cookie}})
	if resp.StatusCode != http.StatusOK || body != "hi\n" {
		t.Errorf("private with cookie: %d %q, want 200 hi", resp.StatusCode, body)
	}

	// what reaches the app: no Authorization, no sbx token or cookie
	py := d.newSandbox(t, "--template", "base")
	d.must(t, "exec", py, "--detach", "--", "python3", "-c", headerEcho)
	pyURL := strings.TrimSpace(d.must(t, "preview", py, "8000"))
	var seen struct {
		Headers map[string]string `json:"headers"`
		Path    string            `json:"path"`
	}
	hdr := http.Header{"Authorization": {"Bearer " + d.token}, "Cookie": {"app=1; sbx_preview=x"}, "X-Test": {"kept"}}
	waitFor(t, "the python server through the proxy", 30*time.Second, func() bool {
		resp, body := previewGet(t, hc, pyURL+"p?a=1&sbx_token=x", hdr)
		return resp.StatusCode == http.StatusOK && json.Unmarshal([]byte(body), &seen) == nil
	})
	if a, ok := seen.Headers["authorization"]; ok {
		t.Errorf("the caller's Authorization reached the sandbox: %q", a)
	}
	if seen.Headers["cookie"] != "app=1" || seen.Headers["x-test"] != "kept" || seen.Path != "/p?a=1" {
		t.Errorf("the app saw cookie %q, x-test %q, path %q; want app=1, kept, /p?a=1", seen.Headers["cookie"], seen.Headers["x-test"], seen.Path)
	}
}

// BenchmarkPreviewProxy: GETs of a small file from busybox httpd in a
// sandbox, through the preview proxy against straight into the sandbox's
// namespace (netns Dial, as sbxd dials), 8 at a time, in the same run.
func BenchmarkPreviewProxy(b *testing.B) {
	d, addr := previewDaemon(b)
	ctx := context.Background()
	sb, err := d.client.Create(ctx)
	if err != nil {
		b.Fatal(err)
	}
	defer deleteSandbox(ctx, d.client, sb.ID)
	if _, err := sdk(d.client).ExecDetached(ctx, sb.ID, api.ExecRequest{Cmd: []string{"sh", "-c", "mkdir -p /w && echo hi > /w/i.txt && exec httpd -f -p 8080 -h /w"}}); err != nil {
		b.Fatal(err)
	}
	if _, err := d.client.Sandbox(sb.ID).Preview(ctx, 8080); err != nil {
		b.Fatal(err)
	}
	nm, err := netns.New(netns.Config{Tag: d.tag})
	if err != nil {
		b.Fatal(err)
	}
	_, proxyPort, _ := net.SplitHostPort(addr)
	u := fmt.Sprintf("http://8080-%s.localhost:%s/i.txt", sb.ID, proxyPort)
	hc := proxyClient(addr)
	viaProxy := func() error {
		resp, err := hc.Get(u)
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != http.StatusOK || string(body) != "hi\n" {
			return fmt.Errorf("proxy: %d %q", resp.StatusCode, body)
		}
		return nil
	}
	direct := func() error {
		c, err := nm.Dial(ctx, sb.ID, 8080)
		if err != nil {
			return err
		}
		defer c.Close()
		fmt.Fprintf(c, "GET /i.txt HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != http.StatusOK || string(body) != "hi\n" {
			return fmt.Errorf("direct: %d %q", resp.StatusCode, body)
		}
		return nil
	}
	deadline := time.Now().Add(20 * time.Second)
	for viaProxy() != nil {
		if time.Now().After(deadline) {
			b.Fatalf("httpd never answered through the proxy: %v", viaProxy())
		}
		time.Sleep(50 * time.Millisecond)
	}
	const perRound, workers = 400, 8
	var px, dx []time.Duration
	var pTime, dTime time.Duration
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		lat, took := previewLoad(b, viaProxy, perRound, workers)
		px, pTime = append(px, lat...), pTime+took
		lat, took = previewLoad(b, direct, perRound, workers)
		dx, dTime = append(dx, lat...), dTime+took
	}
	b.StopTimer()
	if b.N == 1 {
		return
	}
	prps, drps := float64(len(px))/pTime.Seconds(), float64(len(dx))/dTime.Seconds()
	b.ReportMetric(prps, "proxy-req/s")
	b.ReportMetric(drps, "direct-req/s")
	b.ReportMetric(prps/drps, "ratio")
	fmt.Printf("preview proxy   %7.0f req/s  p50 %6.2f ms  p99 %6.2f ms\n", prps, millis(percentile(px, 50)), millis(percentile(px, 99)))
	fmt.Printf("direct (netns)  %7.0f req/s  p50 %6.2f ms  p99 %6.2f ms\n", drps, millis(percentile(dx, 50)), millis(percentile(dx, 99)))
	fmt.Printf("throughput ratio proxy/direct %.2f  (%d requests each, %d at a time)\n", prps/drps, len(px), workers)
}

// previewLoad runs n calls of f on workers goroutines; it returns each call's
// latency and the wall time of all.
func previewLoad(b *testing.B, f func() error, n, workers int) ([]time.Duration, time.Duration) {
	lat := make([]time.Duration, n)
	var next int
	var mu sync.Mutex
	var wg sync.WaitGroup
	var firstErr error
	start := time.Now()
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				mu.Lock()
				i := next
				next++
				mu.Unlock()
				if i >= n {
					return
				}
				t0 := time.Now()
				err := f()
				lat[i] = time.Since(t0)
				if err != nil {
					mu.Lock()
					firstErr = err
					mu.Unlock()
				}
			}
		}()
	}
	wg.Wait()
	if firstErr != nil {
		b.Fatal(firstErr)
	}
	return lat, time.Since(start)
}

func percentile(ds []time.Duration, p int) time.Duration {
	s := append([]time.Duration(nil), ds...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	return s[(len(s)-1)*p/100]
}

func millis(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
