// Package flaky holds the flaky-test workflows, built on the client package.
package flaky

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"strconv"
	"sync"
	"time"

	"sbx.dev/sbx/api"
	"sbx.dev/sbx/client"
)

// Client is the slice of *client.Client the workflows use.
type Client interface {
	Create(ctx context.Context, opts ...client.CreateOption) (*api.Sandbox, error)
	Fork(ctx context.Context, id string, req api.ForkRequest) ([]api.Sandbox, error)
	Exec(ctx context.Context, id string, req api.ExecRequest, stdout, stderr io.Writer) (*api.Exec, error)
	Delete(ctx context.Context, id string) error
	SetTTL(ctx context.Context, id string, ttl time.Duration) (*api.Sandbox, error)
}

// DefaultSeedEnv is the environment variable a run's seed is passed in.
const DefaultSeedEnv = "SEED"

// DefaultParallel is how many test runs go at once unless told.
const DefaultParallel = 4

// MaxParallel is the most runs at once the CLI asks for: each is a sandbox
// of its own, and sbxd bounds nothing of a client's.
const MaxParallel = 64

// Run is the outcome of one run of the test, as `--json` prints it.
type Run struct {
	Run        int    `json:"run"`
	Seed       uint32 `json:"seed"`
	Sandbox    string `json:"sandbox"`
	ExitCode   int    `json:"exitCode"`
	Pass       bool   `json:"pass"`
	DurationMs int64  `json:"durationMs"`
	// Pid is the test's pid inside the sandbox (0: unknown) and Started
	// when the exec started, for a trace of the run (explain).
	Pid     int       `json:"-"`
	Started time.Time `json:"-"`
}

// Test is the command each run executes and how.
type Test struct {
	// Cmd is the test's argv, as api.ExecRequest takes it (already shell
	// wrapped if it is one word of shell syntax).
	Cmd []string
	// SeedEnv names the variable the seed is passed in; "" means DefaultSeedEnv.
	SeedEnv string
	// Timeout, if set, kills one run after this long; a killed run is a
	// failure.
	Timeout api.Duration
	// Env is added to each run's environment (KEY=VALUE), before the seed.
	Env []string
}

func (t Test) validate() error {
	if len(t.Cmd) == 0 {
		return api.Errorf(api.ErrInvalid, "no test command given")
	}
	return nil
}

func (t Test) seedEnv() string {
	if t.SeedEnv == "" {
		return DefaultSeedEnv
	}
	return t.SeedEnv
}

// exec runs the test once in sandbox id with seed and returns its run; an
// exec that cannot run, or ends without an exit code, is an error.
func (t Test) exec(ctx context.Context, c Client, i int, id string, seed uint32) (Run, error) {
	req := api.ExecRequest{
		Cmd:     t.Cmd,
		Env:     append(append([]string{}, t.Env...), t.seedEnv()+"="+strconv.FormatUint(uint64(seed), 10)),
		Timeout: t.Timeout,
	}
	start := time.Now()
	x, err := c.Exec(ctx, id, req, io.Discard, io.Discard)
	if err != nil {
		return Run{}, fmt.Errorf("run %d (seed %d): %w", i, seed, err)
	}
	if x.ExitCode == nil {
		return Run{}, fmt.Errorf("run %d (seed %d) in %s: exec %s ended (%s) without an exit code", i, seed, id, x.ID, x.State)
	}
	return Run{
		Run:        i,
		Seed:       seed,
		Sandbox:    id,
		ExitCode:   *x.ExitCode,
		Pass:       *x.ExitCode == 0,
		DurationMs: time.Since(start).Milliseconds(),
		Pid:        x.Pid,
		Started:    x.StartedAt,
	}, nil
}

// runAll calls do for 0..n-1 with at most parallel at once, and reports
// each finished run to progress (one at a time). The first error cancels
// the runs not yet started and is returned with any others.
func runAll(ctx context.Context, n, parallel int, progress func(Run), do func(ctx context.Context, i int) (Run, error)) ([]Run, error) {
	if parallel < 1 {
		parallel = DefaultParallel
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	runs := make([]Run, n)
	var (
		mu   sync.Mutex
		errs []error
		wg   sync.WaitGroup
	)
	sem := make(chan struct{}, parallel)
	for i := range n {
		select {
		case sem <- struct{}{}:
		case <-ctx.Done():
		}
		if ctx.Err() != nil {
			break
		}
		wg.Go(func() {
			defer func() { <-sem }()
			r, err := do(ctx, i)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				errs = append(errs, err)
				cancel()
				return
			}
			runs[i] = r
			if progress != nil {
				progress(r)
			}
		})
	}
	wg.Wait()
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	return runs, nil
}

// seeds returns n distinct seeds from next (a fresh random uint32 each
// unless next is set).
func seeds(n int, next func() uint32) []uint32 {
	if next == nil {
		next = rand.Uint32
	}
	seen := make(map[uint32]bool, n)
	out := make([]uint32, 0, n)
	for len(out) < n {
		s := next()
		if seen[s] {
			continue // two runs with one seed would measure it twice
		}
		seen[s] = true
		out = append(out, s)
	}
	return out
}

// deleter is the one call deleteAll needs.
type deleter interface {
	Delete(ctx context.Context, id string) error
}

// deleteAll deletes the sandboxes even once ctx has ended: a fork left
// behind would outlive the command that promised none. One already gone is
// no error.
func deleteAll(ctx context.Context, c deleter, ids []string) error {
	ctx = context.WithoutCancel(ctx)
	var errs []error
	for _, id := range ids {
		if err := c.Delete(ctx, id); err != nil && !errors.Is(err, api.ErrNotFound) {
			errs = append(errs, fmt.Errorf("delete %s: %w", id, err))
		}
	}
	return errors.Join(errs...)
}
