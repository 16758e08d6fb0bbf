package e2e

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"sbx.dev/sbx/api"
	"sbx.dev/sbx/client"
)

// heldCrashC forks a child that forks a grandchild; the grandchild segfaults
// at CRASH-LINE (line 11) with a token in a local. The first child says how
// the grandchild ended.
const heldCrashC = `#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <sys/wait.h>

static int fault(const char *token) {
	volatile char secret[64];
	strncpy((char *)secret, token, sizeof secret - 1);
	int *p = NULL;
	return *p; /* CRASH-LINE */
}

int main(int argc, char **argv) {
	const char *token = argc > 1 ? argv[1] : "none";
	pid_t child = fork();
	if (child == 0) {
		pid_t grandchild = fork();
		if (grandchild == 0) {
			usleep(100000);
			return fault(token);
		}
		int st;
		waitpid(grandchild, &st, 0);
		printf("grandchild %d ended: signaled=%d sig=%d\n", grandchild, WIFSIGNALED(st), WTERMSIG(st));
		return 0;
	}
	int st;
	waitpid(child, &st, 0);
	return 0;
}
`

// buildC compiles src on the host (gcc, -g, static) and uploads it to
// path in sandbox id, executable by all.
func buildC(t *testing.T, d *daemon, id, src, path string) {
	t.Helper()
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "p.c"), []byte(src), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("gcc", "-g", "-O0", "-static", "-o", filepath.Join(dir, "p"), filepath.Join(dir, "p.c")).CombinedOutput(); err != nil {
		t.Fatalf("gcc: %v %s", err, out)
	}
	upload(t, d, id, filepath.Join(dir, "p"), path)
}

func upload(t *testing.T, d *daemon, id, local, path string) {
	t.Helper()
	if _, err := d.client.Sandbox(id).Files().Upload(context.Background(), local, path); err != nil {
		t.Fatalf("upload %s: %v", path, err)
	}
}

// crashesOf waits for n crashes caught in sandbox id and returns them.
func crashesOf(t *testing.T, d *daemon, id string, n int) []client.Crash {
	t.Helper()
	var got []client.Crash
	waitFor(t, strconv.Itoa(n)+" crashes caught in "+id, 60*time.Second, func() bool {
		var err error
		got, err = d.client.Sandbox(id).Crashes(context.Background())
		return err == nil && len(got) >= n
	})
	return got
}

// TestCrashFreezeGrandchild: a grandchild of a detached exec segfaults; the
// sandbox is frozen with it held at the fault; the original's process dies
// as it would have (its parent sees SIGSEGV); in a copy, gdb -p as the
// process's own user shows the faulting line and the token in its locals;
// `sbx crashes` lists it with its backtrace, and --bundle writes a core and
// the program matched by build-id. The copies it made are gone after.
func TestCrashFreezeGrandchild(t *testing.T) {
	d := shared
	id := d.newSandbox(t, "--template", "base")
	buildC(t, d, id, heldCrashC, "/tmp/crash")
	token := "tok" + randHex(6)
	x, err := sdk(d.client).ExecDetached(context.Background(), id, api.ExecRequest{Cmd: []string{"/tmp/crash", token}, Detach: true})
	if err != nil {
		t.Fatal(err)
	}
	crs := crashesOf(t, d, id, 1)
	cr := crs[0]
	t.Cleanup(func() { d.sbx(t, "snapshot", "rm", cr.Snapshot) })
	if cr.Signal != "SIGSEGV" || cr.FaultAddr != "0x0" || cr.Exe != "/tmp/crash" || cr.Pid <= 1 || cr.Count != 1 {
		t.Errorf("crash %+v: want SIGSEGV at 0x0 in /tmp/crash, the first", cr)
	}
	res, err := d.client.Sandbox(id).Process(x.ID).Wait(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	logs := d.sbx(t, "logs", id, "--exec", x.ID)
	if want := "grandchild " + strconv.Itoa(cr.Pid) + " ended: signaled=1 sig=11"; !strings.Contains(logs.stdout, want) || res.ExitCode != 0 {
		t.Errorf("the original: exit %d, output %q; want %q (it dies as it would have)", res.ExitCode, logs.stdout, want)
	}

	// in a copy, the grandchild is stopped at the fault, for gdb -p
	cp := d.newSandbox(t, "--from", cr.Snapshot)
	o, e, _ := execOut(t, d, cp, "", "60s", `id -un; ps -o stat= -p `+strconv.Itoa(cr.Pid)+`; gdb -q -batch -p `+strconv.Itoa(cr.Pid)+` -ex bt -ex "info locals" 2>&1`)
	for _, want := range []string{"user\n", "T", "p.c:11", `secret = "` + token + `"`} {
		if !strings.Contains(o, want) {
			t.Errorf("gdb -p %d as the default user in the copy %s: %q %q; want %q in it", cr.Pid, cp, o, e, want)
		}
	}

	var listed struct {
		Crashes []client.Crash `json:"crashes"`
	}
	d.jsonOut(t, &listed, "crashes", id)
	if len(listed.Crashes) != 1 || !strings.Contains(listed.Crashes[0].Backtrace, "fault (token=") || !strings.Contains(listed.Crashes[0].Backtrace, token) {
		t.Errorf("sbx crashes: %+v; want the crash with a backtrace naming fault and the token", listed.Crashes)
	}
	dir := t.TempDir()
	if r := d.sbx(t, "crashes", id, "--bundle", dir, "--no-backtrace"); r.code != 0 {
		t.Fatalf("sbx crashes --bundle: exit %d %s", r.code, r.stderr)
	}
	names := tarNames(t, filepath.Join(dir, "crash.tar"))
	for _, want := range []string{"core", "files/tmp/crash", "maps", "backtrace.txt", "buildids.txt"} {
		if _, ok := names[want]; !ok {
			t.Errorf("bundle lacks %s: %v", want, names)
		}
	}
	if bt, _ := os.ReadFile(filepath.Join(dir, "backtrace.txt")); !strings.Contains(string(bt), token) {
		t.Errorf("bundle's backtrace.txt: %q; want the token in fault's locals", bt)
	}
	// the copies sbx crashes read it in are gone
	var sbs struct {
		Sandboxes []api.Sandbox `json:"sandboxes"`
	}
	d.jsonOut(t, &sbs, "list")
	for _, sb := range sbs.Sandboxes {
		if sb.Meta["sbx.crash.of"] != "" {
			t.Errorf("a copy sbx crashes made is left: %s", sb.ID)
		}
	}
}

// TestCrashFreezePythonAndGo: a Python C-level crash (ctypes) and a Go
// program with GOTRACEBACK=crash (SIGABRT after its traceback) are each
// caught, each in a sandbox of its own.
func TestCrashFreezePythonAndGo(t *testing.T) {
	d := shared
	t.Run("python", func(t *testing.T) {
		id := d.newSandbox(t, "--template", "base")
		if _, err := sdk(d.client).ExecDetached(context.Background(), id, api.ExecRequest{Cmd: []string{"python3", "-c", "import ctypes; ctypes.string_at(0)"}, Detach: true}); err != nil {
			t.Fatal(err)
		}
		cr := crashesOf(t, d, id, 1)[0]
		t.Cleanup(func() { d.sbx(t, "snapshot", "rm", cr.Snapshot) })
		if cr.Signal != "SIGSEGV" || !strings.Contains(cr.Exe, "python3") {
			t.Errorf("python's crash: %+v; want SIGSEGV in python3", cr)
		}
	})
	t.Run("go", func(t *testing.T) {
		dir := t.TempDir()
		src := "package main\n\nfunc main() {\n\tvar m map[string]int\n\tm[\"x\"] = 1\n}\n"
		os.WriteFile(filepath.Join(dir, "main.go"), []byte(src), 0o644)
		os.WriteFile(filepath.Join(dir, "go.mod"), []byte("module crashy\n\ngo 1.22\n"), 0o644)
		build := exec.Command("go", "build", "-o", "crashy", ".")
		build.Dir, build.Env = dir, append(os.Environ(), "CGO_ENABLED=0")
		if out, err := build.CombinedOutput(); err != nil {
			t.Fatalf("go build: %v %s", err, out)
		}
		id := d.newSandbox(t, "--template", "base")
		upload(t, d, id, filepath.Join(dir, "crashy"), "/tmp/crashy")
		if _, err := sdk(d.client).ExecDetached(context.Background(), id, api.ExecRequest{Cmd: []string{"/tmp/crashy"}, Env: []string{"GOTRACEBACK=crash"}, Detach: true}); err != nil {
			t.Fatal(err)
		}
		cr := crashesOf(t, d, id, 1)[0]
		t.Cleanup(func() { d.sbx(t, "snapshot", "rm", cr.Snapshot) })
		if cr.Signal != "SIGABRT" || cr.Exe != "/tmp/crashy" {
			t.Errorf("the Go program's crash: %+v; want SIGABRT in /tmp/crashy", cr)
		}
	})
}

// TestCrashStorm: a process that segfaults hundreds of times in a row
// keeps one capture per boot, plus a count: every crash ends its process
// (the loop finishes), one freeze is recorded, and the count says how many.
func TestCrashStorm(t *testing.T) {
	d := shared
	id := d.newSandbox(t, "--template", "base")
	buildC(t, d, id, "int main(void) { return *(volatile int *)0; }\n", "/tmp/segv")
	const n = 300
	o, e, code := execOut(t, d, id, "", "5m", `n=0; i=0; while [ $i -lt `+strconv.Itoa(n)+` ]; do /tmp/segv; [ $? -eq 139 ] && n=$((n+1)); i=$((i+1)); done; echo $n`)
	if code != 0 || strings.TrimSpace(o) != strconv.Itoa(n) {
		t.Errorf("%d segfaults in a loop: exit %d, %q %q; want every one to end with 139", n, code, o, e)
	}
	crs := crashesOf(t, d, id, 1)
	for _, cr := range crs {
		t.Cleanup(func() { d.sbx(t, "snapshot", "rm", cr.Snapshot) })
	}
	if len(crs) != 1 {
		t.Errorf("a storm of %d crashes: %d caught; want one per boot", n, len(crs))
	}
	var listed struct {
		Crashes    []client.Crash `json:"crashes"`
		SinceStart *int           `json:"crashesSinceStart"`
	}
	d.jsonOut(t, &listed, "crashes", id, "--no-backtrace")
	if listed.SinceStart == nil || *listed.SinceStart != n {
		t.Errorf("crashesSinceStart %v; want %d", listed.SinceStart, n)
	}
	var snaps struct {
		Snapshots []api.Snapshot `json:"snapshots"`
	}
	d.jsonOut(t, &snaps, "snapshot", "ls")
	mine := 0
	for _, sn := range snaps.Snapshots {
		if sn.SandboxID == id {
			mine++
		}
	}
	if mine != 1 {
		t.Errorf("%d snapshots of %s after the storm; want the one capture", mine, id)
	}
}

// TestCrashCaptureOff: with --no-crash-capture a crash ends its process at
// once and nothing is captured.
func TestCrashCaptureOff(t *testing.T) {
	d := shared
	id := d.newSandbox(t, "--template", "base", "--no-crash-capture")
	buildC(t, d, id, "int main(void) { return *(volatile int *)0; }\n", "/tmp/segv")
	if _, _, code := execOut(t, d, id, "", "60s", `/tmp/segv`); code != 139 {
		t.Errorf("a segfault with crash capture off: exit %d, want 139", code)
	}
	// nothing was held: gVisor holds crashes only where init asked
	if o, _, code := execOut(t, d, id, "root", "30s", `test -e /run/sbx/crashes || echo none`); code != 0 || o != "none\n" {
		t.Errorf("with crash capture off, /run/sbx/crashes: %q (exit %d); want none", o, code)
	}
	if crs, err := d.client.Sandbox(id).Crashes(context.Background()); err != nil || len(crs) != 0 {
		t.Errorf("crashes with capture off: %+v, %v; want none", crs, err)
	}
	var info struct {
		Sandbox api.Sandbox `json:"sandbox"`
	}
	b, _ := json.Marshal(d.info(t, id))
	_ = json.Unmarshal(b, &info.Sandbox)
	if info.Sandbox.Meta[api.MetaCrashes] != "off" {
		t.Errorf("meta %v: want %s=off", info.Sandbox.Meta, api.MetaCrashes)
	}

	// a memory fork made with it off, of a sandbox with it on (as
	// flake-rate's runs are): its crashes end at once, uncaught
	on := d.newSandbox(t, "--template", "base")
	buildC(t, d, on, "int main(void) { return *(volatile int *)0; }\n", "/tmp/segv")
	kids, err := sdk(d.client).Fork(context.Background(), on, api.ForkRequest{Memory: true, Count: 1, Meta: map[string]string{api.MetaCrashes: "off"}})
	if err != nil || len(kids) != 1 {
		t.Fatalf("fork: %v %v", kids, err)
	}
	kid := kids[0].ID
	t.Cleanup(func() { _ = deleteSandbox(context.Background(), d.client, kid) })
	if _, _, code := execOut(t, d, kid, "", "60s", `/tmp/segv`); code != 139 {
		t.Errorf("a segfault in a fork with crash capture off: exit %d, want 139", code)
	}
	if crs, err := d.client.Sandbox(kid).Crashes(context.Background()); err != nil || len(crs) != 0 {
		t.Errorf("crashes of the fork with capture off: %+v, %v; want none", crs, err)
	}
	// and its parent still catches its own
	if _, _, code := execOut(t, d, on, "", "60s", `/tmp/segv`); code != 139 {
		t.Errorf("a segfault in the parent: exit %d, want 139 (caught, then let die)", code)
	}
	cr := crashesOf(t, d, on, 1)[0]
	t.Cleanup(func() { d.sbx(t, "snapshot", "rm", cr.Snapshot) })
}
