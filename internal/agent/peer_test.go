package agent

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// asUser sends one request to init's socket as uid 1000 (a process of the
// sandbox's default user) and returns init's reply.
func asUser(t *testing.T, socket string, req map[string]any) initReply {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: the requests come from another uid")
	}
	py, err := exec.LookPath("/usr/bin/python3")
	if err != nil {
		t.Skip("needs python3 to speak as another uid")
	}
	b, _ := json.Marshal(req)
	script := `import socket,sys
s=socket.socket(socket.AF_UNIX,socket.SOCK_STREAM)
s.settimeout(20)
s.connect("\0"+sys.argv[1][1:])
s.sendall(sys.argv[2].encode()+b"\n")
s.shutdown(socket.SHUT_WR)
out=b""
while True:
    d=s.recv(65536)
    if not d: break
    out+=d
sys.stdout.write(out.decode())`
	cmd := exec.Command(py, "-c", script, socket, string(b))
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 1000, Gid: 1000}}
	cmd.Dir = "/"
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("request as uid 1000: %v", err)
	}
	var rep initReply
	if err := json.Unmarshal(out, &rep); err != nil {
		t.Fatalf("reply %q: %v", out, err)
	}
	return rep
}

// TestInitLendsNoRoot: init is root and anyone inside may reach its
// socket, so it gives a process no more than that process has: a spawn by
// uid 1000 runs as uid 1000 and may not ask for another user; uid 1000
// may not signal or settle root's commands. Root (sbx's helpers) may.
func TestInitLendsNoRoot(t *testing.T) {
	s := startSupervisor(t)
	os.Chmod(s.dir, 0o755) // the test's temp dir: the command as uid 1000 must reach "/"

	id := newExecID()
	rep := asUser(t, s.socket, map[string]any{"op": "spawn", "id": id, "argv": []string{"/bin/sh", "-c", "id -u"}})
	if rep.Code != 0 || rep.Pid == 0 {
		t.Fatalf("spawn as uid 1000: %+v", rep)
	}
	exitFile := filepath.Join(s.dir, id, "exit")
	waitFor(t, "the command to end", func() bool { _, err := os.Stat(exitFile); return err == nil })
	if out, _ := os.ReadFile(filepath.Join(s.dir, id, "stdout")); strings.TrimSpace(string(out)) != "1000" {
		t.Errorf("a spawn asked by uid 1000 ran as %q, want 1000", out)
	}
	for _, user := range []string{"0", "root", "1000:0", "1001"} {
		rep := asUser(t, s.socket, map[string]any{"op": "spawn", "id": newExecID(), "argv": []string{"/bin/true"}, "user": user})
		if rep.Code == 0 || !strings.Contains(rep.Error, "only as itself") {
			t.Errorf("spawn as %q asked by uid 1000: %+v, want it refused", user, rep)
		}
	}
	// root's command: uid 1000 may neither signal nor settle it
	rootID := newExecID()
	if code, _, stderr := run(t, nil, "spawn", "--id", rootID, "--pid-fd", "-1", "--", "/bin/sh", "-c", "exec sleep 30 & echo started"); code != 0 {
		t.Fatalf("root's spawn: %d %s", code, stderr)
	}
	waitFor(t, "root's command's pid", func() bool { _, err := readExecPid(s.dir, rootID); return err == nil })
	if rep := asUser(t, s.socket, map[string]any{"op": "kill", "id": rootID, "signal": 9}); rep.Code == 0 || !strings.Contains(rep.Error, "only its own") {
		t.Errorf("uid 1000 killing root's command: %+v, want it refused", rep)
	}
	if rep := asUser(t, s.socket, map[string]any{"op": "settle", "id": newExecID()}); rep.Code == 0 || !strings.Contains(rep.Error, "only root") {
		t.Errorf("uid 1000 settling an exec: %+v, want it refused", rep)
	}
	// its own it may signal
	own := newExecID()
	if rep := asUser(t, s.socket, map[string]any{"op": "spawn", "id": own, "argv": []string{"/bin/sleep", "30"}}); rep.Code != 0 {
		t.Fatalf("spawn as uid 1000: %+v", rep)
	}
	if rep := asUser(t, s.socket, map[string]any{"op": "kill", "id": own, "signal": 9}); rep.Code != 0 {
		t.Errorf("uid 1000 killing its own command: %+v", rep)
	}
	waitFor(t, "its own command to end", func() bool { _, err := os.Stat(filepath.Join(s.dir, own, "exit")); return err == nil })
}

// TestInitUserConnsBounded: a flood of idle connections from uid 1000
// gets at most maxUserConns of them open; root's requests are answered
// all along.
func TestInitUserConnsBounded(t *testing.T) {
	s := startSupervisor(t)
	if os.Geteuid() != 0 {
		t.Skip("needs root")
	}
	py, err := exec.LookPath("/usr/bin/python3")
	if err != nil {
		t.Skip("needs python3")
	}
	// opens n connections, sends nothing, and says how many init closed
	// within two seconds (it holds the rest for its client timeout)
	script := `import socket,sys,time
n=int(sys.argv[2]); socks=[]
for i in range(n):
    s=socket.socket(socket.AF_UNIX,socket.SOCK_STREAM); s.connect("\0"+sys.argv[1][1:]); socks.append(s)
time.sleep(2)
closed=0
for s in socks:
    s.setblocking(False)
    try:
        if s.recv(1)==b"": closed+=1
    except BlockingIOError: pass
    except OSError: closed+=1
print(closed)
sys.stdout.flush()
time.sleep(float(sys.argv[3]))`
	n := maxUserConns + 40
	cmd := exec.Command(py, "-c", script, s.socket, strconv.Itoa(n), "5")
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 1000, Gid: 1000}}
	cmd.Dir = "/"
	stdout, _ := cmd.StdoutPipe()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { cmd.Process.Kill(); cmd.Wait() }()
	line := make([]byte, 32)
	done := make(chan int, 1)
	go func() {
		k, _ := stdout.Read(line)
		v, _ := strconv.Atoi(strings.TrimSpace(string(line[:k])))
		done <- v
	}()
	var closed int
	select {
	case closed = <-done:
	case <-time.After(time.Minute):
		t.Fatal("the flood never said how many were closed")
	}
	if closed < n-maxUserConns {
		t.Errorf("%d of %d idle connections of uid 1000 were closed, want at least %d (at most %d held)", closed, n, n-maxUserConns, maxUserConns)
	}
	// while the flood holds its share, root is answered
	if code, stdout, _ := run(t, nil, "spawn", "--id", newExecID(), "--", "/bin/echo", "ok"); code != 0 || stdout != "ok\n" {
		t.Errorf("root's spawn during the flood: %d %q", code, stdout)
	}
}
