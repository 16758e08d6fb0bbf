package agent

import (
	"bytes"
	"io"
	"strings"
	"testing"
)

// TestAttack31AttachRefusals: an attach on the channel is framed or
// refused with exit 125 and a word why, as the other refusals are: a
// --framed=false after the --framed, or flags attach does not take, got
// unframed output or nothing at all on the connection (a copy sbxd takes
// for lost, and tries again).
func TestAttack31AttachRefusals(t *testing.T) {
	startSupervisor(t)
	id := newExecID()
	var out bytes.Buffer
	Main([]string{"start"}, startReq(t, StartRequest{ID: id, Argv: []string{"sh", "-c", "echo one"}}), &out, io.Discard)
	for _, tc := range []struct {
		name string
		line string
		want string
	}{
		{"framed, then not", `{"args":["attach","--framed","--framed=false","--id","` + id + `"]}`, "--framed"},
		{"an unknown flag", `{"args":["attach","--framed","--id","` + id + `","--bogus"]}`, "bogus"},
		{"no id", `{"args":["attach","--framed"]}`, "--id"},
		{"an argument", `{"args":["attach","--framed","--id","` + id + `","x"]}`, "unexpected"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := askChannelLine(t, tc.line)
			if len(b) == 0 || b[0] != 'o' && b[0] != 'e' && b[0] != 'x' && b[0] != 'p' {
				t.Fatalf("%s: not frames: %q", tc.name, b)
			}
			_, stderr, _, exit := decodeFrames(t, b)
			if exit != ExitUsageExec || !strings.Contains(stderr, tc.want) {
				t.Errorf("%s: exit %d, stderr %q; want %d and %q", tc.name, exit, stderr, ExitUsageExec, tc.want)
			}
		})
	}
}
