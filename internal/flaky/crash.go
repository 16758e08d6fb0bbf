package flaky

// Crash capture (`sbx exec --on-crash`).
//
// gVisor's kernel writes no core files and has no core_pattern, but ptrace
// works, so the command runs under gdb inside the sandbox from its start. A
// small wrapper (an sh script and a gdb Python script, written to
// /tmp/sbx-crash/TOKEN/ in the sandbox) runs it; when it stops on a fatal
// signal that it has no handler for, gdb writes what it can see into
// /tmp/sbx-crash/TOKEN/bundle/ and the client fetches that as a tar.
//
// What is captured: a backtrace of every thread (`thread apply all bt full`),
// a core written by gdb (`generate-core-file`, not by a kernel), the
// executable and every shared library gdb had loaded, copied from the
// sandbox's disk under files/<absolute path> and checked against the build-id
// gdb read when the process mapped them, `info sharedlibrary`, `info proc
// mappings` and the raw /proc/PID/maps, and the signal.
//
// A script (a #! line) runs under gdb through its interpreter, as the kernel
// runs it; a process it execs (`exec ./server`) stays traced.
//
// What is not: crashes of child processes (only the top process is traced; a
// shell script whose child segfaults exits 139 without a bundle), signals the
// program handles and survives, kernel-level state (there is no kernel core),
// the program's own stdin (it gets the exec's stdin, which is empty), and
// files it had open. Running under ptrace changes timing, and a program that
// itself uses ptrace cannot run under it.

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/rand"
	"debug/elf"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"sbx.dev/sbx/api"
)

// CrashClient is the slice of *client.Client crash capture uses.
type CrashClient interface {
	ExecEvents(ctx context.Context, id string, req api.ExecRequest, fn func(api.ExecEvent) error) (*api.Exec, error)
	WriteTar(ctx context.Context, id, dir string, r io.Reader) error
	ReadFile(ctx context.Context, id, path string) (io.ReadCloser, error)
	ReadTar(ctx context.Context, id, path string) (io.ReadCloser, error)
}

// CrashRoot is the directory inside the sandbox under which each capture
// gets its own TOKEN directory; a crash's bundle stays there after the fetch.
const CrashRoot = "/tmp/sbx-crash"

// fatalSignals are the signals --on-crash captures: the ones whose default
// action dumps core because the program faulted or aborted.
var fatalSignals = map[syscall.Signal]bool{
	syscall.SIGSEGV: true, syscall.SIGABRT: true, syscall.SIGBUS: true,
	syscall.SIGFPE: true, syscall.SIGILL: true,
}

// IsFatalSignal reports whether sig is one --on-crash captures
// (SIGSEGV, SIGABRT, SIGBUS, SIGFPE, SIGILL).
func IsFatalSignal(sig syscall.Signal) bool { return fatalSignals[sig] }

// Crash describes a captured crash.
type Crash struct {
	ExecID string `json:"execId"`
	Signal int    `json:"signal"`
	// SignalName is gdb's name for it, "SIGSEGV".
	SignalName string `json:"signalName"`
	// Dir is the local folder holding crash.tar and backtrace.txt.
	Dir string `json:"dir"`
	Tar string `json:"tar"`
	// Remote is the bundle's directory inside the sandbox.
	Remote    string `json:"remote"`
	Backtrace string `json:"-"`
	// Files are the binary and libraries in the bundle, by absolute path in
	// the sandbox, with their build-ids.
	Files []CrashFile `json:"files"`
}

// CrashFile is one executable or library copied into a bundle.
type CrashFile struct {
	Path    string `json:"path"`
	BuildID string `json:"buildId,omitempty"`
	// Match is "ok" when the copy's build-id equals the one gdb saw mapped,
	// "mismatch" when the file changed on disk since, "unknown" when either
	// side has no build-id.
	Match string `json:"match"`
}

// CrashDir returns the local folder of exec execID's bundle: dir when set,
// else ./sbx-crash-EXECID.
func CrashDir(dir, execID string) string {
	if dir != "" {
		return dir
	}
	return "sbx-crash-" + execID
}

// crashStatus is what the wrapper writes to TOKEN/status.
type crashStatus struct {
	kind string // "exited", "signaled" (a non-captured death), "crashed", "error"
	code int    // exit code, or signal number
	name string // signal name, or the error message
}

// parseCrashStatus parses the wrapper's status line: "exited N",
// "signaled N NAME", "crashed N NAME" or "error MESSAGE".
func parseCrashStatus(s string) (crashStatus, error) {
	s = strings.TrimSpace(s)
	kind, rest, _ := strings.Cut(s, " ")
	if kind == "error" {
		return crashStatus{kind: kind, name: rest}, nil
	}
	num, name, _ := strings.Cut(rest, " ")
	n, err := strconv.Atoi(num)
	if err != nil {
		return crashStatus{}, fmt.Errorf("bad crash status %q", s)
	}
	switch kind {
	case "exited":
		if n < 0 || n > 255 {
			return crashStatus{}, fmt.Errorf("bad crash status %q: exit code out of range", s)
		}
	case "signaled", "crashed":
		if n <= 0 || n >= 128 {
			return crashStatus{}, fmt.Errorf("bad crash status %q: signal out of range", s)
		}
		if kind == "crashed" && !IsFatalSignal(syscall.Signal(n)) {
			return crashStatus{}, fmt.Errorf("bad crash status %q: %d is not a crash signal", s, n)
		}
	default:
		return crashStatus{}, fmt.Errorf("bad crash status %q", s)
	}
	return crashStatus{kind: kind, code: n, name: name}, nil
}

// exitCode is the code a shell would report: N, or 128+signal.
func (s crashStatus) exitCode() int {
	if s.kind == "exited" {
		return s.code
	}
	return 128 + s.code
}

// ExecOnCrash runs req in sandbox id under gdb and, when the command dies of
// a fatal signal (see IsFatalSignal), fetches the crash bundle into
// CrashDir(dir, execID) as crash.tar and backtrace.txt. Output events go to
// fn as with client.ExecEvents; the program's stdout and stderr are its own,
// gdb's output goes to a file in the bundle. The returned Exec carries the
// exit code a shell would report: the command's own, or 128+signal. The
// Crash is nil when it did not crash. The sandbox needs gdb and python3 (the
// base template); without them the error says so. Errors from the client
// keep their api kinds.
func ExecOnCrash(ctx context.Context, c CrashClient, id string, req api.ExecRequest, dir string, fn func(api.ExecEvent) error) (*api.Exec, *Crash, error) {
	if len(req.Cmd) == 0 {
		return nil, nil, api.Errorf(api.ErrInvalid, "exec in %s: empty command", id)
	}
	tok := make([]byte, 6)
	rand.Read(tok)
	remote := path.Join(CrashRoot, hex.EncodeToString(tok))
	if err := c.WriteTar(ctx, id, CrashRoot, wrapperTar(path.Base(remote))); err != nil {
		return nil, nil, fmt.Errorf("exec in %s: install the crash wrapper: %w", id, err)
	}
	req.Cmd = append([]string{"/bin/sh", remote + "/run.sh"}, req.Cmd...)
	x, err := c.ExecEvents(ctx, id, req, fn)
	if err != nil {
		return nil, nil, err
	}
	raw, err := readSmall(ctx, c, id, remote+"/status")
	if err != nil {
		return x, nil, fmt.Errorf("exec %s in %s: the crash wrapper left no status (see %s/gdb.log in the sandbox): %w", x.ID, id, remote, err)
	}
	st, err := parseCrashStatus(raw)
	if err != nil {
		return x, nil, fmt.Errorf("exec %s in %s: %w", x.ID, id, err)
	}
	if st.kind == "error" {
		return x, nil, fmt.Errorf("exec %s in %s: --on-crash: %s", x.ID, id, st.name)
	}
	code := st.exitCode()
	x.ExitCode = &code
	if st.kind != "crashed" {
		// nothing to keep: the wrapper's directory goes (best effort)
		c.ExecEvents(context.WithoutCancel(ctx), id, api.ExecRequest{Cmd: []string{"rm", "-rf", remote}}, func(api.ExecEvent) error { return nil })
		return x, nil, nil
	}
	cr := &Crash{ExecID: x.ID, Signal: st.code, SignalName: st.name, Dir: CrashDir(dir, x.ID), Remote: remote + "/bundle"}
	if err := fetchBundle(ctx, c, id, cr); err != nil {
		return x, cr, fmt.Errorf("exec %s in %s: fetch the crash bundle: %w", x.ID, id, err)
	}
	return x, cr, nil
}

func readSmall(ctx context.Context, c CrashClient, id, p string) (string, error) {
	rc, err := c.ReadFile(ctx, id, p)
	if err != nil {
		return "", err
	}
	defer rc.Close()
	b, err := io.ReadAll(io.LimitReader(rc, 4096))
	return string(b), err
}

// tarReader is the one call fetchBundle needs.
type tarReader interface {
	ReadTar(ctx context.Context, id, path string) (io.ReadCloser, error)
}

// fetchBundle writes the sandbox's bundle directory to cr.Dir/crash.tar with
// its entries relative to the bundle, and backtrace.txt beside it; it fills
// cr.Files, checking each copied ELF's build-id against gdb's.
func fetchBundle(ctx context.Context, c tarReader, id string, cr *Crash) error {
	if err := os.MkdirAll(cr.Dir, 0o755); err != nil {
		return err
	}
	rc, err := c.ReadTar(ctx, id, cr.Remote)
	if err != nil {
		return err
	}
	defer rc.Close()
	cr.Tar = filepath.Join(cr.Dir, "crash.tar")
	f, err := os.Create(cr.Tar)
	if err != nil {
		return err
	}
	defer f.Close()
	tw := tar.NewWriter(f)
	tr := tar.NewReader(rc)
	actual := map[string]string{} // path in the sandbox -> build-id of the copy
	var wantIDs string
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return err
		}
		name := stripFirst(h.Name)
		if name == "" {
			continue
		}
		h.Name = name
		if err := tw.WriteHeader(h); err != nil {
			return err
		}
		var buf bytes.Buffer
		keep := h.Typeflag == tar.TypeReg && (strings.HasPrefix(name, "files/") || name == "backtrace.txt" || name == "buildids.txt") && h.Size <= 1<<30
		var w io.Writer = tw
		if keep {
			w = io.MultiWriter(tw, &buf)
		}
		if _, err := io.Copy(w, tr); err != nil {
			return err
		}
		switch {
		case name == "backtrace.txt":
			cr.Backtrace = buf.String()
		case name == "buildids.txt":
			wantIDs = buf.String()
		case keep:
			actual["/"+strings.TrimPrefix(name, "files/")] = ELFBuildID(buf.Bytes())
		}
	}
	if err := tw.Close(); err != nil {
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	cr.Files = matchBuildIDs(parseBuildIDs(wantIDs), actual)
	return os.WriteFile(filepath.Join(cr.Dir, "backtrace.txt"), []byte(cr.Backtrace), 0o644)
}

// stripFirst drops the first element of a tar entry name ("bundle/core" ->
// "core"); the directory itself becomes "".
func stripFirst(name string) string {
	name = strings.TrimPrefix(path.Clean("/"+name), "/")
	_, rest, _ := strings.Cut(name, "/")
	return rest
}

// parseBuildIDs parses buildids.txt: "BUILDID PATH" a line, "-" for none.
func parseBuildIDs(s string) map[string]string {
	m := map[string]string{}
	for _, line := range strings.Split(s, "\n") {
		id, p, ok := strings.Cut(strings.TrimSpace(line), " ")
		if !ok || p == "" {
			continue
		}
		if id == "-" {
			id = ""
		}
		m[p] = id
	}
	return m
}

// matchBuildIDs pairs the copied files with the build-ids gdb saw mapped.
func matchBuildIDs(want, got map[string]string) []CrashFile {
	var out []CrashFile
	for p, id := range got {
		f := CrashFile{Path: p, BuildID: id, Match: "unknown"}
		if w, ok := want[p]; ok && w != "" && id != "" {
			f.Match = "ok"
			if w != id {
				f.Match = "mismatch"
			}
		}
		out = append(out, f)
	}
	sortFiles(out)
	return out
}

func sortFiles(fs []CrashFile) {
	for i := 1; i < len(fs); i++ {
		for j := i; j > 0 && fs[j].Path < fs[j-1].Path; j-- {
			fs[j], fs[j-1] = fs[j-1], fs[j]
		}
	}
}

// ELFBuildID returns the hex GNU build-id of the ELF image b, or "" if it
// is not ELF or has none.
func ELFBuildID(b []byte) string {
	ef, err := elf.NewFile(bytes.NewReader(b))
	if err != nil {
		return ""
	}
	defer ef.Close()
	var notes [][]byte
	for _, s := range ef.Sections {
		if s.Type == elf.SHT_NOTE {
			if d, err := s.Data(); err == nil {
				notes = append(notes, d)
			}
		}
	}
	if len(notes) == 0 { // stripped of section headers: use the program headers
		for _, p := range ef.Progs {
			if p.Type == elf.PT_NOTE {
				if d, err := io.ReadAll(p.Open()); err == nil {
					notes = append(notes, d)
				}
			}
		}
	}
	for _, d := range notes {
		if id := noteBuildID(d, ef.ByteOrder); id != "" {
			return id
		}
	}
	return ""
}

// noteBuildID finds the NT_GNU_BUILD_ID note of owner "GNU" in a note section.
func noteBuildID(d []byte, bo binary.ByteOrder) string {
	const ntGNUBuildID = 3
	for len(d) >= 12 {
		nsz, dsz, typ := bo.Uint32(d), bo.Uint32(d[4:]), bo.Uint32(d[8:])
		d = d[12:]
		na, da := (uint64(nsz)+3)&^3, (uint64(dsz)+3)&^3
		if uint64(len(d)) < na+uint64(dsz) {
			return ""
		}
		name := string(bytes.TrimRight(d[:nsz], "\x00"))
		desc := d[na : na+uint64(dsz)]
		if typ == ntGNUBuildID && name == "GNU" {
			return hex.EncodeToString(desc)
		}
		if uint64(len(d)) < na+da {
			return ""
		}
		d = d[na+da:]
	}
	return ""
}

// wrapperTar is a tar of TOKEN/run.sh and TOKEN/crash.py.
func wrapperTar(tok string) io.Reader {
	var b bytes.Buffer
	tw := tar.NewWriter(&b)
	now := time.Now()
	add := func(name string, mode int64, body string) {
		tw.WriteHeader(&tar.Header{Name: name, Mode: mode, Size: int64(len(body)), ModTime: now, Typeflag: tar.TypeReg})
		tw.Write([]byte(body))
	}
	tw.WriteHeader(&tar.Header{Name: tok + "/", Mode: 0o700, ModTime: now, Typeflag: tar.TypeDir})
	add(tok+"/run.sh", 0o755, wrapperSh)
	add(tok+"/crash.py", 0o644, wrapperPy)
	tw.Close()
	return &b
}

// wrapperSh runs "$@" under gdb; its exit code is the command's, or
// 128+signal, as a shell reports. The program's stdio is the exec's: gdb's
// own goes to gdb.log, and fds 3 and 4 carry stdout and stderr past it.
const wrapperSh = `#!/bin/sh
D=$(dirname "$0")
fail() { echo "error $*" >"$D/status"; echo "sbx: --on-crash: $*" >&2; exit 125; }
command -v gdb >/dev/null 2>&1 || fail "no gdb in the sandbox; use a template with gdb and python3 (base)"
command -v python3 >/dev/null 2>&1 || fail "no python3 in the sandbox; use a template with gdb and python3 (base)"
prog=$(command -v "$1") || { echo "exited 127" >"$D/status"; echo "sbx: $1: command not found" >&2; exit 127; }
shift
case $prog in /*) ;; *) prog=$(pwd)/$prog ;; esac
# a script runs under gdb as the kernel would run it, through the interpreter
# its #! line names with the rest of the line as one argument; what it execs
# (exec ./binary) is traced from then on
if [ "$(head -c 2 "$prog" 2>/dev/null)" = '#!' ]; then
	IFS= read -r line <"$prog"
	line=${line#??}
	line=${line#"${line%%[! 	]*}"}
	interp=${line%%[ 	]*}
	arg=${line#"$interp"}
	arg=${arg#"${arg%%[! 	]*}"}
	arg=${arg%"${arg##*[! 	]}"}
	[ -n "$interp" ] || interp=/bin/sh
	if [ -n "$arg" ]; then set -- "$arg" "$prog" "$@"; else set -- "$prog" "$@"; fi
	prog=$interp
fi
: >"$D/args"; [ $# -eq 0 ] || printf '%s\0' "$@" >"$D/args"
unset DEBUGINFOD_URLS
SHELL=/bin/sh gdb -q -batch -nx -ex 'set pagination off' -ex 'set confirm off' -x "$D/crash.py" --args "$prog" 3>&1 4>&2 >"$D/gdb.log" 2>&1
read -r kind n rest <"$D/status" 2>/dev/null || fail "gdb ended without a verdict; see $D/gdb.log"
case $kind in
exited) exit "$n" ;;
signaled) exit $((128 + n)) ;;
crashed) exit $((128 + n)) ;;
*) exit 125 ;;
esac
`

// wrapperPy is the gdb script. It stops only on the fatal signals, passes
// them on when the program has a handler (SigCgt), and on one it would die
// of writes the bundle.
const wrapperPy = `
import gdb, os, shlex, shutil, signal

D = os.path.dirname(os.path.abspath(__file__))
B = os.path.join(D, "bundle")
FATAL = ("SIGSEGV", "SIGABRT", "SIGBUS", "SIGFPE", "SIGILL")

def status(s):
    with open(os.path.join(D, "status.tmp"), "w") as f:
        f.write(s + "\n")
    os.rename(os.path.join(D, "status.tmp"), os.path.join(D, "status"))

last = [None]
def on_stop(ev):
    last[0] = getattr(ev, "stop_signal", None)
gdb.events.stop.connect(on_stop)

def caught(pid, signo):
    try:
        for line in open("/proc/%d/status" % pid):
            if line.startswith("SigCgt:"):
                return bool(int(line.split()[1], 16) >> (signo - 1) & 1)
    except Exception:
        pass
    return False

def sh(cmd):
    try:
        return gdb.execute(cmd, to_string=True)
    except gdb.error as e:
        return "%s: %s\n" % (cmd, e)

def write(name, s):
    with open(os.path.join(B, name), "w") as f:
        f.write(s)

def bundle(pid, name, signo):
    os.makedirs(B, exist_ok=True)
    write("signal.txt", "%d %s\n" % (signo, name))
    write("backtrace.txt", sh("thread apply all bt full"))
    write("sharedlibs.txt", sh("info sharedlibrary"))
    write("mappings.txt", sh("info proc mappings"))
    try:
        shutil.copyfile("/proc/%d/maps" % pid, os.path.join(B, "maps"))
    except Exception as e:
        write("maps", "unreadable: %s\n" % e)
    write("core.log", sh("generate-core-file " + os.path.join(B, "core")))
    ids = []
    seen = set()
    for o in gdb.objfiles():
        p = o.filename
        if not p or o.owner is not None or p in seen or not p.startswith("/"):
            continue
        seen.add(p)
        ids.append("%s %s" % (o.build_id or "-", p))
        if os.path.isfile(p):
            dst = os.path.join(B, "files", p.lstrip("/"))
            os.makedirs(os.path.dirname(dst), exist_ok=True)
            try:
                shutil.copyfile(p, dst)
            except Exception:
                pass
    write("buildids.txt", "\n".join(ids) + "\n")

for c in ("set disable-randomization off", "set debuginfod enabled off",
          "set logging enabled off"):
    try:
        gdb.execute(c)
    except gdb.error:
        pass
gdb.execute("handle all nostop noprint pass")
gdb.execute("handle SIGPIPE nostop noprint pass")
gdb.execute("handle " + " ".join(FATAL) + " stop print pass")
# the program's argv comes NUL-separated from run.sh, quoted for the shell gdb
# starts it with; the redirections hand it the exec's stdout and stderr
with open(os.path.join(D, "args"), "rb") as f:
    argv = [a.decode("utf-8", "surrogateescape") for a in f.read().split(b"\0")[:-1]]
gdb.execute("set args " + " ".join(shlex.quote(a) for a in argv) + " >&3 2>&4 3>&- 4>&-")

try:
    gdb.execute("run")
except gdb.error as e:
    status("error gdb could not start the program: %s" % e)
    raise SystemExit
while True:
    inf = gdb.selected_inferior()
    if inf.pid == 0:
        sig = gdb.convenience_variable("_exitsignal")
        if sig is not None:
            status("signaled %d" % int(sig))
        else:
            code = gdb.convenience_variable("_exitcode")
            status("exited %d" % (int(code) & 255 if code is not None else 0))
        break
    name = last[0]
    if name in FATAL:
        signo = int(getattr(signal, name))
        if not caught(inf.pid, signo):
            bundle(inf.pid, name, signo)
            status("crashed %d %s" % (signo, name))
            gdb.execute("kill")
            break
    last[0] = None
    gdb.execute("continue")
`
