package freeze

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// fakeCommand stands for /.sbx/freeze: a script that prints out and exits
// with code.
func fakeCommand(t *testing.T, out string, code int) {
	t.Helper()
	p := filepath.Join(t.TempDir(), "freeze")
	script := "#!/bin/sh\necho \"$@\" >" + p + ".args\nprintf '%s' '" + out + "'\necho 'sbx freeze: said on stderr' >&2\nexit " + string(rune('0'+code)) + "\n"
	if err := os.WriteFile(p, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	old := Command
	Command = p
	t.Cleanup(func() { Command = old })
}

func TestNow(t *testing.T) {
	fakeCommand(t, `{"state":"frozen","name":"freeze-x-abcd"}`, 0)
	name, err := Now("TestLogin")
	if err != nil || name != "freeze-x-abcd" {
		t.Fatalf("Now: %q, %v; want freeze-x-abcd", name, err)
	}
	args, _ := os.ReadFile(Command + ".args")
	if !strings.Contains(string(args), "--json --reason TestLogin --failed-at ") {
		t.Errorf("the freeze command got %q", args)
	}
}

func TestNowFails(t *testing.T) {
	fakeCommand(t, "", 1)
	if _, err := Now("x"); err == nil || !strings.Contains(err.Error(), "said on stderr") {
		t.Errorf("Now with a failing freeze: %v, want the command's message", err)
	}
}
