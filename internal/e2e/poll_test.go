package e2e

import (
	"context"
	"os/exec"
	"strings"
	"time"
)

// pollUntil polls cond until it holds or limit passes, and says which. It
// fails nothing: the check after it judges, as it judged after the sleep
// that pollUntil replaces (a signal delivered, processes gone, output
// begun), which now ends as soon as what it waited for has happened.
// waitFor (harness_test.go) is for a wait whose timeout is itself a
// failure.
func pollUntil(limit time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(limit)
	for {
		if cond() {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(100 * time.Millisecond) // the poll's interval
	}
}

// listening says whether something in sandbox id listens on TCP port
// (over IPv4 or IPv6: busybox's servers listen on tcp6).
func listening(d *daemon, id string, port int) func() bool {
	return func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		ps, err := sdk(d.client).Ports(ctx, id)
		for _, p := range ps {
			if err == nil && strings.HasPrefix(p.Proto, "tcp") && p.Port == port {
				return true
			}
		}
		return false
	}
}

// cmdDeadline kills cmd, a started process, if it is still running after
// limit, and fails the test saying what hung: every wait on a process or
// on its pipes then ends (a read of its output sees EOF, its Wait
// returns). Call the returned stop once the process is waited for.
func cmdDeadline(t testingT, cmd *exec.Cmd, limit time.Duration, what string) (stop func()) {
	timer := time.AfterFunc(limit, func() {
		t.Errorf("%s: still running after %s; killed", what, limit)
		if cmd.Process != nil {
			_ = cmd.Process.Kill()
		}
	})
	return func() { timer.Stop() }
}

// testingT is what cmdDeadline needs of a *testing.T (Errorf is safe from
// any goroutine).
type testingT interface {
	Errorf(format string, args ...any)
}
