package client

import (
	"syscall"
	"testing"
	"time"

	"sbx.dev/sbx/internal/wire/freezewire"
)

func TestCrashOf(t *testing.T) {
	c := Crash{Pid: 40, Pgid: 30, Ancestors: []int{35, 30, 20, 1}}
	for _, tc := range []struct {
		name string
		pid  int
		want bool
	}{
		{"the process itself", 40, true},
		{"its parent", 35, true},
		{"its group's leader", 30, true},
		{"a grandparent", 20, true},
		{"another exec", 41, false},
		{"unknown pid", 0, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := c.Of(tc.pid); got != tc.want {
				t.Errorf("Of(%d) = %v, want %v", tc.pid, got, tc.want)
			}
		})
	}
}

func TestCoreSignal(t *testing.T) {
	for _, tc := range []struct {
		code int
		sig  syscall.Signal
		ok   bool
	}{
		{139, syscall.SIGSEGV, true},
		{134, syscall.SIGABRT, true},
		{-11, syscall.SIGSEGV, true},
		{135, syscall.SIGBUS, true},
		{133, syscall.SIGTRAP, true},
		{0, 0, false},
		{1, 0, false},
		{128, 0, false},
		{137, 0, false}, // SIGKILL dumps no core
		{143, 0, false}, // SIGTERM
		{124, 0, false}, // a timeout
		{255, 0, false},
	} {
		sig, ok := coreSignal(tc.code)
		if sig != tc.sig || ok != tc.ok {
			t.Errorf("coreSignal(%d) = %v %v, want %v %v", tc.code, sig, ok, tc.sig, tc.ok)
		}
	}
}

func TestFreezeRecordOfExec(t *testing.T) {
	t0 := time.Date(2026, 12, 1, 20, 0, 0, 0, time.UTC)
	res := &Result{Pid: 30, StartedAt: t0, EndedAt: t0.Add(time.Minute)}
	rec := func(pid int, at time.Time, anc ...int) freezewire.Record {
		r := freezewire.Record{Name: "crash-1", Pid: pid, FailedAt: at}
		r.Crash = &freezewire.Crash{Signal: "SIGSEGV", Ancestors: anc}
		return r
	}
	for _, tc := range []struct {
		name string
		rec  freezewire.Record
		res  *Result
		want bool
	}{
		{"the command", rec(30, t0.Add(time.Second)), res, true},
		{"a grandchild", rec(44, t0.Add(time.Second), 40, 30, 1), res, true},
		{"another process", rec(44, t0.Add(time.Second), 40, 1), res, false},
		{"before the exec (an earlier crash)", rec(30, t0.Add(-time.Minute)), res, false},
		{"after the exec", rec(30, t0.Add(2*time.Minute)), res, false},
		{"a freeze, no crash", freezewire.Record{Name: "f", Pid: 30, FailedAt: t0.Add(time.Second)}, res, false},
		{"no pid known: by time", rec(44, t0.Add(time.Second)), &Result{StartedAt: t0, EndedAt: t0.Add(time.Minute)}, true},
		{"no time", rec(30, time.Time{}), res, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := ofExec(tc.rec, tc.res); got != tc.want {
				t.Errorf("got %v, want %v", got, tc.want)
			}
		})
	}
}
