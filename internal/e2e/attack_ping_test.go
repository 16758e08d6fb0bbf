package e2e

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"sbx.dev/sbx/api"
)

// Attacks on the exec channel's ping pacing (internal/agent/channel.go:
// init pings its idle connections every second while warm, every 2 s when
// cold, and every save kicks them; internal/runsc/channel.go: sbxd waits
// channelWait for a connection, else `runsc exec`). The invariant in all:
// every exec ends, with its own output and exit code, in its own sandbox;
// and the channel is used again soon after.

// pingAtkSrc is a helper run as root inside the sandbox.
//
//	kick SECS N: N goroutines dial init's socket (@sbx-agent) and close, as
//	  root (each kicks the channel), for SECS seconds.
//	fds: tries to open init's socket fds through /proc/1/fd, to read what
//	  sbxd sends init and write garbage into them.
//	forge KIND N SECS: N connections to the channel's socket that ping as
//	  init's do; one given a request answers it per KIND (huge: a frame
//	  header of 4 GiB; garbage: bytes that are no frame; pingflood: a
//	  flood of pings; exit: a forged exit frame); for SECS seconds.
const pingAtkSrc = `package main

import (
	"encoding/binary"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"
)

// dialFlood has n goroutines dial the unix socket at path and close, for
// secs seconds, and returns how many connections were made.
func dialFlood(path string, secs, n int) int64 {
	end := time.Now().Add(time.Duration(secs) * time.Second)
	var count atomic.Int64
	done := make(chan bool)
	for i := 0; i < n; i++ {
		go func() {
			for time.Now().Before(end) {
				if c, err := net.Dial("unix", path); err == nil {
					c.Close()
					count.Add(1)
				}
			}
			done <- true
		}()
	}
	for i := 0; i < n; i++ {
		<-done
	}
	return count.Load()
}

func main() {
	switch os.Args[1] {
	case "kick":
		// N goroutines dial init's own socket and close, for SECS
		secs, _ := strconv.Atoi(os.Args[2])
		n, _ := strconv.Atoi(os.Args[3])
		fmt.Println("kicks", dialFlood("@sbx-agent", secs, n) > 0)
	case "mem":
		// hold MB of memory, not zeros, for SECS seconds
		mb, _ := strconv.Atoi(os.Args[2])
		secs, _ := strconv.Atoi(os.Args[3])
		b := make([]byte, mb<<20)
		for i := range b {
			b[i] = byte(i*13 + 1)
		}
		os.WriteFile("/tmp/mem-up", []byte("up\n"), 0o644)
		time.Sleep(time.Duration(secs) * time.Second)
		fmt.Println(len(b))
	case "nofile":
		// prlimit(1, RLIMIT_NOFILE, {n, n})
		n, _ := strconv.Atoi(os.Args[2])
		lim := [2]uint64{uint64(n), uint64(n)}
		var old [2]uint64
		_, _, e := syscall.RawSyscall6(syscall.SYS_PRLIMIT64, 1, 7, uintptr(unsafe.Pointer(&lim)), uintptr(unsafe.Pointer(&old)), 0, 0)
		fmt.Println("prlimit", e == 0, e, old[0], old[1])
	case "churn":
		// N goroutines dial the channel's socket and close, for SECS
		secs, _ := strconv.Atoi(os.Args[2])
		n, _ := strconv.Atoi(os.Args[3])
		fmt.Println("churned", dialFlood("/run/sbx/chan/agent.sock", secs, n)/int64(secs), "a second")
	case "fds":
		ents, _ := os.ReadDir("/proc/1/fd")
		for _, e := range ents {
			p := filepath.Join("/proc/1/fd", e.Name())
			l, _ := os.Readlink(p)
			if len(l) < 6 || l[:6] != "socket" {
				continue
			}
			f, err := os.OpenFile(p, os.O_RDWR|syscall.O_NONBLOCK, 0)
			if err != nil {
				fmt.Printf("fd %s %s: open: %v\n", e.Name(), l, err)
				continue
			}
			var b [4096]byte
			n, rerr := f.Read(b[:])
			_, werr := f.Write([]byte("garbage\n"))
			fmt.Printf("fd %s %s: OPENED read %d %v write %v\n", e.Name(), l, n, rerr, werr)
			f.Close()
		}
		fmt.Println("done")
	case "forge":
		kind := os.Args[2]
		n, _ := strconv.Atoi(os.Args[3])
		secs, _ := strconv.Atoi(os.Args[4])
		var given atomic.Int64
		for i := 0; i < n; i++ {
			go func() {
				for {
					c, err := net.Dial("unix", "/run/sbx/chan/agent.sock")
					if err != nil {
						time.Sleep(10 * time.Millisecond)
						continue
					}
					got := make(chan bool, 1)
					go func() {
						var b [4096]byte
						for {
							n, err := c.Read(b[:])
							if err != nil {
								got <- false
								return
							}
							for _, x := range b[:n] {
								if x != 0 {
									got <- true
									return
								}
							}
						}
					}()
				wait:
					for {
						select {
						case ok := <-got:
							if ok {
								given.Add(1)
								answer(c, kind)
							}
							break wait
						case <-time.After(300 * time.Millisecond):
							c.SetWriteDeadline(time.Now().Add(time.Second))
							if _, err := c.Write([]byte{0}); err != nil {
								break wait
							}
						}
					}
					c.Close()
				}
			}()
		}
		os.WriteFile("/tmp/forge-up", []byte("up\n"), 0o644)
		time.Sleep(time.Duration(secs) * time.Second)
		fmt.Println("given", given.Load())
	}
}

func answer(c net.Conn, kind string) {
	c.SetWriteDeadline(time.Now().Add(5 * time.Second))
	hdr := func(t byte, n uint32) []byte {
		h := []byte{t, 0, 0, 0, 0}
		binary.BigEndian.PutUint32(h[1:], n)
		return h
	}
	switch kind {
	case "huge":
		c.Write(hdr('o', 0xffffffff))
		c.Write(make([]byte, 1<<20))
	case "garbage":
		b := make([]byte, 1<<16)
		for i := range b {
			b[i] = byte(i*7 + 1)
		}
		c.Write(b)
	case "pingflood":
		c.Write(make([]byte, 1<<16))
	case "exit":
		c.Write(append(hdr('o', 7), "forged\n"...))
		c.Write(append(hdr('x', 1), 0))
	}
	time.Sleep(100 * time.Millisecond)
}
`

func buildPingAtk(t *testing.T) string {
	return buildGoProgram(t, "pingatk", pingAtkSrc)
}

// execCheck runs `sh -c 'echo TAG; exit CODE'` in id and checks the
// answer, within limit; it may be called from goroutines.
func execCheck(t *testing.T, d *daemon, id, tag string, code int, limit time.Duration) {
	t.Helper()
	r, hung := sbxWithin(t, d, limit, "exec", id, "--", "sh", "-c", fmt.Sprintf("echo %s; exit %d", tag, code))
	if hung || r.stdout != tag+"\n" || r.code != code {
		t.Errorf("exec %s in %s: hung=%v %+v; want %q, exit %d", tag, id, hung, r, tag+"\n", code)
	}
}

// TestAttackPingTwoSnapshotsThenExec: two memory snapshots asked at once
// (their saves' kicks may come within channelKickEvery of each other: the
// second is made later), then an exec at once. Want: the exec right, and
// the channel used again within a few seconds.
func TestAttackPingTwoSnapshotsThenExec(t *testing.T) {
	d := shared
	id := d.newSandbox(t, "--template", "tiny")
	channelReady(t, d, id)
	for round := 0; round < 2; round++ {
		var wg sync.WaitGroup
		for i := 0; i < 2; i++ {
			s := fmt.Sprintf("pingtwo%d%d-%s", round, i, randHex(3))
			t.Cleanup(func() { d.sbx(t, "snapshot", "rm", s) })
			wg.Add(1)
			go func() {
				defer wg.Done()
				if r, hung := sbxWithin(t, d, 2*time.Minute, "snapshot", id, s, "--memory"); hung || r.code != 0 {
					t.Errorf("snapshot %s: hung=%v %+v", s, hung, r)
				}
			}()
		}
		wg.Wait()
		execCheck(t, d, id, "first"+strconv.Itoa(round), 3, time.Minute)
		t.Logf("round %d: the first exec after two snapshots over the channel: %v", round, viaChannel(d, id, lastExec(t, d, id).ID))
		if !channelSoon(t, d, id, 5*time.Second) {
			t.Errorf("round %d: no exec over the channel within 5 s of two snapshots", round)
			channelEvidence(t, d, id)
		}
	}
}

// TestAttackPingForkExecAtOnce: a 2-way memory fork and a sandbox made
// from a memory snapshot, then execs in the source and all copies at once, each writing its own sandbox's id. Want:
// every exec right, each in its own sandbox (no connection of one
// sandbox's init served another's exec), and the channel used again.
func TestAttackPingForkExecAtOnce(t *testing.T) {
	d := shared
	id := d.newSandbox(t, "--template", "tiny")
	channelReady(t, d, id)
	d.must(t, "exec", id, "--", "sh", "-c", "echo none > /tmp/who")
	kids := forkMemory(t, d, id, 2)
	snap := "pingfrom-" + randHex(3)
	d.must(t, "snapshot", id, snap, "--memory")
	t.Cleanup(func() { d.sbx(t, "snapshot", "rm", snap) })
	from := d.newSandbox(t, "--from", snap)
	all := append([]string{id, from}, kids...)
	var wg sync.WaitGroup
	for _, sb := range all {
		for j := 0; j < 3; j++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				tag := fmt.Sprintf("%s-%d", sb, j)
				r, hung := sbxWithin(t, d, time.Minute, "exec", sb, "--", "sh", "-c", fmt.Sprintf("echo %s >> /tmp/who; echo %s; exit %d", sb, tag, j+1))
				if hung || r.stdout != tag+"\n" || r.code != j+1 {
					t.Errorf("exec %s: hung=%v %+v", tag, hung, r)
				}
			}()
		}
	}
	wg.Wait()
	for _, sb := range all {
		want := "none\n" + strings.Repeat(sb+"\n", 3)
		if out := d.must(t, "exec", sb, "--", "cat", "/tmp/who"); out != want {
			t.Errorf("%s's /tmp/who is %q, want %q: an exec ran in the wrong sandbox", sb, out, want)
		}
		if !channelSoon(t, d, sb, 5*time.Second) {
			t.Errorf("%s: no exec over the channel within 5 s of the fork", sb)
			channelEvidence(t, d, sb)
		}
	}
}

// TestAttackPingColdResume: the channel cools (no exec for more than
// channelWarm: init pings every 2 s), then a stop with memory and a
// resume, then five execs at once; then, cold again is not waited for,
// a memory snapshot and an exec at once. Want: all right, the channel
// used again soon.
func TestAttackPingColdResume(t *testing.T) {
	d := shared
	id := d.newSandbox(t, "--template", "tiny")
	channelReady(t, d, id)
	src := d.newSandbox(t, "--template", "tiny")
	channelReady(t, d, src)
	time.Sleep(31 * time.Second)
	// a memory fork of the other cold sandbox, and an exec in the fork
	// and in its source at once
	kid := forkMemory(t, d, src, 1)[0]
	var fw sync.WaitGroup
	for _, sb := range []string{kid, src} {
		fw.Add(1)
		go func() { defer fw.Done(); execCheck(t, d, sb, "forked", 9, time.Minute) }()
	}
	fw.Wait()
	t.Logf("the first execs after a cold fork, over the channel: fork %v, source %v", viaChannel(d, kid, lastExec(t, d, kid).ID), viaChannel(d, src, lastExec(t, d, src).ID))
	d.must(t, "stop", id, "--wait")
	d.must(t, "resume", id)
	var wg sync.WaitGroup
	for i := 0; i < 5; i++ {
		wg.Add(1)
		go func() { defer wg.Done(); execCheck(t, d, id, "cold"+strconv.Itoa(i), i, time.Minute) }()
	}
	wg.Wait()
	t.Logf("the last of five execs after a cold resume over the channel: %v", viaChannel(d, id, lastExec(t, d, id).ID))
	for _, sb := range []string{id, kid, src} {
		if !channelSoon(t, d, sb, 5*time.Second) {
			t.Errorf("%s: no exec over the channel within 5 s of a cold capture", sb)
			channelEvidence(t, d, sb)
		}
	}
}

// TestAttackPingInitFds: root inside opens init's sockets through
// /proc/1/fd (its channel connections among them), reads from them and
// writes garbage into them. Want: nothing sbxd sends init is read by
// another, execs right, the channel used again.
func TestAttackPingInitFds(t *testing.T) {
	d := shared
	id := d.newSandbox(t, "--template", "tiny")
	channelReady(t, d, id)
	upload(t, d, id, buildPingAtk(t), "/pa")
	r, hung := sbxWithin(t, d, time.Minute, "exec", "--user", "root", id, "--", "/pa", "fds")
	t.Logf("root on init's sockets: hung=%v %s %s", hung, r.stdout, r.stderr)
	if hung || !strings.Contains(r.stdout, "done") {
		t.Errorf("the fds helper: hung=%v %+v", hung, r)
	}
	if strings.Contains(r.stdout, "OPENED") {
		t.Logf("root opened a socket of init through /proc/1/fd")
	}
	for i := 0; i < 5; i++ {
		execCheck(t, d, id, "after"+strconv.Itoa(i), i, time.Minute)
	}
	if !channelSoon(t, d, id, 5*time.Second) {
		t.Error("no exec over the channel within 5 s after root's attempts on init's sockets")
		channelEvidence(t, d, id)
	}
}

// sbxdCPU is sbxd's user+system CPU time in clock ticks.
func sbxdCPU(t *testing.T, d *daemon) int {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", d.cmd.Process.Pid))
	if err != nil {
		t.Fatal(err)
	}
	s := string(b)
	f := strings.Fields(s[strings.LastIndex(s, ")")+1:])
	u, _ := strconv.Atoi(f[11])
	sy, _ := strconv.Atoi(f[12])
	return u + sy
}

// TestAttackPingKickFlood: root floods init's socket with connections for
// 8 s (each of root's kicks the channel: a ping on every idle
// connection, rate-limited to one kick per channelKickEvery) while execs
// run. Want: execs right, init's CPU bounded by what the flood itself
// costs, sbxd's pings-per-connection bound not tripped (the channel still
// used), and sbxd's CPU small.
func TestAttackPingKickFlood(t *testing.T) {
	d := shared
	id := d.newSandbox(t, "--template", "tiny")
	channelReady(t, d, id)
	upload(t, d, id, buildPingAtk(t), "/pa")
	before := sbxdCPU(t, d)
	start := time.Now()
	x := detachRoot(t, d, id, "/pa", "kick", "8", "8")
	time.Sleep(time.Second)
	via := 0
	for i := 0; i < 10; i++ {
		execCheck(t, d, id, "flood"+strconv.Itoa(i), i%4, time.Minute)
		if viaChannel(d, id, lastExec(t, d, id).ID) {
			via++
		}
	}
	wantExecOutput(t, d, id, x, "the kick flood", "kicks true\n")
	el := time.Since(start)
	used := sbxdCPU(t, d) - before
	t.Logf("over %s of a kick flood: %d of 10 execs over the channel; sbxd used %d ticks", el.Round(time.Millisecond), via, used)
	if via < 5 {
		t.Errorf("only %d of 10 execs went over the channel during a kick flood", via)
		channelEvidence(t, d, id)
	}
	if !channelSoon(t, d, id, 5*time.Second) {
		t.Error("no exec over the channel within 5 s after a kick flood")
	}
}

// TestAttackPingForgedInit: root holds connections to the channel's socket
// that ping as init does and answer a request with a 4 GiB frame header,
// garbage, a flood of pings, or a forged exit. Want: each exec ends within
// a minute (root may lose it; that is root's to do in its sandbox), sbxd
// stays healthy, and once root stops, execs are right and on the channel.
func TestAttackPingForgedInit(t *testing.T) {
	d := shared
	id := d.newSandbox(t, "--template", "tiny")
	channelReady(t, d, id)
	upload(t, d, id, buildPingAtk(t), "/pa")
	for _, kind := range []string{"huge", "garbage", "pingflood", "exit"} {
		x := detachRoot(t, d, id, "/pa", "forge", kind, "6", "6")
		time.Sleep(2 * time.Second) // its connections are up (an exec to see would go to them)
		for i := 0; i < 3; i++ {
			start := time.Now()
			r, hung := sbxWithin(t, d, time.Minute, "exec", id, "--", "sh", "-c", "echo real; exit 5")
			t.Logf("%s: exec %d: %s hung=%v code=%d out=%q err=%.200q", kind, i, time.Since(start).Round(time.Millisecond), hung, r.code, r.stdout, r.stderr)
			if hung {
				t.Errorf("%s: an exec hung for a minute on root's forged connections", kind)
			}
		}
		r, hung := sbxWithin(t, d, time.Minute, "logs", id, "--exec", x, "--follow")
		t.Logf("%s: the forger: %q", kind, r.stdout)
		if hung {
			t.Errorf("%s: the forger did not end", kind)
		}
		for i := 0; i < 3; i++ {
			execCheck(t, d, id, kind+"-after"+strconv.Itoa(i), i, time.Minute)
		}
		if !channelSoon(t, d, id, 5*time.Second) {
			t.Errorf("%s: no exec over the channel within 5 s after the forger ended", kind)
			channelEvidence(t, d, id)
		}
	}
	noRunscOf(t, d)
}

// TestAttackPingExecFlood: 50 execs at once while the sandbox is captured
// (two memory snapshots, a memory fork). Want: all 50 end within 2 min
// with their own output and exit code, none lost.
func TestAttackPingExecFlood(t *testing.T) {
	d := shared
	id := d.newSandbox(t, "--template", "tiny")
	channelReady(t, d, id)
	var wg sync.WaitGroup
	for i := 0; i < 50; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			tag := fmt.Sprintf("x%d", i)
			r, hung := sbxWithin(t, d, 2*time.Minute, "exec", id, "--", "sh", "-c", fmt.Sprintf("sleep 0.%d; echo %s; exit %d", i%10, tag, i%9))
			if hung || r.stdout != tag+"\n" || r.code != i%9 {
				t.Errorf("exec %s: hung=%v %+v", tag, hung, r)
			}
		}()
	}
	for i := 0; i < 2; i++ {
		s := fmt.Sprintf("pingflood%d-%s", i, randHex(3))
		t.Cleanup(func() { d.sbx(t, "snapshot", "rm", s) })
		if r, hung := sbxWithin(t, d, 2*time.Minute, "snapshot", id, s, "--memory"); hung || r.code != 0 {
			t.Errorf("snapshot %s: hung=%v %+v", s, hung, r)
		}
	}
	kids := forkMemory(t, d, id, 1)
	wg.Wait()
	answers(t, d, id, "after 50 execs and captures")
	answers(t, d, kids[0], "the fork")
	if !channelSoon(t, d, id, 5*time.Second) {
		t.Error("no exec over the channel within 5 s of the flood")
		channelEvidence(t, d, id)
	}
}

// TestAttackPingStopInit: root tries to stop init (SIGSTOP; init of a
// pid namespace ignores it, as in Linux: were it stopped, an exec would
// hear nothing on the connection it took), for 3 s while an exec is
// asked, then again through a memory snapshot with an exec at once after
// it. Want: init not stopped, the execs right, the channel used again.
func TestAttackPingStopInit(t *testing.T) {
	d := shared
	id := d.newSandbox(t, "--template", "tiny")
	channelReady(t, d, id)
	st := d.sbx(t, "exec", "--user", "root", id, "--", "sh", "-c", "kill -STOP 1; sleep 0.3; grep State /proc/1/status; kill -CONT 1")
	if !strings.Contains(st.stdout, "State:") || strings.Contains(st.stdout, "stopped") {
		t.Errorf("root stopped init, or its state is unknown: %+v", st)
	}
	r := d.sbx(t, "exec", "--user", "root", id, "--", "sh", "-c", "(sleep 1; kill -STOP 1; sleep 3; kill -CONT 1) >/dev/null 2>&1 & echo started")
	if r.stdout != "started\n" {
		t.Fatalf("the stopper: %+v", r)
	}
	time.Sleep(1500 * time.Millisecond)
	execCheck(t, d, id, "during", 4, 90*time.Second)
	time.Sleep(3 * time.Second)
	execCheck(t, d, id, "after", 2, time.Minute)
	// a memory snapshot while init is stopped: its kick waits for init
	// to go on; the connections the save closed are found dead then
	r = d.sbx(t, "exec", "--user", "root", id, "--", "sh", "-c", "(sleep 1; kill -STOP 1; sleep 4; kill -CONT 1) >/dev/null 2>&1 & echo started")
	if r.stdout != "started\n" {
		t.Fatalf("the stopper: %+v", r)
	}
	time.Sleep(1500 * time.Millisecond)
	snap := "pingstop-" + randHex(3)
	t.Cleanup(func() { d.sbx(t, "snapshot", "rm", snap) })
	if sr, hung := sbxWithin(t, d, 2*time.Minute, "snapshot", id, snap, "--memory"); hung || sr.code != 0 {
		t.Errorf("a memory snapshot while init is stopped: hung=%v %+v", hung, sr)
	}
	execCheck(t, d, id, "snapped", 6, 90*time.Second)
	time.Sleep(4 * time.Second)
	execCheck(t, d, id, "continued", 1, time.Minute)
	if !channelSoon(t, d, id, 5*time.Second) {
		t.Error("no exec over the channel within 5 s after init was stopped and continued")
		channelEvidence(t, d, id)
	}
}

// TestAttackPingUserReachesChannel: the default user (uid 1000) tries to
// reach the channel's socket (its directory is root's, 0700) and to hold
// connections to it as init does. Want: refused; execs right on the
// channel.
func TestAttackPingUserReachesChannel(t *testing.T) {
	d := shared
	id := d.newSandbox(t, "--template", "tiny")
	channelReady(t, d, id)
	upload(t, d, id, buildPingAtk(t), "/pa")
	r := d.sbx(t, "exec", "--user", "1000", id, "--", "sh", "-c", "id -u; ls -ld /run/sbx/chan /run/sbx/chan/agent.sock 2>&1; /pa forge exit 2 1")
	t.Logf("uid 1000 on the channel: %+v", r)
	x, err := sdk(d.client).ExecDetached(context.Background(), id, api.ExecRequest{Cmd: []string{"/pa", "forge", "exit", "4", "4"}, Detach: true, User: "1000"})
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(time.Second)
	for i := 0; i < 5; i++ {
		execCheck(t, d, id, "user"+strconv.Itoa(i), i, time.Minute)
	}
	wantExecOutput(t, d, id, x.ID, "uid 1000's forger", "given 0\n")
}

// TestAttackPingSbxdDownLong: sbxd is killed and stays down for 12 s, so
// init's connections fail to redial and back off (to channelBackoffMax,
// 5 s, between dials). The restarted sbxd listens again at the first exec,
// which goes by `runsc exec`: its copier kicks the channel. A kick woke
// only idle connections, not a loop sleeping between dials, so the
// channel came back only at init's next dial, up to 5 s later. Want: the
// channel used again within 2 s of the first exec.
func TestAttackPingSbxdDownLong(t *testing.T) {
	d, err := startDaemon(nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.stop(true) })
	id := d.newSandbox(t, "--template", "tiny")
	channelReady(t, d, id)
	d.kill(syscall.SIGKILL)
	time.Sleep(12 * time.Second)
	if err := d.start(nil); err != nil {
		t.Fatal(err)
	}
	execCheck(t, d, id, "first", 3, time.Minute)
	start := time.Now()
	ok := channelSoon(t, d, id, 10*time.Second)
	t.Logf("the channel again after %s (first exec over it: %v)", time.Since(start).Round(time.Millisecond), ok)
	if !ok || time.Since(start) > 2*time.Second {
		t.Errorf("the channel was used again %s after the first exec past a restart of sbxd (ok=%v); want within 2 s", time.Since(start).Round(time.Millisecond), ok)
	}
	for i := 0; i < 3; i++ {
		execCheck(t, d, id, "later"+strconv.Itoa(i), i, time.Minute)
	}
}

// TestAttackPingInitNoFiles: root tries to lower init's RLIMIT_NOFILE to
// what it has open (prlimit of pid 1: gVisor refuses it, EPERM, as of
// this writing), so that init could neither dial the channel nor accept a
// copier's connection; then raises it again. Want: execs meanwhile end
// (root may make them fail: it owns the sandbox; not hang), and once the
// limit is back, execs right and on the channel again.
func TestAttackPingInitNoFiles(t *testing.T) {
	d := shared
	id := d.newSandbox(t, "--template", "tiny")
	channelReady(t, d, id)
	upload(t, d, id, buildPingAtk(t), "/pa")
	r := d.sbx(t, "exec", "--user", "root", id, "--", "sh", "-c", "ls /proc/1/fd | wc -l; /pa nofile 8")
	t.Logf("lowered: %+v", r)
	for i := 0; i < 3; i++ {
		start := time.Now()
		r, hung := sbxWithin(t, d, 90*time.Second, "exec", id, "--", "sh", "-c", "echo low; exit 2")
		t.Logf("exec %d with init out of files: %s hung=%v %+v", i, time.Since(start).Round(time.Millisecond), hung, r)
		if hung {
			t.Errorf("an exec with init out of files hung for 90 s")
		}
	}
	r, hung := sbxWithin(t, d, 90*time.Second, "exec", "--user", "root", id, "--", "/pa", "nofile", "1048576")
	t.Logf("raised: hung=%v %+v", hung, r)
	for i := 0; i < 3; i++ {
		execCheck(t, d, id, "back"+strconv.Itoa(i), i, time.Minute)
	}
	if !channelSoon(t, d, id, 8*time.Second) {
		t.Error("no exec over the channel within 8 s after init's file limit came back")
		channelEvidence(t, d, id)
	}
}

// TestAttackPingExecsDuringLongSave: a sandbox holding 400 MB in memory (not zeros)
// (its save takes a while) is snapshotted with memory while execs are
// asked every 50 ms: requests land on connections the save is about to
// close, or wait for init's to come back (sbxd waits channelWait for
// one). Want: every exec right, none "never reached init".
func TestAttackPingExecsDuringLongSave(t *testing.T) {
	d := shared
	id := d.newSandbox(t, "--template", "tiny")
	channelReady(t, d, id)
	upload(t, d, id, buildPingAtk(t), "/pa")
	began := time.Now()
	detach(t, d, id, "/pa", "mem", "400", "600")
	waitFor(t, "400 MB held", time.Minute, func() bool {
		return d.sbx(t, "exec", id, "--", "cat", "/tmp/mem-up").stdout == "up\n"
	})
	t.Logf("filled in %s", time.Since(began).Round(time.Millisecond))
	for round := 0; round < 2; round++ {
		snap := fmt.Sprintf("pinglong%d-%s", round, randHex(3))
		t.Cleanup(func() { d.sbx(t, "snapshot", "rm", snap) })
		done := make(chan time.Duration, 1)
		go func() {
			start := time.Now()
			if r, hung := sbxWithin(t, d, 3*time.Minute, "snapshot", id, snap, "--memory"); hung || r.code != 0 {
				t.Errorf("snapshot: hung=%v %+v", hung, r)
			}
			done <- time.Since(start)
		}()
		var wg sync.WaitGroup
		n := 0
	loop:
		for {
			select {
			case took := <-done:
				t.Logf("round %d: the save took %s; %d execs asked meanwhile", round, took.Round(time.Millisecond), n)
				break loop
			case <-time.After(50 * time.Millisecond):
			}
			wg.Add(1)
			go func() { defer wg.Done(); execCheck(t, d, id, fmt.Sprintf("r%dx%d", round, n), n%5, 2*time.Minute) }()
			n++
		}
		began := time.Now()
		wg.Wait()
		t.Logf("round %d: the execs' end %s after the save's", round, time.Since(began).Round(time.Millisecond))
	}
}

// TestAttackPingExecRacesSave: an exec and a memory snapshot asked at the
// same moment (the exec a few ms ahead, varied), many times, in a sandbox
// holding 200 MB (a save of a second or so): the request may sit unread in
// init's connection when the save closes it. Want: every exec right (sent
// again, or attached), none "never reached init".
func TestAttackPingExecRacesSave(t *testing.T) {
	d := shared
	id := d.newSandbox(t, "--template", "tiny")
	channelReady(t, d, id)
	upload(t, d, id, buildPingAtk(t), "/pa")
	detach(t, d, id, "/pa", "mem", "200", "600")
	waitFor(t, "200 MB held", time.Minute, func() bool {
		return d.sbx(t, "exec", id, "--", "cat", "/tmp/mem-up").stdout == "up\n"
	})
	for round := 0; round < 8; round++ {
		snap := fmt.Sprintf("pingrace%d-%s", round, randHex(3))
		t.Cleanup(func() { d.sbx(t, "snapshot", "rm", snap) })
		var wg sync.WaitGroup
		wg.Add(2)
		go func() { defer wg.Done(); execCheck(t, d, id, fmt.Sprintf("race%d", round), round%4, 2*time.Minute) }()
		go func() {
			defer wg.Done()
			time.Sleep(time.Duration(round*4) * time.Millisecond)
			if r, hung := sbxWithin(t, d, 2*time.Minute, "snapshot", id, snap, "--memory"); hung || r.code != 0 {
				t.Errorf("snapshot: hung=%v %+v", hung, r)
			}
		}()
		wg.Wait()
	}
}

// TestAttackPingChannelChurn: root dials the channel's socket and closes
// at once, from 8 goroutines, for 8 s: each connection costs sbxd an
// accept and a reader. Want: sbxd's CPU bounded (under half a CPU),
// execs right meanwhile, the channel used again after.
func TestAttackPingChannelChurn(t *testing.T) {
	d := shared
	id := d.newSandbox(t, "--template", "tiny")
	channelReady(t, d, id)
	upload(t, d, id, buildPingAtk(t), "/pa")
	before := sbxdCPU(t, d)
	start := time.Now()
	x := detachRoot(t, d, id, "/pa", "churn", "8", "8")
	time.Sleep(time.Second)
	for i := 0; i < 5; i++ {
		execCheck(t, d, id, "churn"+strconv.Itoa(i), i, time.Minute)
	}
	r, _ := sbxWithin(t, d, time.Minute, "logs", id, "--exec", x, "--follow")
	el := time.Since(start)
	used := sbxdCPU(t, d) - before
	t.Logf("root's churn: %q; sbxd used %d ticks in %s", r.stdout, used, el.Round(time.Millisecond))
	if float64(used) > 50*el.Seconds() {
		t.Errorf("sbxd used %d ticks of CPU in %s of root's churn on the channel's socket: more than half a CPU", used, el.Round(time.Millisecond))
	}
	if !channelSoon(t, d, id, 5*time.Second) {
		t.Error("no exec over the channel within 5 s after the churn")
		channelEvidence(t, d, id)
	}
}
