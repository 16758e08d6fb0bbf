package client

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"

	"sbx.dev/sbx/api"
)

// maxSSELine bounds one line of a stream; output events carry up to ~100 KB
// of base64 in one data line.
const maxSSELine = 8 << 20

// sseEvent is one server-sent event.
type sseEvent struct {
	name string
	data []byte
}

// sseReader reads server-sent events ("event: NAME\ndata: JSON\n\n").
type sseReader struct {
	s *bufio.Scanner
}

func newSSEReader(r io.Reader) *sseReader {
	s := bufio.NewScanner(r)
	s.Buffer(make([]byte, 0, 64<<10), maxSSELine)
	return &sseReader{s: s}
}

// next returns the next complete event. It returns io.EOF at the end of the
// stream; an event cut off by the end is dropped, as the SSE spec says.
func (r *sseReader) next() (sseEvent, error) {
	var ev sseEvent
	var data [][]byte
	seen := false
	for r.s.Scan() {
		line := r.s.Bytes()
		if len(line) == 0 {
			if !seen {
				continue
			}
			ev.data = bytes.Join(data, []byte("\n"))
			return ev, nil
		}
		if line[0] == ':' {
			continue // comment, e.g. a keep-alive
		}
		field, value, _ := bytes.Cut(line, []byte(":"))
		value = bytes.TrimPrefix(value, []byte(" "))
		switch string(field) {
		case "event":
			ev.name, seen = string(value), true
		case "data":
			data, seen = append(data, bytes.Clone(value)), true
		}
	}
	if err := r.s.Err(); err != nil {
		return sseEvent{}, err
	}
	return sseEvent{}, io.EOF
}

// streamEnd says how a stream ended.
type streamEnd int

const (
	// streamDone: handle said it was done (the stream's last event).
	streamDone streamEnd = iota
	// streamCut: the stream ended without its last event.
	streamCut
)

// brokenError is a stream whose reading failed: the connection broke.
type brokenError struct{ err error }

func (e *brokenError) Error() string { return e.err.Error() }
func (e *brokenError) Unwrap() error { return e.err }

// isBroken reports whether err is a broken connection under a stream.
func isBroken(err error) bool {
	var b *brokenError
	return errors.As(err, &b)
}

// brokenCause is what broke a stream: the read error, or, for a stream
// that just ended before its last event, io.ErrUnexpectedEOF.
func brokenCause(err error) error {
	var b *brokenError
	if errors.As(err, &b) {
		return b.err
	}
	if err != nil {
		return err
	}
	return io.ErrUnexpectedEOF
}

// readStream reads the server-sent events of one stream from r, each
// decoded into a T, and hands them to handle with their event name (the SSE
// name, which a T's own "event" field may repeat) until handle reports
// done. Every stream of sbxd ends an error the same way: an "error" event
// whose data is an api.ErrorBody (alone or in the frame); readStream returns it as an error of
// the kind its code names, so errors.Is(err, api.ErrNotFound) works on a
// stream as on any call. It returns streamCut when the stream ended
// without handle being done (with a *brokenError when reading failed), and
// any error from handle as it is.
func readStream[T any](r io.Reader, handle func(name string, ev T) (done bool, err error)) (streamEnd, error) {
	sr := newSSEReader(r)
	for {
		raw, err := sr.next()
		if err == io.EOF {
			return streamCut, nil
		}
		if err != nil {
			return streamCut, &brokenError{err}
		}
		if raw.name == "error" {
			return streamDone, streamError(raw.data)
		}
		var ev T
		if len(raw.data) > 0 {
			if err := json.Unmarshal(raw.data, &ev); err != nil {
				return streamDone, fmt.Errorf("decode %q event: %w", raw.name, err)
			}
		}
		done, err := handle(raw.name, ev)
		if err != nil || done {
			return streamDone, err
		}
	}
}

// streamError is the error an "error" event's data says, of the api kind
// its code names (of no kind without one). The data is an api.ErrorBody,
// alone or in the stream's frame; an sbxd older than the one envelope
// sent {"error":MESSAGE,"code":CODE}, read too.
func streamError(data []byte) error {
	var body struct {
		Error json.RawMessage `json:"error"`
		Code  string          `json:"code"` // the flat shape's
	}
	_ = json.Unmarshal(data, &body) // a body that is not JSON leaves the message empty
	var d api.ErrorDetail
	if json.Unmarshal(body.Error, &d) != nil {
		d = api.ErrorDetail{Code: body.Code}
		_ = json.Unmarshal(body.Error, &d.Message)
	}
	return api.StreamError(d.Code, d.Message)
}

// StreamError is the error of a stream from sbxd that ended before its
// end: sbxd went away, was restarted or is shutting down, or the
// connection broke. It matches api.ErrUnavailable. What the stream watched
// goes on without it, and the error names it: ExecID the exec (its
// command runs on: wait for it again with Sandbox.Process(ExecID).Wait),
// Children the sandboxes a fork had announced, LastSeq the last event a
// follow of Events handed over.
type StreamError struct {
	// Op is what the stream was: "exec", "wait", "output", "fork",
	// "events" or "logs".
	Op        string
	SandboxID string
	ExecID    string
	Children  []string
	LastSeq   int64
	// Err is what broke it: a read error, io.ErrUnexpectedEOF for a stream
	// that stopped short, or sbxd's own error of kind api.ErrUnavailable.
	Err error
}

func (e *StreamError) Error() string {
	what := e.Op
	if e.SandboxID != "" {
		what += " of " + e.SandboxID
	}
	goesOn := ""
	switch {
	case e.ExecID != "":
		what = fmt.Sprintf("%s %s in %s", e.Op, e.ExecID, e.SandboxID)
		goesOn = fmt.Sprintf("; exec %s goes on in the sandbox", e.ExecID)
	case len(e.Children) > 0:
		goesOn = fmt.Sprintf("; the fork goes on (children %s)", strings.Join(e.Children, ", "))
	case e.LastSeq > 0:
		goesOn = fmt.Sprintf("; the last event seen was %d", e.LastSeq)
	}
	return fmt.Sprintf("%s: the stream from sbxd broke before its end%s: %v", what, goesOn, e.Err)
}

// Unwrap makes a StreamError match api.ErrUnavailable and what broke it.
func (e *StreamError) Unwrap() []error { return []error{e.Err, api.ErrUnavailable} }
