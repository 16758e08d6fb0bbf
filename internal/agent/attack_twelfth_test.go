package agent

import (
	"os"
	"syscall"
	"testing"
)

// TestAttackTwelfthDevNullErrorSticks: devNull opens /dev/null once for
// init's life under a sync.Once, its error included. A first spawn that
// cannot open it (EMFILE at a burst of connections; root inside having
// removed or replaced /dev/null from a terminal, which is no spawn, before
// the first exec) makes every later spawn fail too, after the cause is
// gone: each one used to open it anew.
func TestAttackTwelfthDevNullErrorSticks(t *testing.T) {
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		t.Fatal(err)
	}
	// the lowest free descriptor: a limit at it makes the next open EMFILE
	fd, err := syscall.Open("/dev/null", syscall.O_RDONLY|syscall.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	syscall.Close(fd)
	low := lim
	low.Cur = uint64(fd)
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &low); err != nil {
		t.Skip(err)
	}
	s := &supervisor{}
	_, _, first := s.devNull()
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		t.Fatal(err)
	}
	if first == nil {
		t.Skip("the open did not fail at the lowered limit")
	}
	t.Logf("first spawn, descriptors exhausted: %v", first)
	if _, _, err := s.devNull(); err != nil {
		t.Errorf("with descriptors free again, every spawn still fails: %v", err)
	}
}

// TestAttackTwelfthHostnameCachedOnlyWhenAgreed: followHostname caches a
// hostname only once /etc names it; a rename that gave up (no file, a
// FIFO root put there, a file read mid-rewrite) is tried again later.
func TestAttackTwelfthHostnameCachedOnlyWhenAgreed(t *testing.T) {
	etc := t.TempDir()
	if hostnameIs(etc, "sb-new") {
		t.Errorf("no hostname file: said to name sb-new")
	}
	if err := syscall.Mkfifo(etc+"/hostname", 0o644); err != nil {
		t.Fatal(err)
	}
	if hostnameIs(etc, "sb-new") {
		t.Errorf("a FIFO: said to name sb-new")
	}
	if err := syscall.Unlink(etc + "/hostname"); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(etc+"/hostname", []byte("sb-old\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if hostnameIs(etc, "sb-new") {
		t.Errorf("a file naming sb-old: said to name sb-new")
	}
	if err := renameHost(etc, "sb-new"); err != nil || !hostnameIs(etc, "sb-new") {
		t.Errorf("after the rename: %v, want the file to name sb-new", err)
	}
}
