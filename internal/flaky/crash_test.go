package flaky

import (
	"encoding/binary"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"sbx.dev/sbx/client"
)

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

func TestHuntCrash(t *testing.T) {
	t0 := time.Date(2026, 12, 1, 20, 0, 0, 0, time.UTC)
	a := client.Crash{Pid: 10, Snapshot: "a", At: t0}
	b := client.Crash{Pid: 20, Snapshot: "b", At: t0.Add(time.Minute)}
	for _, tc := range []struct {
		name     string
		crs      []client.Crash
		failedAt time.Time
		want     string // snapshot, "" for none
	}{
		{"none", nil, t0, ""},
		{"failure time unknown: the last", []client.Crash{a, b}, time.Time{}, "b"},
		{"the last before the failure", []client.Crash{a, b}, t0.Add(30 * time.Second), "a"},
		{"within the slack", []client.Crash{a, b}, t0.Add(time.Minute - time.Second), "b"},
		{"all after the failure", []client.Crash{b}, t0, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, ok := huntCrash(tc.crs, tc.failedAt)
			if ok != (tc.want != "") || got.Snapshot != tc.want {
				t.Errorf("got %q %v, want %q", got.Snapshot, ok, tc.want)
			}
		})
	}
}
