package explain

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"sbx.dev/sbx/api"
	"sbx.dev/sbx/client"
	"sbx.dev/sbx/internal/explain/analyze"
	"sbx.dev/sbx/internal/flaky"
)

// hostile is what a sandbox may put in a path, an argv or a process name.
const hostile = `"'><script>alert(1)</script><img src=x onerror=alert(2)><svg onload=alert(3)><a href="javascript:x">` +
	"\x00\x1b[31m\xff\xfe" + `<link rel=stylesheet href=http://evil.example/x.css><style>@import url(http://evil.example/)</style>]]><!--<![CDATA[<iframe src=//evil.example>`

// TestAttack23ReportHostile: whatever the sandbox printed, in every field
// it can reach, the report has only its own tags, no script, no
// attribute a sandbox chose, and nothing that fetches.
func TestAttack23ReportHostile(t *testing.T) {
	ev := analyze.ExampleEvent{AtMs: 1, Pid: 7, Process: hostile, Event: "open(" + hostile + ") ok"}
	r := &Explained{
		Runs: 2, Failed: 1, Rate: Rate{Rate: 0.5, Low: 0.1, High: 0.9}, Note: hostile, Dropped: 3,
		Divergence: []analyze.Finding{{Summary: hostile, Resource: hostile, Failing: 1, FailingRuns: 1, PassingRuns: 1, P: 0.5,
			Example: analyze.Example{Run: 0, Failed: true, Events: []analyze.ExampleEvent{ev}, Note: hostile}}},
		Timelines:    []TimelineRun{{Run: 0, Failed: true, Events: []analyze.ExampleEvent{ev, {AtMs: 2, Process: hostile, Event: hostile}}}},
		Knobs:        []Knob{{Knob: hostile, Value: hostile, Runs: 1, Failed: 1, Rate: 1, Low: 0.2, High: 1}},
		KnobVerdicts: []KnobVerdict{{Knob: hostile, Summary: hostile}},
		PointOfNoReturn: &PointOfNoReturn{Note: hostile, Certain: true, Curve: []CurvePoint{{AtMs: 0, Runs: 1, Failed: 1, Rate: 1}},
			Before: []analyze.ExampleEvent{ev}},
		Fix: &Verdict{Summary: hostile},
	}
	var b strings.Builder
	if err := WriteReport(&b, r); err != nil {
		t.Fatal(err)
	}
	page := b.String()
	allowed := map[string]bool{"html": true, "head": true, "meta": true, "title": true, "style": true, "body": true, "h1": true, "h2": true,
		"p": true, "table": true, "tr": true, "th": true, "td": true, "code": true, "ul": true, "li": true,
		"svg": true, "line": true, "text": true, "circle": true, "rect": true, "polyline": true}
	for _, m := range regexp.MustCompile(`<([A-Za-z!\[][A-Za-z0-9\[]*)`).FindAllStringSubmatch(page, -1) {
		if tag := strings.ToLower(m[1]); !allowed[tag] && tag != "!doctype" {
			t.Errorf("the report has a <%s> it did not write itself", m[1])
		}
	}
	// inside the report's own tags, nothing of the sandbox's
	for _, tag := range regexp.MustCompile(`<[^>]*>`).FindAllString(page, -1) {
		for _, bad := range []string{"evil", "alert", "javascript", "onerror", "onload"} {
			if strings.Contains(tag, bad) {
				t.Errorf("the report's tag %q carries %q", tag, bad)
			}
		}
	}
	// nor a control character a terminal would act on (cat report.html)
	for _, bad := range []string{"\x00", "\x1b", "\xff"} {
		if strings.Contains(page, bad) {
			t.Errorf("the report carries %q", bad)
		}
	}
	if n := strings.Count(page, "<style>"); n != 1 {
		t.Errorf("%d <style> elements, want the report's own only", n)
	}
}

// fakeClient forks and runs for VerifyFix: every exec exits with code.
type fakeClient struct {
	mu    sync.Mutex
	n     int
	execs int
	code  int
}

func (f *fakeClient) Create(ctx context.Context, opts ...client.CreateOption) (*api.Sandbox, error) {
	return &api.Sandbox{ID: "sb_root"}, nil
}

func (f *fakeClient) Fork(ctx context.Context, id string, req api.ForkRequest) ([]api.Sandbox, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []api.Sandbox
	for range req.Count {
		f.n++
		out = append(out, api.Sandbox{ID: fmt.Sprintf("sb_%010d", f.n)})
	}
	return out, nil
}

func (f *fakeClient) Exec(ctx context.Context, id string, req api.ExecRequest, stdout, stderr io.Writer) (*api.Exec, error) {
	f.mu.Lock()
	f.execs++
	f.mu.Unlock()
	code := f.code
	return &api.Exec{ID: "ex_1", State: api.ExecExited, ExitCode: &code}, nil
}

func (f *fakeClient) Delete(ctx context.Context, id string) error { return nil }
func (f *fakeClient) SetTTL(ctx context.Context, id string, ttl time.Duration) (*api.Sandbox, error) {
	return &api.Sandbox{ID: id}, nil
}
func (f *fakeClient) Trace(ctx context.Context, id string) (*api.Trace, error) {
	return &api.Trace{}, nil
}

// TestAttack23VerifyNeverPasses: --fixed with a command that never passes,
// against a rare failure (1%: 459 runs prove a fix at 99%), stops at its
// first failing batch instead of running all 459.
func TestAttack23VerifyNeverPasses(t *testing.T) {
	f := &fakeClient{code: 1}
	v, err := VerifyFix(context.Background(), f, Options{Sandbox: "sb_root"}, flaky.Test{Cmd: []string{"false"}}, 0.01)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%s (%d execs)", v.Summary, f.execs)
	if v.Fixed || v.Failed == 0 || !strings.HasPrefix(v.Summary, "not fixed") {
		t.Errorf("verdict %+v, want not fixed", v)
	}
	if f.execs > 2*api.MaxForks {
		t.Errorf("%d runs of a fix that failed from its first, want it to stop at its first batch", f.execs)
	}
	// one that holds runs them all
	f = &fakeClient{code: 0}
	if v, err = VerifyFix(context.Background(), f, Options{Sandbox: "sb_root"}, flaky.Test{Cmd: []string{"true"}}, 0.01); err != nil || !v.Fixed || v.Runs != v.Need99 || f.execs != v.Need99 {
		t.Errorf("a fix that holds: %+v, %v, %d execs: want all %d runs", v, err, f.execs, v.Need99)
	}
}

// TestAttack23HugeTimeout: --timeout 1000000h overflowed the forks' ttl
// (a negative duration sbxd refuses).
func TestAttack23HugeTimeout(t *testing.T) {
	for _, to := range []time.Duration{1000000 * time.Hour, 2562047 * time.Hour, time.Second, 0} {
		o := Options{Test: flaky.Test{Timeout: api.Duration(to)}, Parallel: 1}
		ttl := forkTTL(o)
		if ttl != nil && *ttl <= 0 {
			t.Errorf("--timeout %s: fork ttl %s", to, ttl)
		}
		if b := runBound(o.Test); b <= 0 {
			t.Errorf("--timeout %s: run bound %s", to, b)
		}
	}
}

// TestAttack23PNRWeakEvidence: 2 of 2 forks failing is "at least 90%":
// the note says how little that shows.
func TestAttack23PNRWeakEvidence(t *testing.T) {
	lo, hi := flaky.Wilson(2, 2)
	_, note := PointOfNoReturnOf([]CurvePoint{{AtMs: 0, Runs: 2, Failed: 2, Rate: 1, Low: lo, High: hi}})
	if !strings.Contains(note, "from 2 of 2 forks only") {
		t.Errorf("note %q: want it to say 2 forks are little", note)
	}
	lo, hi = flaky.Wilson(40, 40)
	if _, note = PointOfNoReturnOf([]CurvePoint{{AtMs: 0, Runs: 40, Failed: 40, Rate: 1, Low: lo, High: hi}}); strings.Contains(note, "only") {
		t.Errorf("note %q for 40 of 40 forks", note)
	}
}

// TestAttack23ReportNotRegular: --report to a pipe (as /dev/stdout or
// /dev/null are no regular files) is written to, not renamed over: as
// root, `--report /dev/null` replaced the device with the report. A
// symlink to a file keeps being the link.
func TestAttack23ReportNotRegular(t *testing.T) {
	dir := t.TempDir()
	fifo := filepath.Join(dir, "pipe")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	got := make(chan []byte, 1)
	go func() {
		b, _ := os.ReadFile(fifo)
		got <- b
	}()
	r := &Explained{Runs: 2, Failed: 1}
	if err := CheckReportPath(fifo); err != nil {
		t.Fatal(err)
	}
	if err := WriteReportFile(fifo, r); err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Lstat(fifo); err != nil || fi.Mode()&os.ModeNamedPipe == 0 {
		t.Errorf("the pipe is now %v (%v): renamed over", fi.Mode(), err)
	}
	if b := <-got; !strings.Contains(string(b), "<!DOCTYPE html>") {
		t.Errorf("the pipe's reader got %q", b)
	}
	real := filepath.Join(dir, "real.html")
	link := filepath.Join(dir, "link.html")
	os.WriteFile(real, []byte("old"), 0o644)
	os.Symlink(real, link)
	if err := WriteReportFile(link, r); err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Lstat(link); err != nil || fi.Mode()&os.ModeSymlink == 0 {
		t.Errorf("the link is now %v (%v)", fi.Mode(), err)
	}
	if b, _ := os.ReadFile(real); !strings.Contains(string(b), "<!DOCTYPE html>") {
		t.Errorf("the link's file holds %q", b)
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 3 {
		t.Errorf("left in the directory: %v", ents)
	}
}

// TestAttack23TestPid: the point of no return's events are the test's,
// under the wrapper: its first child, not its watchdog (the second), nor
// what the exec's own process (the agent's) does first.
func TestAttack23TestPid(t *testing.T) {
	evs := []api.TraceEvent{
		{Kind: "clone", Pid: 9, Child: 8}, // the agent's helper
		{Kind: "execve", Pid: 10, PPid: 9, Path: "/bin/sh", Argv: []string{"/bin/sh", "-c", "...", "sbx-explain", "/bin/sh", "-c", "test"}},
		{Kind: "clone", Pid: 10, Child: 11},
		{Kind: "clone", Pid: 10, Child: 12},
		{Kind: "execve", Pid: 12, PPid: 10, Path: "/bin/sleep"},
	}
	if got := testPid(evs, 9); got != 11 {
		t.Errorf("testPid = %d, want 11 (the wrapper's first child)", got)
	}
	if got := testPid(evs[:1], 9); got != 9 {
		t.Errorf("testPid with no wrapper = %d, want the exec's pid", got)
	}
}
