package api

import "strings"

// The names of the events of an exec's stream (ExecEvent.Event, and the
// server-sent event's name).
const (
	// ExecStarted comes first in a foreground exec's stream, with the Exec.
	ExecStarted = "started"
	// ExecStdout and ExecStderr carry output bytes in Data.
	ExecStdout = "stdout"
	ExecStderr = "stderr"
	// ExecExit comes last, with the ended Exec.
	ExecExit = "exit"
	// ExecEOF ends a stream read without follow while the exec still runs.
	ExecEOF = "eof"
	// ExecNotice says something to a person (the sandbox is being made).
	ExecNotice = "notice"
)

// StreamErrorEvent is the name of the event that ends any stream with an
// error (an ErrorBody, alone or in the stream's frame: exec, fork, events,
// logs and progress streams).
const StreamErrorEvent = "error"

// The names of the events of a fork's stream (ForkEvent.Event).
const (
	// ForkForking comes at once, with the new children's ids in IDs.
	ForkForking = "sandbox.forking"
	// ForkCaptured says the parent's state is taken: it may change from
	// then on without the children seeing it.
	ForkCaptured = "sandbox.captured"
	// ForkReady comes once per child, with the child in Sandbox.
	ForkReady = "sandbox.ready"
	// ForkDone comes last, with every child in Sandboxes.
	ForkDone = "done"
)

// The log streams of a sandbox (LogEvent.Stream, and the logs route's
// stream parameter). ExecStream names one exec's.
const (
	StreamConsole = "console"
	StreamEvents  = "events"
	StreamRuntime = "runtime"
)

// ExecStream is the name of exec execID's log stream: "exec/EXEC_ID".
func ExecStream(execID string) string { return "exec/" + execID }

// The types of a sandbox's lifecycle events (Event.Type). A change of state
// is also an event, of type EventStatePrefix + the new state
// ("state.stopped"), with the old state in its detail's From.
const (
	EventCreated     = "created"    // made, from a template, a snapshot or a fork
	EventForked      = "forked"     // a capture: children were forked from it
	EventSnapshot    = "snapshot"   // a capture: a named snapshot was taken
	EventStopped     = "stopped"    // a capture: hibernated with its memory
	EventResumed     = "resumed"    // brought back, with or without its memory
	EventTTL         = "ttl"        // its idle ttl was set
	EventPersist     = "persist"    // exempted from (or returned to) the idle reaper
	EventReaped      = "reaped"     // deleted by the reaper, with the rule in Reason
	EventDeleted     = "deleted"    // deleted
	EventOOM         = "oom"        // the kernel stopped it at its memory limit
	EventExited      = "exited"     // its runsc process ended on its own
	EventReconciled  = "reconciled" // an operation cut off by a crash of sbxd was settled
	EventStatePrefix = "state."
)

// IsStateEvent reports whether an event type is a change of state, and to
// which state.
func IsStateEvent(typ string) (State, bool) {
	s, ok := strings.CutPrefix(typ, EventStatePrefix)
	return State(s), ok
}
