package frame

import (
	"bytes"
	"errors"
	"io"
	"testing"
)

func TestRoundTrip(t *testing.T) {
	var b bytes.Buffer
	w := NewWriter(&b)
	big := bytes.Repeat([]byte("x"), MaxPayload+10)
	if err := w.WriteCode(Pid, 42); err != nil {
		t.Fatal(err)
	}
	if _, err := w.Stream(Stdout).Write(big); err != nil {
		t.Fatal(err)
	}
	if err := w.Write(Stderr, []byte("oops")); err != nil {
		t.Fatal(err)
	}
	if err := w.WriteCode(Exit, 3); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, MaxPayload)
	var out, errs []byte
	var pid, code int
	for {
		typ, p, err := Read(&b, buf)
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		switch typ {
		case Stdout:
			out = append(out, p...)
		case Stderr:
			errs = append(errs, p...)
		case Pid:
			pid, _ = Code(p)
		case Exit:
			code, _ = Code(p)
		}
	}
	if !bytes.Equal(out, big) || string(errs) != "oops" || pid != 42 || code != 3 {
		t.Errorf("got %d bytes of stdout, stderr %q, pid %d, exit %d; want %d, oops, 42, 3", len(out), errs, pid, code, len(big))
	}
}

func TestCorrupt(t *testing.T) {
	tests := []struct {
		name string
		in   []byte
	}{
		{"truncated header", []byte{'o', 0, 0}},
		{"oversized", []byte{'o', 0xff, 0xff, 0xff, 0xff}},
		{"unknown type", []byte{'z', 0, 0, 0, 1, 'a'}},
		{"truncated payload", []byte{'o', 0, 0, 0, 9, 'a'}},
		{"long exit", append([]byte{'x', 0, 0, 0, 30}, bytes.Repeat([]byte("9"), 30)...)},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, _, err := Read(bytes.NewReader(tc.in), make([]byte, MaxPayload))
			if !errors.Is(err, ErrCorrupt) {
				t.Errorf("got %v, want ErrCorrupt", err)
			}
		})
	}
	if _, err := Code([]byte("-1")); !errors.Is(err, ErrCorrupt) {
		t.Errorf("negative code: got %v, want ErrCorrupt", err)
	}
}

func TestAlive(t *testing.T) {
	var b bytes.Buffer
	fw := NewWriter(&b)
	if err := fw.Write(Alive, nil); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, MaxPayload)
	typ, p, err := Read(&b, buf)
	if err != nil || typ != Alive || len(p) != 0 {
		t.Fatalf("read back %q %q %v, want an empty alive frame", typ, p, err)
	}
	if _, _, err := Read(bytes.NewReader([]byte{Alive, 0, 0, 0, 1, 'x'}), buf); !errors.Is(err, ErrCorrupt) {
		t.Errorf("an alive frame with a payload: %v, want corrupt", err)
	}
}
