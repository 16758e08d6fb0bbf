package client

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
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
	json.NewEncoder(w).Encode(api.ErrorBody{Error: api.ErrorDetail{Code: code, Message: msg}})
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
			_, err := c.Get(context.Background(), "sb_x")
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
	req := api.ExecRequest{Cmd: []string{"sh", "-c", "x"}, Timeout: "5s", Detach: true}
	x, err := c.Exec(context.Background(), "sb_1", req, &stdout, &stderr)
	if err != nil {
		t.Fatal(err)
	}
	if x.ExitCode == nil || *x.ExitCode != 3 {
		t.Errorf("got exit %v, want 3", x.ExitCode)
	}
	if stdout.String() != "out1\nout2\n" || stderr.String() != "err\n" {
		t.Errorf("got stdout %q stderr %q", stdout.String(), stderr.String())
	}
	req.Detach = false
	if diff := cmp.Diff(req, got); diff != "" {
		t.Errorf("request (-want +got):\n%s", diff)
	}
}

func TestExecStreamErrors(t *testing.T) {
	tests := []struct {
		name  string
		write func(w io.Writer)
		want  string
	}{
		{"no exit", func(w io.Writer) {
			sse(w, "stdout", api.ExecEvent{Data: []byte("x")})
		}, "ended before"},
		{"error event", func(w io.Writer) {
			sse(w, "error", api.ExecEvent{Error: "agent died"})
		}, "agent died"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := newTest(t, func(w http.ResponseWriter, r *http.Request) { tc.write(w) })
			_, err := c.Exec(context.Background(), "sb_1", api.ExecRequest{Cmd: []string{"x"}}, nil, nil)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("got %v, want an error containing %q", err, tc.want)
			}
		})
	}
}

func TestExecDetached(t *testing.T) {
	c := newTest(t, func(w http.ResponseWriter, r *http.Request) {
		var req api.ExecRequest
		json.NewDecoder(r.Body).Decode(&req)
		if !req.Detach {
			t.Error("Detach not set")
		}
		w.WriteHeader(http.StatusCreated)
		json.NewEncoder(w).Encode(api.Exec{ID: "ex_2", Pid: 42, State: api.ExecRunning})
	})
	x, err := c.ExecDetached(context.Background(), "sb_1", api.ExecRequest{Cmd: []string{"sleep", "9"}})
	if err != nil || x.ID != "ex_2" || x.Pid != 42 {
		t.Fatalf("got %+v, %v", x, err)
	}
}

func TestExecOutput(t *testing.T) {
	for _, ended := range []bool{true, false} {
		t.Run(fmt.Sprint("ended=", ended), func(t *testing.T) {
			c := newTest(t, func(w http.ResponseWriter, r *http.Request) {
				if r.URL.Path != "/v1/sandboxes/sb_1/execs/ex_1/output" || r.URL.Query().Get("follow") != "1" {
					t.Errorf("got %s", r.URL)
				}
				sse(w, "stdout", api.ExecEvent{Data: []byte("kept")})
				if ended {
					sse(w, "exit", api.ExecEvent{Exec: &api.Exec{ID: "ex_1", ExitCode: intp(0)}})
				}
			})
			var out bytes.Buffer
			x, err := c.ExecOutput(context.Background(), "sb_1", "ex_1", true, &out, nil)
			if err != nil || out.String() != "kept" || (x != nil) != ended {
				t.Fatalf("got %+v, %v, output %q", x, err, out.String())
			}
		})
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
	if err := c.WriteFile(context.Background(), "sb_1", "/tmp/a b&c", r, int64(len(content)), 0o755); err != nil {
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
	if _, err := c.Get(context.Background(), "a/b c"); err != nil {
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
		WithMeta("a", "1"), WithMeta("b", "2"), WithCPUs(1.5), WithMemoryString("512M"))
	if err != nil || sb.ID != "sb_new" {
		t.Fatalf("got %+v, %v", sb, err)
	}
	want := api.CreateRequest{Template: "tiny", Name: "n", TTL: "30m0s", Meta: map[string]string{"a": "1", "b": "2"}, CPUs: 1.5, Memory: "512M"}
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
		{"failed", []api.Progress{{Event: "step", Message: "x"}, {Event: "error", Error: "mmdebstrap failed"}}, "mmdebstrap failed"},
		{"cut", []api.Progress{{Event: "step", Message: "x"}}, "ended before"},
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
			tpl, err := c.BuildTemplate(context.Background(), "base", true, func(p api.Progress) { got = append(got, p) })
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

func TestImportTemplateStreams(t *testing.T) {
	var te []string
	var body []byte
	c := newTest(t, func(w http.ResponseWriter, r *http.Request) {
		te = r.TransferEncoding
		body, _ = io.ReadAll(r.Body)
		sse(w, "done", api.Progress{Done: true, Template: &api.Template{Name: "mine"}})
	})
	if _, err := c.ImportTemplate(context.Background(), "mine", strings.NewReader("tarbytes"), nil); err != nil {
		t.Fatal(err)
	}
	if string(body) != "tarbytes" || len(te) != 1 || te[0] != "chunked" {
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
		{"exec", func(m, c string) any { return api.ExecEvent{Event: "error", Error: m, Code: c} },
			func(c *Client) error {
				_, err := c.Exec(ctx, "sb_1", api.ExecRequest{Cmd: []string{"x"}}, nil, nil)
				return err
			}, "/v1/sandboxes/sb_1/exec"},
		{"exec output", func(m, c string) any { return api.ExecEvent{Event: "error", Error: m, Code: c} },
			func(c *Client) error { _, err := c.ExecOutput(ctx, "sb_1", "ex_1", true, nil, nil); return err }, "/v1/sandboxes/sb_1/execs/ex_1/output"},
		{"fork", func(m, c string) any { return api.ForkEvent{Event: "error", Error: m, Code: c} },
			func(c *Client) error {
				return c.ForkEvents(ctx, "sb_1", api.ForkRequest{}, func(api.ForkEvent) error { return nil })
			}, "/v1/sandboxes/sb_1/fork"},
		{"logs", func(m, c string) any { return api.StreamErrorBody{Error: m, Code: c} },
			func(c *Client) error { return c.Logs(ctx, "sb_1", func(api.LogEvent) error { return nil }) }, "/v1/sandboxes/sb_1/logs"},
		{"events", func(m, c string) any { return api.StreamErrorBody{Error: m, Code: c} },
			func(c *Client) error { return c.Events(ctx, "sb_1", true, func(api.Event) error { return nil }) }, "/v1/sandboxes/sb_1/events"},
		{"template build", func(m, c string) any { return api.Progress{Event: "error", Error: m, Code: c} },
			func(c *Client) error { _, err := c.BuildTemplate(ctx, "base", false, nil); return err }, "/v1/templates/base/build"},
	}
	for _, s := range streams {
		for _, k := range kinds {
			t.Run(s.name+"/"+k.code, func(t *testing.T) {
				c := newTest(t, func(w http.ResponseWriter, r *http.Request) {
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
