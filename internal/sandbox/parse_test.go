package sandbox

import (
	"errors"
	"strings"
	"testing"

	"sbx.dev/sbx/api"
)

func TestValidName(t *testing.T) {
	tests := []struct {
		name string
		ok   bool
	}{
		{"web", true},
		{"a.b_c-d9", true},
		{strings.Repeat("x", 63), true},
		{strings.Repeat("x", 64), false},
		{"", false},
		{"-lead", false},
		{"has space", false},
		{"sb_looksl1ke", false},
		{"ünï", false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := ValidName(tc.name)
			if (err == nil) != tc.ok {
				t.Errorf("ValidName(%q) = %v, want ok=%v", tc.name, err, tc.ok)
			}
			if err != nil && !errors.Is(err, api.ErrInvalid) {
				t.Errorf("error %v is not ErrInvalid", err)
			}
		})
	}
}

func TestParseSize(t *testing.T) {
	tests := []struct {
		in   string
		want int64
		ok   bool
	}{
		{"", 0, true},
		{"4096", 4096, true},
		{"512M", 512 << 20, true},
		{"512m", 512 << 20, true},
		{"1G", 1 << 30, true},
		{"1GiB", 1 << 30, true},
		{"1.5g", 3 << 29, true},
		{"2 GB", 2 << 30, true},
		{"lots", 0, false},
		{"-1G", 0, false},
		{"1P", 0, false},
		{"99999999T", 0, false},
	}
	for _, tc := range tests {
		t.Run(tc.in, func(t *testing.T) {
			got, err := ParseSize("memory", tc.in)
			if (err == nil) != tc.ok || got != tc.want {
				t.Errorf("ParseSize(%q) = %d, %v; want %d ok=%v", tc.in, got, err, tc.want, tc.ok)
			}
			if err != nil && !strings.HasPrefix(err.Error(), "memory: ") {
				t.Errorf("error %q does not name the field", err)
			}
		})
	}
}

func TestMemoryLimitAgainstTheHost(t *testing.T) {
	const host = 24 << 30
	tests := []struct {
		name  string
		asked string
		total int64
		ok    bool
	}{
		{"unset", "", host, true},
		{"fits", "1G", host, true},
		{"all of it", "24G", host, true},
		{"more than the host", "100T", host, false},
		{"just over", "25G", host, false},
		{"host unknown", "100T", 0, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			mem, err := ParseSize("memory", tc.asked)
			if err != nil {
				t.Fatal(err)
			}
			_, _, _, err = DefaultLimits.resolve(mem, 0, 0, tc.total)
			if (err == nil) != tc.ok {
				t.Fatalf("memory %q against the host: %v, want ok=%v", tc.asked, err, tc.ok)
			}
			if err != nil && (!errors.Is(err, api.ErrInvalid) || !strings.Contains(err.Error(), "24.0 GiB") || !strings.HasPrefix(err.Error(), "memory: ")) {
				t.Errorf("error %q: want ErrInvalid naming the field and what the host has", err)
			}
		})
	}
}

func TestHostMemory(t *testing.T) {
	// this machine has a /proc/meminfo: anything less than 64 MiB is a misread
	if got := hostMemory(); got < 64<<20 {
		t.Errorf("hostMemory() = %d, want the machine's memory", got)
	}
}

func TestNewID(t *testing.T) {
	seen := map[string]bool{}
	for i := 0; i < 1000; i++ {
		id := newID("sb_")
		if len(id) != 13 || strings.Trim(id[3:], "abcdefghijklmnopqrstuvwxyz234567") != "" {
			t.Fatalf("id %q is not sb_ + 10 lowercase base32 characters", id)
		}
		if seen[id] {
			t.Fatalf("id %q twice", id)
		}
		seen[id] = true
	}
}

// TestMergeMetaDropsTheFleetsObject: a fork's children keep the parent's
// meta but for the fleet's object, which names the parent's own Sandbox
// object (a child mirrored into it would take the parent's place).
func TestMergeMetaDropsTheFleetsObject(t *testing.T) {
	parent := map[string]string{"team": "a", api.MetaObject: "web"}
	for _, fork := range []map[string]string{nil, {"run": "1"}} {
		got, err := mergeMeta(parent, fork)
		if err != nil {
			t.Fatal(err)
		}
		if _, ok := got[api.MetaObject]; ok || got["team"] != "a" {
			t.Errorf("mergeMeta(%v, %v) = %v, want team kept and %s dropped", parent, fork, got, api.MetaObject)
		}
	}
	if parent[api.MetaObject] != "web" {
		t.Error("mergeMeta changed the parent's meta")
	}
	// nor its uid (the parent's object's, no child's)
	parent = map[string]string{"team": "a", api.MetaObject: "web", api.MetaObjectUID: "uid-web"}
	got, err := mergeMeta(parent, map[string]string{"run": "1"})
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := got[api.MetaObjectUID]; ok || got["team"] != "a" || got["run"] != "1" {
		t.Errorf("mergeMeta(%v) = %v, want %s dropped too", parent, got, api.MetaObjectUID)
	}
	if parent[api.MetaObjectUID] != "uid-web" {
		t.Error("mergeMeta changed the parent's meta")
	}
}
