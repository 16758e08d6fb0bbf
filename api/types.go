package api

import "time"

// State is a sandbox's lifecycle state as the API reports it.
type State string

// The states a sandbox can be in.
const (
	StateCreating State = "creating"
	StateReady    State = "ready"
	StateStopping State = "stopping"
	StateStopped  State = "stopped"
	StateError    State = "error"
	StateLost     State = "lost"
	StateDeleted  State = "deleted"
)

// States are the states a stored sandbox can be in, in the order of its
// life: the one list of them (StateDeleted is only ever an event's).
var States = []State{StateCreating, StateReady, StateStopping, StateStopped, StateError, StateLost}

// Valid reports whether s is one of States.
func (s State) Valid() bool {
	for _, st := range States {
		if s == st {
			return true
		}
	}
	return false
}

// Sandbox describes one sandbox.
type Sandbox struct {
	ID        string            `json:"id"`
	Name      string            `json:"name,omitempty"`
	Template  string            `json:"template"`
	State     State             `json:"state"`
	Reason    string            `json:"reason,omitempty"`
	CreatedAt time.Time         `json:"createdAt"`
	TTL       Duration          `json:"ttl,omitempty"`
	Meta      map[string]string `json:"meta,omitempty"`
	CPUs      float64           `json:"cpus,omitempty"`
	Memory    int64             `json:"memoryBytes,omitempty"`
	// Address is the sandbox's address as seen from inside it; every sandbox
	// has the same one, its network namespace is what tells them apart.
	Address string `json:"address,omitempty"`
	// LastActivity is when the sandbox last did something that counts as activity.
	LastActivity time.Time `json:"lastActivity"`
	// From is the snapshot the sandbox was made from, if any.
	From string `json:"from,omitempty"`
	// Parent is the sandbox this one was forked from, if any.
	Parent string `json:"parent,omitempty"`
	// MemoryRestored says whether the sandbox's processes and memory were
	// carried over (from a memory snapshot, a memory fork or a resume)
	// rather than booted fresh. ResumeReason says why not, after a resume
	// that fell back to booting from the disk.
	MemoryRestored bool   `json:"memoryRestored"`
	ResumeReason   string `json:"resumeReason,omitempty"`
	// Persistent sandboxes are exempt from the idle reaper.
	Persistent bool `json:"persistent,omitempty"`
	// TemplateVersion is the version of Template the sandbox was made on and
	// holds for as long as it lives.
	TemplateVersion string `json:"templateVersion,omitempty"`
	// Pids and DiskLimit are its process limit (per user inside) and disk
	// limit in bytes.
	Pids      int   `json:"pids,omitempty"`
	DiskLimit int64 `json:"diskLimitBytes,omitempty"`
	// Network is "" (NAT egress under the daemon's policy) or "none"
	// (loopback only); forks, snapshots and resumes keep it.
	Network string `json:"network,omitempty"`
	// Shape perturbs what leaves the sandbox (nil: nothing).
	Shape *NetShape `json:"netShape,omitempty"`
	// Idle is how long the sandbox has done nothing that counts as
	// activity; ReapAt when the reaper will delete it and ReapReason why
	// (idle ttl or lifetime cap), or why not (persistent, an exec running).
	Idle       *Duration  `json:"idle,omitempty"`
	ReapAt     *time.Time `json:"reapAt,omitempty"`
	ReapReason string     `json:"reapReason,omitempty"`
	// Node is the fleet node that holds the sandbox ("" outside a fleet).
	Node string `json:"node,omitempty"`
	// Agent is the build of sbx's in-sandbox agent its processes run on
	// (a key, or "legacy"): its memory restores only on a host that has
	// that build, and a fleet moves and forks it only to such a node.
	Agent string `json:"agent,omitempty"`
}

// NetShape perturbs the traffic that leaves a sandbox through its network
// interface, packet by packet: a perturbation explain measures a test's
// rate under ("what makes it worse"), not a network emulator. The zero
// NetShape is none.
type NetShape struct {
	// Delay holds each packet that long ("100ms"; at most 10s).
	Delay Duration `json:"delay,omitempty"`
	// Loss drops each packet with this probability, from 0 up to 1.
	Loss float64 `json:"loss,omitempty"`
}

// TTLRequest is the body of POST /v1/sandboxes/{id}/ttl.
type TTLRequest struct {
	TTL Duration `json:"ttl"`
}

// PersistRequest is the body of POST /v1/sandboxes/{id}/persist.
type PersistRequest struct {
	Persistent bool `json:"persistent"`
}

// Port is a TCP port listening inside a sandbox.
type Port struct {
	Proto   string `json:"proto"`
	Address string `json:"address"`
	Port    int    `json:"port"`
	Pid     int    `json:"pid,omitempty"`
	Command string `json:"command,omitempty"`
}

// PreviewRequest is the body of POST /v1/sandboxes/{id}/preview.
type PreviewRequest struct {
	Port int `json:"port"`
	// Private adds a signed token that expires after TTL (default 1h).
	Private bool      `json:"private,omitempty"`
	TTL     *Duration `json:"ttl,omitempty"`
}

// Preview is a URL that reaches a port inside a sandbox through the proxy.
type Preview struct {
	URL       string     `json:"url"`
	ExpiresAt *time.Time `json:"expiresAt,omitempty"`
	// Port is the published port; Private says whether it answers only
	// requests with a token.
	Port    int  `json:"port,omitempty"`
	Private bool `json:"private,omitempty"`
}

// LogEvent is one server-sent event of a log stream: Data holds bytes of
// the stream named Stream (console, events, runtime, exec/ID; for an exec,
// stdout and stderr are exec/ID/stdout and exec/ID/stderr).
type LogEvent struct {
	Stream string    `json:"stream"`
	Data   []byte    `json:"data,omitempty"`
	Time   time.Time `json:"time"`
}

// Metrics are a sandbox's resource use now.
type Metrics struct {
	CPUSeconds  float64 `json:"cpuSeconds"`
	MemoryBytes int64   `json:"memoryBytes"`
	Processes   int     `json:"processes"`
	DiskBytes   int64   `json:"diskBytes"`
}

// CreateRequest is the body of POST /v1/sandboxes. Durations are typed
// (Duration) and checked by Validate; sizes are strings ("512M") checked by
// the server, which names the bad field.
type CreateRequest struct {
	Template string            `json:"template,omitempty"`
	Name     string            `json:"name,omitempty"`
	TTL      Duration          `json:"ttl,omitempty"`
	Meta     map[string]string `json:"meta,omitempty"`
	CPUs     float64           `json:"cpus,omitempty"`
	Memory   string            `json:"memory,omitempty"`
	// Pids limits the number of processes (0: the daemon's default).
	Pids int `json:"pids,omitempty"`
	// Disk limits the sandbox's disk changes ("10G"; "": the daemon's default).
	Disk string `json:"disk,omitempty"`
	// Network is "" (NAT egress under the daemon's policy) or "none".
	Network string `json:"network,omitempty"`
	// From makes the sandbox from a snapshot: a disk snapshot boots fresh
	// on its disk, a memory snapshot carries on its processes. Template,
	// CPUs and Memory then come from the snapshot.
	From string `json:"from,omitempty"`
	// ForkOf, with From, records the sandbox as a fork of the sandbox the
	// snapshot was taken of (its parent): a fleet's fork across nodes is
	// a snapshot of the parent, moved, and a create from it on each node.
	// It must be the snapshot's own sandbox's id.
	ForkOf string `json:"forkOf,omitempty"`
	// Monitor turns on runtime monitoring: sbxd keeps a bounded trace of
	// the sandbox's syscalls on files and sockets, execs and exits (GET
	// /v1/sandboxes/{id}/trace). Off by default.
	Monitor bool `json:"monitor,omitempty"`
	// Shape perturbs what leaves the sandbox (not with Network "none").
	Shape *NetShape `json:"netShape,omitempty"`
}

// DeleteResult is the body answering DELETE /v1/sandboxes/{id}.
type DeleteResult struct {
	ID string `json:"id"`
	// Snapshots names the snapshots removed with the sandbox (withSnapshots).
	Snapshots []string `json:"snapshots,omitempty"`
	// Freezes names the freeze snapshots removed with the sandbox (all its
	// freezes unless keepFreezes, save those promoted with snapshot keep).
	Freezes []string `json:"freezes,omitempty"`
}

// MaxNetDelay is the longest NetShape.Delay: a perturbation, not a
// partition.
const MaxNetDelay = 10 * time.Second

// SnapshotRequest is the body of POST /v1/sandboxes/{id}/snapshots.
type SnapshotRequest struct {
	Name   string `json:"name"`
	Memory bool   `json:"memory,omitempty"`
}

// Snapshot describes a named capture of a sandbox: always its disk, and its
// processes and memory when Memory is set. A snapshot outlives its sandbox.
type Snapshot struct {
	Name      string    `json:"name"`
	ID        string    `json:"id"`
	SandboxID string    `json:"sandboxId"`
	Template  string    `json:"template"`
	Memory    bool      `json:"memory"`
	CreatedAt time.Time `json:"createdAt"`
	Size      int64     `json:"sizeBytes"`
	// Paused is how long the sandbox was paused while its memory was
	// written (memory snapshots only).
	Paused *Duration `json:"paused,omitempty"`
	// Kept: promoted with `sbx snapshot keep`; a freeze so marked outlives
	// its sandbox and counts in no quota.
	Kept bool `json:"kept,omitempty"`
	// Node is the fleet node that holds it (through a fleet's controller
	// only).
	Node string `json:"node,omitempty"`
	// Ref is where it is in the fleet's registry, once its node pushed it
	// there (a freeze, in a fleet: sbxd --fleet-registry), digest and
	// all: `sbx snapshot pull REF` anywhere. RefPending says why it is not
	// there yet.
	Ref        string `json:"ref,omitempty"`
	RefPending string `json:"refPending,omitempty"`
}

// ForkRequest is the body of POST /v1/sandboxes/{id}/fork.
type ForkRequest struct {
	// Name names the child (only with Count 1).
	Name string `json:"name,omitempty"`
	// Memory carries on the parent's processes and memory; without it the
	// children boot fresh on a copy of the parent's disk.
	Memory bool `json:"memory,omitempty"`
	// Count is how many children, 1 to MaxForks; 0 means 1 (CheckForkCount).
	Count int `json:"count,omitempty"`
	// TTL is the children's idle ttl: nil (absent) the parent's, 0 none.
	TTL *Duration `json:"ttl,omitempty"`
	// Meta is merged into the parent's metadata for the children: a key
	// here replaces the parent's value.
	Meta map[string]string `json:"meta,omitempty"`
	// Monitor turns on runtime monitoring in the children, each with its
	// own trace from its restore on (see CreateRequest.Monitor).
	Monitor bool `json:"monitor,omitempty"`
	// CPUs is the children's CPU quota (0: the parent's), memory forks
	// too: a perturbation explain applies per fork.
	CPUs float64 `json:"cpus,omitempty"`
	// Shape perturbs what leaves each child (nil: as the parent's; an
	// empty one: nothing), another of explain's perturbations.
	Shape *NetShape `json:"netShape,omitempty"`
}

// ForkEvent is one server-sent event of a fork: "sandbox.forking" at once
// with the new ids, "sandbox.captured" once the parent's state is taken (the
// parent may change from then on without the children seeing it),
// "sandbox.ready" with each child that is ready, then "done" (Sandboxes
// set), or "error" (and then no child is left).
type ForkEvent struct {
	Event     string    `json:"event"`
	IDs       []string  `json:"ids,omitempty"`
	Sandbox   *Sandbox  `json:"sandbox,omitempty"`
	Sandboxes []Sandbox `json:"sandboxes,omitempty"`
	// Error is set for "error", as in every error envelope.
	ErrorBody
}

// ResumeRequest is the body of POST /v1/sandboxes/{id}/resume.
type ResumeRequest struct {
	// RequireMemory refuses to boot from the disk when the memory image
	// cannot be restored; the image is kept.
	RequireMemory bool `json:"requireMemory,omitempty"`
}

// Event is one lifecycle event of a sandbox. Captures carry, in Detail,
// start, end, durationMs, sizeBytes and outcome ("ok" or "error", with error).
type Event struct {
	Seq       int64          `json:"seq"`
	SandboxID string         `json:"sandboxId"`
	Time      time.Time      `json:"time"`
	Type      string         `json:"type"`
	Detail    map[string]any `json:"detail,omitempty"`
}

// MetaCrashes is the meta key that, set to "off" (`sbx new
// --no-crash-capture`), leaves a sandbox's crashes alone: they end their
// process at once, as without sbx. Forks inherit it with the meta.
const MetaCrashes = "sbx.crashes"

// MetaPool is the meta key that marks a sandbox of sbxd's warm pool
// (`sbxd --warm`), booted and not yet taken; its value is the template. A
// request through the API may not set it.
const MetaPool = "sbx.pool"

// MetaObject is the meta key that names the fleet's Sandbox object a
// sandbox was made for (internal/fleet): a node agent sets it; a request
// through the API may not.
const MetaObject = "sbx.object"

// MetaObjectUID is the uid of that object: a name asked again, after the
// first object went, is another object.
const MetaObjectUID = "sbx.object-uid"

// MetaObjectNamespace is that object's namespace: an agent watching
// another namespace (its --fleet-namespace changed) finds no object of that
// name there, which says nothing of the object, so it deletes nothing.
const MetaObjectNamespace = "sbx.object-namespace"

// ExecRequest is the body of POST /v1/sandboxes/{id}/exec.
type ExecRequest struct {
	// Cmd is the program and its arguments, run as they are: no shell is
	// put in between (the sbx command line wraps a single word of shell
	// syntax in ["/bin/sh", "-c", WORD]; the Go client's Shell does it on
	// request).
	Cmd     []string `json:"cmd"`
	Env     []string `json:"env,omitempty"`
	Cwd     string   `json:"cwd,omitempty"`
	Timeout Duration `json:"timeout,omitempty"`
	// User runs the command as this user (a name or uid[:gid] inside the
	// sandbox); "" is the template's default user.
	User string `json:"user,omitempty"`
	// Detach answers at once with the Exec; otherwise the response is a
	// stream of ExecEvent (server-sent events) ending with an "exit" event.
	Detach bool `json:"detach,omitempty"`
}

// ExecState is the state of one exec.
type ExecState string

// The states an exec can be in.
const (
	ExecRunning ExecState = "running"
	ExecExited  ExecState = "exited"
	ExecLost    ExecState = "lost"
)

// Exec describes one command run in a sandbox.
type Exec struct {
	ID        string     `json:"id"`
	SandboxID string     `json:"sandboxId"`
	Cmd       []string   `json:"cmd"`
	State     ExecState  `json:"state"`
	Pid       int        `json:"pid,omitempty"`
	ExitCode  *int       `json:"exitCode,omitempty"`
	TimedOut  bool       `json:"timedOut,omitempty"`
	StartedAt time.Time  `json:"startedAt"`
	EndedAt   *time.Time `json:"endedAt,omitempty"`
	// Detached execs are started by the sandbox's init: they (and what
	// they start) live on through stop and resume and are carried into
	// memory snapshots and forks.
	Detached bool `json:"detached,omitempty"`
}

// ExecEvent is one server-sent event of an exec's output stream. Event is
// "stdout" or "stderr" (Data holds the bytes, base64 in JSON), "started"
// (Exec set), "exit" (Exec set, with its exit code), "eof" (the output kept
// so far has been sent and the exec still runs; only without follow), or
// "error".
type ExecEvent struct {
	Event string `json:"event"`
	Data  []byte `json:"data,omitempty"`
	Exec  *Exec  `json:"exec,omitempty"`
	// Error is set for "error", as in every error envelope.
	ErrorBody
	// Message is what a "notice" says: the exec waits for its sandbox to
	// be made, say. A client shows it to a person, not to a script.
	Message string `json:"message,omitempty"`
}

// MaxListPage is the most entries one directory listing answers (fs/ls's
// limit, and its default): a bigger directory is listed a page at a time,
// each page asking for the names after the last one it got. A page bounds
// what one answer of the sandbox can make sbxd hold.
const MaxListPage = 5000

// SignalRequest is the body of POST /v1/sandboxes/{id}/execs/{exec}/signal:
// the signal number (SIGTERM when 0) sent to the exec's process group.
type SignalRequest struct {
	Signal int `json:"signal,omitempty"`
}

// RenameRequest is the body of POST /v1/sandboxes/{id}/fs/rename: From is
// renamed to To inside the sandbox (replacing a file at To, as rename(2)).
type RenameRequest struct {
	From string `json:"from"`
	To   string `json:"to"`
}

// FileInfo describes one file inside a sandbox.
type FileInfo struct {
	Name    string    `json:"name"`
	Path    string    `json:"path,omitempty"`
	Size    int64     `json:"size"`
	Mode    string    `json:"mode"`
	IsDir   bool      `json:"isDir"`
	ModTime time.Time `json:"modTime"`
	// Link is the target of a symbolic link.
	Link string `json:"link,omitempty"`
	// Raw is the name's bytes when they are not UTF-8 (a file name may hold
	// any byte but '/' and NUL): Name then has U+FFFD in their place.
	Raw []byte `json:"raw,omitempty"`
}

// Template describes one template.
type Template struct {
	Name string `json:"name"`
	// Version is the content digest ("sha256:...") of the version the name
	// points at. Every sandbox and snapshot records the version it was made
	// on, and keeps it for as long as it lives.
	Version   string    `json:"version,omitempty"`
	Size      int64     `json:"sizeBytes"`
	CreatedAt time.Time `json:"createdAt"`
	Source    string    `json:"source"`
	// Defaults are what a command run in the template gets unless asked.
	Defaults TemplateDefaults `json:"defaults,omitzero"`
	// HeldBy names, when a name is removed, the sandboxes and snapshots
	// that still hold its version ("sandbox web", "snapshot before").
	HeldBy []string `json:"heldBy,omitempty"`
}

// TemplateDefaults are a template's defaults for the commands run in it.
type TemplateDefaults struct {
	// User is a name or uid[:gid]; "" is root.
	User string   `json:"user,omitempty"`
	Env  []string `json:"env,omitempty"`
	// WorkDir is the working directory; "" is the user's home.
	WorkDir string `json:"workDir,omitempty"`
	// Entrypoint and Cmd come from an image's config.
	Entrypoint []string `json:"entrypoint,omitempty"`
	Cmd        []string `json:"cmd,omitempty"`
}

// Progress is one server-sent event of a long operation (a template build or
// import). The last event has Done set, or Error, or (an image import whose
// layers sbxd lacks) Missing.
type Progress struct {
	Event   string `json:"event"`
	Message string `json:"message,omitempty"`
	Done    bool   `json:"done,omitempty"`
	// Error is set for "error", as in every error envelope.
	ErrorBody
	Template *Template `json:"template,omitempty"`
	// Missing lists the diff IDs of the layers to upload (PUT
	// /v1/layers/{diffID}) before the image import is asked again.
	Missing []string `json:"missing,omitempty"`
}

// ImageImport is the body of POST /v1/templates/{name}/image: an image,
// as its config, whose layers sbxd has or is then sent.
type ImageImport struct {
	// Config is the image's config, byte for byte: its digest (the image
	// ID) is the template's version.
	Config []byte `json:"config"`
	// Source says where the image came from (shown by template ls).
	Source string `json:"source,omitempty"`
	// Force points an existing name at the new version.
	Force bool `json:"force,omitempty"`
}

// Health is the body of GET /v1/health.
type Health struct {
	Status  string `json:"status"`
	Version string `json:"version"`
}
