// Package freeze freezes the sbx sandbox a Go test runs in at the test's
// failure, before its fixtures are torn down: the whole machine, the test
// process itself included (blocked in its cleanup, its failing frame on the
// stack), becomes a named snapshot with memory that `sbx new --from NAME`
// resumes. Outside an sbx sandbox it does nothing.
//
//	func TestLogin(t *testing.T) {
//		srv := startServer(t)  // its teardown is a t.Cleanup
//		freeze.OnFailure(t)    // after the fixtures to keep: cleanups run last first
//		...
//		if got != want {
//			t.Fatalf("login: got %v, want %v", got, want)
//		}
//	}
//
// In the original the test goes on as it would have (its cleanups, the
// failure reported). In a copy resumed from the freeze, the test process
// holds in its cleanup for good, its fixtures alive, to be looked at (gdb:
// its goroutine's stack shows the failing test's frame, at the failing line
// when it failed with t.Fatal, t.FailNow or t.Skip's kin).
//
// In a copy, the freeze command holds and the test goroutine waits for it
// in a system call, so that its stack is on a thread gdb shows
// (`thread apply all bt`: the test's frame, under testing's cleanup).
//
// The test binary's own timeout (-test.timeout, 10m by default) still runs
// in a copy: run it with -test.timeout=0 to keep a copy as long as needed.
package freeze

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"sync"
	"testing"
	"time"
)

// Command is the freeze command inside every sbx sandbox (a variable for
// tests).
var Command = "/.sbx/freeze"

// exitCopy is the freeze command's exit code in a copy resumed from the
// freeze, should it return there (it holds).
const exitCopy = 3

var once sync.Once

// OnFailure freezes the sandbox when t has failed, once t's function has
// returned (or called t.FailNow), before the cleanups registered before
// it: only the first failing test of the process freezes. It logs where
// the freeze went.
func OnFailure(t testing.TB) {
	t.Helper()
	if _, err := os.Stat(Command); err != nil || os.Getenv("SBX_FREEZE") == "0" {
		return // not in an sbx sandbox
	}
	t.Cleanup(func() {
		if !t.Failed() {
			return
		}
		once.Do(func() {
			name, err := Now(t.Name())
			if err != nil {
				t.Logf("sbx freeze: %v", err)
				return
			}
			t.Logf("sbx freeze: froze the sandbox at this failure as snapshot %s; look at it in a copy: sbx new --from %s", name, name)
		})
	})
}

// Now freezes the sandbox now, reason saying why, and returns the snapshot
// it is recorded as. In a copy resumed from that freeze, Now does not
// return: the calling goroutine holds where it is, for good, waiting for
// the freeze command, which holds there.
func Now(reason string) (string, error) {
	cmd := exec.Command(Command, "--json", "--reason", reason,
		"--failed-at", fmt.Sprintf("%.9f", float64(time.Now().UnixNano())/1e9))
	var errb limited
	cmd.Stderr = &errb
	out, err := cmd.Output()
	var ee *exec.ExitError
	switch {
	case errors.As(err, &ee) && ee.ExitCode() == exitCopy:
		for {
			time.Sleep(time.Hour) // the copy: hold here
		}
	case err != nil:
		return "", fmt.Errorf("%s: %w: %s", Command, err, errb.String())
	}
	var rec struct {
		Name string `json:"name"`
	}
	if err := json.Unmarshal(out, &rec); err != nil || rec.Name == "" {
		return "", fmt.Errorf("%s said %q", Command, out)
	}
	return rec.Name, nil
}

// limited keeps the first 4 KiB written to it.
type limited struct{ b []byte }

func (l *limited) Write(p []byte) (int, error) {
	if n := 4096 - len(l.b); n > 0 {
		l.b = append(l.b, p[:min(n, len(p))]...)
	}
	return len(p), nil
}

func (l *limited) String() string { return string(l.b) }
