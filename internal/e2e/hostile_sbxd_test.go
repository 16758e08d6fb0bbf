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

// TestHostileAnswers: a sandbox that makes an answer sbxd reads whole
// enormous (a directory of many long names) gets a clear error on that call,
// and sbxd's memory stays where it was. Floods of exec output and of the
// console are capped on their way out (TestOutputCapped, TestHostileConsole).
func TestHostileAnswers(t *testing.T) {
	d := shared
	ctx := context.Background()
	sb, err := d.client.Create(ctx, client.WithTemplate("tiny"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.client.Delete(context.Background(), sb.ID) })
	// 80,000 names of 250 bytes: an ls answer of some 25 MiB of JSON
	if _, err := d.client.Exec(ctx, sb.ID, api.ExecRequest{Cmd: []string{"sh", "-c",
		`mkdir /many && cd /many && n=$(printf '%0240d' 0) && i=0 && while [ $i -lt 80000 ]; do : > "$n$i"; i=$((i+1)); done`},
		Timeout: "300s"}, io.Discard, io.Discard); err != nil {
		t.Fatal(err)
	}
	before := rss(t, d)
	_, err = d.client.ReadDir(ctx, sb.ID, "/many")
	if !errors.Is(err, api.ErrUnavailable) || !strings.Contains(err.Error(), "answered more than") {
		t.Errorf("ls of an enormous directory: %v, want ErrUnavailable saying the answer is too large", err)
	}
	if grew := rss(t, d) - before; grew > 48<<20 {
		t.Errorf("sbxd's RSS grew %d MiB on an answer it refuses", grew>>20)
	}
	// the sandbox and sbxd go on
	var out strings.Builder
	if _, err := d.client.Exec(ctx, sb.ID, api.ExecRequest{Cmd: []string{"echo", "ok"}}, &out, io.Discard); err != nil || out.String() != "ok\n" {
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
	if _, err := d.client.Exec(ctx, sb.ID, api.ExecRequest{Cmd: []string{"sh", "-c", "yes flood | head -c 50000000 > /proc/1/fd/1; echo done"}, Timeout: "120s"}, io.Discard, io.Discard); err != nil {
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
	t.Cleanup(func() { d.client.Delete(context.Background(), sb.ID) })
	secret := "s3cr3t-" + randHex(8)
	x, err := d.client.ExecDetached(ctx, sb.ID, api.ExecRequest{Cmd: []string{"sleep", "30"}, Env: []string{"TOKEN=" + secret}, Detach: true})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		d.client.Exec(ctx, sb.ID, api.ExecRequest{Cmd: []string{"sleep", "3"}, Env: []string{"TOKEN=" + secret}}, io.Discard, io.Discard)
	}()
	time.Sleep(time.Second)
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
	d.client.ExecOutput(ctx, sb.ID, x.ID, false, &out, io.Discard)
	var env strings.Builder
	if _, err := d.client.Exec(ctx, sb.ID, api.ExecRequest{Cmd: []string{"sh", "-c", "echo $TOKEN"}, Env: []string{"TOKEN=" + secret}}, &env, io.Discard); err != nil || env.String() != secret+"\n" {
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
	t.Cleanup(func() { d.client.Delete(context.Background(), sb.ID) })
	for field, req := range map[string]api.ExecRequest{
		"cmd": {Cmd: []string{"echo", "a\x00b"}},
		"env": {Cmd: []string{"true"}, Env: []string{"K=a\x00b"}},
		"cwd": {Cmd: []string{"true"}, Cwd: "/tmp\x00/x"},
	} {
		_, err := d.client.ExecDetached(ctx, sb.ID, req)
		var ae *api.Error
		if !errors.As(err, &ae) || ae.Status != 400 || !strings.Contains(err.Error(), field) {
			t.Errorf("a NUL in %s: %v, want a 400 naming %s", field, err, field)
		}
	}
	if xs, _ := d.client.Execs(ctx, sb.ID); len(xs) != 0 {
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
	got, err := d.client.Get(ctx, sb.ID)
	if err != nil || got.State != api.StateReady {
		t.Errorf("after the restart: %+v %v, want the sandbox ready (the stop was undone)", got, err)
	}
	if _, err := os.Stat(imgDir); !os.IsNotExist(err) {
		t.Errorf("the partial image is left: %v", err)
	}
}
