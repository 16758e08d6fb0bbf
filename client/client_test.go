package client

import (
	"archive/tar"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"syscall"
	"testing"
	"testing/iotest"
	"time"

	"github.com/google/go-cmp/cmp"
	"sbx.dev/sbx/api"
)

// newTest returns a client of a fake sbxd answering with h.
func newTest(t *testing.T, h http.HandlerFunc) *Client {
	t.Helper()
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	c, err := New("tcp://"+strings.TrimPrefix(srv.URL, "http://"), WithToken("tok"))
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func writeErr(w http.ResponseWriter, kind error, msg string) {
	status, code := api.StatusOf(kind)
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(api.ErrorBody{Error: &api.ErrorDetail{Code: code, Message: msg}})
}

// errFrame is the envelope of a stream's "error" event.
func errFrame(msg, code string) api.ErrorBody {
	return api.ErrorBody{Error: &api.ErrorDetail{Code: code, Message: msg}}
}

func sse(w io.Writer, name string, v any) {
	b, _ := json.Marshal(v)
	fmt.Fprintf(w, "event: %s\ndata: %s\n\n", name, b)
	if f, ok := w.(http.Flusher); ok {
		f.Flush()
	}
}

func TestNewHost(t *testing.T) {
	t.Setenv("SBX_HOST", "")
	t.Setenv("SBX_TOKEN", "envtok")
	tests := []struct {
		name, host, wantBase string
		wantErr              bool
	}{
		{"default", "", "http://sbxd", false},
		{"unix", "unix:///tmp/x.sock", "http://sbxd", false},
		{"tcp", "tcp://127.0.0.1:7000", "http://127.0.0.1:7000", false},
		{"no scheme", "127.0.0.1:7000", "", true},
		{"bad scheme", "ftp://x", "", true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c, err := New(tc.host)
			if tc.wantErr {
				if !errors.Is(err, api.ErrInvalid) {
					t.Fatalf("got %v, want ErrInvalid", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if c.base != tc.wantBase || c.token != "envtok" {
				t.Errorf("got base %q token %q, want %q envtok", c.base, c.token, tc.wantBase)
			}
		})
	}
}

func TestErrorKinds(t *testing.T) {
	for _, kind := range kinds {
		t.Run(kind.Error(), func(t *testing.T) {
			c := newTest(t, func(w http.ResponseWriter, r *http.Request) {
				writeErr(w, kind, "sandbox sb_x is broken")
			})
			_, err := c.Sandbox("sb_x").Info(context.Background())
			if !errors.Is(err, kind) {
				t.Fatalf("got %v, want errors.Is %v", err, kind)
			}
			for _, other := range kinds {
				if other != kind && errors.Is(err, other) {
					t.Errorf("error also matches %v", other)
				}
			}
			var ae *api.Error
			if !errors.As(err, &ae) || ae.Message != "sandbox sb_x is broken" {
				t.Errorf("got %#v, want *api.Error with the server's message", err)
			}
		})
	}
}

func TestErrorNotJSON(t *testing.T) {
	tests := []struct {
		status int
		want   error
	}{
		{404, api.ErrNotFound},
		{503, api.ErrUnavailable},
		{405, api.ErrInvalid},
		{502, api.ErrInternal},
	}
	for _, tc := range tests {
		t.Run(fmt.Sprint(tc.status), func(t *testing.T) {
			c := newTest(t, func(w http.ResponseWriter, r *http.Request) {
				http.Error(w, "plain text", tc.status)
			})
			_, err := c.List(context.Background())
			var ae *api.Error
			if !errors.Is(err, tc.want) || !errors.As(err, &ae) || ae.Status != tc.status {
				t.Fatalf("got %#v, want %v with status %d", err, tc.want, tc.status)
			}
			if !strings.Contains(ae.Message, "plain text") {
				t.Errorf("message %q does not carry the body", ae.Message)
			}
		})
	}
}

func TestUnreachable(t *testing.T) {
	c, err := New("unix://" + t.TempDir() + "/none.sock")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Health(context.Background()); !errors.Is(err, api.ErrUnavailable) {
		t.Fatalf("got %v, want ErrUnavailable", err)
	}
}

func TestSSE(t *testing.T) {
	big := strings.Repeat("A", 300<<10)
	tests := []struct {
		name string
		in   string
		want []sseEvent
	}{
		{"two", "event: a\ndata: 1\n\nevent: b\ndata: 2\n\n", []sseEvent{{"a", []byte("1")}, {"b", []byte("2")}}},
		{"crlf and comment", ": ping\r\n\r\nevent: a\r\ndata:x\r\n\r\n", []sseEvent{{"a", []byte("x")}}},
		{"multi data", "data: a\ndata: b\n\n", []sseEvent{{"", []byte("a\nb")}}},
		{"large", "event: big\ndata: " + big + "\n\n", []sseEvent{{"big", []byte(big)}}},
		{"cut off", "event: a\ndata: 1\n\nevent: b\ndata: 2", []sseEvent{{"a", []byte("1")}}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			// every event arrives split: one byte at a time, or in odd-sized chunks for the large one
			var in io.Reader = iotest.OneByteReader(strings.NewReader(tc.in))
			if len(tc.in) > 1000 {
				in = &chunkReader{r: strings.NewReader(tc.in), n: 4093}
			}
			r := newSSEReader(in)
			var got []sseEvent
			for {
				ev, err := r.next()
				if err == io.EOF {
					break
				}
				if err != nil {
					t.Fatal(err)
				}
				got = append(got, ev)
			}
			if diff := cmp.Diff(tc.want, got, cmp.AllowUnexported(sseEvent{})); diff != "" {
				t.Errorf("events (-want +got):\n%.500s", diff)
			}
		})
	}
}

func intp(i int) *int { return &i }

func TestExec(t *testing.T) {
	var got api.ExecRequest
	c := newTest(t, func(w http.ResponseWriter, r *http.Request) {
		if r.Method != "POST" || r.URL.Path != "/v1/sandboxes/sb_1/exec" || r.Header.Get("Authorization") != "Bearer tok" {
			t.Errorf("got %s %s %q", r.Method, r.URL.Path, r.Header.Get("Authorization"))
		}
		json.NewDecoder(r.Body).Decode(&got)
		w.Header().Set("Content-Type", "text/event-stream")
		sse(w, "started", api.ExecEvent{Event: "started", Exec: &api.Exec{ID: "ex_1", State: api.ExecRunning}})
		sse(w, "stdout", api.ExecEvent{Event: "stdout", Data: []byte("out1\n")})
		sse(w, "stderr", api.ExecEvent{Event: "stderr", Data: []byte("err\n")})
		sse(w, "stdout", api.ExecEvent{Event: "stdout", Data: []byte("out2\n")})
		sse(w, "exit", api.ExecEvent{Event: "exit", Exec: &api.Exec{ID: "ex_1", State: api.ExecExited, ExitCode: intp(3)}})
	})
	var stdout, stderr bytes.Buffer
	var events []string
	res, err := c.Sandbox("sb_1").Exec(context.Background(), Shell("x"), WithTimeout(5*time.Second), WithEnv("A=1"),
		WithCwd("/w"), WithUser("bob"), WithStdout(&stdout), WithStderr(&stderr),
		WithExecEvents(func(ev api.ExecEvent) error { events = append(events, ev.Event); return nil }))
	if err != nil {
		t.Fatal(err)
	}
	if res.ExitCode != 3 || !res.Exited() || res.ID != "ex_1" {
		t.Errorf("got %+v, want ex_1 exited 3", res)
	}
	if stdout.String() != "out1\nout2\n" || stderr.String() != "err\n" {
		t.Errorf("got stdout %q stderr %q", stdout.String(), stderr.String())
	}
	want := api.ExecRequest{Cmd: []string{"/bin/sh", "-c", "x"}, Timeout: api.Duration(5 * time.Second), Env: []string{"A=1"}, Cwd: "/w", User: "bob"}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("request (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]string{"started", "stdout", "stderr", "stdout", "exit"}, events); diff != "" {
		t.Errorf("events (-want +got):\n%s", diff)
	}
}

// An exec whose stream breaks returns what it knows (the exec's id, still
// running) with an error of kind unavailable that names the exec.
func TestExecStreamErrors(t *testing.T) {
	tests := []struct {
		name    string
		write   func(w io.Writer)
		want    string
		kind    error
		started bool
	}{
		{"cut after start", func(w io.Writer) {
			sse(w, "started", api.ExecEvent{Exec: &api.Exec{ID: "ex_9", SandboxID: "sb_1", State: api.ExecRunning}})
			sse(w, "stdout", api.ExecEvent{Data: []byte("x")})
		}, "ex_9 goes on", api.ErrUnavailable, true},
		{"cut before start", func(w io.Writer) {}, "broke", api.ErrUnavailable, false},
		{"error event", func(w io.Writer) {
			sse(w, "started", api.ExecEvent{Exec: &api.Exec{ID: "ex_9", State: api.ExecRunning}})
			sse(w, "error", api.ExecEvent{ErrorBody: errFrame("agent died", "internal")})
		}, "agent died", api.ErrInternal, true},
		{"shutting down", func(w io.Writer) {
			sse(w, "started", api.ExecEvent{Exec: &api.Exec{ID: "ex_9", State: api.ExecRunning}})
			sse(w, "error", api.ExecEvent{ErrorBody: errFrame("sbxd is shutting down", "unavailable")})
		}, "ex_9 goes on", api.ErrUnavailable, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := newTest(t, func(w http.ResponseWriter, r *http.Request) { tc.write(w) })
			res, err := c.Sandbox("sb_1").Exec(context.Background(), []string{"x"})
			if err == nil || !strings.Contains(err.Error(), tc.want) || !errors.Is(err, tc.kind) {
				t.Fatalf("got %v, want an error of kind %v containing %q", err, tc.kind, tc.want)
			}
			if !tc.started {
				return
			}
			if res == nil || res.ID != "ex_9" || res.State != api.ExecRunning || res.ExitCode != -1 {
				t.Errorf("got %+v, want what is known: ex_9 running", res)
			}
			var se *StreamError
			if tc.kind == api.ErrUnavailable && (!errors.As(err, &se) || se.ExecID != "ex_9") {
				t.Errorf("got %#v, want a *StreamError naming ex_9", err)
			}
		})
	}
}

// Cancelling an exec stops the waiting, not the command: the Result names it.
func TestExecCancel(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	c := newTest(t, func(w http.ResponseWriter, r *http.Request) {
		sse(w, "started", api.ExecEvent{Exec: &api.Exec{ID: "ex_5", State: api.ExecRunning}})
		<-r.Context().Done()
	})
	res, err := c.Sandbox("sb_1").Exec(ctx, []string{"sleep", "100"}, WithExecEvents(func(ev api.ExecEvent) error {
		cancel() // once it has started
		return nil
	}))
	if !errors.Is(err, context.Canceled) || !strings.Contains(err.Error(), "goes on") {
		t.Fatalf("got %v, want context.Canceled saying the command goes on", err)
	}
	if res == nil || res.ID != "ex_5" || res.State != api.ExecRunning {
		t.Errorf("got %+v, want ex_5 running", res)
	}
}

func TestStart(t *testing.T) {
	c := newTest(t, func(w http.ResponseWriter, r *http.Request) {
		var req api.ExecRequest
		json.NewDecoder(r.Body).Decode(&req)
		if !req.Detach {
			t.Error("Detach not set")
		}
		w.WriteHeader(http.StatusCreated)
		json.NewEncoder(w).Encode(api.Exec{ID: "ex_2", Pid: 42, State: api.ExecRunning})
	})
	p, err := c.Sandbox("sb_1").Start(context.Background(), []string{"sleep", "9"})
	if err != nil || p.ID != "ex_2" || p.Pid != 42 || p.SandboxID != "sb_1" {
		t.Fatalf("got %+v, %v", p, err)
	}
}

// Wait delivers each output byte once, across a stream that broke and a
// Wait again, which starts from the start.
func TestWaitOnce(t *testing.T) {
	calls := 0
	c := newTest(t, func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/v1/sandboxes/sb_1/execs/ex_1/output" || r.URL.Query().Get("follow") != "1" {
			t.Errorf("got %s", r.URL)
		}
		calls++
		sse(w, "stdout", api.ExecEvent{Data: []byte("abc")})
		sse(w, "stderr", api.ExecEvent{Data: []byte("E")})
		if calls == 1 {
			return // broken
		}
		sse(w, "stdout", api.ExecEvent{Data: []byte("def")})
		sse(w, "exit", api.ExecEvent{Exec: &api.Exec{ID: "ex_1", State: api.ExecExited, ExitCode: intp(0)}})
	})
	var out, errOut bytes.Buffer
	p := c.Sandbox("sb_1").Process("ex_1")
	res, err := p.Wait(context.Background(), WithStdout(&out), WithStderr(&errOut))
	var se *StreamError
	if !errors.As(err, &se) || se.ExecID != "ex_1" || res.State != api.ExecRunning {
		t.Fatalf("first wait: got %+v, %v; want a StreamError naming ex_1", res, err)
	}
	res, err = p.Wait(context.Background())
	if err != nil || res.ExitCode != 0 {
		t.Fatalf("second wait: got %+v, %v", res, err)
	}
	if out.String() != "abcdef" || errOut.String() != "E" {
		t.Errorf("got stdout %q stderr %q, want each byte once: abcdef and E", out.String(), errOut.String())
	}
}

func TestOutput(t *testing.T) {
	for _, ended := range []bool{true, false} {
		t.Run(fmt.Sprint("ended=", ended), func(t *testing.T) {
			c := newTest(t, func(w http.ResponseWriter, r *http.Request) {
				if r.URL.Path == "/v1/sandboxes/sb_1/execs/ex_1" {
					json.NewEncoder(w).Encode(api.Exec{ID: "ex_1", State: api.ExecRunning, Pid: 3})
					return
				}
				if r.URL.Path != "/v1/sandboxes/sb_1/execs/ex_1/output" || r.URL.Query().Get("follow") != "" {
					t.Errorf("got %s", r.URL)
				}
				sse(w, "stdout", api.ExecEvent{Data: []byte("kept")})
				if ended {
					sse(w, "exit", api.ExecEvent{Exec: &api.Exec{ID: "ex_1", State: api.ExecExited, ExitCode: intp(0)}})
				} else {
					sse(w, "eof", api.ExecEvent{})
				}
			})
			var out bytes.Buffer
			res, err := c.Sandbox("sb_1").Process("ex_1").Output(context.Background(), WithStdout(&out))
			if err != nil || out.String() != "kept" || res.Exited() != ended {
				t.Fatalf("got %+v, %v, output %q", res, err, out.String())
			}
		})
	}
}

func TestSignal(t *testing.T) {
	var got []string
	c := newTest(t, func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		got = append(got, r.Method+" "+r.URL.Path+" "+string(b))
		if strings.Contains(r.URL.Path, "ex_gone") {
			writeErr(w, api.ErrConflict, "exec ex_gone has ended")
			return
		}
		w.WriteHeader(http.StatusNoContent)
	})
	sb := c.Sandbox("sb_1")
	if err := sb.Process("ex_1").Kill(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := sb.Process("ex_1").Signal(context.Background(), syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	if err := sb.Process("ex_gone").Kill(context.Background()); !errors.Is(err, api.ErrConflict) {
		t.Errorf("got %v, want ErrConflict", err)
	}
	if err := sb.Process("ex_1").Signal(context.Background(), 0); !errors.Is(err, api.ErrInvalid) {
		t.Errorf("signal 0: got %v, want ErrInvalid", err)
	}
	want := []string{
		`POST /v1/sandboxes/sb_1/execs/ex_1/signal {"signal":9}`,
		`POST /v1/sandboxes/sb_1/execs/ex_1/signal {"signal":2}`,
		`POST /v1/sandboxes/sb_1/execs/ex_gone/signal {"signal":9}`,
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("requests (-want +got):\n%s", diff)
	}
}

func TestWriteFile(t *testing.T) {
	content := bytes.Repeat([]byte("0123456789"), 100_000)
	var gotLen int64
	var gotBody []byte
	var gotQuery string
	c := newTest(t, func(w http.ResponseWriter, r *http.Request) {
		gotLen = r.ContentLength
		gotQuery = r.URL.RawQuery
		gotBody, _ = io.ReadAll(r.Body)
		w.WriteHeader(http.StatusNoContent)
	})
	// a reader that is not a *bytes.Reader, so net/http cannot size it itself
	r := io.MultiReader(bytes.NewReader(content))
	if err := c.Sandbox("sb_1").Files().Write(context.Background(), "/tmp/a b&c", r, int64(len(content)), WithMode(0o755)); err != nil {
		t.Fatal(err)
	}
	if gotLen != int64(len(content)) || !bytes.Equal(gotBody, content) {
		t.Errorf("got Content-Length %d and %d bytes, want %d", gotLen, len(gotBody), len(content))
	}
	if gotQuery != "mode=0755&path=%2Ftmp%2Fa+b%26c" {
		t.Errorf("got query %q", gotQuery)
	}
}

func TestPathEscape(t *testing.T) {
	var got string
	c := newTest(t, func(w http.ResponseWriter, r *http.Request) {
		got = r.URL.EscapedPath()
		json.NewEncoder(w).Encode(api.Sandbox{ID: "x"})
	})
	if _, err := c.Sandbox("a/b c").Info(context.Background()); err != nil {
		t.Fatal(err)
	}
	if want := "/v1/sandboxes/a%2Fb%20c"; got != want {
		t.Errorf("got %q, want %q", got, want)
	}
}

func TestCreate(t *testing.T) {
	var got api.CreateRequest
	c := newTest(t, func(w http.ResponseWriter, r *http.Request) {
		json.NewDecoder(r.Body).Decode(&got)
		w.WriteHeader(http.StatusCreated)
		json.NewEncoder(w).Encode(api.Sandbox{ID: "sb_new"})
	})
	sb, err := c.Create(context.Background(), WithTemplate("tiny"), WithName("n"), WithTTL(30*time.Minute),
		WithMeta("a", "1"), WithMeta("b", "2"), WithCPUs(1.5), WithMemoryLimit(512<<20), WithDiskLimit(1<<30),
		WithPidsLimit(100), WithNetwork(NetworkNone))
	if err != nil || sb.ID != "sb_new" {
		t.Fatalf("got %+v, %v", sb, err)
	}
	want := api.CreateRequest{Template: "tiny", Name: "n", TTL: api.Duration(30 * time.Minute), Meta: map[string]string{"a": "1", "b": "2"}, CPUs: 1.5,
		Memory: "536870912", Disk: "1073741824", Pids: 100, Network: "none"}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("request (-want +got):\n%s", diff)
	}
}

func TestBuildTemplate(t *testing.T) {
	tests := []struct {
		name    string
		events  []api.Progress
		wantErr string
	}{
		{"done", []api.Progress{{Event: "step", Message: "debootstrap"}, {Event: "done", Done: true, Template: &api.Template{Name: "base", Size: 9}}}, ""},
		{"failed", []api.Progress{{Event: "step", Message: "x"}, {Event: "error", ErrorBody: errFrame("mmdebstrap failed", "")}}, "mmdebstrap failed"},
		{"cut", []api.Progress{{Event: "step", Message: "x"}}, "broke before its end"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := newTest(t, func(w http.ResponseWriter, r *http.Request) {
				if r.URL.Path != "/v1/templates/base/build" || r.URL.Query().Get("force") != "1" {
					t.Errorf("got %s", r.URL)
				}
				for _, p := range tc.events {
					sse(w, p.Event, p)
				}
			})
			var got []api.Progress
			tpl, err := c.BuildTemplate(context.Background(), "base", WithForce(), WithProgress(func(p api.Progress) { got = append(got, p) }))
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("got %v, want error %q", err, tc.wantErr)
				}
			} else if err != nil || tpl.Name != "base" {
				t.Fatalf("got %+v, %v", tpl, err)
			}
			wantEvents := tc.events
			if n := len(wantEvents); n > 0 && wantEvents[n-1].Event == "error" {
				wantEvents = wantEvents[:n-1] // the stream's error, not an event
			}
			if diff := cmp.Diff(wantEvents, got); diff != "" {
				t.Errorf("progress (-want +got):\n%s", diff)
			}
		})
	}
}

// TestImportRootfsStreams: a rootfs tar reaches sbxd as it is, chunked.
func TestImportRootfsStreams(t *testing.T) {
	var te []string
	var body []byte
	c := newTest(t, func(w http.ResponseWriter, r *http.Request) {
		te = r.TransferEncoding
		body, _ = io.ReadAll(r.Body)
		sse(w, "done", api.Progress{Done: true, Template: &api.Template{Name: "mine"}})
	})
	var tb bytes.Buffer
	tw := tar.NewWriter(&tb)
	tw.WriteHeader(&tar.Header{Name: "etc/", Typeflag: tar.TypeDir, Mode: 0o755})
	tw.Close()
	if _, err := c.ImportRootfs(context.Background(), "mine", bytes.NewReader(tb.Bytes())); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(body, tb.Bytes()) || len(te) != 1 || te[0] != "chunked" {
		t.Errorf("got body %q transfer-encoding %v", body, te)
	}
}

// chunkReader reads at most n bytes at a time.
type chunkReader struct {
	r io.Reader
	n int
}

func (c *chunkReader) Read(p []byte) (int, error) {
	if len(p) > c.n {
		p = p[:c.n]
	}
	return c.r.Read(p)
}

// TestEveryStreamErrorKind: every stream ends an error the same way, and the
// error keeps its kind, whichever call reads it.
func TestEveryStreamErrorKind(t *testing.T) {
	kinds := []struct {
		code string
		kind error
	}{
		{"not_found", api.ErrNotFound}, {"conflict", api.ErrConflict}, {"invalid", api.ErrInvalid},
		{"unavailable", api.ErrUnavailable}, {"internal", api.ErrInternal},
	}
	// each stream's own "error" event, as the server writes it
	type stream struct {
		name  string
		event func(msg, code string) any
		call  func(c *Client) error
		path  string
	}
	ctx := context.Background()
	streams := []stream{
		{"exec", func(m, c string) any { return api.ExecEvent{Event: "error", ErrorBody: errFrame(m, c)} },
			func(c *Client) error {
				_, err := c.Sandbox("sb_1").Exec(ctx, []string{"x"})
				return err
			}, "/v1/sandboxes/sb_1/exec"},
		{"exec output", func(m, c string) any { return api.ExecEvent{Event: "error", ErrorBody: errFrame(m, c)} },
			func(c *Client) error { _, err := c.Sandbox("sb_1").Process("ex_1").Wait(ctx); return err }, "/v1/sandboxes/sb_1/execs/ex_1/output"},
		{"fork", func(m, c string) any { return api.ForkEvent{Event: "error", ErrorBody: errFrame(m, c)} },
			func(c *Client) error { _, err := c.Sandbox("sb_1").Fork(ctx); return err }, "/v1/sandboxes/sb_1/fork"},
		{"logs", func(m, c string) any { return errFrame(m, c) },
			func(c *Client) error { return c.Sandbox("sb_1").Logs(ctx, func(api.LogEvent) error { return nil }) }, "/v1/sandboxes/sb_1/logs"},
		{"events", func(m, c string) any { return errFrame(m, c) },
			func(c *Client) error {
				return c.Sandbox("sb_1").Events(ctx, func(api.Event) error { return nil }, Follow())
			}, "/v1/sandboxes/sb_1/events"},
		{"template build", func(m, c string) any { return api.Progress{Event: "error", ErrorBody: errFrame(m, c)} },
			func(c *Client) error { _, err := c.BuildTemplate(ctx, "base"); return err }, "/v1/templates/base/build"},
	}
	for _, s := range streams {
		for _, k := range kinds {
			t.Run(s.name+"/"+k.code, func(t *testing.T) {
				c := newTest(t, func(w http.ResponseWriter, r *http.Request) {
					if r.Method == "DELETE" {
						writeErr(w, api.ErrNotFound, "gone") // a failed fork's undo
						return
					}
					if r.URL.Path != s.path {
						t.Errorf("got %s, want %s", r.URL.Path, s.path)
					}
					sse(w, "error", s.event("it went wrong", k.code))
				})
				err := s.call(c)
				if !errors.Is(err, k.kind) {
					t.Errorf("got %v, want an error of kind %v", err, k.kind)
				}
				if err == nil || !strings.Contains(err.Error(), "it went wrong") {
					t.Errorf("got %v, want the server's message", err)
				}
				for _, other := range kinds {
					if other.kind != k.kind && errors.Is(err, other.kind) {
						t.Errorf("error %v is also of kind %v", err, other.kind)
					}
				}
			})
		}
	}
}

// TestImportImageSteps: the config is posted with its source and force; a
// "missing" answer returns the layers to send, not an error; a layer is
// streamed to its diff ID.
func TestImportImageSteps(t *testing.T) {
	var posts []api.ImageImport
	var layer []byte
	var layerPath string
	c := newTest(t, func(w http.ResponseWriter, r *http.Request) {
		switch {
		case r.Method == http.MethodPost && r.URL.Path == "/v1/templates/app/image":
			var req api.ImageImport
			json.NewDecoder(r.Body).Decode(&req)
			posts = append(posts, req)
			if layer == nil {
				sse(w, "missing", api.Progress{Missing: []string{"sha256:aa"}})
				return
			}
			sse(w, "progress", api.Progress{Message: "stacking"})
			sse(w, "done", api.Progress{Done: true, Template: &api.Template{Name: "app", Version: "sha256:cfg"}})
		case r.Method == http.MethodPut && strings.HasPrefix(r.URL.Path, "/v1/layers/"):
			layerPath = r.URL.Path
			layer, _ = io.ReadAll(r.Body)
			sse(w, "done", api.Progress{Done: true})
		default:
			http.NotFound(w, r)
		}
	})
	ctx := context.Background()
	var msgs []string
	progress := WithProgress(func(p api.Progress) { msgs = append(msgs, p.Event+":"+p.Message) })
	tpl, missing, err := c.ImportImageConfig(ctx, "app", []byte(`{"os":"linux"}`), "oci:/x", WithForce(), progress)
	if err != nil || tpl != nil || len(missing) != 1 || missing[0] != "sha256:aa" {
		t.Fatalf("first post: %+v, %v, %v; want missing [sha256:aa]", tpl, missing, err)
	}
	if err := c.UploadLayer(ctx, "sha256:aa", strings.NewReader("layer bytes"), progress); err != nil {
		t.Fatal(err)
	}
	if string(layer) != "layer bytes" || layerPath != "/v1/layers/sha256:aa" {
		t.Errorf("layer %q at %s, want %q at /v1/layers/sha256:aa", layer, layerPath, "layer bytes")
	}
	tpl, missing, err = c.ImportImageConfig(ctx, "app", []byte(`{"os":"linux"}`), "oci:/x", WithForce(), progress)
	if err != nil || tpl == nil || tpl.Version != "sha256:cfg" || missing != nil {
		t.Fatalf("second post: %+v, %v, %v; want the template", tpl, missing, err)
	}
	want := api.ImageImport{Config: []byte(`{"os":"linux"}`), Source: "oci:/x", Force: true}
	if diff := cmp.Diff([]api.ImageImport{want, want}, posts); diff != "" {
		t.Errorf("posts (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]string{"done:", "progress:stacking", "done:"}, msgs); diff != "" {
		t.Errorf("progress (-want +got):\n%s", diff)
	}
}
