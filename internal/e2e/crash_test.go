package e2e

import (
	"archive/tar"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
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

// TestExecOnCrash: exec --on-crash of a program that dereferences NULL exits
// 139, prints a backtrace naming the function and line, and leaves a bundle
// with a core, the binary, libc and the mappings; a normal exit passes
// through with no bundle.
func TestExecOnCrash(t *testing.T) {
	if _, err := exec.LookPath("gcc"); err != nil {
		t.Skip("no gcc on the host")
	}
	d := shared
	tmp := t.TempDir()
	src := filepath.Join(tmp, "crash.c")
	if err := os.WriteFile(src, []byte(crashC), 0o644); err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(tmp, "crash")
	if out, err := exec.Command("gcc", "-g", "-O0", "-o", bin, src).CombinedOutput(); err != nil {
		t.Fatalf("gcc: %v\n%s", err, out)
	}
	line := 0
	for i, l := range strings.Split(crashC, "\n") {
		if strings.Contains(l, "CRASH_LINE") {
			line = i + 1
		}
	}
	id := d.newSandbox(t, "--template", "base")
	d.must(t, "exec", id, "--", "mkdir", "-p", "/tmp/work")
	d.must(t, "scp", bin, id+":/tmp/work/crash")

	t.Run("crash", func(t *testing.T) {
		dir := filepath.Join(t.TempDir(), "bundle")
		r := d.sbx(t, "exec", "--on-crash", "--crash-dir", dir, id, "--", "/tmp/work/crash")
		if r.code != 139 {
			t.Fatalf("exit %d, want 139\nstdout: %s\nstderr: %s", r.code, r.stdout, r.stderr)
		}
		if r.stdout != "before the crash\n" {
			t.Errorf("stdout %q, want the program's own output only", r.stdout)
		}
		for _, want := range []string{"crash_here", "crash.c:" + strconv.Itoa(line), "SIGSEGV"} {
			if !strings.Contains(r.stderr, want) {
				t.Errorf("printed backtrace lacks %q:\n%s", want, r.stderr)
			}
		}
		bt, err := os.ReadFile(filepath.Join(dir, "backtrace.txt"))
		if err != nil || !strings.Contains(string(bt), "crash.c:"+strconv.Itoa(line)) {
			t.Errorf("backtrace.txt: %v\n%s", err, bt)
		}
		names := tarNames(t, filepath.Join(dir, "crash.tar"))
		has := func(pred func(string) bool) bool {
			for n, size := range names {
				if pred(n) && size > 0 {
					return true
				}
			}
			return false
		}
		for what, pred := range map[string]func(string) bool{
			"core":      func(n string) bool { return n == "core" },
			"binary":    func(n string) bool { return n == "files/tmp/work/crash" },
			"libc.so.6": func(n string) bool { return strings.HasPrefix(n, "files/") && strings.HasSuffix(n, "/libc.so.6") },
			"mappings":  func(n string) bool { return n == "mappings.txt" },
			"maps":      func(n string) bool { return n == "maps" },
			"buildids":  func(n string) bool { return n == "buildids.txt" },
		} {
			if !has(pred) {
				t.Errorf("crash.tar lacks a non-empty %s; has %v", what, names)
			}
		}
		if strings.Contains(r.stderr, "build-id differs") {
			t.Errorf("build-id mismatch reported:\n%s", r.stderr)
		}
	})

	// a script runs under gdb through its #! interpreter; what it execs is traced
	t.Run("script that execs", func(t *testing.T) {
		d.must(t, "exec", id, "--", "sh", "-c", `printf '#!/bin/sh\necho from the script\nexec /tmp/work/crash "$@"\n' >/tmp/work/run.sh && chmod +x /tmp/work/run.sh`)
		r := d.sbx(t, "exec", "--on-crash", "--crash-dir", filepath.Join(t.TempDir(), "bundle"), id, "--", "/tmp/work/run.sh")
		if r.code != 139 {
			t.Fatalf("exit %d, want 139\nstdout: %s\nstderr: %s", r.code, r.stdout, r.stderr)
		}
		if r.stdout != "from the script\nbefore the crash\n" {
			t.Errorf("stdout %q, want the script's and the program's output", r.stdout)
		}
		if !strings.Contains(r.stderr, "crash_here") {
			t.Errorf("printed backtrace lacks crash_here:\n%s", r.stderr)
		}
	})

	t.Run("normal exit", func(t *testing.T) {
		wd, _ := os.Getwd()
		cwd := t.TempDir()
		if err := os.Chdir(cwd); err != nil {
			t.Fatal(err)
		}
		defer os.Chdir(wd)
		r := d.sbx(t, "exec", "--on-crash", id, "--", "/tmp/work/crash", "3")
		if r.code != 3 {
			t.Fatalf("exit %d, want 3\nstdout: %s\nstderr: %s", r.code, r.stdout, r.stderr)
		}
		if r.stdout != "before the crash\n" {
			t.Errorf("stdout %q, want the program's own output only", r.stdout)
		}
		ents, _ := os.ReadDir(cwd)
		if len(ents) != 0 {
			t.Errorf("a normal exit left %v in the working directory", ents)
		}
		if strings.Contains(r.stderr, "backtrace") {
			t.Errorf("a normal exit printed a backtrace:\n%s", r.stderr)
		}
	})
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

// TestHuntOnCrash: hunt --on-crash of a program that crashes on some seeds
// finds a crashing run, and its artifacts hold the crash bundle: a
// backtrace naming the function and line, a core and the binary.
func TestHuntOnCrash(t *testing.T) {
	if _, err := exec.LookPath("gcc"); err != nil {
		t.Skip("no gcc on the host")
	}
	d := shared
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "crash.c"), []byte(crashSeedC), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("gcc", "-g", "-O0", "-o", filepath.Join(dir, "crashy"), filepath.Join(dir, "crash.c")).CombinedOutput(); err != nil {
		t.Fatalf("gcc: %v\n%s", err, out)
	}
	line := 0
	for i, l := range strings.Split(crashSeedC, "\n") {
		if strings.Contains(l, "CRASH_LINE") {
			line = i + 1
		}
	}
	name := "hunt-crash-" + randHex(3)
	huntCleanup(t, d, name)
	// 40 runs: an even seed among them all but surely (1 - 2^-40)
	r := d.sbxDir(t, dir, "--json", "hunt", "--template", "base", "--on-crash", "--runs", "40", "--name", name, "--", "./crashy")
	events, s := huntEvents(t, r)
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
