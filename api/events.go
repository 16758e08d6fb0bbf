package api

import (
	"encoding/json"
	"time"
)

// EventDetail is an Event's Detail with its fields typed. Each event type
// sets the fields that concern it; the others are zero.
type EventDetail struct {
	// Captures (forked, snapshot, stopped, resumed): when the capture
	// started and ended, how long it took, how big its image is, and its
	// outcome, "ok" or "error" (with Error).
	Start    time.Time
	End      time.Time
	Duration time.Duration
	Size     int64
	Outcome  string
	Error    string
	// Paused is how long the sandbox was paused for a capture with memory.
	Paused time.Duration
	// Memory says a fork or snapshot carried the memory.
	Memory bool
	// Children are the sandboxes a fork made (forked).
	Children []string
	// Name is the snapshot's name (snapshot).
	Name string
	// MemoryRestored and ResumeReason: whether a resumed or created sandbox
	// carries on its processes, and why not (resumed, created).
	MemoryRestored bool
	ResumeReason   string
	// Template, From and Parent say what a created sandbox was made from.
	Template string
	From     string
	Parent   string
	// TTL is the idle ttl set (ttl); Persistent the exemption set (persist).
	TTL        time.Duration
	Persistent bool
	// Reason says why (reaped, oom, exited, state changes, reconciled).
	Reason string
	// State is the state a reaped sandbox was in; FromState the state a
	// change of state left.
	State     State
	FromState State
	// MemoryLimit is the limit an oom hit, in bytes.
	MemoryLimit int64
	// SnapshotsRemoved are the snapshots deleted with the sandbox (deleted).
	SnapshotsRemoved []string
	// Operation, Step and Decision: what reconcile settled, and how.
	Operation string
	Step      string
	Decision  string
}

// eventDetailWire is how the fields of EventDetail are spelled in Detail.
type eventDetailWire struct {
	Start            time.Time `json:"start"`
	End              time.Time `json:"end"`
	DurationMs       float64   `json:"durationMs"`
	SizeBytes        float64   `json:"sizeBytes"`
	Outcome          string    `json:"outcome"`
	Error            string    `json:"error"`
	PausedMs         float64   `json:"pausedMs"`
	Memory           bool      `json:"memory"`
	Children         []string  `json:"children"`
	Name             string    `json:"name"`
	MemoryRestored   bool      `json:"memoryRestored"`
	ResumeReason     string    `json:"resumeReason"`
	Template         string    `json:"template"`
	From             string    `json:"from"`
	Parent           string    `json:"parent"`
	TTL              string    `json:"ttl"`
	Persistent       bool      `json:"persistent"`
	Reason           string    `json:"reason"`
	State            string    `json:"state"`
	MemoryLimit      float64   `json:"memoryLimit"`
	SnapshotsRemoved []string  `json:"snapshotsRemoved"`
	Operation        string    `json:"operation"`
	Step             string    `json:"step"`
	Decision         string    `json:"decision"`
}

// Details returns the event's Detail with its fields typed. A field of an
// unexpected type is left zero: Detail is as the server sent it.
func (e Event) Details() EventDetail {
	var d EventDetail
	if len(e.Detail) == 0 {
		return d
	}
	var w eventDetailWire
	// field by field, so that one odd value spoils only itself
	for k, v := range e.Detail {
		b, err := json.Marshal(map[string]any{k: v})
		if err == nil {
			_ = json.Unmarshal(b, &w)
		}
	}
	d = EventDetail{
		Start: w.Start, End: w.End, Duration: time.Duration(w.DurationMs) * time.Millisecond,
		Size: int64(w.SizeBytes), Outcome: w.Outcome, Error: w.Error,
		Paused: time.Duration(w.PausedMs) * time.Millisecond, Memory: w.Memory,
		Children: w.Children, Name: w.Name, MemoryRestored: w.MemoryRestored, ResumeReason: w.ResumeReason,
		Template: w.Template, Parent: w.Parent, Persistent: w.Persistent, Reason: w.Reason,
		MemoryLimit: int64(w.MemoryLimit), SnapshotsRemoved: w.SnapshotsRemoved,
		Operation: w.Operation, Step: w.Step, Decision: w.Decision,
	}
	if ttl, err := time.ParseDuration(w.TTL); err == nil {
		d.TTL = ttl
	}
	// "from" is a snapshot for created, the old state for a change of state
	if _, ok := IsStateEvent(e.Type); ok {
		d.FromState = State(w.From)
	} else {
		d.From = w.From
	}
	if e.Type == EventReaped {
		d.State = State(w.State)
	}
	return d
}
