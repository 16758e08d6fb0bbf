package cgroup

import (
	"math"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"
)

const sandbox = "/sbx-t1/sb_a"

// fakeRoot lays files (path below the root: content) in a new root.
func fakeRoot(t *testing.T, files map[string]string) Root {
	t.Helper()
	root := t.TempDir()
	for name, content := range files {
		p := filepath.Join(root, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return Root(root)
}

func TestPath(t *testing.T) {
	if got, want := Path("t1", "sb_a"), sandbox; got != want {
		t.Errorf("Path: got %q, want %q", got, want)
	}
	if got, want := Parent("t1"), "/sbx-t1"; got != want {
		t.Errorf("Parent: got %q, want %q", got, want)
	}
}

func TestReads(t *testing.T) {
	type reading struct {
		ok bool
		n  int64
	}
	for _, tc := range []struct {
		name  string
		files map[string]string
		read  func(Group) (int64, bool)
		want  reading
	}{
		{"memory current v1", map[string]string{"memory" + sandbox + "/memory.usage_in_bytes": "4096\n"}, Group.MemoryCurrent, reading{true, 4096}},
		{"memory current v2", map[string]string{sandbox + "/memory.current": "8192\n"}, Group.MemoryCurrent, reading{true, 8192}},
		{"memory current v1 before v2", map[string]string{"memory" + sandbox + "/memory.usage_in_bytes": "1\n", sandbox + "/memory.current": "2\n"}, Group.MemoryCurrent, reading{true, 1}},
		{"memory current missing", nil, Group.MemoryCurrent, reading{false, 0}},
		{"memory current garbage", map[string]string{sandbox + "/memory.current": "lots\n"}, Group.MemoryCurrent, reading{false, 0}},
		{"memory max v1", map[string]string{"memory" + sandbox + "/memory.limit_in_bytes": "2147483648\n"}, Group.MemoryMax, reading{true, 2 << 30}},
		{"memory max v2", map[string]string{sandbox + "/memory.max": "1073741824\n"}, Group.MemoryMax, reading{true, 1 << 30}},
		{"memory max v2 unlimited", map[string]string{sandbox + "/memory.max": "max\n"}, Group.MemoryMax, reading{true, math.MaxInt64}},
		{"memory peak v1", map[string]string{"memory" + sandbox + "/memory.max_usage_in_bytes": "12345\n"}, Group.MemoryPeak, reading{true, 12345}},
		{"memory peak v2", map[string]string{sandbox + "/memory.peak": "54321\n"}, Group.MemoryPeak, reading{true, 54321}},
		{"memory peak old v2 kernel", map[string]string{sandbox + "/memory.current": "1\n"}, Group.MemoryPeak, reading{false, 0}},
		{"cpu v1", map[string]string{"cpuacct" + sandbox + "/cpuacct.usage": "1500000000\n"}, cpuNanos, reading{true, 1500000000}},
		{"cpu v2", map[string]string{sandbox + "/cpu.stat": "usage_usec 2500000\nuser_usec 2000000\nsystem_usec 500000\n"}, cpuNanos, reading{true, 2500000000}},
		{"cpu v2 no usage", map[string]string{sandbox + "/cpu.stat": "user_usec 2000000\n"}, cpuNanos, reading{false, 0}},
		{"cpu missing", nil, cpuNanos, reading{false, 0}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n, ok := tc.read(fakeRoot(t, tc.files).Group(sandbox))
			if got := (reading{ok, n}); got != tc.want {
				t.Errorf("got %+v, want %+v", got, tc.want)
			}
		})
	}
}

func cpuNanos(g Group) (int64, bool) {
	d, ok := g.CPUUsage()
	return int64(d / time.Nanosecond), ok
}

func TestOOMKilled(t *testing.T) {
	for _, tc := range []struct {
		name  string
		files map[string]string
		want  bool
	}{
		{"v1 killed", map[string]string{"memory" + sandbox + "/memory.oom_control": "oom_kill_disable 0\nunder_oom 0\noom_kill 1\n"}, true},
		{"v1 not killed", map[string]string{"memory" + sandbox + "/memory.oom_control": "oom_kill_disable 0\nunder_oom 0\noom_kill 0\n"}, false},
		{"v2 killed", map[string]string{sandbox + "/memory.events": "low 0\nhigh 0\nmax 3\noom 1\noom_kill 2\n"}, true},
		{"v2 oom without a kill", map[string]string{sandbox + "/memory.events": "low 0\nhigh 0\nmax 3\noom 1\noom_kill 0\n"}, false},
		// v1 answers first, as a hybrid host's memory controller is v1's
		{"v1 before v2", map[string]string{"memory" + sandbox + "/memory.oom_control": "oom_kill 0\n", sandbox + "/memory.events": "oom_kill 1\n"}, false},
		{"no group", nil, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := fakeRoot(t, tc.files).Group(sandbox).OOMKilled(); got != tc.want {
				t.Errorf("got %v, want %v", got, tc.want)
			}
		})
	}
}

func TestPids(t *testing.T) {
	for _, tc := range []struct {
		name  string
		files map[string]string
		want  []int
	}{
		{"v1 controllers, each pid once", map[string]string{
			"memory" + sandbox + "/cgroup.procs":  "10\n11\n",
			"memory" + sandbox + "/tasks":         "10\n11\n12\n",
			"pids" + sandbox + "/cgroup.procs":    "11\n13\n",
			"unified" + sandbox + "/cgroup.procs": "10\n",
		}, []int{10, 11, 12, 13}},
		{"v2", map[string]string{sandbox + "/cgroup.procs": "7\n8\n"}, []int{7, 8}},
		{"garbage left out", map[string]string{sandbox + "/cgroup.procs": "7\nx\n9\n"}, []int{7, 9}},
		{"empty", map[string]string{sandbox + "/cgroup.procs": ""}, nil},
		{"no group", nil, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := fakeRoot(t, tc.files).Group(sandbox).Pids()
			slices.Sort(got)
			if !slices.Equal(got, tc.want) {
				t.Errorf("got %v, want %v", got, tc.want)
			}
		})
	}
}

func TestChildren(t *testing.T) {
	r := fakeRoot(t, map[string]string{
		"memory/sbx-t1/sb_a/cgroup.procs":  "",
		"memory/sbx-t1/sb_b/cgroup.procs":  "",
		"memory/sbx-t1/cgroup.procs":       "",
		"cpu/sbx-t1/sb_a/cgroup.procs":     "",
		"pids/sbx-t1/sb_c/cgroup.procs":    "",
		"memory/sbx-t2/sb_x/cgroup.procs":  "",
		"sbx-t1/sb_d/cgroup.procs":         "", // v2
		"memory/sbx-t1/sb_b/child/x.procs": "",
	})
	got := r.Group(Parent("t1")).Children()
	slices.Sort(got)
	if want := []string{"sb_a", "sb_b", "sb_c", "sb_d"}; !slices.Equal(got, want) {
		t.Errorf("got %v, want %v", got, want)
	}
	if got := r.Group(Parent("t3")).Children(); len(got) != 0 {
		t.Errorf("no parent: got %v, want none", got)
	}
}

func TestRemove(t *testing.T) {
	root := t.TempDir()
	for _, d := range []string{"memory" + sandbox, "pids" + sandbox, "cpu/sbx-t1", sandbox, "memory/sbx-t1/sb_b"} {
		if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	// a group holding something (here a file; in cgroupfs a process) stays
	if err := os.WriteFile(filepath.Join(root, "pids", sandbox, "cgroup.procs"), []byte("1\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	r := Root(root)
	r.Group(sandbox).Remove()
	r.Group(Parent("t1")).Remove()
	for _, tc := range []struct {
		dir  string
		want bool
	}{
		{"memory" + sandbox, false},
		{sandbox, false},
		{"pids" + sandbox, true},
		{"cpu/sbx-t1", false},
		{"memory/sbx-t1", true}, // sb_b is in it
		{"memory/sbx-t1/sb_b", true},
	} {
		_, err := os.Stat(filepath.Join(root, tc.dir))
		if got := err == nil; got != tc.want {
			t.Errorf("%s there: got %v, want %v", tc.dir, got, tc.want)
		}
	}
}
