package e2e

import (
	"encoding/json"
	"io"
	"net/http"
	"regexp"
	"strings"
	"testing"
	"time"

	"sbx.dev/sbx/api"
)

// TestLogs: what a process writes to /dev/console lands in the console
// stream, in order, tails and survives a stop and resume; events are a
// stream of lines.
func TestLogs(t *testing.T) {
	d := shared
	id := d.newSandbox(t)
	// /dev/console is a FIFO init copies to the console log: a process needs
	// no access to init's stdout to leave a marker, and `>` twice keeps both.
	d.must(t, "exec", id, "--", "sh", "-c", "echo MARK-ONE > /dev/console")
	d.must(t, "exec", id, "--", "sh", "-c", "echo MARK-TWO > /dev/console")
	waitFor(t, "both markers in the console stream", 10*time.Second, func() bool {
		return strings.Contains(d.must(t, "logs", id), "MARK-TWO")
	})
	out := d.must(t, "logs", id, "--stream", "console")
	one, two := strings.Index(out, "MARK-ONE\n"), strings.Index(out, "MARK-TWO\n")
	if one < 0 || two < one {
		t.Fatalf("console stream %q: want MARK-ONE then MARK-TWO", out)
	}
	if got := d.must(t, "logs", id, "--tail", "1"); got != "MARK-TWO\n" {
		t.Errorf("logs --tail 1: got %q, want %q", got, "MARK-TWO\n")
	}

	events := d.must(t, "logs", id, "--stream", "events")
	if !regexp.MustCompile(`(?m)^\d{4}-\d\d-\d\dT\S+ created `).MatchString(events) {
		t.Errorf("events stream %q: want a created line", events)
	}
	if r := d.sbx(t, "logs", id, "--stream", "nosuch"); r.code != 2 || !strings.Contains(r.stderr, "console, events, runtime") {
		t.Errorf("unknown stream: exit %d, stderr %q; want exit 2 naming the streams", r.code, r.stderr)
	}
	if r := d.sbx(t, "logs", id, "--stream", "runtime"); r.code != 0 {
		t.Errorf("runtime stream: exit %d, stderr %q", r.code, r.stderr)
	}

	// --json: one LogEvent a line.
	var ev api.LogEvent
	line, _, _ := strings.Cut(d.must(t, "--json", "logs", id, "--tail", "1"), "\n")
	if err := json.Unmarshal([]byte(line), &ev); err != nil || ev.Stream != "console" || string(ev.Data) != "MARK-TWO\n" {
		t.Errorf("logs --json --tail 1: got %q (%v), want a console event of MARK-TWO", line, err)
	}

	// The logs live with the sandbox, not its runsc processes.
	d.must(t, "stop", id, "--wait")
	if out := d.must(t, "logs", id); !strings.Contains(out, "MARK-ONE\nMARK-TWO\n") {
		t.Errorf("console stream of a stopped sandbox: %q", out)
	}
	d.must(t, "resume", id)
	d.must(t, "exec", id, "--", "sh", "-c", "echo MARK-THREE > /dev/console")
	waitFor(t, "the console stream after resume", 10*time.Second, func() bool {
		return strings.Contains(d.must(t, "logs", id), "MARK-TWO\nMARK-THREE\n")
	})
	events = d.must(t, "logs", id, "--stream", "events")
	for _, typ := range []string{" stopped ", " resumed "} {
		if !strings.Contains(events, typ) {
			t.Errorf("events stream %q: want a%sline", events, typ)
		}
	}
}

// TestLogsFollow: --follow prints what comes while it runs.
func TestLogsFollow(t *testing.T) {
	d := shared
	id := d.newSandbox(t)
	x := d.must(t, "exec", id, "--detach", "--", "sh", "-c", "for i in 1 2 3; do echo FOLLOW-$i > /dev/console; sleep 0.3; done")
	_ = x
	got := make(chan string, 1)
	go func() {
		r := d.sbx(t, "logs", id, "--follow", "--tail", "100")
		got <- r.stdout
	}()
	// The follower is ended by deleting the sandbox once all three are in.
	waitFor(t, "FOLLOW-3 in the console", 15*time.Second, func() bool {
		return strings.Contains(d.must(t, "logs", id), "FOLLOW-3")
	})
	time.Sleep(300 * time.Millisecond) // the follower, which reads what the console has as it comes, prints it: nothing outside shows when
	d.must(t, "delete", id)
	select {
	case out := <-got:
		if !strings.Contains(out, "FOLLOW-1\nFOLLOW-2\nFOLLOW-3\n") {
			t.Errorf("logs --follow printed %q, want FOLLOW-1..3 in order", out)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("logs --follow did not end when the sandbox was deleted")
	}
}

// TestMetrics: a sandbox's resource use, and sbxd's Prometheus metrics.
func TestMetrics(t *testing.T) {
	d := shared
	id := d.newSandbox(t)
	a := d.info(t, id)
	var m api.Metrics
	d.jsonOut(t, &m, "metrics", id)
	if m.MemoryBytes <= 0 || m.Processes < 1 || m.CPUSeconds <= 0 {
		t.Errorf("metrics %+v: want memory > 0, processes >= 1, cpu > 0", m)
	}
	var b api.Sandbox
	b = d.info(t, id)
	if !b.LastActivity.Equal(a.LastActivity) {
		t.Errorf("metrics counted as activity: last activity %s, then %s", a.LastActivity, b.LastActivity)
	}

	d.must(t, "snapshot", id, "metrics-"+randHex(4))
	req, _ := http.NewRequest("GET", "http://"+d.tcp+"/metrics", nil)
	req.Header.Set("Authorization", "Bearer "+d.token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET /metrics: %s\n%s", resp.Status, body)
	}
	text := string(body)
	for _, want := range []*regexp.Regexp{
		regexp.MustCompile(`(?m)^sbx_sandboxes\{state="ready"\} [1-9]`),
		regexp.MustCompile(`(?m)^sbx_sandboxes\{state="stopped"\} \d+$`),
		regexp.MustCompile(`(?m)^# TYPE sbx_capture_duration_seconds histogram$`),
		regexp.MustCompile(`(?m)^sbx_capture_duration_seconds_bucket\{kind="snapshot",outcome="ok",le="\+Inf"\} [1-9]`),
		regexp.MustCompile(`(?m)^sbx_api_requests_total\{route="POST /v1/sandboxes",status="201"\} [1-9]`),
	} {
		if !want.MatchString(text) {
			t.Errorf("/metrics does not match %s:\n%s", want, text)
		}
	}
	// Without the token the TCP listener refuses.
	resp, err = http.Get("http://" + d.tcp + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusUnauthorized {
		t.Errorf("GET /metrics without a token: %s, want 401", resp.Status)
	}
}
