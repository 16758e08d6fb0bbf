package main

import (
	"testing"
)

func TestPrefixesFlag(t *testing.T) {
	tests := []struct {
		in, want string
		bad      bool
	}{
		{in: "10.0.0.0/8", want: "10.0.0.0/8"},
		{in: "10.1.2.3/8", want: "10.0.0.0/8"},
		{in: "169.254.169.254", want: "169.254.169.254/32"},
		{in: "fd00::/8", bad: true},
		{in: "::1", bad: true},
		{in: "10.0.0.0/33", bad: true},
		{in: "metadata", bad: true},
		{in: "", bad: true},
	}
	for _, tc := range tests {
		t.Run(tc.in, func(t *testing.T) {
			var p prefixes
			err := p.Set(tc.in)
			if tc.bad {
				if err == nil {
					t.Errorf("Set(%q) = nil, want an error", tc.in)
				}
				return
			}
			if err != nil || p.String() != tc.want {
				t.Errorf("Set(%q): %q %v, want %q", tc.in, p.String(), err, tc.want)
			}
		})
	}
	var p prefixes
	p.Set("10.0.0.0/8")
	p.Set("192.168.0.0/16")
	if p.String() != "10.0.0.0/8,192.168.0.0/16" {
		t.Errorf("repeated: %q", p.String())
	}
}
