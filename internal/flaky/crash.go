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
	// Truncated says what was left out of a bundle past its limits.
	Truncated string `json:"truncated,omitempty"`
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
// "signaled N NAME", "crashed N NAME" or "error MESSAGE". Only the first
// line counts (a status file is one line; what follows is not read).
func parseCrashStatus(s string) (crashStatus, error) {
	s, _, _ = strings.Cut(s, "\n")
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

// What a crash bundle may bring out of the sandbox, which may be hostile
// (its gdb, its files, its tar): the bundle's bytes and entries in all,
// and what is read into memory (the backtrace and build-id list shown,
// the ELF notes a build-id is read from).
var (
	maxBundleBytes   int64 = 4 << 30
	maxBundleEntries       = 4096
	maxBundleText          = 1 << 20
)

// fetchBundle writes the sandbox's bundle directory to cr.Dir/crash.tar with
// its entries relative to the bundle, and backtrace.txt beside it; it fills
// cr.Files, checking each copied ELF's build-id against gdb's. Past
// maxBundleBytes or maxBundleEntries the rest is left out, and
// cr.Truncated says so. Nothing is held in memory but the texts shown (each
// within maxBundleText): build-ids are read from crash.tar on disk.
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
	cw := &countWriter{w: f}
	tw := tar.NewWriter(cw)
	tr := tar.NewReader(rc)
	type elfEntry struct{ off, size int64 }
	elfs := map[string]elfEntry{} // path in the sandbox -> where its copy is in crash.tar
	var wantIDs string
	var total int64
	entries, skipped := 0, 0
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
		if entries >= maxBundleEntries || h.Size < 0 || total+h.Size > maxBundleBytes {
			skipped++
			continue
		}
		entries++
		total += h.Size
		h.Name = name
		if err := tw.WriteHeader(h); err != nil {
			return err
		}
		off := cw.n // the data of a regular entry starts right after its header
		var text bytes.Buffer
		var w io.Writer = tw
		if h.Typeflag == tar.TypeReg && (name == "backtrace.txt" || name == "buildids.txt") {
			w = io.MultiWriter(tw, &limitedBuffer{buf: &text, max: maxBundleText})
		}
		if _, err := io.Copy(w, tr); err != nil {
			return err
		}
		switch {
		case name == "backtrace.txt":
			cr.Backtrace = text.String()
		case name == "buildids.txt":
			wantIDs = text.String()
		case h.Typeflag == tar.TypeReg && strings.HasPrefix(name, "files/"):
			elfs["/"+strings.TrimPrefix(name, "files/")] = elfEntry{off, h.Size}
		}
	}
	if skipped > 0 {
		cr.Truncated = fmt.Sprintf("%d entries left out: a bundle holds at most %d entries and %d MiB", skipped, maxBundleEntries, maxBundleBytes>>20)
	}
	if err := tw.Close(); err != nil {
		return err
	}
	actual := map[string]string{} // path in the sandbox -> build-id of the copy
	for p, e := range elfs {
		actual[p] = elfBuildIDAt(io.NewSectionReader(f, e.off, e.size))
	}
	if err := f.Close(); err != nil {
		return err
	}
	cr.Files = matchBuildIDs(parseBuildIDs(wantIDs), actual)
	return os.WriteFile(filepath.Join(cr.Dir, "backtrace.txt"), []byte(cr.Backtrace), 0o644)
}

// countWriter counts what goes through it.
type countWriter struct {
	w io.Writer
	n int64
}

func (c *countWriter) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	c.n += int64(n)
	return n, err
}

// limitedBuffer keeps the first max bytes written to it and drops the rest
// (without failing the write, so the copy to the tar goes on).
type limitedBuffer struct {
	buf *bytes.Buffer
	max int
}

func (l *limitedBuffer) Write(p []byte) (int, error) {
	if room := l.max - l.buf.Len(); room > 0 {
		l.buf.Write(p[:min(len(p), room)])
	}
	return len(p), nil
}

// stripFirst drops the first element of a tar entry name ("bundle/core" ->
// "core"); the directory itself becomes "".
func stripFirst(name string) string {
	name = strings.TrimPrefix(path.Clean("/"+name), "/")
	_, rest, _ := strings.Cut(name, "/")
	return rest
}

// parseBuildIDs parses buildids.txt: "BUILDID PATH" a line, "-" for none.
// A build-id longer than maxBuildIDSize bytes is taken as none.
func parseBuildIDs(s string) map[string]string {
	m := map[string]string{}
	for _, line := range strings.Split(s, "\n") {
		id, p, ok := strings.Cut(strings.TrimSpace(line), " ")
		if !ok || p == "" {
			continue
		}
		if len(id) > 2*maxBuildIDSize {
			id = "-"
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
func ELFBuildID(b []byte) string { return elfBuildIDAt(bytes.NewReader(b)) }

// What reading a build-id may cost: one note segment or section, all that
// is read of the file (headers and notes), and the longest build-id taken
// (GNU ld makes 16 or 20 bytes; --build-id=0xHEX any length).
const (
	maxNote        = 64 << 10
	maxELFRead     = 1 << 20
	maxBuildIDSize = 256
)

// budgetReaderAt reads from r until n bytes in all have been asked for,
// then fails: a file's headers cannot make the read of its notes long.
type budgetReaderAt struct {
	r io.ReaderAt
	n int64
}

func (b *budgetReaderAt) ReadAt(p []byte, off int64) (int, error) {
	if int64(len(p)) > b.n {
		return 0, fmt.Errorf("more than %d bytes read for a build-id", maxELFRead)
	}
	b.n -= int64(len(p))
	return b.r.ReadAt(p, off)
}

// elfBuildIDAt returns the GNU build-id of the ELF file r, or "". It reads
// the header, the program headers and the note segments (or, stripped of
// those, the section headers and note sections), each within maxNote and
// maxELFRead in all: never the file, whatever its headers claim.
func elfBuildIDAt(ra io.ReaderAt) string {
	r := &budgetReaderAt{r: ra, n: maxELFRead}
	var ident [elf.EI_NIDENT]byte
	if _, err := r.ReadAt(ident[:], 0); err != nil || string(ident[:4]) != elf.ELFMAG {
		return ""
	}
	var bo binary.ByteOrder
	switch elf.Data(ident[elf.EI_DATA]) {
	case elf.ELFDATA2LSB:
		bo = binary.LittleEndian
	case elf.ELFDATA2MSB:
		bo = binary.BigEndian
	default:
		return ""
	}
	is64 := elf.Class(ident[elf.EI_CLASS]) == elf.ELFCLASS64
	if !is64 && elf.Class(ident[elf.EI_CLASS]) != elf.ELFCLASS32 {
		return ""
	}
	hdr := make([]byte, 64)
	if _, err := r.ReadAt(hdr, 0); err != nil && !(err == io.EOF && !is64) {
		return ""
	}
	// where the program and section headers are, and how many
	var phoff, shoff uint64
	var phentsize, phnum, shentsize, shnum int
	if is64 {
		phoff, shoff = bo.Uint64(hdr[32:]), bo.Uint64(hdr[40:])
		phentsize, phnum = int(bo.Uint16(hdr[54:])), int(bo.Uint16(hdr[56:]))
		shentsize, shnum = int(bo.Uint16(hdr[58:])), int(bo.Uint16(hdr[60:]))
	} else {
		phoff, shoff = uint64(bo.Uint32(hdr[28:])), uint64(bo.Uint32(hdr[32:]))
		phentsize, phnum = int(bo.Uint16(hdr[42:])), int(bo.Uint16(hdr[44:]))
		shentsize, shnum = int(bo.Uint16(hdr[46:])), int(bo.Uint16(hdr[48:]))
	}
	note := func(off, size uint64) string {
		if size == 0 || size > maxNote || size > uint64(r.n) || off > 1<<62 {
			return ""
		}
		d := make([]byte, size)
		if _, err := r.ReadAt(d, int64(off)); err != nil {
			return ""
		}
		return noteBuildID(d, bo)
	}
	// a segment or section header: its type, and where its bytes are
	entry := func(tabOff uint64, i, entsize int, segment bool) (typ uint32, off, size uint64, ok bool) {
		if entsize < 32 || entsize > 128 || int64(entsize) > r.n || tabOff > 1<<62 {
			return 0, 0, 0, false
		}
		e := make([]byte, entsize)
		if _, err := r.ReadAt(e, int64(tabOff)+int64(i)*int64(entsize)); err != nil {
			return 0, 0, 0, false
		}
		typ = bo.Uint32(e)
		switch {
		case segment && is64 && entsize >= 56:
			return typ, bo.Uint64(e[8:]), bo.Uint64(e[32:]), true
		case segment && !is64:
			return typ, uint64(bo.Uint32(e[4:])), uint64(bo.Uint32(e[16:])), true
		case !segment && is64 && entsize >= 64:
			return bo.Uint32(e[4:]), bo.Uint64(e[24:]), bo.Uint64(e[32:]), true
		case !segment && !is64 && entsize >= 40:
			return bo.Uint32(e[4:]), uint64(bo.Uint32(e[16:])), uint64(bo.Uint32(e[20:])), true
		}
		return 0, 0, 0, false
	}
	for i := range phnum {
		if typ, off, size, ok := entry(phoff, i, phentsize, true); ok && elf.ProgType(typ) == elf.PT_NOTE {
			if id := note(off, size); id != "" {
				return id
			}
		}
	}
	for i := range shnum {
		if typ, off, size, ok := entry(shoff, i, shentsize, false); ok && elf.SectionType(typ) == elf.SHT_NOTE {
			if id := note(off, size); id != "" {
				return id
			}
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
			if len(desc) > maxBuildIDSize {
				return ""
			}
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
const wrapperPy = bundlePy + wrapperRunPy

// bundlePy is the part of the gdb scripts that writes a bundle of the
// process gdb is at: bundle(pid, name, signo), into the directory B beside
// the script.
const bundlePy = `
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
        dbg = "/usr/lib/debug/.build-id/%s/%s.debug" % (o.build_id[:2], o.build_id[2:]) if o.build_id else ""
        if dbg and os.path.isfile(dbg):
            dst = os.path.join(B, "files", dbg.lstrip("/"))
            os.makedirs(os.path.dirname(dst), exist_ok=True)
            try:
                shutil.copyfile(dbg, dst)
            except Exception:
                pass
        if os.path.isfile(p):
            dst = os.path.join(B, "files", p.lstrip("/"))
            os.makedirs(os.path.dirname(dst), exist_ok=True)
            try:
                shutil.copyfile(p, dst)
            except Exception:
                pass
    write("buildids.txt", "\n".join(ids) + "\n")
`

// wrapperRunPy runs the program under gdb and stops it at a fatal signal.
const wrapperRunPy = `
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
