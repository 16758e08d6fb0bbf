package client

import (
	"context"
	"encoding/json"
	"slices"
	"time"

	"sbx.dev/sbx/api"
)

// Crash is a crash caught in a sandbox: a process that got a signal whose
// default action dumps core, held at its faulting instruction while the
// sandbox was frozen as Snapshot. In a copy resumed from Snapshot
// (`sbx new --from`), process Pid is still stopped there, its signal
// pending, for `gdb -p`. What it says of the process is the sandbox's word.
type Crash struct {
	Pid       int       `json:"pid"`
	Tid       int       `json:"tid,omitempty"`
	Exe       string    `json:"exe,omitempty"`
	Cmd       string    `json:"cmd,omitempty"`
	Signal    string    `json:"signal"`
	FaultAddr string    `json:"faultAddr,omitempty"`
	IP        string    `json:"ip,omitempty"`
	At        time.Time `json:"at"`
	Snapshot  string    `json:"snapshot"`
	// Count is how many crashes the sandbox had in that boot when this one
	// was caught (one is caught per boot: the others end at once).
	Count int `json:"count,omitempty"`
	// Backtrace is the faulting thread's stack, read by gdb in a copy.
	Backtrace string `json:"backtrace,omitempty"`
	// Pgid is the process's group and Ancestors its parent, the parent's
	// parent and so on (the sandbox's word, as all of it): they tell which
	// exec it came from (Of).
	Pgid      int   `json:"pgid,omitempty"`
	Ancestors []int `json:"ancestors,omitempty"`
}

// Of reports whether the crash was of the process pid or of one it started
// (a child, a grandchild, or a process of its group that outlived its
// parent). An exec's pid leads its own process group.
func (c Crash) Of(pid int) bool {
	if pid <= 0 {
		return false
	}
	return c.Pid == pid || c.Pgid == pid || slices.Contains(c.Ancestors, pid)
}

// Crashes lists the crashes caught in the sandbox, oldest first: each one a
// process held at its faulting instruction in a freeze of the sandbox (its
// Snapshot), from the sandbox's "frozen" events. A deleted sandbox's are
// listed too. Backtrace is not filled in: it is read in a copy (package
// flaky's Backtrace).
func (s *Sandbox) Crashes(ctx context.Context) ([]Crash, error) {
	out := []Crash{}
	err := s.Events(ctx, func(ev api.Event) error {
		if c, ok := crashOf(ev); ok {
			out = append(out, c)
		}
		return nil
	})
	return out, err
}

// crashOf reads a crash from a frozen event whose freeze caught one.
func crashOf(ev api.Event) (Crash, bool) {
	if ev.Type != "frozen" || ev.Detail["crash"] == nil || ev.Detail["outcome"] != "ok" {
		return Crash{}, false
	}
	var d struct {
		Name     string    `json:"name"`
		Pid      int       `json:"pid"`
		Cmd      string    `json:"cmd"`
		FailedAt time.Time `json:"failedAt"`
		Crash    struct {
			Signal    string `json:"signal"`
			Tid       int    `json:"tid"`
			FaultAddr string `json:"faultAddr"`
			IP        string `json:"ip"`
			Exe       string `json:"exe"`
			Count     int    `json:"count"`
			Pgid      int    `json:"pgid"`
			Ancestors []int  `json:"ancestors"`
		} `json:"crash"`
	}
	b, err := json.Marshal(ev.Detail)
	if err != nil || json.Unmarshal(b, &d) != nil || d.Name == "" || d.Pid <= 0 {
		return Crash{}, false
	}
	at := d.FailedAt
	if at.IsZero() {
		at = ev.Time
	}
	return Crash{Pid: d.Pid, Tid: d.Crash.Tid, Exe: d.Crash.Exe, Cmd: d.Cmd, Signal: d.Crash.Signal,
		FaultAddr: d.Crash.FaultAddr, IP: d.Crash.IP, At: at, Snapshot: d.Name, Count: d.Crash.Count,
		Pgid: d.Crash.Pgid, Ancestors: d.Crash.Ancestors}, true
}
