package agent

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
)

// agentBin is the sbx-agent binary built once for the exec tests, which need
// a process of their own (signals, process groups, a subreaper).
var agentBin string

// binSocket and binExecsDir are where agentBin's init listens and keeps its
// commands, set at build time so that its tests touch nothing of the host's.
var binSocket, binExecsDir string

func TestMain(m *testing.M) {
	os.Exit(testMain(m))
}

func testMain(m *testing.M) int {
	defaultSignals()
	dir, err := os.MkdirTemp("", "sbx-agent-test-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(dir)
	agentBin = filepath.Join(dir, "sbx-agent")
	binSocket = fmt.Sprintf("@sbx-agent-test-%d", os.Getpid())
	binExecsDir = filepath.Join(dir, "execs")
	build := exec.Command("go", "build", "-o", agentBin, "-ldflags",
		"-X sbx.dev/sbx/internal/agent.initSocket="+binSocket+" -X sbx.dev/sbx/internal/agent.execsDir="+binExecsDir,
		"sbx.dev/sbx/cmd/sbx-agent")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "build sbx-agent: %s\n%s", err, out)
		return 1
	}
	// beside the agent, as sbxd installs it: a timeout is then init's
	if out, err := exec.Command("../../cmd/sbx-reaper/build.sh", filepath.Join(dir, reaperName)).CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "build sbx-reaper (gcc: make deps installs it): %s\n%s", err, out)
		return 1
	}
	return m.Run()
}

// run calls Main in this process and returns its exit code and output.
func run(t *testing.T, stdin io.Reader, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	if stdin == nil {
		stdin = strings.NewReader("")
	}
	var out, errb bytes.Buffer
	code = Main(args, stdin, &out, &errb)
	return code, out.String(), errb.String()
}

// writeFile writes a file with a mode, failing the test on error.
func writeFile(t *testing.T, path, content string, mode os.FileMode) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(content), mode); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(path, mode); err != nil {
		t.Fatal(err)
	}
}

func TestMainUsage(t *testing.T) {
	tests := []struct {
		name    string
		args    []string
		code    int
		wantErr string
	}{
		{"no subcommand", nil, ExitInvalid, "usage"},
		{"unknown subcommand", []string{"frob"}, ExitInvalid, `sbx-agent: unknown subcommand "frob"`},
		{"relative path", []string{"stat", "etc"}, ExitInvalid, "sbx-agent: path etc is not absolute"},
		{"missing path", []string{"get"}, ExitInvalid, "usage: sbx-agent get [--tar] [--user U] PATH"},
		{"unknown flag", []string{"get", "--frob", "/x"}, ExitInvalid, "flag provided but not defined"},
		{"extra argument", []string{"ls", "/a", "/b"}, ExitInvalid, "want 1 argument(s), got 2"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			code, _, stderr := run(t, nil, tc.args...)
			if code != tc.code {
				t.Errorf("exit code: got %d, want %d", code, tc.code)
			}
			if !strings.Contains(stderr, tc.wantErr) {
				t.Errorf("stderr: got %q, want it to contain %q", stderr, tc.wantErr)
			}
		})
	}
}

// TestSigDfl: sigdfl gives a command started in the background (SIGINT and
// SIGQUIT ignored, as a shell's & leaves them) its default signals back.
func TestSigDfl(t *testing.T) {
	const intQuit = 1<<(2-1) | 1<<(3-1) // SigIgn's bits for SIGINT and SIGQUIT
	for _, tc := range []struct {
		name, cmd string
		want      uint64
	}{
		{"plain &", `sh -c 'grep SigIgn /proc/self/status' &` + "\nwait", intQuit},
		{"through sigdfl", agentBin + ` sigdfl -- sh -c 'grep SigIgn /proc/self/status' &` + "\nwait", 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out, err := exec.Command("sh", "-c", "trap '' INT QUIT\n"+tc.cmd).CombinedOutput()
			if err != nil {
				t.Fatalf("%v: %s", err, out)
			}
			// other bits are whatever this test was started with
			var ign uint64
			if _, err := fmt.Sscanf(strings.TrimSpace(string(out)), "SigIgn:\t%x", &ign); err != nil {
				t.Fatalf("%q: %v", out, err)
			}
			if got := ign & intQuit; got != tc.want {
				t.Errorf("SIGINT and SIGQUIT ignored bits %#x, want %#x (SigIgn %#x)", got, tc.want, ign)
			}
		})
	}
	if code, _, _ := run(t, nil, "sigdfl", "--", "/no/such/prog"); code != ExitNotFoundExec {
		t.Errorf("an unknown program: exit %d, want %d", code, ExitNotFoundExec)
	}
}

// defaultSignals gives the commands the tests start the default actions of
// the signals this process was started with ignored (nohup ignores SIGHUP,
// a shell's background job SIGINT and SIGQUIT). Ignored signals stay
// ignored across fork and exec, and a shell cannot trap a signal ignored on
// entry: TestExecForwardsSignals/SIGHUP looped for 30 minutes under nohup.
// Handled signals are reset by exec, so handling them here is what puts
// them back to their defaults in the children; this process goes on
// ignoring them, as it was asked to.
func defaultSignals() {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return
	}
	var ignored uint64
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "SigIgn:"); ok {
			ignored, _ = strconv.ParseUint(strings.TrimSpace(v), 16, 64)
		}
	}
	for _, sig := range []syscall.Signal{syscall.SIGHUP, syscall.SIGINT, syscall.SIGQUIT, syscall.SIGTERM, syscall.SIGUSR1, syscall.SIGUSR2} {
		if ignored&(1<<(uint(sig)-1)) != 0 {
			signal.Notify(make(chan os.Signal, 1), sig)
		}
	}
}
