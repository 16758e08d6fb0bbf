package netns

import (
	"errors"
	"os"
	"testing"

	"golang.org/x/sys/unix"
)

// TestAttackDeleteAfterCrashMidRemove: sbxd killed inside Delete, after
// it unmounted the gateway namespace and before it removed its file (or
// inside Create, after the file and before the bind mount), leaves a plain
// file at /run/netns/sbx-TAG-ID-gw. Every later Delete then fails with
// `delete up0: enter ...-gw: invalid argument`, so after the restart the
// reconcile cannot finish the delete and the sandbox is shown as `error`
// (TestAttackCrashDeleteMany found it). A path that is no namespace any
// more is a namespace already gone: Delete should remove it and succeed.
func TestAttackDeleteAfterCrashMidRemove(t *testing.T) {
	m := newManager(t)
	nw := create(t, m)
	// what the killed Delete had done: up0 and the sandbox namespace gone,
	// the gateway's unmounted, its file still there
	if err := unix.Unmount(nw.Path, unix.MNT_DETACH); err != nil {
		t.Fatal(err)
	}
	os.Remove(nw.Path)
	if err := unix.Unmount(nw.Gateway, unix.MNT_DETACH); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.Remove(nw.Gateway) }) // before create's own Delete
	if err := m.Delete(nw.ID); err != nil {
		t.Errorf("Delete(%s) after a crash left %s a plain file: %v; the reconcile then leaves the sandbox `error`, want success", nw.ID, nw.Gateway, err)
	}
	if _, err := os.Stat(nw.Gateway); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("stat %s after Delete: %v, want it removed", nw.Gateway, err)
	}
}
