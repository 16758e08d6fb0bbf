package client

import (
	"io"
	"io/fs"
	"net/url"
	"strconv"
	"time"

	"sbx.dev/sbx/api"
)

// Every call takes its options the same way: a list of WithX values of the
// call's option type. Some options suit several calls (WithName names a
// created sandbox or a fork); their types say which.

// CreateOption configures Create.
type CreateOption interface{ applyCreate(*api.CreateRequest) }

// ForkOption configures Fork.
type ForkOption interface{ applyFork(*forkConfig) }

// ListOption filters List: a sandbox is listed when it matches every one.
type ListOption interface{ applyList(url.Values) }

// SandboxOption is an option of both Create and Fork.
type SandboxOption interface {
	CreateOption
	ForkOption
}

// MetaOption is an option of Create and Fork (set the key) and of List
// (keep the sandboxes that have it).
type MetaOption interface {
	CreateOption
	ForkOption
	ListOption
}

type createFunc func(*api.CreateRequest)

func (f createFunc) applyCreate(r *api.CreateRequest) { f(r) }

// WithTemplate names the template the sandbox boots from (sbxd's default
// template if unset).
func WithTemplate(name string) CreateOption {
	return createFunc(func(r *api.CreateRequest) { r.Template = name })
}

// WithFrom makes the sandbox from the named snapshot: a disk snapshot boots
// fresh on its disk, a memory snapshot carries on its processes. The
// template, CPUs and memory then come from the snapshot.
func WithFrom(snapshot string) CreateOption {
	return createFunc(func(r *api.CreateRequest) { r.From = snapshot })
}

// WithCPUs sets the sandbox's CPU limit (0.5 is half a CPU).
func WithCPUs(n float64) CreateOption { return createFunc(func(r *api.CreateRequest) { r.CPUs = n }) }

// WithMemoryLimit sets the sandbox's memory limit in bytes (0: sbxd's
// default). Past it the kernel stops the whole sandbox.
func WithMemoryLimit(bytes int64) CreateOption {
	return createFunc(func(r *api.CreateRequest) {
		r.Memory = ""
		if bytes > 0 {
			r.Memory = strconv.FormatInt(bytes, 10)
		}
	})
}

// WithDiskLimit sets the sandbox's disk limit in bytes (0: sbxd's default):
// past it the sandbox's writes fail with ENOSPC.
func WithDiskLimit(bytes int64) CreateOption {
	return createFunc(func(r *api.CreateRequest) {
		r.Disk = ""
		if bytes > 0 {
			r.Disk = strconv.FormatInt(bytes, 10)
		}
	})
}

// WithPidsLimit sets the process limit, per user inside the sandbox (0:
// sbxd's default).
func WithPidsLimit(n int) CreateOption { return createFunc(func(r *api.CreateRequest) { r.Pids = n }) }

// NetworkNone is the network mode of a sandbox with loopback only.
const NetworkNone = "none"

// WithNetwork sets the sandbox's network mode: NetworkNone gives it
// loopback only; "" is NAT egress under sbxd's policy. Forks, snapshots and
// resumes keep it.
func WithNetwork(mode string) CreateOption {
	return createFunc(func(r *api.CreateRequest) { r.Network = mode })
}

type nameOption string

func (o nameOption) applyCreate(r *api.CreateRequest) { r.Name = string(o) }
func (o nameOption) applyFork(f *forkConfig)          { f.req.Name = string(o) }

// WithName names a sandbox (Create) or the one child of a fork (Fork); a
// name works wherever an id does. It cannot start with "sb_".
func WithName(name string) SandboxOption { return nameOption(name) }

type ttlOption time.Duration

func (o ttlOption) applyCreate(r *api.CreateRequest) { r.TTL = api.Duration(o) }
func (o ttlOption) applyFork(f *forkConfig)          { f.req.TTL = api.DurationOf(time.Duration(o)) }

// WithTTL sets the idle ttl of a created sandbox, or of a fork's children
// (which otherwise take the parent's): a ready sandbox idle that long is
// deleted. 0 is none.
func WithTTL(d time.Duration) SandboxOption { return ttlOption(d) }

type metaOption struct{ k, v string }

func (o metaOption) applyCreate(r *api.CreateRequest) {
	if r.Meta == nil {
		r.Meta = map[string]string{}
	}
	r.Meta[o.k] = o.v
}

func (o metaOption) applyFork(f *forkConfig) {
	if f.req.Meta == nil {
		f.req.Meta = map[string]string{}
	}
	f.req.Meta[o.k] = o.v
}

func (o metaOption) applyList(q url.Values) { q.Add("meta", o.k+"="+o.v) }

// WithMeta sets metadata key k to v on a created sandbox or a fork's
// children (merged into the parent's), or, for List, keeps the sandboxes
// whose key k is v. It may be given more than once.
func WithMeta(k, v string) MetaOption { return metaOption{k, v} }

type listFunc func(url.Values)

func (f listFunc) applyList(q url.Values) { f(q) }

// WithParent keeps the sandboxes forked from parent (an id or a name).
func WithParent(parent string) ListOption {
	return listFunc(func(q url.Values) { q.Set("parent", parent) })
}

// WithState keeps the sandboxes in one of the states given.
func WithState(states ...api.State) ListOption {
	return listFunc(func(q url.Values) {
		for _, s := range states {
			q.Add("state", string(s))
		}
	})
}

// forkConfig is what Fork is asked.
type forkConfig struct {
	req    api.ForkRequest
	events func(api.ForkEvent) error
	noWait bool
}

type forkFunc func(*forkConfig)

func (f forkFunc) applyFork(c *forkConfig) { f(c) }

// WithCount makes n children. Up to api.MaxForks are made by one call to
// sbxd; more grow a tree breadth-first (children of the children, each a
// copy of the same state), all or nothing.
func WithCount(n int) ForkOption { return forkFunc(func(c *forkConfig) { c.req.Count = n }) }

// WithForkEvents hands every event of the fork's streams to fn as it comes
// (api.ForkForking, api.ForkCaptured, api.ForkReady, api.ForkDone); an
// error from fn ends the fork as a failure.
func WithForkEvents(fn func(api.ForkEvent) error) ForkOption {
	return forkFunc(func(c *forkConfig) { c.events = fn })
}

// MemoryOption is an option of Fork and Snapshot.
type MemoryOption interface {
	ForkOption
	SnapshotOption
}

type memoryOption struct{}

func (memoryOption) applyFork(c *forkConfig)              { c.req.Memory = true }
func (memoryOption) applySnapshot(r *api.SnapshotRequest) { r.Memory = true }

// WithMemory carries the sandbox's processes and memory: into a fork's
// children (which then carry on from the parent's state instead of booting
// fresh on a copy of its disk), or into a snapshot.
func WithMemory() MemoryOption { return memoryOption{} }

// SnapshotOption configures Snapshot.
type SnapshotOption interface{ applySnapshot(*api.SnapshotRequest) }

// StopOption configures Stop.
type StopOption interface{ applyStop(*bool) }

// WaitOption is an option of Stop and Fork.
type WaitOption interface {
	StopOption
	ForkOption
}

type noWait struct{}

func (noWait) applyStop(wait *bool)    { *wait = false }
func (noWait) applyFork(c *forkConfig) { c.noWait = true }

// NoWait returns once the work has begun rather than once it is done:
// Stop with the sandbox stopping; Fork (of up to api.MaxForks children)
// with the children's ids as soon as sbxd names them, the children still
// being made (state creating: a call to one waits until it is ready), and
// the fork going on on sbxd, which undoes it whole if it fails.
func NoWait() WaitOption { return noWait{} }

// ResumeOption configures Resume.
type ResumeOption interface{ applyResume(*resumeConfig) }

type resumeConfig struct {
	req    api.ResumeRequest
	onWait func(why string)
}

type requireMemory struct{}

func (requireMemory) applyResume(c *resumeConfig) { c.req.RequireMemory = true }

type onWait func(why string)

func (f onWait) applyResume(c *resumeConfig) { c.onWait = f }

// OnWait has fn hear why Resume waits, while it waits: through a fleet's
// controller, a resume that requires its memory waits for a node where it
// restores, saying which nodes cannot and why (fn hears it again when the
// why changes, at most MaxWaits times: a controller that sends more is
// not heard). fn runs on the request's goroutine and must not block. The
// why is the fleet's words, from what its nodes publish: quote it before
// a terminal shows it.
// One sbxd never waits, and says nothing.
func OnWait(fn func(why string)) ResumeOption { return onWait(fn) }

// RequireMemory makes Resume fail, keeping the sandbox stopped with its
// image, rather than boot it from its disk when its memory cannot be
// restored.
func RequireMemory() ResumeOption { return requireMemory{} }

// DeleteOption configures Delete.
type DeleteOption interface{ applyDelete(url.Values) }

type withSnapshots struct{}

func (withSnapshots) applyDelete(q url.Values) { q.Set("withSnapshots", "1") }

// WithSnapshots also deletes the snapshots taken from the sandbox.
func WithSnapshots() DeleteOption { return withSnapshots{} }

type keepFreezes struct{}

func (keepFreezes) applyDelete(q url.Values) { q.Set("keepFreezes", "1") }

// KeepFreezes keeps the sandbox's freezes (and crash captures): they are
// marked kept, and outlive it. Without it they go with the sandbox, save
// those promoted with Client.KeepSnapshot.
func KeepFreezes() DeleteOption { return keepFreezes{} }

// ExecOption configures Exec and Start.
type ExecOption interface{ applyExec(*execConfig) }

// OutputOption says where an exec's output goes: an option of Exec and
// Start, and of a Process's Wait and Output.
type OutputOption interface {
	ExecOption
	applyOutput(*outputConfig)
}

// CommandOption is an option of a command, run by Exec, Start or PTY.
type CommandOption interface {
	ExecOption
	PTYOption
}

// execConfig is what Exec and Start are asked.
type execConfig struct {
	req     api.ExecRequest
	out     outputConfig
	onCrash bool
}

// outputConfig is where output goes.
type outputConfig struct {
	stdout, stderr io.Writer
	events         func(api.ExecEvent) error
}

type execFunc func(*execConfig)

func (f execFunc) applyExec(c *execConfig) { f(c) }

// WithTimeout has the sandbox kill the command, and whatever it started,
// after d: it then ends with exit code 124 and Result.TimedOut. 0 is no
// limit (the default). The limit is enforced inside the sandbox, whatever
// becomes of the client.
func WithTimeout(d time.Duration) ExecOption {
	return execFunc(func(c *execConfig) {
		c.req.Timeout = api.Duration(max(d, 0))
	})
}

type envOption []string

func (o envOption) applyExec(c *execConfig) { c.req.Env = append(c.req.Env, o...) }
func (o envOption) applyPTY(c *ptyConfig)   { c.env = append(c.env, o...) }

// WithEnv adds environment variables, each "KEY=VALUE", to the command's.
func WithEnv(kv ...string) CommandOption { return envOption(kv) }

type cwdOption string

func (o cwdOption) applyExec(c *execConfig) { c.req.Cwd = string(o) }
func (o cwdOption) applyPTY(c *ptyConfig)   { c.cwd = string(o) }

// WithCwd sets the command's working directory (absolute; the default is
// the template's, the user's home in base).
func WithCwd(dir string) CommandOption { return cwdOption(dir) }

type userOption string

func (o userOption) applyExec(c *execConfig) { c.req.User = string(o) }
func (o userOption) applyPTY(c *ptyConfig)   { c.user = string(o) }

// WithUser runs the command as user, a name or uid[:gid] inside the
// sandbox; "" is the template's default user ("user" in base, root in tiny).
func WithUser(user string) CommandOption { return userOption(user) }

type stdoutOption struct{ w io.Writer }

func (o stdoutOption) applyExec(c *execConfig)     { c.out.stdout = o.w }
func (o stdoutOption) applyOutput(c *outputConfig) { c.stdout = o.w }

// WithStdout writes the command's standard output to w as it comes (by
// default it is not read, though sbxd keeps it: see Process.Output).
func WithStdout(w io.Writer) OutputOption { return stdoutOption{w} }

type stderrOption struct{ w io.Writer }

func (o stderrOption) applyExec(c *execConfig)     { c.out.stderr = o.w }
func (o stderrOption) applyOutput(c *outputConfig) { c.stderr = o.w }

// WithStderr writes the command's standard error to w as it comes.
func WithStderr(w io.Writer) OutputOption { return stderrOption{w} }

type eventsOption func(api.ExecEvent) error

func (o eventsOption) applyExec(c *execConfig)     { c.out.events = o }
func (o eventsOption) applyOutput(c *outputConfig) { c.events = o }

// WithExecEvents hands every event of the exec's stream to fn, output
// included (api.ExecStarted, api.ExecStdout, api.ExecStderr, api.ExecNotice,
// api.ExecExit); an error from fn ends the wait (not the command) and is
// returned.
func WithExecEvents(fn func(api.ExecEvent) error) OutputOption { return eventsOption(fn) }

// PTYOption configures PTY.
type PTYOption interface{ applyPTY(*ptyConfig) }

// ptyConfig is what PTY is asked.
type ptyConfig struct {
	cmd, env   []string
	cwd, user  string
	cols, rows int
}

type ptyFunc func(*ptyConfig)

func (f ptyFunc) applyPTY(c *ptyConfig) { f(c) }

// WithCommand sets the terminal's command (default: the sandbox's shell,
// bash if it has it, else sh).
func WithCommand(argv ...string) PTYOption { return ptyFunc(func(c *ptyConfig) { c.cmd = argv }) }

// WithSize sets the terminal's initial size (default 80x24).
func WithSize(cols, rows int) PTYOption {
	return ptyFunc(func(c *ptyConfig) { c.cols, c.rows = cols, rows })
}

// AttachOption configures Process.Attach.
type AttachOption interface{ applyAttach(url.Values) }

type fromStart struct{}

func (fromStart) applyAttach(q url.Values) { q.Set("from", "start") }

// FromStart sends the output kept from the exec's start before what comes
// (the default is only what comes after the attach).
func FromStart() AttachOption { return fromStart{} }

// EventsOption configures Events.
type EventsOption interface{ applyEvents(*eventsConfig) }

// LogsOption configures Logs.
type LogsOption interface{ applyLogs(url.Values) }

// FollowOption is an option of Events and Logs.
type FollowOption interface {
	EventsOption
	LogsOption
}

type eventsConfig struct {
	follow bool
	after  int64
}

type follow struct{}

func (follow) applyEvents(c *eventsConfig) { c.follow = true }
func (follow) applyLogs(q url.Values)      { q.Set("follow", "1") }

// Follow keeps the stream open for what comes, until ctx ends or the
// sandbox is deleted (for an exec's log, until it ends).
func Follow() FollowOption { return follow{} }

type afterOption int64

func (o afterOption) applyEvents(c *eventsConfig) { c.after = int64(o) }

// After starts the events after sequence number seq (api.Event.Seq): pass
// the last one seen to pick up a stream that broke.
func After(seq int64) EventsOption { return afterOption(seq) }

type logsFunc func(url.Values)

func (f logsFunc) applyLogs(q url.Values) { f(q) }

// WithStream picks the log stream: api.StreamConsole (the default),
// api.StreamEvents, api.StreamRuntime or api.ExecStream(execID).
func WithStream(name string) LogsOption {
	return logsFunc(func(q url.Values) { q.Set("stream", name) })
}

// WithTail starts the stream at its last n lines.
func WithTail(n int) LogsOption {
	return logsFunc(func(q url.Values) {
		if n > 0 {
			q.Set("tail", strconv.Itoa(n))
		}
	})
}

// FileOption configures a write of a file or directory.
type FileOption interface{ applyFile(*fileConfig) }

type fileConfig struct {
	mode    fs.FileMode
	modeSet bool
}

type modeOption fs.FileMode

func (o modeOption) applyFile(c *fileConfig) { c.mode, c.modeSet = fs.FileMode(o).Perm(), true }

// WithMode sets the permission bits of a written file (default: a replaced
// file's, else 0644) or of the directories MkdirAll makes (default 0755).
func WithMode(perm fs.FileMode) FileOption { return modeOption(perm) }

// PreviewOption configures Preview.
type PreviewOption interface{ applyPreview(*api.PreviewRequest) }

type privatePreview time.Duration

func (o privatePreview) applyPreview(r *api.PreviewRequest) {
	r.Private = true
	if o > 0 {
		r.TTL = api.DurationOf(time.Duration(o))
	}
}

// Private asks for a private preview: its URL carries a signed token valid
// for ttl (0: sbxd's default, an hour), and the port then refuses requests
// without one.
func Private(ttl time.Duration) PreviewOption { return privatePreview(ttl) }

// TemplateOption configures BuildTemplate and the steps of an import
// (ImportRootfs, ImportImageConfig, UploadLayer; package client/image).
type TemplateOption interface{ applyTemplate(*templateOptions) }

type templateFunc func(*templateOptions)

func (f templateFunc) applyTemplate(o *templateOptions) { f(o) }

// WithForce points an existing name at the new version (sandboxes made on
// the old one keep it).
func WithForce() TemplateOption { return templateFunc(func(o *templateOptions) { o.force = true }) }

// WithPackages builds base plus these Debian packages under the name
// (BuildTemplate).
func WithPackages(pkgs ...string) TemplateOption {
	return templateFunc(func(o *templateOptions) { o.packages = pkgs })
}

// WithProgress hands each progress event of the build or import to fn.
func WithProgress(fn func(api.Progress)) TemplateOption {
	return templateFunc(func(o *templateOptions) { o.progress = fn })
}

// WaitPortOption configures WaitPort.
type WaitPortOption interface{ applyWaitPort(*waitPortConfig) }

type waitPortConfig struct {
	interval time.Duration
}

type pollEvery time.Duration

func (o pollEvery) applyWaitPort(c *waitPortConfig) { c.interval = time.Duration(o) }

// PollEvery sets how often WaitPort looks (default 100ms).
func PollEvery(d time.Duration) WaitPortOption { return pollEvery(d) }

// MaxWaits bounds how many times OnWait hears why one request waits (a
// fleet's controller sends at most 8).
const MaxWaits = 8
