package freezewire

import (
	"reflect"
	"strings"
	"testing"
	"time"
)

func TestLineParse(t *testing.T) {
	at := time.Date(2026, 1, 2, 3, 4, 5, 6, time.UTC)
	v := Verdict{Result: Frozen, Record: Record{Slot: "im_abcdefghij", Pid: 42, UID: 1000, Cmd: "python3 -m pytest", Reason: "test_x", FailedAt: at, Triggered: at, Done: at.Add(time.Second)}}
	line := Line(v)
	if line[0] != ControlByte || line[len(line)-1] != '\n' || len(line) > MaxLine {
		t.Fatalf("line %q: want a control byte first, a newline last, at most %d bytes", line, MaxLine)
	}
	got, err := Parse(line)
	if err != nil {
		t.Fatal(err)
	}
	if got.Slot != v.Slot || got.Result != v.Result || got.Pid != 42 || got.Cmd != v.Cmd || !got.Done.Equal(v.Done) {
		t.Errorf("got %+v, want %+v", got, v)
	}
}

// TestLineLeavesBookkeeping: a line carries what the sandbox says of a
// freeze, not init's own record of it (a list of pids would blow MaxLine).
func TestLineLeavesBookkeeping(t *testing.T) {
	pids := make([]int, 2000)
	v := Verdict{Result: Frozen, Record: Record{State: "frozen", Name: "n", Sandbox: "sb_x", Slot: "im_abcdefghij", Error: "e", Pids: pids, PausedMs: 3, Reason: "r"}}
	line := Line(v)
	if len(line) > MaxLine {
		t.Fatalf("line of %d bytes, over %d", len(line), MaxLine)
	}
	got, err := Parse(line)
	if err != nil {
		t.Fatal(err)
	}
	if want := (Verdict{Result: Frozen, Record: Record{Slot: "im_abcdefghij", Reason: "r"}}); !reflect.DeepEqual(got, want) {
		t.Errorf("got %+v, want %+v", got, want)
	}
}

func TestParseRefuses(t *testing.T) {
	for _, tc := range []struct{ name, line, want string }{
		{"not ours", "hello\n", "not a freeze line"},
		{"bad json", Prefix + "{\n", "freeze line"},
		{"bad slot", Prefix + `{"slot":"../../etc","result":"frozen"}`, "bad slot"},
		{"unknown result", Prefix + `{"slot":"im_abcdefghij","result":"won"}`, "unknown result"},
		{"too long", Prefix + `{"slot":"im_abcdefghij","result":"frozen","cmd":"` + strings.Repeat("x", MaxLine) + `"}`, "over"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Parse([]byte(tc.line))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("Parse(%.40q): %v, want an error with %q", tc.line, err, tc.want)
			}
		})
	}
}

// TestLineBounds: long text from the sandbox is cut, never split in the
// middle of a rune, and control characters cannot reach a terminal.
func TestLineBounds(t *testing.T) {
	v := Verdict{Result: Failed, Record: Record{Slot: "im_abcdefghij", Cmd: strings.Repeat("é", 2000), Reason: "a\x1b[2Jb\nc"}}
	line := Line(v)
	if len(line) > MaxLine {
		t.Fatalf("line of %d bytes, over %d", len(line), MaxLine)
	}
	got, err := Parse(line)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasSuffix(got.Cmd, "é...") {
		t.Errorf("cmd cut as %q, want whole runes and an ellipsis", got.Cmd[len(got.Cmd)-10:])
	}
	if got.Reason != "a?[2Jb?c" {
		t.Errorf("reason %q, want control characters replaced", got.Reason)
	}
	if !ValidSlot("im_abcdefghij") || ValidSlot("im_ABCDEFGHIJ") || ValidSlot("im_abc") || ValidSlot("x/im_abcdefghij") {
		t.Error("ValidSlot accepts or refuses the wrong slots")
	}
}
