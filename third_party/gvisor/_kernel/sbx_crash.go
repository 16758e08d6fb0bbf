// sbx: crashes held at their faulting instruction.
//
// This file is added to gVisor's pkg/sentry/kernel by sbx's build (see
// third_party/gvisor/README.md). When a signal whose default action dumps
// core is about to end a thread group that has no handler for it, and the
// sandbox's init asked for crashes (it made sbxCrashDir), the task is held
// instead: the signal goes back to its pending queue, marked, and the
// thread group enters a group stop, as SIGSTOP would make it, with the
// registers of the faulting instruction. The crash is told to init as a
// file in sbxCrashDir. init then captures the sandbox (the application
// checkpoint of /proc/gvisor/checkpoint) and, in the original, sends
// SIGCONT: the marked signal is delivered at once and the process dies as it
// would have. In a copy restored from the capture the process stays
// stopped, its signal pending, for gdb -p. A marked signal is never held
// again, and the mark is saved with the pending signal, so a copy's process
// dies when it is let go too.

package kernel

import (
	"bytes"
	"fmt"

	"gvisor.dev/gvisor/pkg/abi/linux"
	"gvisor.dev/gvisor/pkg/fspath"
	"gvisor.dev/gvisor/pkg/sentry/kernel/auth"
	"gvisor.dev/gvisor/pkg/sentry/vfs"
	"gvisor.dev/gvisor/pkg/usermem"
)

// sbxCrashDir is where held crashes are told, inside the sandbox; crashes
// are held only while it exists (init makes it, root's, 0700).
const sbxCrashDir = "/run/sbx/crashes"

// sbxHeldMark marks a held signal, in the last bytes of its siginfo (past
// every field of the union Linux defines for the signals that dump core).
var sbxHeldMark = []byte("sbxheld\x00")

func sbxCrashHeld(info *linux.SignalInfo) bool {
	return bytes.Equal(info.Fields[len(info.Fields)-len(sbxHeldMark):], sbxHeldMark)
}

// sbxHoldCrash holds t's thread group at the crash that info would end it
// with, and reports whether it did. It does not for a signal held once
// already, a traced task (its tracer has seen the signal and let it go on),
// the sandbox's init, or when sbxCrashDir is not there. sbxCrashDir is
// looked up in init's mount namespace.
func (t *Task) sbxHoldCrash(info *linux.SignalInfo) bool {
	init := t.k.GlobalInit()
	if sbxCrashHeld(info) || t.hasTracer() || init == nil || t.tg == init {
		return false
	}
	// init's mount namespace, not the crashing task's: a user's own
	// namespace (unshare -Urm) could put a /run/sbx/crashes of its own
	// there, or a symlink out of it, for the sentry to write as root
	leader := init.Leader()
	if leader == nil {
		return false
	}
	mntns := leader.MountNamespace()
	if mntns == nil {
		return false
	}
	root := mntns.Root(t)
	if !root.Ok() {
		return false
	}
	defer root.DecRef(t)
	creds := auth.NewRootCredentials(t.k.RootUserNamespace())
	dir := &vfs.PathOperation{Root: root, Start: root, Path: fspath.Parse(sbxCrashDir)}
	if _, err := t.k.VFS().StatAt(t, creds, dir, &vfs.StatOptions{}); err != nil {
		return false
	}

	held := *info
	copy(held.Fields[len(held.Fields)-len(sbxHeldMark):], sbxHeldMark)
	sh := t.tg.signalLock()
	if t.tg.exiting || t.tg.execing != nil {
		sh.mu.Unlock()
		return false
	}
	err := t.sendSignalLocked(&held, false /* group */)
	// as if SIGSTOP had just been dequeued (initiateGroupStop checks it)
	t.tg.groupStopDequeued = true
	sh.mu.Unlock()
	if err != nil {
		return false
	}
	t.initiateGroupStop(&linux.SignalInfo{Signo: int32(linux.SIGSTOP), Code: linux.SI_KERNEL})
	if err := t.sbxTellCrash(root, creds, info); err != nil {
		// nobody will let it go: let it go now, and it dies as it would have
		t.Warningf("sbx: cannot tell init of the crash: %v", err)
		_ = t.tg.SendSignal(&linux.SignalInfo{Signo: int32(linux.SIGCONT), Code: linux.SI_KERNEL})
	}
	return true
}

// sbxTellCrash writes the crash as sbxCrashDir/PID.json (through a
// temporary name, so init reads it whole).
func (t *Task) sbxTellCrash(root vfs.VirtualDentry, creds *auth.Credentials, info *linux.SignalInfo) error {
	ts := t.k.TaskSet().Root
	pid, tid := ts.IDOfThreadGroup(t.tg), ts.IDOfTask(t)
	var addr uint64
	switch linux.Signal(info.Signo) {
	case linux.SIGSEGV, linux.SIGFPE, linux.SIGILL, linux.SIGTRAP, linux.SIGBUS:
		addr = info.Addr()
	}
	uid := t.Credentials().RealKUID.In(t.k.RootUserNamespace()).OrOverflow()
	body := fmt.Sprintf(`{"pid":%d,"tid":%d,"signal":%d,"code":%d,"addr":%d,"uid":%d,"ip":%d,"time":%d}`+"\n",
		pid, tid, info.Signo, info.Code, addr, uid, t.Arch().IP(), t.k.RealtimeClock().Now().Nanoseconds())
	tmp := fmt.Sprintf("%s/.%d.tmp", sbxCrashDir, pid)
	final := fmt.Sprintf("%s/%d.json", sbxCrashDir, pid)
	fd, err := t.k.VFS().OpenAt(t, creds, &vfs.PathOperation{Root: root, Start: root, Path: fspath.Parse(tmp)},
		&vfs.OpenOptions{Flags: linux.O_WRONLY | linux.O_CREAT | linux.O_TRUNC | linux.O_NOFOLLOW, Mode: 0o600})
	if err != nil {
		return err
	}
	_, err = fd.Write(t, usermem.BytesIOSequence([]byte(body)), vfs.WriteOptions{})
	fd.DecRef(t)
	if err != nil {
		return err
	}
	return t.k.VFS().RenameAt(t, creds,
		&vfs.PathOperation{Root: root, Start: root, Path: fspath.Parse(tmp)},
		&vfs.PathOperation{Root: root, Start: root, Path: fspath.Parse(final)}, &vfs.RenameOptions{})
}
