package flaky

// Crash bundles: what a core needs to be readable, brought out of a
// sandbox (see crashes.go for where the core is written: in a copy resumed
// from the crash's capture, where the process is still held at its fault).

import (
	"archive/tar"
	"bytes"
	"context"
	"debug/elf"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"strings"

	"sbx.dev/sbx/api"
)

// CrashClient is the slice of *client.Client a crash bundle uses.
type CrashClient interface {
	ExecEvents(ctx context.Context, id string, req api.ExecRequest, fn func(api.ExecEvent) error) (*api.Exec, error)
	WriteTar(ctx context.Context, id, dir string, r io.Reader) error
	ReadFile(ctx context.Context, id, path string) (io.ReadCloser, error)
	ReadTar(ctx context.Context, id, path string) (io.ReadCloser, error)
}

// CrashRoot is the directory inside the sandbox under which each capture
// gets its own TOKEN directory; a crash's bundle stays there after the fetch.
const CrashRoot = "/tmp/sbx-crash"

// Crash describes a captured crash.
type Crash struct {
	ExecID string `json:"execId"`
	Signal int    `json:"signal"`
	// SignalName is its name, "SIGSEGV".
	SignalName string `json:"signalName"`
	// Dir is the local folder holding crash.tar and backtrace.txt.
	Dir string `json:"dir"`
	Tar string `json:"tar"`
	// Remote is the bundle's directory inside the copy it was made in.
	Remote    string `json:"remote"`
	Backtrace string `json:"-"`
	// Files are the binary and libraries in the bundle, by absolute path in
	// the sandbox, with their build-ids.
	Files []CrashFile `json:"files"`
	// Truncated says what was left out of a bundle past its limits.
	Truncated string `json:"truncated,omitempty"`
	// Snapshot is the sandbox's capture of the crash: in a copy resumed
	// from it (sbx new --from) the process is held at its fault.
	Snapshot string `json:"snapshot,omitempty"`
	// Pid is the crashed process.
	Pid int `json:"pid,omitempty"`
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
