package agent

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"sbx.dev/sbx/internal/wire/frame"
)

// decodeFrames reads a start or attach --framed output.
func decodeFrames(t *testing.T, b []byte) (stdout, stderr string, pid, exit int) {
	t.Helper()
	pid, exit = -1, -1
	buf := make([]byte, frame.MaxPayload)
	r := bytes.NewReader(b)
	for {
		typ, p, err := frame.Read(r, buf)
		if errors.Is(err, io.EOF) {
			return
		}
		if err != nil {
			t.Fatalf("frames: %v", err)
		}
		switch typ {
		case frame.Stdout:
			stdout += string(p)
		case frame.Stderr:
			stderr += string(p)
		case frame.Pid:
			pid, _ = frame.Code(p)
		case frame.Exit:
			exit, _ = frame.Code(p)
		}
	}
}

func startReq(t *testing.T, r StartRequest) io.Reader {
	b, err := json.Marshal(r)
	if err != nil {
		t.Fatal(err)
	}
	return bytes.NewReader(b)
}

func TestStart(t *testing.T) {
	startSupervisor(t)
	tests := []struct {
		name           string
		req            StartRequest
		stdout, stderr string
		exit           int
		pid            bool
		stdinIsNotJSON bool
	}{
		{"output and code", StartRequest{Argv: []string{"sh", "-c", "echo out; echo err >&2; exit 3"}}, "out\n", "err\n", 3, true, false},
		{"env from stdin, not argv", StartRequest{Argv: []string{"sh", "-c", "echo $SECRET"}, Env: []string{"SECRET=hunter2"}}, "hunter2\n", "", 0, true, false},
		{"not found", StartRequest{Argv: []string{"nope-no-such"}}, "", "sbx: nope-no-such: command not found\n", 127, false, false},
		{"timeout", StartRequest{Argv: []string{"sleep", "30"}, Timeout: "200ms"}, "", "sbx: command timed out after 200ms\n", 124, true, false},
		{"unknown user", StartRequest{Argv: []string{"true"}, User: "nobody-at-all"}, "", "", 125, false, false},
		{"bad request", StartRequest{}, "", "", 125, false, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			tc.req.ID = newExecID()
			var in io.Reader = startReq(t, tc.req)
			if tc.stdinIsNotJSON {
				in = strings.NewReader("{not json")
			}
			var out bytes.Buffer
			code := Main([]string{"start"}, in, &out, io.Discard)
			stdout, stderr, pid, exit := decodeFrames(t, out.Bytes())
			if code != tc.exit || exit != tc.exit {
				t.Errorf("exit: process %d, frame %d, want %d (stderr %q)", code, exit, tc.exit, stderr)
			}
			if stdout != tc.stdout {
				t.Errorf("stdout: got %q, want %q", stdout, tc.stdout)
			}
			if tc.stderr != "" && stderr != tc.stderr {
				t.Errorf("stderr: got %q, want %q", stderr, tc.stderr)
			}
			if tc.pid != (pid > 0) {
				t.Errorf("pid frame: got %d, want one: %v", pid, tc.pid)
			}
		})
	}
}

// TestAttachFramedWaits: a copier that attaches to a running command learns
// of its end from init at once, and sends only what is past its offsets.
func TestAttachFramedWaits(t *testing.T) {
	s := startSupervisor(t)
	id := newExecID()
	rep := s.spawn(initRequest{Op: "spawn", ID: id, Argv: []string{"sh", "-c", "echo one; sleep 0.5; echo two; exit 7"}})
	if rep.Error != "" {
		t.Fatal(rep.Error)
	}
	waitFor(t, "the first line", func() bool {
		b, _ := os.ReadFile(filepath.Join(s.dir, id, "stdout"))
		return string(b) == "one\n"
	})
	var out bytes.Buffer
	start := time.Now()
	code := Main([]string{"attach", "--framed", "--id", id, "--stdout-offset", "4"}, nil, &out, io.Discard)
	stdout, _, _, exit := decodeFrames(t, out.Bytes())
	if code != 7 || exit != 7 || stdout != "two\n" {
		t.Errorf("attach: exit %d/%d stdout %q, want 7 and %q", code, exit, stdout, "two\n")
	}
	if took := time.Since(start); took > 2*time.Second {
		t.Errorf("attach took %s to see the end", took)
	}
	// once ended, a wait answers from the exit file
	rep, err := callInitWait(id)
	if err != nil || rep.Exit == nil || *rep.Exit != 7 {
		t.Errorf("wait after the end: %+v %v, want exit 7", rep, err)
	}
	if rep, _ := callInitWait("ex_unknown"); rep.Error == "" {
		t.Errorf("wait for an unknown exec: no error")
	}
}

// TestAttachSaysAlive: a copier of a quiet command says it is there
// (frame.Alive), so the shim can tell it from one stopped in the sandbox.
func TestAttachSaysAlive(t *testing.T) {
	startSupervisor(t)
	old := aliveEvery
	aliveEvery = 20 * time.Millisecond
	t.Cleanup(func() { aliveEvery = old })
	var out bytes.Buffer
	code := Main([]string{"start"}, startReq(t, StartRequest{ID: newExecID(), Argv: []string{"sleep", "0.5"}}), &out, io.Discard)
	if code != 0 {
		t.Fatalf("exit %d", code)
	}
	alive := 0
	buf := make([]byte, frame.MaxPayload)
	r := bytes.NewReader(out.Bytes())
	for {
		typ, _, err := frame.Read(r, buf)
		if err != nil {
			break
		}
		if typ == frame.Alive {
			alive++
		}
	}
	if alive < 5 {
		t.Errorf("%d alive frames in half a second at one every 20ms, want a dozen or so", alive)
	}
}
