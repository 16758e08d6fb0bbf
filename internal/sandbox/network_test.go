package sandbox

import (
	"errors"
	"testing"
	"time"

	"sbx.dev/sbx/api"
	"sbx.dev/sbx/internal/netns"
)

func TestParseShape(t *testing.T) {
	// the API promises what the network enforces: one bound, written in api
	if err := (netns.Shape{Delay: api.MaxNetDelay}).Check(); err != nil {
		t.Fatalf("netns refuses the API's longest delay: %v", err)
	}
	if err := (netns.Shape{Delay: api.MaxNetDelay + 1}).Check(); err == nil {
		t.Fatal("netns takes a delay past the API's longest")
	}
	for _, bad := range []struct {
		sh      api.NetShape
		network string
	}{
		{api.NetShape{Delay: api.Duration(-5 * time.Millisecond)}, ""},
		{api.NetShape{Delay: api.Duration(11 * time.Second)}, ""},
		{api.NetShape{Loss: 1}, ""},
		{api.NetShape{Loss: -0.5}, ""},
		{api.NetShape{Delay: api.Duration(10 * time.Millisecond)}, NetworkNone},
		{api.NetShape{Loss: 0.1}, NetworkNone},
	} {
		if _, _, err := parseShape(&bad.sh, bad.network); !errors.Is(err, api.ErrInvalid) {
			t.Errorf("parseShape(%+v, %q) = %v, want invalid", bad.sh, bad.network, err)
		}
	}
	d, l, err := parseShape(&api.NetShape{Delay: api.Duration(250 * time.Millisecond), Loss: 0.05}, "")
	if err != nil || d.Milliseconds() != 250 || l != 0.05 {
		t.Errorf("parseShape(250ms, 0.05) = %s, %v, %v", d, l, err)
	}
	if _, _, err := parseShape(&api.NetShape{}, NetworkNone); err != nil {
		t.Errorf("no shape on network none: %v", err)
	}
}
