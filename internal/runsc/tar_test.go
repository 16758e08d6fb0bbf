package runsc

import (
	"bytes"
	"errors"
	"strings"
	"testing"
)

func TestCopyAtMost(t *testing.T) {
	cases := []struct {
		name    string
		in      int
		max     int64
		tooBig  bool
		written int
	}{
		{name: "under", in: 10, max: 11, written: 10},
		{name: "at the bound", in: 11, max: 11, written: 11},
		{name: "past the bound", in: 12, max: 11, tooBig: true, written: 12},
		{name: "far past", in: 1 << 20, max: 100, tooBig: true, written: 101},
		{name: "no bound", in: 1 << 20, max: 0, written: 1 << 20},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var out bytes.Buffer
			err := copyAtMost(&out, strings.NewReader(strings.Repeat("x", tc.in)), tc.max)
			if got := errors.Is(err, ErrTarTooBig); got != tc.tooBig {
				t.Errorf("got %v, want too big %v", err, tc.tooBig)
			}
			// past the bound, one byte more than it is read and the rest never
			if out.Len() != tc.written {
				t.Errorf("wrote %d bytes, want %d", out.Len(), tc.written)
			}
		})
	}
}
