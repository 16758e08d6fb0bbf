package sandbox

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"sbx.dev/sbx/api"
	"sbx.dev/sbx/internal/follow"
)

func TestTailStart(t *testing.T) {
	tests := []struct {
		name    string
		content string
		n       int
		want    string
	}{
		{"empty", "", 3, ""},
		{"fewer lines than asked", "a\nb\n", 5, "a\nb\n"},
		{"last line", "a\nb\nc\n", 1, "c\n"},
		{"last two", "a\nb\nc\n", 2, "b\nc\n"},
		{"unterminated last line counts", "a\nb\nc", 1, "c"},
		{"unterminated, two", "a\nb\nc", 2, "b\nc"},
		{"empty lines count", "a\n\n\n", 2, "\n\n"},
		{"exactly n", "a\nb\n", 2, "a\nb\n"},
		{"long file across chunks", strings.Repeat("x", 3*chunkSize) + "\nlast\n", 1, "last\n"},
		{"long last line", "a\n" + strings.Repeat("y", 2*chunkSize) + "\n", 1, strings.Repeat("y", 2*chunkSize) + "\n"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := strings.NewReader(tc.content)
			off, err := tailStart(r, int64(len(tc.content)), tc.n)
			if err != nil {
				t.Fatal(err)
			}
			if got := tc.content[off:]; got != tc.want {
				t.Errorf("got %q, want %q", short(got), short(tc.want))
			}
		})
	}
}

func short(s string) string {
	if len(s) > 40 {
		return s[:20] + "..." + s[len(s)-20:]
	}
	return s
}

func TestTailStartMatching(t *testing.T) {
	content := "hello\nW0102 15:04:05.000000   12 x.go:3] one\nuser\nW0102 15:04:05.000001   12 x.go:4] two\nbye\n"
	tests := []struct {
		name string
		n    int
		want string // the lines the runtime filter then sends
	}{
		{"last one", 1, "W0102 15:04:05.000001   12 x.go:4] two\n"},
		{"all", 5, "W0102 15:04:05.000000   12 x.go:3] one\nW0102 15:04:05.000001   12 x.go:4] two\n"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "console.log")
			os.WriteFile(path, []byte(content), 0o600)
			got := collect(t, []*logFile{{stream: "runtime", path: path, match: isRuntimeLine}}, false, tc.n, nil, nil)
			if got != tc.want {
				t.Errorf("got %q, want %q", got, tc.want)
			}
		})
	}
}

// collect runs followLogs and returns what it sent, in order; ended is
// looked at again when end is told.
func collect(t *testing.T, files []*logFile, following bool, tail int, ended func() (bool, error), end *follow.Broadcast) string {
	t.Helper()
	if ended == nil {
		ended = func() (bool, error) { return false, nil }
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var b strings.Builder
	err := followLogs(ctx, &follow.Files{}, files, following, tail, ended, time.Now, func(ev api.LogEvent) error {
		b.Write(ev.Data)
		return nil
	}, end.Wait)
	if err != nil {
		t.Fatalf("followLogs: %v", err)
	}
	return b.String()
}

func TestFollowLogs(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "console.log")
	if err := os.WriteFile(path, []byte("old 1\nold 2\nold 3\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Run("tail without follow", func(t *testing.T) {
		got := collect(t, []*logFile{{stream: "console", path: path}}, false, 2, nil, nil)
		if want := "old 2\nold 3\n"; got != want {
			t.Errorf("got %q, want %q", got, want)
		}
	})
	t.Run("missing file is empty", func(t *testing.T) {
		got := collect(t, []*logFile{{stream: "console", path: filepath.Join(dir, "none")}}, false, 0, nil, nil)
		if got != "" {
			t.Errorf("got %q, want nothing", got)
		}
	})
	t.Run("follow sends what comes until the end, in order", func(t *testing.T) {
		var done atomic.Bool
		var end follow.Broadcast
		go func() {
			f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND, 0)
			if err != nil {
				return
			}
			for i := range 5 {
				time.Sleep(20 * time.Millisecond) // lines arrive one at a time: the follower is tested on growth
				f.WriteString("new " + string(rune('a'+i)) + "\n")
			}
			f.Close()
			done.Store(true)
			end.Notify()
		}()
		got := collect(t, []*logFile{{stream: "console", path: path}}, true, 1, func() (bool, error) { return done.Load(), nil }, &end)
		if want := "old 3\nnew a\nnew b\nnew c\nnew d\nnew e\n"; got != want {
			t.Errorf("got %q, want %q", got, want)
		}
	})
	t.Run("follow ends with ctx", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 150*time.Millisecond)
		defer cancel()
		err := followLogs(ctx, &follow.Files{}, []*logFile{{stream: "console", path: path}}, true, 0,
			func() (bool, error) { return false, nil }, time.Now, func(api.LogEvent) error { return nil })
		if err != context.DeadlineExceeded {
			t.Errorf("got %v, want %v", err, context.DeadlineExceeded)
		}
	})
	t.Run("filter holds back a partial line until it ends", func(t *testing.T) {
		p := filepath.Join(dir, "partial.log")
		os.WriteFile(p, []byte("user\nrunsc: half"), 0o600)
		f := &logFile{stream: "runtime", path: p, match: isRuntimeLine}
		var got []string
		emit := func(ev api.LogEvent) error { got = append(got, string(ev.Data)); return nil }
		if _, err := f.drain(0, time.Now, emit); err != nil {
			t.Fatal(err)
		}
		if len(got) != 0 {
			t.Fatalf("sent %q before the line ended", got)
		}
		a, _ := os.OpenFile(p, os.O_WRONLY|os.O_APPEND, 0)
		a.WriteString(" done\nuser again\n")
		a.Close()
		if _, err := f.drain(0, time.Now, emit); err != nil {
			t.Fatal(err)
		}
		if want := []string{"runsc: half done\n"}; strings.Join(got, "|") != strings.Join(want, "|") {
			t.Errorf("got %q, want %q", got, want)
		}
	})
}

// events runs followLogs without follow and returns each event's data.
func events(t *testing.T, f *logFile, tail int) []string {
	t.Helper()
	var got []string
	err := followLogs(context.Background(), nil, []*logFile{f}, false, tail, nil, time.Now, func(ev api.LogEvent) error {
		got = append(got, string(ev.Data))
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return got
}

// runscLog is what runsc leaves in a sandbox's --log file: JSON objects back
// to back, without newlines, one with braces and quotes in its message.
const runscLog = `{"msg":"executing processes for container: \"nosuch\" not found","level":"error","time":"2026-11-30T11:53:22Z"}` +
	`{"msg":"odd } { \\\" text","level":"error","time":"2026-11-30T11:53:23Z"}` +
	`{"msg":"third","level":"warning","time":"2026-11-30T11:53:24Z"}` + "\n" +
	"plain text line\n" +
	`{"msg":"last","level":"error","time":"2026-11-30T11:53:25Z"}`

func TestLogLines(t *testing.T) {
	dir := t.TempDir()
	t.Run("runsc's objects, one a line", func(t *testing.T) {
		p := filepath.Join(dir, "runsc.log")
		os.WriteFile(p, []byte(runscLog), 0o600)
		got := events(t, &logFile{stream: "runtime", path: p, objects: true}, 0)
		if len(got) != 5 {
			t.Fatalf("got %d events %q, want 5 lines", len(got), got)
		}
		for i, line := range got {
			if !strings.HasSuffix(line, "\n") || strings.Count(line, "\n") != 1 {
				t.Errorf("event %d %q is not one line", i, line)
			}
			if strings.HasPrefix(line, "{") {
				var v map[string]any
				if err := json.Unmarshal([]byte(line), &v); err != nil {
					t.Errorf("event %d %q is not one JSON object: %v", i, line, err)
				}
			}
		}
		if got[3] != "plain text line\n" {
			t.Errorf("text line: got %q", got[3])
		}
	})
	t.Run("tail counts objects as lines", func(t *testing.T) {
		p := filepath.Join(dir, "runsc.log")
		os.WriteFile(p, []byte(runscLog), 0o600)
		got := events(t, &logFile{stream: "runtime", path: p, objects: true}, 2)
		if len(got) != 2 || got[0] != "plain text line\n" || !strings.Contains(got[1], `"last"`) {
			t.Errorf("tail 2: got %q", got)
		}
		got = events(t, &logFile{stream: "runtime", path: p, objects: true}, 4)
		if len(got) != 4 || !strings.Contains(got[0], `odd } {`) {
			t.Errorf("tail 4: got %q", got)
		}
	})
	t.Run("an object in pieces", func(t *testing.T) {
		var s jsonSplitter
		var out []byte
		for i := 0; i < len(runscLog); i += 7 {
			out = append(out, s.split([]byte(runscLog[i:min(i+7, len(runscLog))]))...)
		}
		if whole := (&jsonSplitter{}).split([]byte(runscLog)); string(out) != string(whole) {
			t.Errorf("in pieces:\n%s\nwhole:\n%s", out, whole)
		}
	})
	t.Run("plain lines, one event each", func(t *testing.T) {
		p := filepath.Join(dir, "console.log")
		os.WriteFile(p, []byte("a\nbb\n\nccc"), 0o600)
		got := events(t, &logFile{stream: "console", path: p}, 0)
		if want := []string{"a\n", "bb\n", "\n", "ccc"}; strings.Join(got, "|") != strings.Join(want, "|") {
			t.Errorf("got %q, want %q", got, want)
		}
	})
	t.Run("a prompt shows once it has waited", func(t *testing.T) {
		p := filepath.Join(dir, "prompt.log")
		os.WriteFile(p, []byte("Password: "), 0o600)
		clock := time.Unix(1000, 0)
		now := func() time.Time { return clock }
		f := &logFile{stream: "console", path: p}
		var got []string
		emit := func(ev api.LogEvent) error { got = append(got, string(ev.Data)); return nil }
		f.drain(0, now, emit)
		f.flush(false, now, emit)
		if len(got) != 0 {
			t.Fatalf("sent %q at once", got)
		}
		clock = clock.Add(partialWait)
		f.flush(false, now, emit)
		if strings.Join(got, "|") != "Password: " {
			t.Errorf("got %q, want the prompt", got)
		}
	})
	t.Run("a long line is sent in bounded pieces", func(t *testing.T) {
		p := filepath.Join(dir, "long.log")
		os.WriteFile(p, []byte(strings.Repeat("z", 3*maxPartial)+"\n"), 0o600)
		got := events(t, &logFile{stream: "console", path: p}, 0)
		for _, g := range got {
			if len(g) > maxPartial+chunkSize {
				t.Errorf("an event of %d bytes", len(g))
			}
		}
		if strings.Join(got, "") != strings.Repeat("z", 3*maxPartial)+"\n" {
			t.Errorf("the pieces do not make the line")
		}
	})
}

func TestEachLine(t *testing.T) {
	var got []string
	eachLine([]byte("a\nb\n\nc"), func(l []byte) error { got = append(got, string(l)); return nil })
	if want := []string{"a\n", "b\n", "\n", "c"}; strings.Join(got, "|") != strings.Join(want, "|") {
		t.Errorf("got %q, want %q", got, want)
	}
}

func TestEventLine(t *testing.T) {
	ev := api.Event{Time: time.Date(2026, 1, 2, 3, 4, 5, 6e6, time.UTC), Type: "stopped",
		Detail: map[string]any{"reason": "idle for 5m", "sizeBytes": float64(3300000), "outcome": "ok"}}
	want := `2026-01-02T03:04:05.006Z stopped outcome=ok reason="idle for 5m" sizeBytes=3300000`
	if got := EventLine(ev); got != want {
		t.Errorf("got %q, want %q", got, want)
	}
}
