package flaky

// Crashes caught at their faulting instruction (every sandbox's, with no
// setup): the process is held in a freeze of the sandbox, and what gdb can
// tell of it is read in a copy resumed from that freeze, where the process
// is still stopped at the fault with its signal pending.

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"sbx.dev/sbx/api"
	"sbx.dev/sbx/client"
	"sbx.dev/sbx/internal/wire/agentwire"
)

// CopyClient is what reading a crash in a copy uses.
type CopyClient interface {
	CrashClient
	Create(ctx context.Context, opts ...client.CreateOption) (*api.Sandbox, error)
	Delete(ctx context.Context, id string) error
}

// copyTTL is the idle ttl of a copy a crash is read in: one left behind by
// a client that went away goes by itself.
const copyTTL = 10 * time.Minute

// withCopy runs fn in a copy resumed from cr's snapshot, then deletes it.
func withCopy(ctx context.Context, c CopyClient, cr client.Crash, fn func(id string) error) error {
	if cr.Snapshot == "" || cr.Pid <= 0 {
		return api.Errorf(api.ErrInvalid, "crash of pid %d: no snapshot to read it in", cr.Pid)
	}
	sb, err := c.Create(ctx, client.WithFrom(cr.Snapshot), client.WithTTL(copyTTL), client.WithMeta("sbx.crash.of", cr.Snapshot))
	if err != nil {
		return fmt.Errorf("a copy of %s: %w", cr.Snapshot, err)
	}
	defer c.Delete(context.WithoutCancel(ctx), sb.ID)
	return fn(sb.ID)
}

// CrashBacktrace returns the stacks of cr's process, every thread's, read
// by gdb in a copy resumed from the crash's snapshot (bounded to
// maxBundleText). In a sandbox with no gdb they are read by this machine's
// gdb from a core sbx-agent writes in the copy (see CrashBundle).
func CrashBacktrace(ctx context.Context, c CopyClient, cr client.Crash) (string, error) {
	var bt string
	err := withCopy(ctx, c, cr, func(id string) error {
		if !hasGDB(ctx, c, id) {
			sig := unix.SignalNum(cr.Signal)
			if sig == 0 {
				return api.Errorf(api.ErrInvalid, "crash of pid %d: unknown signal %q", cr.Pid, cr.Signal)
			}
			tmp, err := os.MkdirTemp("", "sbx-backtrace-")
			if err != nil {
				return err
			}
			defer os.RemoveAll(tmp)
			tok := make([]byte, 6)
			rand.Read(tok)
			out := &Crash{Signal: int(sig), SignalName: cr.Signal, Dir: tmp}
			if err := agentBundle(ctx, c, id, cr, int(sig), path.Join(CrashRoot, hex.EncodeToString(tok)), out); err != nil {
				return err
			}
			bt = stackOf(out.Backtrace)
			if bt == "" {
				bt = out.Backtrace // why there is none
			}
			return nil
		}
		var out limitedBuffer
		out.buf, out.max = &bytes.Buffer{}, maxBundleText
		req := api.ExecRequest{User: "root", Timeout: api.Duration(60 * time.Second), Cmd: []string{"gdb", "-q", "-batch", "-nx",
			"-ex", "set pagination off", "-ex", "set debuginfod enabled off", "-p", strconv.Itoa(cr.Pid), "-ex", "thread apply all bt"}}
		x, err := c.ExecEvents(ctx, id, req, func(ev api.ExecEvent) error {
			if ev.Event == "stdout" || ev.Event == "stderr" {
				out.Write(ev.Data)
			}
			return nil
		})
		if err != nil {
			return err
		}
		if x.ExitCode == nil || *x.ExitCode != 0 {
			return fmt.Errorf("gdb -p %d in a copy of %s: %s", cr.Pid, cr.Snapshot, bytes.TrimSpace(out.buf.Bytes()))
		}
		bt = stackOf(out.buf.String())
		return nil
	})
	return bt, err
}

// stackOf keeps gdb's stack lines (#N ... and the thread headers).
func stackOf(s string) string {
	var b bytes.Buffer
	for _, line := range bytes.Split([]byte(s), []byte("\n")) {
		if bytes.HasPrefix(line, []byte("#")) || bytes.HasPrefix(line, []byte("Thread ")) {
			b.Write(line)
			b.WriteByte('\n')
		}
	}
	return b.String()
}

// CrashBundle writes what a core needs to be readable into dir, from a
// copy resumed from cr's snapshot: crash.tar (a core gdb wrote of the held
// process, the exact program and the libraries it had mapped, each checked
// by build-id, their /usr/lib/debug files if the sandbox has them, the
// mappings, the shared libraries, every thread's backtrace with locals) and
// backtrace.txt beside it. It is bounded (maxBundleBytes, maxBundleEntries).
//
// A sandbox with no gdb (tiny, a distroless image) gets the same bundle
// from sbx-agent gcore instead (a core written through ptrace, the mapped
// files, their build-ids as mapped), and its backtrace.txt is read by the
// gdb of this machine on that core, if it has one (see hostBacktrace).
func CrashBundle(ctx context.Context, c CopyClient, cr client.Crash, dir string) (*Crash, error) {
	sig := unix.SignalNum(cr.Signal)
	if sig == 0 {
		return nil, api.Errorf(api.ErrInvalid, "crash of pid %d: unknown signal %q", cr.Pid, cr.Signal)
	}
	out := &Crash{Signal: int(sig), SignalName: cr.Signal, Dir: dir, Snapshot: cr.Snapshot, Pid: cr.Pid}
	err := withCopy(ctx, c, cr, func(id string) error {
		tok := make([]byte, 6)
		rand.Read(tok)
		remote := path.Join(CrashRoot, hex.EncodeToString(tok))
		if !hasGDB(ctx, c, id) {
			return agentBundle(ctx, c, id, cr, int(sig), remote, out)
		}
		script := bundlePy + fmt.Sprintf("\nbundle(%d, %q, %d)\n", cr.Pid, cr.Signal, sig)
		if err := c.WriteTar(ctx, id, CrashRoot, scriptTar(path.Base(remote), script)); err != nil {
			return fmt.Errorf("install the bundle script: %w", err)
		}
		req := api.ExecRequest{User: "root", Timeout: api.Duration(5 * time.Minute), Cmd: []string{"gdb", "-q", "-batch", "-nx",
			"-ex", "set pagination off", "-ex", "set debuginfod enabled off", "-p", strconv.Itoa(cr.Pid), "-x", remote + "/bundle.py"}}
		if log, err := execLogged(ctx, c, id, req); err != nil {
			return err
		} else if log != nil {
			return fmt.Errorf("gdb -p %d in a copy of %s: %s", cr.Pid, cr.Snapshot, log)
		}
		out.Remote = remote + "/bundle"
		return fetchBundle(ctx, c, id, out)
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// execLogged runs req in id, keeping the first 64 KiB of its output; on a
// non-zero exit it returns that output (trimmed, never nil), else nil.
func execLogged(ctx context.Context, c CopyClient, id string, req api.ExecRequest) ([]byte, error) {
	var log limitedBuffer
	log.buf, log.max = &bytes.Buffer{}, 64<<10
	x, err := c.ExecEvents(ctx, id, req, func(ev api.ExecEvent) error {
		if ev.Event == "stdout" || ev.Event == "stderr" {
			log.Write(ev.Data)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	if x.ExitCode == nil || *x.ExitCode != 0 {
		return append([]byte{}, bytes.TrimSpace(log.buf.Bytes())...), nil
	}
	return nil, nil
}

// scriptTar is a directory tok holding bundle.py.
func scriptTar(tok, script string) io.Reader {
	var b bytes.Buffer
	tw := tar.NewWriter(&b)
	now := time.Now()
	tw.WriteHeader(&tar.Header{Name: tok + "/", Mode: 0o700, ModTime: now, Typeflag: tar.TypeDir})
	tw.WriteHeader(&tar.Header{Name: tok + "/bundle.py", Mode: 0o644, Size: int64(len(script)), ModTime: now, Typeflag: tar.TypeReg})
	tw.Write([]byte(script))
	tw.Close()
	return &b
}

// hasGDB reports whether the sandbox id has gdb and python3 (the bundle
// script is gdb's Python).
func hasGDB(ctx context.Context, c CopyClient, id string) bool {
	x, err := c.ExecEvents(ctx, id, api.ExecRequest{User: "root", Timeout: api.Duration(30 * time.Second), Cmd: []string{"/bin/sh", "-c", "command -v gdb && command -v python3"}},
		func(api.ExecEvent) error { return nil })
	return err == nil && x.ExitCode != nil && *x.ExitCode == 0
}

// agentBundle writes cr's bundle with sbx-agent gcore in the copy id, then
// reads its backtrace with this machine's gdb.
func agentBundle(ctx context.Context, c CopyClient, id string, cr client.Crash, sig int, remote string, out *Crash) error {
	req := api.ExecRequest{User: "root", Timeout: api.Duration(5 * time.Minute), Cmd: []string{agentwire.AgentPath, "gcore",
		"--pid", strconv.Itoa(cr.Pid), "--tid", strconv.Itoa(cr.Tid), "--signal", strconv.Itoa(sig), "--out", remote + "/bundle"}}
	if log, err := execLogged(ctx, c, id, req); err != nil {
		return err
	} else if log != nil {
		return fmt.Errorf("sbx-agent gcore %d in a copy of %s (no gdb there): %s", cr.Pid, cr.Snapshot, log)
	}
	out.Remote = remote + "/bundle"
	if err := fetchBundle(ctx, c, id, out); err != nil {
		return err
	}
	out.Backtrace = hostBacktrace(ctx, out.Tar, cr.Exe)
	return os.WriteFile(filepath.Join(out.Dir, "backtrace.txt"), []byte(out.Backtrace), 0o644)
}

// hostGDBTimeout bounds the gdb of this machine on a bundle.
const hostGDBTimeout = 2 * time.Minute

// hostBacktrace is every thread's backtrace, with locals, read by the gdb
// of this machine from the core and files in the bundle tarPath (exe is
// the crashed program's path in the sandbox), or a line saying why there
// is none. What the bundle holds came from the sandbox: gdb reads it with
// nothing of its own loaded or auto-loaded (-nx, auto-load off, no
// debuginfod), within hostGDBTimeout, its output bounded.
func hostBacktrace(ctx context.Context, tarPath, exe string) string {
	gdb, err := exec.LookPath("gdb")
	if err != nil {
		return "no backtrace: the sandbox has no gdb and neither has this machine; read the core with gdb (gdb files" + exe + " core, set sysroot files)\n"
	}
	tmp, err := os.MkdirTemp("", "sbx-crash-")
	if err != nil {
		return "no backtrace: " + err.Error() + "\n"
	}
	defer os.RemoveAll(tmp)
	if err := untarBundle(tarPath, tmp); err != nil {
		return "no backtrace: unpack the bundle: " + err.Error() + "\n"
	}
	files := filepath.Join(tmp, "files")
	prog := filepath.Join(files, filepath.FromSlash(path.Clean("/"+exe)))
	// the link map names libraries as the loader opened them
	// (/lib/x86_64-linux-gnu/libc.so.6), the bundle by where they are
	// mapped (/usr/lib/...): gdb looks them up by name in their folders too
	libDirs := map[string]bool{}
	_ = filepath.WalkDir(files, func(p string, d fs.DirEntry, err error) error {
		if err == nil && d.Type().IsRegular() && strings.Contains(d.Name(), ".so") && len(libDirs) < 256 {
			libDirs[filepath.Dir(p)] = true
		}
		return nil
	})
	var search []string
	for d := range libDirs {
		search = append(search, d)
	}
	sort.Strings(search)
	ctx, cancel := context.WithTimeout(ctx, hostGDBTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, gdb, "-nx", "-batch", "-q",
		"-iex", "set auto-load off", "-iex", "set debuginfod enabled off", "-iex", "set pagination off", "-iex", "set confirm off",
		"-ex", "set sysroot "+files, "-ex", "set solib-search-path "+strings.Join(search, ":"),
		"-ex", "set debug-file-directory "+filepath.Join(files, "usr", "lib", "debug"),
		"-ex", "file "+prog, "-ex", "core-file "+filepath.Join(tmp, "core"), "-ex", "thread apply all bt full")
	cmd.Dir = tmp
	cmd.Env = []string{"PATH=/usr/bin:/bin", "HOME=" + tmp, "LANG=C"}
	var o limitedBuffer
	o.buf, o.max = &bytes.Buffer{}, maxBundleText
	cmd.Stdout, cmd.Stderr = &o, &o
	if err := cmd.Run(); err != nil && o.buf.Len() == 0 {
		return "no backtrace: gdb on this machine: " + err.Error() + "\n"
	}
	return o.buf.String()
}

// untarBundle unpacks the core and files/ of crash.tar into dir: regular
// files only, by names kept inside dir.
func untarBundle(tarPath, dir string) error {
	f, err := os.Open(tarPath)
	if err != nil {
		return err
	}
	defer f.Close()
	tr := tar.NewReader(f)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return err
		}
		name := strings.TrimPrefix(path.Clean("/"+h.Name), "/")
		if h.Typeflag != tar.TypeReg || (name != "core" && !strings.HasPrefix(name, "files/")) {
			continue
		}
		to := filepath.Join(dir, filepath.FromSlash(name))
		if err := os.MkdirAll(filepath.Dir(to), 0o700); err != nil {
			return err
		}
		w, err := os.OpenFile(to, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o600)
		if err != nil {
			return err
		}
		_, err = io.Copy(w, io.LimitReader(tr, maxBundleBytes))
		if cerr := w.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return err
		}
	}
}
