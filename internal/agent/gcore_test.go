package agent

import (
	"bytes"
	"debug/elf"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"sbx.dev/sbx/internal/procfs"
)

// TestGcore: the core sbx-agent writes of a stopped process is an ELF core
// with a thread and its memory that gdb reads a backtrace from, with the
// files it had mapped beside it and their build-ids as mapped.
func TestGcore(t *testing.T) {
	if os.Getuid() != 0 || runtime.GOARCH != "amd64" {
		t.Skip("needs root (ptrace) on amd64")
	}
	cmd := exec.Command("sleep", "100")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	// stop it in its nanosleep, once sleep runs (not the child before the
	// exec, nor the loader)
	waitFor(t, "sleep to sleep", func() bool {
		st, err := procfs.ReadStat(cmd.Process.Pid)
		return err == nil && st.Comm == "sleep" && st.State == 'S'
	})
	if err := cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	out := t.TempDir()
	var stdout bytes.Buffer
	if err := runGcore([]string{"--pid", strconv.Itoa(cmd.Process.Pid), "--signal", "11", "--out", out}, &stdout); err != nil {
		t.Fatal(err)
	}
	f, err := elf.Open(filepath.Join(out, "core"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	loads, notes := 0, 0
	for _, p := range f.Progs {
		switch p.Type {
		case elf.PT_LOAD:
			loads++
		case elf.PT_NOTE:
			notes++
		}
	}
	if f.Type != elf.ET_CORE || f.Machine != elf.EM_X86_64 || loads == 0 || notes != 1 {
		t.Errorf("core: type %v machine %v, %d loads %d notes; want an x86-64 core with both", f.Type, f.Machine, loads, notes)
	}
	exe, _ := os.Readlink("/proc/" + strconv.Itoa(cmd.Process.Pid) + "/exe")
	if _, err := os.Stat(filepath.Join(out, "files", exe)); err != nil {
		t.Errorf("the program %s is not in files/: %v", exe, err)
	}
	ids, _ := os.ReadFile(filepath.Join(out, "buildids.txt"))
	if !strings.Contains(string(ids), " "+exe+"\n") || strings.HasPrefix(string(ids), "- ") {
		t.Errorf("buildids.txt %q: want the program's build-id read from memory", ids)
	}
	gdb, err := exec.LookPath("gdb")
	if err != nil {
		return
	}
	files := filepath.Join(out, "files")
	libc, _ := filepath.Glob(filepath.Join(files, "*", "lib", "*", "libc.so*"))
	search := ""
	if len(libc) > 0 {
		search = filepath.Dir(libc[0])
	}
	bt, _ := exec.Command(gdb, "-nx", "-batch", "-iex", "set auto-load off", "-iex", "set debuginfod enabled off",
		"-ex", "set sysroot "+files, "-ex", "set solib-search-path "+search, "-ex", "file "+filepath.Join(files, exe), "-ex", "core-file "+filepath.Join(out, "core"), "-ex", "bt").CombinedOutput()
	t.Logf("gdb on the core:\n%s", bt)
	if !strings.Contains(string(bt), "#0 ") || !strings.Contains(string(bt), "SIGSEGV") || !strings.Contains(string(bt), "nanosleep") {
		t.Errorf("gdb on the core:\n%s", bt)
	}
}
