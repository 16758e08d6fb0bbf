package client

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"

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

// readStream reads the server-sent events of one stream from r, each
// decoded into a T, and hands them to handle with their event name (the SSE
// name, which a T's own "event" field may repeat) until handle reports
// done. Every stream of sbxd ends an error the same way: an "error" event
// whose data is an api.StreamErrorBody; readStream returns it as an error of
// the kind its code names, so errors.Is(err, api.ErrNotFound) works on a
// stream as on any call. It returns ended true when the stream ended
// without handle being done (an eof, or the connection closed), and any
// error from handle as it is.
func readStream[T any](r io.Reader, handle func(name string, ev T) (done bool, err error)) (ended bool, err error) {
	sr := newSSEReader(r)
	for {
		raw, err := sr.next()
		if err == io.EOF {
			return true, nil
		}
		if err != nil {
			return false, err
		}
		if raw.name == "error" {
			return false, streamError(raw.data)
		}
		var ev T
		if len(raw.data) > 0 {
			if err := json.Unmarshal(raw.data, &ev); err != nil {
				return false, fmt.Errorf("decode %q event: %w", raw.name, err)
			}
		}
		done, err := handle(raw.name, ev)
		if err != nil || done {
			return false, err
		}
	}
}

// streamError is the error an "error" event's data says, of the api kind
// its code names (of no kind without one).
func streamError(data []byte) error {
	var body api.StreamErrorBody
	_ = json.Unmarshal(data, &body) // a body that is not JSON leaves the message empty
	return api.StreamError(body.Code, body.Error)
}
