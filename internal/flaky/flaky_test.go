package flaky

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"sbx.dev/sbx/api"
	"sbx.dev/sbx/client"
)

// fakeClient is an in-memory sbxd: sandboxes are ids, a test's exit code is
// exit(seed), and it records what it was asked.
type fakeClient struct {
	exit func(seed uint32) int // the test's exit code for a seed

	mu        sync.Mutex
	next      int
	alive     map[string]bool
	from      map[string]string // sandbox -> snapshot it was made from
	forkSizes []int             // Count of each fork call
	seedOf    map[string]uint32 // sandbox -> seed its exec saw
	execs     int
	running   int
	maxRun    int
	forkErrAt int // fail the fork call with this 1-based number
	execErrAt int // fail the exec with this 1-based number
}

var _ Client = (*fakeClient)(nil)

func newFake(exit func(uint32) int, existing ...string) *fakeClient {
	f := &fakeClient{exit: exit, alive: map[string]bool{}, from: map[string]string{}, seedOf: map[string]uint32{}}
	for _, id := range existing {
		f.alive[id] = true
	}
	return f
}

// failBelow3 fails when seed%10 < 3, as the e2e test's shell test does.
func failBelow3(seed uint32) int {
	if seed%10 < 3 {
		return 1
	}
	return 0
}

func (f *fakeClient) newID() string {
	f.next++
	id := fmt.Sprintf("sb_%010d", f.next)
	f.alive[id] = true
	return id
}

func (f *fakeClient) Create(ctx context.Context, opts ...client.CreateOption) (*api.Sandbox, error) {
	var req api.CreateRequest
	for _, o := range opts {
		o(&req)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if req.From == "missing" {
		return nil, api.Errorf(api.ErrNotFound, "snapshot %s not found", req.From)
	}
	id := f.newID()
	f.from[id] = req.From
	return &api.Sandbox{ID: id}, nil
}

func (f *fakeClient) Fork(ctx context.Context, id string, req api.ForkRequest) ([]api.Sandbox, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.forkSizes = append(f.forkSizes, req.Count)
	if req.Count < 1 || req.Count > api.MaxForks {
		return nil, api.Errorf(api.ErrInvalid, "count %d: want 1 to %d", req.Count, api.MaxForks)
	}
	if !req.Memory {
		return nil, errors.New("fake: flake-rate must fork with memory")
	}
	if !f.alive[id] {
		return nil, api.Errorf(api.ErrNotFound, "sandbox %s not found", id)
	}
	if len(f.forkSizes) == f.forkErrAt {
		return nil, api.Errorf(api.ErrUnavailable, "fake: fork fails")
	}
	kids := make([]api.Sandbox, req.Count)
	for i := range kids {
		kids[i] = api.Sandbox{ID: f.newID()}
	}
	return kids, nil
}

func (f *fakeClient) Exec(ctx context.Context, id string, req api.ExecRequest, stdout, stderr io.Writer) (*api.Exec, error) {
	f.mu.Lock()
	f.execs++
	n := f.execs
	if !f.alive[id] {
		f.mu.Unlock()
		return nil, api.Errorf(api.ErrNotFound, "sandbox %s not found", id)
	}
	var seed uint32
	found := false
	for _, kv := range req.Env {
		if v, ok := strings.CutPrefix(kv, "SEED="); ok {
			s, err := strconv.ParseUint(v, 10, 32)
			if err != nil {
				f.mu.Unlock()
				return nil, fmt.Errorf("fake: bad seed %q", v)
			}
			seed, found = uint32(s), true
		}
	}
	if !found {
		f.mu.Unlock()
		return nil, fmt.Errorf("fake: no SEED in %q", req.Env)
	}
	f.seedOf[id] = seed
	f.running++
	f.maxRun = max(f.maxRun, f.running)
	f.mu.Unlock()

	time.Sleep(time.Millisecond) // let runs overlap
	f.mu.Lock()
	defer f.mu.Unlock()
	f.running--
	if n == f.execErrAt {
		return nil, api.Errorf(api.ErrConflict, "fake: sandbox %s stopped", id)
	}
	code := f.exit(seed)
	return &api.Exec{ID: "x", SandboxID: id, State: api.ExecExited, ExitCode: &code}, nil
}

func (f *fakeClient) Delete(ctx context.Context, id string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if !f.alive[id] {
		return api.Errorf(api.ErrNotFound, "sandbox %s not found", id)
	}
	delete(f.alive, id)
	return nil
}

// left is the sandboxes still there, sorted.
func (f *fakeClient) left() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	var ids []string
	for id := range f.alive {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	return ids
}

var shTest = Test{Cmd: []string{"sh", "-c", "test $((SEED % 10)) -ge 3"}}

// checkRuns checks that runs are in order, in distinct sandboxes, with
// distinct seeds that the exec saw, and pass exactly when exit(seed) is 0.
func checkRuns(t *testing.T, f *fakeClient, runs []Run, n int) {
	t.Helper()
	if len(runs) != n {
		t.Fatalf("got %d runs, want %d", len(runs), n)
	}
	seeds := map[uint32]bool{}
	sandboxes := map[string]bool{}
	for i, r := range runs {
		if r.Run != i {
			t.Errorf("runs[%d].Run = %d, want %d", i, r.Run, i)
		}
		if seeds[r.Seed] {
			t.Errorf("run %d: seed %d used twice", i, r.Seed)
		}
		seeds[r.Seed] = true
		if sandboxes[r.Sandbox] {
			t.Errorf("run %d: sandbox %s used twice", i, r.Sandbox)
		}
		sandboxes[r.Sandbox] = true
		if got := f.seedOf[r.Sandbox]; got != r.Seed {
			t.Errorf("run %d: recorded seed %d, the exec in %s saw %d", i, r.Seed, r.Sandbox, got)
		}
		if want := f.exit(r.Seed) == 0; r.Pass != want || r.ExitCode != f.exit(r.Seed) {
			t.Errorf("run %d (seed %d): pass %v exit %d, want pass %v exit %d", i, r.Seed, r.Pass, r.ExitCode, want, f.exit(r.Seed))
		}
	}
}

func failures(runs []Run) (n int, ids []string) {
	for _, r := range runs {
		if !r.Pass {
			n++
			ids = append(ids, r.Sandbox)
		}
	}
	return n, ids
}

func TestFlakeRate(t *testing.T) {
	tests := []struct {
		name          string
		n, parallel   int
		keep          bool
		wantForkSizes []int
	}{
		{"40 forks, deleted", 40, 0, false, []int{16, 16, 8}},
		{"40 forks, failures kept", 40, 3, true, []int{16, 16, 8}},
		{"one", 1, 1, false, []int{1}},
		{"300 forks", 300, 16, false, []int{16, 16, 16, 16, 16, 16, 16, 16, 16, 16, 16, 16, 16, 16, 16, 16, 16, 16, 12}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := newFake(failBelow3, "sb_parent000")
			var progressed []int
			res, err := FlakeRate(context.Background(), f, RateOptions{
				Sandbox: "sb_parent000", N: tc.n, Parallel: tc.parallel, KeepFailures: tc.keep, Test: shTest,
				Progress: func(r Run) { progressed = append(progressed, r.Run) },
			})
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.wantForkSizes, f.forkSizes); diff != "" {
				t.Errorf("fork call counts (-want +got):\n%s", diff)
			}
			checkRuns(t, f, res.Runs, tc.n)
			slices.Sort(progressed)
			if len(progressed) != tc.n || progressed[0] != 0 || progressed[tc.n-1] != tc.n-1 {
				t.Errorf("progress heard of runs %v, want each of 0..%d once", progressed, tc.n-1)
			}
			wantParallel := tc.parallel
			if wantParallel == 0 {
				wantParallel = DefaultParallel
			}
			if f.maxRun > wantParallel {
				t.Errorf("%d runs at once, want at most %d", f.maxRun, wantParallel)
			}

			nfail, failed := failures(res.Runs)
			lo, hi := Wilson(nfail, tc.n)
			want := RateSummary{Runs: tc.n, Failures: nfail, Rate: float64(nfail) / float64(tc.n), Wilson95: [2]float64{lo, hi}, Kept: []string{}}
			wantLeft := []string{"sb_parent000"}
			if tc.keep {
				want.Kept = append(want.Kept, failed...)
				wantLeft = append(wantLeft, failed...)
				slices.Sort(wantLeft)
			}
			if diff := cmp.Diff(want, res.Summary); diff != "" {
				t.Errorf("summary (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(wantLeft, f.left()); diff != "" {
				t.Errorf("sandboxes left (-want +got):\n%s", diff)
			}
		})
	}
}

func TestFlakeRateFromSnapshot(t *testing.T) {
	f := newFake(failBelow3)
	res, err := FlakeRate(context.Background(), f, RateOptions{From: "snap", N: 20, KeepFailures: true, Test: shTest})
	if err != nil {
		t.Fatal(err)
	}
	checkRuns(t, f, res.Runs, 20)
	if got := f.from["sb_0000000001"]; got != "snap" {
		t.Errorf("first sandbox made from %q, want snap", got)
	}
	if diff := cmp.Diff([]int{16, 4}, f.forkSizes); diff != "" {
		t.Errorf("fork call counts (-want +got):\n%s", diff)
	}
	// the sandbox made from the snapshot goes; the failures stay
	_, failed := failures(res.Runs)
	slices.Sort(failed)
	if diff := cmp.Diff(failed, f.left()); diff != "" {
		t.Errorf("sandboxes left (-want +got):\n%s", diff)
	}
}

func TestFlakeRateSeeds(t *testing.T) {
	// a seed source that repeats itself still gives distinct seeds
	next := uint32(0)
	f := newFake(failBelow3, "sb_parent000")
	res, err := FlakeRate(context.Background(), f, RateOptions{
		Sandbox: "sb_parent000", N: 10, Test: Test{Cmd: []string{"true"}, SeedEnv: "SEED"},
		Seed: func() uint32 { next++; return next / 3 },
	})
	if err != nil {
		t.Fatal(err)
	}
	checkRuns(t, f, res.Runs, 10)
	var got []uint32
	for _, r := range res.Runs {
		got = append(got, r.Seed)
	}
	if diff := cmp.Diff([]uint32{0, 1, 2, 3, 4, 5, 6, 7, 8, 9}, got); diff != "" {
		t.Errorf("seeds (-want +got):\n%s", diff)
	}
	if want := 3; res.Summary.Failures != want { // seeds 0, 1 and 2
		t.Errorf("%d failures, want %d", res.Summary.Failures, want)
	}
}

func TestFlakeRateErrors(t *testing.T) {
	tests := []struct {
		name      string
		opts      RateOptions
		forkErrAt int
		execErrAt int
		wantKind  error
	}{
		{"no sandbox", RateOptions{N: 3, Test: shTest}, 0, 0, api.ErrInvalid},
		{"both", RateOptions{Sandbox: "sb_parent000", From: "snap", N: 3, Test: shTest}, 0, 0, api.ErrInvalid},
		{"no runs", RateOptions{Sandbox: "sb_parent000", Test: shTest}, 0, 0, api.ErrInvalid},
		{"no command", RateOptions{Sandbox: "sb_parent000", N: 3}, 0, 0, api.ErrInvalid},
		{"unknown sandbox", RateOptions{Sandbox: "sb_nope", N: 3, Test: shTest}, 0, 0, api.ErrNotFound},
		{"unknown snapshot", RateOptions{From: "missing", N: 3, Test: shTest}, 0, 0, api.ErrNotFound},
		{"second fork call fails", RateOptions{Sandbox: "sb_parent000", N: 40, Test: shTest}, 2, 0, api.ErrUnavailable},
		{"an exec fails", RateOptions{Sandbox: "sb_parent000", N: 40, KeepFailures: true, Test: shTest}, 0, 7, api.ErrConflict},
		{"an exec fails, from a snapshot", RateOptions{From: "snap", N: 20, Test: shTest}, 0, 3, api.ErrConflict},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := newFake(failBelow3, "sb_parent000")
			f.forkErrAt, f.execErrAt = tc.forkErrAt, tc.execErrAt
			_, err := FlakeRate(context.Background(), f, tc.opts)
			if !errors.Is(err, tc.wantKind) {
				t.Fatalf("got %v, want an error of kind %v", err, tc.wantKind)
			}
			// an operational error leaves no fork behind, kept failures included
			if diff := cmp.Diff([]string{"sb_parent000"}, f.left()); diff != "" {
				t.Errorf("sandboxes left (-want +got):\n%s", diff)
			}
		})
	}
}

func TestReplay(t *testing.T) {
	tests := []struct {
		name        string
		seed        uint32
		n           int
		exit        func(uint32) int
		wantPattern string
		wantFail    int
	}{
		{"passing seed", 17, 5, failBelow3, "PPPPP", 0},
		{"failing seed", 21, 5, failBelow3, "FFFFF", 5},
		{"default count", 21, 0, failBelow3, "FFFFFFFFFF", 10},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := newFake(tc.exit)
			res, err := Replay(context.Background(), f, ReplayOptions{Snapshot: "snap", Seed: tc.seed, N: tc.n, Parallel: 2, Test: shTest})
			if err != nil {
				t.Fatal(err)
			}
			want := ReplaySummary{Runs: len(tc.wantPattern), Failures: tc.wantFail, Seed: tc.seed, Pattern: tc.wantPattern}
			if diff := cmp.Diff(want, res.Summary); diff != "" {
				t.Errorf("summary (-want +got):\n%s", diff)
			}
			for i, r := range res.Runs {
				if r.Run != i || r.Seed != tc.seed || f.seedOf[r.Sandbox] != tc.seed || f.from[r.Sandbox] != "snap" {
					t.Errorf("run %d: %+v, made from %q, saw seed %d; want run %d in a sandbox from snap with seed %d",
						i, r, f.from[r.Sandbox], f.seedOf[r.Sandbox], i, tc.seed)
				}
			}
			if len(f.from) != len(tc.wantPattern) {
				t.Errorf("%d sandboxes made, want a fresh one per run (%d)", len(f.from), len(tc.wantPattern))
			}
			if f.maxRun > 2 {
				t.Errorf("%d runs at once, want at most 2", f.maxRun)
			}
			if left := f.left(); len(left) != 0 {
				t.Errorf("sandboxes left: %v, want none", left)
			}
		})
	}
}

func TestReplayPattern(t *testing.T) {
	// runs finish out of order; the pattern is in run order
	var calls int
	var mu sync.Mutex
	f := newFake(nil)
	f.exit = func(seed uint32) int {
		mu.Lock()
		defer mu.Unlock()
		calls++
		if calls == 9 {
			return 0
		}
		return 1
	}
	res, err := Replay(context.Background(), f, ReplayOptions{Snapshot: "snap", Seed: 1, N: 12, Parallel: 1, Test: shTest})
	if err != nil {
		t.Fatal(err)
	}
	if got, want := res.Summary.Pattern, "FFFFFFFFPFFF"; got != want {
		t.Errorf("pattern %q, want %q", got, want)
	}
	if got, want := res.Summary.String(), "11/12 failed"; got != want {
		t.Errorf("summary %q, want %q", got, want)
	}
}

func TestReplayErrors(t *testing.T) {
	tests := []struct {
		name      string
		opts      ReplayOptions
		execErrAt int
		wantKind  error
	}{
		{"no snapshot", ReplayOptions{Test: shTest}, 0, api.ErrInvalid},
		{"negative count", ReplayOptions{Snapshot: "snap", N: -1, Test: shTest}, 0, api.ErrInvalid},
		{"unknown snapshot", ReplayOptions{Snapshot: "missing", Test: shTest}, 0, api.ErrNotFound},
		{"an exec fails", ReplayOptions{Snapshot: "snap", N: 10, Test: shTest}, 4, api.ErrConflict},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := newFake(failBelow3)
			f.execErrAt = tc.execErrAt
			_, err := Replay(context.Background(), f, tc.opts)
			if !errors.Is(err, tc.wantKind) {
				t.Fatalf("got %v, want an error of kind %v", err, tc.wantKind)
			}
			if left := f.left(); len(left) != 0 {
				t.Errorf("sandboxes left: %v, want none", left)
			}
		})
	}
}

func TestRateSummaryString(t *testing.T) {
	runs := make([]Run, 50)
	for i := range runs {
		runs[i] = Run{Run: i, Pass: i >= 7}
	}
	got := Summarize(runs).String()
	if want := "7/50 failed: rate 14.0% (95% Wilson interval 7.0%–26.2%)"; got != want {
		t.Errorf("got %q, want %q", got, want)
	}
}
