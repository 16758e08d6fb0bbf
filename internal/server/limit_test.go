package server

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"
)

func TestConnBudget(t *testing.T) {
	tests := []struct {
		name          string
		nofile        uint64
		max           int
		api, preview  int
		wantReserveAt int // at least
	}{
		{"plenty", 1 << 20, 1024, 1024, 1024, 1 << 18},
		{"20000", 20000, 1024, 1024, 1024, 5000},
		{"2048", 2048, 1024, 490, 490, 512},
		{"1024", 1024, 1024, 149, 149, 512},
		{"tiny", 64, 1024, 8, 8, 32},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			api, preview, reserve := ConnBudget(tc.nofile, tc.max)
			if api != tc.api || preview != tc.preview || reserve < tc.wantReserveAt {
				t.Errorf("got api %d preview %d reserve %d, want %d %d and at least %d", api, preview, reserve, tc.api, tc.preview, tc.wantReserveAt)
			}
			if tc.nofile >= 1024 && uint64(api+2*preview+MaxIdleUpstream+reserve) > tc.nofile {
				t.Errorf("connections (%d + 2x%d + %d idle) and reserve %d exceed %d descriptors", api, preview, MaxIdleUpstream, reserve, tc.nofile)
			}
		})
	}
}

// limitedServer serves h behind a limiter of max connections.
func limitedServer(t *testing.T, max int, h http.Handler) (string, *ConnLimiter) {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	lim := NewConnLimiter("test", max, nil)
	srv := NewHTTPServer(h, lim)
	go srv.Serve(lim.Listener(l))
	t.Cleanup(func() { srv.Close() })
	return l.Addr().String(), lim
}

func dialT(t *testing.T, addr string) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	// a read or write that hangs fails the test (tests set nearer deadlines)
	c.SetDeadline(time.Now().Add(30 * time.Second))
	return c
}

// closedSoon reports whether the server closed c within a second.
func closedSoon(c net.Conn) bool {
	c.SetReadDeadline(time.Now().Add(time.Second))
	_, err := io.ReadAll(c)
	return err == nil // EOF: closed; a timeout: still open
}

func waitOpen(t *testing.T, lim *ConnLimiter, want int) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for lim.Open() != want && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	if got := lim.Open(); got != want {
		t.Fatalf("%d connections open, want %d", got, want)
	}
}

func waitWaiting(t *testing.T, lim *ConnLimiter, want int) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for lim.Waiting() != want && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	if got := lim.Waiting(); got != want {
		t.Fatalf("%d connections waiting, want %d", got, want)
	}
}

func getOn(c net.Conn, path string) (*http.Response, error) {
	fmt.Fprintf(c, "GET %s HTTP/1.1\r\nHost: x\r\n\r\n", path)
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	return http.ReadResponse(bufio.NewReader(c), nil)
}

func TestConnLimiterSheds(t *testing.T) {
	addr, lim := limitedServer(t, 3, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") }))
	// three that never finish their request: the oldest goes first
	// (each counted as waiting before the next dials: the server's hook
	// that queues a connection runs in its own goroutine)
	a := dialT(t, addr)
	a.Write([]byte("GET / HTTP/1.1\r\nHo"))
	waitWaiting(t, lim, 1)
	b := dialT(t, addr)
	waitWaiting(t, lim, 2)
	c := dialT(t, addr)
	waitWaiting(t, lim, 3)
	waitOpen(t, lim, 3)
	d := dialT(t, addr)
	resp, err := getOn(d, "/")
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("a new client at the limit: %v %v, want served", resp, err)
	}
	if !closedSoon(a) {
		t.Errorf("the oldest waiting connection was not shed")
	}
	// d is idle now (kept alive): the next one sheds b, the next oldest
	e := dialT(t, addr)
	if resp, err := getOn(e, "/"); err != nil || resp.StatusCode != 200 {
		t.Fatalf("second new client: %v %v", resp, err)
	}
	if !closedSoon(b) {
		t.Errorf("the next oldest waiting connection was not shed")
	}
	_ = c
	for _, x := range []net.Conn{c, d, e} {
		x.Close()
	}
	waitOpen(t, lim, 0)
}

func TestConnLimiterRefuses(t *testing.T) {
	hold, entered := make(chan struct{}), make(chan struct{}, 2)
	addr, lim := limitedServer(t, 2, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		entered <- struct{}{}
		<-hold
		io.WriteString(w, "ok")
	}))
	// two requests in flight: nothing to shed
	var busy []net.Conn
	for range 2 {
		c := dialT(t, addr)
		fmt.Fprintf(c, "GET / HTTP/1.1\r\nHost: x\r\n\r\n")
		busy = append(busy, c)
	}
	waitOpen(t, lim, 2)
	for range 2 { // both requests read: active
		select {
		case <-entered:
		case <-time.After(5 * time.Second):
			t.Fatal("the two requests did not reach the handler")
		}
	}
	x := dialT(t, addr)
	x.SetReadDeadline(time.Now().Add(5 * time.Second))
	b, _ := io.ReadAll(x)
	if !strings.HasPrefix(string(b), "HTTP/1.1 503") || !strings.Contains(string(b), "too many connections") {
		t.Errorf("at the limit with every connection busy: got %q, want a 503", b)
	}
	resp, err := http.ReadResponse(bufio.NewReader(strings.NewReader(string(b))), nil)
	if err != nil || resp.StatusCode != 503 {
		t.Errorf("the refusal is not a well-formed response: %v", err)
	} else if body, _ := io.ReadAll(resp.Body); !strings.Contains(string(body), "try again") {
		t.Errorf("refusal body %q", body)
	}
	close(hold)
	for _, c := range busy {
		c.SetReadDeadline(time.Now().Add(5 * time.Second))
		if resp, err := http.ReadResponse(bufio.NewReader(c), nil); err != nil || resp.StatusCode != 200 {
			t.Errorf("a busy request was disturbed: %v %v", resp, err)
		}
		c.Close()
	}
	waitOpen(t, lim, 0)
}

// TestConnLimiterHijacked: an upgraded connection is counted until it is
// closed, and never shed.
func TestConnLimiterHijacked(t *testing.T) {
	addr, lim := limitedServer(t, 1, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		conn, bw, err := http.NewResponseController(w).Hijack()
		if err != nil {
			return
		}
		bw.WriteString("HTTP/1.1 101 Switching Protocols\r\n\r\n")
		bw.Flush()
		io.Copy(conn, conn)
		conn.Close()
	}))
	h := dialT(t, addr)
	fmt.Fprintf(h, "GET / HTTP/1.1\r\nHost: x\r\n\r\n")
	h.SetReadDeadline(time.Now().Add(5 * time.Second))
	buf := make([]byte, len("HTTP/1.1 101 Switching Protocols\r\n\r\n"))
	if _, err := io.ReadFull(h, buf); err != nil {
		t.Fatal(err)
	}
	waitOpen(t, lim, 1)
	x := dialT(t, addr)
	x.SetReadDeadline(time.Now().Add(5 * time.Second))
	if b, _ := io.ReadAll(x); !strings.HasPrefix(string(b), "HTTP/1.1 503") {
		t.Errorf("with the one slot upgraded: got %q, want a 503", b)
	}
	h.Write([]byte("ping"))
	if _, err := io.ReadFull(h, buf[:4]); err != nil || string(buf[:4]) != "ping" {
		t.Errorf("the upgraded connection was disturbed: %q %v", buf[:4], err)
	}
	h.Close()
	waitOpen(t, lim, 0)
}

// TestBodyTimeout: a client that stalls in the middle of a body is dropped
// whether the handler reads the body or not; a response that streams long
// after a whole body is not cut.
func TestBodyTimeout(t *testing.T) {
	const d = 200 * time.Millisecond
	serve := func(h http.HandlerFunc) string {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		srv := &http.Server{Handler: bodyTimeout(h, d)}
		go srv.Serve(l)
		t.Cleanup(func() { srv.Close() })
		return l.Addr().String()
	}
	stalled := "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n0123456789"
	t.Run("handler reads", func(t *testing.T) {
		addr := serve(func(w http.ResponseWriter, r *http.Request) {
			if _, err := io.ReadAll(r.Body); err != nil {
				http.Error(w, err.Error(), http.StatusBadRequest)
				return
			}
			io.WriteString(w, "whole")
		})
		c := dialT(t, addr)
		c.Write([]byte(stalled))
		c.SetReadDeadline(time.Now().Add(5 * time.Second))
		start := time.Now()
		b, err := io.ReadAll(c)
		if err != nil || strings.Contains(string(b), "whole") || time.Since(start) > 3*time.Second {
			t.Errorf("got %q %v after %s, want the connection ended soon after %s", b, err, time.Since(start), d)
		}
	})
	t.Run("handler ignores", func(t *testing.T) {
		addr := serve(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ignored") })
		c := dialT(t, addr)
		c.Write([]byte(stalled))
		c.SetReadDeadline(time.Now().Add(5 * time.Second))
		b, err := io.ReadAll(c)
		if err != nil || !strings.Contains(string(b), "ignored") {
			t.Errorf("got %q %v, want the answer, then the connection ended", b, err)
		}
	})
	t.Run("a long stream after a whole body", func(t *testing.T) {
		addr := serve(func(w http.ResponseWriter, r *http.Request) {
			io.ReadAll(r.Body)
			for i := range 4 {
				fmt.Fprintf(w, "chunk %d\n", i)
				w.(http.Flusher).Flush()
				time.Sleep(2 * d) // tested: a response paced slower than the timeout goes on
			}
		})
		c := dialT(t, addr)
		fmt.Fprintf(c, "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n\r\nabc")
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			t.Fatal(err)
		}
		b, err := io.ReadAll(resp.Body)
		if err != nil || !strings.Contains(string(b), "chunk 3") {
			t.Errorf("got %q %v, want all four chunks", b, err)
		}
	})
}

// TestDropAfterReply: a client without the token that announces a body and
// never sends it is answered and disconnected at once, not held.
func TestDropAfterReply(t *testing.T) {
	s := New(Config{Manager: &fakeManager{}})
	addr, lim := limitedServer(t, 5, s.Handler("tok"))
	for range 20 {
		c := dialT(t, addr)
		c.Write([]byte("POST /v1/sandboxes HTTP/1.1\r\nHost: x\r\nContent-Length: 100000\r\n\r\n{"))
		c.SetReadDeadline(time.Now().Add(5 * time.Second))
		if b, _ := io.ReadAll(c); !strings.HasPrefix(string(b), "HTTP/1.1 401") {
			t.Fatalf("got %q, want a 401 and the end of the connection", b)
		}
	}
	waitOpen(t, lim, 0)
}
