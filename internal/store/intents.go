package store

import (
	"context"
	"encoding/json"
	"fmt"
	"time"
)

// Intent is a journaled capture: what was being done to which sandbox, with
// which image, and the last step reached.
type Intent struct {
	ID        string // the image the capture writes
	Kind      string // "stop", "snapshot", "fork", "resume" or "delete"
	SandboxID string
	Step      string
	Detail    map[string]any
	StartedAt time.Time
	UpdatedAt time.Time
}

// AddIntent journals a capture before it starts.
func (s *Store) AddIntent(ctx context.Context, in *Intent) error {
	d, _ := json.Marshal(in.Detail)
	_, err := s.q.ExecContext(ctx, `INSERT INTO intents (id, kind, sandbox_id, step, detail, started_at, updated_at) VALUES (?, ?, ?, ?, ?, ?, ?)`,
		in.ID, in.Kind, in.SandboxID, in.Step, string(d), in.StartedAt.UnixNano(), in.StartedAt.UnixNano())
	if err != nil {
		return fmt.Errorf("journal %s of %s: %w", in.Kind, in.SandboxID, err)
	}
	return nil
}

// StepIntent records the step a capture has reached.
func (s *Store) StepIntent(ctx context.Context, id, step string, at time.Time) error {
	_, err := s.q.ExecContext(ctx, `UPDATE intents SET step = ?, updated_at = ? WHERE id = ?`, step, at.UnixNano(), id)
	if err != nil {
		return fmt.Errorf("journal step %s of %s: %w", step, id, err)
	}
	return nil
}

// DeleteIntent closes a capture's journal entry.
func (s *Store) DeleteIntent(ctx context.Context, id string) error {
	_, err := s.q.ExecContext(ctx, `DELETE FROM intents WHERE id = ?`, id)
	return err
}

// Intents returns the journaled captures, oldest first.
func (s *Store) Intents(ctx context.Context) ([]*Intent, error) {
	rows, err := s.q.QueryContext(ctx, `SELECT id, kind, sandbox_id, step, detail, started_at, updated_at FROM intents ORDER BY started_at`)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []*Intent
	for rows.Next() {
		var in Intent
		var d string
		var started, updated int64
		if err := rows.Scan(&in.ID, &in.Kind, &in.SandboxID, &in.Step, &d, &started, &updated); err != nil {
			return nil, err
		}
		_ = json.Unmarshal([]byte(d), &in.Detail)
		in.StartedAt, in.UpdatedAt = time.Unix(0, started), time.Unix(0, updated)
		out = append(out, &in)
	}
	return out, rows.Err()
}

// SetIntentDetail replaces a journal entry's detail.
func (s *Store) SetIntentDetail(ctx context.Context, id string, detail map[string]any) error {
	d, err := json.Marshal(detail)
	if err != nil {
		return fmt.Errorf("journal detail of %s: %w", id, err)
	}
	if _, err := s.q.ExecContext(ctx, `UPDATE intents SET detail = ? WHERE id = ?`, string(d), id); err != nil {
		return fmt.Errorf("journal detail of %s: %w", id, err)
	}
	return nil
}
