package api

import "time"

// State is a sandbox's lifecycle state as the API reports it.
type State string

// The states a sandbox can be in.
const (
	StateCreating State = "creating"
	StateRunning  State = "running"
	StateStopped  State = "stopped"
	StateError    State = "error"
	StateLost     State = "lost"
	StateDeleted  State = "deleted"
)

// Sandbox describes one sandbox.
type Sandbox struct {
	ID        string            `json:"id"`
	Name      string            `json:"name,omitempty"`
	Template  string            `json:"template"`
	State     State             `json:"state"`
	Reason    string            `json:"reason,omitempty"`
	CreatedAt time.Time         `json:"createdAt"`
	TTL       string            `json:"ttl,omitempty"`
	Meta      map[string]string `json:"meta,omitempty"`
	CPUs      float64           `json:"cpus,omitempty"`
	Memory    int64             `json:"memoryBytes,omitempty"`
	// Address is the sandbox's address as seen from inside it; every sandbox
	// has the same one, its network namespace is what tells them apart.
	Address string `json:"address,omitempty"`
	// LastActivity is when the sandbox last did something that counts as activity.
	LastActivity time.Time `json:"lastActivity"`
}

// CreateRequest is the body of POST /v1/sandboxes. Durations and sizes are
// strings ("30m", "512M") checked by the server, which names the bad field.
type CreateRequest struct {
	Template string            `json:"template,omitempty"`
	Name     string            `json:"name,omitempty"`
	TTL      string            `json:"ttl,omitempty"`
	Meta     map[string]string `json:"meta,omitempty"`
	CPUs     float64           `json:"cpus,omitempty"`
	Memory   string            `json:"memory,omitempty"`
}

// DeleteResult is the body answering DELETE /v1/sandboxes/{id}.
type DeleteResult struct {
	ID string `json:"id"`
}

// ExecRequest is the body of POST /v1/sandboxes/{id}/exec.
type ExecRequest struct {
	// Cmd is the program and its arguments. A single element containing
	// shell syntax is run by the client as ["/bin/sh", "-c", Cmd[0]].
	Cmd     []string `json:"cmd"`
	Env     []string `json:"env,omitempty"`
	Cwd     string   `json:"cwd,omitempty"`
	Timeout string   `json:"timeout,omitempty"`
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
	Error string `json:"error,omitempty"`
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
}

// Template describes one template.
type Template struct {
	Name      string    `json:"name"`
	Size      int64     `json:"sizeBytes"`
	CreatedAt time.Time `json:"createdAt"`
	Source    string    `json:"source"`
}

// Progress is one server-sent event of a long operation (a template build or
// import). The last event has Done set, or Error.
type Progress struct {
	Event    string    `json:"event"`
	Message  string    `json:"message,omitempty"`
	Done     bool      `json:"done,omitempty"`
	Error    string    `json:"error,omitempty"`
	Template *Template `json:"template,omitempty"`
}

// Health is the body of GET /v1/health.
type Health struct {
	Status  string `json:"status"`
	Version string `json:"version"`
}
