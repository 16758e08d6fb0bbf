// sbx: the sandbox's init is init to the processes of the sandbox.
//
// This file is added to gVisor's pkg/sentry/kernel by sbx's build (see
// third_party/gvisor/README.md). sbx's agent is the init of every sandbox
// (pid 1 of the root PID namespace): it starts every exec, holds every
// crash and freeze, and answers sbxd. Linux keeps the processes of a PID
// namespace from stopping or killing its init: "Only signals for which the
// init process has established a signal handler can be sent to the init
// process by other members of the PID namespace. This restriction applies
// even to privileged processes" (pid_namespaces(7)); the same holds for
// the global init. gVisor leaves this as a TODO in sendSignalTimerLocked,
// so root inside a sandbox could `kill -STOP 1` and every exec, crash and
// freeze waited for init to be continued, or `kill -KILL 1` and end the
// sandbox from inside.

package kernel

import "gvisor.dev/gvisor/pkg/abi/linux"

// sbxInitDrops reports whether a signal info sent to t, a task of the
// sandbox's init, is dropped: one that a process of the sandbox sent
// (kill, tkill, tgkill, rt_sigqueueinfo, a timer: si_code SI_USER with the
// sender's pid, or below zero) and that init has no handler for, SIGKILL
// and SIGSTOP included. What comes from outside the sandbox still reaches
// init (runsc kill and the control server send SI_USER with no sender pid),
// as does what the kernel sends (a fault of init's own, SI_KERNEL): Linux
// lets an ancestor namespace and the kernel through too.
//
// The user cannot pass for the outside: rt_sigqueueinfo and
// rt_tgsigqueueinfo refuse a si_code of 0 or more for another process, and
// every kill sets the sender's pid, which is at least 1 in the root
// namespace.
//
// Preconditions: the signal mutex is locked.
func (t *Task) sbxInitDrops(info *linux.SignalInfo, sig linux.Signal) bool {
	// globalInit is set by the first CreateProcess, before any task of the
	// sandbox runs, and never changes after (its comment in kernel.go);
	// GlobalInit() would take extMu, which an external signal holds here.
	if init := t.k.globalInit; init == nil || t.tg != init {
		return false
	}
	if info.Code > 0 || (info.Code == linux.SI_USER && info.PID() == 0) {
		return false
	}
	if sig == linux.SIGKILL || sig == linux.SIGSTOP {
		return true
	}
	return t.tg.signalHandlers.actions[sig].Handler == linux.SIG_DFL
}
