package api

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"
)

// decodeRequest decodes body as sbxd does: a Duration that does not read
// names its field (DecodeError), then the request's Validate.
func decodeRequest(body string, v interface{ Validate() error }) error {
	dec := json.NewDecoder(strings.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return DecodeError(err)
	}
	return v.Validate()
}

func TestDurationDecode(t *testing.T) {
	tests := []struct {
		name string
		body string
		v    interface{ Validate() error }
		want string // "" is no error
	}{
		{"go duration", `{"ttl":"30m"}`, &CreateRequest{}, ""},
		{"bare seconds", `{"ttl":"1800"}`, &CreateRequest{}, ""},
		{"a number", `{"ttl":1800}`, &CreateRequest{}, `ttl: 1800 is not a duration: give it as a string`},
		{"null", `{"ttl":null}`, &CreateRequest{}, ""},
		{"not a duration", `{"ttl":"soon"}`, &CreateRequest{}, `ttl: "soon" is not a duration (use seconds`},
		{"negative", `{"ttl":"-5m"}`, &CreateRequest{}, `ttl: "-5m" is negative`},
		{"negative seconds", `{"ttl":"-5"}`, &CreateRequest{}, `ttl: "-5" is not a duration`},
		{"not a string", `{"ttl":true}`, &CreateRequest{}, `ttl: true is not a duration: give it as a string`},
		{"nested field", `{"netShape":{"delay":"later"}}`, &CreateRequest{}, `netShape.delay: "later" is not a duration`},
		{"delay past its bound", `{"netShape":{"delay":"11s"}}`, &CreateRequest{}, `netShape.delay: "11s" is not a duration between 0s and 10s`},
		{"the fleet's meta", `{"meta":{"sbx.object":"web"}}`, &CreateRequest{}, "meta: sbx.object is the fleet's"},
		{"the pool's meta", `{"meta":{"sbx.pool":"base"}}`, &CreateRequest{}, "meta: sbx.pool is sbxd's"},
		{"another meta", `{"meta":{"team":"a","sbx.crashes":"off"}}`, &CreateRequest{}, ""},
		{"fork ttl", `{"ttl":"x"}`, &ForkRequest{}, `ttl: "x" is not a duration`},
		{"the fleet's meta on a fork", `{"meta":{"sbx.object":"web"}}`, &ForkRequest{}, "meta: sbx.object is the fleet's"},
		{"fork count", `{"count":17}`, &ForkRequest{}, "count 17 is out of range: a fork makes 1 to 16 sandboxes per call"},
		{"fork name with a count", `{"count":2,"name":"n"}`, &ForkRequest{}, "name: only a single fork can be named"},
		{"ttl request", `{"ttl":"2h"}`, &TTLRequest{}, ""},
		{"ttl request bad", `{"ttl":"1e3"}`, &TTLRequest{}, `ttl: "1e3" is not a duration`},
		{"exec timeout", `{"cmd":["ls"],"timeout":"soon"}`, &ExecRequest{}, `timeout: "soon" is not a duration`},
		{"prune", `{"olderThan":"later"}`, &PruneRequest{}, `olderThan: "later" is not a duration`},
		{"preview ttl", `{"port":80,"private":true,"ttl":"2h"}`, &PreviewRequest{}, ""},
		{"preview ttl too short", `{"port":80,"private":true,"ttl":"0"}`, &PreviewRequest{}, `ttl: "0s" is not a duration between 1s and 720h0m0s`},
		{"preview ttl too long", `{"port":80,"private":true,"ttl":"721h"}`, &PreviewRequest{}, `ttl: "721h0m0s" is not a duration between 1s and 720h0m0s`},
		{"preview ttl not private", `{"port":80,"ttl":"1h"}`, &PreviewRequest{}, "ttl: only a private preview expires"},
		{"preview port", `{"port":0}`, &PreviewRequest{}, "port: 0 is not a TCP port"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := decodeRequest(tc.body, tc.v)
			switch {
			case tc.want == "" && err != nil:
				t.Errorf("got %v, want no error", err)
			case tc.want != "" && (err == nil || !strings.HasPrefix(err.Error(), tc.want) || !errors.Is(err, ErrInvalid)):
				t.Errorf("got %v, want ErrInvalid %q", err, tc.want)
			}
		})
	}
}

func TestDurationValues(t *testing.T) {
	var r CreateRequest
	if err := json.Unmarshal([]byte(`{"ttl":"1.5"}`), &r); err != nil || r.TTL.D() != 1500*time.Millisecond {
		t.Errorf("ttl 1.5: got %s, %v; want 1.5s", r.TTL, err)
	}
	var f ForkRequest
	if err := json.Unmarshal([]byte(`{"ttl":"0"}`), &f); err != nil || f.TTL == nil || *f.TTL != 0 {
		t.Errorf("fork ttl 0: got %v, %v; want a ttl of none, not absent", f.TTL, err)
	}
	tests := []struct {
		name string
		v    any
		want string
	}{
		{"go form", Sandbox{TTL: Duration(30 * time.Minute)}, `"ttl":"30m0s"`},
		{"fork ttl none", ForkRequest{TTL: DurationOf(0)}, `"ttl":"0s"`},
		{"fork ttl absent", ForkRequest{}, `{}`},
		{"ttl request", TTLRequest{}, `{"ttl":"0s"}`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			b, err := json.Marshal(tc.v)
			if err != nil || !strings.Contains(string(b), tc.want) {
				t.Errorf("got %s, %v; want it to hold %s", b, err, tc.want)
			}
		})
	}
	if b, _ := json.Marshal(Sandbox{}); strings.Contains(string(b), `"ttl"`) {
		t.Errorf("a sandbox without a ttl: %s, want no ttl", b)
	}
}

func TestDurationSet(t *testing.T) {
	var d Duration
	if err := d.Set("90"); err != nil || d.D() != 90*time.Second {
		t.Errorf("Set(90) = %s, %v", d, err)
	}
	for _, bad := range []string{"", " ", "soon", "-5"} {
		if err := d.Set(bad); err == nil {
			t.Errorf("Set(%q): no error", bad)
		}
	}
}

func TestCheckForkCount(t *testing.T) {
	tests := []struct {
		n    int
		tree bool
		want string
	}{
		{1, false, ""},
		{MaxForks, false, ""},
		{MaxForks + 1, false, "count 17 is out of range: a fork makes 1 to 16 sandboxes per call; more grow a tree from the children, which must be ready"},
		{0, false, "count 0 is out of range: a fork makes 1 to 16"},
		{MaxForks + 1, true, ""},
		{1000, true, ""},
		{0, true, "count 0 is out of range: a fork makes at least 1 sandbox"},
		{-1, true, "count -1 is out of range"},
	}
	for _, tc := range tests {
		err := CheckForkCount(tc.n, tc.tree)
		if (tc.want == "") != (err == nil) || err != nil && (!strings.HasPrefix(err.Error(), tc.want) || !errors.Is(err, ErrInvalid)) {
			t.Errorf("CheckForkCount(%d, %v) = %v, want %q", tc.n, tc.tree, err, tc.want)
		}
	}
}
