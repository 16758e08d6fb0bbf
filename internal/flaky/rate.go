package flaky

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"sbx.dev/sbx/api"
	"sbx.dev/sbx/client"
)

// RateOptions says what FlakeRate measures and how.
type RateOptions struct {
	// Sandbox is forked, or, when From is set instead, a sandbox made from
	// the snapshot From (and deleted afterwards). Exactly one must be set.
	Sandbox string
	From    string
	// N is how many forks, one run each.
	N int
	// Parallel bounds how many runs go at once; 0 means DefaultParallel.
	Parallel int
	// KeepFailures keeps the forks whose run failed, each as a memory fork
	// of itself named after its seed (KeptName) with the idle ttl KeepTTL
	// (0: DefaultKeepTTL; KeepForever: none); the rest are deleted.
	KeepFailures bool
	KeepTTL      time.Duration
	Test         Test
	// Seed gives each run its seed; nil means a fresh random uint32. The
	// seeds of one measurement are distinct.
	Seed func() uint32
	// Monitor forks with runtime monitoring, each fork tracing its run.
	Monitor bool
	// CPUs is each fork's CPU quota (0: the state's own).
	CPUs float64
	// Shape perturbs what leaves each fork (nil: as the state's own).
	Shape *api.NetShape
	// ForkTTL, if set, is each fork's idle ttl (else the state's own):
	// should the client lose sbxd before it could delete them, forks
	// of a state without one would stay for good. It must outlast a
	// fork's wait for its run (its run's exec counts as activity).
	ForkTTL *api.Duration
	// Inspect, if set, is called as each run ends, with its fork still
	// there (r.Sandbox) and before Progress; explain reads the run's trace.
	// Calls may come at once. An error ends the measurement.
	Inspect func(ctx context.Context, r Run) error
	// Progress, if set, hears of each run as it ends, one at a time.
	Progress func(Run)
	// Forked, if set, hears how many of the N forks have been made, after
	// each batch; the runs go meanwhile, but Forked and Progress are never
	// called at once.
	Forked func(ready, n int)
}

// DefaultKeepTTL is the idle ttl of a failure FlakeRate keeps: long enough
// to come back to it, short enough that forgotten ones do not pile up.
const DefaultKeepTTL = 2 * time.Hour

// KeepForever, as a KeepTTL, is no idle ttl: what is kept stays until it
// is deleted (`--keep-ttl 0`, as `--ttl 0` everywhere in sbx).
const KeepForever time.Duration = -1

// keepTTL is the idle ttl a KeepTTL of d gives (0: none).
func keepTTL(d time.Duration) time.Duration {
	switch d {
	case 0:
		return DefaultKeepTTL
	case KeepForever:
		return 0
	}
	return d
}

// KeptName is the name of a kept failure: flake-SEED, or flake-SEED-N for
// the Nth try when that name is taken (an earlier measurement's).
func KeptName(seed uint32, try int) string {
	if try == 0 {
		return fmt.Sprintf("flake-%d", seed)
	}
	return fmt.Sprintf("flake-%d-%d", seed, try+1)
}

// keptNameTries is how many names KeepFailures tries before it keeps the
// failure under its id.
const keptNameTries = 5

// RateSummary is the measured failure rate, as `--json` prints it last.
type RateSummary struct {
	Runs     int        `json:"runs"`
	Failures int        `json:"failures"`
	Rate     float64    `json:"rate"`
	Wilson95 [2]float64 `json:"wilson95"`
	// Kept are the failing forks left for a look (with KeepFailures).
	Kept []string `json:"kept"`
}

// String is the summary for people:
// "7/50 failed: rate 14.0% (95% Wilson interval 7.0%–26.2%)".
func (s RateSummary) String() string {
	return fmt.Sprintf("%d/%d failed: rate %.1f%% (95%% Wilson interval %.1f%%–%.1f%%)",
		s.Failures, s.Runs, 100*s.Rate, 100*s.Wilson95[0], 100*s.Wilson95[1])
}

// Summarize counts runs' failures and puts the Wilson interval on the rate.
func Summarize(runs []Run) RateSummary {
	s := RateSummary{Runs: len(runs), Kept: []string{}}
	for _, r := range runs {
		if !r.Pass {
			s.Failures++
		}
	}
	if s.Runs > 0 {
		s.Rate = float64(s.Failures) / float64(s.Runs)
	}
	s.Wilson95[0], s.Wilson95[1] = Wilson(s.Failures, s.Runs)
	return s
}

// RateResult is what FlakeRate measured: every run in run order and the summary.
type RateResult struct {
	Runs    []Run
	Summary RateSummary
}

// FlakeRate forks N sandboxes with memory from one ready state (grown
// api.MaxForks at a time, each batch forked from that state itself), runs
// the test once in each with its own seed, at most Parallel at once, and
// measures the failure rate. Runs start as soon as their forks exist, while
// the next batch is made; at most Parallel+api.MaxForks forks, kept ones
// aside, are alive at once. Every fork is deleted in the background as its
// run ends, except failing ones with KeepFailures, and FlakeRate returns
// once they are gone. A test that fails is a result, not an error; an error
// is operational (a fork, exec or delete that did not work, the end of ctx,
// api.ErrInvalid for bad options) and then no fork is left.
func FlakeRate(ctx context.Context, c Client, o RateOptions) (*RateResult, error) {
	if err := o.validate(); err != nil {
		return nil, err
	}
	root := o.Sandbox
	if o.From != "" {
		// Not cut off by ctx: sbxd finishes a create whose caller left,
		// and the sandbox, never named to us, would outlive the
		// measurement (^C while it was made left it).
		sb, err := c.Create(context.WithoutCancel(ctx), client.WithFrom(o.From))
		if err != nil {
			return nil, fmt.Errorf("flake-rate: create a sandbox from snapshot %s: %w", o.From, err)
		}
		root = sb.ID
		if err := ctx.Err(); err != nil {
			return nil, errors.Join(err, deleteAll(ctx, c, []string{root}))
		}
	}
	res, err := flakeRate(ctx, c, root, o)
	if o.From != "" {
		if derr := deleteAll(ctx, c, []string{root}); derr != nil {
			err = errors.Join(err, fmt.Errorf("flake-rate: %w", derr))
		}
	}
	if err != nil {
		return nil, err
	}
	return res, nil
}

func (o RateOptions) validate() error {
	switch {
	case o.Sandbox == "" && o.From == "":
		return api.Errorf(api.ErrInvalid, "flake-rate: give a sandbox to fork, or a snapshot to start from")
	case o.Sandbox != "" && o.From != "":
		return api.Errorf(api.ErrInvalid, "flake-rate: give a sandbox or a snapshot, not both")
	case o.N < 1:
		return api.Errorf(api.ErrInvalid, "flake-rate: want at least 1 run, got %d", o.N)
	case o.Parallel < 0:
		return api.Errorf(api.ErrInvalid, "flake-rate: want a parallelism of at least 1, got %d", o.Parallel)
	case o.KeepTTL < 0 && o.KeepTTL != KeepForever:
		return api.Errorf(api.ErrInvalid, "flake-rate: the ttl of kept failures is negative (%s)", o.KeepTTL)
	}
	return o.Test.validate()
}

// flakeRate is FlakeRate forking root, as a pipeline: grow makes the forks
// batch by batch while dispatch starts runs in the forks already made, and
// each fork is deleted in the background as its run ends. It returns once
// grow, every run and every delete are done; on an error, once every fork
// it made is gone too.
func flakeRate(ctx context.Context, c Client, root string, o RateOptions) (*RateResult, error) {
	parallel := o.Parallel
	if parallel < 1 {
		parallel = DefaultParallel
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	p := &ratePipeline{
		c: c, root: root, o: o, seed: seeds(o.N, o.Seed),
		parallel: parallel, maxLive: parallel + api.MaxForks,
		ctx: ctx, cancel: cancel,
		gone:    map[string]bool{},
		runs:    make([]Run, o.N),
		deletes: make(chan struct{}, rateDeletes),
	}
	p.cond = sync.NewCond(&p.mu)
	stop := context.AfterFunc(ctx, func() {
		p.mu.Lock()
		defer p.mu.Unlock()
		p.cond.Broadcast() // wake grow and dispatch to see the end
	})
	defer stop()

	p.wg.Go(p.grow)
	p.dispatch()
	p.wg.Wait()
	if err := p.err(); err != nil {
		if derr := p.deleteLeft(); derr != nil {
			err = errors.Join(err, derr)
		}
		return nil, fmt.Errorf("flake-rate of %s: %w", root, err)
	}
	s := Summarize(p.runs)
	for _, r := range p.runs {
		if !r.Pass && o.KeepFailures {
			s.Kept = append(s.Kept, r.Sandbox) // the kept fork's name
		}
	}
	return &RateResult{Runs: p.runs, Summary: s}, nil
}

// rateDeletes is how many finished forks are deleted at once. Deletes are
// off the run slots, so a few keep up with the runs (a delete costs about a
// third of a run) without taking the CPU the runs and forks need.
const rateDeletes = 2

// ratePipeline is one FlakeRate under way. Run i goes in forks[i] with
// seed[i], whatever order the forks and runs finish in.
type ratePipeline struct {
	c        Client
	root     string
	o        RateOptions
	seed     []uint32
	parallel int
	// maxLive bounds the forks alive at once (made, not yet deleted, not
	// kept), for memory: the Parallel running and one batch of api.MaxForks
	// made while they run. A kept failure is not counted: it stays on
	// purpose, and counting it would stall the runs once enough had failed.
	maxLive int
	ctx     context.Context // ends at the first error, or with the caller's
	cancel  context.CancelFunc

	mu      sync.Mutex
	cond    *sync.Cond      // broadcast on any change below, and when ctx ends
	forks   []string        // every fork made, in run order (a kept failure's, once kept)
	stray   []string        // failing forks that were kept as forks of theirs, not yet deleted
	ready   int             // forks[:ready] may run (a failed call's partial batch may not)
	gone    map[string]bool // forks deleted
	live    int             // forks made, not yet deleted, not kept: what maxLive bounds
	running int             // runs under way, at most parallel
	done    int             // runs ended with a result
	runs    []Run
	errs    []error

	report  sync.Mutex    // Progress and Forked hear one thing at a time
	deletes chan struct{} // a token per delete under way
	wg      sync.WaitGroup
}

// grow makes the N forks, at most api.MaxForks per call, each batch when the
// live forks leave room for it. Every batch is forked from the root itself,
// not from forks made before as a tree would: a fork may have run its test
// by the time the next batch is due, and its children would then carry that
// run; the root never runs it. Nothing is lost against a tree: either way a
// call captures its parent once and boots its children, one call per batch,
// and a tree's spare parents would have to be held back from running.
func (p *ratePipeline) grow() {
	n := p.o.N
	for made := 0; made < n; {
		k := min(api.MaxForks, n-made)
		p.mu.Lock()
		for p.live+k > p.maxLive && p.ctx.Err() == nil {
			p.cond.Wait()
		}
		p.mu.Unlock()
		if p.ctx.Err() != nil {
			return
		}
		// Not cut off by ctx: sbxd finishes a fork whose caller left, and
		// its children, never named to us, would outlive the measurement.
		// The runs' crashes are counted, not caught: a capture per failing
		// run would be an image per run (the failure to look at is kept
		// as it is, by keep).
		kids, err := p.c.Fork(context.WithoutCancel(p.ctx), p.root, api.ForkRequest{Memory: true, Count: k, Monitor: p.o.Monitor, CPUs: p.o.CPUs, Shape: p.o.Shape, TTL: p.o.ForkTTL, Meta: map[string]string{api.MetaCrashes: "off"}})
		if err == nil && len(kids) != k {
			err = fmt.Errorf("fork %s: asked for %d children, got %d", p.root, k, len(kids))
		}
		p.mu.Lock()
		for _, kid := range kids {
			p.forks = append(p.forks, kid.ID)
		}
		p.live += len(kids)
		if err == nil {
			p.ready = len(p.forks)
		}
		made = len(p.forks)
		p.cond.Broadcast()
		p.mu.Unlock()
		if err != nil {
			p.fail(fmt.Errorf("%d of %d forks of %s made, deleting them: %w", made, n, p.root, err))
			return
		}
		if p.o.Forked != nil {
			p.report.Lock()
			p.o.Forked(made, n)
			p.report.Unlock()
		}
	}
}

// dispatch starts run i as soon as fork i exists and a run slot is free, in
// run order, until all N have started or ctx ends.
func (p *ratePipeline) dispatch() {
	for i := range p.o.N {
		p.mu.Lock()
		for (p.ready <= i || p.running == p.parallel) && p.ctx.Err() == nil {
			p.cond.Wait()
		}
		if p.ctx.Err() != nil {
			p.mu.Unlock()
			return
		}
		p.running++
		id := p.forks[i]
		p.mu.Unlock()
		p.wg.Go(func() { p.run(i, id) })
	}
}

// run runs the test in fork id, frees its slot, and hands the fork to a
// background delete unless it is a failure to keep.
func (p *ratePipeline) run(i int, id string) {
	r, err := p.o.Test.exec(p.ctx, p.c, i, id, p.seed[i])
	if err == nil && p.o.Inspect != nil {
		if err = p.o.Inspect(p.ctx, r); err != nil {
			err = fmt.Errorf("run %d (seed %d) in %s: %w", i, r.Seed, id, err)
		}
	}
	// a measurement cut short keeps nothing: what it made goes
	keep := err == nil && !r.Pass && p.o.KeepFailures && p.ctx.Err() == nil
	if keep {
		r.Sandbox, err = p.keep(i, id, r.Seed)
	}
	p.mu.Lock()
	p.running--
	if err == nil {
		p.runs[i] = r
		p.done++
	}
	if keep {
		p.live--
	}
	p.cond.Broadcast()
	p.mu.Unlock()
	if !keep {
		p.wg.Go(func() { p.deleteFork(i, id) })
	}
	if err != nil {
		p.fail(err)
		return
	}
	if p.o.Progress != nil {
		p.report.Lock()
		p.o.Progress(r)
		p.report.Unlock()
	}
}

// keep turns the failing fork id of run i into one a person can find and
// that goes away by itself: a memory fork of it (the failure's processes
// and memory carry on) named after its seed, with KeepTTL; the fork itself
// is deleted. It returns the kept sandbox's name. If the fork cannot be
// made, the failure is kept as it is, with the ttl, under its id.
func (p *ratePipeline) keep(i int, id string, seed uint32) (string, error) {
	ttl := keepTTL(p.o.KeepTTL)
	// Not cut off by ctx, as grow's forks are not: a named child made after
	// the caller left would outlive the measurement.
	ctx := context.WithoutCancel(p.ctx)
	for try := range keptNameTries {
		name := KeptName(seed, try)
		kids, err := p.c.Fork(ctx, id, api.ForkRequest{Memory: true, Count: 1, Name: name, TTL: api.DurationOf(ttl)})
		if errors.Is(err, api.ErrConflict) {
			continue // the name is an earlier measurement's
		}
		if err != nil || len(kids) != 1 {
			break
		}
		p.mu.Lock()
		p.forks[i] = kids[0].ID // what an error deletes from now on
		p.mu.Unlock()
		p.wg.Go(func() {
			if err := p.delete(id); err != nil {
				p.mu.Lock()
				p.stray = append(p.stray, id) // for deleteLeft to try again
				p.mu.Unlock()
				p.fail(fmt.Errorf("run %d: %w", i, err))
			}
		})
		return name, nil
	}
	if _, err := p.c.SetTTL(ctx, id, ttl); err != nil {
		return id, fmt.Errorf("run %d (seed %d): keep %s: %w", i, seed, id, err)
	}
	return id, nil
}

// deleteFork deletes run i's fork, at most rateDeletes at once, and makes
// room for the next batch.
func (p *ratePipeline) deleteFork(i int, id string) {
	err := p.delete(id)
	p.mu.Lock()
	p.live--
	if err == nil {
		p.gone[id] = true
	}
	p.cond.Broadcast()
	p.mu.Unlock()
	if err != nil {
		p.fail(fmt.Errorf("run %d: %w", i, err))
	}
}

// delete deletes one fork when a delete token is free.
func (p *ratePipeline) delete(id string) error {
	p.deletes <- struct{}{}
	defer func() { <-p.deletes }()
	return deleteAll(p.ctx, p.c, []string{id})
}

// fail records err and ends ctx, which stops grow and dispatch and cuts the
// runs under way short. The errors those runs then return only echo the
// end of ctx and are dropped.
func (p *ratePipeline) fail(err error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if cause := p.ctx.Err(); cause != nil && len(p.errs) > 0 && errors.Is(err, cause) {
		return
	}
	p.errs = append(p.errs, err)
	p.cancel()
}

// err is what ended the measurement short, once everything has stopped:
// the errors, or the caller's ctx if it ended first; nil if all N ran.
func (p *ratePipeline) err() error {
	if len(p.errs) > 0 {
		return errors.Join(p.errs...)
	}
	if p.done < p.o.N {
		return context.Cause(p.ctx)
	}
	return nil
}

// deleteLeft deletes every fork still there (kept failures too), after
// everything else has stopped.
func (p *ratePipeline) deleteLeft() error {
	var left []string
	for _, id := range p.forks {
		if !p.gone[id] {
			left = append(left, id)
		}
	}
	left = append(left, p.stray...)
	errs := make([]error, len(left))
	var wg sync.WaitGroup
	for i, id := range left {
		wg.Go(func() { errs[i] = p.delete(id) })
	}
	wg.Wait()
	return errors.Join(errs...)
}
