package e2e

import (
	"fmt"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"sbx.dev/sbx/api"
)

// connectMs is a command timing a TCP connect from inside the sandbox to
// addr, in whole milliseconds, on stdout.
func connectMs(addr string) string {
	return fmt.Sprintf(`python3 -c "import socket,time; t=time.monotonic(); socket.create_connection(('%s', 8080), timeout=20).close(); print(int((time.monotonic()-t)*1000))"`, addr)
}

// connectTook runs connectMs in id and returns the milliseconds.
func connectTook(t *testing.T, d *daemon, id, addr string) int {
	t.Helper()
	out := strings.TrimSpace(d.must(t, "exec", "--timeout", "60s", id, "--", "sh", "-c", connectMs(addr)))
	ms, err := strconv.Atoi(out)
	if err != nil {
		t.Fatalf("connect from %s: %q", id, out)
	}
	return ms
}

// TestNetShape: a sandbox made with --net-delay holds what it sends out
// (a connect takes at least the delay: its SYN waits), sbx info says so,
// a memory fork keeps it unless told, a stop and resume and a restart of
// sbxd keep it (the restarted sbxd reads the delay's queue again). Bad
// values and a shaped sandbox without a network are refused, naming the
// field.
func TestNetShape(t *testing.T) {
	d := ownDaemon(t)
	out := outside(t)
	const delay = 250
	id := d.newSandbox(t, "--template", "base", "--net-delay", fmt.Sprintf("%dms", delay), "--net-loss", "0%")
	sb := d.info(t, id)
	if sb.Shape == nil || sb.Shape.Delay != api.Duration(250*time.Millisecond) || sb.Shape.Loss != 0 {
		t.Fatalf("sbx info of a sandbox made with --net-delay 250ms: shape %+v", sb.Shape)
	}
	if ms := connectTook(t, d, id, out); ms < delay {
		t.Errorf("a connect with a delay of %d ms took %d ms", delay, ms)
	}

	kid := strings.Fields(d.must(t, "fork", "--memory", "--wait", id))[0]
	t.Cleanup(func() { d.sbx(t, "rm", kid) })
	if ms := connectTook(t, d, kid, out); ms < delay {
		t.Errorf("a memory fork of a delayed sandbox: a connect took %d ms, want the parent's delay of %d ms", ms, delay)
	}
	none := strings.Fields(d.must(t, "fork", "--memory", "--wait", "--net-delay", "0", id))[0]
	t.Cleanup(func() { d.sbx(t, "rm", none) })
	if sh := d.info(t, none).Shape; sh != nil {
		t.Errorf("a fork with --net-delay 0: shape %+v, want none", sh)
	}
	d.must(t, "exec", "--timeout", "60s", none, "--", "sh", "-c", connectMs(out))

	d.must(t, "stop", "--wait", id)
	d.must(t, "resume", "--require-memory", id)
	if ms := connectTook(t, d, id, out); ms < delay {
		t.Errorf("after a stop and resume: a connect took %d ms, want the delay of %d ms", ms, delay)
	}

	d.kill(syscall.SIGKILL)
	if err := d.start(nil); err != nil {
		t.Fatal(err)
	}
	if ms := connectTook(t, d, id, out); ms < delay {
		t.Errorf("after sbxd was killed and started again: a connect took %d ms, want the delay of %d ms", ms, delay)
	}

	for _, bad := range [][]string{
		{"new", "--net-delay", "11s"},
		{"new", "--net-delay", "soon"},
		{"new", "--net-loss", "1"},
		{"new", "--net-loss", "150%"},
		{"new", "--net-loss", "-0.1"},
		{"new", "--network", "none", "--net-delay", "10ms"},
		{"fork", "--net-loss", "2", id},
	} {
		r := d.sbx(t, bad...)
		if r.code == 0 {
			d.sbx(t, "rm", strings.TrimSpace(r.stdout))
			t.Errorf("sbx %s: exit 0, want it refused", strings.Join(bad, " "))
		} else if !strings.Contains(r.stderr, "net") {
			t.Errorf("sbx %s: %q, want the error to name the network shape", strings.Join(bad, " "), r.stderr)
		}
	}
	d.sbx(t, "rm", kid)
	d.sbx(t, "rm", none)
	d.must(t, "rm", id)
	checkNoLeaks(t, d)
}

// TestExplainNetKnob: a test that fails when its connect to the outside
// is slow: explain's delay knob separates (every run fails at 1 s,
// none at 0) and says the rate is network-dependent; the loss knob's
// baseline is the delay's, measured once.
func TestExplainNetKnob(t *testing.T) {
	d := shared
	out := outside(t)
	id := d.newSandbox(t, "--template", "base")
	test := connectMs(out) + " | awk '{ exit ($1 < 600) ? 0 : 1 }'"
	res := explainTop(t, d, id, []string{"-n", "4", "--knob-runs", "4", "--cpus", "none", "--net-delay", "0,1s", "--net-loss", "0,5%"}, "sh", "-c", test)
	failed := map[string]int{}
	for _, k := range res.Knobs {
		failed[k.Knob+"="+k.Value] = k.Failed
		if k.Runs != 4 {
			t.Errorf("knob %s=%s: %d runs, want 4", k.Knob, k.Value, k.Runs)
		}
	}
	if len(res.Knobs) != 4 || failed["net-delay=1s"] != 4 || failed["net-delay=0s"] != 0 {
		t.Errorf("the knobs: %v, want 4 of 4 failed at a delay of 1s and none at 0", failed)
	}
	found := false
	for _, v := range res.KnobVerdicts {
		if v.Knob == "net-delay" {
			found = true
			if !v.Changes || !strings.Contains(v.Summary, "network-dependent") {
				t.Errorf("the delay knob's verdict: %+v, want network-dependent", v)
			}
		}
	}
	if !found {
		t.Errorf("no verdict on net-delay: %+v", res.KnobVerdicts)
	}
}
