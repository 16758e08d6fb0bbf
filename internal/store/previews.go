package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"sbx.dev/sbx/api"
)

// Preview is a port of a sandbox published on the preview proxy.
type Preview struct {
	SandboxID string
	Port      int
	// Private publications answer only requests with a signed token.
	Private   bool
	CreatedAt time.Time
}

// Publish records port of sandbox id as published, private or not. A
// private publication stays private: publishing it again without private
// is api.ErrConflict (withdraw it first). A sandbox that does not exist
// (or no longer does) is api.ErrNotFound. It returns the publication as it
// now is.
func (s *Store) Publish(ctx context.Context, id string, port int, private bool, at time.Time) (*Preview, error) {
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return nil, err
	}
	defer tx.Rollback()
	// in the same transaction as the insert: a sandbox deleted meanwhile
	// leaves no publication behind
	var n int
	if err := tx.QueryRowContext(ctx, `SELECT COUNT(*) FROM sandboxes WHERE id = ?`, id).Scan(&n); err != nil {
		return nil, fmt.Errorf("publish %s port %d: %w", id, port, err)
	}
	if n == 0 {
		return nil, api.Errorf(api.ErrNotFound, "sandbox %s not found", id)
	}
	cur, err := scanPreview(tx.QueryRowContext(ctx, `SELECT `+previewCols+` FROM previews WHERE sandbox_id = ? AND port = ?`, id, port))
	switch {
	case errors.Is(err, sql.ErrNoRows):
		cur = &Preview{SandboxID: id, Port: port, Private: private, CreatedAt: at}
		if _, err := tx.ExecContext(ctx, `INSERT INTO previews (sandbox_id, port, private, created_at) VALUES (?, ?, ?, ?)`,
			id, port, private, at.UnixNano()); err != nil {
			return nil, fmt.Errorf("publish %s port %d: %w", id, port, err)
		}
	case err != nil:
		return nil, fmt.Errorf("publish %s port %d: %w", id, port, err)
	case cur.Private && !private:
		return nil, api.Errorf(api.ErrConflict, "port %d of sandbox %s is published private; ask for a private preview for a URL with a token, or withdraw the port first to publish it to everyone",
			port, id)
	case private && !cur.Private:
		cur.Private = true
		if _, err := tx.ExecContext(ctx, `UPDATE previews SET private = 1 WHERE sandbox_id = ? AND port = ?`, id, port); err != nil {
			return nil, fmt.Errorf("publish %s port %d: %w", id, port, err)
		}
	}
	if err := tx.Commit(); err != nil {
		return nil, fmt.Errorf("publish %s port %d: %w", id, port, err)
	}
	return cur, nil
}

// Unpublish withdraws port of sandbox id; a port not published is
// api.ErrNotFound.
func (s *Store) Unpublish(ctx context.Context, id string, port int) error {
	res, err := s.q.ExecContext(ctx, `DELETE FROM previews WHERE sandbox_id = ? AND port = ?`, id, port)
	if err != nil {
		return fmt.Errorf("withdraw %s port %d: %w", id, port, err)
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return api.Errorf(api.ErrNotFound, "port %d of sandbox %s is not published", port, id)
	}
	return nil
}

// Published returns the publication of port of sandbox id, or
// api.ErrNotFound if there is none.
func (s *Store) Published(ctx context.Context, id string, port int) (*Preview, error) {
	p, err := scanPreview(s.q.QueryRowContext(ctx, `SELECT `+previewCols+` FROM previews WHERE sandbox_id = ? AND port = ?`, id, port))
	if errors.Is(err, sql.ErrNoRows) {
		return nil, api.Errorf(api.ErrNotFound, "port %d of sandbox %s is not published", port, id)
	}
	return p, err
}

// Previews returns the ports published of sandbox id, by port.
func (s *Store) Previews(ctx context.Context, id string) ([]*Preview, error) {
	rows, err := s.q.QueryContext(ctx, `SELECT `+previewCols+` FROM previews WHERE sandbox_id = ? ORDER BY port`, id)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []*Preview
	for rows.Next() {
		p, err := scanPreview(rows)
		if err != nil {
			return nil, err
		}
		out = append(out, p)
	}
	return out, rows.Err()
}

const previewCols = `sandbox_id, port, private, created_at`

func scanPreview(row interface{ Scan(...any) error }) (*Preview, error) {
	var p Preview
	var created int64
	if err := row.Scan(&p.SandboxID, &p.Port, &p.Private, &created); err != nil {
		return nil, err
	}
	p.CreatedAt = time.Unix(0, created)
	return &p, nil
}
