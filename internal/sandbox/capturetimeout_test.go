package sandbox

import (
	"testing"
	"time"

	"sbx.dev/sbx/internal/runsc"
)

// A checkpoint's timeout grows with the memory it may write, so that a
// big sandbox on a slow disk is kept, not cut off at runsc's flat default.
func TestCaptureTimeoutGrowsWithMemory(t *testing.T) {
	for _, c := range []struct {
		mem  int64
		want time.Duration
	}{
		{-1, runsc.DefaultTimeout}, // no cgroup to read
		{0, runsc.DefaultTimeout},
		{10 << 20, runsc.DefaultTimeout + 2*time.Second},
		{1 << 30, runsc.DefaultTimeout + 256*time.Second},
		{4 << 30, runsc.DefaultTimeout + 1024*time.Second},
		{1 << 40, captureTimeoutMax},
	} {
		if got := captureTimeoutFor(c.mem); got != c.want {
			t.Errorf("captureTimeoutFor(%d) = %s, want %s", c.mem, got, c.want)
		}
	}
	// 1.5 GB at the 5 MB/s a busy host's disk was seen writing
	if got := captureTimeoutFor(1500 << 20); got < 1500/5*time.Second {
		t.Errorf("a 1.5 GB sandbox gets %s: less than a 5 MB/s disk needs", got)
	}
	// a restarted sbxd waits for a capture it finds running longer than
	// the capture may run
	if captureTimeoutMax >= captureWaitLimit {
		t.Errorf("captureTimeoutMax %s is not below captureWaitLimit %s", captureTimeoutMax, captureWaitLimit)
	}
}
