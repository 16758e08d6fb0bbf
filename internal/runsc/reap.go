package runsc

import (
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

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
		sweep := time.NewTicker(reapSweepEvery)
		defer sweep.Stop()
		reapOrphans(true)
		for {
			select {
			case <-ctx.Done():
				return
			case <-sigs:
				reapOrphans(false)
			case <-sweep.C:
				reapOrphans(true)
			}
		}
	}()
	return nil
}

// reapSweepEvery is how often every process is looked at, not only this
// process's children: a zombie a thread's exit moved between the lists
// read, or whose SIGCHLD was merged with another's, waits this long at most.
const reapSweepEvery = 2 * time.Second

// reapOrphans waits for every ended runsc sandbox or gofer whose parent is
// this process. Its children are read from each of its threads' children
// list (what a SIGCHLD is about: a few reads, where a look at every
// process of a busy host read hundreds of files at every one, a quarter of
// sbxd's CPU in a run of forks); all is every process in /proc, as where
// the kernel keeps no such lists.
func reapOrphans(all bool) {
	pids, ok := []string(nil), false
	if !all {
		pids, ok = childPids()
	}
	if !ok {
		entries, _ := os.ReadDir("/proc")
		for _, e := range entries {
			pids = append(pids, e.Name())
		}
	}
	self := []byte(strconv.Itoa(os.Getpid()))
	for _, name := range pids {
		pid, err := strconv.Atoi(name)
		if err != nil {
			continue
		}
		stat, err := os.ReadFile(filepath.Join("/proc", name, "stat"))
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

// childPids lists this process's children, from each of its threads'
// children files (/proc/self/task/TID/children); ok is false where the
// kernel has none (CONFIG_PROC_CHILDREN).
func childPids() (pids []string, ok bool) {
	if !haveChildrenFiles() {
		return nil, false
	}
	tasks, err := os.ReadDir("/proc/self/task")
	if err != nil {
		return nil, false
	}
	for _, t := range tasks {
		b, err := readWhole(filepath.Join("/proc/self/task", t.Name(), "children"))
		if err != nil {
			continue // a thread that ended meanwhile: its children went to another
		}
		pids = append(pids, strings.Fields(string(b))...)
	}
	return pids, true
}

// readWhole reads a /proc file in as few reads as the kernel allows: a
// children list read 512 bytes at a time (os.ReadFile's start) finds its
// place again at each read by counting entries, and a child reaped between
// two reads shifts the rest: one pid was never listed
// (TestAttackTwelfthChildrenListSkips), and a sandbox's delete waited for
// the next sweep. Within one read (up to a page: some 600 children) the
// kernel follows the list; a longer one is left to the sweep.
func readWhole(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	for size := 64 << 10; ; size *= 2 {
		buf := make([]byte, size)
		n, err := f.ReadAt(buf, 0)
		if err != nil && !errors.Is(err, io.EOF) {
			return nil, err
		}
		if n < size || size >= 16<<20 {
			return buf[:n], nil
		}
	}
}

// haveChildrenFiles says whether the kernel keeps threads' children lists.
var haveChildrenFiles = sync.OnceValue(func() bool {
	_, err := os.Stat("/proc/thread-self/children")
	return err == nil
})
