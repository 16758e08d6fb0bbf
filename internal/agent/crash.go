package agent

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"sync"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"sbx.dev/sbx/internal/wire/freezewire"
)

// Crashes held at their faulting instruction. sbx's gVisor holds a process
// that gets a signal whose default action dumps core (SIGSEGV, SIGBUS,
// SIGILL, SIGFPE, SIGABRT, SIGTRAP, SIGSYS, SIGQUIT, ...) and has no handler
// for it: the signal goes back to pending and the process stops, as
// SIGSTOP would stop it, at the faulting instruction. gVisor tells init with
// a file in CrashDir (third_party/gvisor/_kernel/sbx_crash.go). init
// freezes the sandbox (the boot's one freeze) with the crash as its reason,
// then lets the process go in the original: it dies as it would have. In a
// copy resumed from the freeze it stays stopped, for `gdb -p`. Crashes after
// the boot's freeze are let go at once and counted.

// CrashDir is where gVisor tells init of held crashes; crashes are held only
// while it exists. It lives in the sandbox's memory (/run/sbx), so a copy
// has the files of the crash it was taken at.
var CrashDir = "/run/sbx/crashes"

// CrashesEnv, "off" in init's environment, leaves crashes alone.
const CrashesEnv = freezewire.CrashesEnv

// CrashCountFile, in CrashDir, holds how many crashes the sandbox has had
// since it started (a copy goes on from its original's count).
const CrashCountFile = "count"

// maxCrashFile bounds what is read of a crash file.
const maxCrashFile = 4096

var crashFileRE = regexp.MustCompile(`^([1-9][0-9]{0,9})\.json$`)

// crashReport is gVisor's file.
type crashReport struct {
	Pid    int    `json:"pid"`
	Tid    int    `json:"tid"`
	Signal int    `json:"signal"`
	Code   int    `json:"code"`
	Addr   uint64 `json:"addr"`
	UID    int    `json:"uid"`
	IP     uint64 `json:"ip"`
	Time   int64  `json:"time"`
}

// crashes is init's part that handles held crashes.
type crashes struct {
	dir     string
	freezer *freezer
	log     io.Writer

	mu    sync.Mutex
	count int // crashes seen this boot (counted across a copy's boot too)
}

// startCrashes makes dir and handles the crashes told there, until the
// sandbox ends. It returns an error if crashes cannot be held.
func startCrashes(dir string, f *freezer, log io.Writer) (*crashes, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	if err := os.Chmod(dir, 0o700); err != nil {
		return nil, err
	}
	fd, err := unix.InotifyInit1(unix.IN_CLOEXEC)
	if err != nil {
		return nil, os.NewSyscallError("inotify_init1", err)
	}
	if _, err := unix.InotifyAddWatch(fd, dir, unix.IN_MOVED_TO|unix.IN_CLOSE_WRITE); err != nil {
		unix.Close(fd)
		return nil, os.NewSyscallError("inotify_add_watch", err)
	}
	c := &crashes{dir: dir, freezer: f, log: log}
	go c.watch(fd)
	return c, nil
}

func (c *crashes) watch(fd int) {
	defer unix.Close(fd)
	buf := make([]byte, 64<<10)
	for {
		n, err := unix.Read(fd, buf)
		if err == syscall.EINTR {
			continue
		}
		if err != nil || n <= 0 {
			fmt.Fprintf(c.log, "sbx-agent: init: crashes: %v\n", err)
			return
		}
		for off := 0; off+unix.SizeofInotifyEvent <= n; {
			ev := (*unix.InotifyEvent)(unsafe.Pointer(&buf[off]))
			nameLen := int(ev.Len)
			end := off + unix.SizeofInotifyEvent + nameLen
			if end > n {
				break
			}
			name := string(buf[off+unix.SizeofInotifyEvent : end])
			for len(name) > 0 && name[len(name)-1] == 0 {
				name = name[:len(name)-1]
			}
			off = end
			if crashFileRE.MatchString(name) {
				go c.handle(name)
			}
		}
	}
}

// handle takes one held crash: the boot's freeze if it is the first, then
// lets the process go, unless this is the copy resumed from its freeze.
func (c *crashes) handle(name string) {
	path := filepath.Join(c.dir, name)
	rep, err := readCrash(path)
	if err != nil {
		fmt.Fprintf(c.log, "sbx-agent: init: crash %s: %v\n", name, err)
		_ = os.Remove(path)
		return
	}
	c.mu.Lock()
	c.count++
	n := c.count
	// how many this boot has had, for `sbx crashes` (one is caught)
	_ = writeFileAtomic(filepath.Join(c.dir, CrashCountFile), strconv.Itoa(n)+"\n")
	c.mu.Unlock()
	sig := unix.SignalName(syscall.Signal(rep.Signal))
	crash := &freezewire.Crash{Signal: sig, Tid: rep.Tid, Exe: exeOf(rep.Pid), Count: n,
		IP: "0x" + strconv.FormatUint(rep.IP, 16), Pgid: pgidOf(rep.Pid), Ancestors: ancestorsOf(rep.Pid)}
	switch syscall.Signal(rep.Signal) {
	case syscall.SIGSEGV, syscall.SIGBUS, syscall.SIGILL, syscall.SIGFPE, syscall.SIGTRAP:
		// a fault has an address; a signal sent with kill(2) (si_code 0 or
		// below) carries the sender's pid and uid there instead
		if rep.Code > 0 {
			crash.FaultAddr = "0x" + strconv.FormatUint(rep.Addr, 16)
		}
	}
	reason := fmt.Sprintf("crash: %s in %d (%s)", sig, rep.Pid, crash.Exe)
	if crash.FaultAddr != "" {
		reason += " at " + crash.FaultAddr
	}
	// the process goes as soon as the image holds it: gVisor has written
	// the checkpoint (sbxd's word on keeping it may take many seconds, a
	// copy's of a crash caught mid-capture too), or at the end
	release := sync.OnceFunc(func() {
		_ = os.Remove(path)
		_ = syscall.Kill(rep.Pid, syscall.SIGCONT)
	})
	rec := FreezeRecord{State: FreezeUnsupported}
	if env, err := readBootEnv(); err == nil && env.crashesOff {
		rec.Error = "crash capture is off in this boot"
	} else if c.freezer != nil {
		rec = c.freezer.freeze(initRequest{Op: "freeze", Self: true, Reason: reason, Crash: crash,
			FailedAt: time.Unix(0, rep.Time).UTC().Format(time.RFC3339Nano), written: release}, peer{pid: rep.Pid, uid: rep.UID})
	}
	switch rec.State {
	case FreezeCopy:
		// the copy resumed from the freeze: the process stays as it was
		// caught, for gdb -p; its file says which it is
		fmt.Fprintf(c.log, "sbx: %s: process %d is held at its crash for debugging (gdb -p %d); kill -CONT %d lets it die\n", reason, rep.Pid, rep.Pid, rep.Pid)
		return
	case FreezeFrozen:
		fmt.Fprintf(c.log, "sbx: %s: caught as %s; the process dies now, as it would have\n", reason, rec.Name)
	default:
		fmt.Fprintf(c.log, "sbx: %s: not caught (%s); the process dies now\n", reason, rec.Error)
	}
	release()
}

func readCrash(path string) (crashReport, error) {
	f, err := os.Open(path)
	if err != nil {
		return crashReport{}, err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, maxCrashFile))
	if err != nil {
		return crashReport{}, err
	}
	var r crashReport
	if err := json.Unmarshal(b, &r); err != nil {
		return crashReport{}, err
	}
	if m := crashFileRE.FindStringSubmatch(filepath.Base(path)); m == nil || m[1] != strconv.Itoa(r.Pid) {
		return crashReport{}, fmt.Errorf("the file names another process than %d", r.Pid)
	}
	return r, nil
}

// ancestorsOf is pid's parent, its parent's parent and so on, up to init
// (or freezewire.MaxAncestors of them).
func ancestorsOf(pid int) []int {
	var out []int
	for len(out) < freezewire.MaxAncestors {
		ppid, _, ok := procStat(pid)
		if !ok || ppid <= 0 || ppid == pid {
			break
		}
		out = append(out, ppid)
		pid = ppid
	}
	return out
}

// pgidOf is pid's process group, 0 if unknown.
func pgidOf(pid int) int {
	g, err := syscall.Getpgid(pid)
	if err != nil {
		return 0
	}
	return g
}

// exeOf is pid's program, or its name when the link cannot be read.
func exeOf(pid int) string {
	if exe, err := os.Readlink(fmt.Sprintf("/proc/%d/exe", pid)); err == nil {
		return exe
	}
	b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid))
	return string(b)
}
