package e2e

import (
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"sbx.dev/sbx/api"
	"sbx.dev/sbx/client"
)

// TestCrashFuzz kills sbxd with SIGKILL at random instants spread over the
// whole duration of each operation, not only at named steps, restarts it,
// and checks the invariants of "Never lose the sandbox" (DESIGN §3):
//   - every sandbox is ready, or stopped with its memory (a resume with
//     --require-memory brings its processes back, answering with their
//     memory);
//   - a fork has all its children or none;
//   - a complete snapshot is usable;
//   - every sandbox has its network;
//   - records, runsc and namespaces agree, no journal entry is left, and
//     once everything is deleted nothing of it is left on the host.
//
// SBX_CRASH_OFFSETS sets the offsets per operation (default 1, a new
// random one each run: the suite's time has no room for more;
// `make soak` runs 30) and SBX_CRASH_SEED the seed (printed, to replay a
// failure).
func TestCrashFuzz(t *testing.T) {
	offsets := 1
	if v := os.Getenv("SBX_CRASH_OFFSETS"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			t.Fatalf("SBX_CRASH_OFFSETS=%q: want a positive number", v)
		}
		offsets = n
	}
	seed := uint64(time.Now().UnixNano())
	if v := os.Getenv("SBX_CRASH_SEED"); v != "" {
		seed, _ = strconv.ParseUint(v, 10, 64)
	}
	t.Logf("crash fuzz: %d offsets per operation, SBX_CRASH_SEED=%d", offsets, seed)
	rng := rand.New(rand.NewPCG(seed, seed>>1))

	extra := []string{"--preview-listen", freePort(), "--orphan-grace", "2s"}
	d, err := startDaemon(extra)
	if err != nil {
		t.Fatal(err)
	}
	d.preview = extra[1]
	t.Cleanup(func() { d.stop(true) })

	var table []fuzzRow
	for _, op := range fuzzOps() {
		ok := t.Run(op.name, func(t *testing.T) {
			// how long the operation takes, undisturbed
			st := op.setup(t, d)
			start := time.Now()
			if err := op.run(context.Background(), d, &st); err != nil {
				t.Fatalf("%s without a crash: %v", op.name, err)
			}
			dur := time.Since(start)
			deleteEverything(t, d)
			row := fuzzRow{op: op.name, dur: dur, outcomes: map[string]int{}}
			for i := 0; i < offsets; i++ {
				// stratified: one offset in each slice of the duration,
				// and a quarter past its end (an operation under load runs longer than its calibration)
				at := time.Duration((float64(i) + rng.Float64()) / float64(offsets) * 1.25 * float64(dur))
				outcome, failed := crashOnce(t, d, op, at)
				row.offsets++
				row.outcomes[outcome]++
				if failed {
					row.violations++
				}
				deleteEverything(t, d)
				checkNoLeaks(t, d)
				if t.Failed() {
					t.Logf("%s: invariant violated with the crash %s into it (duration %s); replay with SBX_CRASH_SEED=%d", op.name, at.Round(time.Millisecond), dur.Round(time.Millisecond), seed)
					return
				}
			}
			table = append(table, row)
		})
		if !ok {
			table = append(table, fuzzRow{op: op.name, violations: 1, outcomes: map[string]int{"FAILED": 1}})
		}
	}
	printFuzzTable(t, table)
}

// fuzzRow is one line of the crash fuzz's table.
type fuzzRow struct {
	op         string
	dur        time.Duration
	offsets    int
	violations int
	outcomes   map[string]int
}

func printFuzzTable(t *testing.T, rows []fuzzRow) {
	var b strings.Builder
	fmt.Fprintf(&b, "\n%-18s %8s %8s %11s  %s\n", "operation", "duration", "offsets", "violations", "outcomes after the restart")
	for _, r := range rows {
		var outs []string
		for k, n := range r.outcomes {
			outs = append(outs, fmt.Sprintf("%s ×%d", k, n))
		}
		sort.Strings(outs)
		fmt.Fprintf(&b, "%-18s %8s %8d %11d  %s\n", r.op, r.dur.Round(time.Millisecond), r.offsets, r.violations, strings.Join(outs, ", "))
	}
	t.Log(b.String())
	if p := os.Getenv("SBX_CRASH_TABLE"); p != "" {
		_ = os.WriteFile(p, []byte(b.String()), 0o644) // make soak prints it
	}
}

// fuzzState is what an operation works on.
type fuzzState struct {
	id   string // the sandbox, "" for a create
	mem  holder // its holder before the operation
	name string // the snapshot's name
	n    int    // the fork's children
}

type fuzzOp struct {
	name  string
	setup func(t *testing.T, d *daemon) fuzzState
	run   func(ctx context.Context, d *daemon, s *fuzzState) error
}

// withHolder is the setup of most operations: a ready tiny sandbox whose
// holder keeps a token and a counter in memory.
func withHolder(t *testing.T, d *daemon) fuzzState {
	t.Helper()
	sb, err := d.client.Create(context.Background(), client.WithTemplate("tiny"), client.WithMemoryLimit(256<<20))
	if err != nil {
		t.Fatalf("create: %v", err)
	}
	h := startHolderTiny(t, d, sb.ID)
	if d.preview != "" {
		// httpd answers before the crash: one that does not after it
		// is the crash's doing
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		if err := previewGetState(ctx, d, sb.ID, 8080, "/state"); err != nil {
			t.Fatalf("%s: httpd does not answer before the operation: %v", sb.ID, err)
		}
	}
	return fuzzState{id: sb.ID, mem: h}
}

func fuzzOps() []fuzzOp {
	snap := func(memory bool) func(ctx context.Context, d *daemon, s *fuzzState) error {
		return func(ctx context.Context, d *daemon, s *fuzzState) error {
			s.name = "fz-" + randHex(4)
			_, err := d.client.Sandbox(s.id).Snapshot(ctx, s.name, memOpt(memory)...)
			return err
		}
	}
	fork := func(n int, memory bool) func(ctx context.Context, d *daemon, s *fuzzState) error {
		return func(ctx context.Context, d *daemon, s *fuzzState) error {
			s.n = n
			_, err := sdk(d.client).Fork(ctx, s.id, api.ForkRequest{Count: n, Memory: memory})
			return err
		}
	}
	return []fuzzOp{
		{"create", func(*testing.T, *daemon) fuzzState { return fuzzState{} },
			func(ctx context.Context, d *daemon, s *fuzzState) error {
				_, err := d.client.Create(ctx, client.WithTemplate("tiny"), client.WithMemoryLimit(256<<20))
				return err
			}},
		{"exec", withHolder, func(ctx context.Context, d *daemon, s *fuzzState) error {
			_, err := sdk(d.client).Exec(ctx, s.id, api.ExecRequest{Cmd: []string{"sh", "-c", "echo a; sleep 0.5; echo b"}}, io.Discard, io.Discard)
			return err
		}},
		{"exec --detach", withHolder, func(ctx context.Context, d *daemon, s *fuzzState) error {
			_, err := sdk(d.client).ExecDetached(ctx, s.id, api.ExecRequest{Cmd: []string{"sleep", "3"}, Detach: true})
			return err
		}},
		{"snapshot", withHolder, snap(false)},
		{"snapshot --memory", withHolder, snap(true)},
		{"fork", withHolder, fork(1, false)},
		{"fork --memory x8", withHolder, fork(8, true)},
		{"stop", withHolder, func(ctx context.Context, d *daemon, s *fuzzState) error {
			_, err := d.client.Sandbox(s.id).Stop(ctx)
			return err
		}},
		{"resume", func(t *testing.T, d *daemon) fuzzState {
			s := withHolder(t, d)
			if _, err := d.client.Sandbox(s.id).Stop(context.Background()); err != nil {
				t.Fatalf("stop: %v", err)
			}
			return s
		}, func(ctx context.Context, d *daemon, s *fuzzState) error {
			_, err := d.client.Sandbox(s.id).Resume(ctx, client.RequireMemory())
			return err
		}},
		{"delete", withHolder, func(ctx context.Context, d *daemon, s *fuzzState) error {
			return deleteSandbox(ctx, d.client, s.id)
		}},
	}
}

// crashOnce sets the operation up, starts it, kills sbxd at after, restarts
// it and checks the invariants. It returns what became of the operation.
func crashOnce(t *testing.T, d *daemon, op fuzzOp, after time.Duration) (outcome string, failed bool) {
	t.Helper()
	st := op.setup(t, d)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- op.run(ctx, d, &st) }()
	var opErr error
	select {
	case opErr = <-done:
		// it ended before the crash: the crash comes after
		done = nil
	case <-time.After(after):
	}
	d.kill(syscall.SIGKILL)
	if done != nil {
		select {
		case opErr = <-done:
		case <-time.After(30 * time.Second):
			t.Fatalf("%s: the client did not return after sbxd died", op.name)
		}
	}
	if err := d.start([]string{"--preview-listen", d.preview, "--orphan-grace", "2s"}); err != nil {
		t.Fatalf("restart sbxd after a crash %s into %s: %v", after, op.name, err)
	}
	before := t.Failed()
	outcome = checkFuzzInvariants(t, d, op, st, opErr == nil)
	return outcome, t.Failed() && !before
}

// checkFuzzInvariants checks the state after a restart and says what
// became of the operation.
func checkFuzzInvariants(t *testing.T, d *daemon, op fuzzOp, st fuzzState, opDone bool) string {
	t.Helper()
	ctx := context.Background()
	sbs := checkConsistent(t, d)
	var outcome []string
	var mine *api.Sandbox
	var children []api.Sandbox
	for i := range sbs {
		if sbs[i].ID == st.id {
			mine = &sbs[i]
		}
		if st.id != "" && sbs[i].Parent == st.id {
			children = append(children, sbs[i])
		}
	}
	switch {
	case st.id == "":
		outcome = append(outcome, fmt.Sprintf("%d made", len(sbs)))
		if len(sbs) > 1 {
			t.Errorf("a create made %d sandboxes", len(sbs))
		}
	case mine == nil && op.name != "delete":
		t.Errorf("%s: the sandbox is gone after a crash during %s", st.id, op.name)
	case mine == nil:
		outcome = append(outcome, "deleted")
	default:
		outcome = append(outcome, string(mine.State))
	}
	if opDone && op.name == "delete" && mine != nil {
		t.Errorf("the delete returned, and the sandbox is still there (%s)", mine.State)
	}
	// Every sandbox is ready or stopped with its memory; resume the stopped.
	for _, sb := range sbs {
		if sb.State != api.StateStopped {
			continue
		}
		got, err := d.client.Sandbox(sb.ID).Resume(ctx, client.RequireMemory())
		if err != nil {
			t.Errorf("%s is stopped, and its memory cannot be restored: %v", sb.ID, err)
			continue
		}
		if !got.MemoryRestored {
			t.Errorf("%s: resumed without its memory: %s", sb.ID, got.ResumeReason)
		}
	}
	if mine != nil {
		checkMemory(t, d, mine.ID, st.mem)
		checkNetwork(t, d, mine.ID, true)
	}
	// A fork is all its children or none.
	if st.n > 0 {
		if len(children) != 0 && len(children) != st.n {
			t.Errorf("a fork of %d has %d children after the restart", st.n, len(children))
		}
		if opDone && len(children) != st.n {
			t.Errorf("the fork returned, and it has %d children, not %d", len(children), st.n)
		}
		outcome = append(outcome, fmt.Sprintf("%d children", len(children)))
		for _, c := range children {
			if c.MemoryRestored {
				checkMemory(t, d, c.ID, holder{Token: st.mem.Token, Pid: st.mem.Pid})
			}
			checkNetwork(t, d, c.ID, c.MemoryRestored)
		}
	}
	// A complete snapshot is usable.
	if st.name != "" {
		sn, err := d.client.GetSnapshot(ctx, st.name)
		switch {
		case err == nil:
			outcome = append(outcome, "snapshot kept")
			from, err := d.client.Create(ctx, client.WithFrom(sn.Name))
			if err != nil {
				t.Errorf("snapshot %s survived the crash but makes no sandbox: %v", sn.Name, err)
				break
			}
			if sn.Memory {
				checkMemory(t, d, from.ID, holder{Token: st.mem.Token, Pid: st.mem.Pid})
			}
		case opDone:
			t.Errorf("the snapshot returned, and it is gone after the restart: %v", err)
		default:
			outcome = append(outcome, "no snapshot")
		}
	}
	return strings.Join(outcome, ", ")
}
