// Package explain says why a flaky test fails: it runs the test in N memory
// forks of one ready state, as flake-rate does, each with runtime
// monitoring, and compares what the failing runs did with what the passing
// runs did (package analyze). It is a workflow on the client package.
package explain

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"sbx.dev/sbx/api"
	"sbx.dev/sbx/internal/explain/analyze"
	"sbx.dev/sbx/internal/flaky"
)

// Client is the slice of the client explain uses: flake-rate's, and the
// trace of a monitored sandbox.
type Client interface {
	flaky.Client
	Trace(ctx context.Context, id string) (*api.Trace, error)
}

// DefaultRuns is how many runs explain makes unless told: enough for
// Fisher's test to separate a feature of every failure at a rate of 20-80%.
const DefaultRuns = 24

// Options says what to explain and how.
type Options struct {
	// Sandbox or From (a snapshot) is the ready state, as for flake-rate.
	Sandbox, From string
	// N runs (0: DefaultRuns), Parallel at once (0: flaky.DefaultParallel).
	N, Parallel int
	Test        flaky.Test
	Seed        func() uint32
	// Knobs are the perturbations whose rates are measured, each value
	// in KnobRuns forks (0: DefaultKnobRuns) without monitoring.
	Knobs    []KnobValue
	KnobRuns int
	// PNR, if set, measures the point of no return; empty Offsets are
	// DefaultOffsets of the failing runs' median time.
	PNR *PNROptions
	// Fixed, if set, is the fixed test: once the rate is known, it runs
	// as many times as prove the fix at 99% (see VerifyFix).
	Fixed *flaky.Test
	// Progress, if set, hears what happens, one event at a time.
	Progress func(Progress)
}

// Progress is one progress line of `sbx explain --json`.
type Progress struct {
	Event string `json:"event"` // "forked", "run", "knob"
	// forked: Ready of N forks made
	Ready int `json:"ready,omitempty"`
	N     int `json:"n,omitempty"`
	// run: the run, how many of its test's events its trace held and
	// how many the trace lost
	*flaky.Run
	Events  int   `json:"events,omitempty"`
	Dropped int64 `json:"dropped,omitempty"`
	// knob: one value's rate
	Knob *Knob `json:"knob,omitempty"`
}

// Rate is the failure rate with its 95% Wilson interval.
type Rate struct {
	Rate float64 `json:"rate"`
	Low  float64 `json:"low"`
	High float64 `json:"high"`
}

// Explained is what explain found, the last line of `sbx explain --json`.
type Explained struct {
	Event  string `json:"event"` // "explained"
	Runs   int    `json:"runs"`
	Failed int    `json:"failed"`
	Rate   Rate   `json:"rate"`
	// Divergence is what failing runs did that passing runs did not (or
	// the other way round), best separating first.
	Divergence []analyze.Finding `json:"divergence"`
	// Note says why there is no divergence, when there is none.
	Note string `json:"note,omitempty"`
	// Dropped counts the trace events lost over all runs; Empty the runs
	// whose trace held nothing of their test.
	Dropped int64 `json:"dropped"`
	Empty   int   `json:"empty"`
	// Knobs and PointOfNoReturn are not measured yet (empty, null).
	Knobs           []Knob           `json:"knobs"`
	KnobVerdicts    []KnobVerdict    `json:"knobVerdicts"`
	PointOfNoReturn *PointOfNoReturn `json:"pointOfNoReturn"`
	Report          string           `json:"report,omitempty"`
	// Fix is the verification of the fixed test, when one was given.
	Fix *Verdict `json:"fix,omitempty"`
	// RunList is every run, in run order.
	RunList []flaky.Run `json:"runList"`
	// Timelines are a failing and a passing run's events, for the report.
	Timelines []TimelineRun `json:"-"`

	// KnobSkipped are the knob values sbxd refused, with why.
	KnobSkipped []string `json:"knobsSkipped,omitempty"`
}

// Knob is the rate under one perturbation.
type Knob struct {
	Knob   string  `json:"knob"`
	Value  string  `json:"value"`
	Runs   int     `json:"runs"`
	Failed int     `json:"failed"`
	Rate   float64 `json:"rate"`
	Low    float64 `json:"low"`
	High   float64 `json:"high"`
}

// KnobVerdict says whether a knob changes the rate beyond chance: Fisher's
// exact test of its value with the highest rate against the one with the
// lowest.
type KnobVerdict struct {
	Knob    string  `json:"knob"`
	Changes bool    `json:"changes"`
	P       float64 `json:"p"`
	Summary string  `json:"summary"`
}

// KnobValue is one perturbation: a CPU quota per fork, a delay or a loss
// on what leaves each fork, or environment variables added to the test's.
type KnobValue struct {
	Knob  string // "cpus", "net-delay", "net-loss", or the variable's name
	Value string
	CPUs  float64
	Shape *api.NetShape // nil: the state's own (none)
	Env   []string
}

// same reports whether k and o perturb the runs alike (the baseline of
// net-delay, 0, is the baseline of net-loss): one is measured for both.
func (k KnobValue) same(o KnobValue) bool {
	if k.CPUs != o.CPUs || strings.Join(k.Env, "\x00") != strings.Join(o.Env, "\x00") {
		return false
	}
	if k.Shape == nil || o.Shape == nil {
		return k.Shape == o.Shape
	}
	return *k.Shape == *o.Shape
}

// DefaultKnobRuns is how many runs each knob value gets unless told.
const DefaultKnobRuns = 8

// DefaultCPUs are the CPU quotas explain tries unless told.
var DefaultCPUs = []float64{0.25, 0.5, 1, 2}

// The network knob's values unless told: none against a delay of each
// packet leaving a fork, and against a loss of some of them.
var (
	DefaultNetDelays = []time.Duration{0, 100 * time.Millisecond}
	DefaultNetLosses = []float64{0, 0.1}
)

// PointOfNoReturn is when the failure became certain: the curve of the
// rate among forks of failing runs taken at offsets from their start.
type PointOfNoReturn struct {
	// AtMs is the earliest offset from which forks fail at least 90% of
	// the time (with Certain; else no offset tried made it certain).
	AtMs    float64      `json:"atMs"`
	Certain bool         `json:"certain"`
	Curve   []CurvePoint `json:"curve"`
	// Before are a failing run's last events before AtMs.
	Before []analyze.ExampleEvent `json:"before"`
	// PauseMs is the longest a capture paused a run (at most: it is
	// measured from the fork's call to its capture's end).
	PauseMs float64 `json:"pauseMs"`
	Note    string  `json:"note"`
}

// eventBudget bounds the events explain holds over all runs, each run
// keeping at least minRunEvents of its own: the analysis costs up to
// some 1.6 KB an event (distinct in each run), so about 1 GB at most.
// MaxRuns keeps the floor inside the budget (with a floor of 2000 and no
// bound on -n, -n 100000 was 200 million events).
const (
	eventBudget  = 600_000
	MaxRuns      = 1000
	minRunEvents = eventBudget / MaxRuns
)

// traceSettle bounds the wait for a run's last events, which gVisor sends
// after the exec has ended: its root's exit is the sign they are in.
const traceSettle = 2 * time.Second

// Explain runs the test N times from one ready state with monitoring and
// reports the rate and the divergence. A test that fails is a result; an
// error is operational (as flake-rate's), and then no fork is left.
func Explain(ctx context.Context, c Client, o Options) (*Explained, error) {
	n := o.N
	if n == 0 {
		n = DefaultRuns
	}
	if n > MaxRuns {
		return nil, api.Errorf(api.ErrInvalid, "explain: %d runs: at most %d (each run's trace is kept for the analysis)", n, MaxRuns)
	}
	var (
		mu     sync.Mutex
		traces = make([]analyze.Run, n)
	)
	ro := flaky.RateOptions{
		Sandbox: o.Sandbox, From: o.From, N: n, Parallel: o.Parallel, Test: o.Test, Seed: o.Seed,
		Monitor: true, ForkTTL: forkTTL(o),
		Inspect: func(ctx context.Context, r flaky.Run) error {
			tr, err := readTrace(ctx, c, r)
			if err != nil {
				return err
			}
			run := analyze.Run{Run: r.Run, Seed: r.Seed, Failed: !r.Pass, Root: int32(r.Pid),
				Dropped: tr.Dropped + tr.SentryDropped, Events: tr.Events}
			if !r.Started.IsZero() {
				run.StartNs = r.Started.UnixNano()
			}
			// keep only the test's own events, and no more than the budget
			// gives a run: N traces of a whole sandbox are big
			run.Events = analyze.Select(run)
			if keep := max(minRunEvents, eventBudget/n); len(run.Events) > keep {
				run.Dropped += int64(len(run.Events) - keep)
				run.Events = run.Events[:keep]
			}
			mu.Lock()
			traces[r.Run] = run
			mu.Unlock()
			return nil
		},
	}
	if o.Progress != nil {
		ro.Forked = func(ready, n int) { o.Progress(Progress{Event: "forked", Ready: ready, N: n}) }
		ro.Progress = func(r flaky.Run) {
			mu.Lock()
			t := traces[r.Run]
			mu.Unlock()
			o.Progress(Progress{Event: "run", Run: &r, Events: len(t.Events), Dropped: t.Dropped})
		}
	}
	res, err := flaky.FlakeRate(ctx, c, ro)
	if err != nil {
		return nil, fmt.Errorf("explain: %w", err)
	}
	a := analyze.Analyze(traces)
	s := res.Summary
	out := &Explained{
		Event: "explained", Runs: s.Runs, Failed: s.Failures,
		Rate:       Rate{Rate: s.Rate, Low: s.Wilson95[0], High: s.Wilson95[1]},
		Divergence: a.Findings, Note: a.Note, Dropped: a.Dropped, Empty: a.Empty,
		Knobs: []Knob{}, KnobVerdicts: []KnobVerdict{}, RunList: res.Runs,
		Timelines: pair(traces, a.Findings, a.Ports),
	}
	at := make([]int, len(o.Knobs)) // where each value's rate is in out.Knobs (-1: left out)
	for i, kv := range o.Knobs {
		at[i] = -1
		var k Knob
		measured := false
		for j := range i {
			if at[j] >= 0 && o.Knobs[j].same(kv) {
				k, measured = out.Knobs[at[j]], true
				k.Knob, k.Value = kv.Knob, kv.Value
				break
			}
		}
		if !measured {
			var err error
			k, err = measureKnob(ctx, c, o, kv)
			if errors.Is(err, api.ErrInvalid) && ctx.Err() == nil {
				// a value sbxd refuses (a CPU quota above its host's, as the
				// default 2 on one CPU): the runs measured stand
				out.KnobSkipped = append(out.KnobSkipped, fmt.Sprintf("%s=%s: %v", kv.Knob, kv.Value, err))
				continue
			}
			if err != nil {
				return nil, fmt.Errorf("explain: knob %s=%s: %w", kv.Knob, kv.Value, err)
			}
		}
		at[i] = len(out.Knobs)
		out.Knobs = append(out.Knobs, k)
		if o.Progress != nil {
			o.Progress(Progress{Event: "knob", Knob: &k})
		}
	}
	out.KnobVerdicts = Verdicts(out.Knobs)
	if o.PNR != nil && s.Failures > 0 {
		pc, ok := c.(PNRClient)
		if !ok {
			return nil, fmt.Errorf("explain: the client cannot start runs in the background")
		}
		po := *o.PNR
		if len(po.Offsets) == 0 {
			po.Offsets = DefaultOffsets(medianFailing(res.Runs))
		}
		if po.Parents == 0 {
			po.Parents = DefaultPNRParents
		}
		if po.Ways == 0 {
			po.Ways = DefaultPNRWays
		}
		if out.PointOfNoReturn, err = measurePNR(ctx, pc, o, po); err != nil {
			return nil, fmt.Errorf("explain: %w", err)
		}
		if o.Progress != nil {
			o.Progress(Progress{Event: "pointOfNoReturn"})
		}
	}
	if o.Fixed != nil {
		if out.Fix, err = VerifyFix(ctx, c, o, *o.Fixed, s.Rate); err != nil {
			return nil, fmt.Errorf("explain: %w", err)
		}
	}
	return out, nil
}

// medianFailing is the median time of the failing runs.
func medianFailing(runs []flaky.Run) time.Duration {
	var ds []int64
	for _, r := range runs {
		if !r.Pass {
			ds = append(ds, r.DurationMs)
		}
	}
	if len(ds) == 0 {
		return time.Second
	}
	slices.Sort(ds)
	return time.Duration(ds[len(ds)/2]) * time.Millisecond
}

// pair picks the runs the report shows side by side: the top finding's
// example and the first run of the other outcome.
func pair(traces []analyze.Run, findings []analyze.Finding, ports map[string]bool) []TimelineRun {
	first := -1
	if len(findings) > 0 {
		first = findings[0].Example.Run
	}
	var fail, pass *analyze.Run
	for i := range traces {
		t := &traces[i]
		switch {
		case t.Failed && (fail == nil || t.Run == first):
			fail = t
		case !t.Failed && (pass == nil || t.Run == first):
			pass = t
		}
	}
	var out []TimelineRun
	for _, t := range []*analyze.Run{fail, pass} {
		if t == nil {
			continue
		}
		evs, cut := analyze.TimelineWith(*t, maxTimeline, ports)
		out = append(out, TimelineRun{Run: t.Run, Seed: t.Seed, Failed: t.Failed, Events: evs, Cut: cut})
	}
	return out
}

// measureKnob measures the rate with one perturbation applied per fork.
func measureKnob(ctx context.Context, c Client, o Options, kv KnobValue) (Knob, error) {
	n := o.KnobRuns
	if n == 0 {
		n = DefaultKnobRuns
	}
	t := o.Test
	t.Env = append(append([]string{}, t.Env...), kv.Env...)
	res, err := flaky.FlakeRate(ctx, c, flaky.RateOptions{
		Sandbox: o.Sandbox, From: o.From, N: n, Parallel: o.Parallel, Test: t, Seed: o.Seed, CPUs: kv.CPUs, Shape: kv.Shape, ForkTTL: forkTTL(o),
	})
	if err != nil {
		return Knob{}, err
	}
	s := res.Summary
	return Knob{Knob: kv.Knob, Value: kv.Value, Runs: s.Runs, Failed: s.Failures, Rate: s.Rate, Low: s.Wilson95[0], High: s.Wilson95[1]}, nil
}

// Verdicts says, for each knob, whether it changes the rate beyond chance
// (Fisher's exact test, p < 0.05, of the values with the highest and the
// lowest rate): "cpus: timing-dependent: 100% [68, 100] at 0.25, 12% [2, 47] at 2".
func Verdicts(knobs []Knob) []KnobVerdict {
	out := []KnobVerdict{}
	var names []string
	by := map[string][]Knob{}
	for _, k := range knobs {
		if by[k.Knob] == nil {
			names = append(names, k.Knob)
		}
		by[k.Knob] = append(by[k.Knob], k)
	}
	for _, name := range names {
		ks := by[name]
		hi, lo := ks[0], ks[0]
		for _, k := range ks {
			if k.Rate > hi.Rate {
				hi = k
			}
			if k.Rate < lo.Rate {
				lo = k
			}
		}
		p := analyze.Fisher(hi.Failed, hi.Runs-hi.Failed, lo.Failed, lo.Runs-lo.Failed)
		v := KnobVerdict{Knob: name, P: p, Changes: p < 0.05 && hi.Rate > lo.Rate}
		span := fmt.Sprintf("%s at %s, %s at %s", pct(hi), hi.Value, pct(lo), lo.Value)
		if hi.Rate == lo.Rate {
			span = fmt.Sprintf("%s at every value", pct(hi))
		}
		if v.Changes {
			word := "changes the rate"
			switch name {
			case "cpus":
				word = "timing-dependent"
			case "net-delay", "net-loss":
				word = "network-dependent"
			}
			v.Summary = fmt.Sprintf("%s: %s: %s (Fisher p=%.2g)", name, word, span, p)
		} else {
			v.Summary = fmt.Sprintf("%s: no change beyond chance: %s (Fisher p=%.2g)", name, span, p)
		}
		out = append(out, v)
	}
	return out
}

func pct(k Knob) string {
	return fmt.Sprintf("%.0f%% [%.0f, %.0f]", 100*k.Rate, 100*k.Low, 100*k.High)
}

// readTrace reads run r's trace once its root's exit is in, or after
// traceSettle at the latest.
func readTrace(ctx context.Context, c Client, r flaky.Run) (*api.Trace, error) {
	deadline := time.Now().Add(traceSettle)
	for {
		tr, err := c.Trace(ctx, r.Sandbox)
		if err != nil {
			return nil, fmt.Errorf("trace: %w", err)
		}
		if r.Pid == 0 || rootExited(tr, int32(r.Pid)) || time.Now().After(deadline) || len(tr.Events) >= tr.Limit || tr.Full {
			return tr, nil
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
}

func rootExited(tr *api.Trace, pid int32) bool {
	for i := len(tr.Events) - 1; i >= 0; i-- {
		if e := tr.Events[i]; e.Kind == "exit" && e.Pid == pid {
			return true
		}
	}
	return false
}
