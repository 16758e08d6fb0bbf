package e2e

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"sbx.dev/sbx/api"
	"sbx.dev/sbx/internal/flaky"
)

// huntOptionsArtifact returns the file rel of the artifacts folder art.
func huntOptionsArtifact(t *testing.T, art, rel string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(art, rel))
	if err != nil {
		t.Errorf("artifact %s: %v", rel, err)
	}
	return string(b)
}

// huntOptionsTest counts its runs in /work/.runs and fails (exit 7) on the
// third. It needs what the setup makes (setup-marker, logs/) and fails at
// once (exit 9) without it; each run appends its number and seed to
// logs/test.log and writes its number to an absolute path outside /work.
const huntOptionsTest = `#!/bin/sh
n=$(( $(cat .runs 2>/dev/null || echo 0) + 1 ))
echo "$n" >.runs
[ "$(cat setup-marker 2>/dev/null)" = prepared ] || { echo "run $n: no setup-marker"; exit 9; }
echo "run $n seed $HUNT_SEED" >>logs/test.log || exit 9
echo "abs run $n" >/tmp/hunt-options-abs.txt
if [ "$n" -eq 3 ]; then echo "failing on purpose in run $n"; exit 7; fi
echo "run $n passes"
`

// TestHuntOptionsSetupCollect: the setup runs once in /work before the first
// run, its output is kept as setup.out, and each --collect path (relative to
// /work, absolute, missing) is kept as the failing run left it.
func TestHuntOptionsSetupCollect(t *testing.T) {
	d := shared
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "test.sh"), []byte(huntOptionsTest), 0o755); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(t.TempDir(), "evidence")
	name := "hunt-opt-" + randHex(4)
	huntCleanup(t, d, name)

	setup := "echo prepared >setup-marker && mkdir -p logs && echo ran >>setup-count && echo setup says hello in $(pwd)"
	r := d.sbxDir(t, dir, "--json", "hunt", "--template", "tiny", "--runs", "10", "--name", name,
		"--setup", setup, "--seed-env", "HUNT_SEED", "--out", out,
		"--collect", "logs", "--collect", "setup-count", "--collect", "/tmp/hunt-options-abs.txt",
		"--collect", "no-such-file", "--", "./test.sh")
	events, s := huntEvents(t, r)

	var passed []int
	var failed []flaky.HuntEvent
	for _, ev := range events {
		switch ev.Event {
		case "run":
			if ev.ExitCode == nil || *ev.ExitCode != 0 {
				t.Errorf("run event %+v, want exit 0", ev)
			}
			passed = append(passed, ev.Run)
		case "failed":
			failed = append(failed, ev)
		}
	}
	if fmt.Sprint(passed) != "[1 2]" {
		t.Errorf("passing runs %v, want [1 2]", passed)
	}
	if len(failed) != 1 || failed[0].Run != 3 || failed[0].ExitCode == nil || *failed[0].ExitCode != 7 {
		t.Errorf("failed events %+v, want one for run 3 with exit 7", failed)
	}
	if s.Run != 3 || s.Runs != 3 || s.ExitCode != 7 || s.Seed == "" {
		t.Errorf("summary run %d of %d, exit %d, seed %q; want run 3 of 3, exit 7, a seed", s.Run, s.Runs, s.ExitCode, s.Seed)
	}
	if s.Artifacts != out {
		t.Errorf("artifacts in %q, want --out %q", s.Artifacts, out)
	}
	if _, err := os.Stat(filepath.Join(dir, "sbx-hunt-"+name)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the default artifacts folder was made despite --out: %v", err)
	}

	if got, want := huntOptionsArtifact(t, out, "setup.out"), "setup says hello in /work\n"; got != want {
		t.Errorf("setup.out %q, want %q", got, want)
	}
	if got := huntOptionsArtifact(t, out, "collected/work/setup-count"); got != "ran\n" {
		t.Errorf("collected/work/setup-count %q, want the setup to have run once: %q", got, "ran\n")
	}
	logs := strings.Split(strings.TrimSpace(huntOptionsArtifact(t, out, "collected/work/logs/test.log")), "\n")
	if len(logs) != 3 {
		t.Errorf("collected/work/logs/test.log has %d lines, want one per run (3): %q", len(logs), logs)
	} else {
		for i, l := range logs {
			if !strings.HasPrefix(l, fmt.Sprintf("run %d seed ", i+1)) || l == fmt.Sprintf("run %d seed ", i+1) {
				t.Errorf("test.log line %d is %q, want run %d and a seed in $HUNT_SEED", i+1, l, i+1)
			}
		}
		if want := "run 3 seed " + s.Seed; logs[2] != want {
			t.Errorf("test.log's last line %q, want %q (the summary's seed)", logs[2], want)
		}
	}
	if got := huntOptionsArtifact(t, out, "collected/tmp/hunt-options-abs.txt"); got != "abs run 3\n" {
		t.Errorf("collected/tmp/hunt-options-abs.txt %q, want the failing run's %q", got, "abs run 3\n")
	}
	if got := huntOptionsArtifact(t, out, "collect.log"); !strings.Contains(got, "collect /work/no-such-file failed") {
		t.Errorf("collect.log %q, want the missing path noted", got)
	}
	if got := huntOptionsArtifact(t, out, "test-output.txt"); got != "failing on purpose in run 3\n" {
		t.Errorf("test-output.txt %q, want the failing run's output", got)
	}
	failedRec := huntOptionsArtifact(t, out, "failed")
	if !strings.Contains(failedRec, "run=3\n") || !strings.Contains(failedRec, "seed="+s.Seed+"\n") || !strings.Contains(failedRec, "exit=7\n") {
		t.Errorf("failed record %q, want run=3, seed=%s, exit=7", failedRec, s.Seed)
	}
	// busybox's date has no %N: the time comes from the agent, to the nanosecond
	if !regexp.MustCompile(`(?m)^time=\d+\.\d{9}$`).MatchString(failedRec) {
		t.Errorf("failed record %q, want the time with nanoseconds", failedRec)
	}
}

// TestHuntOptionsSetupFails: a setup that fails stops the hunt before any
// run; hunt exits non-zero naming setup.out, makes no fork, snapshot or
// artifacts, and keeps the sandbox so the setup can be looked at.
func TestHuntOptionsSetupFails(t *testing.T) {
	d := shared
	dir := t.TempDir()
	name := "hunt-opt-" + randHex(4)
	huntCleanup(t, d, name)

	r := d.sbxDir(t, dir, "hunt", "--template", "tiny", "--runs", "3", "--name", name,
		"--setup", "echo setup broke here; exit 5", "--", "touch", "/work/test-ran")
	if r.code == 0 {
		t.Fatalf("sbx hunt with a failing setup exited 0\nstdout: %s\nstderr: %s", r.stdout, r.stderr)
	}
	for _, want := range []string{"the setup failed", flaky.HuntDir + "/setup.out", "kept", "exit 5"} {
		if !strings.Contains(r.stderr, want) {
			t.Errorf("stderr lacks %q:\n%s", want, r.stderr)
		}
	}
	if _, err := os.Stat(filepath.Join(dir, "sbx-hunt-"+name)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("artifacts folder after a failed setup: %v, want none", err)
	}

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	sb, err := d.client.Sandbox(name).Info(ctx)
	if err != nil {
		t.Fatalf("sandbox %s after a failed setup: %v, want it kept", name, err)
	}
	if sb.State != "ready" {
		t.Errorf("sandbox %s is %s, want ready", name, sb.State)
	}
	if _, err := d.client.Sandbox(name + "-fork").Info(ctx); !errors.Is(err, api.ErrNotFound) {
		t.Errorf("fork %s-fork: %v, want not found", name, err)
	}
	if _, err := d.client.GetSnapshot(ctx, name); !errors.Is(err, api.ErrNotFound) {
		t.Errorf("snapshot %s: %v, want not found", name, err)
	}
	if got := d.must(t, "exec", name, "--", "cat", flaky.HuntDir+"/setup.out"); got != "setup broke here\n" {
		t.Errorf("setup.out in the sandbox %q, want the setup's output", got)
	}
	for _, f := range []string{"/work/test-ran", flaky.HuntDir + "/current", flaky.HuntDir + "/failed"} {
		if r := d.sbx(t, "exec", name, "--", "test", "-e", f); r.code == 0 {
			t.Errorf("%s exists: the test ran after a failed setup", f)
		}
	}
}

// huntOptionsFromTest is put in /work of the snapshot: it lists /work and
// fails (exit 4) on its second run.
const huntOptionsFromTest = `#!/bin/sh
echo "from the snapshot, seed $SEED"
ls -a /work
n=$(( $(cat /work/.runs 2>/dev/null || echo 0) + 1 ))
echo "$n" >/work/.runs
[ "$n" -lt 2 ] || { echo "snapshot test fails in run $n"; exit 4; }
`

// TestHuntOptionsFrom hunts in a sandbox made from a disk snapshot: the test
// comes from the snapshot's /work, and the current directory is not copied.
func TestHuntOptionsFrom(t *testing.T) {
	d := shared
	src := d.newSandbox(t, "--template", "tiny")
	snap := "hunt-opt-src-" + randHex(4)
	name := "hunt-opt-" + randHex(4)
	huntCleanup(t, d, name, snap, src)

	script := filepath.Join(t.TempDir(), "from-test.sh")
	if err := os.WriteFile(script, []byte(huntOptionsFromTest), 0o644); err != nil {
		t.Fatal(err)
	}
	d.must(t, "exec", src, "--", "mkdir", "-p", "/work")
	d.must(t, "scp", script, src+":/work/from-test.sh")
	d.must(t, "exec", src, "--", "sh", "-c", "chmod +x /work/from-test.sh && echo kept >/work/snapshot-data")
	d.must(t, "snapshot", src, snap)

	// the current directory holds a file that must not reach the sandbox
	dir := t.TempDir()
	marker := "cwd-marker-" + randHex(4)
	if err := os.WriteFile(filepath.Join(dir, marker), []byte("must not be copied\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	r := d.sbxDir(t, dir, "--json", "hunt", "--from", snap, "--runs", "5", "--name", name, "--", "./from-test.sh")
	_, s := huntEvents(t, r)
	if s.Run != 2 || s.ExitCode != 4 {
		t.Errorf("summary run %d exit %d, want run 2 exit 4", s.Run, s.ExitCode)
	}
	art := filepath.Join(dir, "sbx-hunt-"+name)
	if s.Artifacts != art {
		t.Errorf("artifacts in %q, want %q", s.Artifacts, art)
	}
	output := huntOptionsArtifact(t, art, "test-output.txt")
	for _, want := range []string{"from the snapshot, seed " + s.Seed + "\n", "from-test.sh\n", "snapshot-data\n", "snapshot test fails in run 2\n"} {
		if !strings.Contains(output, want) {
			t.Errorf("test-output.txt lacks %q:\n%s", want, output)
		}
	}
	if strings.Contains(output, marker) {
		t.Errorf("test-output.txt lists %s: --from copied the current directory:\n%s", marker, output)
	}
	// the fork is a disk copy: /work there is as the failing run left it
	if r := d.sbx(t, "exec", name+"-fork", "--", "ls", "-a", "/work"); r.code != 0 {
		t.Errorf("ls /work in %s-fork: exit %d\n%s", name, r.code, r.stderr)
	} else if !strings.Contains(r.stdout, "from-test.sh") || strings.Contains(r.stdout, marker) {
		t.Errorf("/work of %s-fork is %q, want from-test.sh and not %s", name, r.stdout, marker)
	}

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := d.client.GetSnapshot(ctx, name); err != nil {
		t.Errorf("snapshot %s: %v", name, err)
	}
	if sb, err := d.client.Sandbox(name).Info(ctx); err != nil || sb.State != "stopped" {
		t.Errorf("sandbox %s: %+v, %v; want stopped", name, sb, err)
	}
}

// TestHuntOptionsTimeout: a run that hangs past --timeout is the failure;
// it is captured while it hangs, and the resumed machine still has the
// hung process.
func TestHuntOptionsTimeout(t *testing.T) {
	d := shared
	dir := t.TempDir()
	name := "hunt-opt-" + randHex(4)
	huntCleanup(t, d, name)
	// run 2 hangs in a process named for it
	test := `n=$(cat /tmp/n 2>/dev/null || echo 0); n=$((n+1)); echo $n >/tmp/n; [ $n -lt 2 ] || exec sleep 1234`
	r := d.sbxDir(t, dir, "--json", "hunt", "--template", "tiny", "--runs", "5", "--timeout", "1s", "--name", name, "--", test)
	_, s := huntEvents(t, r)
	if s.Run != 2 || s.ExitCode != 124 || !s.TimedOut {
		t.Fatalf("summary: run %d exit %d timedOut %v, want run 2, exit 124, timed out", s.Run, s.ExitCode, s.TimedOut)
	}
	if leaked := huntOptionsArtifact(t, s.Artifacts, "leaked.txt"); !strings.Contains(leaked, "sleep 1234") {
		t.Errorf("leaked.txt %q, want the hung run's sleep 1234", leaked)
	}
	d.must(t, "resume", name)
	if ps := d.must(t, "exec", name, "--", "ps"); !strings.Contains(ps, "sleep 1234") {
		t.Fatalf("after resume the hung process is gone:\n%s", ps)
	}
	// run in the background, the test still dies of SIGINT as it would in the
	// foreground (a shell's & ignores it; busybox's env cannot put it back:
	// the agent does)
	d.must(t, "exec", name, "--", "sh", "-c", `kill -INT $(ps | awk '/sleep 1234/ && !/awk/ { print $1 }')`)
	waitFor(t, "the hung sleep to die of SIGINT", 10*time.Second, func() bool {
		return !strings.Contains(d.must(t, "exec", name, "--", "ps"), "sleep 1234")
	})

	// a bad duration is refused before anything is made
	r = d.sbxDir(t, dir, "hunt", "--template", "tiny", "--timeout", "soon", "--name", name+"x", "--", "true")
	if r.code == 0 || !strings.Contains(r.stderr, "soon") {
		t.Errorf("--timeout soon: exit %d, stderr %q; want a usage error naming it", r.code, r.stderr)
	}
}
