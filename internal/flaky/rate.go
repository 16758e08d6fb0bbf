package flaky

import (
	"context"
	"errors"
	"fmt"

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
	// KeepFailures keeps the forks whose run failed; the rest are deleted.
	KeepFailures bool
	Test         Test
	// Seed gives each run its seed; nil means a fresh random uint32. The
	// seeds of one measurement are distinct.
	Seed func() uint32
	// Progress, if set, hears of each run as it ends, one at a time.
	Progress func(Run)
	// Forked, if set, hears how many of the N forks are ready, as they grow.
	Forked func(ready, n int)
}

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
// breadth-first, at most api.MaxForks per fork call), runs the test once in
// each with its own seed, at most Parallel at once, and measures the failure
// rate. Every fork is deleted, as each run ends, except failing ones with
// KeepFailures. A test that fails is a result, not an error; an error is
// operational (a fork, exec or delete that did not work, api.ErrInvalid for
// bad options) and then no fork is left.
func FlakeRate(ctx context.Context, c Client, o RateOptions) (*RateResult, error) {
	if err := o.validate(); err != nil {
		return nil, err
	}
	root := o.Sandbox
	if o.From != "" {
		sb, err := c.Create(ctx, client.WithFrom(o.From))
		if err != nil {
			return nil, fmt.Errorf("flake-rate: create a sandbox from snapshot %s: %w", o.From, err)
		}
		root = sb.ID
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
	}
	return o.Test.validate()
}

// flakeRate is FlakeRate forking root.
func flakeRate(ctx context.Context, c Client, root string, o RateOptions) (*RateResult, error) {
	forks, err := growForks(ctx, c, root, o.N, o.Forked)
	if err != nil {
		return nil, err
	}
	seed := seeds(o.N, o.Seed)
	runs, err := runAll(ctx, o.N, o.Parallel, o.Progress, func(ctx context.Context, i int) (Run, error) {
		r, err := o.Test.exec(ctx, c, i, forks[i], seed[i])
		if err != nil {
			return Run{}, err
		}
		if r.Pass || !o.KeepFailures {
			// delete as soon as done: a passing fork holds memory for nothing
			if err := deleteAll(ctx, c, []string{forks[i]}); err != nil {
				return Run{}, fmt.Errorf("run %d: %w", i, err)
			}
		}
		return r, nil
	})
	if err != nil {
		if derr := deleteAll(ctx, c, forks); derr != nil {
			err = errors.Join(err, derr)
		}
		return nil, fmt.Errorf("flake-rate of %s: %w", root, err)
	}
	s := Summarize(runs)
	for _, r := range runs {
		if !r.Pass && o.KeepFailures {
			s.Kept = append(s.Kept, r.Sandbox)
		}
	}
	return &RateResult{Runs: runs, Summary: s}, nil
}

// growForks makes n memory forks of root, at most api.MaxForks per call,
// breadth-first: children of root, then children of those children (each a
// copy of the same state), until n exist. On an error it deletes those it
// made (a failed call leaves none of its own) and returns the error.
func growForks(ctx context.Context, c Client, root string, n int, ready func(int, int)) ([]string, error) {
	var made []string
	parents := []string{root}
	for len(made) < n {
		var next []string
		for _, p := range parents {
			if len(made) == n {
				break
			}
			k := min(api.MaxForks, n-len(made))
			kids, err := c.Fork(ctx, p, api.ForkRequest{Memory: true, Count: k})
			if err == nil && len(kids) != k {
				for _, kid := range kids {
					made = append(made, kid.ID)
				}
				err = fmt.Errorf("fork %s: asked for %d children, got %d", p, k, len(kids))
			}
			if err != nil {
				err = fmt.Errorf("flake-rate: %d of %d forks of %s made, deleting them: %w", len(made), n, root, err)
				if derr := deleteAll(ctx, c, made); derr != nil {
					err = errors.Join(err, derr)
				}
				return nil, err
			}
			for _, kid := range kids {
				made = append(made, kid.ID)
				next = append(next, kid.ID)
			}
			if ready != nil {
				ready(len(made), n)
			}
		}
		parents = next
	}
	return made, nil
}
