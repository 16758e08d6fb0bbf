package flaky

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"

	"sbx.dev/sbx/api"
	"sbx.dev/sbx/client"
)

// DefaultReplays is how many times Replay runs a seed unless told.
const DefaultReplays = 10

// ReplayOptions says what Replay runs and how.
type ReplayOptions struct {
	// Snapshot is what every run's fresh sandbox is made from.
	Snapshot string
	Seed     uint32
	// N is how many runs; 0 means DefaultReplays.
	N int
	// Parallel bounds how many runs go at once; 0 means DefaultParallel.
	Parallel int
	Test     Test
	// Progress, if set, hears of each run as it ends, one at a time.
	Progress func(Run)
}

// ReplaySummary is what Replay saw, as `--json` prints it last.
type ReplaySummary struct {
	Runs     int    `json:"runs"`
	Failures int    `json:"failures"`
	Seed     uint32 `json:"seed"`
	// Pattern has one letter per run in run order: P passed, F failed.
	Pattern string `json:"pattern"`
}

// String is the count for people: "11/12 failed".
func (s ReplaySummary) String() string {
	return fmt.Sprintf("%d/%d failed", s.Failures, s.Runs)
}

// ReplayResult is every run of Replay in run order and the summary.
type ReplayResult struct {
	Runs    []Run
	Summary ReplaySummary
}

// Pattern is the runs' outcomes in order, P for pass and F for fail:
// "FFFFFFFFPFFF".
func Pattern(runs []Run) string {
	var b strings.Builder
	for _, r := range runs {
		if r.Pass {
			b.WriteByte('P')
		} else {
			b.WriteByte('F')
		}
	}
	return b.String()
}

// Replay runs the test N times with one seed, each time in a fresh sandbox
// made from the snapshot and deleted after the run, at most Parallel at
// once. A test that fails is a result, not an error; an error is
// operational (an unknown snapshot is api.ErrNotFound, bad options
// api.ErrInvalid), and then no sandbox of it is left.
func Replay(ctx context.Context, c Client, o ReplayOptions) (*ReplayResult, error) {
	if o.N == 0 {
		o.N = DefaultReplays
	}
	switch {
	case o.Snapshot == "":
		return nil, api.Errorf(api.ErrInvalid, "replay: no snapshot given")
	case o.N < 1:
		return nil, api.Errorf(api.ErrInvalid, "replay: want at least 1 run, got %d", o.N)
	case o.Parallel < 0:
		return nil, api.Errorf(api.ErrInvalid, "replay: want a parallelism of at least 1, got %d", o.Parallel)
	}
	if err := o.Test.validate(); err != nil {
		return nil, err
	}
	// Each sandbox is deleted in the background once its run ends (as
	// flake-rate does), so the run's slot goes to the next run at once;
	// Replay returns after every delete.
	var (
		deletes sync.WaitGroup
		mu      sync.Mutex
		delErrs []error
	)
	tokens := make(chan struct{}, rateDeletes)
	runs, err := runAll(ctx, o.N, o.Parallel, o.Progress, func(ctx context.Context, i int) (Run, error) {
		sb, err := c.Create(ctx, client.WithFrom(o.Snapshot))
		if err != nil {
			return Run{}, fmt.Errorf("run %d: create from snapshot %s: %w", i, o.Snapshot, err)
		}
		r, err := o.Test.exec(ctx, c, i, sb.ID, o.Seed)
		deletes.Go(func() {
			tokens <- struct{}{}
			defer func() { <-tokens }()
			if derr := deleteAll(ctx, c, []string{sb.ID}); derr != nil {
				mu.Lock()
				delErrs = append(delErrs, fmt.Errorf("run %d: %w", i, derr))
				mu.Unlock()
			}
		})
		return r, err
	})
	deletes.Wait()
	err = errors.Join(err, errors.Join(delErrs...))
	if err != nil {
		return nil, fmt.Errorf("replay of %s with seed %d: %w", o.Snapshot, o.Seed, err)
	}
	s := ReplaySummary{Runs: len(runs), Seed: o.Seed, Pattern: Pattern(runs)}
	for _, r := range runs {
		if !r.Pass {
			s.Failures++
		}
	}
	return &ReplayResult{Runs: runs, Summary: s}, nil
}
