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
// exit(seed), and it records what it was asked. Forking a sandbox whose test
// has run is an error: its children would carry the run.
type fakeClient struct {
	exit func(seed uint32) int // the test's exit code for a seed

	// Set before use, read without the lock.
	forkGate   chan struct{}   // if set, each fork call takes one value first
	deleteGate chan struct{}   // if set, each delete takes one value first
	onFork     func()          // if set, hears each fork call begin
	onExec     func(id string) // if set, hears each exec begin
	onDelete   func()          // if set, hears each delete begin

	mu          sync.Mutex
	next        int
	alive       map[string]bool
	existing    int               // sandboxes there from the start
	from        map[string]string // sandbox -> snapshot it was made from
	forkSizes   []int             // Count of each fork call
	forkParents []string          // parent of each fork call
	maxAlive    int               // most sandboxes made by the test alive at once
	seedOf      map[string]uint32 // sandbox -> seed its exec saw
	execs       int
	running     int
	maxRun      int
	deletes     int
	deleting    int
	maxDeleting int
	kept        map[string]string // kept failure's name -> the ttl it was forked with
	keepErr     error             // if set, what every fork that keeps a failure returns
	ttls        map[string]time.Duration
	forkErrAt   int // fail the fork call with this 1-based number
	forkShortAt int // the fork call with this 1-based number makes one child too few
	execErrAt   int // fail the exec with this 1-based number
	deleteErrAt int // fail the delete with this 1-based number
}

var _ Client = (*fakeClient)(nil)

func newFake(exit func(uint32) int, existing ...string) *fakeClient {
	f := &fakeClient{exit: exit, alive: map[string]bool{}, from: map[string]string{}, seedOf: map[string]uint32{},
		kept: map[string]string{}, ttls: map[string]time.Duration{}}
	for _, id := range existing {
		f.alive[id] = true
	}
	f.existing = len(existing)
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
	req := client.CreateRequest(opts...)
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
	if req.Name != "" {
		f.mu.Lock()
		defer f.mu.Unlock()
		return f.keepFork(id, req)
	}
	if f.onFork != nil {
		f.onFork()
	}
	if f.forkGate != nil {
		<-f.forkGate
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.forkSizes = append(f.forkSizes, req.Count)
	f.forkParents = append(f.forkParents, id)
	if req.Count < 1 || req.Count > api.MaxForks {
		return nil, api.Errorf(api.ErrInvalid, "count %d: want 1 to %d", req.Count, api.MaxForks)
	}
	if !req.Memory {
		return nil, errors.New("fake: flake-rate must fork with memory")
	}
	if !f.alive[id] {
		return nil, api.Errorf(api.ErrNotFound, "sandbox %s not found", id)
	}
	if _, ran := f.seedOf[id]; ran {
		return nil, fmt.Errorf("fake: fork of %s after its test ran", id)
	}
	if len(f.forkSizes) == f.forkErrAt {
		return nil, api.Errorf(api.ErrUnavailable, "fake: fork fails")
	}
	k := req.Count
	if len(f.forkSizes) == f.forkShortAt {
		k--
	}
	kids := make([]api.Sandbox, k)
	for i := range kids {
		kids[i] = api.Sandbox{ID: f.newID()}
	}
	f.maxAlive = max(f.maxAlive, len(f.alive)-f.existing)
	return kids, nil
}

// keepFork is a fork that keeps a failure: one named child of a fork whose
// test has run, carrying its seed (its memory). The child's id is its name.
func (f *fakeClient) keepFork(id string, req api.ForkRequest) ([]api.Sandbox, error) {
	switch {
	case f.keepErr != nil:
		return nil, f.keepErr
	case req.Count != 1 || !req.Memory:
		return nil, fmt.Errorf("fake: a kept failure is one memory fork, got %+v", req)
	case !f.alive[id]:
		return nil, api.Errorf(api.ErrNotFound, "sandbox %s not found", id)
	case f.alive[req.Name]:
		return nil, api.Errorf(api.ErrConflict, "name %q is taken", req.Name)
	}
	if _, ran := f.seedOf[id]; !ran {
		return nil, fmt.Errorf("fake: %s kept before its test ran", id)
	}
	f.alive[req.Name] = true
	f.seedOf[req.Name] = f.seedOf[id]
	f.kept[req.Name] = "(the parent's)"
	if req.TTL != nil {
		f.kept[req.Name] = req.TTL.String()
	}
	return []api.Sandbox{{ID: req.Name, Name: req.Name}}, nil
}

func (f *fakeClient) SetTTL(ctx context.Context, id string, ttl time.Duration) (*api.Sandbox, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if !f.alive[id] {
		return nil, api.Errorf(api.ErrNotFound, "sandbox %s not found", id)
	}
	f.ttls[id] = ttl
	return &api.Sandbox{ID: id}, nil
}

func (f *fakeClient) Exec(ctx context.Context, id string, req api.ExecRequest, stdout, stderr io.Writer) (*api.Exec, error) {
	if f.onExec != nil {
		f.onExec(id)
	}
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("exec in %s: %w", id, err)
	}
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

	time.Sleep(time.Millisecond) // a run takes a while, so that runs overlap: the parallelism counted is tested
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
	if f.onDelete != nil {
		f.onDelete()
	}
	f.mu.Lock()
	f.deletes++
	n := f.deletes
	f.deleting++
	f.maxDeleting = max(f.maxDeleting, f.deleting)
	f.mu.Unlock()
	if f.deleteGate != nil {
		<-f.deleteGate
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.deleting--
	if n == f.deleteErrAt {
		return api.Errorf(api.ErrUnavailable, "fake: delete of %s fails", id)
	}
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
			// unguarded on purpose: the race detector sees Progress and
			// Forked called at once
			var progressed, forked []int
			heard := 0
			res, err := FlakeRate(context.Background(), f, RateOptions{
				Sandbox: "sb_parent000", N: tc.n, Parallel: tc.parallel, KeepFailures: tc.keep, Test: shTest,
				Progress: func(r Run) { heard++; progressed = append(progressed, r.Run) },
				Forked: func(ready, n int) {
					heard++
					if n != tc.n {
						t.Errorf("Forked(%d, %d), want n %d", ready, n, tc.n)
					}
					forked = append(forked, ready)
				},
			})
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.wantForkSizes, f.forkSizes); diff != "" {
				t.Errorf("fork call counts (-want +got):\n%s", diff)
			}
			var wantForked []int
			for _, k := range tc.wantForkSizes {
				wantForked = append(wantForked, k+len(wantForked)*api.MaxForks)
			}
			if diff := cmp.Diff(wantForked, forked); diff != "" {
				t.Errorf("Forked heard (-want +got):\n%s", diff)
			}
			if heard != tc.n+len(tc.wantForkSizes) {
				t.Errorf("callbacks heard %d times, want %d", heard, tc.n+len(tc.wantForkSizes))
			}
			for i, p := range f.forkParents {
				if p != "sb_parent000" {
					t.Errorf("fork call %d forked %s, want every batch from the root", i+1, p)
				}
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
			if bound := wantParallel + api.MaxForks; !tc.keep && f.maxAlive > bound {
				t.Errorf("%d forks alive at once, want at most %d", f.maxAlive, bound)
			}
			if f.maxDeleting > rateDeletes {
				t.Errorf("%d deletes at once, want at most %d", f.maxDeleting, rateDeletes)
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
	sb := "sb_parent000"
	tests := []struct {
		name string
		opts RateOptions
		// 1-based numbers of the calls that fail
		forkErrAt, forkShortAt, execErrAt, deleteErrAt int
		wantKind                                       error
	}{
		{name: "no sandbox", opts: RateOptions{N: 3, Test: shTest}, wantKind: api.ErrInvalid},
		{name: "both", opts: RateOptions{Sandbox: sb, From: "snap", N: 3, Test: shTest}, wantKind: api.ErrInvalid},
		{name: "no runs", opts: RateOptions{Sandbox: sb, Test: shTest}, wantKind: api.ErrInvalid},
		{name: "no command", opts: RateOptions{Sandbox: sb, N: 3}, wantKind: api.ErrInvalid},
		{name: "unknown sandbox", opts: RateOptions{Sandbox: "sb_nope", N: 3, Test: shTest}, wantKind: api.ErrNotFound},
		{name: "unknown snapshot", opts: RateOptions{From: "missing", N: 3, Test: shTest}, wantKind: api.ErrNotFound},
		{name: "second fork call fails", opts: RateOptions{Sandbox: sb, N: 40, Test: shTest}, forkErrAt: 2, wantKind: api.ErrUnavailable},
		{name: "second fork call fails, failures kept", opts: RateOptions{Sandbox: sb, N: 40, Parallel: 2, KeepFailures: true, Test: shTest}, forkErrAt: 2, wantKind: api.ErrUnavailable},
		{name: "third fork call fails, parallel 16", opts: RateOptions{Sandbox: sb, N: 60, Parallel: 16, Test: shTest}, forkErrAt: 3, wantKind: api.ErrUnavailable},
		{name: "second fork call makes too few", opts: RateOptions{Sandbox: sb, N: 40, Test: shTest}, forkShortAt: 2},
		{name: "an exec fails", opts: RateOptions{Sandbox: sb, N: 40, KeepFailures: true, Test: shTest}, execErrAt: 7, wantKind: api.ErrConflict},
		{name: "an exec in the second batch fails", opts: RateOptions{Sandbox: sb, N: 40, Parallel: 2, Test: shTest}, execErrAt: 20, wantKind: api.ErrConflict},
		{name: "an exec fails, from a snapshot", opts: RateOptions{From: "snap", N: 20, Test: shTest}, execErrAt: 3, wantKind: api.ErrConflict},
		{name: "a delete fails", opts: RateOptions{Sandbox: sb, N: 40, Test: shTest}, deleteErrAt: 3, wantKind: api.ErrUnavailable},
		{name: "a delete fails, failures kept", opts: RateOptions{Sandbox: sb, N: 40, KeepFailures: true, Test: shTest}, deleteErrAt: 3, wantKind: api.ErrUnavailable},
		{name: "the last delete fails", opts: RateOptions{Sandbox: sb, N: 20, Test: shTest}, deleteErrAt: 20, wantKind: api.ErrUnavailable},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := newFake(failBelow3, sb)
			f.forkErrAt, f.forkShortAt, f.execErrAt, f.deleteErrAt = tc.forkErrAt, tc.forkShortAt, tc.execErrAt, tc.deleteErrAt
			_, err := FlakeRate(context.Background(), f, tc.opts)
			if tc.wantKind == nil && err == nil {
				t.Fatal("got no error, want one")
			}
			if tc.wantKind != nil && !errors.Is(err, tc.wantKind) {
				t.Fatalf("got %v, want an error of kind %v", err, tc.wantKind)
			}
			// an operational error leaves no fork behind, kept failures included
			if diff := cmp.Diff([]string{"sb_parent000"}, f.left()); diff != "" {
				t.Errorf("sandboxes left (-want +got):\n%s", diff)
			}
		})
	}
}

// stuck is how long a test waits for a step before calling the code
// stuck; only a guard against a hang, nothing waits on it to pass.
const stuck = 20 * time.Second

// rateCall is FlakeRate under way in the background.
type rateCall struct {
	done chan struct{}
	res  *RateResult
	err  error
}

func startRate(ctx context.Context, f *fakeClient, o RateOptions) *rateCall {
	rc := &rateCall{done: make(chan struct{})}
	go func() {
		defer close(rc.done)
		rc.res, rc.err = FlakeRate(ctx, f, o)
	}()
	return rc
}

// wait is FlakeRate's result, or a fatal error if it never ends.
func (rc *rateCall) wait(t *testing.T) (*RateResult, error) {
	t.Helper()
	select {
	case <-rc.done:
		return rc.res, rc.err
	case <-time.After(stuck):
		t.Fatalf("FlakeRate still going after %v", stuck)
		return nil, nil
	}
}

// await waits for a step of the test, or fails it with what was awaited.
func await[T any](t *testing.T, c <-chan T, what string) T {
	t.Helper()
	select {
	case v := <-c:
		return v
	case <-time.After(stuck):
		t.Fatalf("still waiting after %v for %s", stuck, what)
		var zero T
		return zero
	}
}

// signal returns a channel that hears n sends, and a send for it that never blocks.
func signal[T any](n int) (chan T, func(T)) {
	c := make(chan T, n)
	return c, func(v T) {
		select {
		case c <- v:
		default:
		}
	}
}

func TestFlakeRatePipelines(t *testing.T) {
	// the second fork call is held until a run has started: a FlakeRate that
	// made every fork before running any never gets there
	f := newFake(failBelow3, "sb_parent000")
	f.forkGate = make(chan struct{})
	started, send := signal[int](1)
	f.onExec = func(string) {
		f.mu.Lock()
		defer f.mu.Unlock()
		send(f.next)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var forked []int // guarded by FlakeRate: Forked and Progress hear one at a time
	rc := startRate(ctx, f, RateOptions{
		Sandbox: "sb_parent000", N: 40, Parallel: 4, Test: shTest,
		Forked: func(ready, n int) { forked = append(forked, ready) },
	})
	f.forkGate <- struct{}{} // the first batch
	if made := await(t, started, "a run while the second batch of forks is held"); made != api.MaxForks {
		t.Errorf("%d forks made when the first run started, want %d (the first batch)", made, api.MaxForks)
	}
	close(f.forkGate)
	res, err := rc.wait(t)
	if err != nil {
		t.Fatal(err)
	}
	checkRuns(t, f, res.Runs, 40)
	if diff := cmp.Diff([]int{16, 32, 40}, forked); diff != "" {
		t.Errorf("Forked heard (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]string{"sb_parent000"}, f.left()); diff != "" {
		t.Errorf("sandboxes left (-want +got):\n%s", diff)
	}
}

func TestFlakeRateDeletesOffTheSlot(t *testing.T) {
	// Every delete is held: with 2 slots, the whole first batch still runs,
	// rateDeletes deletes wait, and the second batch waits for room.
	const n, parallel = 40, 2
	f := newFake(failBelow3, "sb_parent000")
	f.deleteGate = make(chan struct{})
	deleting, sendDeleting := signal[struct{}](n)
	f.onDelete = func() { sendDeleting(struct{}{}) }
	ran, sendRan := signal[struct{}](1)
	runs := 0 // guarded by FlakeRate: Progress hears one at a time
	rc := startRate(context.Background(), f, RateOptions{
		Sandbox: "sb_parent000", N: n, Parallel: parallel, Test: shTest,
		Progress: func(Run) {
			if runs++; runs == api.MaxForks {
				sendRan(struct{}{})
			}
		},
	})
	await(t, ran, fmt.Sprintf("%d runs to end while every delete is held", api.MaxForks))
	for i := range rateDeletes {
		await(t, deleting, fmt.Sprintf("delete %d to begin", i+1))
	}
	f.mu.Lock()
	calls := len(f.forkSizes)
	f.mu.Unlock()
	if calls != 1 {
		t.Errorf("%d fork calls with %d forks waiting to be deleted, want 1: the next batch waits for room", calls, api.MaxForks)
	}
	close(f.deleteGate)
	res, err := rc.wait(t)
	if err != nil {
		t.Fatal(err)
	}
	checkRuns(t, f, res.Runs, n)
	if f.maxDeleting != rateDeletes {
		t.Errorf("%d deletes at once, want %d", f.maxDeleting, rateDeletes)
	}
	if f.maxRun > parallel {
		t.Errorf("%d runs at once, want at most %d", f.maxRun, parallel)
	}
	if diff := cmp.Diff([]string{"sb_parent000"}, f.left()); diff != "" {
		t.Errorf("sandboxes left (-want +got):\n%s", diff)
	}
}

func TestFlakeRateBound(t *testing.T) {
	// forks are instant and runs are not, so without a bound the forks
	// would all be made at once
	tests := []struct {
		name        string
		n, parallel int
		keep        bool
		exit        func(uint32) int
	}{
		{"300 forks, 2 at once", 300, 2, false, failBelow3},
		{"100 forks, 4 at once", 100, 4, false, failBelow3},
		{"64 forks, 16 at once", 64, 16, false, failBelow3},
		// kept forks stay on purpose and do not count: counting them would
		// stall the pipeline once 18 had failed
		{"every run fails, all kept", 60, 2, true, func(uint32) int { return 1 }},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := newFake(tc.exit, "sb_parent000")
			res, err := startRate(context.Background(), f, RateOptions{
				Sandbox: "sb_parent000", N: tc.n, Parallel: tc.parallel, KeepFailures: tc.keep, Test: shTest,
			}).wait(t)
			if err != nil {
				t.Fatal(err)
			}
			checkRuns(t, f, res.Runs, tc.n)
			bound := tc.parallel + api.MaxForks
			if tc.keep {
				// every fork stays, and a failure being kept is there
				// twice until its fork of itself is made
				bound = tc.n + tc.parallel
			}
			if f.maxAlive > bound {
				t.Errorf("%d forks alive at once, want at most %d", f.maxAlive, bound)
			}
			_, failed := failures(res.Runs)
			if !tc.keep {
				failed = nil
			}
			want := append([]string{"sb_parent000"}, failed...)
			slices.Sort(want)
			if diff := cmp.Diff(want, f.left()); diff != "" {
				t.Errorf("sandboxes left (-want +got):\n%s", diff)
			}
		})
	}
}

// cancelAtExec arms a case to cancel as the nth run starts.
func cancelAtExec(n int) func(*testing.T, *fakeClient, func()) func() {
	return func(t *testing.T, f *fakeClient, cancel func()) func() {
		var mu sync.Mutex
		execs := 0
		f.onExec = func(string) {
			mu.Lock()
			defer mu.Unlock()
			if execs++; execs == n {
				cancel()
			}
		}
		return nil
	}
}

func TestFlakeRateCancel(t *testing.T) {
	tests := []struct {
		name string
		from string // else fork sb_parent000
		// arm sets f up to call cancel mid-way and returns what the test
		// then does (nil: nothing)
		arm func(t *testing.T, f *fakeClient, cancel func()) func()
		// wantForkCalls is how many fork calls begin, -1 for any
		wantForkCalls int
	}{
		{
			name:          "before the start",
			arm:           func(t *testing.T, f *fakeClient, cancel func()) func() { cancel(); return nil },
			wantForkCalls: 0,
		},
		{
			name: "while the second batch is forked",
			arm: func(t *testing.T, f *fakeClient, cancel func()) func() {
				f.forkGate = make(chan struct{})
				calls, sendCall := signal[struct{}](2)
				f.onFork = func() { sendCall(struct{}{}) }
				started, sendStarted := signal[struct{}](1)
				f.onExec = func(string) { sendStarted(struct{}{}) }
				return func() {
					f.forkGate <- struct{}{}
					await(t, started, "a run in the first batch")
					await(t, calls, "fork call 1")
					await(t, calls, "fork call 2")
					cancel()
					close(f.forkGate) // the held call ends and its forks are deleted
				}
			},
			wantForkCalls: 2,
		},
		{
			name:          "during the fifth run",
			arm:           cancelAtExec(5),
			wantForkCalls: -1,
		},
		{
			name:          "during the fifth run, from a snapshot",
			from:          "snap",
			arm:           cancelAtExec(5),
			wantForkCalls: -1,
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := newFake(failBelow3, "sb_parent000")
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			var mu sync.Mutex
			canceled, callsAfter := false, 0
			then := tc.arm(t, f, func() {
				mu.Lock()
				defer mu.Unlock()
				canceled = true
				cancel()
			})
			onFork := f.onFork
			f.onFork = func() {
				mu.Lock()
				if canceled {
					callsAfter++
				}
				mu.Unlock()
				if onFork != nil {
					onFork()
				}
			}
			o := RateOptions{N: 40, Parallel: 4, KeepFailures: true, Test: shTest}
			if tc.from != "" {
				o.From = tc.from
			} else {
				o.Sandbox = "sb_parent000"
			}
			rc := startRate(ctx, f, o)
			if then != nil {
				then()
			}
			_, err := rc.wait(t)
			if !errors.Is(err, context.Canceled) {
				t.Fatalf("got %v, want %v", err, context.Canceled)
			}
			if callsAfter != 0 {
				t.Errorf("%d fork calls began after the cancel, want none", callsAfter)
			}
			if got := len(f.forkSizes); tc.wantForkCalls >= 0 && got != tc.wantForkCalls {
				t.Errorf("%d fork calls, want %d", got, tc.wantForkCalls)
			}
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

// TestReplayDeletes: sandboxes are deleted off the run slots, at most
// rateDeletes at once, Replay returns only once all are gone, and a failed
// delete is an error.
func TestReplayDeletes(t *testing.T) {
	f := newFake(failBelow3)
	res, err := Replay(context.Background(), f, ReplayOptions{Snapshot: "snap", Seed: 21, N: 12, Parallel: 4, Test: shTest})
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Runs) != 12 || len(f.left()) != 0 {
		t.Errorf("%d runs, sandboxes left %v; want 12 and none", len(res.Runs), f.left())
	}
	if f.maxDeleting > rateDeletes {
		t.Errorf("%d deletes at once, want at most %d", f.maxDeleting, rateDeletes)
	}

	f = newFake(failBelow3)
	f.deleteErrAt = 3
	if _, err := Replay(context.Background(), f, ReplayOptions{Snapshot: "snap", Seed: 21, N: 6, Test: shTest}); err == nil || !strings.Contains(err.Error(), "delete") {
		t.Errorf("a failed delete: got %v, want an error naming it", err)
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

// TestKeptFailures: a kept failure is named after its seed, carries the
// keep ttl and goes on as a memory fork of the failing fork, which goes.
func TestKeptFailures(t *testing.T) {
	t.Run("named after the seed, with the ttl", func(t *testing.T) {
		f := newFake(failBelow3, "sb_parent000")
		res, err := FlakeRate(context.Background(), f, RateOptions{Sandbox: "sb_parent000", N: 30, KeepFailures: true, KeepTTL: 45 * time.Minute, Test: shTest})
		if err != nil {
			t.Fatal(err)
		}
		checkRuns(t, f, res.Runs, 30)
		nfail, _ := failures(res.Runs)
		if nfail == 0 {
			t.Fatal("no run failed; the test proves nothing")
		}
		want := []string{"sb_parent000"}
		for _, r := range res.Runs {
			if r.Pass {
				continue
			}
			name := fmt.Sprintf("flake-%d", r.Seed)
			if r.Sandbox != name {
				t.Errorf("run %d (seed %d) kept as %q, want %q", r.Run, r.Seed, r.Sandbox, name)
			}
			if got := f.kept[name]; got != "45m0s" {
				t.Errorf("%s forked with ttl %q, want 45m0s", name, got)
			}
			want = append(want, name)
		}
		slices.Sort(want)
		if diff := cmp.Diff(want, f.left()); diff != "" {
			t.Errorf("sandboxes left (-want +got):\n%s", diff)
		}
		if diff := cmp.Diff(want[:len(want)-1], res.Summary.Kept, cmpSorted); len(res.Summary.Kept) != nfail || diff != "" {
			t.Errorf("summary kept %v, want the %d names", res.Summary.Kept, nfail)
		}
	})
	t.Run("default ttl", func(t *testing.T) {
		f := newFake(func(uint32) int { return 1 }, "sb_parent000")
		if _, err := FlakeRate(context.Background(), f, RateOptions{Sandbox: "sb_parent000", N: 2, KeepFailures: true, Test: shTest}); err != nil {
			t.Fatal(err)
		}
		for name, ttl := range f.kept {
			if ttl != DefaultKeepTTL.String() {
				t.Errorf("%s: ttl %q, want %s", name, ttl, DefaultKeepTTL)
			}
		}
		if len(f.kept) != 2 {
			t.Errorf("kept %v, want 2", f.kept)
		}
	})
	t.Run("a taken name gets a number", func(t *testing.T) {
		f := newFake(func(uint32) int { return 1 }, "sb_parent000", "flake-7", "flake-7-2")
		res, err := FlakeRate(context.Background(), f, RateOptions{Sandbox: "sb_parent000", N: 1, KeepFailures: true, Test: shTest,
			Seed: func() uint32 { return 7 }})
		if err != nil {
			t.Fatal(err)
		}
		if got := res.Summary.Kept; len(got) != 1 || got[0] != "flake-7-3" {
			t.Errorf("kept %v, want [flake-7-3]", got)
		}
	})
	t.Run("a keep fork that fails keeps the failure as it is", func(t *testing.T) {
		f := newFake(func(uint32) int { return 1 }, "sb_parent000")
		f.keepErr = api.Errorf(api.ErrUnavailable, "fake: no space")
		res, err := FlakeRate(context.Background(), f, RateOptions{Sandbox: "sb_parent000", N: 3, KeepFailures: true, KeepTTL: time.Hour, Test: shTest})
		if err != nil {
			t.Fatal(err)
		}
		for _, id := range res.Summary.Kept {
			if !strings.HasPrefix(id, "sb_") || f.ttls[id] != time.Hour {
				t.Errorf("kept %s with ttl %v, want the fork itself with 1h", id, f.ttls[id])
			}
		}
		if len(res.Summary.Kept) != 3 || len(f.left()) != 4 {
			t.Errorf("kept %v, left %v", res.Summary.Kept, f.left())
		}
	})
}

var cmpSorted = cmp.Transformer("sorted", func(in []string) []string {
	out := slices.Clone(in)
	slices.Sort(out)
	return out
})
