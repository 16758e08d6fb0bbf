//go:build sbxtest

package sandbox

import (
	"os"
	"strings"
	"syscall"
	"time"
)

// crashPoint kills sbxd abruptly (SIGKILL) at a named step of a capture
// when SBX_TEST_CRASH_AT names it, so fault tests can stop a capture exactly
// there. With a suffix "+DURATION" (stop:writing-memory+300ms) it kills the
// process that long after the step began, while the step is under way.
// Only builds with the sbxtest tag have it.
func crashPoint(step string) {
	want := os.Getenv("SBX_TEST_CRASH_AT")
	name, delay, _ := strings.Cut(want, "+")
	if name != step {
		return
	}
	if delay == "" {
		syscall.Kill(os.Getpid(), syscall.SIGKILL)
		return
	}
	d, err := time.ParseDuration(delay)
	if err != nil {
		return
	}
	time.AfterFunc(d, func() { syscall.Kill(os.Getpid(), syscall.SIGKILL) })
}
