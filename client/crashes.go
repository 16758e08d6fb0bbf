package client

import (
	"context"
	"encoding/json"
	"time"

	"sbx.dev/sbx/api"
)

// Crashes lists the crashes caught in the sandbox, oldest first: each one a
// process held at its faulting instruction in a freeze of the sandbox (its
// Snapshot), from the sandbox's "frozen" events. A deleted sandbox's are
// listed too. Backtrace is not filled in: it is read in a copy (package
// flaky's Backtrace).
func (s *Sandbox) Crashes(ctx context.Context) ([]api.Crash, error) {
	out := []api.Crash{}
	err := s.Events(ctx, func(ev api.Event) error {
		if c, ok := crashOf(ev); ok {
			out = append(out, c)
		}
		return nil
	})
	return out, err
}

// crashOf reads a crash from a frozen event whose freeze caught one.
func crashOf(ev api.Event) (api.Crash, bool) {
	if ev.Type != "frozen" || ev.Detail["crash"] == nil || ev.Detail["outcome"] != "ok" {
		return api.Crash{}, false
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
		} `json:"crash"`
	}
	b, err := json.Marshal(ev.Detail)
	if err != nil || json.Unmarshal(b, &d) != nil || d.Name == "" || d.Pid <= 0 {
		return api.Crash{}, false
	}
	at := d.FailedAt
	if at.IsZero() {
		at = ev.Time
	}
	return api.Crash{Pid: d.Pid, Tid: d.Crash.Tid, Exe: d.Crash.Exe, Cmd: d.Cmd, Signal: d.Crash.Signal,
		FaultAddr: d.Crash.FaultAddr, IP: d.Crash.IP, At: at, Snapshot: d.Name, Count: d.Crash.Count}, true
}
