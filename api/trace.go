package api

// TraceEvent is one point of a sandbox's runtime monitoring, as gVisor's
// sentry reported it: a syscall on a resource with its result, a process
// made, an exec or an exit. What a sandbox does is untrusted: sbxd bounds
// every string and the count of events.
type TraceEvent struct {
	// TimeNs is the sandbox's wall clock at the point, in nanoseconds.
	TimeNs int64 `json:"timeNs"`
	// Pid is the thread group (process) inside the sandbox, Tid the
	// thread, PPid the parent process; Process is its name (comm).
	Pid     int32  `json:"pid"`
	Tid     int32  `json:"tid,omitempty"`
	PPid    int32  `json:"ppid,omitempty"`
	Process string `json:"process,omitempty"`
	// Kind is what happened: a syscall's name ("openat", "connect",
	// "bind", "accept", "rename", ...), or "execve", "clone", "exit" of a
	// process as the sentry saw it.
	Kind string `json:"kind"`
	// Path is the file of an open, or the binary of an execve; Addr the
	// socket address of a connect, bind or accept ("127.0.0.1:8765",
	// "[::1]:80", "unix:/run/x.sock").
	Path string `json:"path,omitempty"`
	Addr string `json:"addr,omitempty"`
	// Argv is an execve's arguments (the first few).
	Argv []string `json:"argv,omitempty"`
	// Result is a syscall's return value and Errno its error (0: none);
	// Flags an open's flags.
	Result int64  `json:"result,omitempty"`
	Errno  int64  `json:"errno,omitempty"`
	Flags  uint32 `json:"flags,omitempty"`
	// Fd is the descriptor a socket call was on (listen's too, so that
	// its address is the one bound on it).
	Fd int64 `json:"fd,omitempty"`
	// Child is the process a clone made; Status an exit's wait status.
	Child  int32 `json:"child,omitempty"`
	Status int32 `json:"status,omitempty"`
}

// Trace is what runtime monitoring kept of a monitored sandbox since it
// booted or was restored, the body of GET /v1/sandboxes/{id}/trace
// (as {"trace": ...}).
type Trace struct {
	SandboxID string       `json:"sandboxId"`
	Events    []TraceEvent `json:"events"`
	// Dropped counts the events sbxd did not keep: past its bound on the
	// trace, or that it could not decode. SentryDropped counts those
	// gVisor dropped before sending (its socket was full).
	Dropped       int64 `json:"dropped"`
	SentryDropped int64 `json:"sentryDropped"`
	// Limit is the most events sbxd keeps of one sandbox.
	Limit int `json:"limit"`
	// Full says the trace has kept all it can (Limit events, or its
	// bound in bytes): what comes next is only counted.
	Full bool `json:"full,omitempty"`
	// Connected says gVisor's sink reached sbxd: with false, the trace
	// is empty because nothing was reported, not because nothing ran.
	Connected bool `json:"connected"`
}
