package analyze

import (
	"fmt"
	"strings"
	"testing"

	"sbx.dev/sbx/api"
)

const ms = int64(1e6)

// serviceRun is a synthetic run of the bundled example: the test starts a
// server that binds port 8765 after delay ms, and connects at 250 ms;
// connecting first is refused and fails the run. Pids, the start time and
// a temporary file's name differ from run to run, as they do.
func serviceRun(i int, delay int64) Run {
	start := int64(1_700_000_000_000_000_000) + int64(i)*7_777_777
	sh, py, curl := int32(100+i*10), int32(101+i*10), int32(102+i*10)
	failed := delay+30 > 250
	evs := []api.TraceEvent{
		{TimeNs: start + 1*ms, Pid: sh, PPid: 1, Process: "sh", Kind: "execve", Path: "/bin/sh"},
		{TimeNs: start + 2*ms, Pid: sh, Kind: "clone", Child: py},
		{TimeNs: start + 3*ms, Pid: py, PPid: sh, Process: "python3", Kind: "execve", Path: "/usr/bin/python3"},
		{TimeNs: start + 20*ms, Pid: py, PPid: sh, Process: "python3", Kind: "open", Path: fmt.Sprintf("/tmp/tmp%sq9/cache", []string{"aB3x", "Zk8p", "m2Qw", "Yy7r"}[i%4])},
		{TimeNs: start + 240*ms, Pid: sh, Kind: "clone", Child: curl},
		{TimeNs: start + 245*ms, Pid: curl, PPid: sh, Process: "curl", Kind: "execve", Path: "/usr/bin/curl"},
		// the agent, outside the test's tree: not the test's doing
		{TimeNs: start + 100*ms, Pid: 5, PPid: 1, Process: "sbx-agent", Kind: "open", Path: fmt.Sprintf("/proc/%d/stat", 40+i)},
	}
	bind := api.TraceEvent{TimeNs: start + (delay+30)*ms, Pid: py, PPid: sh, Process: "python3", Kind: "bind", Addr: "127.0.0.1:8765"}
	conn := api.TraceEvent{TimeNs: start + 250*ms, Pid: curl, PPid: sh, Process: "curl", Kind: "connect", Addr: "127.0.0.1:8765", Result: -115, Errno: 115}
	evs = append(evs, conn)
	if delay < 350 { // the slowest servers bind after the trace was read
		bind.Fd = 3
		evs = append(evs, bind, api.TraceEvent{TimeNs: bind.TimeNs + ms, Pid: py, PPid: sh, Process: "python3", Kind: "listen", Fd: 3})
	}
	status := int32(0)
	if failed {
		status = 7 << 8
	} else {
		evs = append(evs, api.TraceEvent{TimeNs: start + 252*ms, Pid: py, PPid: sh, Process: "python3", Kind: "accept", Addr: fmt.Sprintf("127.0.0.1:%d", 40000+i)})
	}
	evs = append(evs, api.TraceEvent{TimeNs: start + 300*ms, Pid: curl, PPid: sh, Process: "curl", Kind: "exit", Status: status})
	return Run{Run: i, Seed: uint32(delay), Failed: failed, StartNs: start, Root: sh, Events: evs}
}

func TestAnalyzeService(t *testing.T) {
	var runs []Run
	for i, d := range []int64{0, 100, 200, 300, 400, 0, 100, 200, 300, 400, 0, 100} {
		runs = append(runs, serviceRun(i, d))
	}
	res := Analyze(runs)
	if res.Failed != 4 || res.Runs != 12 {
		t.Fatalf("got %d/%d failed, want 4/12", res.Failed, res.Runs)
	}
	if len(res.Findings) == 0 {
		t.Fatal("no findings")
	}
	top := res.Findings[0]
	t.Logf("findings:\n%s", dump(res))
	if top.Resource != "port 8765" || !strings.Contains(top.Summary, "8765") || !strings.Contains(top.Summary, "connect") {
		t.Errorf("top finding %q (resource %q), want the order of connect and the server's bind or listen on port 8765", top.Summary, top.Resource)
	}
	if !strings.Contains(dump(res), "listen(127.0.0.1:8765) ok") {
		t.Errorf("no finding names the listen on the bound address")
	}
	if top.Failing != 4 || top.Passing != 0 || !top.InFailing {
		t.Errorf("top finding in %d failing and %d passing runs, want 4 and 0", top.Failing, top.Passing)
	}
	if len(top.Example.Events) == 0 || !top.Example.Failed || top.Example.Events[0].AtMs != 250 {
		t.Errorf("example %+v, want a failing run's connect at 250 ms", top.Example)
	}
	for _, f := range res.Findings {
		if strings.Contains(f.Summary, "/tmp/tmp") && !strings.Contains(f.Summary, "/tmp/*") || strings.Contains(f.Summary, "sbx-agent") || strings.Contains(f.Summary, "/proc/") {
			t.Errorf("finding %q: a temporary name, or an event outside the test", f.Summary)
		}
	}
}

// fileRun: a writer renames a file into place after delay ms; the reader
// opens it at 100 ms and fails if it is not there yet.
func fileRun(i int, delay int64) Run {
	start := int64(1_800_000_000_000_000_000) + int64(i)*1_234_567
	sh, w, r := int32(50+i), int32(60+i), int32(70+i)
	evs := []api.TraceEvent{
		{TimeNs: start, Pid: sh, PPid: 1, Process: "sh", Kind: "execve", Path: "/bin/sh"},
		{TimeNs: start + 1*ms, Pid: w, PPid: sh, Process: "sh", Kind: "open", Path: "/tmp/race/data.tmp", Flags: 0o1101},
		{TimeNs: start + delay*ms, Pid: w, PPid: sh, Process: "mv", Kind: "rename"},
	}
	open := api.TraceEvent{TimeNs: start + 100*ms, Pid: r, PPid: sh, Process: "cat", Kind: "open", Path: "/tmp/race/data"}
	failed := delay > 100
	if failed {
		open.Errno, open.Result = 2, -2
	}
	evs = append(evs, open)
	return Run{Run: i, Seed: uint32(i), Failed: failed, StartNs: start, Root: sh, Events: evs}
}

func TestAnalyzeFileRace(t *testing.T) {
	var runs []Run
	for i, d := range []int64{10, 150, 50, 180, 90, 20, 130, 60} {
		runs = append(runs, fileRun(i, d))
	}
	res := Analyze(runs)
	t.Logf("findings:\n%s", dump(res))
	if len(res.Findings) == 0 {
		t.Fatal("no findings")
	}
	top := res.Findings[0]
	if top.Resource != "/tmp/race/data" || !strings.Contains(top.Summary, "ENOENT") {
		t.Errorf("top finding %q (resource %q), want the open of /tmp/race/data failing ENOENT", top.Summary, top.Resource)
	}
}

func TestAnalyzeNothingToCompare(t *testing.T) {
	for _, tc := range []struct {
		name   string
		delays []int64
		want   string
	}{
		{"never fails", []int64{0, 10, 20}, "no run of 3 failed"},
		{"always fails", []int64{300, 310}, "every run of 2 failed"},
		{"no runs", nil, "no runs"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var runs []Run
			for i, d := range tc.delays {
				runs = append(runs, serviceRun(i, d))
			}
			res := Analyze(runs)
			if !strings.Contains(res.Note, tc.want) || len(res.Findings) != 0 {
				t.Errorf("got note %q and %d findings, want %q and none", res.Note, len(res.Findings), tc.want)
			}
		})
	}
}

func TestNormalize(t *testing.T) {
	for _, tc := range []struct {
		name string
		in   api.TraceEvent
		key  string
		res  string
	}{
		{"refused", api.TraceEvent{Kind: "connect", Addr: "127.0.0.1:8765", Errno: 111}, "connect(127.0.0.1:8765) failed ECONNREFUSED", "port 8765"},
		{"in progress", api.TraceEvent{Kind: "connect", Addr: "127.0.0.1:8765", Result: -115}, "connect(127.0.0.1:8765) in progress", "port 8765"},
		{"ephemeral", api.TraceEvent{Kind: "connect", Addr: "10.0.0.1:45123"}, "connect(10.0.0.1:*) ok", ""},
		{"bind any", api.TraceEvent{Kind: "bind", Addr: "0.0.0.0:0"}, "bind(0.0.0.0:*) ok", ""},
		{"proc pid", api.TraceEvent{Kind: "open", Path: "/proc/1234/status"}, "open(/proc/PID/status) ok", "/proc/PID/status"},
		{"mkstemp", api.TraceEvent{Kind: "open", Path: "/tmp/tmpa8Xk2q/out.txt", Errno: 2}, "open(/tmp/*/out.txt) failed ENOENT", "/tmp/*/out.txt"},
		{"chosen tmp", api.TraceEvent{Kind: "open", Path: "/tmp/race/data"}, "open(/tmp/race/data) ok", "/tmp/race/data"},
		{"seed in name", api.TraceEvent{Kind: "open", Path: "/work/run-2849304884.log"}, "open(/work/run-N.log) ok", "/work/run-N.log"},
		{"exit", api.TraceEvent{Kind: "exit", Process: "curl", Status: 1792}, "curl exited 7", ""},
		{"killed", api.TraceEvent{Kind: "exit", Process: "sleep", Status: 9}, "sleep killed by SIGKILL", ""},
		{"rename", api.TraceEvent{Kind: "rename", Process: "mv"}, "rename() by mv ok", ""},
		{"clone", api.TraceEvent{Kind: "clone"}, "", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			key, res, _ := Normalize(tc.in)
			if key != tc.key || res != tc.res {
				t.Errorf("got %q on %q, want %q on %q", key, res, tc.key, tc.res)
			}
		})
	}
}

func dump(r Result) string {
	var b strings.Builder
	for _, f := range r.Findings {
		fmt.Fprintf(&b, "%.2f  %d/%d fail %d/%d pass  %s  [%s] ex %+v\n", f.Score, f.Failing, f.FailingRuns, f.Passing, f.PassingRuns, f.Summary, f.Resource, f.Example)
	}
	return b.String()
}
