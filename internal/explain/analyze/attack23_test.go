package analyze

import (
	"fmt"
	"runtime"
	"strings"
	"testing"
	"time"

	"sbx.dev/sbx/api"
)

// hostileRuns: runs whose traces (sbxd keeps 20000 events of each) are
// made to give the most order features: on each of many ports, 12
// connects to different addresses and 12 binds, so 24 keys per port and
// 24*23 orders per port per run, and different addresses in each run.
func hostileRuns(n, events int, shared bool) []Run {
	var runs []Run
	for r := range n {
		run := Run{Run: r, Failed: r%2 == 0, StartNs: 1}
		t := int64(10)
		for len(run.Events) < events {
			port := 1000 + len(run.Events)/24
			for i := range 24 {
				kind := "connect"
				if i%2 == 1 {
					kind = "bind"
				}
				addr := fmt.Sprintf("10.%d.%d.%d:%d", r%7, i, (r*i)%251, port)
				if shared {
					addr = fmt.Sprintf("10.0.%d.%d:%d", i, (r+i)%2, port) // the same keys in every run, orders differing
				}
				run.Events = append(run.Events, api.TraceEvent{Kind: kind, Addr: addr, Pid: 5, TimeNs: t, Process: "x"})
				t += 1000
			}
		}
		runs = append(runs, run)
	}
	return runs
}

// TestAttack23AnalyzeBounded: the analysis of hostile traces ends in
// bounded time and memory.
func TestAttack23AnalyzeBounded(t *testing.T) {
	for _, shared := range []bool{false, true} {
		t.Run(fmt.Sprint("shared=", shared), func(t *testing.T) { analyzeBounded(t, hostileRuns(24, 10000, shared)) })
	}
}

func analyzeBounded(t *testing.T, runs []Run) {
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	start := time.Now()
	var res Result
	peak := peakHeap(func() { res = Analyze(runs) })
	took := time.Since(start)
	runtime.ReadMemStats(&after)
	t.Logf("%d findings in %s, %d MB allocated, %d MB at most in use", len(res.Findings), took, (after.TotalAlloc-before.TotalAlloc)>>20, peak>>20)
	// at 20000 events a run, with the same keys in every run and orders
	// on 833 ports, it held 1.6 GB; each distinct event costs some 1.6 KB
	// (which explain's event budget bounds). Half that here, for time.
	if peak > 512<<20 {
		t.Errorf("the analysis of 24 hostile traces held %d MB at once, want under 512 MB", peak>>20)
	}
}

func peakHeap(fn func()) (peak uint64) {
	done := make(chan struct{})
	var ms runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&ms)
	base := ms.HeapAlloc
	go func() {
		defer close(done)
		fn()
	}()
	for {
		select {
		case <-done:
			return peak
		case <-time.After(20 * time.Millisecond):
			runtime.ReadMemStats(&ms)
			if ms.HeapAlloc > base && ms.HeapAlloc-base > peak {
				peak = ms.HeapAlloc - base
			}
		}
	}
}

// TestAttack23HighFixedPort: the bundled example's race on a server's
// chosen port above 32768 (gRPC's 50051): the port is the same in every
// run, so it is no ephemeral one, and the top finding names it. It was
// normalised to "*", on no resource: no port named, no order.
func TestAttack23HighFixedPort(t *testing.T) {
	var runs []Run
	for i, d := range []int64{0, 100, 200, 300, 400, 0, 100, 200, 300, 400, 0, 100} {
		r := serviceRun(i, d)
		for j := range r.Events {
			r.Events[j].Addr = strings.Replace(r.Events[j].Addr, ":8765", ":50051", 1)
		}
		runs = append(runs, r)
	}
	res := Analyze(runs)
	t.Logf("findings:\n%s", dump(res))
	if len(res.Findings) == 0 || res.Findings[0].Resource != "port 50051" {
		t.Fatalf("top finding %+v, want it on port 50051", res.Findings)
	}
	// the accepted peers' ports (40000+i, one per run) stay ephemeral
	if strings.Contains(dump(res), "127.0.0.1:4000") {
		t.Errorf("an accept's ephemeral peer port was kept")
	}
	// and a timeline says it as the findings do
	evs, _ := TimelineWith(runs[0], 100, res.Ports)
	found := false
	for _, e := range evs {
		found = found || strings.Contains(e.Event, ":50051")
	}
	if !found {
		t.Errorf("timeline %+v does not name port 50051", evs)
	}
}
