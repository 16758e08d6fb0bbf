package e2e

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"
)

// TestAttackMeShellJobControl: job control in a shell on the PTY, with
// init's signals taken and the kernel dropping what the sandbox sends
// init: ^Z stops the foreground job, bg/fg/kill %1 work, ^C ends one.
func TestAttackMeShellJobControl(t *testing.T) {
	d := shared
	id := d.newSandbox(t, "--template", "base")
	url := "ws://" + d.tcp + "/v1/sandboxes/" + id + "/exec/pty?cols=100&rows=30"
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c, _, err := websocket.Dial(ctx, url, &websocket.DialOptions{HTTPHeader: http.Header{"Authorization": {"Bearer " + d.token}}})
	if err != nil {
		t.Fatal(err)
	}
	defer c.CloseNow()
	send := func(s string) {
		t.Helper()
		if err := c.Write(ctx, websocket.MessageBinary, []byte(s)); err != nil {
			t.Fatal(err)
		}
	}
	var out strings.Builder
	readUntil := func(want string) {
		t.Helper()
		out.Reset()
		for !strings.Contains(out.String(), want) {
			typ, b, err := c.Read(ctx)
			if err != nil || typ == websocket.MessageText {
				t.Fatalf("waiting for %q: %v %s; got %q", want, err, b, out.String())
			}
			out.Write(b)
		}
	}
	send("exec bash -i\r")
	send("echo ready-$((6*7))\r")
	readUntil("ready-42")
	send("sleep 300\r")
	// sleep runs by now, so that ^Z is not typed ahead: nothing the shell echoes says when it starts
	time.Sleep(time.Second)
	send("\x1a") // ^Z
	readUntil("Stopped")
	send("jobs -l; echo j-$((1+1))\r")
	readUntil("j-2")
	if !strings.Contains(out.String(), "Stopped") {
		t.Errorf("jobs after ^Z: %q", out.String())
	}
	send("bg; sleep 0.5; jobs; echo b-$((2+1))\r")
	readUntil("b-3")
	if !strings.Contains(out.String(), "Running") {
		t.Errorf("jobs after bg: %q", out.String())
	}
	send("kill %1; sleep 0.5; jobs; echo k-$((3+1))\r")
	readUntil("k-4")
	send("sleep 300\r")
	// sleep runs by now, so that ^C is not typed ahead: nothing the shell echoes says when it starts
	time.Sleep(time.Second)
	send("\x03") // ^C
	send("echo rc=$?\r")
	readUntil("rc=130")
	send("exit 0\r")
}
