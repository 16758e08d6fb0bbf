package sandbox

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"time"

	"sbx.dev/sbx/api"
	"sbx.dev/sbx/internal/follow"
	"sbx.dev/sbx/internal/store"
)

// The log streams of a sandbox. All of them live in the sandbox's directory
// (or the store), so they survive stop and resume and go with the sandbox.
//
//   - console: DATA_DIR/sandboxes/ID/console.log, the first process's stdout
//     and stderr. The same file is bound at /dev/console inside (see
//     runsc.SpecOptions.ConsoleFile), so `echo X > /dev/console` lands here;
//     runsc's own stderr of `runsc run`/`restore` lands here too.
//   - runtime: runsc's own lines of console.log (glog-formatted lines and its
//     start errors), then DATA_DIR/sandboxes/ID/runsc.log if something put
//     one there. sbxd does not run runsc with a per-sandbox --debug-log, so
//     this is what runsc said on stderr, not its debug log.
//   - events: the sandbox's lifecycle events, one line each:
//     "TIME TYPE key=value ..." with the detail sorted by key.
//   - exec/EXEC_ID: one exec's stdout and stderr, as exec/EXEC_ID/stdout and
//     exec/EXEC_ID/stderr.
const (
	StreamConsole = "console"
	StreamEvents  = "events"
	StreamRuntime = "runtime"
)

// logsOwner owns the reading of a sandbox's logs and events: the console,
// runtime, events and exec streams, and the events feed, followed through
// internal/follow. It writes nothing; it sees the rest of the manager only
// through logsHost.
type logsOwner struct{ host logsHost }

// logsHost is what the logs owner needs of the rest of the manager.
type logsHost interface {
	Sandbox(ctx context.Context, ref string) (*store.Sandbox, error)
	Exec(ctx context.Context, sandboxID, execID string) (*api.Exec, error)
	Events(ctx context.Context, sandboxID string, after int64) ([]api.Event, error)
	DeletedByName(ctx context.Context, name string) (string, error)
	// Changed is closed at the next committed event (the store's feed)
	Changed() <-chan struct{}
	sandboxDir(id string) string
	execDir(sandboxID, execID string) string
	// output is the exec owner's: an exec's output, and its end
	output(ctx context.Context, sandboxID, execID string, following bool, emit func(api.ExecEvent) error) error
	execsChanged() <-chan struct{}
	fileWatcher() *follow.Files
	now() time.Time
}

// logsHost, as the manager gives it.
type managerLogsHost struct {
	*store.Store
	m *Manager
}

func (h managerLogsHost) sandboxDir(id string) string { return h.m.sandboxDir(id) }
func (h managerLogsHost) execDir(sandboxID, execID string) string {
	return h.m.execDir(sandboxID, execID)
}
func (h managerLogsHost) output(ctx context.Context, sandboxID, execID string, following bool, emit func(api.ExecEvent) error) error {
	return h.m.execs.output(ctx, sandboxID, execID, following, emit)
}
func (h managerLogsHost) execsChanged() <-chan struct{} { return h.m.execs.table.watch() }
func (h managerLogsHost) fileWatcher() *follow.Files    { return &h.m.files }
func (h managerLogsHost) now() time.Time                { return h.m.now() }

// The facade.

// Logs: see logsOwner.logs.
func (m *Manager) Logs(ctx context.Context, ref, stream string, follow bool, tail int, emit func(api.LogEvent) error) error {
	return m.logs.logs(ctx, ref, stream, follow, tail, emit)
}

// Events: see logsOwner.events.
func (m *Manager) Events(ctx context.Context, ref string, after int64, following bool, emit func(api.Event) error) error {
	return m.logs.events(ctx, ref, after, following, emit)
}

// Logs sends one of a sandbox's log streams (StreamConsole when stream is
// empty): the last tail lines (all of it when tail is 0), then, with
// follow, what comes until ctx ends, the sandbox is deleted, or (for an
// exec) the exec ends. Reading a log is inspection: it is not activity.
// An unknown stream or a negative tail is api.ErrInvalid; an unknown
// sandbox or exec, api.ErrNotFound.
func (l *logsOwner) logs(ctx context.Context, ref, stream string, follow bool, tail int, emit func(api.LogEvent) error) error {
	if tail < 0 {
		return api.Errorf(api.ErrInvalid, "tail: %d is not a count of lines", tail)
	}
	sb, err := l.host.Sandbox(ctx, ref)
	if err != nil {
		return err
	}
	if stream == "" {
		stream = StreamConsole
	}
	dir := l.host.sandboxDir(sb.ID)
	gone := func() (bool, error) {
		cur, err := l.host.Sandbox(context.WithoutCancel(ctx), sb.ID)
		if errors.Is(err, api.ErrNotFound) {
			return true, nil
		}
		if err != nil {
			return false, err
		}
		return cur.State == api.StateDeleted, nil
	}
	switch {
	case stream == StreamConsole:
		files := []*logFile{{stream: StreamConsole, path: filepath.Join(dir, "console.log")}}
		return followLogs(ctx, l.host.fileWatcher(), files, follow, tail, gone, l.host.now, emit, l.host.Changed)
	case stream == StreamRuntime:
		files := []*logFile{
			{stream: StreamRuntime, path: filepath.Join(dir, "console.log"), match: isRuntimeLine},
			{stream: StreamRuntime, path: filepath.Join(dir, "runsc.log"), objects: true},
		}
		return followLogs(ctx, l.host.fileWatcher(), files, follow, tail, gone, l.host.now, emit, l.host.Changed)
	case stream == StreamEvents:
		return l.eventLog(ctx, sb.ID, follow, tail, gone, emit)
	case strings.HasPrefix(stream, "exec/"):
		execID := strings.TrimPrefix(stream, "exec/")
		if execID == "" || strings.Contains(execID, "/") {
			return api.Errorf(api.ErrInvalid, "stream %q: name an exec as exec/EXEC_ID (the execs of %s are listed by its execs)", stream, sb.ID)
		}
		return l.execLog(ctx, sb.ID, execID, follow, tail, emit)
	default:
		return api.Errorf(api.ErrInvalid, "stream %q: the streams are console, events, runtime and exec/EXEC_ID", stream)
	}
}

// execLog sends an exec's output as a log stream.
func (l *logsOwner) execLog(ctx context.Context, sandboxID, execID string, follow bool, tail int, emit func(api.LogEvent) error) error {
	prefix := "exec/" + execID + "/"
	if tail == 0 {
		// All of it: Output knows how an exec's output ends.
		return l.host.output(ctx, sandboxID, execID, follow, func(ev api.ExecEvent) error {
			if ev.Event != "stdout" && ev.Event != "stderr" {
				return nil
			}
			now := l.host.now()
			return eachLine(ev.Data, func(line []byte) error {
				return emit(api.LogEvent{Stream: prefix + ev.Event, Data: line, Time: now})
			})
		})
	}
	if _, err := l.host.Exec(ctx, sandboxID, execID); err != nil {
		return err
	}
	dir := l.host.execDir(sandboxID, execID)
	files := []*logFile{
		{stream: prefix + "stdout", path: filepath.Join(dir, "stdout")},
		{stream: prefix + "stderr", path: filepath.Join(dir, "stderr")},
	}
	ended := func() (bool, error) {
		e, err := l.host.Exec(context.WithoutCancel(ctx), sandboxID, execID)
		if err != nil {
			return false, err
		}
		return e.State != api.ExecRunning, nil
	}
	return followLogs(ctx, l.host.fileWatcher(), files, follow, tail, ended, l.host.now, emit, l.host.execsChanged, l.host.Changed)
}

// eventLog sends a sandbox's events as lines: the last tail (all when
// tail is 0), then, with follow, those recorded until the sandbox is gone.
func (l *logsOwner) eventLog(ctx context.Context, sandboxID string, following bool, tail int, gone func() (bool, error), emit func(api.LogEvent) error) error {
	var after int64 // the last event sent
	if tail > 0 {
		evs, err := l.host.Events(ctx, sandboxID, 0)
		if err != nil {
			return err
		}
		if len(evs) > tail {
			after = evs[len(evs)-tail-1].Seq // those before the last tail count as sent
		}
	}
	return follow.Follow(ctx, func() (bool, time.Time, error) {
		done := true
		if following {
			var err error
			if done, err = gone(); err != nil {
				return false, time.Time{}, err
			}
		}
		// read after gone: what was recorded before the sandbox went is sent
		evs, err := l.host.Events(ctx, sandboxID, after)
		if err != nil {
			return false, time.Time{}, err
		}
		for _, ev := range evs {
			if err := emit(api.LogEvent{Stream: StreamEvents, Data: []byte(EventLine(ev) + "\n"), Time: ev.Time}); err != nil {
				return false, time.Time{}, err
			}
			after = ev.Seq
		}
		return done, time.Time{}, nil
	}, l.host.Changed)
}

// EventLine writes an event as one line: "TIME TYPE key=value ...", the
// time in UTC, the detail sorted by key, values quoted when they would not
// read as one word.
func EventLine(ev api.Event) string { return ev.Line(time.UTC, nil) }

// runtimeLine matches runsc's own log lines (glog format:
// "W0102 15:04:05.000000   1234 file.go:12] ...") and the errors runsc
// prints when it cannot run, create or restore a container.
var runtimeLine = regexp.MustCompile(`^([DIWEF]\d{4} \d\d:\d\d:\d\d\.\d+\s+\d+ \S+:\d+\] |(running|creating|starting|restoring|checkpointing) container|runsc: |\*\*\* )`)

func isRuntimeLine(line []byte) bool { return runtimeLine.Match(line) }

// logFile is one file of a log stream, read from where it was left. It is
// sent a line per event: a line not ended yet is held back until its newline
// comes, the stream ends, or it has waited partialWait (a prompt).
type logFile struct {
	stream string
	path   string
	// match, when set, keeps only the whole lines it accepts.
	match func(line []byte) bool
	// objects puts each JSON object on a line of its own: runsc writes its
	// log (--log) as objects back to back, with no newline between them.
	objects bool

	f         *os.File
	off       int64
	partial   []byte    // the start of a line not ended yet
	partialAt time.Time // when partial last grew
	split     jsonSplitter
	started   bool
}

// partialWait is how long the start of a line waits for its end before it
// is sent as it is, so that a prompt without a newline still shows.
const partialWait = 200 * time.Millisecond

// maxPartial bounds the start of a line held back: a longer line is sent
// in pieces of this size rather than grow sbxd's memory.
const maxPartial = chunkSize

// followLogs sends the files of a stream: the last tail lines of each
// (all when tail is 0), then, following, what they gain, until ctx ends or
// ended reports true (whatever was written before is sent). It looks again
// when a file's directory changes (told by w) and when one of wakes does:
// the sources whatever ended reads tells (the store, the execs).
func followLogs(ctx context.Context, w *follow.Files, files []*logFile, following bool, tail int, ended func() (bool, error), now func() time.Time, emit func(api.LogEvent) error, wakes ...follow.Source) error {
	defer func() {
		for _, f := range files {
			if f.f != nil {
				f.f.Close()
			}
		}
	}()
	sources := slices.Clone(wakes)
	if following {
		dirs := map[string]bool{}
		for _, f := range files {
			dir := filepath.Dir(f.path)
			if dirs[dir] {
				continue
			}
			dirs[dir] = true
			src, stop, err := w.Watch(dir)
			if err != nil {
				return fmt.Errorf("follow %s: %w", f.stream, err)
			}
			defer stop()
			sources = append(sources, src)
		}
	}
	return follow.Follow(ctx, func() (bool, time.Time, error) {
		done := true
		if following {
			var err error
			if done, err = ended(); err != nil {
				return false, time.Time{}, err
			}
		}
		for _, f := range files {
			if _, err := f.drain(tail, now, emit); err != nil {
				return false, time.Time{}, err
			}
		}
		var again time.Time // when the first line held back has waited enough
		for _, f := range files {
			if err := f.flush(done, now, emit); err != nil {
				return false, time.Time{}, err
			}
			if len(f.partial) > 0 {
				at := time.Now().Add(partialWait - now().Sub(f.partialAt))
				if again.IsZero() || at.Before(again) {
					again = at
				}
			}
		}
		return done, again, nil
	}, sources...)
}

// drain sends what f has gained since it was last read and returns how
// many bytes it read. The first read starts at the last tail lines.
func (f *logFile) drain(tail int, now func() time.Time, emit func(api.LogEvent) error) (int, error) {
	if f.f == nil {
		file, err := os.Open(f.path)
		if errors.Is(err, fs.ErrNotExist) {
			return 0, nil
		}
		if err != nil {
			return 0, err
		}
		f.f = file
	}
	fi, err := f.f.Stat()
	if err != nil {
		return 0, err
	}
	size := fi.Size()
	if !f.started {
		f.started = true
		if tail > 0 {
			switch {
			case f.objects:
				f.off, err = tailStartObjects(f.f, size, tail)
			case f.match == nil:
				f.off, err = tailStart(f.f, size, tail)
			default:
				f.off, err = tailStartMatching(f.f, size, tail, f.match)
			}
			if err != nil {
				return 0, err
			}
		}
	}
	if size < f.off {
		// Truncated under us: start again from its beginning.
		f.off, f.partial, f.split = 0, nil, jsonSplitter{}
	}
	total := 0
	buf := make([]byte, chunkSize)
	for f.off < size {
		n, err := f.f.ReadAt(buf[:min(int64(len(buf)), size-f.off)], f.off)
		if n > 0 {
			f.off += int64(n)
			total += n
			if eerr := f.send(buf[:n], now, emit); eerr != nil {
				return total, eerr
			}
		}
		if err == io.EOF || n == 0 {
			break
		}
		if err != nil {
			return total, err
		}
	}
	return total, nil
}

// send emits the whole lines of b (with a matcher, those it accepts), one
// event each, and holds back the start of a line not ended yet.
func (f *logFile) send(b []byte, now func() time.Time, emit func(api.LogEvent) error) error {
	if f.objects {
		b = f.split.split(b)
	}
	data := append(f.partial, b...)
	t := now()
	for {
		i := bytes.IndexByte(data, '\n')
		if i < 0 {
			break
		}
		if err := f.emitLine(data[:i+1], t, emit); err != nil {
			return err
		}
		data = data[i+1:]
	}
	if len(data) > 0 && len(b) > 0 {
		f.partialAt = t // it grew: its wait starts again
	}
	f.partial = append(f.partial[:0:0], data...)
	if len(f.partial) >= maxPartial {
		return f.flush(true, now, emit)
	}
	return nil
}

// emitLine sends one line, if the matcher (if any) accepts it.
func (f *logFile) emitLine(line []byte, t time.Time, emit func(api.LogEvent) error) error {
	if f.match != nil && !f.match(line) {
		return nil
	}
	return emit(api.LogEvent{Stream: f.stream, Data: append([]byte(nil), line...), Time: t})
}

// flush sends the start of a line held back, without its newline: at the
// end (all), or once it has waited partialWait.
func (f *logFile) flush(all bool, now func() time.Time, emit func(api.LogEvent) error) error {
	if len(f.partial) == 0 {
		return nil
	}
	t := now()
	if !all && t.Sub(f.partialAt) < partialWait {
		return nil
	}
	p := f.partial
	f.partial = nil
	return f.emitLine(p, t, emit)
}

// eachLine hands fn each line of b, its newline included; the last piece of
// b, if it ends without one, too.
func eachLine(b []byte, fn func([]byte) error) error {
	for len(b) > 0 {
		i := bytes.IndexByte(b, '\n')
		if i < 0 {
			i = len(b) - 1
		}
		if err := fn(b[:i+1]); err != nil {
			return err
		}
		b = b[i+1:]
	}
	return nil
}

// jsonSplitter puts a newline after each JSON object that starts a line and
// is not followed by one; everything else passes as it is. It keeps its
// place across calls, so an object may come in pieces.
type jsonSplitter struct {
	depth    int
	inString bool
	escaped  bool
	midLine  bool // not at the start of a line
	skipNL   bool // an object just ended and its newline was put after it
}

// split returns b with the newlines put in.
func (s *jsonSplitter) split(b []byte) []byte {
	out := make([]byte, 0, len(b)+8)
	for _, c := range b {
		if s.skipNL {
			s.skipNL = false
			if c == '\n' {
				continue
			}
		}
		out = append(out, c)
		if s.step(c) {
			out = append(out, '\n')
			s.skipNL = true
		}
	}
	return out
}

// step moves over c and reports whether it ends an object.
func (s *jsonSplitter) step(c byte) bool {
	if s.depth == 0 {
		if c == '{' && !s.midLine {
			s.depth, s.midLine = 1, true
			return false
		}
		s.midLine = c != '\n'
		return false
	}
	switch {
	case s.escaped:
		s.escaped = false
	case s.inString:
		switch c {
		case '\\':
			s.escaped = true
		case '"':
			s.inString = false
		}
	case c == '"':
		s.inString = true
	case c == '{':
		s.depth++
	case c == '}':
		s.depth--
		if s.depth == 0 {
			s.midLine = false
			return true
		}
	}
	return false
}

// tailStartObjects is tailStart for a file read through a jsonSplitter:
// the offset of the first of its last n lines, an object ending a line.
func tailStartObjects(r io.ReaderAt, size int64, n int) (int64, error) {
	if n <= 0 || size == 0 {
		return size, nil
	}
	br := bufio.NewReaderSize(io.NewSectionReader(r, 0, size), chunkSize)
	starts := make([]int64, 0, n)
	var s jsonSplitter
	atStart := true
	for off := int64(0); ; off++ {
		c, err := br.ReadByte()
		if err == io.EOF {
			break
		}
		if err != nil {
			return 0, err
		}
		if s.skipNL {
			s.skipNL = false
			if c == '\n' {
				continue // the object's newline, already counted
			}
		}
		if atStart {
			if len(starts) == n {
				starts = starts[1:]
			}
			starts = append(starts, off)
			atStart = false
		}
		if s.step(c) {
			s.skipNL, atStart = true, true
		} else if c == '\n' {
			atStart = true
		}
	}
	if len(starts) == 0 {
		return size, nil
	}
	return starts[0], nil
}

// tailStart returns the offset of the first of the last n lines of the
// size bytes of r. A last line without its newline counts as a line.
func tailStart(r io.ReaderAt, size int64, n int) (int64, error) {
	if n <= 0 || size == 0 {
		return size, nil
	}
	end := size
	var last [1]byte
	if _, err := r.ReadAt(last[:], size-1); err != nil {
		return 0, err
	}
	if last[0] == '\n' {
		end-- // the final newline ends the last line; it starts none
	}
	buf := make([]byte, chunkSize)
	seen := 0
	for end > 0 {
		start := max(0, end-int64(len(buf)))
		chunk := buf[:end-start]
		if _, err := r.ReadAt(chunk, start); err != nil && err != io.EOF {
			return 0, err
		}
		for i := len(chunk) - 1; i >= 0; i-- {
			if chunk[i] == '\n' {
				seen++
				if seen == n {
					return start + int64(i) + 1, nil
				}
			}
		}
		end = start
	}
	return 0, nil
}

// tailStartMatching returns the offset of the first of the last n lines
// of the size bytes of r that match accepts (size when none does).
func tailStartMatching(r io.ReaderAt, size int64, n int, match func([]byte) bool) (int64, error) {
	br := bufio.NewReaderSize(io.NewSectionReader(r, 0, size), chunkSize)
	starts := make([]int64, 0, n)
	var off int64
	for {
		line, err := br.ReadBytes('\n')
		if len(line) > 0 && match(line) {
			if len(starts) == n {
				starts = starts[1:]
			}
			starts = append(starts, off)
		}
		off += int64(len(line))
		if err == io.EOF {
			break
		}
		if err != nil {
			return 0, err
		}
	}
	if len(starts) == 0 {
		return size, nil
	}
	return starts[0], nil
}

// Events sends a sandbox's events after sequence number after (0: from
// the first): those recorded so far, then, following, new ones as they
// come, until ctx ends, emit fails, or the sandbox is deleted.
//
// A deleted sandbox's events stay readable by its id (how else would one
// learn why the reaper took it?).
func (l *logsOwner) events(ctx context.Context, ref string, after int64, following bool, emit func(api.Event) error) error {
	if after < 0 {
		return api.Errorf(api.ErrInvalid, "after: %d is not a sequence number (0 or more)", after)
	}
	id := ref
	if sb, err := l.host.Sandbox(ctx, ref); err == nil {
		id = sb.ID
	} else if evs, eerr := l.host.Events(ctx, ref, 0); eerr == nil && len(evs) > 0 {
		following = false // nothing more will happen to it
	} else if gone, gerr := l.host.DeletedByName(ctx, ref); gerr == nil && gone != "" {
		// the last sandbox of that name, deleted or reaped
		id, following = gone, false
	} else {
		return err
	}
	err := follow.Follow(ctx, func() (bool, time.Time, error) {
		evs, err := l.host.Events(ctx, id, after)
		if err != nil {
			return false, time.Time{}, err
		}
		for _, ev := range evs {
			if err := emit(ev); err != nil {
				return false, time.Time{}, err
			}
			after = ev.Seq
			if ev.Type == api.EventDeleted || ev.Type == api.EventReaped {
				following = false // nothing more will happen to it
			}
		}
		return !following, time.Time{}, nil
	}, l.host.Changed)
	if ctx.Err() != nil && errors.Is(err, ctx.Err()) {
		return nil // the follower left
	}
	return err
}
