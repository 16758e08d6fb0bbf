package sandbox

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"sbx.dev/sbx/api"
	"sbx.dev/sbx/internal/metrics"
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

// logPoll is how often a followed log is looked at for more.
const logPoll = 50 * time.Millisecond

// Logs sends one of a sandbox's log streams (StreamConsole when stream is
// empty): the last tail lines (all of it when tail is 0), then, with
// follow, what comes until ctx ends, the sandbox is deleted, or (for an
// exec) the exec ends. Reading a log is inspection: it is not activity.
// An unknown stream or a negative tail is api.ErrInvalid; an unknown
// sandbox or exec, api.ErrNotFound.
func (m *Manager) Logs(ctx context.Context, ref, stream string, follow bool, tail int, emit func(api.LogEvent) error) error {
	if tail < 0 {
		return api.Errorf(api.ErrInvalid, "tail: %d is not a count of lines", tail)
	}
	sb, err := m.cfg.Store.Sandbox(ctx, ref)
	if err != nil {
		return err
	}
	if stream == "" {
		stream = StreamConsole
	}
	dir := m.sandboxDir(sb.ID)
	gone := func() (bool, error) {
		cur, err := m.cfg.Store.Sandbox(context.WithoutCancel(ctx), sb.ID)
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
		return followLogs(ctx, files, follow, tail, gone, m.now, emit)
	case stream == StreamRuntime:
		files := []*logFile{
			{stream: StreamRuntime, path: filepath.Join(dir, "console.log"), match: isRuntimeLine},
			{stream: StreamRuntime, path: filepath.Join(dir, "runsc.log"), objects: true},
		}
		return followLogs(ctx, files, follow, tail, gone, m.now, emit)
	case stream == StreamEvents:
		return m.eventLog(ctx, sb.ID, follow, tail, gone, emit)
	case strings.HasPrefix(stream, "exec/"):
		execID := strings.TrimPrefix(stream, "exec/")
		if execID == "" || strings.Contains(execID, "/") {
			return api.Errorf(api.ErrInvalid, "stream %q: name an exec as exec/EXEC_ID (the execs of %s are listed by its execs)", stream, sb.ID)
		}
		return m.execLog(ctx, sb.ID, execID, follow, tail, emit)
	default:
		return api.Errorf(api.ErrInvalid, "stream %q: the streams are console, events, runtime and exec/EXEC_ID", stream)
	}
}

// execLog sends an exec's output as a log stream.
func (m *Manager) execLog(ctx context.Context, sandboxID, execID string, follow bool, tail int, emit func(api.LogEvent) error) error {
	prefix := "exec/" + execID + "/"
	if tail == 0 {
		// All of it: Output knows how an exec's output ends.
		return m.Output(ctx, sandboxID, execID, follow, func(ev api.ExecEvent) error {
			if ev.Event != "stdout" && ev.Event != "stderr" {
				return nil
			}
			now := m.now()
			return eachLine(ev.Data, func(line []byte) error {
				return emit(api.LogEvent{Stream: prefix + ev.Event, Data: line, Time: now})
			})
		})
	}
	if _, err := m.cfg.Store.Exec(ctx, sandboxID, execID); err != nil {
		return err
	}
	dir := m.execDir(sandboxID, execID)
	files := []*logFile{
		{stream: prefix + "stdout", path: filepath.Join(dir, "stdout")},
		{stream: prefix + "stderr", path: filepath.Join(dir, "stderr")},
	}
	ended := func() (bool, error) {
		e, err := m.cfg.Store.Exec(context.WithoutCancel(ctx), sandboxID, execID)
		if err != nil {
			return false, err
		}
		return e.State != api.ExecRunning, nil
	}
	return followLogs(ctx, files, follow, tail, ended, m.now, emit)
}

// eventLog sends a sandbox's events as lines.
func (m *Manager) eventLog(ctx context.Context, sandboxID string, follow bool, tail int, gone func() (bool, error), emit func(api.LogEvent) error) error {
	evs, err := m.cfg.Store.Events(ctx, sandboxID, 0)
	if err != nil {
		return err
	}
	var after int64
	if n := len(evs); n > 0 {
		after = evs[n-1].Seq
	}
	if tail > 0 && len(evs) > tail {
		evs = evs[len(evs)-tail:]
	}
	for {
		for _, ev := range evs {
			if err := emit(api.LogEvent{Stream: StreamEvents, Data: []byte(EventLine(ev) + "\n"), Time: ev.Time}); err != nil {
				return err
			}
			after = ev.Seq
		}
		if !follow {
			return nil
		}
		done, err := gone()
		if err != nil {
			return err
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(4 * logPoll):
		}
		if evs, err = m.cfg.Store.Events(ctx, sandboxID, after); err != nil {
			return err
		}
		if done && len(evs) == 0 {
			return nil
		}
	}
}

// EventLine writes an event as one line: "TIME TYPE key=value ...", the
// time in UTC, the detail sorted by key, values quoted when they would not
// read as one word.
func EventLine(ev api.Event) string {
	var b strings.Builder
	b.WriteString(ev.Time.UTC().Format("2006-01-02T15:04:05.000Z07:00"))
	b.WriteString(" ")
	b.WriteString(ev.Type)
	keys := make([]string, 0, len(ev.Detail))
	for k := range ev.Detail {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		fmt.Fprintf(&b, " %s=%s", k, detailValue(ev.Detail[k]))
	}
	return b.String()
}

func detailValue(v any) string {
	switch v := v.(type) {
	case string:
		if v == "" || strings.ContainsAny(v, " \t\n\"=") {
			return strconv.Quote(v)
		}
		return v
	case float64:
		return strconv.FormatFloat(v, 'f', -1, 64)
	case nil:
		return "null"
	default:
		b, err := json.Marshal(v)
		if err != nil {
			return fmt.Sprint(v)
		}
		return string(b)
	}
}

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
const partialWait = 4 * logPoll

// maxPartial bounds the start of a line held back: a longer line is sent
// in pieces of this size rather than grow sbxd's memory.
const maxPartial = chunkSize

// followLogs sends the files of a stream: the last tail lines of each
// (all when tail is 0), then with follow what they gain, polling, until
// ctx ends or ended reports true (whatever was written before is sent).
func followLogs(ctx context.Context, files []*logFile, follow bool, tail int, ended func() (bool, error), now func() time.Time, emit func(api.LogEvent) error) error {
	defer func() {
		for _, f := range files {
			if f.f != nil {
				f.f.Close()
			}
		}
	}()
	tick := time.NewTicker(logPoll)
	defer tick.Stop()
	for {
		done := true
		if follow {
			var err error
			if done, err = ended(); err != nil {
				return err
			}
		}
		n := 0
		for _, f := range files {
			got, err := f.drain(tail, now, emit)
			if err != nil {
				return err
			}
			n += got
		}
		for _, f := range files {
			if err := f.flush(done, now, emit); err != nil {
				return err
			}
		}
		if done {
			return nil
		}
		if n > 0 {
			continue
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-tick.C:
		}
	}
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

// Metrics reports a sandbox's resource use now: CPU time and memory from
// its cgroup, processes counted in its /proc (running sandboxes only; the
// agent that counts is left out), disk as the blocks its overlay's upper
// layer holds on the host. A stopped sandbox reports its disk and zeros.
// Metrics is inspection: it is not activity. An unknown sandbox is
// api.ErrNotFound.
func (m *Manager) Metrics(ctx context.Context, ref string) (*api.Metrics, error) {
	sb, err := m.cfg.Store.Sandbox(ctx, ref)
	if err != nil {
		return nil, err
	}
	upper := filepath.Join(m.sandboxDir(sb.ID), "upper")
	out := &api.Metrics{DiskBytes: diskUsage(upper)}
	if sb.State != api.StateReady {
		return out, nil
	}
	if w, ok := m.watcher.get(sb.ID); ok {
		out.DiskBytes += openUnder(w.Pid, upper)
	}
	cg := m.cgroupsPath(sb.ID)
	if ns, ok := readCgroupInt("/sys/fs/cgroup/cpuacct", cg, "cpuacct.usage"); ok {
		out.CPUSeconds = float64(ns) / 1e9
	} else if us, ok := readCgroupStat("/sys/fs/cgroup", cg, "cpu.stat", "usage_usec"); ok {
		out.CPUSeconds = float64(us) / 1e6
	}
	if b, ok := readCgroupInt("/sys/fs/cgroup/memory", cg, "memory.usage_in_bytes"); ok {
		out.MemoryBytes = b
	} else if b, ok := readCgroupInt("/sys/fs/cgroup", cg, "memory.current"); ok {
		out.MemoryBytes = b
	}
	fis, err := m.ReadDir(ctx, sb.ID, "/proc", "", 0)
	if err != nil {
		return nil, fmt.Errorf("metrics of %s: count processes: %w", sb.ID, err)
	}
	for _, fi := range fis {
		if _, err := strconv.Atoi(fi.Name); err == nil {
			out.Processes++
		}
	}
	// The agent listing /proc is one of them.
	out.Processes = max(0, out.Processes-1)
	return out, nil
}

func readCgroupInt(root, cgroup, file string) (int64, bool) {
	b, err := os.ReadFile(filepath.Join(root, cgroup, file))
	if err != nil {
		return 0, false
	}
	n, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
	return n, err == nil
}

func readCgroupStat(root, cgroup, file, key string) (int64, bool) {
	b, err := os.ReadFile(filepath.Join(root, cgroup, file))
	if err != nil {
		return 0, false
	}
	for _, line := range strings.Split(string(b), "\n") {
		if k, v, ok := strings.Cut(line, " "); ok && k == key {
			n, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
			return n, err == nil
		}
	}
	return 0, false
}

// diskUsage is what du says of dir: the bytes of the blocks its files hold.
func diskUsage(dir string) int64 {
	var total int64
	_ = filepath.WalkDir(dir, func(_ string, d fs.DirEntry, err error) error {
		if err != nil {
			return nil
		}
		fi, err := d.Info()
		if err != nil {
			return nil
		}
		total += allocated(fi)
		return nil
	})
	return total
}

// openUnder is the blocks of the files under dir that process pid holds
// open: runsc keeps the overlay's file store open and unlinked in the upper
// dir, so du of the dir alone sees nothing.
func openUnder(pid int, dir string) int64 {
	fdDir := fmt.Sprintf("/proc/%d/fd", pid)
	ents, err := os.ReadDir(fdDir)
	if err != nil {
		return 0
	}
	var total int64
	for _, e := range ents {
		p := filepath.Join(fdDir, e.Name())
		target, err := os.Readlink(p)
		if err != nil || !strings.HasPrefix(target, dir+"/") {
			continue
		}
		if fi, err := os.Stat(p); err == nil && fi.Mode().IsRegular() {
			total += allocated(fi)
		}
	}
	return total
}

// allocated is the bytes of the blocks a file holds (its size where the
// file system does not say).
func allocated(fi fs.FileInfo) int64 {
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		return st.Blocks * 512
	}
	return fi.Size()
}

// MetricsRegistry is the registry the manager counts captures and reaper
// actions in, and that sbxd serves at /metrics.
func (m *Manager) MetricsRegistry() *metrics.Registry {
	if m.cfg.Metrics != nil {
		return m.cfg.Metrics
	}
	return metrics.Default
}

// captureKinds names the capture events' kinds in metrics.
var captureKinds = map[string]string{"snapshot": "snapshot", "stopped": "stop", "forked": "fork", "resumed": "resume"}

// observeCapture counts a capture by kind and outcome and records its duration.
func (m *Manager) observeCapture(typ string, d time.Duration, err error) {
	kind, ok := captureKinds[typ]
	if !ok {
		kind = typ
	}
	outcome := "ok"
	if err != nil {
		outcome = "error"
	}
	r := m.MetricsRegistry()
	r.Counter("sbx_captures_total", "Captures (snapshot, stop, fork, resume) by kind and outcome.", "kind", "outcome").Inc(kind, outcome)
	r.Histogram("sbx_capture_duration_seconds", "How long captures took, by kind and outcome.", metrics.DurationBuckets, "kind", "outcome").
		Observe(d.Seconds(), kind, outcome)
}

// observeReaped counts a sandbox the reaper deleted, by why: idle or lifetime.
func (m *Manager) observeReaped(reason string) {
	why := "other"
	switch {
	case strings.HasPrefix(reason, "idle"):
		why = "idle"
	case strings.HasPrefix(reason, "lifetime"):
		why = "lifetime"
	}
	m.MetricsRegistry().Counter("sbx_reaper_actions_total", "Sandboxes the reaper deleted, by why.", "action", "reason").Inc("delete", why)
}
