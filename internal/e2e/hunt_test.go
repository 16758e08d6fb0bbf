package e2e

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
	"testing"
	"time"

	"sbx.dev/sbx/api"
	"sbx.dev/sbx/client"
	"sbx.dev/sbx/internal/flaky"
)

// copyExample copies examples/flaky into a fresh temp dir and returns it.
func copyExample(t *testing.T) string {
	t.Helper()
	_, file, _, _ := runtime.Caller(0)
	src := filepath.Join(filepath.Dir(file), "..", "..", "examples", "flaky")
	dir := t.TempDir()
	if out, err := exec.Command("cp", "-a", src+"/.", dir).CombinedOutput(); err != nil {
		t.Fatalf("copy the example: %v\n%s", err, out)
	}
	return dir
}

// sbxIn runs the CLI in dir (hunt copies the current directory).
func (d *daemon) sbxDir(t *testing.T, dir string, args ...string) result {
	t.Helper()
	cmd := exec.Command(filepath.Join(binDir, "sbx"), args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "SBX_HOST=unix://"+d.socket)
	var out, errb strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatalf("sbx %v: %v", args, err)
	}
	return result{stdout: out.String(), stderr: errb.String(), code: code}
}

// huntCleanup removes, when the test ends, what a hunt named name
// makes (the sandbox and its snapshots, NAME-fork, the snapshot NAME), then
// the sandboxes and snapshots named in also, in that order; it fails the
// test if any of them is still there afterwards.
func huntCleanup(t *testing.T, d *daemon, name string, also ...string) {
	t.Helper()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		_, _ = d.client.Sandbox(name).Delete(ctx, client.WithSnapshots())
		_ = deleteSandbox(ctx, d.client, name+"-fork")
		_ = d.client.DeleteSnapshot(ctx, name)
		for _, x := range also {
			_, _ = d.client.Sandbox(x).Delete(ctx, client.WithSnapshots())
			_ = d.client.DeleteSnapshot(ctx, x)
		}
		for _, x := range append([]string{name, name + "-fork"}, also...) {
			if _, err := d.client.Sandbox(x).Info(ctx); !errors.Is(err, api.ErrNotFound) {
				t.Errorf("cleanup: sandbox %s: %v, want not found", x, err)
			}
		}
		for _, x := range append([]string{name}, also...) {
			if _, err := d.client.GetSnapshot(ctx, x); !errors.Is(err, api.ErrNotFound) {
				t.Errorf("cleanup: snapshot %s: %v, want not found", x, err)
			}
		}
	})
}

// huntEvents parses the lines of `sbx --json hunt` and returns them
// with the summary the last line must carry.
func huntEvents(t *testing.T, r result) ([]flaky.HuntEvent, *flaky.HuntSummary) {
	t.Helper()
	if r.code != 0 {
		t.Fatalf("sbx hunt: exit %d\nstdout: %s\nstderr: %s", r.code, r.stdout, r.stderr)
	}
	var events []flaky.HuntEvent
	sc := bufio.NewScanner(strings.NewReader(r.stdout))
	for sc.Scan() {
		var ev flaky.HuntEvent
		if err := json.Unmarshal(sc.Bytes(), &ev); err != nil {
			t.Fatalf("line %q: %v", sc.Text(), err)
		}
		events = append(events, ev)
	}
	if len(events) == 0 {
		t.Fatalf("sbx hunt printed no events\nstderr: %s", r.stderr)
	}
	last := events[len(events)-1]
	if last.Event != "summary" || last.Summary == nil || !last.Summary.Failed || !last.Summary.Stopped {
		t.Fatalf("last line %+v, want the summary of a captured failure\n%s", last, r.stdout)
	}
	return events, last.Summary
}

func TestHuntFlakyExample(t *testing.T) {
	d := shared
	dir := copyExample(t)
	name := "hunt-" + randHex(4)
	huntCleanup(t, d, name)

	r := d.sbxDir(t, dir, "--json", "hunt", "--template", "base", "--runs", "20", "--name", name, "--", "./test.sh")
	events, s := huntEvents(t, r)
	var order []string
	for _, ev := range events {
		t.Logf("%s %s run=%d", ev.Time.Format("15:04:05.000"), ev.Event, ev.Run)
		switch ev.Event {
		case "fork", "artifacts", "snapshot", "stopped":
			order = append(order, ev.Event)
		}
	}
	if strings.Join(order, ",") != "fork,artifacts,snapshot,stopped" {
		t.Errorf("outside steps %v, want fork, artifacts, snapshot, stopped", order)
	}
	t.Logf("run %d failed with seed %s; captured in %d ms", s.Run, s.Seed, s.CaptureMs)
	art := filepath.Join(dir, "sbx-hunt-"+name)
	if s.Artifacts != art {
		t.Errorf("artifacts in %q, want %q", s.Artifacts, art)
	}

	read := func(f string) string {
		b, err := os.ReadFile(filepath.Join(art, f))
		if err != nil {
			t.Errorf("artifact %s: %v", f, err)
		}
		return string(b)
	}
	t.Logf("inside steps:\n%s\nleaked:\n%s", read("steps.log"), read("leaked.txt"))
	if m, _ := filepath.Glob(filepath.Join(art, "files-*.txt")); len(m) > 0 {
		b, _ := os.ReadFile(m[0])
		t.Logf("%s:\n%s", filepath.Base(m[0]), b)
	} else {
		t.Errorf("no files-PID.txt among the artifacts")
	}
	if m, _ := filepath.Glob(filepath.Join(art, "stack-*.txt")); len(m) > 0 {
		b, _ := os.ReadFile(m[0])
		if !strings.Contains(string(b), "Thread") {
			t.Errorf("%s has no thread stacks:\n%s", filepath.Base(m[0]), b)
		}
	} else {
		t.Errorf("no stack-PID.txt among the artifacts (base has gdb)")
	}
	failed := read("failed")
	if !strings.Contains(failed, "seed="+s.Seed+"\n") || !regexp.MustCompile(`(?m)^run=\d+$`).MatchString(failed) {
		t.Errorf("failed record %q, want run= and seed=%s", failed, s.Seed)
	}
	if out := read("test-output.txt"); !strings.Contains(out, "refused") {
		t.Errorf("test output %q, want curl's connection refused", out)
	}
	listening := read("listening.txt")
	if !regexp.MustCompile(`(?m)python3.*8765|8765.*python3`).MatchString(listening) {
		t.Errorf("no python3 listener on 8765 in listening.txt:\n%s", listening)
	}
	if leaked := read("leaked.txt"); !strings.Contains(leaked, "service.py") {
		t.Errorf("leaked.txt %q, want the service", leaked)
	}
	if ps := read("processes.txt"); !strings.Contains(ps, "service.py") {
		t.Errorf("processes.txt lacks the service:\n%s", ps)
	}

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := d.client.GetSnapshot(ctx, name); err != nil {
		t.Errorf("snapshot %s: %v", name, err)
	}
	if _, err := d.client.Sandbox(name + "-fork").Info(ctx); err != nil {
		t.Errorf("fork %s-fork: %v", name, err)
	}
	sb, err := d.client.Sandbox(name).Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if sb.State != "stopped" {
		t.Fatalf("sandbox %s is %s, want stopped", name, sb.State)
	}

	var res struct {
		MemoryRestored bool `json:"memoryRestored"`
	}
	d.jsonOut(t, &res, "resume", name)
	if !res.MemoryRestored {
		t.Fatalf("resume did not restore the memory")
	}
	var body string
	waitFor(t, "the leaked service to answer", 20*time.Second, func() bool {
		r := d.sbx(t, "exec", name, "--", "curl", "-sS", "--max-time", "3", "http://127.0.0.1:8765/")
		body = r.stdout
		return r.code == 0
	})
	if !strings.Contains(body, "token=") {
		t.Errorf("the leaked service answered %q, want its token", body)
	}
}

// TestHuntAttach kills the client while the loop runs inside the sandbox,
// then picks the hunt up again with --attach, which does the outside steps.
func TestHuntAttach(t *testing.T) {
	d := shared
	dir := t.TempDir()
	name := "hunt-" + randHex(4)
	huntCleanup(t, d, name)
	cmd := exec.Command(filepath.Join(binDir, "sbx"), "--json", "hunt", "--template", "tiny", "--runs", "5",
		"--name", name, "--", "sh", "-c", "sleep 4; echo boom; exit 2")
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "SBX_HOST=unix://"+d.socket)
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	sc := bufio.NewScanner(stdout)
	started := false
	for sc.Scan() {
		if strings.Contains(sc.Text(), `"event":"started"`) {
			started = true
			break
		}
	}
	cmd.Process.Kill() // the client goes away; the loop goes on inside
	cmd.Wait()
	if !started {
		t.Fatalf("the hunt never said it started")
	}

	r := d.sbxDir(t, dir, "--json", "hunt", "--attach", name)
	if r.code != 0 {
		t.Fatalf("sbx hunt --attach: exit %d\nstdout: %s\nstderr: %s", r.code, r.stdout, r.stderr)
	}
	lines := strings.Split(strings.TrimSpace(r.stdout), "\n")
	var last flaky.HuntEvent
	if err := json.Unmarshal([]byte(lines[len(lines)-1]), &last); err != nil {
		t.Fatal(err)
	}
	if last.Summary == nil || !last.Summary.Failed || last.Summary.Run != 1 || !last.Summary.Stopped {
		t.Fatalf("summary %+v, want run 1 failed and stopped\n%s", last.Summary, r.stdout)
	}
	b, err := os.ReadFile(filepath.Join(dir, "sbx-hunt-"+name, "test-output.txt"))
	if err != nil || !strings.Contains(string(b), "boom") {
		t.Errorf("test output %q, %v; want boom", b, err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if sb, err := d.client.Sandbox(name).Info(ctx); err != nil || sb.State != "stopped" {
		t.Errorf("sandbox %s: %+v, %v; want stopped", name, sb, err)
	}
	if _, err := d.client.GetSnapshot(ctx, name); err != nil {
		t.Errorf("snapshot %s: %v", name, err)
	}

	// a second attach finds it captured and does nothing again
	r = d.sbxDir(t, dir, "hunt", "--attach", name)
	t.Logf("second attach:\n%s", r.stdout)
	if r.code != 0 || !strings.Contains(r.stdout, "sbx resume "+name) {
		t.Errorf("second attach: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
}

// TestHuntSparesOtherExecs: the loop kills what a passing run left behind
// before the next run, but not someone's exec started in the hunting
// sandbox meanwhile (it was SIGKILLed at the end of the run it began in).
func TestHuntSparesOtherExecs(t *testing.T) {
	d := shared
	dir := t.TempDir()
	name := "hunt-" + randHex(4)
	huntCleanup(t, d, name)
	// run 1 waits until the exec is started; runs 1 to 3 pass, 4 fails:
	// the hunt keeps the sandbox, stopped
	test := `n=$(cat /tmp/n 2>/dev/null || echo 0); echo $((n+1)) >/tmp/n.t && mv /tmp/n.t /tmp/n
[ "$n" = 0 ] && until [ -e /tmp/go ]; do sleep 0.05; done
[ "$n" -lt 3 ]`
	done := make(chan result, 1)
	go func() {
		done <- d.sbxDir(t, dir, "hunt", "--template", "tiny", "--runs", "10", "--name", name, "--", "sh", "-c", test)
	}()
	var exec string
	for deadline := time.Now().Add(time.Minute); exec == "" && time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		if r := d.sbx(t, "exec", name, "cat", flaky.HuntDir+"/current"); r.code != 0 {
			continue
		}
		r := d.sbx(t, "exec", "-d", name, "sleep", "300")
		if r.code != 0 {
			t.Fatalf("sbx exec -d: exit %d: %s", r.code, r.stderr)
		}
		exec = strings.Fields(r.stdout)[0]
		if r := d.sbx(t, "exec", name, "touch", "/tmp/go"); r.code != 0 {
			t.Fatalf("sbx exec touch: exit %d: %s", r.code, r.stderr)
		}
	}
	r := <-done
	if exec == "" {
		t.Fatalf("the loop never started its first run:\n%s%s", r.stdout, r.stderr)
	}
	if r.code != 0 || !strings.Contains(r.stdout, "run 4 failed") {
		huntPostmortem(t, d, name)
		t.Fatalf("sbx hunt: exit %d, want run 4 failed\nstdout: %s\nstderr: %s", r.code, r.stdout, r.stderr)
	}
	var ps struct{ Execs []api.Exec }
	d.jsonOut(t, &ps, "ps", name)
	for _, x := range ps.Execs {
		if x.ID == exec && x.State != api.ExecRunning {
			t.Errorf("exec %s (sleep 300, started during the hunt): %s; want it running, its sandbox stopped with it\n%s", exec, x.State, d.sbx(t, "ps", name).stdout)
		}
	}
}

// TestHuntNoFailure: a test that always passes leaves no sandbox behind.
func TestHuntNoFailure(t *testing.T) {
	d := shared
	dir := t.TempDir()
	name := "hunt-" + randHex(4)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		_ = deleteSandbox(ctx, d.client, name)
	})
	r := d.sbxDir(t, dir, "hunt", "--template", "tiny", "--runs", "3", "--name", name, "--", "true")
	if r.code != 0 || !strings.Contains(r.stdout, "no failure in 3 runs") {
		t.Fatalf("sbx hunt: exit %d\nstdout: %s\nstderr: %s", r.code, r.stdout, r.stderr)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := d.client.Sandbox(name).Info(ctx); err == nil {
		t.Errorf("sandbox %s is still there after a hunt without failure", name)
	}
}

// TestHuntFixedExample: the fixed test of the example never fails.
func TestHuntFixedExample(t *testing.T) {
	d := shared
	dir := copyExample(t)
	name := "hunt-" + randHex(4)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		_, _ = d.client.Sandbox(name).Delete(ctx, client.WithSnapshots())
	})
	r := d.sbxDir(t, dir, "hunt", "--template", "base", "--runs", "6", "--name", name, "--", "./test_fixed.sh")
	if r.code != 0 || !strings.Contains(r.stdout, "no failure in 6 runs") {
		huntPostmortem(t, d, name)
		t.Fatalf("sbx hunt: exit %d\nstdout: %s\nstderr: %s", r.code, r.stdout, r.stderr)
	}
}

// huntPostmortem logs what a hunt that ended oddly left: sbxd's lines about
// its sandbox, the loop's records inside it and the sandbox's processes.
func huntPostmortem(t *testing.T, d *daemon, name string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	sb, err := d.client.Sandbox(name).Info(ctx)
	if err != nil {
		t.Logf("postmortem: sandbox %s: %v", name, err)
		d.logAbout(t, name)
		return
	}
	d.logAbout(t, name, sb.ID)
	script := "cd " + flaky.HuntDir + " && for f in steps.log current seed run.out; do echo \"== $f\"; tail -n 20 $f; done; echo '== ps'; ps -eo pid,ppid,pgid,stat,args"
	r := d.sbx(t, "exec", "-u", "0", sb.ID, "--", "sh", "-c", script)
	t.Logf("postmortem of %s (exit %d):\n%s%s", sb.ID, r.code, r.stdout, r.stderr)
	if r := d.sbx(t, "ps", sb.ID, "--json"); r.code == 0 {
		t.Logf("its execs: %s", r.stdout)
	}
	if b, err := os.ReadFile(filepath.Join(d.dir, "sandboxes", sb.ID, "runsc.log")); err == nil {
		t.Logf("its runsc.log (the end):\n%s", b[max(0, len(b)-4096):])
	}
}
