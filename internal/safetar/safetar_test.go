package safetar

import (
	"archive/tar"
	"bytes"
	"errors"
	"fmt"
	"golang.org/x/sys/unix"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// The three ways sbx extracts, as its callers set them up: the client (a
// download from a sandbox), the agent (an upload into one) and the
// template store (a root filesystem or an image layer).
var profiles = []struct {
	name string
	opts Options
}{
	{"client", Options{StripComponents: 1, RequireEnd: true, Umask: 0o022, SkipUnknown: true}},
	{"agent", Options{RequireEnd: true, KeepMode: true, KeepTimes: true, Fifos: true, Devices: true,
		Owner: func(h *tar.Header) (int, int) { return h.Uid, h.Gid }}},
	{"template", Options{AbsoluteNames: true, ReplaceDirs: true, SkipUnknown: true, KeepMode: true, KeepTimes: true, Xattrs: true, Fifos: true,
		Owner: func(h *tar.Header) (int, int) { return h.Uid, h.Gid }}},
}

func reg(name, body string) tar.Header {
	return tar.Header{Typeflag: tar.TypeReg, Name: name, Mode: 0o644, Size: int64(len(body)), Linkname: body}
}
func dirh(name string, mode int64) tar.Header {
	return tar.Header{Typeflag: tar.TypeDir, Name: name, Mode: mode}
}
func symh(name, target string) tar.Header {
	return tar.Header{Typeflag: tar.TypeSymlink, Name: name, Linkname: target, Mode: 0o777}
}
func linkh(name, target string) tar.Header {
	return tar.Header{Typeflag: tar.TypeLink, Name: name, Linkname: target}
}

// archive writes hdrs as a tar; a regular file's body is its Linkname. For
// the client, whose names start with the directory it downloads, every
// relative name and hard link target gets "top/" in front.
func archive(t *testing.T, strip bool, hdrs []tar.Header) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	if strip {
		tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: "top/", Mode: 0o755})
	}
	for _, h := range hdrs {
		if h.Typeflag == tar.TypeXHeader || h.Typeflag == tar.TypeGNULongName {
			tw.Flush()
			buf.Write(special(t, h.Typeflag, h.Size))
			continue
		}
		body := ""
		if h.Typeflag == tar.TypeReg {
			body, h.Linkname = h.Linkname, ""
		}
		if strip && h.Name != "" && !strings.HasPrefix(h.Name, "/") {
			h.Name = "top/" + h.Name
			if h.Typeflag == tar.TypeLink && !strings.HasPrefix(h.Linkname, "/") {
				h.Linkname = "top/" + h.Linkname
			}
		}
		if err := tw.WriteHeader(&h); err != nil {
			t.Fatal(err)
		}
		io.WriteString(tw, body)
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// special is a header of type typ (which tar.Writer does not write
// itself) followed by size bytes of its data: a PAX record that long, or a
// name.
func special(t *testing.T, typ byte, size int64) []byte {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: "special", Size: size, Format: tar.FormatUSTAR}); err != nil {
		t.Fatal(err)
	}
	b := buf.Bytes()[:512]
	b[156] = typ
	copy(b[148:156], "        ")
	var sum int64
	for _, c := range b {
		sum += int64(c)
	}
	copy(b[148:156], fmt.Sprintf("%06o\x00 ", sum))
	data := bytes.Repeat([]byte("n"), int(size))
	if typ == tar.TypeXHeader { // one record: "<size> comment=nnn...\n"
		copy(data, fmt.Sprintf("%d comment=", size))
		data[size-1] = '\n'
	}
	out := append(slices.Clone(b), data...)
	if pad := (512 - len(data)%512) % 512; pad > 0 {
		out = append(out, make([]byte, pad)...)
	}
	return out
}

// TestExtractAttacks: archives that try to write outside the target, or
// over what they may not, are refused (or, where a profile allows it,
// kept inside); nothing outside is touched and no temporary file stays.
func TestExtractAttacks(t *testing.T) {
	const out = "OUTSIDE" // replaced by a directory beside the target
	tests := []struct {
		name string
		hdrs []tar.Header
		// the error each profile gives (a part of it), "" for none
		client, agent, template string
		check                   func(t *testing.T, dest string)
	}{
		{name: "dotdot", hdrs: []tar.Header{reg("../evil", "x")},
			client: `".." is not allowed`, agent: `".." is not allowed`, template: `".." is not allowed`},
		{name: "dotdot inside", hdrs: []tar.Header{dirh("a/", 0o755), reg("a/../../evil", "x")},
			client: "leaves the target", agent: "leaves the target", template: "leaves the target"},
		{name: "absolute", hdrs: []tar.Header{reg(out+"/evil", "x")},
			client: "absolute names are not allowed", agent: "absolute names are not allowed",
			check: func(t *testing.T, dest string) {
				// the template takes it as below the rootfs
				var found bool
				filepath.WalkDir(dest, func(p string, d fs.DirEntry, err error) error {
					found = found || d.Name() == "evil"
					return nil
				})
				if !found {
					t.Error("evil is not below the target")
				}
			}},
		{name: "symlink then a file through it", hdrs: []tar.Header{symh("l", out), reg("l/evil", "x")},
			client: "its parent l is a symbolic link", agent: "its parent l is a symbolic link", template: "its parent l is a symbolic link"},
		{name: "relative symlink out then a file", hdrs: []tar.Header{symh("up", "../../../../../../../.."+out), reg("up/evil", "x")},
			client: "symbolic link", agent: "symbolic link", template: "symbolic link"},
		{name: "symlink then a directory through it", hdrs: []tar.Header{symh("l", out), dirh("l/evil/", 0o755)},
			client: "symbolic link", agent: "symbolic link", template: "symbolic link"},
		{name: "symlink then a hard link through it", hdrs: []tar.Header{symh("l", out), reg("f", "x"), linkh("l/evil", "f")},
			client: "symbolic link", agent: "symbolic link", template: "symbolic link"},
		{name: "hard link out", hdrs: []tar.Header{linkh("pw", "../../../etc/passwd")},
			client: "must not contain", agent: "bad hard link target", template: "must not contain"},
		{name: "hard link to an absolute name", hdrs: []tar.Header{linkh("pw", "/etc/passwd")},
			client: "bad hard link target", agent: "absolute names are not allowed", template: "not in the archive"},
		{name: "hard link through a symlink", hdrs: []tar.Header{symh("etc", "/etc"), linkh("pw", "etc/passwd")},
			client: "symbolic link", agent: "symbolic link", template: "symbolic link"},
		{name: "hard link to a directory", hdrs: []tar.Header{dirh("d/", 0o755), linkh("h", "d")},
			client: "hard link to directory", agent: "hard link to directory", template: "hard link to directory"},
		{name: "huge header", hdrs: []tar.Header{{Typeflag: tar.TypeXHeader, Size: 2 << 20}, reg("f", "x")},
			client: "read tar: archive/tar: header field too long", agent: "header field too long", template: "header field too long"},
		{name: "huge name", hdrs: []tar.Header{{Typeflag: tar.TypeGNULongName, Size: 2 << 20}, reg("f", "x")},
			client: "header field too long", agent: "header field too long", template: "header field too long"},
		{name: "empty name", hdrs: []tar.Header{reg("", "x")},
			client: "an empty name", agent: "an empty name", template: "an empty name"},
		{name: "duplicate entries", hdrs: []tar.Header{reg("f", "one"), reg("f", "two"), dirh("d/", 0o700), dirh("d/", 0o750), symh("s", "a"), symh("s", "b")},
			check: func(t *testing.T, dest string) {
				if b, err := os.ReadFile(filepath.Join(dest, "f")); string(b) != "two" {
					t.Errorf("f = %q, %v; want the last entry's", b, err)
				}
				if l, err := os.Readlink(filepath.Join(dest, "s")); l != "b" {
					t.Errorf("s -> %q, %v; want the last entry's", l, err)
				}
			}},
		{name: "directory replaced by a symlink", hdrs: []tar.Header{dirh("d/", 0o755), reg("d/x", "x"), symh("d", out), reg("d/evil", "x")},
			client: "d is a directory", agent: "d is a directory", template: "its parent d is a symbolic link"},
		{name: "directory replaced by a file", hdrs: []tar.Header{dirh("d/", 0o755), reg("d/x", "x"), reg("d", "file")},
			client: "d is a directory", agent: "d is a directory",
			check: func(t *testing.T, dest string) {
				if b, _ := os.ReadFile(filepath.Join(dest, "d")); string(b) != "file" {
					t.Errorf("d = %q, want the file that replaced the directory", b)
				}
			}},
		{name: "file replaced by a directory", hdrs: []tar.Header{reg("d", "file"), dirh("d/", 0o755), reg("d/x", "x")}},
		{name: "the target as a file", hdrs: []tar.Header{reg(".", "x")},
			client: "names the target directory", agent: "names the target directory", template: "names the target directory"},
		{name: "unknown type", hdrs: []tar.Header{{Typeflag: 'Z', Name: "z"}},
			agent: "unsupported type"},
	}
	for _, tc := range tests {
		for _, p := range profiles {
			t.Run(tc.name+"/"+p.name, func(t *testing.T) {
				parent, outside := t.TempDir(), t.TempDir()
				dest := filepath.Join(parent, "dest")
				if err := os.Mkdir(dest, 0o755); err != nil {
					t.Fatal(err)
				}
				hdrs := slices.Clone(tc.hdrs)
				for i := range hdrs {
					hdrs[i].Name = strings.ReplaceAll(hdrs[i].Name, out, outside)
					if hdrs[i].Typeflag != tar.TypeReg {
						hdrs[i].Linkname = strings.ReplaceAll(hdrs[i].Linkname, out, outside)
					}
				}
				want := map[string]string{"client": tc.client, "agent": tc.agent, "template": tc.template}[p.name]
				_, err := Extract(bytes.NewReader(archive(t, p.name == "client", hdrs)), dest, p.opts)
				switch {
				case want == "" && err != nil:
					t.Fatalf("got %v, want no error", err)
				case want != "" && (err == nil || !strings.Contains(err.Error(), want)):
					t.Fatalf("got %v, want an error saying %q", err, want)
				case want != "":
					var e *Error
					if !errors.As(err, &e) {
						t.Errorf("got %T, want an *Error", err)
					}
				}
				if ents, _ := os.ReadDir(outside); len(ents) > 0 {
					t.Errorf("wrote outside the target: %v", ents)
				}
				if ents, _ := os.ReadDir(parent); len(ents) != 1 {
					t.Errorf("beside the target: %v, want only it", ents)
				}
				filepath.WalkDir(dest, func(p string, d fs.DirEntry, err error) error {
					if err == nil && strings.Contains(d.Name(), ".sbx-tmp-") {
						t.Errorf("temporary file left: %s", p)
					}
					return nil
				})
				if tc.check != nil && want == "" {
					tc.check(t, dest) // the client's top/ is stripped
				}
			})
		}
	}
}

// TestExtractModes: without KeepMode an entry gets permission bits within
// the umask and the target keeps its mode unless RootMode; with it, modes
// (setuid too), owners and times are the archive's, directories' last.
func TestExtractModes(t *testing.T) {
	mtime := time.Date(2023, 5, 6, 7, 8, 9, 0, time.UTC)
	hdrs := []tar.Header{
		{Typeflag: tar.TypeDir, Name: "d/", Mode: 0o777, ModTime: mtime},
		{Typeflag: tar.TypeDir, Name: "d/sub/", Mode: 0o500, ModTime: mtime},
		{Typeflag: tar.TypeReg, Name: "d/sub/f", Mode: 0o4777, Size: 1, ModTime: mtime, Uid: 1234, Gid: 1234},
	}
	write := func() []byte {
		var buf bytes.Buffer
		tw := tar.NewWriter(&buf)
		for _, h := range hdrs {
			tw.WriteHeader(&h)
			if h.Size > 0 {
				tw.Write([]byte("x"))
			}
		}
		tw.Close()
		return buf.Bytes()
	}
	tests := []struct {
		name  string
		opts  Options
		modes map[string]fs.FileMode
		owned bool
		timed bool
	}{
		{"within the umask", Options{StripComponents: 1, Umask: 0o027},
			map[string]fs.FileMode{".": 0o700, "sub": 0o700, "sub/f": 0o750}, false, false},
		{"root mode", Options{StripComponents: 1, Umask: 0o027, RootMode: true},
			map[string]fs.FileMode{".": 0o750, "sub": 0o700, "sub/f": 0o750}, false, false},
		{"kept", Options{StripComponents: 1, KeepMode: true, KeepTimes: true, Owner: func(h *tar.Header) (int, int) { return h.Uid, h.Gid }},
			map[string]fs.FileMode{".": 0o700, "sub": 0o500, "sub/f": fs.ModeSetuid | 0o777}, true, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			dest := filepath.Join(t.TempDir(), "dest")
			os.Mkdir(dest, 0o700)
			if _, err := Extract(bytes.NewReader(write()), dest, tc.opts); err != nil {
				t.Fatal(err)
			}
			for p, want := range tc.modes {
				fi, err := os.Lstat(filepath.Join(dest, p))
				if err != nil {
					t.Fatal(err)
				}
				if got := fi.Mode() & (fs.ModePerm | fs.ModeSetuid | fs.ModeSetgid | fs.ModeSticky); got != want {
					t.Errorf("%s: mode %v, want %v", p, got, want)
				}
				st := fi.Sys().(*syscall.Stat_t)
				if p == "sub/f" && (st.Uid == 1234) != tc.owned {
					t.Errorf("%s: uid %d, want the archive's: %v", p, st.Uid, tc.owned)
				}
				if p != "." && fi.ModTime().Equal(mtime) != tc.timed {
					t.Errorf("%s: mtime %v, want the archive's: %v", p, fi.ModTime(), tc.timed)
				}
			}
		})
	}
}

// TestExtractSpecial: devices and fifos are made only when asked; unknown
// types are skipped only when asked; Note hears what is skipped.
func TestExtractSpecial(t *testing.T) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	tw.WriteHeader(&tar.Header{Typeflag: tar.TypeChar, Name: "mem", Mode: 0o666, Devmajor: 1, Devminor: 1})
	tw.WriteHeader(&tar.Header{Typeflag: tar.TypeFifo, Name: "pipe", Mode: 0o644})
	tw.Close()
	for _, tc := range []struct {
		name       string
		opts       Options
		mem, pipe  bool
		wantNotes  int
		needsMknod bool
	}{
		{"skipped", Options{}, false, false, 2, false},
		{"fifos", Options{Fifos: true}, false, true, 1, false},
		{"all", Options{Fifos: true, Devices: true}, true, true, 0, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var notes []string
			tc.opts.Note = func(s string) { notes = append(notes, s) }
			dest := t.TempDir()
			_, err := Extract(bytes.NewReader(buf.Bytes()), dest, tc.opts)
			if tc.needsMknod && errors.Is(err, syscall.EPERM) {
				t.Skip("no CAP_MKNOD")
			}
			if err != nil {
				t.Fatal(err)
			}
			fi, err := os.Lstat(filepath.Join(dest, "mem"))
			if (err == nil && fi.Mode()&fs.ModeCharDevice != 0) != tc.mem {
				t.Errorf("mem: %v, %v; want a device: %v", fi, err, tc.mem)
			}
			fi, err = os.Lstat(filepath.Join(dest, "pipe"))
			if (err == nil && fi.Mode()&fs.ModeNamedPipe != 0) != tc.pipe {
				t.Errorf("pipe: %v, %v; want a fifo: %v", fi, err, tc.pipe)
			}
			if len(notes) != tc.wantNotes {
				t.Errorf("notes %q, want %d", notes, tc.wantNotes)
			}
		})
	}
}

// TestExtractCut: an archive cut between entries is refused with
// RequireEnd; cut anywhere else, always.
func TestExtractCut(t *testing.T) {
	// a: header 0-512, data to 516, padding to 1024; b: 1024-1540, padding
	// to 2048; the end marker to 3072
	whole := archive(t, false, []tar.Header{reg("a", "aaaa"), reg("b", "bbbb")})
	for _, tc := range []struct {
		cut    int
		always bool // refused without RequireEnd too
	}{
		{300, true}, {514, true}, {700, false}, {1024, false}, {1300, true}, {1538, true},
		{2047, false}, {2048, false}, {2560, false}, {3071, true},
	} {
		for _, end := range []bool{false, true} {
			_, err := Extract(bytes.NewReader(whole[:tc.cut]), t.TempDir(), Options{RequireEnd: end})
			var e *Error
			if want := tc.always || end; want != (err != nil) || err != nil && (!errors.As(err, &e) || e.Kind != Unreadable) {
				t.Errorf("cut at %d, RequireEnd %v: got %v, want an Unreadable *Error: %v", tc.cut, end, err, want)
			}
		}
	}
	if _, err := Extract(bytes.NewReader(whole), t.TempDir(), Options{RequireEnd: true}); err != nil {
		t.Errorf("whole archive: %v", err)
	}
}

// TestExtractCharge: Charge hears every byte and every directory, and its
// error stops the extraction as it is.
func TestExtractCharge(t *testing.T) {
	tooBig := errors.New("too big")
	var used int64
	charge := func(n int64) error {
		used += n
		if used > 10000 {
			return tooBig
		}
		return nil
	}
	a := archive(t, false, []tar.Header{dirh("d/", 0o755), reg("d/f", strings.Repeat("x", 100))})
	if _, err := Extract(bytes.NewReader(a), t.TempDir(), Options{Charge: charge}); err != nil || used != DirCost+100 {
		t.Fatalf("got %v, used %d; want no error, %d", err, used, DirCost+100)
	}
	used = 0
	a = archive(t, false, []tar.Header{reg("big", strings.Repeat("x", 20000))})
	if _, err := Extract(bytes.NewReader(a), t.TempDir(), Options{Charge: charge}); err != tooBig {
		t.Fatalf("got %v (used %d), want Charge's error as it is", err, used)
	}
}

// TestExtractSpill: past CacheBytes the directories' modes and times go to
// a file in SpillDir and are still set, the last entry naming a path
// winning; the file goes afterwards.
func TestExtractSpill(t *testing.T) {
	var hdrs []tar.Header
	for i := range 40 {
		h := dirh("d"+string(rune('a'+i%10))+"/", 0o700+int64(i%8))
		h.ModTime = time.Unix(int64(1000+i), 0)
		hdrs = append(hdrs, h)
	}
	spill, dest := t.TempDir(), t.TempDir()
	_, err := Extract(bytes.NewReader(archive(t, false, hdrs)), dest, Options{KeepMode: true, KeepTimes: true, CacheBytes: 8, SpillDir: spill})
	if err != nil {
		t.Fatal(err)
	}
	for d := range 10 {
		last := 30 + d
		fi, err := os.Stat(filepath.Join(dest, "d"+string(rune('a'+d))))
		if err != nil {
			t.Fatal(err)
		}
		if got, want := fi.Mode().Perm(), fs.FileMode(0o700+last%8); got != want {
			t.Errorf("d%c: mode %v, want %v", 'a'+d, got, want)
		}
		if got, want := fi.ModTime().Unix(), int64(1000+last); got != want {
			t.Errorf("d%c: time %d, want %d", 'a'+d, got, want)
		}
	}
	if ents, _ := os.ReadDir(spill); len(ents) != 0 {
		t.Errorf("spill dir holds %v after the extraction", ents)
	}
}

func TestClean(t *testing.T) {
	x := &extractor{o: Options{StripComponents: 1}}
	for _, tc := range []struct {
		name, want string
		bad        badName
	}{
		{"top/a/b", "a/b", nameOK},
		{"./top/a/", "a", nameOK},
		{"top", ".", nameOK},
		{"top/", ".", nameOK},
		{"", "", nameEmpty},
		{"top/a\x00b", "", nameNUL},
		{"/top/a", "", nameAbsolute},
		{"top/../a", "", nameDotDot},
		{"top/..", "", nameDotDot},
		{"top/a..b", "a..b", nameOK},
	} {
		if got, bad := x.clean(tc.name); got != tc.want || bad != tc.bad {
			t.Errorf("clean(%q) = %q, %v; want %q, %v", tc.name, got, bad, tc.want, tc.bad)
		}
	}
}

// TestWriteContents: with no Base, what is below root, named relative to it.
func TestWriteContents(t *testing.T) {
	src := t.TempDir()
	os.MkdirAll(filepath.Join(src, "sub"), 0o755)
	os.WriteFile(filepath.Join(src, "a"), []byte("A"), 0o600)
	os.WriteFile(filepath.Join(src, "sub", "b"), []byte("B"), 0o644)
	os.Symlink("a", filepath.Join(src, "link"))
	os.Link(filepath.Join(src, "a"), filepath.Join(src, "sub", "hard"))
	var buf bytes.Buffer
	if err := Write(&buf, src, WriteOptions{}); err != nil {
		t.Fatal(err)
	}
	var names []string
	tr := tar.NewReader(&buf)
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		n := hdr.Name
		switch hdr.Typeflag {
		case tar.TypeSymlink:
			n += " -> " + hdr.Linkname
		case tar.TypeLink:
			n += " => " + hdr.Linkname
		}
		if hdr.Uname != "" || hdr.Gname != "" {
			t.Errorf("%s: owner names %q %q, want none", hdr.Name, hdr.Uname, hdr.Gname)
		}
		names = append(names, n)
	}
	want := []string{"a", "link -> a", "sub/", "sub/b", "sub/hard => a"}
	if diff := cmp.Diff(want, names); diff != "" {
		t.Errorf("entries (-want +got):\n%s", diff)
	}
}

// TestWriteRoundTrip: what Write stores under a Base with exact times,
// Extract with the archive's modes and times puts back as it was.
func TestWriteRoundTrip(t *testing.T) {
	mtime := time.Date(2023, 5, 6, 7, 8, 9, 123456789, time.UTC)
	src := filepath.Join(t.TempDir(), "project")
	os.MkdirAll(filepath.Join(src, "sub"), 0o750)
	os.WriteFile(filepath.Join(src, "sub", "run"), []byte("#!/bin/sh\n"), 0o755)
	os.Symlink("/etc/passwd", filepath.Join(src, "abs"))
	for _, p := range []string{"sub/run", "sub", ""} {
		os.Chtimes(filepath.Join(src, p), mtime, mtime)
	}
	// root itself may be a symlink: it is resolved
	alias := filepath.Join(t.TempDir(), "alias")
	os.Symlink(src, alias)
	var buf bytes.Buffer
	if err := Write(&buf, alias, WriteOptions{Base: "project", ExactTimes: true}); err != nil {
		t.Fatal(err)
	}
	dest := t.TempDir()
	if _, err := Extract(&buf, dest, Options{RequireEnd: true, KeepMode: true, KeepTimes: true}); err != nil {
		t.Fatal(err)
	}
	for p, want := range map[string]fs.FileMode{"project": fs.ModeDir | 0o750, "project/sub": fs.ModeDir | 0o750, "project/sub/run": 0o755, "project/abs": fs.ModeSymlink | 0o777} {
		fi, err := os.Lstat(filepath.Join(dest, p))
		if err != nil {
			t.Fatal(err)
		}
		if fi.Mode() != want {
			t.Errorf("%s: mode %v, want %v", p, fi.Mode(), want)
		}
		if fi.Mode()&fs.ModeSymlink == 0 && !fi.ModTime().Equal(mtime) {
			t.Errorf("%s: mtime %v, want %v", p, fi.ModTime(), mtime)
		}
	}
}

// TestSwappedParentStaysInside: another writer below the target swaps a
// checked parent directory for a symlink to a directory outside, again and
// again, while entries are extracted into it (as root inside a sandbox
// extracts an upload into a directory its user owns). The nodes made and
// the times and attributes set never land outside: they go through the
// parent opened through the root, not a path from the target.
func TestSwappedParentStaysInside(t *testing.T) {
	dest, outside := t.TempDir(), t.TempDir()
	old := time.Date(2001, 1, 1, 0, 0, 0, 0, time.UTC)
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	tw.WriteHeader(&tar.Header{Name: "a/", Typeflag: tar.TypeDir, Mode: 0o755})
	for i := range 20 {
		tw.WriteHeader(&tar.Header{Name: fmt.Sprintf("a/p%d", i), Typeflag: tar.TypeFifo, Mode: 0o644, ModTime: old})
		// a file of that name outside: its times must stay
		os.WriteFile(filepath.Join(outside, fmt.Sprintf("p%d", i)), nil, 0o644)
	}
	tw.Close()
	stop := make(chan struct{})
	swapped := make(chan int)
	go func() {
		n := 0
		defer func() { swapped <- n }()
		// a is always there: a directory, or (swapped atomically) a
		// symlink to outside
		a, link := filepath.Join(dest, "a"), filepath.Join(dest, "link")
		for {
			select {
			case <-stop:
				return
			default:
			}
			if _, err := os.Lstat(a); err != nil {
				continue // not made yet
			}
			if _, err := os.Lstat(link); err != nil {
				os.Symlink(outside, link)
			}
			if unix.Renameat2(unix.AT_FDCWD, a, unix.AT_FDCWD, link, unix.RENAME_EXCHANGE) == nil {
				n++
				time.Sleep(20 * time.Microsecond) // tested: the window an entry may meet
				unix.Renameat2(unix.AT_FDCWD, a, unix.AT_FDCWD, link, unix.RENAME_EXCHANGE)
				time.Sleep(20 * time.Microsecond)
			}
		}
	}()
	var errs int
	for range 200 {
		if _, err := Extract(bytes.NewReader(buf.Bytes()), dest, Options{Fifos: true, KeepTimes: true}); err != nil {
			errs++
		}
	}
	close(stop)
	n := <-swapped
	t.Logf("%d of 200 extractions failed (a parent a symlink); the parent was swapped %d times", errs, n)
	ents, _ := os.ReadDir(outside)
	for _, e := range ents {
		fi, _ := e.Info()
		if fi.Mode()&fs.ModeNamedPipe != 0 {
			t.Errorf("a fifo was made outside the target: %s", e.Name())
		}
		if fi.ModTime().Equal(old) {
			t.Errorf("the times of %s outside the target were set", e.Name())
		}
	}
}
