package sandbox

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"sbx.dev/sbx/api"
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
			got := collect(t, []*logFile{{stream: "runtime", path: path, match: isRuntimeLine}}, false, tc.n, nil)
			if got != tc.want {
				t.Errorf("got %q, want %q", got, tc.want)
			}
		})
	}
}

// collect runs followLogs and returns what it sent, in order.
func collect(t *testing.T, files []*logFile, follow bool, tail int, ended func() (bool, error)) string {
	t.Helper()
	if ended == nil {
		ended = func() (bool, error) { return false, nil }
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var b strings.Builder
	err := followLogs(ctx, files, follow, tail, ended, time.Now, func(ev api.LogEvent) error {
		b.Write(ev.Data)
		return nil
	})
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
		got := collect(t, []*logFile{{stream: "console", path: path}}, false, 2, nil)
		if want := "old 2\nold 3\n"; got != want {
			t.Errorf("got %q, want %q", got, want)
		}
	})
	t.Run("missing file is empty", func(t *testing.T) {
		got := collect(t, []*logFile{{stream: "console", path: filepath.Join(dir, "none")}}, false, 0, nil)
		if got != "" {
			t.Errorf("got %q, want nothing", got)
		}
	})
	t.Run("follow sends what comes until the end, in order", func(t *testing.T) {
		var done atomic.Bool
		go func() {
			f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND, 0)
			if err != nil {
				return
			}
			for i := range 5 {
				time.Sleep(20 * time.Millisecond)
				f.WriteString("new " + string(rune('a'+i)) + "\n")
			}
			f.Close()
			done.Store(true)
		}()
		got := collect(t, []*logFile{{stream: "console", path: path}}, true, 1, func() (bool, error) { return done.Load(), nil })
		if want := "old 3\nnew a\nnew b\nnew c\nnew d\nnew e\n"; got != want {
			t.Errorf("got %q, want %q", got, want)
		}
	})
	t.Run("follow ends with ctx", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 150*time.Millisecond)
		defer cancel()
		err := followLogs(ctx, []*logFile{{stream: "console", path: path}}, true, 0,
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

func TestEventLine(t *testing.T) {
	ev := api.Event{Time: time.Date(2026, 1, 2, 3, 4, 5, 6e6, time.UTC), Type: "stopped",
		Detail: map[string]any{"reason": "idle for 5m", "sizeBytes": float64(3300000), "outcome": "ok"}}
	want := `2026-01-02T03:04:05.006Z stopped outcome=ok reason="idle for 5m" sizeBytes=3300000`
	if got := EventLine(ev); got != want {
		t.Errorf("got %q, want %q", got, want)
	}
}
