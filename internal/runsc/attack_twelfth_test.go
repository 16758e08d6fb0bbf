package runsc

import (
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// TestAttackTwelfthChildrenListSkips: the children file is a seq_file
// that os.ReadFile reads in several read(2)s once it passes 512 bytes, and
// each read after the first finds its place again by position in the
// thread's children list. A child of the same thread waited for between
// two of those reads (exec.Cmd.Wait of a runsc CLI the main thread forked,
// which is what made the SIGCHLD) moves every later child up one place:
// one is never listed. If it is the sandbox's zombie, runsc delete waits
// for the next sweep.
func TestAttackTwelfthChildrenListSkips(t *testing.T) {
	if !haveChildrenFiles() {
		t.Skip("no children lists")
	}
	if err := unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0); err != nil {
		t.Fatal(err)
	}
	noSubreaperAfter(t)
	// orphans, in the order they are re-parented: all onto the thread
	// group leader's list (find_new_reaper -> find_alive_thread)
	orphans := func(n int) []int {
		t.Helper()
		out, err := exec.Command("/bin/sh", "-c",
			`i=0; while [ $i -lt `+strconv.Itoa(n)+` ]; do sleep 600 </dev/null >/dev/null 2>&1 & echo $!; i=$((i+1)); done`).Output()
		if err != nil {
			t.Fatal(err)
		}
		var pids []int
		for _, f := range strings.Fields(string(out)) {
			p, err := strconv.Atoi(f)
			if err != nil {
				t.Fatal(err)
			}
			pids = append(pids, p)
		}
		return pids
	}
	churn := orphans(60)   // first in the list, waited for one by one
	stable := orphans(150) // after them, untouched while it is read
	defer func() {
		for _, p := range append(churn, stable...) {
			_ = syscall.Kill(p, syscall.SIGKILL)
			var ws unix.WaitStatus
			_, _ = unix.Wait4(p, &ws, 0, nil)
		}
	}()
	// wait until all are re-parented here
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		pids, _ := childPids()
		n := 0
		for _, p := range stable {
			if slices.Contains(pids, strconv.Itoa(p)) {
				n++
			}
		}
		if n == len(stable) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("only %d of %d orphans re-parented", n, len(stable))
		}
	}

	var wg sync.WaitGroup
	done := make(chan struct{})
	wg.Add(1)
	go func() {
		defer wg.Done()
		defer close(done)
		for _, p := range churn {
			_ = syscall.Kill(p, syscall.SIGKILL)
			var ws unix.WaitStatus
			_, _ = unix.Wait4(p, &ws, 0, nil)
			time.Sleep(300 * time.Microsecond)
		}
	}()
	reads, short := 0, 0
	var missed []int
loop:
	for {
		select {
		case <-done:
			break loop
		default:
		}
		pids, _ := childPids()
		reads++
		for _, p := range stable {
			if !slices.Contains(pids, strconv.Itoa(p)) {
				missed = append(missed, p)
				short++
				break
			}
		}
	}
	wg.Wait()
	if short > 0 {
		t.Errorf("in %d of %d reads of the children lists a child that neither ended nor moved was not listed (e.g. %v): a zombie missed this way waits for the %v sweep", short, reads, missed[:min(5, len(missed))], reapSweepEvery)
	}
}
