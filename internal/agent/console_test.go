package agent

import (
	"os"
	"path/filepath"
	"testing"
	"time"
)

// TestConsole: writes to the console, even with O_TRUNC as `echo > ` opens
// it, all arrive in order; a plain file left there is replaced.
func TestConsole(t *testing.T) {
	path := filepath.Join(t.TempDir(), "console")
	os.WriteFile(path, []byte("stale plain file"), 0o644)
	var out syncBuffer
	if err := serveConsole(path, &out); err != nil {
		t.Fatal(err)
	}
	for _, m := range []string{"FIRST\n", "SECOND\n", "THIRD\n"} {
		f, err := os.OpenFile(path, os.O_WRONLY|os.O_TRUNC|os.O_CREATE, 0o644)
		if err != nil {
			t.Fatal(err)
		}
		f.WriteString(m)
		f.Close()
	}
	deadline := time.Now().Add(5 * time.Second)
	for out.String() != "FIRST\nSECOND\nTHIRD\n" && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if got := out.String(); got != "FIRST\nSECOND\nTHIRD\n" {
		t.Errorf("console got %q", got)
	}
}
