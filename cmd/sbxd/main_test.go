package main

import (
	"strings"
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

// TestWarmFlag: --warm takes a template, a size and the pool's limits,
// refuses what a user may mistype with a message saying the form, and a
// pool given twice keeps the later size.
func TestWarmFlag(t *testing.T) {
	for _, tc := range []struct {
		in, want, bad string
	}{
		{in: "base=2", want: "base=2"},
		{in: "base=2,memory=1G,cpus=0.5", want: "base=2,cpus=0.5,memory=1G"},
		{in: "tiny=1,pids=64,disk=100M", want: "tiny=1,pids=64,disk=100M"},
		{in: "base", bad: "TEMPLATE=N"},
		{in: "base=-1", bad: "TEMPLATE=N"},
		{in: "base=65", bad: "TEMPLATE=N"},
		{in: "base=two", bad: "TEMPLATE=N"},
		{in: "../x=1", bad: "template"},
		{in: "base=1,memory", bad: "no limit"},
		{in: "base=1,memory=lots", bad: "memory"},
		{in: "base=1,cpus=0", bad: "cpus"},
		{in: "base=1,pids=-3", bad: "pids"},
		{in: "base=1,gpus=1", bad: "cpus, memory, pids or disk"},
		{in: "base=1,", bad: "no limit"},
	} {
		var w warmPools
		err := w.Set(tc.in)
		switch {
		case tc.bad != "" && (err == nil || !strings.Contains(err.Error(), tc.bad)):
			t.Errorf("Set(%q) = %v, want an error saying %q", tc.in, err, tc.bad)
		case tc.bad == "" && (err != nil || w.String() != tc.want):
			t.Errorf("Set(%q): %q %v, want %q", tc.in, w.String(), err, tc.want)
		}
	}
	var w warmPools
	for _, v := range []string{"base=2", "base=1,memory=1G", "base=4", "tiny=1"} {
		if err := w.Set(v); err != nil {
			t.Fatal(err)
		}
	}
	if got := w.String(); got != "base=4 base=1,memory=1G tiny=1" {
		t.Errorf("repeated --warm: %q, want base=4 base=1,memory=1G tiny=1", got)
	}
}
