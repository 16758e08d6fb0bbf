package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"sbx.dev/sbx/api"
)

// TestKeptMigration: a snapshot taken under an older sbxd (schema 9) is
// kept once the database is opened by this one: it was taken under the
// promise that a snapshot outlives its sandbox. A new one is not, until
// KeepSnapshot; keeping an unknown name is not found.
func TestKeptMigration(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "state.db")
	db, err := sql.Open("sqlite", "file:"+path)
	if err != nil {
		t.Fatal(err)
	}
	for v, m := range migrations[:9] {
		if _, err := db.Exec(m); err != nil {
			t.Fatalf("schema %d: %v", v+1, err)
		}
	}
	if _, err := db.Exec(fmt.Sprintf(`PRAGMA user_version = 9; INSERT INTO snapshots (name, id, sandbox_id, template, memory, created_at) VALUES ('freeze-old-abcd', 'im_aaaaaaaaaa', 'sb_gone', 'tiny', 1, %d)`, time.Now().UnixNano())); err != nil {
		t.Fatal(err)
	}
	db.Close()
	s, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	old, err := s.Snapshot(ctx, "freeze-old-abcd")
	if err != nil || !old.Kept {
		t.Errorf("a snapshot of schema 9 after the migration: %+v %v, want kept", old, err)
	}
	sn := &Snapshot{Name: "freeze-new-abcd", ID: "im_bbbbbbbbbb", SandboxID: "sb_x", Template: "tiny", Memory: true, CreatedAt: time.Now()}
	if err := s.CreateSnapshot(ctx, sn); err != nil {
		t.Fatal(err)
	}
	if got, _ := s.Snapshot(ctx, sn.Name); got.Kept {
		t.Errorf("a new snapshot is kept before KeepSnapshot")
	}
	if err := s.KeepSnapshot(ctx, sn.Name); err != nil {
		t.Fatal(err)
	}
	if got, _ := s.Snapshot(ctx, sn.Name); !got.Kept {
		t.Errorf("a snapshot after KeepSnapshot is not kept")
	}
	if err := s.KeepSnapshot(ctx, "nosuch"); !errors.Is(err, api.ErrNotFound) {
		t.Errorf("KeepSnapshot(nosuch): %v, want not found", err)
	}
}
