package sandbox

import (
	"errors"
	"testing"

	"sbx.dev/sbx/api"
	"sbx.dev/sbx/internal/netns"
)

func TestParseShape(t *testing.T) {
	if api.MaxNetDelay != netns.MaxDelay {
		t.Fatalf("api.MaxNetDelay %s, netns.MaxDelay %s: the API promises what the network enforces", api.MaxNetDelay, netns.MaxDelay)
	}
	for _, bad := range []struct {
		sh      api.NetShape
		network string
	}{
		{api.NetShape{Delay: "soon"}, ""},
		{api.NetShape{Delay: "-5ms"}, ""},
		{api.NetShape{Delay: "11s"}, ""},
		{api.NetShape{Loss: 1}, ""},
		{api.NetShape{Loss: -0.5}, ""},
		{api.NetShape{Delay: "10ms"}, NetworkNone},
		{api.NetShape{Loss: 0.1}, NetworkNone},
	} {
		if _, _, err := parseShape(&bad.sh, bad.network); !errors.Is(err, api.ErrInvalid) {
			t.Errorf("parseShape(%+v, %q) = %v, want invalid", bad.sh, bad.network, err)
		}
	}
	d, l, err := parseShape(&api.NetShape{Delay: "250ms", Loss: 0.05}, "")
	if err != nil || d.Milliseconds() != 250 || l != 0.05 {
		t.Errorf("parseShape(250ms, 0.05) = %s, %v, %v", d, l, err)
	}
	if _, _, err := parseShape(&api.NetShape{}, NetworkNone); err != nil {
		t.Errorf("no shape on network none: %v", err)
	}
}
