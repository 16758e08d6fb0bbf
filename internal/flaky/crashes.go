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
	"path"
	"strconv"
	"time"

	"golang.org/x/sys/unix"

	"sbx.dev/sbx/api"
	"sbx.dev/sbx/client"
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
// maxBundleText).
func CrashBacktrace(ctx context.Context, c CopyClient, cr client.Crash) (string, error) {
	var bt string
	err := withCopy(ctx, c, cr, func(id string) error {
		var out limitedBuffer
		out.buf, out.max = &bytes.Buffer{}, maxBundleText
		req := api.ExecRequest{User: "root", Timeout: "60s", Cmd: []string{"gdb", "-q", "-batch", "-nx",
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
// backtrace.txt beside it. It is bounded as --on-crash's bundle is.
func CrashBundle(ctx context.Context, c CopyClient, cr client.Crash, dir string) (*Crash, error) {
	sig := unix.SignalNum(cr.Signal)
	if sig == 0 {
		return nil, api.Errorf(api.ErrInvalid, "crash of pid %d: unknown signal %q", cr.Pid, cr.Signal)
	}
	out := &Crash{Signal: int(sig), SignalName: cr.Signal, Dir: dir}
	err := withCopy(ctx, c, cr, func(id string) error {
		tok := make([]byte, 6)
		rand.Read(tok)
		remote := path.Join(CrashRoot, hex.EncodeToString(tok))
		script := bundlePy + fmt.Sprintf("\nbundle(%d, %q, %d)\n", cr.Pid, cr.Signal, sig)
		if err := c.WriteTar(ctx, id, CrashRoot, scriptTar(path.Base(remote), script)); err != nil {
			return fmt.Errorf("install the bundle script: %w", err)
		}
		var log limitedBuffer
		log.buf, log.max = &bytes.Buffer{}, 64<<10
		req := api.ExecRequest{User: "root", Timeout: "5m", Cmd: []string{"gdb", "-q", "-batch", "-nx",
			"-ex", "set pagination off", "-ex", "set debuginfod enabled off", "-p", strconv.Itoa(cr.Pid), "-x", remote + "/bundle.py"}}
		x, err := c.ExecEvents(ctx, id, req, func(ev api.ExecEvent) error {
			if ev.Event == "stdout" || ev.Event == "stderr" {
				log.Write(ev.Data)
			}
			return nil
		})
		if err != nil {
			return err
		}
		if x.ExitCode == nil || *x.ExitCode != 0 {
			return fmt.Errorf("gdb -p %d in a copy of %s: %s", cr.Pid, cr.Snapshot, bytes.TrimSpace(log.buf.Bytes()))
		}
		out.Remote = remote + "/bundle"
		return fetchBundle(ctx, c, id, out)
	})
	if err != nil {
		return nil, err
	}
	return out, nil
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
