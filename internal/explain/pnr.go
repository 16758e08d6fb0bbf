package explain

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"sbx.dev/sbx/api"
	"sbx.dev/sbx/client"
	"sbx.dev/sbx/internal/explain/analyze"
	"sbx.dev/sbx/internal/flaky"
)

// PNRClient is what the point of no return needs beyond Client: a test
// started in the background, and a fork that says when its parent's state
// was taken.
type PNRClient interface {
	Client
	ExecDetached(ctx context.Context, id string, req api.ExecRequest) (*api.Exec, error)
	ForkEvents(ctx context.Context, id string, req api.ForkRequest, fn func(api.ForkEvent) error) error
}

// PNROptions says how the point of no return is measured: at each offset
// from a run's start, Parents runs are captured and forked Ways ways.
type PNROptions struct {
	Offsets []time.Duration
	Parents int
	Ways    int
}

// Defaults of the point of no return: small, for a small test.
const (
	DefaultPNRParents = 3
	DefaultPNRWays    = 4
	// certain is the rate from which a failure is certain.
	certain = 0.9
	// exitFile, with a random name of the run's after it, is where a
	// run started in the background leaves its exit
	// code (in the sandbox's own /tmp; each fork has its own disk).
	exitFile = "/tmp/.sbx-explain-exit"
	// pnrWait bounds a background run without a --timeout: the wrapper
	// kills the test after it (a failure, as --timeout's kill is).
	pnrWait = 2 * time.Minute
	// pnrGrace is how much longer than its bound a run is waited for
	// (its fork boots, the wrapper writes its exit) before it counts as
	// one that did not say how it ended.
	pnrGrace = 30 * time.Second
)

// CurvePoint is the rate, among forks taken at AtMs of runs that went on
// to fail, of those that failed too.
type CurvePoint struct {
	AtMs   float64 `json:"atMs"`
	Runs   int     `json:"runs"`
	Failed int     `json:"failed"`
	Rate   float64 `json:"rate"`
	Low    float64 `json:"low"`
	High   float64 `json:"high"`
	// Parents is how many failing runs were forked at this offset;
	// PauseMs the longest pause a capture cost one of them.
	Parents int     `json:"parents"`
	PauseMs float64 `json:"pauseMs"`
	// Ended is how many runs had ended before this offset (not forked:
	// the offset is past the test's end).
	Ended int `json:"ended,omitempty"`
}

// DefaultOffsets are the offsets tried for runs that last about d: the
// start and each quarter of the way.
func DefaultOffsets(d time.Duration) []time.Duration {
	return []time.Duration{0, d / 4, d / 2, 3 * d / 4}
}

// PointOfNoReturnOf reads the point of no return off a curve: the earliest
// offset from which every point with forks fails at least 90% of the time
// (nil if none), and a sentence for people.
func PointOfNoReturnOf(curve []CurvePoint) (at *float64, note string) {
	idx := -1
	for i := len(curve) - 1; i >= 0; i-- {
		p := curve[i]
		if p.Runs == 0 {
			continue
		}
		if p.Rate < certain {
			break
		}
		idx = i
	}
	if idx < 0 {
		return nil, "no offset tried made the failure certain (90% of forks failing): it was decided later, or by chance to the end"
	}
	v := curve[idx].AtMs
	at, note = &v, pnrNote(curve, idx)
	// 2 of 2 forks is "90%" too: say how little that is
	if p := curve[idx]; p.Low < certain-0.3 {
		note += fmt.Sprintf(" (from %d of %d forks only: the rate there is %.0f%%-%.0f%%, more --pnr-parents or --pnr-ways tell better)", p.Failed, p.Runs, 100*p.Low, 100*p.High)
	}
	return at, note
}

// pnrNote says when the failure became certain, at curve[idx].
func pnrNote(curve []CurvePoint, idx int) string {
	v := curve[idx].AtMs
	prev := -1 // the last point before with forks
	for i := idx - 1; i >= 0; i-- {
		if curve[i].Runs > 0 {
			prev = i
			break
		}
	}
	switch {
	case v == 0:
		return "the outcome was decided before the test started: replay its seed"
	case prev < 0:
		// nothing earlier was measured: it may have been decided at the start
		return fmt.Sprintf("the failure was certain by %.0f ms, the earliest offset measured: try earlier offsets (0 tells a seed's doing)", v)
	}
	return fmt.Sprintf("the failure became certain between %.0f ms and %.0f ms after the start", curve[prev].AtMs, v)
}

// measurePNR captures runs at each offset and forks them Ways ways.
func measurePNR(ctx context.Context, c PNRClient, o Options, po PNROptions) (*PointOfNoReturn, error) {
	root := o.Sandbox
	if o.From != "" {
		// not cut off by ctx: a create the caller left is finished by
		// sbxd, and the sandbox would outlive explain (^C left it)
		sb, err := c.Create(context.WithoutCancel(ctx), client.WithFrom(o.From))
		if err != nil {
			return nil, fmt.Errorf("point of no return: create a sandbox from snapshot %s: %w", o.From, err)
		}
		root = sb.ID
		defer func() { _ = c.Delete(context.WithoutCancel(ctx), root) }()
		if err := ctx.Err(); err != nil {
			return nil, err
		}
	}
	seed := o.Seed
	if seed == nil {
		seed = rand.Uint32
	}
	out := &PointOfNoReturn{Curve: []CurvePoint{}, Before: []analyze.ExampleEvent{}}
	var firstBefore [][]analyze.ExampleEvent // per offset, a failing parent's last events
	// the curve is read from its start on: offsets in order, once each
	offsets := slices.Clone(po.Offsets)
	slices.Sort(offsets)
	offsets = slices.Compact(offsets)
	for _, off := range offsets {
		type result struct {
			failed     bool
			kids, fail int
			pause      time.Duration
			before     []analyze.ExampleEvent
			err        error
		}
		res := make([]result, po.Parents)
		var wg sync.WaitGroup
		// at most --parallel parents at once, as the runs: each holds
		// its fork and Ways children
		sem := make(chan struct{}, parallelOf(o))
		for i := range po.Parents {
			s := seed()
			sem <- struct{}{} // before the goroutine: --pnr-parents 100000 made 100000 of them wait
			wg.Go(func() {
				defer func() { <-sem }()
				r := &res[i]
				r.failed, r.kids, r.fail, r.pause, r.before, r.err = pnrParent(ctx, c, o, root, off, po.Ways, s)
			})
		}
		wg.Wait()
		p := CurvePoint{AtMs: float64(off) / 1e6}
		var before []analyze.ExampleEvent
		var errs []error
		for _, r := range res {
			if errors.Is(r.err, errEnded) {
				p.Ended++
				continue
			}
			if r.err != nil {
				errs = append(errs, r.err)
				continue
			}
			if !r.failed {
				continue // only runs that went on to fail tell when they became certain
			}
			p.Parents++
			p.Runs += r.kids
			p.Failed += r.fail
			p.PauseMs = max(p.PauseMs, float64(r.pause)/1e6)
			if before == nil {
				before = r.before
			}
		}
		if err := errors.Join(errs...); err != nil {
			return nil, fmt.Errorf("point of no return at %s: %w", off, err)
		}
		if p.Runs > 0 {
			p.Rate = float64(p.Failed) / float64(p.Runs)
		}
		p.Low, p.High = flaky.Wilson(p.Failed, p.Runs)
		out.Curve = append(out.Curve, p)
		firstBefore = append(firstBefore, before)
	}
	at, note := PointOfNoReturnOf(out.Curve)
	out.Note = note
	if at != nil {
		out.AtMs = *at
		out.Certain = true
		for i, p := range out.Curve {
			if p.AtMs == *at && firstBefore[i] != nil {
				out.Before = firstBefore[i]
			}
		}
	}
	for _, p := range out.Curve {
		out.PauseMs = max(out.PauseMs, p.PauseMs)
	}
	return out, nil
}

// pnrParent runs the test in a monitored fork of root in the background,
// forks that fork ways ways at off from the start, and waits for all:
// whether the parent failed, how many children ended and failed, how long
// the capture took (the pause, at most), and the parent's last events
// before off.
func pnrParent(ctx context.Context, c PNRClient, o Options, root string, off time.Duration, ways int, seed uint32) (failed bool, kids, fails int, pause time.Duration, before []analyze.ExampleEvent, err error) {
	wctx := context.WithoutCancel(ctx) // forks finish, and are deleted, whatever the caller does
	// an idle ttl that outlasts the run and the waits for its children:
	// should explain lose sbxd, they go by themselves
	ttl := ttlOf(2*(min(runBound(o.Test), maxBound)+pnrGrace) + 10*time.Minute)
	made, err := c.Fork(wctx, root, api.ForkRequest{Memory: true, Count: 1, Monitor: true, TTL: ttl})
	if err != nil {
		return false, 0, 0, 0, nil, err
	}
	parent := made[0].ID
	var children []string
	defer func() {
		for _, id := range append(children, parent) {
			_ = c.Delete(wctx, id)
		}
	}()
	env := append(append([]string{}, o.Test.Env...), seedEnv(o.Test)+"="+strconv.FormatUint(uint64(seed), 10))
	bound := runBound(o.Test)
	// a name the test cannot know from the start: a test that wrote a
	// fixed /tmp/.sbx-explain-exit itself had its outcome read from it
	// at once (a run that passed counted failed, with all its forks)
	file := fmt.Sprintf("%s-%016x", exitFile, rand.Uint64())
	start := time.Now()
	// the wrapper kills the test at its bound, in the children too (a
	// child carries the watchdog on; no exec of sbxd's is there to time
	// it out); sbxd's own timeout is the backstop for the parent
	x, err := c.ExecDetached(ctx, parent, api.ExecRequest{Cmd: wrapExit(o.Test.Cmd, bound, file), Env: env, Timeout: api.Duration(bound + pnrGrace)})
	if err != nil {
		return false, 0, 0, 0, nil, fmt.Errorf("start the test in %s: %w", parent, err)
	}
	// wait for the offset, or the run's end: a run that ended before it
	// has nothing left to fork (its children would only read its exit),
	// and an offset past every run's end is no hour to wait
	ended, err := waitOffset(ctx, c, parent, file, start.Add(off))
	if err != nil {
		return false, 0, 0, 0, nil, err
	}
	if ended >= 0 || ended == unknownExit {
		return false, 0, 0, 0, nil, errEnded
	}
	asked := time.Now()
	err = c.ForkEvents(wctx, parent, api.ForkRequest{Memory: true, Count: ways, TTL: ttl}, func(ev api.ForkEvent) error {
		switch ev.Event {
		case api.ForkForking:
			children = append(children, ev.IDs...)
		case api.ForkCaptured:
			pause = time.Since(asked)
		}
		return nil
	})
	if err != nil {
		return false, 0, 0, 0, nil, fmt.Errorf("fork %s at %s: %w", parent, off, err)
	}
	deadline := start.Add(bound + pnrGrace)
	code, err := waitExit(ctx, c, parent, file, deadline)
	if err != nil {
		return false, 0, 0, 0, nil, err
	}
	failed = code != 0 && code != unknownExit
	if !failed {
		return false, 0, 0, pause, nil, nil
	}
	for _, k := range children {
		code, err := waitExit(ctx, c, k, file, deadline.Add(pnrGrace))
		if err != nil {
			return false, 0, 0, 0, nil, err
		}
		if code == unknownExit {
			continue // not counted: it did not say how it ended
		}
		kids++
		if code != 0 {
			fails++
		}
	}
	if tr, err := c.Trace(ctx, parent); err == nil {
		run := analyze.Run{Root: testPid(tr.Events, int32(x.Pid)), StartNs: start.UnixNano(), Events: tr.Events}
		evs, _ := analyze.Timeline(run, 10000)
		for _, e := range evs {
			if e.AtMs <= float64(off)/1e6 {
				before = append(before, e)
			}
		}
		before = before[max(0, len(before)-10):]
	}
	return failed, kids, fails, pause, before, nil
}

// testPid is the test's pid in a background run: the first child of the
// wrapper (the process that exec'd it, argv[3] "sbx-explain"); its second
// is the watchdog, whose sleep is not the test's doing. root (the exec's
// pid) if the trace does not say.
func testPid(evs []api.TraceEvent, root int32) int32 {
	var w int32
	for _, e := range evs {
		if e.Kind == "execve" && len(e.Argv) > 3 && e.Argv[3] == wrapperName {
			w = e.Pid
			break
		}
	}
	if w == 0 {
		return root
	}
	for _, e := range evs {
		if e.Kind == "clone" && e.Pid == w && e.Child != 0 && e.Child != w {
			return e.Child
		}
	}
	return root
}

func seedEnv(t flaky.Test) string {
	if t.SeedEnv == "" {
		return flaky.DefaultSeedEnv
	}
	return t.SeedEnv
}

// parallelOf is how many runs go at once.
func parallelOf(o Options) int {
	if o.Parallel < 1 {
		return flaky.DefaultParallel
	}
	return o.Parallel
}

// forkTTL is the idle ttl of the forks of a measurement: more than a
// fork's wait for a run slot, the runs of api.MaxForks+parallel forks
// ahead of it, one at a time, when they are timed out; else a day (a
// fork whose run waited longer, behind runs of hours each, is then lost,
// and explain says so; without it, forks an sbxd that died under explain
// left stayed for good).
func forkTTL(o Options) *api.Duration {
	d := o.Test.Timeout.D()
	if d <= 0 {
		return api.DurationOf(noTimeoutTTL)
	}
	ahead := time.Duration(2 + api.MaxForks/parallelOf(o))
	return ttlOf(ahead*(min(d, maxBound)+time.Minute) + 10*time.Minute)
}

// noTimeoutTTL is the forks' idle ttl when the runs have no --timeout.
const noTimeoutTTL = 24 * time.Hour

// maxBound is the longest bound a ttl is computed from: past it (a
// --timeout of 1000000h) the products overflow.
const maxBound = 1000 * time.Hour

// ttlOf is a fork's ttl, none (nil: the parent's) past what a duration
// holds.
func ttlOf(d time.Duration) *api.Duration {
	if d <= 0 || d > 100*maxBound {
		return nil
	}
	return api.DurationOf(d)
}

// runBound is how long a background run may go: the test's --timeout,
// else pnrWait.
func runBound(t flaky.Test) time.Duration {
	if d := t.Timeout.D(); d > 0 {
		return min(d, maxBound)
	}
	return pnrWait
}

// wrapExit runs cmd, killed after bound (a failure, as --timeout's kill
// is), and leaves its exit code in file, so that a fork that carries
// the run on can tell how it ended.
func wrapExit(cmd []string, bound time.Duration, file string) []string {
	script := fmt.Sprintf(`"$@" & p=$!; (sleep %.3f; kill -9 $p) >/dev/null 2>&1 & w=$!; wait $p; c=$?; kill $w 2>/dev/null; `+
		`echo $c > %s.tmp && mv %s.tmp %s`, bound.Seconds(), file, file, file)
	return append([]string{"/bin/sh", "-c", script, wrapperName}, cmd...)
}

// errEnded says a run ended before its offset came.
var errEnded = errors.New("the run ended before its offset")

// waitOffset waits until at, looking for the run's end in sandbox id
// every half second meanwhile: its exit code if it ended first, else -2.
func waitOffset(ctx context.Context, c PNRClient, id, file string, at time.Time) (int, error) {
	for {
		wait := time.Until(at)
		if wait <= 0 {
			return -2, nil
		}
		select {
		case <-ctx.Done():
			return 0, ctx.Err()
		case <-time.After(min(wait, 500*time.Millisecond)):
		}
		if time.Until(at) <= 0 {
			return -2, nil
		}
		if code, ok, err := readExit(ctx, c, id, file); err != nil || ok {
			return code, err
		}
	}
}

// wrapperName is the wrapper's $0.
const wrapperName = "sbx-explain"

// unknownExit is the exit of a run whose exit file holds no exit code.
const unknownExit = -1

// waitExit waits, until deadline, for the background run in sandbox id
// to leave its exit code; one that has not by then did not say how it
// ended (unknownExit: its watchdog was killed, or the sandbox lies).
func waitExit(ctx context.Context, c PNRClient, id, file string, deadline time.Time) (int, error) {
	for {
		if code, ok, err := readExit(ctx, c, id, file); err != nil || ok {
			return code, err
		}
		if time.Now().After(deadline) {
			return unknownExit, nil
		}
		select {
		case <-ctx.Done():
			return 0, ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// readExit reads the exit the background run in sandbox id left, if it
// has (ok).
func readExit(ctx context.Context, c PNRClient, id, file string) (code int, ok bool, err error) {
	var out bytes.Buffer
	x, err := c.Exec(ctx, id, api.ExecRequest{Cmd: []string{"cat", file}, Timeout: api.Duration(10 * time.Second)}, &limitWriter{w: &out, n: 64}, io.Discard)
	if err != nil {
		return 0, false, fmt.Errorf("read the exit of the run in %s: %w", id, err)
	}
	if x.ExitCode == nil || *x.ExitCode != 0 {
		return 0, false, nil
	}
	code, err = strconv.Atoi(strings.TrimSpace(out.String()))
	if err != nil || code < 0 || code > 255 {
		// the test wrote the file itself: its outcome is unknown
		return unknownExit, true, nil
	}
	return code, true, nil
}

// limitWriter keeps the first n bytes: what a sandbox prints is untrusted.
type limitWriter struct {
	w io.Writer
	n int
}

func (l *limitWriter) Write(p []byte) (int, error) {
	if l.n > 0 {
		k := min(l.n, len(p))
		l.w.Write(p[:k])
		l.n -= k
	}
	return len(p), nil
}
