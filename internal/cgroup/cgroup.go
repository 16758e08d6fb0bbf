// Package cgroup reads and removes the cgroups runsc makes for each sandbox,
// on cgroup v1 (one hierarchy per controller), v2 (one unified hierarchy) or
// a hybrid of both.
//
// It writes no limits: runsc sets them from the OCI spec's resources
// (internal/runsc/spec.go), and a second writer would fight it.
package cgroup

import (
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// Root is the directory the cgroup hierarchies are mounted under: on v1 a
// directory per controller (memory/, cpuacct/, pids/ ...), on v2 the
// unified hierarchy itself.
type Root string

// Host is the host's cgroup root.
const Host Root = "/sys/fs/cgroup"

// Parent is the cgroup, below each hierarchy's root, holding the sandboxes
// of the daemon tagged tag.
func Parent(tag string) string { return "/sbx-" + tag }

// Path is the cgroup, below each hierarchy's root, of sandbox id of the
// daemon tagged tag: the OCI spec's cgroupsPath, where runsc puts the
// sandbox and its gofer.
func Path(tag, id string) string { return Parent(tag) + "/" + id }

// Group is one cgroup path in every hierarchy under a root.
type Group struct {
	root Root
	path string
}

// Group is the cgroup at path (as Path gives it) under r.
func (r Root) Group(path string) Group { return Group{root: r, path: path} }

// v1 is the file of controller ctrl's hierarchy; v2 that of the unified one.
func (g Group) v1(ctrl, file string) string {
	return filepath.Join(string(g.root), ctrl, g.path, file)
}
func (g Group) v2(file string) string { return filepath.Join(string(g.root), g.path, file) }

// MemoryCurrent is the memory the group uses now, in bytes; false when
// the group or its memory controller is not there.
func (g Group) MemoryCurrent() (int64, bool) {
	return firstInt(g.v1("memory", "memory.usage_in_bytes"), g.v2("memory.current"))
}

// MemoryMax is the group's memory limit in bytes; a group without one
// reads math.MaxInt64 on v2 ("max"), and v1's page-rounded near-maximum.
func (g Group) MemoryMax() (int64, bool) {
	return firstInt(g.v1("memory", "memory.limit_in_bytes"), g.v2("memory.max"))
}

// MemoryPeak is the most memory the group has used, in bytes (v2 kernels
// before 5.19 have no memory.peak: false).
func (g Group) MemoryPeak() (int64, bool) {
	return firstInt(g.v1("memory", "memory.max_usage_in_bytes"), g.v2("memory.peak"))
}

// CPUUsage is the CPU time the group's processes have used.
func (g Group) CPUUsage() (time.Duration, bool) {
	if ns, ok := readInt(g.v1("cpuacct", "cpuacct.usage")); ok {
		return time.Duration(ns), true
	}
	if us, ok := readKey(g.v2("cpu.stat"), "usage_usec"); ok {
		return time.Duration(us) * time.Microsecond, true
	}
	return 0, false
}

// OOMKilled reports whether the kernel's OOM killer has killed a process
// of the group.
func (g Group) OOMKilled() bool {
	for _, f := range []string{g.v1("memory", "memory.oom_control"), g.v2("memory.events")} {
		if _, err := os.Stat(f); err == nil {
			n, _ := readKey(f, "oom_kill")
			return n > 0
		}
	}
	return false
}

// Pids lists the processes (cgroup.procs) and threads (v1's tasks) in the
// group, in every hierarchy, each once. It includes zombies.
func (g Group) Pids() []int {
	seen := map[int]bool{}
	var pids []int
	for _, dir := range g.dirs() {
		for _, f := range []string{"cgroup.procs", "tasks"} {
			b, err := os.ReadFile(filepath.Join(dir, f))
			if err != nil {
				continue
			}
			for _, l := range strings.Fields(string(b)) {
				pid, err := strconv.Atoi(l)
				if err != nil || seen[pid] {
					continue
				}
				seen[pid] = true
				pids = append(pids, pid)
			}
		}
	}
	return pids
}

// Children lists the names of the groups directly below g, in any
// hierarchy, each once.
func (g Group) Children() []string {
	seen := map[string]bool{}
	var names []string
	for _, dir := range g.dirs() {
		ents, _ := os.ReadDir(dir)
		for _, e := range ents {
			if e.IsDir() && !seen[e.Name()] {
				seen[e.Name()] = true
				names = append(names, e.Name())
			}
		}
	}
	return names
}

// Remove removes the group from every hierarchy where it is empty. While a
// process or a child group remains the kernel refuses, and a group not
// there is already removed: Remove is best effort and says nothing.
func (g Group) Remove() {
	for _, dir := range g.dirs() {
		_ = syscall.Rmdir(dir)
	}
}

// dirs are the group's directories in every hierarchy: one per v1
// controller directory under the root, and the v2 one (the root itself).
func (g Group) dirs() []string {
	dirs := []string{g.v2("")}
	ents, _ := os.ReadDir(string(g.root))
	for _, e := range ents {
		if e.IsDir() {
			dirs = append(dirs, g.v1(e.Name(), ""))
		}
	}
	return dirs
}

// firstInt is the number in the first of files that can be read.
func firstInt(files ...string) (int64, bool) {
	for _, f := range files {
		if n, ok := readInt(f); ok {
			return n, true
		}
	}
	return 0, false
}

// readInt reads a file holding one number, or "max" (math.MaxInt64).
func readInt(file string) (int64, bool) {
	b, err := os.ReadFile(file)
	if err != nil {
		return 0, false
	}
	s := strings.TrimSpace(string(b))
	if s == "max" {
		return math.MaxInt64, true
	}
	n, err := strconv.ParseInt(s, 10, 64)
	return n, err == nil
}

// readKey reads the number of key in a flat-keyed file ("key value" lines,
// as cpu.stat, memory.events and memory.oom_control are).
func readKey(file, key string) (int64, bool) {
	b, err := os.ReadFile(file)
	if err != nil {
		return 0, false
	}
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) == 2 && f[0] == key {
			n, err := strconv.ParseInt(f[1], 10, 64)
			return n, err == nil
		}
	}
	return 0, false
}
