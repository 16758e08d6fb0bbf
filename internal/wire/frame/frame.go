// Package frame is how the agent inside a sandbox sends a command's output
// out through one stream: stdout and stderr multiplexed, then the exit
// code, each a frame. runsc's own stderr stays apart, so nothing runsc
// says about itself can pass for the command's output.
//
// A frame is one type byte, a big-endian uint32 length and that many bytes
// of payload (at most MaxPayload).
package frame

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"strconv"
	"sync"
	"time"
)

// The frame types.
const (
	Stdout byte = 'o'
	Stderr byte = 'e'
	// Pid carries the command's pid inside the sandbox, in decimal.
	Pid byte = 'p'
	// Exit carries the command's exit code, in decimal; it is the last frame.
	Exit byte = 'x'
	// Alive carries nothing: the copier says it is still there, every
	// AliveEvery, so that a reader can tell a quiet command from a copier
	// that was stopped or wedged inside the sandbox.
	Alive byte = 'k'
)

// AliveEvery is how often a copier sends Alive.
const AliveEvery = 5 * time.Second

// MaxPayload bounds a frame: a reader never holds more of one in memory.
const MaxPayload = 64 << 10

// Writer writes frames; it is safe for concurrent use.
type Writer struct {
	mu sync.Mutex
	w  io.Writer
}

// NewWriter returns a Writer on w.
func NewWriter(w io.Writer) *Writer { return &Writer{w: w} }

// Write sends p as frames of type t, split at MaxPayload.
func (fw *Writer) Write(t byte, p []byte) error {
	fw.mu.Lock()
	defer fw.mu.Unlock()
	var hdr [5]byte
	for len(p) > 0 || t == Exit || t == Pid || t == Alive {
		n := min(len(p), MaxPayload)
		hdr[0] = t
		binary.BigEndian.PutUint32(hdr[1:], uint32(n))
		if _, err := fw.w.Write(hdr[:]); err != nil {
			return err
		}
		if _, err := fw.w.Write(p[:n]); err != nil {
			return err
		}
		p = p[n:]
		if len(p) == 0 {
			break
		}
	}
	return nil
}

// Stream returns an io.Writer that sends what it is given as frames of type t.
func (fw *Writer) Stream(t byte) io.Writer { return streamWriter{fw, t} }

type streamWriter struct {
	fw *Writer
	t  byte
}

func (s streamWriter) Write(p []byte) (int, error) {
	if err := s.fw.Write(s.t, p); err != nil {
		return 0, err
	}
	return len(p), nil
}

// WriteCode sends an exit or pid frame.
func (fw *Writer) WriteCode(t byte, n int) error { return fw.Write(t, []byte(strconv.Itoa(n))) }

// ErrCorrupt is wrapped by Read's errors about a malformed stream.
var ErrCorrupt = errors.New("corrupt frame stream")

// Read reads one frame into buf (which must hold MaxPayload bytes) and
// returns its type and payload (a slice of buf). io.EOF at a frame
// boundary is the end; a short or oversized frame is ErrCorrupt.
func Read(r io.Reader, buf []byte) (byte, []byte, error) {
	var hdr [5]byte
	if _, err := io.ReadFull(r, hdr[:]); err != nil {
		if err == io.ErrUnexpectedEOF {
			return 0, nil, fmt.Errorf("%w: truncated header", ErrCorrupt)
		}
		return 0, nil, err
	}
	n := binary.BigEndian.Uint32(hdr[1:])
	switch {
	case n > MaxPayload:
		return 0, nil, fmt.Errorf("%w: a frame of %d bytes (at most %d)", ErrCorrupt, n, MaxPayload)
	case hdr[0] != Stdout && hdr[0] != Stderr && hdr[0] != Pid && hdr[0] != Exit && hdr[0] != Alive:
		return 0, nil, fmt.Errorf("%w: unknown frame type %q", ErrCorrupt, hdr[0])
	case (hdr[0] == Pid || hdr[0] == Exit) && n > 20, hdr[0] == Alive && n > 0:
		return 0, nil, fmt.Errorf("%w: a %q frame of %d bytes", ErrCorrupt, hdr[0], n)
	}
	if _, err := io.ReadFull(r, buf[:n]); err != nil {
		return 0, nil, fmt.Errorf("%w: truncated payload", ErrCorrupt)
	}
	return hdr[0], buf[:n], nil
}

// Code parses the payload of a pid or exit frame.
func Code(p []byte) (int, error) {
	n, err := strconv.Atoi(string(p))
	if err != nil || n < 0 || n > 1<<31 {
		return 0, fmt.Errorf("%w: bad code %q", ErrCorrupt, p)
	}
	return n, nil
}
