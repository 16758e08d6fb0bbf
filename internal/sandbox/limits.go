package sandbox

import (
	"syscall"

	"sbx.dev/sbx/api"
)

// Limits are what one sandbox may use: a daemon's defaults, and the most a
// create may ask for. Every sandbox has a memory, process and disk limit
// (DESIGN §3): a sandbox that asks for none gets the default.
type Limits struct {
	// Memory is the cgroup memory limit in bytes: past it the kernel stops
	// the whole sandbox (reported as out of memory).
	Memory, MaxMemory int64
	// Pids bounds the processes of each user inside the sandbox
	// (RLIMIT_NPROC, which gVisor enforces: fork fails with EAGAIN).
	Pids, MaxPids int
	// Disk caps the sandbox's disk changes in bytes: past it writes fail
	// with ENOSPC inside, and the host's disk is not the sandbox's to fill.
	Disk, MaxDisk int64
}

// DefaultLimits are sbxd's limits unless its flags say otherwise.
var DefaultLimits = Limits{
	Memory: 2 << 30, MaxMemory: 0, // 0: the host's memory
	Pids: 4096, MaxPids: 65536,
	Disk: 10 << 30, MaxDisk: 1 << 40,
}

// resolve applies the defaults to a create's requested limits (0: the
// default) and checks them against the maxima; hostMemory bounds memory
// when no maximum is set. Errors are api.ErrInvalid naming the field.
func (l Limits) resolve(memory int64, pids int, disk int64, hostMemory int64) (int64, int, int64, error) {
	maxMem := l.MaxMemory
	if maxMem == 0 || (hostMemory > 0 && hostMemory < maxMem) {
		maxMem = hostMemory
	}
	if memory == 0 {
		memory = l.Memory
		if maxMem > 0 && memory > maxMem {
			memory = maxMem
		}
	}
	switch {
	case memory < minMemory:
		return 0, 0, 0, api.Errorf(api.ErrInvalid, "memory: %s is below the minimum of %s", fmtBytes(memory), fmtBytes(minMemory))
	case maxMem > 0 && memory > maxMem:
		what := "sbxd's maximum"
		if maxMem == hostMemory {
			what = "this host has"
		}
		return 0, 0, 0, api.Errorf(api.ErrInvalid, "memory: %s is more than %s (%s); ask for at most that", fmtBytes(memory), what, fmtBytes(maxMem))
	}
	if pids == 0 {
		pids = l.Pids
	}
	switch {
	case pids < 0:
		return 0, 0, 0, api.Errorf(api.ErrInvalid, "pids: %d is negative", pids)
	case pids < minPids:
		return 0, 0, 0, api.Errorf(api.ErrInvalid, "pids: %d is below the minimum of %d", pids, minPids)
	case l.MaxPids > 0 && pids > l.MaxPids:
		return 0, 0, 0, api.Errorf(api.ErrInvalid, "pids: %d is more than sbxd's maximum (%d)", pids, l.MaxPids)
	}
	if disk == 0 {
		disk = l.Disk
	}
	switch {
	case disk < minDisk:
		return 0, 0, 0, api.Errorf(api.ErrInvalid, "disk: %s is below the minimum of %s", fmtBytes(disk), fmtBytes(minDisk))
	case l.MaxDisk > 0 && disk > l.MaxDisk:
		return 0, 0, 0, api.Errorf(api.ErrInvalid, "disk: %s is more than sbxd's maximum (%s)", fmtBytes(disk), fmtBytes(l.MaxDisk))
	}
	return memory, pids, disk, nil
}

// The smallest limits a sandbox boots and works with.
const (
	minPids = 16
	minDisk = 16 << 20
)

// minFree is the room sbxd wants on its data dir before it takes new work:
// below it, new execs, sandboxes and captures are refused with a clear
// error, and what is under way can still record how it ends (the store
// keeps a reserve of its own besides).
const minFree = 64 << 20

// checkRoom refuses new work when the data dir is (nearly) full.
func (m *Manager) checkRoom(what string) error {
	var fs syscall.Statfs_t
	if err := syscall.Statfs(m.cfg.DataDir, &fs); err != nil {
		return nil // cannot tell: let the work say
	}
	if free := int64(fs.Bavail) * fs.Bsize; free < minFree {
		return api.Errorf(api.ErrUnavailable, "%s: sbxd's data dir %s is full (%s free, it wants %s): free some space there", what, m.cfg.DataDir, fmtBytes(free), fmtBytes(minFree))
	}
	return nil
}
