package e2e

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"sbx.dev/sbx/api"
	"sbx.dev/sbx/client"
)

// The Go client's shape against a real sbxd, as a newcomer would hold it:
// exec control (Start, Signal, Kill, Wait, a cancelled Exec), a foreground
// exec and what it leaves behind surviving stop and resume, WaitPort,
// Events after a sequence number, fork meta and list filters, and the
// directory helpers.

// newSDKSandbox creates a sandbox through the client, deleted when the
// test ends.
func newSDKSandbox(t *testing.T, d *daemon, opts ...client.CreateOption) *client.Sandbox {
	t.Helper()
	info, err := d.client.Create(context.Background(), opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		_ = deleteSandbox(ctx, d.client, info.ID)
	})
	return d.client.Sandbox(info.ID)
}

// TestSDKExecControl: Start returns at once with the id; Signal reaches the
// command's process group (a trap sees it), Kill ends it, Wait reports
// either; Exec cancelled returns the exec's id and leaves the command
// running, to be waited for again.
func TestSDKExecControl(t *testing.T) {
	d := shared
	ctx := context.Background()
	sb := newSDKSandbox(t, d, client.WithTemplate("tiny"))

	// a trap sees the signal
	var out strings.Builder
	p, err := sb.Start(ctx, client.Shell(`trap 'echo got USR1; exit 7' USR1; echo ready; while :; do sleep 0.1; done`), client.WithStdout(&out))
	if err != nil {
		t.Fatal(err)
	}
	if p.ID == "" {
		t.Fatal("Start returned no exec id")
	}
	waitFor(t, "the trap to be set", 20*time.Second, func() bool {
		var o strings.Builder
		_, err := p.Output(ctx, client.WithStdout(&o))
		return err == nil && strings.Contains(o.String(), "ready")
	})
	if err := p.Signal(ctx, syscall.SIGUSR1); err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	res, err := p.Wait(wctx)
	cancel()
	if err != nil || res.ExitCode != 7 {
		t.Fatalf("after SIGUSR1: %+v %v, want exit 7", res, err)
	}
	if !strings.Contains(out.String(), "got USR1") {
		t.Errorf("the trap's output: %q", out.String())
	}
	if err := p.Signal(ctx, syscall.SIGUSR1); !errors.Is(err, api.ErrConflict) {
		t.Errorf("signal to an ended exec: %v, want ErrConflict", err)
	}
	if err := sb.Process("ex_nosuch").Kill(ctx); !errors.Is(err, api.ErrNotFound) {
		t.Errorf("kill of no exec: %v, want ErrNotFound", err)
	}

	// Kill ends what ignores SIGTERM, and its group with it
	p, err = sb.Start(ctx, client.Shell(`trap '' TERM; sleep 300 & echo $! > /tmp/child; wait`))
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the child's pid", 20*time.Second, func() bool {
		b, err := sb.Files().ReadFile(ctx, "/tmp/child", 64)
		return err == nil && len(b) > 0
	})
	if err := p.Kill(ctx); err != nil {
		t.Fatal(err)
	}
	wctx, cancel = context.WithTimeout(ctx, 30*time.Second)
	res, err = p.Wait(wctx)
	cancel()
	if err != nil || res.ExitCode != 128+9 {
		t.Fatalf("after Kill: %+v %v, want exit 137", res, err)
	}
	var check strings.Builder
	r, err := sb.Exec(ctx, client.Shell(`kill -0 $(cat /tmp/child) 2>/dev/null && echo alive || echo gone`), client.WithStdout(&check))
	if err != nil || r.ExitCode != 0 {
		t.Fatalf("check the child: %+v %v", r, err)
	}
	if check.String() != "gone\n" {
		t.Errorf("the killed exec's child lives on")
	}

	// a cancelled Exec: its id comes back, the command runs on
	cctx, cancel := context.WithCancel(ctx)
	time.AfterFunc(time.Second, cancel)
	var late strings.Builder
	res, err = sb.Exec(cctx, client.Shell(`sleep 3; echo finished`), client.WithStdout(&late))
	if !errors.Is(err, context.Canceled) || res == nil || res.ID == "" || res.State != api.ExecRunning {
		t.Fatalf("cancelled Exec: %+v %v, want the running exec and context.Canceled", res, err)
	}
	wctx, cancel = context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	res, err = sb.Process(res.ID).Wait(wctx, client.WithStdout(&late))
	if err != nil || res.ExitCode != 0 || !strings.Contains(late.String(), "finished") {
		t.Errorf("the command after the cancel: %+v %v %q, want it finished", res, err, late.String())
	}
}

// TestSDKForegroundSurvivesStop: a foreground Exec, and a process it left
// behind, go on across a stop and a resume: the client following the exec
// sees it end after the resume, and the process it started is the same one.
func TestSDKForegroundSurvivesStop(t *testing.T) {
	d := shared
	ctx := context.Background()
	sb := newSDKSandbox(t, d, client.WithTemplate("tiny"))
	type done struct {
		res *client.Result
		err error
	}
	ended := make(chan done, 1)
	var out strings.Builder
	go func() {
		res, err := sb.Exec(ctx, client.Shell(`sleep 600 & echo $! > /tmp/bg; while [ ! -e /tmp/go ]; do sleep 0.2; done; echo fg-done`),
			client.WithStdout(&out), client.WithTimeout(10*time.Minute))
		ended <- done{res, err}
	}()
	var bg string
	waitFor(t, "the foreground exec to leave its process", 30*time.Second, func() bool {
		b, err := sb.Files().ReadFile(ctx, "/tmp/bg", 64)
		bg = strings.TrimSpace(string(b))
		return err == nil && bg != ""
	})
	if _, err := sb.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	back, err := sb.Resume(ctx, client.RequireMemory())
	if err != nil {
		t.Fatal(err)
	}
	if !back.MemoryRestored {
		t.Fatalf("resume: memoryRestored false (%s)", back.ResumeReason)
	}
	if err := sb.Files().WriteString(ctx, "/tmp/go", "go"); err != nil {
		t.Fatal(err)
	}
	var got done
	select {
	case got = <-ended:
	case <-time.After(2 * time.Minute):
		t.Fatal("the foreground exec did not end after the resume")
	}
	res := got.res
	var se *client.StreamError
	if errors.As(got.err, &se) && se.ExecID != "" { // the follow broke at the stop: wait again
		wctx, cancel := context.WithTimeout(ctx, time.Minute)
		defer cancel()
		res, got.err = sb.Process(se.ExecID).Wait(wctx, client.WithStdout(&out))
	}
	if got.err != nil || res == nil || res.ExitCode != 0 || !strings.Contains(out.String(), "fg-done") {
		t.Fatalf("the foreground exec across stop and resume: %+v %v, output %q", res, got.err, out.String())
	}
	var alive strings.Builder
	r, err := sb.Exec(ctx, []string{"sh", "-c", `kill -0 "$1" && echo alive`, "sh", bg}, client.WithStdout(&alive))
	if err != nil || r.ExitCode != 0 || alive.String() != "alive\n" {
		t.Errorf("the process the foreground exec left (pid %s) after the resume: %+v %v %q", bg, r, err, alive.String())
	}
}

// TestSDKHelpers: WaitPort, Events after a sequence number, fork meta and
// list filters, UploadDir and DownloadDir (into a 0700 folder that keeps
// its mode).
func TestSDKHelpers(t *testing.T) {
	d := shared
	ctx := context.Background()
	sb := newSDKSandbox(t, d, client.WithTemplate("tiny"), client.WithMeta("team", "sdk"))

	// WaitPort: nothing yet, then the server
	short, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
	_, err := sb.WaitPort(short, 8080)
	cancel()
	if !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "8080") {
		t.Errorf("WaitPort with nothing listening: %v, want the deadline, naming the port", err)
	}
	if _, err := sb.Start(ctx, client.Shell("sleep 1; mkdir -p /w && echo hi > /w/i.txt && exec httpd -f -p 8080 -h /w")); err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	port, err := sb.WaitPort(wctx, 8080)
	cancel()
	if err != nil || port.Port != 8080 {
		t.Fatalf("WaitPort: %+v %v", port, err)
	}

	// Events after a sequence number: only what came later
	var all []api.Event
	if err := sb.Events(ctx, func(ev api.Event) error { all = append(all, ev); return nil }); err != nil || len(all) == 0 {
		t.Fatalf("events: %d, %v", len(all), err)
	}
	var after []api.Event
	if err := sb.Events(ctx, func(ev api.Event) error { after = append(after, ev); return nil }, client.After(all[0].Seq)); err != nil {
		t.Fatal(err)
	}
	if len(after) < len(all)-1 {
		t.Errorf("events after %d: %d, want the %d that came later", all[0].Seq, len(after), len(all)-1)
	}
	for _, ev := range after {
		if ev.Seq <= all[0].Seq {
			t.Errorf("events after %d gave event %d (%s)", all[0].Seq, ev.Seq, ev.Type)
		}
	}

	// UploadDir, DownloadDir into a folder of mine that keeps its mode
	src := t.TempDir()
	os.MkdirAll(filepath.Join(src, "sub"), 0o755)
	os.WriteFile(filepath.Join(src, "sub", "a.txt"), []byte("A"), 0o640)
	if err := sb.Files().UploadDir(ctx, src, "/up"); err != nil {
		t.Fatal(err)
	}
	if _, err := sb.Exec(ctx, client.Shell("chmod 777 /up")); err != nil {
		t.Fatal(err)
	}
	mine := filepath.Join(t.TempDir(), "mine")
	if err := os.Mkdir(mine, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := sb.Files().DownloadDir(ctx, "/up", mine); err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(filepath.Join(mine, "sub", "a.txt")); err != nil || string(b) != "A" {
		t.Errorf("downloaded sub/a.txt: %q %v", b, err)
	}
	if fi, err := os.Stat(mine); err != nil || fi.Mode().Perm() != 0o700 {
		t.Errorf("my 0700 folder after DownloadDir: %v %v", fi.Mode(), err)
	}

	// fork meta merged, list filters
	kids, err := sb.Fork(ctx, client.WithCount(2), client.WithMeta("job", "sdk-"+randHex(3)))
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range kids {
		t.Cleanup(func() { _ = deleteSandbox(context.Background(), d.client, k.ID) })
		if k.Meta["team"] != "sdk" || !strings.HasPrefix(k.Meta["job"], "sdk-") || k.Parent != sb.ID() {
			t.Errorf("child %s: meta %v parent %s, want the parent's meta merged with the fork's", k.ID, k.Meta, k.Parent)
		}
	}
	job := kids[0].Meta["job"]
	got, err := d.client.List(ctx, client.WithMeta("job", job), client.WithParent(sb.ID()), client.WithState(api.StateReady))
	if err != nil || len(got) != 2 {
		t.Errorf("list by meta, parent and state: %d sandboxes, %v; want the 2 children", len(got), err)
	}
	if none, err := d.client.List(ctx, client.WithMeta("job", job), client.WithState(api.StateStopped)); err != nil || len(none) != 0 {
		t.Errorf("list of stopped children: %d, %v; want none", len(none), err)
	}
}

// TestSDKExecStartedAtStop: foreground execs whose start sbxd has just
// answered (their "started" event) when a stop comes are all carried
// through the stop and the resume, and end with their own exit code and
// output: none is lost ("exec not found") because the stop caught it
// before the sandbox's init had it.
func TestSDKExecStartedAtStop(t *testing.T) {
	d := shared
	ctx := context.Background()
	sb := newSDKSandbox(t, d, client.WithTemplate("tiny"))
	type done struct {
		i   int
		res *client.Result
		err error
		out *strings.Builder
	}
	for round := 0; round < 4; round++ {
		const n = 4
		started := make(chan struct{}, n)
		ended := make(chan done, n)
		for i := 0; i < n; i++ {
			go func() {
				out := &strings.Builder{}
				res, err := sb.Exec(ctx, client.Shell(fmt.Sprintf("sleep 0.5; echo round-%d-%d; exit %d", round, i, 10+i)),
					client.WithStdout(out), client.WithExecEvents(func(ev api.ExecEvent) error {
						if ev.Event == api.ExecStarted {
							started <- struct{}{}
						}
						return nil
					}))
				ended <- done{i, res, err, out}
			}()
		}
		<-started // the first has started: stop at once
		if _, err := sb.Stop(ctx); err != nil {
			t.Fatal(err)
		}
		if _, err := sb.Resume(ctx, client.RequireMemory()); err != nil {
			t.Fatal(err)
		}
		for range n {
			var got done
			select {
			case got = <-ended:
			case <-time.After(2 * time.Minute):
				t.Fatalf("round %d: an exec did not end after the resume", round)
			}
			res, err := got.res, got.err
			var se *client.StreamError
			if errors.As(err, &se) && se.ExecID != "" { // the follow broke at the stop: wait again
				wctx, cancel := context.WithTimeout(ctx, time.Minute)
				got.out.Reset()
				res, err = sb.Process(se.ExecID).Wait(wctx, client.WithStdout(got.out))
				cancel()
			}
			want := fmt.Sprintf("round-%d-%d\n", round, got.i)
			if errors.Is(err, api.ErrConflict) && res == nil {
				continue // refused: the sandbox was stopping when it came
			}
			if err != nil || res == nil || res.ExitCode != 10+got.i || got.out.String() != want {
				t.Errorf("round %d: exec %d around the stop: %+v %v, output %q; want exit %d and %q", round, got.i, res, err, got.out.String(), 10+got.i, want)
			}
		}
	}
}
