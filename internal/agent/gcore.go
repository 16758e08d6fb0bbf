package agent

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// gcore writes what a core needs to be readable for a process held at its
// crash, in a sandbox with no gdb (tiny, a distroless image): an ELF core
// written here through ptrace, the program and every file it had mapped,
// the mappings, and the build-id of each file as it was mapped (read from
// the process's memory, so a file changed on disk since is seen). The
// backtrace is then read by a gdb outside, on the core.
//
//	sbx-agent gcore --pid PID [--tid TID] [--signal N] --out DIR

// Bounds of a core: the memory dumped in all, and the mappings listed.
const (
	maxCoreBytes    = 2 << 30
	maxCoreMappings = 60000
	maxCoreFile     = 1 << 30
)

func runGcore(args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("gcore", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	pid := fs.Int("pid", 0, "")
	sig := fs.Int("signal", 0, "")
	tid := fs.Int("tid", 0, "")
	out := fs.String("out", "", "")
	if err := fs.Parse(args); err != nil {
		return invalidf("gcore: %v", err)
	}
	if *pid <= 0 || *out == "" || *sig < 0 || *sig > 64 {
		return invalidf("gcore: want --pid PID [--tid TID] [--signal N] --out DIR")
	}
	if err := os.MkdirAll(*out, 0o700); err != nil {
		return err
	}
	maps, err := readMaps(*pid)
	if err != nil {
		return err
	}
	raw, _ := os.ReadFile(fmt.Sprintf("/proc/%d/maps", *pid))
	if err := os.WriteFile(filepath.Join(*out, "maps"), raw, 0o644); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(*out, "signal.txt"), []byte(fmt.Sprintf("%d %s\n", *sig, unix.SignalName(syscall.Signal(*sig)))), 0o644); err != nil {
		return err
	}
	log := &bytes.Buffer{}
	if err := writeCore(*pid, *tid, *sig, maps, filepath.Join(*out, "core"), log); err != nil {
		fmt.Fprintf(log, "core: %v\n", err)
	}
	ids := copyMapped(*pid, maps, filepath.Join(*out, "files"), log)
	if err := os.WriteFile(filepath.Join(*out, "buildids.txt"), []byte(ids), 0o644); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(*out, "core.log"), log.Bytes(), 0o644); err != nil {
		return err
	}
	if _, err := os.Stat(filepath.Join(*out, "core")); err != nil {
		return fmt.Errorf("gcore %d: no core written: %s", *pid, strings.TrimSpace(log.String()))
	}
	fmt.Fprintf(stdout, "wrote %s\n", *out)
	return nil
}

// mapping is one line of /proc/PID/maps.
type mapping struct {
	start, end, off uint64
	perms, path     string
}

func (m mapping) readable() bool { return len(m.perms) > 0 && m.perms[0] == 'r' }
func (m mapping) writable() bool { return len(m.perms) > 1 && m.perms[1] == 'w' }
func (m mapping) file() bool     { return strings.HasPrefix(m.path, "/") }

func readMaps(pid int) ([]mapping, error) {
	f, err := os.Open(fmt.Sprintf("/proc/%d/maps", pid))
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out []mapping
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 64<<10)
	for sc.Scan() && len(out) < maxCoreMappings {
		f := strings.Fields(sc.Text())
		if len(f) < 5 {
			continue
		}
		lo, hi, ok := strings.Cut(f[0], "-")
		if !ok {
			continue
		}
		var m mapping
		var e1, e2, e3 error
		m.start, e1 = strconv.ParseUint(lo, 16, 64)
		m.end, e2 = strconv.ParseUint(hi, 16, 64)
		m.off, e3 = strconv.ParseUint(f[2], 16, 64)
		if e1 != nil || e2 != nil || e3 != nil || m.end <= m.start {
			continue
		}
		m.perms = f[1]
		if len(f) >= 6 {
			m.path = strings.Join(f[5:], " ")
		}
		out = append(out, m)
	}
	return out, sc.Err()
}

// memReader reads pid's memory: /proc/PID/mem, else process_vm_readv.
type memReader struct {
	pid int
	f   *os.File
}

func (r *memReader) ReadAt(p []byte, off int64) (int, error) {
	if r.f != nil {
		if n, err := r.f.ReadAt(p, off); n == len(p) || err == nil {
			return n, err
		}
	}
	local := []unix.Iovec{{Base: &p[0]}}
	local[0].SetLen(len(p))
	remote := []unix.RemoteIovec{{Base: uintptr(off), Len: len(p)}}
	n, err := unix.ProcessVMReadv(r.pid, local, remote, 0)
	if err != nil {
		return 0, err
	}
	if n < len(p) {
		return n, io.ErrUnexpectedEOF
	}
	return n, nil
}

// dumped is how much of m goes in the core, close to what Linux's default
// coredump_filter keeps: memory whole, but of a mapped file's code only its
// ELF header page (the file itself is in the bundle). A file's other
// private mappings go whole: its relocated data (RELRO: .dynamic, which
// leads gdb to the shared libraries) is read-only by now, and Linux keeps
// such a mapping because it was written, which maps does not tell.
func dumped(m mapping) uint64 {
	switch {
	case !m.readable() || m.path == "[vvar]":
		return 0
	case m.file() && len(m.perms) > 2 && m.perms[2] == 'x':
		if m.off == 0 {
			return min(m.end-m.start, 4096)
		}
		return 0
	}
	return m.end - m.start
}

// writeCore writes an ELF core of pid to path: a note per thread
// (registers, the faulting thread first), the process's, its auxv and its
// mapped files, and a PT_LOAD per mapping.
func writeCore(pid, faulting, sig int, maps []mapping, path string, log io.Writer) error {
	if runtime.GOARCH != "amd64" {
		return fmt.Errorf("writing a core is done on amd64 only, not %s", runtime.GOARCH)
	}
	tids, err := threads(pid, faulting)
	if err != nil {
		return err
	}
	// ptrace is per thread: every request from the one that attached
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	var attached []int
	defer func() {
		for _, t := range attached {
			_ = unix.PtraceDetach(t)
		}
	}()
	for _, t := range tids {
		if err := unix.PtraceAttach(t); err != nil {
			return fmt.Errorf("ptrace attach %d: %w", t, err)
		}
		attached = append(attached, t)
		if err := waitStopped(t, 5*time.Second); err != nil {
			return err
		}
	}
	var notes bytes.Buffer
	ppid, _, _ := procStat(pid)
	pgid, _ := syscall.Getpgid(pid)
	sid, _ := unix.Getsid(pid)
	for i, t := range tids {
		var regs unix.PtraceRegs
		if err := unix.PtraceGetRegs(t, &regs); err != nil {
			fmt.Fprintf(log, "registers of %d: %v\n", t, err)
			continue
		}
		var st [336]byte
		le := binary.LittleEndian
		le.PutUint32(st[0:], uint32(sig))
		le.PutUint16(st[12:], uint16(sig))
		le.PutUint32(st[32:], uint32(t))
		le.PutUint32(st[36:], uint32(ppid))
		le.PutUint32(st[40:], uint32(pgid))
		le.PutUint32(st[44:], uint32(sid))
		var rb bytes.Buffer
		_ = binary.Write(&rb, le, &regs)
		copy(st[112:328], rb.Bytes())
		fp := make([]byte, 512)
		const ptraceGetFPRegs = 14 // PTRACE_GETFPREGS, x86
		_, _, e := unix.Syscall6(unix.SYS_PTRACE, ptraceGetFPRegs, uintptr(t), 0, uintptr(unsafe.Pointer(&fp[0])), 0, 0)
		if e == 0 {
			le.PutUint32(st[328:], 1)
		}
		note(&notes, 1, st[:]) // NT_PRSTATUS
		if i == 0 {
			note(&notes, 3, prpsinfo(pid, ppid, pgid, sid)) // NT_PRPSINFO
			if auxv, err := os.ReadFile(fmt.Sprintf("/proc/%d/auxv", pid)); err == nil {
				note(&notes, 6, auxv) // NT_AUXV
			}
			note(&notes, 0x46494c45, ntFile(maps)) // NT_FILE
		}
		if e == 0 {
			note(&notes, 2, fp) // NT_FPREGSET
		}
	}
	mem := &memReader{pid: pid}
	if f, err := os.Open(fmt.Sprintf("/proc/%d/mem", pid)); err == nil {
		mem.f = f
		defer f.Close()
	}
	return writeELFCore(path, notes.Bytes(), maps, mem, log)
}

// threads lists pid's threads, the faulting one first (gdb takes the first
// thread of a core for the current one); the order otherwise is the
// kernel's.
func threads(pid, faulting int) ([]int, error) {
	ents, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
	if err != nil {
		return nil, err
	}
	var out []int
	for _, e := range ents {
		if t, err := strconv.Atoi(e.Name()); err == nil {
			if t == faulting {
				out = append([]int{t}, out...)
			} else {
				out = append(out, t)
			}
		}
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("process %d has no threads", pid)
	}
	return out, nil
}

// waitStopped waits (bounded) for tid to report its ptrace stop.
func waitStopped(tid int, limit time.Duration) error {
	deadline := time.Now().Add(limit)
	for {
		var ws unix.WaitStatus
		n, err := unix.Wait4(tid, &ws, unix.WALL|unix.WNOHANG, nil)
		if err != nil && !errors.Is(err, unix.EINTR) {
			return fmt.Errorf("wait for %d: %w", tid, err)
		}
		if n == tid && ws.Stopped() {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("thread %d did not stop for ptrace within %s", tid, limit)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// note appends one ELF note of owner CORE.
func note(b *bytes.Buffer, typ uint32, desc []byte) {
	le := binary.LittleEndian
	var h [12]byte
	le.PutUint32(h[0:], 5)
	le.PutUint32(h[4:], uint32(len(desc)))
	le.PutUint32(h[8:], typ)
	b.Write(h[:])
	b.WriteString("CORE\x00\x00\x00\x00")
	b.Write(desc)
	for b.Len()%4 != 0 {
		b.WriteByte(0)
	}
}

// prpsinfo is struct elf_prpsinfo (x86_64, 136 bytes).
func prpsinfo(pid, ppid, pgid, sid int) []byte {
	var p [136]byte
	le := binary.LittleEndian
	p[1] = 'T'
	le.PutUint32(p[24:], uint32(pid))
	le.PutUint32(p[28:], uint32(ppid))
	le.PutUint32(p[32:], uint32(pgid))
	le.PutUint32(p[36:], uint32(sid))
	comm, _ := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid))
	copy(p[40:55], bytes.TrimSpace(comm))
	args, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	copy(p[56:135], bytes.ReplaceAll(bytes.TrimRight(args, "\x00"), []byte{0}, []byte{' '}))
	return p[:]
}

// ntFile is the NT_FILE note: the file-backed mappings.
func ntFile(maps []mapping) []byte {
	le := binary.LittleEndian
	var files []mapping
	for _, m := range maps {
		if m.file() {
			files = append(files, m)
		}
	}
	var b bytes.Buffer
	var w [8]byte
	put := func(v uint64) { le.PutUint64(w[:], v); b.Write(w[:]) }
	put(uint64(len(files)))
	put(4096)
	for _, m := range files {
		put(m.start)
		put(m.end)
		put(m.off / 4096)
	}
	for _, m := range files {
		b.WriteString(m.path)
		b.WriteByte(0)
	}
	return b.Bytes()
}

// writeELFCore writes the header, the program headers (PT_NOTE, then a
// PT_LOAD per mapping), the notes and the memory.
func writeELFCore(path string, notes []byte, maps []mapping, mem io.ReaderAt, log io.Writer) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	defer f.Close()
	le := binary.LittleEndian
	const ehsize, phentsize = 64, 56
	phnum := 1 + len(maps)
	notesOff := uint64(ehsize + phentsize*phnum)
	dataOff := (notesOff + uint64(len(notes)) + 4095) &^ 4095
	var eh [ehsize]byte
	copy(eh[:], "\x7fELF")
	eh[4], eh[5], eh[6] = 2, 1, 1 // 64-bit, little-endian, version 1
	le.PutUint16(eh[16:], 4)      // ET_CORE
	le.PutUint16(eh[18:], 62)     // EM_X86_64
	le.PutUint32(eh[20:], 1)
	le.PutUint64(eh[32:], ehsize) // e_phoff
	le.PutUint16(eh[52:], ehsize)
	le.PutUint16(eh[54:], phentsize)
	le.PutUint16(eh[56:], uint16(phnum))
	w := bufio.NewWriterSize(f, 1<<20)
	w.Write(eh[:])
	ph := func(typ, flags uint32, off, vaddr, filesz, memsz, align uint64) {
		var p [phentsize]byte
		le.PutUint32(p[0:], typ)
		le.PutUint32(p[4:], flags)
		le.PutUint64(p[8:], off)
		le.PutUint64(p[16:], vaddr)
		le.PutUint64(p[32:], filesz)
		le.PutUint64(p[40:], memsz)
		le.PutUint64(p[48:], align)
		w.Write(p[:])
	}
	ph(4, 4, notesOff, 0, uint64(len(notes)), 0, 4) // PT_NOTE
	sizes := make([]uint64, len(maps))
	off, total := dataOff, uint64(0)
	for i, m := range maps {
		if n := dumped(m); total+n <= maxCoreBytes {
			sizes[i] = n
			total += n
		}
		var flags uint32
		for j, c := range []byte{'r', 'w', 'x'} {
			if len(m.perms) > j && m.perms[j] == c {
				flags |= 4 >> j
			}
		}
		ph(1, flags, off, m.start, sizes[i], m.end-m.start, 4096) // PT_LOAD
		off += sizes[i]
	}
	w.Write(notes)
	if err := w.Flush(); err != nil {
		return err
	}
	if _, err := f.Seek(int64(dataOff), io.SeekStart); err != nil {
		return err
	}
	w.Reset(f)
	page := make([]byte, 4096)
	zero := make([]byte, 4096)
	for i, m := range maps {
		bad := 0
		for a := uint64(0); a < sizes[i]; a += 4096 {
			n := min(4096, sizes[i]-a)
			if _, err := mem.ReadAt(page[:n], int64(m.start+a)); err != nil {
				w.Write(zero[:n]) // an unreadable page reads as zeros, as in a kernel's core
				bad++
				continue
			}
			w.Write(page[:n])
		}
		if bad > 0 {
			fmt.Fprintf(log, "%x-%x %s: %d pages unreadable, written as zeros\n", m.start, m.end, m.path, bad)
		}
	}
	if err := w.Flush(); err != nil {
		return err
	}
	return f.Close()
}

// copyMapped copies the files pid has mapped into dir under their absolute
// paths and returns buildids.txt: each one's build-id as the process has
// it mapped ("-" for none).
func copyMapped(pid int, maps []mapping, dir string, log io.Writer) string {
	mem := &memReader{pid: pid}
	if f, err := os.Open(fmt.Sprintf("/proc/%d/mem", pid)); err == nil {
		mem.f = f
		defer f.Close()
	}
	seen := map[string]bool{}
	var ids strings.Builder
	for _, m := range maps {
		if !m.file() || seen[m.path] || strings.HasSuffix(m.path, " (deleted)") {
			continue
		}
		seen[m.path] = true
		id := "-"
		if m.off == 0 {
			if b := memBuildID(mem, m); b != "" {
				id = b
			}
		}
		fmt.Fprintf(&ids, "%s %s\n", id, m.path)
		if err := copyRegular(m.path, filepath.Join(dir, filepath.Clean(m.path))); err != nil {
			fmt.Fprintf(log, "copy %s: %v\n", m.path, err)
		}
		if len(id) > 2 && id != "-" {
			// its separate debug file, if the sandbox has it (as gdb finds it)
			dbg := "/usr/lib/debug/.build-id/" + id[:2] + "/" + id[2:] + ".debug"
			if _, err := os.Stat(dbg); err == nil {
				_ = copyRegular(dbg, filepath.Join(dir, dbg))
			}
		}
	}
	return ids.String()
}

func copyRegular(from, to string) error {
	src, err := os.Open(from)
	if err != nil {
		return err
	}
	defer src.Close()
	fi, err := src.Stat()
	if err != nil {
		return err
	}
	if !fi.Mode().IsRegular() || fi.Size() > maxCoreFile {
		return fmt.Errorf("not a regular file of at most %d MiB", maxCoreFile>>20)
	}
	if err := os.MkdirAll(filepath.Dir(to), 0o755); err != nil {
		return err
	}
	dst, err := os.Create(to)
	if err != nil {
		return err
	}
	if _, err := io.Copy(dst, io.LimitReader(src, maxCoreFile)); err != nil {
		dst.Close()
		return err
	}
	return dst.Close()
}

// memBuildID reads the GNU build-id of the ELF file mapped at m (its first
// mapping, offset 0) from the process's memory: its program headers and
// the note segments that lie in the mapping.
func memBuildID(mem io.ReaderAt, m mapping) string {
	size := min(m.end-m.start, 64<<10)
	b := make([]byte, size)
	if _, err := mem.ReadAt(b, int64(m.start)); err != nil {
		return ""
	}
	if len(b) < 64 || string(b[:4]) != "\x7fELF" || b[4] != 2 || b[5] != 1 {
		return ""
	}
	le := binary.LittleEndian
	phoff, phentsize, phnum := le.Uint64(b[32:]), uint64(le.Uint16(b[54:])), uint64(le.Uint16(b[56:]))
	if phentsize < 56 {
		return ""
	}
	for i := uint64(0); i < phnum; i++ {
		p := phoff + i*phentsize
		if p+56 > size {
			break
		}
		if le.Uint32(b[p:]) != 4 { // PT_NOTE
			continue
		}
		off, n := le.Uint64(b[p+8:]), le.Uint64(b[p+32:])
		if off >= size || n > size-off {
			continue
		}
		if id := gnuBuildID(b[off : off+n]); id != "" {
			return id
		}
	}
	return ""
}

// gnuBuildID finds the NT_GNU_BUILD_ID note in a note segment.
func gnuBuildID(d []byte) string {
	le := binary.LittleEndian
	for len(d) >= 12 {
		nsz, dsz, typ := uint64(le.Uint32(d)), uint64(le.Uint32(d[4:])), le.Uint32(d[8:])
		d = d[12:]
		na, da := (nsz+3)&^3, (dsz+3)&^3
		if uint64(len(d)) < na+dsz {
			return ""
		}
		if typ == 3 && nsz == 4 && string(d[:3]) == "GNU" && dsz <= 256 {
			return hex.EncodeToString(d[na : na+dsz])
		}
		if uint64(len(d)) < na+da {
			return ""
		}
		d = d[na+da:]
	}
	return ""
}
