package runsc

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"
)

// testDriver returns a Driver on the runsc built into bin/, with its own
// state root, or skips when the test cannot drive real runsc.
func testDriver(t *testing.T) *Driver {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root to drive runsc")
	}
	_, file, _, _ := runtime.Caller(0)
	bin := filepath.Join(filepath.Dir(file), "..", "..", "bin", "runsc")
	if _, err := os.Stat(bin); err != nil {
		t.Skipf("no runsc at %s (run make build): %v", bin, err)
	}
	return &Driver{Path: bin, Root: t.TempDir()}
}

// busyboxRootfs makes a minimal rootfs from the host's busybox-static.
func busyboxRootfs(t *testing.T) string {
	t.Helper()
	bb, err := exec.LookPath("busybox")
	if err != nil {
		t.Skip("busybox-static not installed")
	}
	root := t.TempDir()
	for _, d := range []string{"bin", "proc", "sys", "dev", "tmp", "etc", ".sbx"} {
		if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	b, err := os.ReadFile(bb)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(root, "bin", "busybox"), b, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, app := range []string{"sh", "sleep", "echo", "cat", "ls"} {
		if err := os.Symlink("busybox", filepath.Join(root, "bin", app)); err != nil {
			t.Fatal(err)
		}
	}
	for _, f := range []string{"resolv.conf", "hosts", "hostname"} {
		if err := os.WriteFile(filepath.Join(root, "etc", f), nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return root
}

func testNetNS(t *testing.T) string {
	t.Helper()
	name := "sbxtest-" + strings.ToLower(strings.ReplaceAll(t.Name(), "/", "-"))
	if len(name) > 40 {
		name = name[:40]
	}
	// this run's own: two runs of these tests on one machine must not meet
	name += "-" + strconv.Itoa(os.Getpid())
	if out, err := exec.Command("ip", "netns", "add", name).CombinedOutput(); err != nil {
		t.Fatalf("ip netns add: %v: %s", err, out)
	}
	t.Cleanup(func() { exec.Command("ip", "netns", "del", name).Run() })
	return "/run/netns/" + name
}

func TestRunExecDelete(t *testing.T) {
	d := testDriver(t)
	ctx := context.Background()
	dir := t.TempDir()
	etc := filepath.Join(dir, "etc")
	os.MkdirAll(etc, 0o755)
	for _, f := range []string{"resolv.conf", "hosts", "hostname"} {
		os.WriteFile(filepath.Join(etc, f), []byte("# "+f+"\n"), 0o644)
	}
	agent := filepath.Join(dir, "agent")
	os.MkdirAll(agent, 0o755)
	rootfs := busyboxRootfs(t)
	spec := Spec(SpecOptions{Hostname: "t", Rootfs: rootfs, AgentDir: agent, EtcDir: etc, NetNS: testNetNS(t)})
	spec.Process.Args = []string{"/bin/sh", "-c", "echo console-hello; exec sleep 1000"}
	bundle := filepath.Join(dir, "bundle")
	os.MkdirAll(bundle, 0o700)
	writeSpec(t, bundle, spec)
	console := filepath.Join(dir, "console.log")
	overlay := filepath.Join(dir, "upper")
	os.MkdirAll(overlay, 0o700)
	const id = "sbxtest-run"
	t.Cleanup(func() { d.Delete(context.Background(), id) })
	pidFile := filepath.Join(dir, "sandbox.pid")
	os.WriteFile(pidFile, []byte(strconv.Itoa(os.Getpid())), 0o600) // an earlier boot's
	if err := d.Run(ctx, id, RunOptions{Bundle: bundle, Console: console, Overlay: overlay, PIDFile: pidFile}); err != nil {
		t.Fatal(err)
	}
	st, err := d.State(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	if st.Status != StatusRunning {
		t.Errorf("status = %q, want running", st.Status)
	}
	// the pid runsc wrote is the one runsc state names, and only for id
	if p, ok := BootedProcess(pidFile, id); !ok || p.Pid != st.Pid {
		t.Errorf("BootedProcess = %+v %v, want pid %d (runsc state's)", p, ok, st.Pid)
	}
	if _, ok := BootedProcess(pidFile, "sbxtest-other"); ok {
		t.Error("BootedProcess took sandbox sbxtest-run's process for another's")
	}
	var out bytes.Buffer
	code, err := d.Exec(ctx, id, ExecOptions{Args: []string{"/bin/sh", "-c", "cat /run/sbx/etc/resolv.conf; echo x > /tmp/f; cat /tmp/f; exit 7"}}, nil, &out, nil)
	if err != nil {
		t.Fatal(err)
	}
	if code != 7 {
		t.Errorf("exit code = %d, want 7", code)
	}
	if got, want := out.String(), "# resolv.conf\nx\n"; got != want {
		t.Errorf("output = %q, want %q", got, want)
	}
	// The template is shared: a sandbox's writes never reach it.
	if _, err := os.Stat(filepath.Join(rootfs, "tmp", "f")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("write inside the sandbox reached the template: %v", err)
	}
	var b []byte
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if b, _ = os.ReadFile(filepath.Join(dir, "console.log")); strings.Contains(string(b), "console-hello") {
			break
		}
	}
	if !strings.Contains(string(b), "console-hello") {
		t.Errorf("console = %q, want console-hello", b)
	}
	if err := d.Delete(ctx, id); err != nil {
		t.Fatal(err)
	}
	if p, ok := BootedProcess(pidFile, id); ok {
		t.Errorf("BootedProcess after the delete: %+v, want none", p)
	}
	if _, err := d.State(ctx, id); !errors.Is(err, ErrNotExist) {
		t.Errorf("state after delete: %v, want ErrNotExist", err)
	}
	if err := d.Delete(ctx, id); err != nil {
		t.Errorf("second delete: %v", err)
	}
}

func writeSpec(t *testing.T, bundle string, spec any) {
	t.Helper()
	b, err := json.Marshal(spec)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(bundle, "config.json"), b, 0o600); err != nil {
		t.Fatal(err)
	}
}

func TestTail(t *testing.T) {
	tests := []struct {
		name, in, want string
	}{
		{"plain", "checkpoint failed: statefile.NewWriter failed: no space left on device\n", "checkpoint failed: statefile.NewWriter failed: no space left on device"},
		{"stack trace", "panic: write: no space left on device\n\ngoroutine 12 [running]:\ngvisor.dev/gvisor/pkg/urpc.(*Server).handleOne(0xc000, 0xc001)\n\t/root/go/pkg/mod/gvisor.dev/urpc.go:343 +0x69f\ncreated by gvisor.dev/gvisor/pkg/urpc.(*Server).StartHandling in goroutine 16\n", "panic: write: no space left on device"},
		{"no failure words", "line one\nline two\n", "line one; line two"},
		{"checkpoint on a full disk", "checkpoint failed: checkpointing container \"sb_x\": error serializing object &wire.Struct{TypeID:0x201}: no space left on device:\n\ngoroutine 1 [running]:\npanic({0x131df60?, 0x15cb2e0?})\n\t/usr/local/go/src/runtime/panic.go:860 +0x13a\ngvisor.dev/gvisor/pkg/state.Failf({0x1524a37, 0x20}, {0x2e6?})\n", "checkpoint failed: checkpointing container \"sb_x\": error serializing object &wire.Struct{TypeID:0x201}: no space left on device:"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := tail([]byte(tc.in)); got != tc.want {
				t.Errorf("tail = %q, want %q", got, tc.want)
			}
		})
	}
}

func TestGone(t *testing.T) {
	tests := []struct {
		name   string
		stderr string
		want   bool
	}{
		{"never made", `loading container "sb_x": container with id "sb_x" does not exist`, true},
		{"state file gone while a delete was cut short", `FetchSpec failed: loading container: open /var/lib/sbx/runsc/sb_x_sandbox:sb_x.state: no such file or directory`, true},
		{"cannot find", `cannot find container "sb_x"`, true},
		{"a full disk is not gone", `checkpoint failed: no space left on device`, false},
		{"a locked state file is not gone", `loading container: acquiring lock on "/x/sb_x.lock": resource temporarily unavailable`, false},
		{"another missing file is not gone", `exec failed: open /bin/nope: no such file or directory`, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := gone(tc.stderr); got != tc.want {
				t.Errorf("gone(%q) = %v, want %v", tc.stderr, got, tc.want)
			}
		})
	}
}

func TestProcessStart(t *testing.T) {
	p := Proc{Pid: os.Getpid(), Start: ProcessStart(os.Getpid())}
	if p.Start == "" || !p.Alive() {
		t.Errorf("this process: %+v is not alive", p)
	}
	if ProcessStart(1<<22+12345) != "" {
		t.Errorf("a pid that cannot exist has a start time")
	}
	if (Proc{Pid: os.Getpid(), Start: "1"}).Alive() {
		t.Errorf("a reused pid (another start time) is taken for the process")
	}
}

// TestBootedProcessRefuses: a pid file that names no process, garbage, or a
// process that is not runsc's sandbox process is no answer: runsc state
// must say.
func TestBootedProcessRefuses(t *testing.T) {
	dir := t.TempDir()
	f := filepath.Join(dir, "sandbox.pid")
	if _, ok := BootedProcess(f, "x"); ok {
		t.Error("no pid file: ok")
	}
	for _, content := range []string{"", "garbage", "-1", "0", strconv.Itoa(os.Getpid()), "4194304"} {
		os.WriteFile(f, []byte(content), 0o600)
		if p, ok := BootedProcess(f, "x"); ok {
			t.Errorf("pid file %q: %+v ok", content, p)
		}
	}
}

// A call's timeout is DefaultTimeout unless the context gives its own,
// and the error of a call cut off says which.
func TestCallTimeoutFromContext(t *testing.T) {
	bin := filepath.Join(t.TempDir(), "runsc")
	if err := os.WriteFile(bin, []byte("#!/bin/sh\nsleep \"$SLEEP\"\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	d := &Driver{Path: bin, Root: t.TempDir()}
	if got := CallTimeout(context.Background()); got != DefaultTimeout {
		t.Fatalf("callTimeout without one = %s, want %s", got, DefaultTimeout)
	}
	t.Setenv("SLEEP", "30")
	start := time.Now()
	_, err := d.run(WithTimeout(context.Background(), 200*time.Millisecond), nil, "checkpoint", "x")
	if err == nil || !strings.Contains(err.Error(), "timed out after 200ms") {
		t.Fatalf("a call past its context's timeout: %v, want timed out after 200ms", err)
	}
	if time.Since(start) > 20*time.Second {
		t.Fatalf("the call ran %s: its timeout was not applied", time.Since(start))
	}
	t.Setenv("SLEEP", "0.1")
	if _, err := d.run(WithTimeout(context.Background(), time.Minute), nil, "checkpoint", "x"); err != nil {
		t.Fatalf("a call within its timeout: %v", err)
	}
}
