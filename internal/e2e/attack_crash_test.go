package e2e

// The attacker's crash suite: sbxd killed (SIGKILL) at random instants of
// operations TestCrashFuzz does not cover, then restarted, and the
// invariants of "Never lose a sandbox" checked. SBX_ATTACK_OFFSETS sets the
// offsets per operation (default 1, a new random one each run), SBX_CRASH_SEED
// the seed.

import (
	"archive/tar"
	"context"
	"crypto/rand"
	"fmt"
	"io"
	mrand "math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"

	"sbx.dev/sbx/api"
	"sbx.dev/sbx/client"
	"sbx.dev/sbx/internal/runsc"
)

// attackRNG returns the offsets per operation and a seeded random source.
func attackRNG(t *testing.T) (int, *mrand.Rand) {
	offsets := 1
	if v := os.Getenv("SBX_ATTACK_OFFSETS"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			t.Fatalf("SBX_ATTACK_OFFSETS=%q: want a positive number", v)
		}
		offsets = n
	}
	seed := uint64(time.Now().UnixNano())
	if v := os.Getenv("SBX_CRASH_SEED"); v != "" {
		seed, _ = strconv.ParseUint(v, 10, 64)
	}
	t.Logf("%d offsets per operation, SBX_CRASH_SEED=%d", offsets, seed)
	return offsets, mrand.New(mrand.NewPCG(seed, seed>>1))
}

// offsetsOver returns n crash instants spread over dur (stratified, and a
// little past its end).
func offsetsOver(rng *mrand.Rand, n int, dur time.Duration) []time.Duration {
	var at []time.Duration
	for i := range n {
		at = append(at, time.Duration((float64(i)+rng.Float64())/float64(n)*1.1*float64(dur)))
	}
	return at
}

// crashDuring runs op, SIGKILLs sbxd after `after` (or once op returned),
// restarts it with args, and returns op's error.
func crashDuring(t *testing.T, d *daemon, after time.Duration, args []string, op func(ctx context.Context) error) error {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- op(ctx) }()
	var opErr error
	select {
	case opErr = <-done:
		done = nil
	case <-time.After(after):
	}
	d.kill(syscall.SIGKILL)
	if done != nil {
		select {
		case opErr = <-done:
		case <-time.After(60 * time.Second):
			t.Fatalf("the operation did not return within 60 s of sbxd's death")
		}
	}
	if err := d.start(args); err != nil {
		t.Fatalf("restart sbxd after a crash %s in: %v", after.Round(time.Millisecond), err)
	}
	return opErr
}

// timeOp runs op once, undisturbed, and returns how long it took.
func timeOp(t *testing.T, what string, op func(ctx context.Context) error) time.Duration {
	t.Helper()
	start := time.Now()
	if err := op(context.Background()); err != nil {
		t.Fatalf("%s without a crash: %v", what, err)
	}
	return time.Since(start)
}

// sbxCmd runs the sbx CLI against d, for use off the test's goroutine.
func sbxCmd(ctx context.Context, d *daemon, args ...string) error {
	cmd := exec.CommandContext(ctx, filepath.Join(binDir, "sbx"), args...)
	cmd.Env = append(os.Environ(), "SBX_HOST=unix://"+d.socket)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return fmt.Errorf("sbx %s: %v: %s", strings.Join(args, " "), err, out)
	}
	return nil
}

// checkUsable: every sandbox is ready (it runs a command) or stopped with
// its memory (a resume with --require-memory works); nothing else.
func checkUsable(t *testing.T, d *daemon) {
	t.Helper()
	ctx := context.Background()
	for _, sb := range checkConsistent(t, d) {
		switch sb.State {
		case api.StateStopped:
			got, err := sdk(d.client).Resume(ctx, sb.ID, true)
			if err != nil {
				t.Errorf("%s is stopped and its memory cannot be restored: %v", sb.ID, err)
				continue
			}
			if !got.MemoryRestored {
				t.Errorf("%s resumed without its memory: %s", sb.ID, got.ResumeReason)
			}
		case api.StateReady:
		default:
			continue
		}
		var out strings.Builder
		if _, err := sdk(d.client).Exec(ctx, sb.ID, api.ExecRequest{Cmd: []string{"echo", "ok"}, Timeout: api.Duration(20 * time.Second)}, &out, io.Discard); err != nil || out.String() != "ok\n" {
			t.Errorf("%s (%s) does not run a command after the restart: %v %q", sb.ID, sb.State, err, out.String())
		}
	}
}

// TestAttackCrashDeleteMany: sbxd killed while `sbx delete --all` (and
// `sbx delete ID...`) deletes eight sandboxes in parallel, one of them
// stopped with its memory. After the restart each is gone or usable,
// records, runsc and namespaces agree, and once everything is deleted
// nothing is left.
func TestAttackCrashDeleteMany(t *testing.T) {
	offsets, rng := attackRNG(t)
	args := []string{"--orphan-grace", "2s"}
	d, err := startDaemon(args)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.stop(true) })
	setup := func(t *testing.T) []string {
		var ids []string
		for i := range 8 {
			sb, err := sdk(d.client).Create(context.Background(), client.WithTemplate("tiny"), client.WithMemoryLimit(256<<20))
			if err != nil {
				t.Fatalf("create: %v", err)
			}
			d.must(t, "exec", "-d", sb.ID, "--", "sh", "-c", "while :; do date > /tmp/t; sleep 1; done")
			if i == 0 {
				if _, err := sdk(d.client).Stop(context.Background(), sb.ID, true); err != nil {
					t.Fatalf("stop: %v", err)
				}
			}
			ids = append(ids, sb.ID)
		}
		return ids
	}
	for _, mode := range []string{"--all", "ids"} {
		t.Run(mode, func(t *testing.T) {
			op := func(ids []string) func(ctx context.Context) error {
				return func(ctx context.Context) error {
					if mode == "--all" {
						return sbxCmd(ctx, d, "delete", "--all", "--yes")
					}
					return sbxCmd(ctx, d, append([]string{"delete", "--yes"}, ids...)...)
				}
			}
			dur := timeOp(t, "delete", op(setup(t)))
			for _, at := range offsetsOver(rng, offsets, dur) {
				ids := setup(t)
				opErr := crashDuring(t, d, at, args, op(ids))
				left := d.list(t)
				t.Logf("crash %s into a delete of 8 (it takes %s): %d left, delete returned %v", at.Round(time.Millisecond), dur.Round(time.Millisecond), len(left), opErr)
				if opErr == nil && len(left) != 0 {
					t.Errorf("the delete returned success and %d sandboxes are left", len(left))
				}
				checkUsable(t, d)
				deleteEverything(t, d)
				checkNoLeaks(t, d)
				if t.Failed() {
					return
				}
			}
		})
	}
}

// TestAttackCrashExecFlood: sbxd killed while an exec floods its output
// (300 MB). After the restart the exec ends, with its code, and its output
// on the host is within its budget; sbxd's memory is small.
func TestAttackCrashExecFlood(t *testing.T) {
	offsets, rng := attackRNG(t)
	args := []string{"--orphan-grace", "2s"}
	d, err := startDaemon(args)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.stop(true) })
	cmd := []string{"sh", "-c", "dd if=/dev/zero bs=1M count=300 2>/dev/null; echo flood-done >&2"}
	newSB := func() string {
		sb, err := sdk(d.client).Create(context.Background(), client.WithTemplate("tiny"))
		if err != nil {
			t.Fatalf("create: %v", err)
		}
		return sb.ID
	}
	id := newSB()
	dur := timeOp(t, "exec flood", func(ctx context.Context) error {
		_, err := sdk(d.client).Exec(ctx, id, api.ExecRequest{Cmd: cmd, Timeout: api.Duration(5 * time.Minute)}, io.Discard, io.Discard)
		return err
	})
	deleteEverything(t, d)
	for _, at := range offsetsOver(rng, offsets, dur) {
		id := newSB()
		crashDuring(t, d, at, args, func(ctx context.Context) error {
			_, err := sdk(d.client).Exec(ctx, id, api.ExecRequest{Cmd: cmd, Timeout: api.Duration(5 * time.Minute)}, io.Discard, io.Discard)
			return err
		})
		checkConsistent(t, d)
		var ex api.Exec
		waitFor(t, "the flooding exec to end after the restart", 3*time.Minute, func() bool {
			xs := mustExecs(t, d, id)
			if len(xs) == 0 {
				return false
			}
			ex = xs[0]
			return ex.State != api.ExecRunning
		})
		if ex.State != api.ExecExited || ex.ExitCode == nil || *ex.ExitCode != 0 {
			t.Errorf("crash %s into an exec flood (%s): the exec is %s (exit %v), want exited 0: its shim outlived sbxd and keeps its end", at.Round(time.Millisecond), dur.Round(time.Millisecond), ex.State, ex.ExitCode)
		}
		var size int64
		filepath.Walk(filepath.Join(d.dir, "sandboxes", id, "execs", ex.ID), func(p string, fi os.FileInfo, err error) error {
			if err == nil && !fi.IsDir() && (fi.Name() == "stdout" || fi.Name() == "stderr") {
				size += fi.Size()
			}
			return nil
		})
		if budget := int64(runsc.DefaultOutputHead+runsc.DefaultOutputTail)*2 + 4096; size > budget {
			t.Errorf("the exec's output holds %d bytes on the host, past its budget %d", size, budget)
		}
		if r := rssKB(t, d, "VmRSS"); r > 200<<10 {
			t.Errorf("sbxd's RSS is %d MB after the restart", r>>10)
		}
		deleteEverything(t, d)
		checkNoLeaks(t, d)
		if t.Failed() {
			t.Logf("crash at %s", at)
			return
		}
	}
}

// TestAttackCrashStopManyExecs: sbxd killed while it stops a sandbox
// running the memory holder and eight detached commands. After the
// restart the sandbox is ready or stopped with its memory; resumed, its
// holder answers with its memory and every detached command is still
// running, and followed (its output grows).
func TestAttackCrashStopManyExecs(t *testing.T) {
	offsets, rng := attackRNG(t)
	extra := []string{"--preview-listen", freePort(), "--orphan-grace", "2s"}
	d, err := startDaemon(extra)
	if err != nil {
		t.Fatal(err)
	}
	d.preview = extra[1]
	t.Cleanup(func() { d.stop(true) })
	setup := func(t *testing.T) (fuzzState, []string) {
		st := withHolder(t, d)
		var execs []string
		for i := range 8 {
			x, err := sdk(d.client).ExecDetached(context.Background(), st.id, api.ExecRequest{Cmd: []string{"sh", "-c", fmt.Sprintf("i=0; while :; do i=$((i+1)); echo c%d $i; sleep 0.3; done", i)}, Detach: true})
			if err != nil {
				t.Fatalf("detach: %v", err)
			}
			execs = append(execs, x.ID)
		}
		return st, execs
	}
	st, _ := setup(t)
	dur := timeOp(t, "stop", func(ctx context.Context) error { _, err := sdk(d.client).Stop(ctx, st.id, true); return err })
	deleteEverything(t, d)
	for _, at := range offsetsOver(rng, offsets, dur) {
		st, execs := setup(t)
		crashDuring(t, d, at, extra, func(ctx context.Context) error { _, err := sdk(d.client).Stop(ctx, st.id, true); return err })
		op := fuzzOp{name: "stop"}
		outcome := checkFuzzInvariants(t, d, op, st, false)
		t.Logf("crash %s into a stop with 10 execs (%s): %s", at.Round(time.Millisecond), dur.Round(time.Millisecond), outcome)
		lines := func(ex string) int {
			r := d.sbx(t, "logs", st.id, "--exec", ex, "--tail", "1")
			var c, n int
			fmt.Sscanf(strings.TrimSpace(r.stdout), "c%d %d", &c, &n)
			return n
		}
		for _, ex := range execs {
			a := lines(ex)
			deadline := time.Now().Add(15 * time.Second)
			for lines(ex) <= a+2 && time.Now().Before(deadline) {
				time.Sleep(300 * time.Millisecond)
			}
			if b := lines(ex); b <= a+2 {
				state := ""
				for _, x := range mustExecs(t, d, st.id) {
					if x.ID == ex {
						state = string(x.State)
					}
				}
				t.Errorf("crash %s into a stop: detached exec %s (%s) is not followed any more after the restart and resume: its output stays at %d", at.Round(time.Millisecond), ex, state, b)
			}
		}
		deleteEverything(t, d)
		checkNoLeaks(t, d)
		if t.Failed() {
			return
		}
	}
}

// TestAttackCrashForkOfFork: sbxd killed while it makes four memory forks
// of a sandbox that is itself a memory fork. After the restart the fork has
// all its children or none; the parent, the grandparent and every child
// answer with the holder's memory and have their network.
func TestAttackCrashForkOfFork(t *testing.T) {
	offsets, rng := attackRNG(t)
	extra := []string{"--preview-listen", freePort(), "--orphan-grace", "2s"}
	d, err := startDaemon(extra)
	if err != nil {
		t.Fatal(err)
	}
	d.preview = extra[1]
	t.Cleanup(func() { d.stop(true) })
	setup := func(t *testing.T) fuzzState {
		st := withHolder(t, d)
		kids, err := sdk(d.client).Fork(context.Background(), st.id, api.ForkRequest{Count: 1, Memory: true})
		if err != nil || len(kids) != 1 {
			t.Fatalf("fork: %v", err)
		}
		return fuzzState{id: kids[0].ID, mem: holder{Token: st.mem.Token, Pid: st.mem.Pid}}
	}
	fork := func(st *fuzzState) func(ctx context.Context) error {
		return func(ctx context.Context) error {
			st.n = 4
			_, err := sdk(d.client).Fork(ctx, st.id, api.ForkRequest{Count: 4, Memory: true})
			return err
		}
	}
	st := setup(t)
	dur := timeOp(t, "fork of a fork", fork(&st))
	deleteEverything(t, d)
	for _, at := range offsetsOver(rng, offsets, dur) {
		st := setup(t)
		opErr := crashDuring(t, d, at, extra, fork(&st))
		outcome := checkFuzzInvariants(t, d, fuzzOp{name: "fork"}, st, opErr == nil)
		t.Logf("crash %s into a fork of a fork (%s): %s", at.Round(time.Millisecond), dur.Round(time.Millisecond), outcome)
		deleteEverything(t, d)
		checkNoLeaks(t, d)
		if t.Failed() {
			return
		}
	}
}

// TestAttackCrashDuringReconcile: sbxd killed in the middle of stops,
// a fork --memory x4 and a delete going on at once; then each restart is
// killed again at a random instant of its reconcile (twice), before a
// last one is let through. Every sandbox is then ready or stopped with
// its memory, every holder answers with its memory, the fork has all its
// children or none, and nothing leaks.
func TestAttackCrashDuringReconcile(t *testing.T) {
	offsets, rng := attackRNG(t)
	extra := []string{"--preview-listen", freePort(), "--orphan-grace", "2s"}
	d, err := startDaemon(extra)
	if err != nil {
		t.Fatal(err)
	}
	d.preview = extra[1]
	t.Cleanup(func() { d.stop(true) })
	for round := range offsets {
		var sts []fuzzState
		for range 4 {
			sts = append(sts, withHolder(t, d))
		}
		errs := make(chan error, 4)
		go func() { _, err := sdk(d.client).Stop(context.Background(), sts[0].id, true); errs <- err }()
		go func() { _, err := sdk(d.client).Stop(context.Background(), sts[1].id, true); errs <- err }()
		go func() {
			_, err := sdk(d.client).Fork(context.Background(), sts[2].id, api.ForkRequest{Count: 4, Memory: true})
			errs <- err
		}()
		go func() { errs <- sdk(d.client).Delete(context.Background(), sts[3].id) }()
		first := time.Duration(300+rng.IntN(1500)) * time.Millisecond
		time.Sleep(first) // tested: a random instant, sbxd killed
		d.kill(syscall.SIGKILL)
		for range 4 {
			<-errs
		}
		var again []time.Duration
		for range 2 {
			at := time.Duration(50+rng.IntN(2500)) * time.Millisecond
			again = append(again, at)
			d.startNoWait(t)
			time.Sleep(at) // tested: a random instant, sbxd killed again
			d.kill(syscall.SIGKILL)
		}
		if err := d.start(extra); err != nil {
			t.Fatalf("round %d: the third restart: %v", round, err)
		}
		t.Logf("round %d: crash %s into the operations, then %v into two reconciles", round, first, again)
		sbs := checkConsistent(t, d)
		byID := map[string]api.Sandbox{}
		children := 0
		for _, sb := range sbs {
			byID[sb.ID] = sb
			if sb.Parent == sts[2].id {
				children++
			}
		}
		if children != 0 && children != 4 {
			t.Errorf("round %d: the fork of 4 has %d children", round, children)
		}
		for i, st := range sts[:3] {
			sb, ok := byID[st.id]
			if !ok {
				t.Errorf("round %d: sandbox %d (%s) is gone", round, i, st.id)
				continue
			}
			if sb.State == api.StateStopped {
				if got, err := sdk(d.client).Resume(context.Background(), sb.ID, true); err != nil || !got.MemoryRestored {
					t.Errorf("round %d: %s is stopped and does not resume with its memory: %v", round, sb.ID, err)
					continue
				}
			}
			checkMemory(t, d, st.id, st.mem)
		}
		checkUsable(t, d)
		deleteEverything(t, d)
		checkNoLeaks(t, d)
		if t.Failed() {
			return
		}
	}
}

// randomLayer is a layer holding one file of n random bytes.
func randomLayer(t *testing.T, name string, n int) []byte {
	t.Helper()
	b := make([]byte, n)
	rand.Read(b)
	return layerTar(t, []tarEntry{tdir("data/", 0o755), {hdr: &tar.Header{Typeflag: tar.TypeReg, Name: "data/" + name, Mode: 0o644}, body: b}})
}

// templateStoreLeftovers lists what an interrupted operation left in the
// template store's tmp/ (work directories and lease files).
func templateStoreLeftovers(d *daemon) []string {
	ents, _ := os.ReadDir(filepath.Join(d.dir, "templates", "tmp"))
	var left []string
	for _, e := range ents {
		left = append(left, e.Name())
	}
	return left
}

// checkTemplate: name is absent, or a complete template a sandbox boots
// from and runs a command in.
func checkTemplate(t *testing.T, d *daemon, name string) bool {
	t.Helper()
	ctx := context.Background()
	tms, err := sdk(d.client).Templates(ctx)
	if err != nil {
		t.Errorf("template ls after the restart: %v", err)
		return false
	}
	for _, tm := range tms {
		if tm.Name != name {
			continue
		}
		sb, err := sdk(d.client).Create(ctx, client.WithTemplate(name))
		if err != nil {
			t.Errorf("template %s (%s) survived the crash but makes no sandbox: %v", name, tm.Version, err)
			return true
		}
		var out strings.Builder
		if _, err := sdk(d.client).Exec(ctx, sb.ID, api.ExecRequest{Cmd: []string{"echo", "ok"}, Timeout: api.Duration(20 * time.Second)}, &out, io.Discard); err != nil || out.String() != "ok\n" {
			t.Errorf("a sandbox of template %s runs nothing: %v %q", name, err, out.String())
		}
		_ = sdk(d.client).Delete(ctx, sb.ID)
		return true
	}
	return false
}

// TestAttackCrashTemplates: sbxd killed at random instants of an image
// import, a template build and a template rm (of a template a sandbox
// holds), on a template store of its own. After the restart each name is
// absent or complete and usable, the operation can be done again, the
// sandbox that held the template still runs, and the interrupted work is
// cleared from the store's tmp/.
func TestAttackCrashTemplates(t *testing.T) {
	offsets, rng := attackRNG(t)
	d := privateDaemon(t)
	ctx := context.Background()
	if _, err := sdk(d.client).BuildTemplate(ctx, "tiny", false, nil); err != nil {
		t.Fatalf("build tiny: %v", err)
	}
	layout := func(t *testing.T) string {
		return writeLayout(t, imageOf(t, v1.Config{Env: []string{"A=1"}},
			layerOf(t, busyboxLayer(t)), layerOf(t, randomLayer(t, "a", 96<<20)), layerOf(t, randomLayer(t, "b", 96<<20))))
	}
	type tplOp struct {
		name  string
		setup func(t *testing.T, i int) (string, func(ctx context.Context) error)
		// present says where the name must be once the operation returned
		present bool
	}
	ops := []tplOp{
		{"import image", func(t *testing.T, i int) (string, func(ctx context.Context) error) {
			dir, name := layout(t), fmt.Sprintf("img%d", i)
			return name, func(ctx context.Context) error {
				_, err := sdk(d.client).ImportTemplateFrom(ctx, name, dir, nil)
				return err
			}
		}, true},
		{"build tiny --force", func(t *testing.T, i int) (string, func(ctx context.Context) error) {
			return "tiny", func(ctx context.Context) error {
				_, err := sdk(d.client).BuildTemplate(ctx, "tiny", true, nil)
				return err
			}
		}, true},
		{"rm a held template", func(t *testing.T, i int) (string, func(ctx context.Context) error) {
			name := fmt.Sprintf("held%d", i)
			if _, err := sdk(d.client).ImportTemplateFrom(ctx, name, layout(t), nil); err != nil {
				t.Fatalf("import: %v", err)
			}
			sb, err := sdk(d.client).Create(ctx, client.WithTemplate(name))
			if err != nil {
				t.Fatalf("create on %s: %v", name, err)
			}
			_ = sb
			return name, func(ctx context.Context) error {
				_, err := sdk(d.client).RemoveTemplate(ctx, name)
				return err
			}
		}, false},
	}
	n := 0
	for _, op := range ops {
		t.Run(op.name, func(t *testing.T) {
			n++
			name, run := op.setup(t, n)
			dur := timeOp(t, op.name, run)
			for _, at := range offsetsOver(rng, offsets, dur) {
				n++
				name, run = op.setup(t, n)
				opErr := crashDuring(t, d, at, nil, run)
				present := checkTemplate(t, d, name)
				t.Logf("crash %s into %s (%s): returned %v; %s present: %v", at.Round(time.Millisecond), op.name, dur.Round(time.Millisecond), opErr, name, present)
				if opErr == nil && present != op.present {
					t.Errorf("%s returned success, and after the crash template %s present=%v", op.name, name, present)
				}
				checkUsable(t, d)
				var left []string
				deadline := time.Now().Add(15 * time.Second)
				for left = templateStoreLeftovers(d); len(left) > 0 && time.Now().Before(deadline); left = templateStoreLeftovers(d) {
					time.Sleep(500 * time.Millisecond)
				}
				if len(left) > 0 {
					t.Errorf("crash %s into %s: the template store's tmp/ still holds %v after the restart: the interrupted work is never cleared", at.Round(time.Millisecond), op.name, left)
				}
				// and again, undisturbed
				if op.name == "import image" || op.name == "build tiny --force" {
					if err := run(context.Background()); err != nil && !present {
						t.Errorf("%s again after the crash: %v", op.name, err)
					}
				}
				if t.Failed() {
					return
				}
			}
		})
	}
	deleteEverything(t, d)
	tms, _ := sdk(d.client).Templates(ctx)
	for _, tm := range tms {
		if _, err := sdk(d.client).RemoveTemplate(ctx, tm.Name); err != nil {
			t.Errorf("template rm %s: %v", tm.Name, err)
		}
	}
	var vs []os.DirEntry
	waitFor(t, "the template versions nothing holds to be collected", 30*time.Second, func() bool {
		vs, _ = os.ReadDir(filepath.Join(d.dir, "templates", "versions"))
		return len(vs) == 0
	})
	checkNoLeaks(t, d)
}
