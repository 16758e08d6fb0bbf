// Package agentwire is what sbx's agent and its clients outside the
// sandbox agree on: where the agent is, a freeze's record, the hunt loop's
// configuration, exit codes and lines. It is a package of its own so that
// the CLI and the client libraries need not link the agent (the sandbox's
// PID 1) to read what it writes.
package agentwire

// AgentPath is the agent inside every sandbox.
const AgentPath = "/.sbx/sbx-agent"

// The states of a freeze record (freezewire.Record).
const (
	FreezeFreezing    = "freezing"    // asked, no outcome yet
	FreezeFrozen      = "frozen"      // the original, once sbxd recorded the freeze
	FreezeFailed      = "failed"      // not kept (gVisor or sbxd says why); the sandbox ran on
	FreezeCopy        = "copy"        // a copy restored from the freeze
	FreezeUsed        = "used"        // this boot's freeze was used already
	FreezeUnsupported = "unsupported" // the sandbox was started without freezes
	// FreezeInterrupted: this sandbox was restored from another capture
	// (a stop, a snapshot, a fork) taken while the freeze was under way.
	FreezeInterrupted = "interrupted"
	// FreezeUnconfirmed: gVisor wrote the checkpoint, and sbxd did not
	// confirm it in time (it may still: the record follows).
	FreezeUnconfirmed = "unconfirmed"
)

// FreezeRecordFile is where init keeps the last freeze's record (a
// freezewire.Record); it is in
// the sandbox's memory (a tmpfs), so a copy has it too.
const FreezeRecordFile = "/run/sbx/freeze/record.json"

// HuntConfig is what the hunt loop does; the client writes it as JSON.
type HuntConfig struct {
	// Dir is where the loop keeps its state and the evidence; Work is where
	// the setup and the runs run.
	Dir  string `json:"dir"`
	Work string `json:"work"`
	// Setup is a shell command run once before the runs.
	Setup string `json:"setup,omitempty"`
	Runs  int    `json:"runs"`
	// SeedEnv is the variable each run's seed is passed in.
	SeedEnv string   `json:"seedEnv"`
	Test    []string `json:"test"`
	// Collect are absolute paths copied under collected/ on a failure.
	Collect []string `json:"collect,omitempty"`
	// OnCrash ends the hunt at a run during which a process crashed (got a
	// signal that dumps core, with no handler: the sandbox's crash count
	// went up), whatever the run's exit code: the sandbox caught that crash
	// at its faulting instruction, and one is caught per boot.
	OnCrash bool `json:"onCrash,omitempty"`
	// CrashCount replaces CrashDir/count, the file of that count (tests).
	CrashCount string `json:"crashCount,omitempty"`
	// Timeout (a Go duration, "" for none) makes a run that lasts longer a
	// failure with exit 124, captured while it hangs: its processes are
	// left alone.
	Timeout string `json:"timeout,omitempty"`
	// ListenWait (a Go duration) replaces DefaultListenWait.
	ListenWait string `json:"listenWait,omitempty"`
	// User runs the setup and the runs; the loop itself, and the evidence,
	// run as root (gdb attaches to whatever a run left).
	User string `json:"user,omitempty"`
	// Freeze freezes the failure (see above).
	Freeze bool `json:"freeze,omitempty"`
}

// The loop's exit codes.
const (
	// HuntNoFailure: no run failed.
	HuntNoFailure = 0
	// HuntFailed: a run failed and the evidence is in Dir.
	HuntFailed = 3
	// HuntSetupFailed: the setup failed; its output is Dir/setup.out.
	HuntSetupFailed = 4
	// HuntCrashWrapper was --on-crash's gdb wrapper failing (5, no longer
	// used: --on-crash needs no gdb).
	// HuntFrozen: a run failed and the sandbox was frozen at the failure;
	// Dir/frozen holds the freeze's record.
	HuntFrozen = 6
)

// The lines the loop prints, one per step.
const (
	HuntLineRun      = "sbx-hunt: run"      // "sbx-hunt: run N seed S exit E"
	HuntLineFailed   = "sbx-hunt: failed"   // "sbx-hunt: failed N seed S exit E time T"
	HuntLineCaptured = "sbx-hunt: captured" // the evidence is in Dir
	HuntLineFrozen   = "sbx-hunt: frozen"   // "sbx-hunt: frozen NAME", the record in Dir/frozen
)

// Exit codes of the subcommands other than exec. exec exits with the code of
// the command it ran, or with one of the Exit*Exec codes.
const (
	ExitOK       = 0 // success
	ExitError    = 1 // any failure without a more precise code
	ExitNotFound = 3 // the path, or its parent directory, does not exist
	// ExitInvalid means bad arguments, a path that is (or is not) a
	// directory when the other was needed, or a path that escapes.
	ExitInvalid = 4
	ExitExists  = 5 // the path already exists
)

// Exit codes of exec for its own failures, as timeout(1), env(1) and a POSIX
// shell use them. The agent writes a line starting with "sbx: " on stderr
// with each of them. spawn and attach exit with them too; attach exits with
// ExitUsageExec for an unknown exec id.
const (
	ExitTimeoutExec  = 124 // the command ran past --timeout and was killed
	ExitUsageExec    = 125 // exec itself was called with bad arguments
	ExitCannotExec   = 126 // the program exists but cannot be executed
	ExitNotFoundExec = 127 // the program was not found
)

// StartRequest is what `sbx-agent start` reads from its stdin: the command
// to start and how. It comes on stdin, never in argv, so that the
// environment (secrets, often) is not in any process list on the host.
type StartRequest struct {
	ID   string   `json:"id"`
	Argv []string `json:"argv"`
	Env  []string `json:"env,omitempty"`
	Cwd  string   `json:"cwd,omitempty"`
	// User is a name, a uid, or either with ":group"; "" is root.
	User    string `json:"user,omitempty"`
	Timeout string `json:"timeout,omitempty"`
}

// The exec channel: sbxd listens on a unix socket in a host directory bound
// read-only at ChannelDir (root's alone: 0700), and init keeps connections
// to it open (gVisor's --host-uds=open lets it connect), so that an exec is
// a message on a connection already there rather than a `runsc exec`. Each
// connection carries one ChannelRequest, then the frames (package frame) of
// what it asks for, as `sbx-agent start` or `attach --framed` would send
// them on their stdout, and is closed after the exit frame.
const (
	ChannelDir    = "/run/sbx/chan"
	ChannelSocket = ChannelDir + "/agent.sock"
)

// ChannelRequest is what sbxd sends first on an exec channel's connection:
// the agent's arguments ("start", or "attach" and its flags) and what that
// command would read on its stdin (a StartRequest). It is one JSON line.
type ChannelRequest struct {
	Args  []string `json:"args"`
	Stdin []byte   `json:"stdin,omitempty"`
}

// ChannelPing is what init sends on an idle channel connection, so that it
// learns when a capture closed it; no frame starts with it.
const ChannelPing = 0

// MaxChannelRequest bounds a ChannelRequest's line: a start request (8 MiB
// at most) in base64, with room for the rest.
const MaxChannelRequest = 12 << 20
