package agent

import (
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"sbx.dev/sbx/internal/procfs"
)

// procState is the State letter of pid's /proc status ("" once it is gone).
func procState(pid int) string {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		return ""
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "State:"); ok {
			return strings.TrimSpace(v)[:1]
		}
	}
	return ""
}

// TestAttack28KillGroupReachesRoot: init's kill checks only that the
// group's leader is the asker's, then signals the whole group as root. A
// command root started whose leader later became uid 1000 (a shell that
// starts a root helper in the background, then drops to the user: `sh -c
// 'daemon & exec setpriv --reuid 1000 app'`) keeps a root process in the
// group; kill(2) would not let uid 1000 signal it, init's kill does.
func TestAttack28KillGroupReachesRoot(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root")
	}
	py, err := exec.LookPath("/usr/bin/python3")
	if err != nil {
		t.Skip("needs python3")
	}
	s := startSupervisor(t)
	os.Chmod(s.dir, 0o755)
	childFile := filepath.Join(t.TempDir(), "child")
	script := `import os,sys,time
pid=os.fork()
if pid==0:
    open(sys.argv[1]+".tmp","w").write(str(os.getpid())); os.rename(sys.argv[1]+".tmp",sys.argv[1])
    time.sleep(20); os._exit(0)
os.setgid(1000); os.setuid(1000)
time.sleep(20)`
	id := newExecID()
	if rep, err := callInit(initRequest{Op: "spawn", ID: id, Argv: []string{py, "-c", script, childFile}}); err != nil || rep.Code != 0 {
		t.Fatalf("root's spawn: %+v %v", rep, err)
	}
	var leader, child int
	waitFor(t, "the leader to drop to uid 1000 and the root child to start", func() bool {
		leader, _ = readExecPid(s.dir, id)
		b, err := os.ReadFile(childFile)
		if err != nil || leader == 0 {
			return false
		}
		child, _ = strconv.Atoi(string(b))
		uid, err := procfs.UID(leader)
		return err == nil && uid == 1000
	})
	t.Cleanup(func() {
		syscall.Kill(child, syscall.SIGKILL)
		syscall.Kill(-leader, syscall.SIGKILL)
		exitRecorded(s.dir, id)
	})
	if uid, _ := procfs.UID(child); uid != 0 {
		t.Fatalf("the child runs as %d, want root", uid)
	}
	rep := asUser(t, s.socket, map[string]any{"op": "kill", "id": id, "signal": 9})
	time.Sleep(300 * time.Millisecond)
	if st := procState(child); st == "" || st == "Z" {
		t.Errorf("uid 1000's kill of exec %s (reply %+v) killed pid %d, a process of root's that kill(2) would not let uid 1000 signal", id, rep, child)
	}
}

// TestAttack28WaitsStarveOtherUsers: the bound on connections that are
// not root's is one for all uids, and a "wait" holds its connection for
// as long as the command runs. One uid (1001: a service's, nobody's) that
// spawns a long command and asks 32 waits of it takes every slot, for
// ever: then the default user (uid 1000) reaches init no more, not to
// spawn, not to freeze.
func TestAttack28WaitsStarveOtherUsers(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root")
	}
	py, err := exec.LookPath("/usr/bin/python3")
	if err != nil {
		t.Skip("needs python3")
	}
	s := startSupervisor(t)
	os.Chmod(s.dir, 0o755)
	id := newExecID()
	script := `import socket,sys,json,time
def conn():
    s=socket.socket(socket.AF_UNIX,socket.SOCK_STREAM); s.connect("\0"+sys.argv[1][1:]); return s
s=conn(); s.sendall(json.dumps({"op":"spawn","id":sys.argv[2],"argv":["/bin/sleep","60"]}).encode()+b"\n"); s.shutdown(socket.SHUT_WR); sys.stderr.write(s.recv(4096).decode()); s.close()
socks=[]
for i in range(int(sys.argv[3])):
    w=conn(); w.sendall(json.dumps({"op":"wait","id":sys.argv[2]}).encode()+b"\n"); socks.append(w)
print("ready"); sys.stdout.flush()
time.sleep(30)`
	cmd := exec.Command(py, "-c", script, s.socket, id, strconv.Itoa(maxUserConns))
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 1001, Gid: 1001}}
	cmd.Dir = "/"
	stdout, _ := cmd.StdoutPipe()
	var errb strings.Builder
	cmd.Stderr = &errb
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		t.Logf("uid 1001's spawn: %s", errb.String())
		cmd.Process.Kill()
		cmd.Wait()
		if pid, err := readExecPid(s.dir, id); err == nil {
			syscall.Kill(-pid, syscall.SIGKILL)
			// init records the exit in the exec's directory (a temporary
			// file, then a rename): the test's directory goes only after
			// (CI saw its removal race that write)
			exitRecorded(s.dir, id)
		}
	})
	line := make([]byte, 16)
	if n, _ := stdout.Read(line); !strings.HasPrefix(string(line[:n]), "ready") {
		t.Fatalf("uid 1001's waits: %q", line[:n])
	}
	time.Sleep(200 * time.Millisecond) // init has admitted them all
	check := exec.Command(py, "-c", `import socket,sys
s=socket.socket(socket.AF_UNIX,socket.SOCK_STREAM); s.settimeout(5); s.connect("\0"+sys.argv[1][1:])
s.sendall(b'{"op":"freeze-status"}\n'); s.shutdown(socket.SHUT_WR)
print(len(s.recv(4096)))`, s.socket)
	check.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 1000, Gid: 1000}}
	check.Dir = "/"
	out, err := check.Output()
	if n, _ := strconv.Atoi(strings.TrimSpace(string(out))); err != nil || n == 0 {
		t.Errorf("uid 1000 gets no answer from init (%q, %v) while uid 1001 holds %d waits: one uid's waits starve every other", out, err, maxUserConns)
	}
}
