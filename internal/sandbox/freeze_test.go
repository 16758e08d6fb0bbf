package sandbox

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"sbx.dev/sbx/internal/runsc"
	"sbx.dev/sbx/internal/wire/freezewire"
)

// slotWith makes a slot whose state file holds state.
func slotWith(t *testing.T, state string) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "im_abcdefghij")
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{freezewire.StateFile, freezewire.PagesMetaFile, freezewire.PagesFile} {
		if err := os.WriteFile(filepath.Join(dir, f), nil, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(dir, freezewire.StateFile), []byte(state), 0o600); err != nil {
		t.Fatal(err)
	}
	return dir
}

// holder starts a process that holds the slot's state file open (as the
// sandbox's process holds gVisor's files until its checkpoint is done), or
// none of them.
func holder(t *testing.T, dir string, hold bool) runsc.Proc {
	t.Helper()
	cmd := exec.Command("sleep", "60")
	if hold {
		f, err := os.OpenFile(filepath.Join(dir, freezewire.StateFile), os.O_RDWR, 0)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		cmd.ExtraFiles = []*os.File{f}
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	return runsc.Proc{Pid: cmd.Process.Pid, Start: runsc.ProcessStart(cmd.Process.Pid)}
}

// TestSlotOutcome: what sbxd decides of a slot comes from gVisor's files,
// never from the sandbox's word: held open is not done, let go with a
// statefile is whole, let go with gVisor's error is failed, and nothing
// can be said once the boot's process is gone, unless sbxd noted it first.
func TestSlotOutcome(t *testing.T) {
	whole := stateMagic + "rest of a statefile"
	t.Run("held", func(t *testing.T) {
		dir := slotWith(t, whole) // written, still being written
		if out, _ := slotOutcome(dir, holder(t, dir, true)); out != slotOpen {
			t.Errorf("a slot the process holds: %v, want open", out)
		}
		if _, err := os.Stat(filepath.Join(dir, freezewire.DoneFile)); err == nil {
			t.Error("an open slot was noted as done")
		}
	})
	t.Run("whole", func(t *testing.T) {
		dir := slotWith(t, whole)
		if out, _ := slotOutcome(dir, holder(t, dir, false)); out != slotWhole {
			t.Errorf("a statefile let go: %v, want whole", out)
		}
		// noted: once the process is gone, the slot still says so
		if out, _ := slotOutcome(dir, runsc.Proc{}); out != slotWhole {
			t.Errorf("a noted whole slot, its process gone: %v, want whole", out)
		}
	})
	t.Run("failed", func(t *testing.T) {
		dir := slotWith(t, appSaveFailed+"write pages: no space left on device\n")
		out, why := slotOutcome(dir, holder(t, dir, false))
		if out != slotFailed || why != "write pages: no space left on device" {
			t.Errorf("gVisor's error let go: %v %q, want failed with gVisor's error", out, why)
		}
		// gVisor writes its error once the save is over, and a failed save
		// may leave its writer open: still held, still failed
		dir = slotWith(t, appSaveFailed+"error serializing object\n")
		if out, _ := slotOutcome(dir, holder(t, dir, true)); out != slotFailed {
			t.Errorf("gVisor's error, the file still held: %v, want failed", out)
		}
	})
	t.Run("half written", func(t *testing.T) {
		// a process that is not the boot's (or one that ended): a state
		// file cut short says nothing
		dir := slotWith(t, "garbage, not a statefile")
		if out, _ := slotOutcome(dir, holder(t, dir, false)); out != slotFailed {
			t.Errorf("a state file that is no statefile, let go: %v, want failed", out)
		}
	})
	t.Run("gone", func(t *testing.T) {
		dir := slotWith(t, whole)
		p := holder(t, dir, false)
		proc, _ := os.FindProcess(p.Pid)
		proc.Kill()
		for deadline := time.Now().Add(5 * time.Second); !zombie(p.Pid) && time.Now().Before(deadline); {
			time.Sleep(5 * time.Millisecond)
		}
		// a zombie has let go of everything: that says nothing
		if out, _ := slotOutcome(dir, p); out != slotUnseen {
			t.Errorf("a slot whose process died: %v, want unseen", out)
		}
		if out, _ := slotOutcome(dir, runsc.Proc{}); out != slotUnseen {
			t.Errorf("a slot with no process: %v, want unseen", out)
		}
	})
	t.Run("forged note", func(t *testing.T) {
		// the note is sbxd's; a symlink in its place (nothing inside can
		// write the slot, but the host's other users) is not read
		dir := slotWith(t, whole)
		if err := os.Symlink("/etc/hostname", filepath.Join(dir, freezewire.DoneFile)); err != nil {
			t.Fatal(err)
		}
		if out, _ := slotOutcome(dir, runsc.Proc{}); out != slotUnseen {
			t.Errorf("a symlinked note: %v, want unseen", out)
		}
	})
}

// TestReadVerdictForged: a verdict that cannot be read, or names another
// slot, is a verdict with nothing in it: it wakes sbxd, and decides nothing.
func TestReadVerdictForged(t *testing.T) {
	dir := slotWith(t, "")
	for _, body := range []string{"{not json", `{"slot":"im_zzzzzzzzzz","result":"frozen"}`, strings.Repeat("x", 10000)} {
		if err := os.WriteFile(filepath.Join(dir, freezewire.VerdictFile), []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		v, ok := readVerdict(dir)
		if !ok || v.Slot != "im_abcdefghij" || v.Result != "" {
			t.Errorf("verdict %.30q: %+v %v, want an empty verdict of the slot", body, v, ok)
		}
	}
}

// A freeze's memory/ keeps gVisor's files only: a verdict the console shim
// wrote into the slot as it was moved, or that write's temporary, is
// dropped before the image's sizes are taken (a temporary counted while
// empty made every copy from the freeze fail as damaged).
func TestDropSlotFiles(t *testing.T) {
	dir := t.TempDir()
	gvisor := []string{freezewire.StateFile, freezewire.PagesMetaFile, freezewire.PagesFile, ".hidden-of-gvisor", "verdict.img"}
	sbx := []string{freezewire.VerdictFile, ".verdict.sbx-305049593", freezewire.DoneFile, ".done.sbx-1", slotMetaFile, "." + slotMetaFile + ".sbx-77"}
	for _, f := range append(append([]string{}, gvisor...), sbx...) {
		if err := os.WriteFile(filepath.Join(dir, f), []byte("x"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	dropSlotFiles(dir)
	for _, f := range gvisor {
		if _, err := os.Stat(filepath.Join(dir, f)); err != nil {
			t.Errorf("%s was dropped: %v", f, err)
		}
	}
	for _, f := range sbx {
		if _, err := os.Stat(filepath.Join(dir, f)); err == nil {
			t.Errorf("%s of sbx's is still in memory/", f)
		}
	}
}
