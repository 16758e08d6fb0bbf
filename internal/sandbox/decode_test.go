package sandbox

import (
	"errors"
	"strings"
	"testing"

	"sbx.dev/sbx/api"
)

// TestDecodeList: an agent's list answer is decoded one element at a time,
// and refused past its entries, before they cost sbxd their decoded size.
func TestDecodeList(t *testing.T) {
	got, err := decodeList[api.Port]([]byte(`[{"port":80},{"port":443}]`), 2, "ports")
	if err != nil || len(got) != 2 || got[1].Port != 443 {
		t.Errorf("two ports: %+v, %v", got, err)
	}
	if got, err := decodeList[api.Port]([]byte(`[]`), 2, "ports"); err != nil || got == nil || len(got) != 0 {
		t.Errorf("no ports: %#v, %v; want an empty, non-nil list", got, err)
	}
	flood := "[" + strings.Repeat("{},", 1<<20) + "{}]"
	if _, err := decodeList[api.Port]([]byte(flood), 1000, "ports"); !errors.Is(err, api.ErrUnavailable) || !strings.Contains(err.Error(), "more than 1000 entries") {
		t.Errorf("a flood of empty objects: %v, want ErrUnavailable saying more than 1000 entries", err)
	}
	for _, bad := range []string{``, `{}`, `[{"port":"x"}]`, `[{}`, `null`} {
		if _, err := decodeList[api.Port]([]byte(bad), 10, "ports"); err == nil {
			t.Errorf("%q: decoded, want an error", bad)
		}
	}
}
