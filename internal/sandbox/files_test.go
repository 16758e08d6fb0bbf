package sandbox

import (
	"errors"
	"testing"

	"sbx.dev/sbx/api"
)

func TestCheckPath(t *testing.T) {
	tests := []struct {
		in, want string
		ok       bool
	}{
		{"/etc/hosts", "/etc/hosts", true},
		{"/a/../b/", "/b", true},
		{"~", "~", true},
		{"~/file", "~/file", true},
		{"~user/x", "~user/x", true},
		{"", "", false},
		{"relative", "", false},
		{"./x", "", false},
		{"/a\x00b", "", false},
		{"~/a\x00b", "", false},
	}
	for _, tc := range tests {
		t.Run(tc.in, func(t *testing.T) {
			got, err := checkPath(tc.in)
			if (err == nil) != tc.ok || got != tc.want {
				t.Fatalf("checkPath(%q) = %q, %v; want %q ok=%v", tc.in, got, err, tc.want, tc.ok)
			}
			if err != nil && !errors.Is(err, api.ErrInvalid) {
				t.Errorf("error %v is not ErrInvalid", err)
			}
		})
	}
}
