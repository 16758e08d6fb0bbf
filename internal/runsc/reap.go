package runsc

import (
	"bytes"
	"context"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"syscall"

	"golang.org/x/sys/unix"
)

// A detached sandbox outlives the `runsc run` that started it, and its
// processes are re-parented to the nearest subreaper, or to init. runsc
// delete waits until the sandbox process is gone, zombie included, so the
// sandbox is only deleted as fast as its new parent reaps it: on a machine
// whose init reaps once a second, every delete and stop would take a second.
// So sbxd makes itself the subreaper of the sandboxes it starts and reaps
// them at once.

// ReapSandboxes makes the calling process a child subreaper and reaps its
// runsc sandbox and gofer processes as soon as they end, until ctx ends.
// It waits only for those processes, never for children an exec.Cmd is
// waiting for: runsc starts the sandbox and gofer by re-executing itself
// through /proc/self/exe, so their command name is "exe", while sbxd's own
// children are runsc ("runsc") and exec shims ("sh").
func ReapSandboxes(ctx context.Context) error {
	if err := unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0); err != nil {
		return err
	}
	sigs := make(chan os.Signal, 16)
	signal.Notify(sigs, syscall.SIGCHLD)
	go func() {
		defer signal.Stop(sigs)
		for {
			reapOrphans()
			select {
			case <-ctx.Done():
				return
			case <-sigs:
			}
		}
	}()
	return nil
}

// reapOrphans waits for every ended runsc sandbox or gofer whose parent is
// this process.
func reapOrphans() {
	self := []byte(strconv.Itoa(os.Getpid()))
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		stat, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil {
			continue
		}
		// "pid (comm) S ppid ...": the comm may hold spaces, the rest not.
		// (A zombie has no cmdline left; its comm stays.)
		i, j := bytes.IndexByte(stat, '('), bytes.LastIndexByte(stat, ')')
		if i < 0 || j < i {
			continue
		}
		f := bytes.Fields(stat[j+1:])
		if len(f) < 2 || string(f[0]) != "Z" || !bytes.Equal(f[1], self) || string(stat[i+1:j]) != "exe" {
			continue
		}
		var ws unix.WaitStatus
		_, _ = unix.Wait4(pid, &ws, unix.WNOHANG, nil)
	}
}
