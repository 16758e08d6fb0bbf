package client

import (
	"bufio"
	"bytes"
	"io"
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
