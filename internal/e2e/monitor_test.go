package e2e

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"sbx.dev/sbx/api"
	"sbx.dev/sbx/client"
)

// traceHas reports whether tr holds an event for which match is true.
func traceHas(tr *api.Trace, match func(api.TraceEvent) bool) bool {
	for _, e := range tr.Events {
		if match(e) {
			return true
		}
	}
	return false
}

func openOf(path string, errno int64) func(api.TraceEvent) bool {
	return func(e api.TraceEvent) bool { return e.Kind == "open" && e.Path == path && e.Errno == errno }
}

func dumpTrace(tr *api.Trace) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%d events, dropped %d, connected %v\n", len(tr.Events), tr.Dropped, tr.Connected)
	for i, e := range tr.Events {
		if i == 200 {
			b.WriteString("...\n")
			break
		}
		fmt.Fprintf(&b, "%+v\n", e)
	}
	return b.String()
}

// TestMonitorCreateAndFork: a sandbox created with monitoring reports its
// execs' opens and exits with results; memory forks of an unmonitored
// sandbox asked with monitoring each report their own, from the restore
// on; an unmonitored sandbox's trace is a conflict.
func TestMonitorCreateAndFork(t *testing.T) {
	d := shared
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	sb, err := d.client.Create(ctx, client.WithTemplate("tiny"), client.WithMonitoring())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = deleteSandbox(context.Background(), d.client, sb.ID) })
	s := d.client.Sandbox(sb.ID)
	if _, err := s.Exec(ctx, []string{"sh", "-c", "echo x > /tmp/a; mv /tmp/a /tmp/b; cat /nonexistent-created; true"}); err != nil {
		t.Fatal(err)
	}
	var tr *api.Trace
	waitFor(t, "the created sandbox's open of /nonexistent-created", 10*time.Second, func() bool {
		tr, err = s.Trace(ctx)
		return err == nil && traceHas(tr, openOf("/nonexistent-created", 2))
	})
	if !tr.Connected {
		t.Errorf("trace not connected: %s", dumpTrace(tr))
	}
	if !traceHas(tr, func(e api.TraceEvent) bool {
		return e.Kind == "execve" && strings.HasSuffix(e.Path, "cat") || len(e.Argv) > 0 && e.Argv[0] == "cat"
	}) {
		t.Errorf("no execve of cat in the trace:\n%s", dumpTrace(tr))
	}
	// a raw syscall point (rename) has its time and process: gVisor takes
	// a raw exit's context from its enter point, which must be asked too
	if !traceHas(tr, func(e api.TraceEvent) bool {
		return e.Kind == "rename" && e.TimeNs > 0 && e.Pid > 0 && e.Process == "mv"
	}) {
		t.Errorf("no rename by mv with a time and a pid:\n%s", dumpTrace(tr))
	}
	if traceHas(tr, func(e api.TraceEvent) bool { return e.TimeNs == 0 }) {
		t.Errorf("an event without a time:\n%s", dumpTrace(tr))
	}

	parent := d.newSandbox(t, "--template", "tiny")
	if _, err := d.client.Sandbox(parent).Trace(ctx); !errors.Is(err, api.ErrConflict) {
		t.Errorf("trace of an unmonitored sandbox: got %v, want a conflict", err)
	}
	kids, err := d.client.Sandbox(parent).Fork(ctx, client.WithMemory(), client.WithCount(2), client.WithMonitoring())
	for _, k := range kids {
		t.Cleanup(func() { _ = deleteSandbox(context.Background(), d.client, k.ID) })
	}
	if err != nil {
		t.Fatal(err)
	}
	for i, k := range kids {
		path := fmt.Sprintf("/nonexistent-fork-%d", i)
		ks := d.client.Sandbox(k.ID)
		if _, err := ks.Exec(ctx, []string{"sh", "-c", "cat " + path + "; true"}); err != nil {
			t.Fatal(err)
		}
		waitFor(t, "fork "+k.ID+"'s open of "+path, 10*time.Second, func() bool {
			tr, err = ks.Trace(ctx)
			return err == nil && traceHas(tr, openOf(path, 2))
		})
		if traceHas(tr, openOf(fmt.Sprintf("/nonexistent-fork-%d", 1-i), 2)) {
			t.Errorf("fork %d's trace holds the other fork's open:\n%s", i, dumpTrace(tr))
		}
	}
}

// TestTraceCLI: `sbx new --monitor` and `sbx trace` show an exec's open
// with its error; a sandbox not monitored is refused with a hint.
func TestTraceCLI(t *testing.T) {
	d := shared
	id := d.newSandbox(t, "--template", "tiny", "--monitor")
	d.sbx(t, "exec", id, "--", "cat", "/nonexistent-cli")
	waitFor(t, "the open in sbx trace", 10*time.Second, func() bool {
		return strings.Contains(d.must(t, "trace", id), "open /nonexistent-cli = errno 2")
	})
	plain := d.newSandbox(t, "--template", "tiny")
	if r := d.sbx(t, "trace", plain); r.code == 0 || !strings.Contains(r.stderr, "not monitored") {
		t.Errorf("trace of an unmonitored sandbox: exit %d, %q", r.code, r.stderr)
	}
	kid := strings.TrimSpace(d.must(t, "fork", id, "--memory", "--monitor", "--wait"))
	kid = strings.Fields(kid)[0]
	t.Cleanup(func() { _ = deleteSandbox(context.Background(), d.client, kid) })
	d.sbx(t, "exec", kid, "--", "cat", "/nonexistent-kid")
	waitFor(t, "the fork's open in sbx trace", 10*time.Second, func() bool {
		out := d.must(t, "trace", kid)
		return strings.Contains(out, "open /nonexistent-kid = errno 2") && !strings.Contains(out, "/nonexistent-cli")
	})
}
