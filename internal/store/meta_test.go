package store

import (
	"context"
	"testing"
	"time"

	"sbx.dev/sbx/api"
)

// TestSetMetaKey: a key is set and removed in a sandbox's meta, a nil
// meta included, only while the sandbox is in the state and on the image
// asked (unless none is asked), and a key with quotes or dots names that
// key alone.
func TestSetMetaKey(t *testing.T) {
	ctx := context.Background()
	s := openTest(t)
	now := time.Now()
	sb := &Sandbox{ID: "sb_aaaaaaaaaa", Template: "tiny", State: api.StateStopped, CreatedAt: now, LastActivity: now, Image: "im_1"}
	if err := s.CreateSandbox(ctx, sb); err != nil { // meta nil: "null"
		t.Fatal(err)
	}
	get := func() map[string]string {
		got, err := s.Sandbox(ctx, sb.ID)
		if err != nil {
			t.Fatal(err)
		}
		return got.Meta
	}
	if ok, err := s.SetMetaKey(ctx, sb.ID, api.StateStopped, "im_1", "sbx.image-ref", "r1"); !ok || err != nil {
		t.Fatalf("set on a nil meta: %v %v", ok, err)
	}
	if get()["sbx.image-ref"] != "r1" {
		t.Fatalf("meta: %v", get())
	}
	// another image, another state: nothing set
	if ok, _ := s.SetMetaKey(ctx, sb.ID, api.StateStopped, "im_2", "sbx.image-ref", "r2"); ok || get()["sbx.image-ref"] != "r1" {
		t.Errorf("set on another image: %v %v", ok, get())
	}
	if ok, _ := s.SetMetaKey(ctx, sb.ID, api.StateReady, "im_1", "sbx.image-ref", "r2"); ok {
		t.Errorf("set in another state")
	}
	// odd keys name themselves alone
	if _, err := s.SetMetaKey(ctx, sb.ID, "", "", `a"b.c$`, "v"); err != nil {
		t.Fatal(err)
	}
	if m := get(); m["sbx.image-ref"] != "r1" || len(m) != 2 {
		t.Errorf("an odd key: %v", m)
	}
	// removed, asking nothing of the state
	if ok, err := s.SetMetaKey(ctx, sb.ID, "", "", "sbx.image-ref", ""); !ok || err != nil {
		t.Fatal(ok, err)
	}
	if _, ok := get()["sbx.image-ref"]; ok {
		t.Errorf("removed, and still there: %v", get())
	}
}
