package e2e

import (
	"archive/tar"
	"context"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"sbx.dev/sbx/client"
)

const crashC = `#include <stdio.h>
#include <stdlib.h>

int crash_here(int *p) {
	return *p; /* CRASH_LINE */
}

int main(int argc, char **argv) {
	printf("before the crash\n");
	fflush(stdout);
	if (argc > 1)
		return atoi(argv[1]);
	return crash_here(NULL);
}
`

// onCrashTemplate is the template of the --on-crash tests: tiny, which has
// no gdb, so nothing of it can come from a gdb in the sandbox.
const onCrashTemplate = "tiny"

// crashLine is the line of crashC's CRASH_LINE.
func crashLine(src string) int {
	for i, l := range strings.Split(src, "\n") {
		if strings.Contains(l, "CRASH_LINE") {
			return i + 1
		}
	}
	return 0
}

// dropCrashSnapshots removes the captures sandbox id's crashes left (they
// outlive it, as named snapshots do).
func dropCrashSnapshots(t *testing.T, d *daemon, id string) {
	t.Cleanup(func() {
		crs, _ := d.client.Sandbox(id).Crashes(context.Background())
		for _, cr := range crs {
			d.sbx(t, "snapshot", "rm", cr.Snapshot)
		}
	})
}

// TestExecOnCrash: exec --on-crash of a program that dereferences NULL, in
// a sandbox with no gdb, runs it as a plain exec; it exits 139, prints a
// backtrace naming the faulting function, and leaves the bundle sbx crashes
// --bundle writes (a core, the binary, the mappings). A normal exit passes
// through with no bundle. A second crash in the same boot is not caught:
// sbx names the first and its snapshot and exits with the command's code.
func TestExecOnCrash(t *testing.T) {
	if _, err := exec.LookPath("gcc"); err != nil {
		t.Skip("no gcc on the host")
	}
	d := shared
	id := d.newSandbox(t, "--template", onCrashTemplate)
	dropCrashSnapshots(t, d, id)
	buildC(t, d, id, crashC, "/tmp/crash")
	if r := d.sbx(t, "exec", id, "--", "sh", "-c", "command -v gdb"); r.code == 0 {
		t.Fatalf("the template %s has gdb (%s): the test needs one without", onCrashTemplate, r.stdout)
	}
	line := crashLine(crashC)

	t.Run("normal exit", func(t *testing.T) {
		wd, _ := os.Getwd()
		cwd := t.TempDir()
		if err := os.Chdir(cwd); err != nil {
			t.Fatal(err)
		}
		defer os.Chdir(wd)
		r := d.sbx(t, "exec", "--on-crash", id, "--", "/tmp/crash", "3")
		if r.code != 3 {
			t.Fatalf("exit %d, want 3\nstdout: %s\nstderr: %s", r.code, r.stdout, r.stderr)
		}
		if r.stdout != "before the crash\n" {
			t.Errorf("stdout %q, want the program's own output only", r.stdout)
		}
		if ents, _ := os.ReadDir(cwd); len(ents) != 0 {
			t.Errorf("a normal exit left %v in the working directory", ents)
		}
		if strings.Contains(r.stderr, "backtrace") {
			t.Errorf("a normal exit printed a backtrace:\n%s", r.stderr)
		}
	})

	var first client.Crash
	t.Run("crash", func(t *testing.T) {
		wd, _ := os.Getwd()
		cwd := t.TempDir()
		if err := os.Chdir(cwd); err != nil {
			t.Fatal(err)
		}
		defer os.Chdir(wd)
		r := d.sbx(t, "exec", "--on-crash", id, "--", "/tmp/crash")
		if r.code != 139 {
			t.Fatalf("exit %d, want 139\nstdout: %s\nstderr: %s", r.code, r.stdout, r.stderr)
		}
		if r.stdout != "before the crash\n" {
			t.Errorf("stdout %q, want the program's own output only", r.stdout)
		}
		for _, want := range []string{"crash_here", "SIGSEGV"} {
			if !strings.Contains(r.stderr, want) {
				t.Errorf("printed backtrace lacks %q:\n%s", want, r.stderr)
			}
		}
		ents, _ := os.ReadDir(cwd)
		if len(ents) != 1 || !strings.HasPrefix(ents[0].Name(), "sbx-crash-ex_") {
			t.Fatalf("working directory holds %v, want one sbx-crash-EXECID", ents)
		}
		dir := filepath.Join(cwd, ents[0].Name())
		bt, err := os.ReadFile(filepath.Join(dir, "backtrace.txt"))
		if err != nil || !strings.Contains(string(bt), "crash_here") || !strings.Contains(string(bt), "p.c:"+strconv.Itoa(line)) {
			t.Errorf("backtrace.txt (%v) lacks crash_here at p.c:%d:\n%s", err, line, bt)
		}
		names := tarNames(t, filepath.Join(dir, "crash.tar"))
		for _, want := range []string{"core", "files/tmp/crash", "maps"} {
			if names[want] == 0 {
				t.Errorf("crash.tar lacks a non-empty %s; has %v", want, names)
			}
		}
		crs, err := d.client.Sandbox(id).Crashes(context.Background())
		if err != nil || len(crs) != 1 {
			t.Fatalf("crashes %+v %v, want the one", crs, err)
		}
		first = crs[0]
		t.Logf("stderr of the crash:\n%s", r.stderr)
		if !strings.Contains(r.stderr, first.Snapshot) {
			t.Errorf("stderr does not name the capture %s:\n%s", first.Snapshot, r.stderr)
		}
	})

	t.Run("second crash of the boot", func(t *testing.T) {
		if first.Snapshot == "" {
			t.Skip("no first crash")
		}
		wd, _ := os.Getwd()
		cwd := t.TempDir()
		if err := os.Chdir(cwd); err != nil {
			t.Fatal(err)
		}
		defer os.Chdir(wd)
		r := d.sbx(t, "exec", "--on-crash", id, "--", "/tmp/crash")
		if r.code != 139 {
			t.Fatalf("exit %d, want the command's 139\nstderr: %s", r.code, r.stderr)
		}
		for _, want := range []string{"spent", first.Snapshot, strconv.Itoa(first.Pid), "one crash per boot"} {
			if !strings.Contains(r.stderr, want) {
				t.Errorf("stderr lacks %q:\n%s", want, r.stderr)
			}
		}
		if ents, _ := os.ReadDir(cwd); len(ents) != 0 {
			t.Errorf("an uncaught crash left %v", ents)
		}
		t.Logf("stderr of the second crash:\n%s", r.stderr)
	})
}

// TestExecOnCrashErrors: what --on-crash refuses, before anything runs.
func TestExecOnCrashErrors(t *testing.T) {
	d := shared
	off := d.newSandbox(t, "--template", "tiny", "--no-crash-capture")
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"crash capture off", []string{"exec", "--on-crash", off, "--", "sh", "-c", "echo ran"}, "crash capture off"},
		{"crash capture off, detached", []string{"exec", "-d", "--on-crash", off, "--", "sh", "-c", "echo ran"}, "crash capture off"},
		{"unknown sandbox", []string{"exec", "--on-crash", "sb_aaaaaaaaaa", "--", "true"}, "sb_aaaaaaaaaa"},
		{"--crash-dir with -d", []string{"exec", "-d", "--on-crash", "--crash-dir", "x", off, "--", "true"}, "sbx crashes"},
		{"--crash-dir without --on-crash", []string{"exec", "--crash-dir", "x", off, "--", "true"}, "--crash-dir goes with --on-crash"},
		{"a terminal", []string{"exec", "-t", "--on-crash", off, "--", "true"}, "-t"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := d.sbx(t, tc.args...)
			if r.code == 0 || !strings.Contains(r.stderr, tc.want) {
				t.Errorf("exit %d, stderr %q; want an error naming %q", r.code, r.stderr, tc.want)
			}
			if strings.Contains(r.stdout, "ran") {
				t.Errorf("the command ran: %q", r.stdout)
			}
		})
	}
}

// TestExecDetachedOnCrash: exec -d --on-crash starts a program whose
// grandchild segfaults; it prints what -d prints, and sbx crashes finds the
// crash, its ancestors leading to the exec.
func TestExecDetachedOnCrash(t *testing.T) {
	d := shared
	id := d.newSandbox(t, "--template", onCrashTemplate)
	dropCrashSnapshots(t, d, id)
	buildC(t, d, id, heldCrashC, "/tmp/crash")
	r := d.sbx(t, "exec", "-d", "--on-crash", id, "--", "/tmp/crash", "tok")
	f := strings.Fields(r.stdout)
	if r.code != 0 || len(f) != 2 || !strings.HasPrefix(f[0], "ex_") {
		t.Fatalf("exit %d, stdout %q; want EXEC_ID PID\n%s", r.code, r.stdout, r.stderr)
	}
	pid, _ := strconv.Atoi(f[1])
	if !strings.Contains(r.stderr, "sbx crashes "+id) {
		t.Errorf("stderr does not say how to read the crash: %s", r.stderr)
	}
	cr := crashesOf(t, d, id, 1)[0]
	if cr.Pid == pid || !cr.Of(pid) || cr.Signal != "SIGSEGV" {
		t.Errorf("crash %+v: want the grandchild's SIGSEGV, of exec pid %d", cr, pid)
	}
	var listed struct {
		Crashes []client.Crash `json:"crashes"`
	}
	// the backtrace, read with no gdb in the sandbox: a core sbx-agent
	// writes in a copy, read by this machine's gdb
	d.jsonOut(t, &listed, "crashes", id)
	if len(listed.Crashes) != 1 || listed.Crashes[0].Snapshot != cr.Snapshot {
		t.Fatalf("sbx crashes: %+v; want %s", listed.Crashes, cr.Snapshot)
	}
	if bt := listed.Crashes[0].Backtrace; !strings.Contains(bt, "fault (") || !strings.Contains(bt, "p.c:11") || !strings.Contains(bt, "tok") {
		t.Errorf("backtrace %q: want fault at p.c:11 with its token", bt)
	}
}

// tarNames lists a tar's regular files with their sizes.
func tarNames(t *testing.T, p string) map[string]int64 {
	t.Helper()
	f, err := os.Open(p)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	m := map[string]int64{}
	tr := tar.NewReader(f)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return m
		}
		if err != nil {
			t.Fatalf("read %s: %v", p, err)
		}
		if h.Typeflag == tar.TypeReg {
			m[h.Name] = h.Size
		}
	}
}

// crashSeedC crashes in crash_here on even seeds and passes on odd ones.
const crashSeedC = `#include <stdio.h>
#include <stdlib.h>

int crash_here(int *p) {
	return *p; /* CRASH_LINE */
}

int main(void) {
	const char *s = getenv("SEED");
	unsigned long seed = s ? strtoul(s, NULL, 10) : 0;
	printf("seed %lu\n", seed);
	fflush(stdout);
	if (seed % 2 == 0)
		return crash_here(NULL);
	return 0;
}
`

// TestHuntOnCrash: hunt --on-crash, in a template with no gdb, of a
// program that crashes on some seeds: the crashing run ends the hunt, the
// sandbox's capture of it is the evidence, and the artifacts hold its
// bundle: a backtrace naming the function and line, a core and the binary.
func TestHuntOnCrash(t *testing.T) {
	if _, err := exec.LookPath("gcc"); err != nil {
		t.Skip("no gcc on the host")
	}
	d := shared
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "crash.c"), []byte(crashSeedC), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("gcc", "-g", "-O0", "-static", "-o", filepath.Join(dir, "crashy"), filepath.Join(dir, "crash.c")).CombinedOutput(); err != nil {
		t.Fatalf("gcc: %v\n%s", err, out)
	}
	line := crashLine(crashSeedC)
	name := "hunt-crash-" + randHex(3)
	huntCleanup(t, d, name)
	// 40 runs: an even seed among them all but surely (1 - 2^-40)
	r := d.sbxDir(t, dir, "--json", "hunt", "--template", onCrashTemplate, "--on-crash", "--runs", "40", "--name", name, "--", "./crashy")
	events, s := huntEvents(t, r)
	if s != nil && s.Sandbox != "" {
		dropCrashSnapshots(t, d, s.Sandbox)
	}
	sawCrash := false
	for _, ev := range events {
		sawCrash = sawCrash || ev.Event == "crash" && ev.Message == "SIGSEGV"
	}
	if s.Crash == nil {
		t.Fatalf("want a summary of a crash, got %+v\n%s", s, r.stdout)
	}
	if !sawCrash {
		t.Errorf("no crash event naming SIGSEGV:\n%s", r.stdout)
	}
	if seed, _ := strconv.ParseUint(s.Seed, 10, 64); seed%2 != 0 || s.ExitCode != 139 {
		t.Errorf("run %d: seed %s exit %d, want an even seed and 139", s.Run, s.Seed, s.ExitCode)
	}
	if s.Crash.SignalName != "SIGSEGV" {
		t.Errorf("crash signal %q, want SIGSEGV", s.Crash.SignalName)
	}
	// the evidence is the sandbox's capture of the crash
	if crs, err := d.client.Sandbox(s.Sandbox).Crashes(context.Background()); err != nil || len(crs) != 1 || crs[0].Snapshot != s.Crash.Snapshot {
		t.Errorf("crashes %+v (%v); want the one the summary names, %q", crs, err, s.Crash.Snapshot)
	}
	art := filepath.Join(dir, "sbx-hunt-"+name)
	bt, err := os.ReadFile(filepath.Join(art, "crash", "backtrace.txt"))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"crash_here", "crash.c:" + strconv.Itoa(line)} {
		if !strings.Contains(string(bt), want) {
			t.Errorf("crash/backtrace.txt lacks %q:\n%s", want, bt)
		}
	}
	names := tarNames(t, filepath.Join(art, "crash", "crash.tar"))
	for _, want := range []string{"core", "files/work/crashy", "maps"} {
		if names[want] == 0 {
			t.Errorf("crash.tar lacks a non-empty %s; has %v", want, names)
		}
	}
	if out, err := os.ReadFile(filepath.Join(art, "test-output.txt")); err != nil || !strings.Contains(string(out), "seed "+s.Seed) {
		t.Errorf("test-output.txt %q (%v), want the crashing run's seed line", out, err)
	}
}

// TestExecOnCrashChild: a foreground exec whose grandchild segfaults (the
// command itself exits 0). Through the Go client, WithOnCrash returns the
// grandchild's capture; through the CLI, the bundle is written and the exit
// is 139.
func TestExecOnCrashChild(t *testing.T) {
	d := shared
	ctx := context.Background()

	id := d.newSandbox(t, "--template", onCrashTemplate)
	dropCrashSnapshots(t, d, id)
	buildC(t, d, id, heldCrashC, "/tmp/crash")
	res, err := d.client.Sandbox(id).Exec(ctx, []string{"/tmp/crash", "tok"}, client.WithOnCrash(), client.WithTimeout(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	if res.ExitCode != 0 || res.Crash == nil || res.Crash.Pid == res.Pid || !res.Crash.Of(res.Pid) || res.Crash.Signal != "SIGSEGV" {
		t.Fatalf("exit %d, crash %+v (missed %q): want the grandchild's SIGSEGV, of exec pid %d", res.ExitCode, res.Crash, res.CrashMissed, res.Pid)
	}

	id2 := d.newSandbox(t, "--template", onCrashTemplate)
	dropCrashSnapshots(t, d, id2)
	buildC(t, d, id2, heldCrashC, "/tmp/crash")
	dir := filepath.Join(t.TempDir(), "bundle")
	r := d.sbx(t, "exec", "--on-crash", "--crash-dir", dir, id2, "--", "/tmp/crash", "tok")
	if r.code != 139 || !strings.Contains(r.stdout, "signaled=1 sig=11") {
		t.Fatalf("exit %d, stdout %q; want 139 and the program's own output\n%s", r.code, r.stdout, r.stderr)
	}
	if bt, err := os.ReadFile(filepath.Join(dir, "backtrace.txt")); err != nil || !strings.Contains(string(bt), "fault (") {
		t.Errorf("backtrace.txt (%v): %s; want fault", err, bt)
	}
}

// TestExecOnCrashDynamicNoGdb: a dynamically linked program in base with
// its gdb removed: the bundle comes from sbx-agent gcore, with libc in it,
// and this machine's gdb names the faulting function and line.
func TestExecOnCrashDynamicNoGdb(t *testing.T) {
	if _, err := exec.LookPath("gcc"); err != nil {
		t.Skip("no gcc on the host")
	}
	d := shared
	id := d.newSandbox(t, "--template", "base")
	dropCrashSnapshots(t, d, id)
	d.must(t, "exec", "-u", "root", id, "--", "rm", "-f", "/usr/bin/gdb")
	tmp := t.TempDir()
	if err := os.WriteFile(filepath.Join(tmp, "crash.c"), []byte(crashC), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("gcc", "-g", "-O0", "-o", filepath.Join(tmp, "crash"), filepath.Join(tmp, "crash.c")).CombinedOutput(); err != nil {
		t.Fatalf("gcc: %v\n%s", err, out)
	}
	upload(t, d, id, filepath.Join(tmp, "crash"), "/tmp/crash")
	d.must(t, "exec", "-u", "root", id, "--", "chmod", "755", "/tmp/crash")
	dir := filepath.Join(t.TempDir(), "bundle")
	r := d.sbx(t, "exec", "--on-crash", "--crash-dir", dir, id, "--", "/tmp/crash")
	if r.code != 139 {
		t.Fatalf("exit %d, want 139\n%s", r.code, r.stderr)
	}
	bt, err := os.ReadFile(filepath.Join(dir, "backtrace.txt"))
	if err != nil || !strings.Contains(string(bt), "crash_here") || !strings.Contains(string(bt), "crash.c:"+strconv.Itoa(crashLine(crashC))) {
		t.Errorf("backtrace.txt (%v):\n%s\nwant crash_here at crash.c:%d", err, bt, crashLine(crashC))
	}
	names := tarNames(t, filepath.Join(dir, "crash.tar"))
	libc := false
	for n, size := range names {
		libc = libc || strings.HasSuffix(n, "/libc.so.6") && size > 0
	}
	if names["core"] == 0 || names["files/tmp/crash"] == 0 || !libc {
		t.Errorf("crash.tar %v: want a core, the program and libc", names)
	}
}
