package sandbox

import (
	"bytes"
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"path"
	"strconv"
	"strings"
	"time"

	"sbx.dev/sbx/api"
	"sbx.dev/sbx/internal/runsc"
	"sbx.dev/sbx/internal/store"
	"sbx.dev/sbx/internal/wire/agentwire"
)

// Every file operation runs the agent inside the sandbox, so every path is
// resolved by the sandbox's own kernel: a symlink to /etc/shadow in the
// sandbox is the sandbox's /etc/shadow. Nothing here touches a host path.

// checkPath checks a path inside the sandbox: absolute, or starting at a
// home directory ("~", "~/x", "~name/x"), which the agent resolves from the
// sandbox's own /etc/passwd.
func checkPath(p string) (string, error) {
	if strings.ContainsRune(p, 0) {
		return "", api.Errorf(api.ErrInvalid, "path: contains a NUL byte")
	}
	if strings.HasPrefix(p, "~") {
		return p, nil
	}
	if p == "" || !strings.HasPrefix(p, "/") {
		return "", api.Errorf(api.ErrInvalid, "path: %q is not an absolute path inside the sandbox (nor ~/...)", p)
	}
	return path.Clean(p), nil
}

// Whatever the agent answers is the sandbox's word, and the sandbox may be
// hostile (root inside can replace the agent): every answer is bounded in
// size and in time, and a sandbox that floods or stalls gets an error on
// that call, never more of sbxd's memory.
const (
	// maxAnswer bounds an answer sbxd reads whole (stat, ls, ports).
	maxAnswer = 16 << 20
	// maxAgentStderr bounds the agent's message on failure.
	maxAgentStderr = 4 << 10
	// inspectTimeout bounds an inspection call (stat, ls, ports).
	inspectTimeout = 30 * time.Second
)

// errAnswerTooLarge is the error of an answer past maxAnswer.
var errAnswerTooLarge = errors.New("answer too large")

// boundedBuffer keeps up to max bytes, in chunks (no doubling that would
// hold twice what was written), and fails the write past them, which ends
// the agent's answer.
type boundedBuffer struct {
	chunks [][]byte
	n, max int
}

const chunk = 1 << 20

func (b *boundedBuffer) Write(p []byte) (int, error) {
	if b.n+len(p) > b.max {
		return 0, errAnswerTooLarge
	}
	n := len(p)
	for len(p) > 0 {
		if len(b.chunks) == 0 || len(b.chunks[len(b.chunks)-1]) == cap(b.chunks[len(b.chunks)-1]) {
			b.chunks = append(b.chunks, make([]byte, 0, min(chunk, max(len(p), 4096))))
		}
		last := &b.chunks[len(b.chunks)-1]
		k := min(len(p), cap(*last)-len(*last))
		*last = append(*last, p[:k]...)
		p = p[k:]
	}
	b.n += n
	return n, nil
}

func (b *boundedBuffer) Len() int { return b.n }

// Bytes returns what was written, in one slice.
func (b *boundedBuffer) Bytes() []byte {
	if len(b.chunks) == 1 {
		return b.chunks[0]
	}
	out := make([]byte, 0, b.n)
	for _, c := range b.chunks {
		out = append(out, c...)
	}
	return out
}

// String returns what was written.
func (b *boundedBuffer) String() string { return string(b.Bytes()) }

// maxNameLen is the longest file name there is (NAME_MAX).
const maxNameLen = 255

// maxAnswerEntries is the most entries sbxd decodes from one agent answer
// that lists things: 16 MiB of "{}," is millions of values, each costing
// far more decoded than its bytes.
const maxAnswerEntries = 1 << 16

// decodeList decodes an agent's answer, a JSON array, one element at a
// time, refusing one of more than max elements before it decodes them.
func decodeList[T any](b []byte, max int, what string) ([]T, error) {
	dec := json.NewDecoder(bytes.NewReader(b))
	if tok, err := dec.Token(); err != nil || tok != json.Delim('[') {
		return nil, fmt.Errorf("%s: decode agent answer: not a JSON array", what)
	}
	out := []T{}
	for dec.More() {
		if len(out) == max {
			return nil, api.Errorf(api.ErrUnavailable, "%s: the sandbox answered more than %d entries; its agent may have been replaced from inside", what, max)
		}
		var v T
		if err := dec.Decode(&v); err != nil {
			return nil, fmt.Errorf("%s: decode agent answer: %w", what, err)
		}
		out = append(out, v)
	}
	if _, err := dec.Token(); err != nil {
		return nil, fmt.Errorf("%s: decode agent answer: %w", what, err)
	}
	return out, nil
}

// inspect runs an agent call whose whole answer sbxd reads, within
// maxAnswer bytes and inspectTimeout.
func (f *sandboxFiles) inspect(ctx context.Context, ref string, args ...string) ([]byte, error) {
	ctx, cancel := context.WithTimeout(ctx, inspectTimeout)
	defer cancel()
	out := &boundedBuffer{max: maxAnswer}
	err := f.agentCall(ctx, ref, nil, out, args...)
	if errors.Is(err, errAnswerTooLarge) || out.Len() >= maxAnswer {
		return nil, api.Errorf(api.ErrUnavailable, "%s: the sandbox answered more than %d MiB; its agent may have been replaced from inside", args[0], maxAnswer>>20)
	}
	if err != nil && ctx.Err() == context.DeadlineExceeded {
		return nil, api.Errorf(api.ErrUnavailable, "%s: the sandbox did not answer within %s", args[0], inspectTimeout)
	}
	return out.Bytes(), err
}

// fileCommands are the agent's subcommands that take --user.
var fileCommands = map[string]bool{"get": true, "put": true, "untar": true, "stat": true, "ls": true, "mkdir": true, "rm": true, "mv": true}

// agentCall runs the agent in a running sandbox and maps its exit codes to
// the API's error kinds. A file subcommand is run for the sandbox's default
// user.
func (f *sandboxFiles) agentCall(ctx context.Context, ref string, stdin io.Reader, stdout io.Writer, args ...string) error {
	sb, err := f.host.whenReady(ctx, ref)
	if err != nil {
		return err
	}
	if u := f.host.defaultUser(sb); u != "" && fileCommands[args[0]] {
		args = append([]string{args[0], "--user", u}, args[1:]...)
	}
	stderr := &boundedBuffer{max: maxAgentStderr}
	code, err := f.host.runAgent(ctx, sb.ID, runsc.ExecOptions{Args: append([]string{runsc.AgentPath}, args...)}, stdin, stdout, stderr)
	if err != nil {
		// Deleted or stopped meanwhile: say that, not how runsc failed.
		if _, rerr := f.host.running(context.WithoutCancel(ctx), sb.ID); rerr != nil {
			return rerr
		}
		return fmt.Errorf("%s in %s: %w", args[0], sb.ID, err)
	}
	msg := strings.ToValidUTF8(strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(stderr.String()), "sbx-agent: ")), "?")
	switch code {
	case 0:
		return nil
	case agentwire.ExitNotFound:
		return api.Errorf(api.ErrNotFound, "%s", msg)
	case agentwire.ExitInvalid:
		return api.Errorf(api.ErrInvalid, "%s", msg)
	case agentwire.ExitExists:
		return api.Errorf(api.ErrConflict, "%s", msg)
	default:
		if msg == "" {
			msg = fmt.Sprintf("exit code %d", code)
		}
		return fmt.Errorf("%s in %s: %s", args[0], sb.ID, msg)
	}
}

// ReadFile streams a file of the sandbox to w. Nothing is written to w
// before the agent has started sending the file, so an error before the
// first byte can still be answered as an error.
func (f *sandboxFiles) read(ctx context.Context, ref, p string, asTar bool, w io.Writer) error {
	p, err := checkPath(p)
	if err != nil {
		return err
	}
	args := []string{"get", p}
	if asTar {
		args = []string{"get", "--tar", p}
	}
	defer f.transfer(ctx, ref)()
	return f.agentCall(ctx, ref, nil, w, args...)
}

// transfer marks a sandbox active while bytes move through the file API,
// from the first byte (a long upload is activity all along), and touches it
// at the end.
func (f *sandboxFiles) transfer(ctx context.Context, ref string) (done func()) {
	sb, err := f.host.Sandbox(ctx, ref)
	if err != nil {
		return func() {}
	}
	release := f.host.lease(sb.ID)
	f.host.touch(ctx, sb.ID)
	return func() {
		release()
		f.host.touch(context.WithoutCancel(ctx), sb.ID)
	}
}

// WriteFile writes size bytes from r to path p in the sandbox. The file
// lands whole or not at all: the agent writes a temporary file and renames
// it only once all size bytes have arrived.
func (f *sandboxFiles) write(ctx context.Context, ref, p string, r io.Reader, size int64, mode string) error {
	p, err := checkPath(p)
	if err != nil {
		return err
	}
	if size < 0 {
		return api.Errorf(api.ErrInvalid, "the upload's length must be known (send Content-Length)")
	}
	if mode == "" {
		mode = "0644"
	}
	if _, err := strconv.ParseUint(mode, 8, 32); err != nil {
		return api.Errorf(api.ErrInvalid, "mode: %q is not an octal file mode", mode)
	}
	defer f.transfer(ctx, ref)()
	return f.agentCall(ctx, ref, r, io.Discard, "put", "--size", strconv.FormatInt(size, 10), "--mode", mode, p)
}

// WriteTar extracts a tar stream under directory p in the sandbox.
func (f *sandboxFiles) writeTar(ctx context.Context, ref, p string, r io.Reader) error {
	p, err := checkPath(p)
	if err != nil {
		return err
	}
	defer f.transfer(ctx, ref)()
	return f.agentCall(ctx, ref, r, io.Discard, "untar", p)
}

// Stat describes one file of the sandbox (the link itself for a symlink).
// Inspection: it does not count as activity.
func (f *sandboxFiles) stat(ctx context.Context, ref, p string) (*api.FileInfo, error) {
	p, err := checkPath(p)
	if err != nil {
		return nil, err
	}
	out, err := f.inspect(ctx, ref, "stat", p)
	if err != nil {
		return nil, err
	}
	var fi api.FileInfo
	if err := json.Unmarshal(out, &fi); err != nil {
		return nil, fmt.Errorf("stat %s: decode agent answer: %w", p, err)
	}
	return &fi, nil
}

// ReadDir lists a directory of the sandbox, sorted by name: the names after
// after ("" from the start), at most limit of them (0: all, within the
// bound of an agent's answer). Inspection: no activity.
func (f *sandboxFiles) readDir(ctx context.Context, ref, p, after string, limit int) ([]api.FileInfo, error) {
	p, err := checkPath(p)
	if err != nil {
		return nil, err
	}
	if strings.ContainsAny(after, "/\x00") || len(after) > maxNameLen {
		return nil, api.Errorf(api.ErrInvalid, "after %.64q: not a file name (at most %d bytes, no '/' or NUL): pass the last name of the previous page", after, maxNameLen)
	}
	args := []string{"ls"}
	if after != "" {
		args = append(args, "--after-hex", hex.EncodeToString([]byte(after)))
	}
	if limit > 0 {
		args = append(args, "--limit", strconv.Itoa(limit))
	}
	out, err := f.inspect(ctx, ref, append(args, "--", p)...)
	if err != nil {
		return nil, err
	}
	max := limit
	if max <= 0 {
		max = maxAnswerEntries
	}
	fis, err := decodeList[api.FileInfo](out, max, "ls "+p)
	if err != nil {
		return nil, err
	}
	return fis, nil
}

// MkdirAll makes directory p in the sandbox and any missing parents, with
// mode's permission bits ("" is 0755), owned by the sandbox's default user.
// An existing directory is no error; a file in the way is api.ErrConflict.
func (f *sandboxFiles) mkdirAll(ctx context.Context, ref, p, mode string) error {
	p, err := checkPath(p)
	if err != nil {
		return err
	}
	if mode == "" {
		mode = "0755"
	}
	if n, err := strconv.ParseUint(mode, 8, 32); err != nil || n > 0o7777 {
		return api.Errorf(api.ErrInvalid, "mode: %q is not an octal file mode", mode)
	}
	defer f.transfer(ctx, ref)()
	return f.agentCall(ctx, ref, nil, io.Discard, "mkdir", "--mode", mode, p)
}

// Remove removes file p in the sandbox (a symlink itself, or an empty
// directory); with recursive a directory and all it holds, and then a
// missing p is no error. A missing p is api.ErrNotFound, a directory that
// is not empty api.ErrConflict.
func (f *sandboxFiles) remove(ctx context.Context, ref, p string, recursive bool) error {
	p, err := checkPath(p)
	if err != nil {
		return err
	}
	if p == "/" {
		return api.Errorf(api.ErrInvalid, "path: refusing to remove /")
	}
	args := []string{"rm", p}
	if recursive {
		args = []string{"rm", "-r", p}
	}
	defer f.transfer(ctx, ref)()
	return f.agentCall(ctx, ref, nil, io.Discard, args...)
}

// Rename renames from to to in the sandbox, as rename(2): a file at to is
// replaced. A missing from is api.ErrNotFound; a directory at to that is
// not empty api.ErrConflict.
func (f *sandboxFiles) rename(ctx context.Context, ref, from, to string) error {
	from, err := checkPath(from)
	if err != nil {
		return err
	}
	if to, err = checkPath(to); err != nil {
		return err
	}
	defer f.transfer(ctx, ref)()
	return f.agentCall(ctx, ref, nil, io.Discard, "mv", from, to)
}

// sandboxFiles owns the file API of running sandboxes: every read, write,
// listing and change goes through the sandbox's agent (a runsc exec), whose
// exit codes map to the API's kinds; bytes moving count as activity. It sees
// the rest of the manager only through filesHost.
type sandboxFiles struct{ host filesHost }

// filesHost is what the file API needs of the rest of the manager.
type filesHost interface {
	Sandbox(ctx context.Context, ref string) (*store.Sandbox, error)
	whenReady(ctx context.Context, ref string) (*store.Sandbox, error)
	running(ctx context.Context, ref string) (*store.Sandbox, error)
	defaultUser(sb *store.Sandbox) string
	// runAgent runs a command (the agent) in sandbox id
	runAgent(ctx context.Context, id string, o runsc.ExecOptions, stdin io.Reader, stdout, stderr io.Writer) (int, error)
	// lease keeps sandbox id active until its release (the reaper's)
	lease(id string) (release func())
	touch(ctx context.Context, id string)
}

// filesHost, as the manager gives it.
type managerFilesHost struct {
	*store.Store
	m *Manager
}

func (h managerFilesHost) whenReady(ctx context.Context, ref string) (*store.Sandbox, error) {
	return h.m.whenReady(ctx, ref)
}
func (h managerFilesHost) running(ctx context.Context, ref string) (*store.Sandbox, error) {
	return h.m.running(ctx, ref)
}
func (h managerFilesHost) defaultUser(sb *store.Sandbox) string { return h.m.defaultUser(sb) }
func (h managerFilesHost) runAgent(ctx context.Context, id string, o runsc.ExecOptions, stdin io.Reader, stdout, stderr io.Writer) (int, error) {
	return h.m.cfg.Runtime.Exec(ctx, id, o, stdin, stdout, stderr)
}
func (h managerFilesHost) lease(id string) func()               { return h.m.reaper.leases.take(id) }
func (h managerFilesHost) touch(ctx context.Context, id string) { h.m.touch(ctx, id) }

// The facade.

// ReadFile: see sandboxFiles.read.
func (m *Manager) ReadFile(ctx context.Context, ref, p string, asTar bool, w io.Writer) error {
	return m.fs.read(ctx, ref, p, asTar, w)
}

// WriteFile: see sandboxFiles.write.
func (m *Manager) WriteFile(ctx context.Context, ref, p string, r io.Reader, size int64, mode string) error {
	return m.fs.write(ctx, ref, p, r, size, mode)
}

// WriteTar: see sandboxFiles.writeTar.
func (m *Manager) WriteTar(ctx context.Context, ref, p string, r io.Reader) error {
	return m.fs.writeTar(ctx, ref, p, r)
}

// Stat: see sandboxFiles.stat.
func (m *Manager) Stat(ctx context.Context, ref, p string) (*api.FileInfo, error) {
	return m.fs.stat(ctx, ref, p)
}

// ReadDir: see sandboxFiles.readDir.
func (m *Manager) ReadDir(ctx context.Context, ref, p, after string, limit int) ([]api.FileInfo, error) {
	return m.fs.readDir(ctx, ref, p, after, limit)
}

// MkdirAll: see sandboxFiles.mkdirAll.
func (m *Manager) MkdirAll(ctx context.Context, ref, p, mode string) error {
	return m.fs.mkdirAll(ctx, ref, p, mode)
}

// Remove: see sandboxFiles.remove.
func (m *Manager) Remove(ctx context.Context, ref, p string, recursive bool) error {
	return m.fs.remove(ctx, ref, p, recursive)
}

// Rename: see sandboxFiles.rename.
func (m *Manager) Rename(ctx context.Context, ref, from, to string) error {
	return m.fs.rename(ctx, ref, from, to)
}

func (m *Manager) agentCall(ctx context.Context, ref string, stdin io.Reader, stdout io.Writer, args ...string) error {
	return m.fs.agentCall(ctx, ref, stdin, stdout, args...)
}

func (m *Manager) inspect(ctx context.Context, ref string, args ...string) ([]byte, error) {
	return m.fs.inspect(ctx, ref, args...)
}
