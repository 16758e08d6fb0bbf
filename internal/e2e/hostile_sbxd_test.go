package e2e

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"sbx.dev/sbx/api"
	"sbx.dev/sbx/client"
	"sbx.dev/sbx/internal/store"
)

// The hostile suite, continued: what a sandbox says is untrusted input to
// sbxd, bounded in size and in time; secrets stay out of the host's process
// list; and nobody but sbxd's own capture processes can hold its restart.

// TestHostileAnswers: a directory whose listing would be enormous (many long
// names) is listed a page at a time: the client gets every entry, and sbxd,
// which holds one page at once, stays where it was. An agent that answers
// past its bound gets a clear error (TestAttackLyingAgentAmplifies). Floods
// of exec output and of the console are capped on their way out
// (TestOutputCapped, TestHostileConsole).
func TestHostileAnswers(t *testing.T) {
	d := shared
	ctx := context.Background()
	sb, err := d.client.Create(ctx, client.WithTemplate("tiny"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { deleteSandbox(context.Background(), d.client, sb.ID) })
	// 80,000 names of 250 bytes: some 25 MiB of JSON in one answer
	if _, err := sdk(d.client).Exec(ctx, sb.ID, api.ExecRequest{Cmd: []string{"sh", "-c",
		`mkdir /many && cd /many && n=$(printf '%0240d' 0) && i=0 && while [ $i -lt 80000 ]; do : > "$n$i"; i=$((i+1)); done`},
		Timeout: api.Duration(5 * time.Minute)}, io.Discard, io.Discard); err != nil {
		t.Fatal(err)
	}
	before := rss(t, d)
	fis, err := d.client.Sandbox(sb.ID).Files().ReadDir(ctx, "/many")
	if err != nil || len(fis) != 80000 {
		t.Errorf("ls of a directory of 80,000 long names: %d entries, %v; want them all", len(fis), err)
	}
	for i := 1; i < len(fis); i++ {
		if fis[i-1].Name >= fis[i].Name {
			t.Fatalf("entries %d and %d out of order or repeated: %.20s..., %.20s...", i-1, i, fis[i-1].Name, fis[i].Name)
		}
	}
	if grew := rss(t, d) - before; grew > 48<<20 {
		t.Errorf("sbxd's RSS grew %d MiB listing a big directory", grew>>20)
	}
	// the sandbox and sbxd go on
	var out strings.Builder
	if _, err := sdk(d.client).Exec(ctx, sb.ID, api.ExecRequest{Cmd: []string{"echo", "ok"}}, &out, io.Discard); err != nil || out.String() != "ok\n" {
		t.Errorf("exec after the flood: %q %v", out.String(), err)
	}
}

// TestHostileConsole: root inside writing without end to the console
// (init's stdout, through /proc/1/fd/1) fills no more of the host's disk
// than the console's budget.
func TestHostileConsole(t *testing.T) {
	d, err := startDaemon([]string{"--output-head", "1M", "--output-tail", "64K"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.stop(true) })
	ctx := context.Background()
	sb, err := d.client.Create(ctx, client.WithTemplate("tiny"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := sdk(d.client).Exec(ctx, sb.ID, api.ExecRequest{Cmd: []string{"sh", "-c", "yes flood | head -c 50000000 > /proc/1/fd/1; echo done"}, Timeout: api.Duration(2 * time.Minute)}, io.Discard, io.Discard); err != nil {
		t.Fatal(err)
	}
	console := filepath.Join(d.dir, "sandboxes", sb.ID, "console.log")
	fi, err := os.Stat(console)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Size() > 1<<20+64<<10+4096 {
		t.Errorf("the console holds %d bytes after a 50 MB flood, past its budget of 1M+64K", fi.Size())
	}
}

// TestHostileSecretsNotInArgv: an exec's environment (a secret, often) is
// in no process's command line on the host while the exec runs, detached
// or not, nor in a terminal's.
func TestHostileSecretsNotInArgv(t *testing.T) {
	d := shared
	ctx := context.Background()
	sb, err := d.client.Create(ctx, client.WithTemplate("tiny"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { deleteSandbox(context.Background(), d.client, sb.ID) })
	secret := "s3cr3t-" + randHex(8)
	x, err := sdk(d.client).ExecDetached(ctx, sb.ID, api.ExecRequest{Cmd: []string{"sleep", "30"}, Env: []string{"TOKEN=" + secret}, Detach: true})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		sdk(d.client).Exec(ctx, sb.ID, api.ExecRequest{Cmd: []string{"sleep", "3"}, Env: []string{"TOKEN=" + secret}}, io.Discard, io.Discard)
	}()
	pollUntil(10*time.Second, func() bool { // both execs run
		xs, err := sdk(d.client).Execs(ctx, sb.ID)
		n := 0
		for _, e := range xs {
			if e.State == api.ExecRunning && e.Pid > 0 {
				n++
			}
		}
		return err == nil && n == 2
	})
	if pids := pidsWith(secret); len(pids) > 0 {
		for _, p := range pids {
			cmd, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", p))
			t.Errorf("the secret is in the command line of pid %d: %s", p, strings.ReplaceAll(string(cmd), "\x00", " "))
		}
	}
	// nor left on the host's disk once the exec started
	filepath.Walk(filepath.Join(d.dir, "sandboxes", sb.ID), func(p string, fi os.FileInfo, err error) error {
		if err == nil && fi.Mode().IsRegular() && fi.Size() < 1<<20 {
			if b, _ := os.ReadFile(p); strings.Contains(string(b), secret) {
				t.Errorf("the secret stays on the host's disk in %s", p)
			}
		}
		return nil
	})
	// but the command has it
	var out strings.Builder
	sdk(d.client).ExecOutput(ctx, sb.ID, x.ID, false, &out, io.Discard)
	var env strings.Builder
	if _, err := sdk(d.client).Exec(ctx, sb.ID, api.ExecRequest{Cmd: []string{"sh", "-c", "echo $TOKEN"}, Env: []string{"TOKEN=" + secret}}, &env, io.Discard); err != nil || env.String() != secret+"\n" {
		t.Errorf("the command does not see its environment: %q %v", env.String(), err)
	}
	<-done
}

// TestHostileNUL: a NUL byte in a command, an environment or a working
// directory is a 400 naming the field, and leaves no exec behind.
func TestHostileNUL(t *testing.T) {
	d := shared
	ctx := context.Background()
	sb, err := d.client.Create(ctx, client.WithTemplate("tiny"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { deleteSandbox(context.Background(), d.client, sb.ID) })
	for field, req := range map[string]api.ExecRequest{
		"cmd": {Cmd: []string{"echo", "a\x00b"}},
		"env": {Cmd: []string{"true"}, Env: []string{"K=a\x00b"}},
		"cwd": {Cmd: []string{"true"}, Cwd: "/tmp\x00/x"},
	} {
		_, err := sdk(d.client).ExecDetached(ctx, sb.ID, req)
		var ae *api.Error
		if !errors.As(err, &ae) || ae.Status != 400 || !strings.Contains(err.Error(), field) {
			t.Errorf("a NUL in %s: %v, want a 400 naming %s", field, err, field)
		}
	}
	if xs, _ := d.client.Sandbox(sb.ID).Execs(ctx); len(xs) != 0 {
		t.Errorf("refused execs left %d records", len(xs))
	}
}

// TestHostileReconcileNotBlocked: a process of anyone else whose command
// line names an image path cannot hold sbxd's restart: reconcile waits for
// the capture processes its journal recorded (pid and start time), no
// others.
func TestHostileReconcileNotBlocked(t *testing.T) {
	d, err := startDaemon(nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.stop(true) })
	ctx := context.Background()
	sb, err := d.client.Create(ctx, client.WithTemplate("tiny"))
	if err != nil {
		t.Fatal(err)
	}
	d.kill(syscall.SIGTERM)
	// a stop journaled and cut short, and a stranger's process naming its image
	img := "im_" + randHex(5)[:10]
	imgDir := filepath.Join(d.dir, "images", img)
	os.MkdirAll(filepath.Join(imgDir, "memory"), 0o700)
	st, err := store.Open(filepath.Join(d.dir, "state.db"))
	if err != nil {
		t.Fatal(err)
	}
	err = st.AddIntent(ctx, &store.Intent{ID: img, Kind: "stop", SandboxID: sb.ID, Step: "disk-written", Detail: map[string]any{"memory": true}, StartedAt: time.Now()})
	st.Close()
	if err != nil {
		t.Fatal(err)
	}
	stranger := exec.Command("sleep", "300", imgDir, "--image-path", imgDir)
	if err := stranger.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { stranger.Process.Kill(); stranger.Wait() })
	start := time.Now()
	if err := d.start(nil); err != nil {
		t.Fatal(err)
	}
	if took := time.Since(start); took > 30*time.Second {
		t.Errorf("a stranger's process naming the image held the restart for %s", took)
	}
	got, err := d.client.Sandbox(sb.ID).Info(ctx)
	if err != nil || got.State != api.StateReady {
		t.Errorf("after the restart: %+v %v, want the sandbox ready (the stop was undone)", got, err)
	}
	if _, err := os.Stat(imgDir); !os.IsNotExist(err) {
		t.Errorf("the partial image is left: %v", err)
	}
}
