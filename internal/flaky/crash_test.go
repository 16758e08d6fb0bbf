package flaky

import (
	"encoding/binary"
	"syscall"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestParseCrashStatus(t *testing.T) {
	for _, tc := range []struct {
		name    string
		in      string
		want    crashStatus
		code    int
		wantErr bool
	}{
		{name: "exit 0", in: "exited 0\n", want: crashStatus{kind: "exited"}, code: 0},
		{name: "exit 3", in: "exited 3", want: crashStatus{kind: "exited", code: 3}, code: 3},
		{name: "segv", in: "crashed 11 SIGSEGV\n", want: crashStatus{kind: "crashed", code: 11, name: "SIGSEGV"}, code: 139},
		{name: "abort", in: "crashed 6 SIGABRT", want: crashStatus{kind: "crashed", code: 6, name: "SIGABRT"}, code: 134},
		{name: "killed", in: "signaled 9", want: crashStatus{kind: "signaled", code: 9}, code: 137},
		{name: "error", in: "error no gdb in the sandbox", want: crashStatus{kind: "error", name: "no gdb in the sandbox"}},
		{name: "term is no crash", in: "crashed 15 SIGTERM", wantErr: true},
		{name: "exit out of range", in: "exited 300", wantErr: true},
		{name: "signal zero", in: "signaled 0", wantErr: true},
		{name: "garbage", in: "hello", wantErr: true},
		{name: "empty", in: "", wantErr: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := parseCrashStatus(tc.in)
			if tc.wantErr {
				if err == nil {
					t.Fatalf("got %+v, want an error", got)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got != tc.want {
				t.Errorf("got %+v, want %+v", got, tc.want)
			}
			if got.kind != "error" && got.exitCode() != tc.code {
				t.Errorf("exit code %d, want %d", got.exitCode(), tc.code)
			}
		})
	}
}

func TestIsFatalSignal(t *testing.T) {
	for sig, want := range map[syscall.Signal]bool{
		syscall.SIGSEGV: true, syscall.SIGABRT: true, syscall.SIGBUS: true, syscall.SIGFPE: true, syscall.SIGILL: true,
		syscall.SIGTERM: false, syscall.SIGKILL: false, syscall.SIGPIPE: false, syscall.SIGINT: false, syscall.SIGTRAP: false,
	} {
		if got := IsFatalSignal(sig); got != want {
			t.Errorf("IsFatalSignal(%v) = %v, want %v", sig, got, want)
		}
	}
}

func TestCrashDir(t *testing.T) {
	if got, want := CrashDir("", "ex_abc"), "sbx-crash-ex_abc"; got != want {
		t.Errorf("got %q, want %q", got, want)
	}
	if got, want := CrashDir("/tmp/x", "ex_abc"), "/tmp/x"; got != want {
		t.Errorf("got %q, want %q", got, want)
	}
}

func TestStripFirst(t *testing.T) {
	for in, want := range map[string]string{
		"bundle/":                    "",
		"bundle":                     "",
		"bundle/core":                "core",
		"./bundle/files/lib/libc.so": "files/lib/libc.so",
		"bundle/../../etc/passwd":    "passwd",
	} {
		if got := stripFirst(in); got != want {
			t.Errorf("stripFirst(%q) = %q, want %q", in, got, want)
		}
	}
}

func note(bo binary.AppendByteOrder, name string, typ uint32, desc []byte) []byte {
	b := bo.AppendUint32(nil, uint32(len(name)+1))
	b = bo.AppendUint32(b, uint32(len(desc)))
	b = bo.AppendUint32(b, typ)
	n := append([]byte(name), 0)
	for len(n)%4 != 0 {
		n = append(n, 0)
	}
	b = append(b, n...)
	d := append([]byte(nil), desc...)
	for len(d)%4 != 0 {
		d = append(d, 0)
	}
	return append(b, d...)
}

func TestNoteBuildID(t *testing.T) {
	bo := binary.LittleEndian
	id := []byte{0xde, 0xad, 0xbe, 0xef, 0x01}
	for _, tc := range []struct {
		name string
		in   []byte
		want string
	}{
		{name: "alone", in: note(bo, "GNU", 3, id), want: "deadbeef01"},
		{name: "after ABI tag", in: append(note(bo, "GNU", 1, []byte{0, 0, 0, 0, 3, 0, 0, 0}), note(bo, "GNU", 3, id)...), want: "deadbeef01"},
		{name: "Go build id is not it", in: note(bo, "Go", 4, []byte("abc")), want: ""},
		{name: "truncated", in: note(bo, "GNU", 3, id)[:14], want: ""},
		{name: "empty", in: nil, want: ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := noteBuildID(tc.in, bo); got != tc.want {
				t.Errorf("got %q, want %q", got, tc.want)
			}
		})
	}
	if got := ELFBuildID([]byte("not an elf")); got != "" {
		t.Errorf("ELFBuildID(junk) = %q, want empty", got)
	}
}

func TestMatchBuildIDs(t *testing.T) {
	want := parseBuildIDs("aa /work/crash\nbb /lib/libc.so.6\n- /lib/nobid.so\n\n")
	got := matchBuildIDs(want, map[string]string{
		"/work/crash":    "aa",
		"/lib/libc.so.6": "cc",
		"/lib/nobid.so":  "",
		"/lib/extra.so":  "dd",
	})
	exp := []CrashFile{
		{Path: "/lib/extra.so", BuildID: "dd", Match: "unknown"},
		{Path: "/lib/libc.so.6", BuildID: "cc", Match: "mismatch"},
		{Path: "/lib/nobid.so", Match: "unknown"},
		{Path: "/work/crash", BuildID: "aa", Match: "ok"},
	}
	if d := cmp.Diff(exp, got); d != "" {
		t.Errorf("(-want +got)\n%s", d)
	}
}
