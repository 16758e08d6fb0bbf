// Package procfs reads what sbx needs of /proc: a process's state, parent
// and start time from /proc/PID/stat.
package procfs

import (
	"fmt"
	"os"
	"strconv"
	"strings"
)

// Stat is what /proc/PID/stat says of a process.
type Stat struct {
	Pid   int
	Comm  string // its command name, without the parentheses
	State byte   // R, S, D, T, t, Z, X, ...
	PPid  int
	// Start is its start time in clock ticks since boot, as /proc writes
	// it: with the pid, it names one process for as long as the host runs.
	Start string
}

// Gone reports whether the process has ended: a zombie or dead.
func (s Stat) Gone() bool { return s.State == 'Z' || s.State == 'X' }

// ReadStat reads /proc/PID/stat; a process that is not there is an error
// wrapping os.ErrNotExist.
func ReadStat(pid int) (Stat, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return Stat{}, err
	}
	st, err := ParseStat(string(b))
	if err != nil {
		return Stat{}, fmt.Errorf("/proc/%d/stat: %w", pid, err)
	}
	return st, nil
}

// ParseStat reads the text of a /proc/PID/stat. The command name, in
// parentheses, may itself hold spaces and ')': the fields are those after
// the last ')'.
func ParseStat(s string) (Stat, error) {
	open, shut := strings.IndexByte(s, '('), strings.LastIndexByte(s, ')')
	if open < 0 || shut < open {
		return Stat{}, fmt.Errorf("no command name in %q", trim(s))
	}
	pid, err := strconv.Atoi(strings.TrimSpace(s[:open]))
	if err != nil {
		return Stat{}, fmt.Errorf("pid of %q: %w", trim(s), err)
	}
	f := strings.Fields(s[shut+1:])
	// state (3), ppid (4), ..., starttime (22): f[0], f[1], f[19]
	if len(f) < 20 || len(f[0]) != 1 {
		return Stat{}, fmt.Errorf("too few fields in %q", trim(s))
	}
	ppid, err := strconv.Atoi(f[1])
	if err != nil {
		return Stat{}, fmt.Errorf("ppid of %q: %w", trim(s), err)
	}
	return Stat{Pid: pid, Comm: s[open+1 : shut], State: f[0][0], PPid: ppid, Start: f[19]}, nil
}

func trim(s string) string {
	if len(s) > 80 {
		return s[:80] + "..."
	}
	return s
}
