package api

import (
	"errors"
	"strings"
	"testing"
	"time"
)

func TestParseDuration(t *testing.T) {
	tests := []struct {
		in   string
		want time.Duration
		ok   bool
	}{
		{"", 0, true},
		{"90s", 90 * time.Second, true},
		{"1h30m", 90 * time.Minute, true},
		{"10", 10 * time.Second, true},
		{"3600", time.Hour, true},
		{"1.5", 1500 * time.Millisecond, true},
		{"0", 0, true},
		{"-5m", 0, false},
		{"-5", 0, false},
		{"soon", 0, false},
		{"1e3", 0, false},
		{"0x10", 0, false},
		{"Inf", 0, false},
		{"10 s", 0, false},
		{"99999999999999999999", 0, false},
	}
	for _, tc := range tests {
		t.Run(tc.in, func(t *testing.T) {
			got, err := ParseDuration("ttl", tc.in)
			if (err == nil) != tc.ok || got != tc.want {
				t.Errorf("ParseDuration(%q) = %v, %v; want %v ok=%v", tc.in, got, err, tc.want, tc.ok)
			}
			if err != nil && (!errors.Is(err, ErrInvalid) || !strings.HasPrefix(err.Error(), "ttl: ")) {
				t.Errorf("error %q does not name the field or is not ErrInvalid", err)
			}
		})
	}
}

func TestParseDurationNoField(t *testing.T) {
	if _, err := ParseDuration("", "soon"); err == nil || strings.HasPrefix(err.Error(), ":") || !strings.HasPrefix(err.Error(), `"soon"`) {
		t.Errorf("ParseDuration without a field: %v", err)
	}
}
