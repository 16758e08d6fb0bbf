package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"time"

	"sbx.dev/sbx/api"
)

// Snapshot is the durable record of a named capture.
type Snapshot struct {
	Name      string
	ID        string // also the id of its image
	SandboxID string
	Template  string
	Memory    bool
	CPUs      float64
	MemLimit  int64
	CreatedAt time.Time
	Size      int64
	Paused    time.Duration
	// Disk is the tar the source's overlay started from: a sandbox made
	// from a memory snapshot must name it again.
	Disk string
	// TemplateVersion is the template version the snapshot holds.
	TemplateVersion string
	// Pids and DiskLimit are the source's limits.
	Pids      int
	DiskLimit int64
	// Network is the network mode of the sandbox it was taken of, which a
	// sandbox made from it keeps.
	Network string
	// Kept marks a snapshot promoted with `sbx snapshot keep`: a freeze so
	// marked is the user's, and outlives its sandbox.
	Kept bool
	// Ref is where the snapshot is in the fleet's registry, once pushed
	// there (a freeze in a fleet); RefPending why it is not yet.
	Ref, RefPending string
}

// CreateSnapshot inserts a snapshot; a taken name is api.ErrConflict. Its
// network mode is its sandbox's (sn.Network is set to it), or, of a
// sandbox this node has not (a snapshot pulled from another), sn.Network.
func (s *Store) CreateSnapshot(ctx context.Context, sn *Snapshot) error {
	err := s.q.QueryRowContext(ctx, `INSERT INTO snapshots (name, id, sandbox_id, template, memory, cpus, mem_limit, created_at, size, paused_ns, disk, template_version, pids, disk_limit, network)
		VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, COALESCE((SELECT network FROM sandboxes WHERE id = ?), ?)) RETURNING network`,
		sn.Name, sn.ID, sn.SandboxID, sn.Template, sn.Memory, sn.CPUs, sn.MemLimit, sn.CreatedAt.UnixNano(), sn.Size, int64(sn.Paused), sn.Disk, sn.TemplateVersion, sn.Pids, sn.DiskLimit, sn.SandboxID, sn.Network).Scan(&sn.Network)
	if err != nil && strings.Contains(err.Error(), "UNIQUE constraint failed: snapshots.name") {
		return api.Errorf(api.ErrConflict, "snapshot name %q is taken", sn.Name)
	}
	if err != nil {
		return fmt.Errorf("store snapshot %s: %w", sn.Name, err)
	}
	return nil
}

// SnapshotNameTaken reports whether a snapshot has this name.
func (s *Store) SnapshotNameTaken(ctx context.Context, name string) (bool, error) {
	var n int
	err := s.q.QueryRowContext(ctx, `SELECT COUNT(*) FROM snapshots WHERE name = ?`, name).Scan(&n)
	return n > 0, err
}

const snapshotCols = `name, id, sandbox_id, template, memory, cpus, mem_limit, created_at, size, paused_ns, disk, template_version, pids, disk_limit, network, kept, ref, ref_pending`

func scanSnapshot(row interface{ Scan(...any) error }) (*Snapshot, error) {
	var sn Snapshot
	var created, paused int64
	if err := row.Scan(&sn.Name, &sn.ID, &sn.SandboxID, &sn.Template, &sn.Memory, &sn.CPUs, &sn.MemLimit, &created, &sn.Size, &paused, &sn.Disk, &sn.TemplateVersion, &sn.Pids, &sn.DiskLimit, &sn.Network, &sn.Kept, &sn.Ref, &sn.RefPending); err != nil {
		return nil, err
	}
	sn.CreatedAt = time.Unix(0, created)
	sn.Paused = time.Duration(paused)
	return &sn, nil
}

// Snapshot returns the snapshot called name (api.ErrNotFound if none).
func (s *Store) Snapshot(ctx context.Context, name string) (*Snapshot, error) {
	sn, err := scanSnapshot(s.q.QueryRowContext(ctx, `SELECT `+snapshotCols+` FROM snapshots WHERE name = ?`, name))
	if errors.Is(err, sql.ErrNoRows) {
		return nil, api.Errorf(api.ErrNotFound, "snapshot %s not found", name)
	}
	return sn, err
}

// Snapshots returns every snapshot, or those of one sandbox, oldest first.
func (s *Store) Snapshots(ctx context.Context, sandboxID string) ([]*Snapshot, error) {
	q, args := `SELECT `+snapshotCols+` FROM snapshots ORDER BY created_at`, []any{}
	if sandboxID != "" {
		q, args = `SELECT `+snapshotCols+` FROM snapshots WHERE sandbox_id = ? ORDER BY created_at`, []any{sandboxID}
	}
	rows, err := s.q.QueryContext(ctx, q, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []*Snapshot
	for rows.Next() {
		sn, err := scanSnapshot(rows)
		if err != nil {
			return nil, err
		}
		out = append(out, sn)
	}
	return out, rows.Err()
}

// KeepSnapshot marks snapshot name kept (api.ErrNotFound if none).
func (s *Store) KeepSnapshot(ctx context.Context, name string) error {
	res, err := s.q.ExecContext(ctx, `UPDATE snapshots SET kept = 1 WHERE name = ?`, name)
	if err != nil {
		return fmt.Errorf("keep snapshot %s: %w", name, err)
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return api.Errorf(api.ErrNotFound, "snapshot %s not found", name)
	}
	return nil
}

// SetSnapshotRef records where snapshot name, of image id, went in the
// fleet's registry (ref), or why not yet (pending); false if no snapshot
// of that name holds that image (deleted, or taken again under its name).
func (s *Store) SetSnapshotRef(ctx context.Context, name, id, ref, pending string) (bool, error) {
	res, err := s.q.ExecContext(ctx, `UPDATE snapshots SET ref = ?, ref_pending = ? WHERE name = ? AND id = ?`, ref, pending, name, id)
	if err != nil {
		return false, fmt.Errorf("record snapshot %s's ref: %w", name, err)
	}
	n, _ := res.RowsAffected()
	if n > 0 {
		s.changed() // the fleet's agent mirrors it at once
	}
	return n > 0, nil
}

// DeleteSnapshot removes a snapshot's record.
func (s *Store) DeleteSnapshot(ctx context.Context, name string) error {
	_, err := s.q.ExecContext(ctx, `DELETE FROM snapshots WHERE name = ?`, name)
	return err
}

// Image is the record of a capture on disk that no snapshot owns: a stop's
// hibernation image. Once its sandbox is gone it is an orphan, swept after
// a grace period.
type Image struct {
	ID         string
	SandboxID  string
	Kind       string
	CreatedAt  time.Time
	OrphanedAt time.Time // zero while its sandbox exists
	// RetireAt is when a retired image may go (zero: not retired): runsc
	// may read a restored image until then.
	RetireAt time.Time
}

// AddImage records an image.
func (s *Store) AddImage(ctx context.Context, im *Image) error {
	_, err := s.q.ExecContext(ctx, `INSERT INTO images (id, sandbox_id, kind, created_at) VALUES (?, ?, ?, ?)`,
		im.ID, im.SandboxID, im.Kind, im.CreatedAt.UnixNano())
	return err
}

// OrphanImages marks every image of a sandbox an orphan as of now.
func (s *Store) OrphanImages(ctx context.Context, sandboxID string, now time.Time) error {
	_, err := s.q.ExecContext(ctx, `UPDATE images SET orphaned_at = ? WHERE sandbox_id = ? AND orphaned_at IS NULL`, now.UnixNano(), sandboxID)
	return err
}

// RetireImage marks one image an orphan as of now, to be removed at at
// (a sweep after a restart of sbxd still knows when).
func (s *Store) RetireImage(ctx context.Context, id string, now, at time.Time) error {
	_, err := s.q.ExecContext(ctx, `UPDATE images SET orphaned_at = COALESCE(orphaned_at, ?), retire_at = ? WHERE id = ?`, now.UnixNano(), at.UnixNano(), id)
	return err
}

// DeleteImage removes an image's record.
func (s *Store) DeleteImage(ctx context.Context, id string) error {
	_, err := s.q.ExecContext(ctx, `DELETE FROM images WHERE id = ?`, id)
	return err
}

// ImagesDue returns the images to remove at now: those whose retire time
// has passed, and those orphaned before now-grace; never one a sandbox
// still loads its memory from (SetPagesImage).
func (s *Store) ImagesDue(ctx context.Context, now time.Time, grace time.Duration) ([]*Image, error) {
	rows, err := s.q.QueryContext(ctx, `SELECT id, sandbox_id, kind, created_at, orphaned_at FROM images
		WHERE orphaned_at IS NOT NULL AND (orphaned_at < ? OR (retire_at IS NOT NULL AND retire_at <= ?))
		AND id NOT IN (SELECT pages_image FROM sandboxes WHERE pages_image != '')`,
		now.Add(-grace).UnixNano(), now.UnixNano())
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []*Image
	for rows.Next() {
		var im Image
		var created, orphaned int64
		if err := rows.Scan(&im.ID, &im.SandboxID, &im.Kind, &created, &orphaned); err != nil {
			return nil, err
		}
		im.CreatedAt, im.OrphanedAt = time.Unix(0, created), time.Unix(0, orphaned)
		out = append(out, &im)
	}
	return out, rows.Err()
}

// TemplateVersionHeld reports whether a sandbox or a snapshot holds version.
func (s *Store) TemplateVersionHeld(ctx context.Context, version string) (bool, error) {
	var n int
	err := s.q.QueryRowContext(ctx, `SELECT (SELECT COUNT(*) FROM sandboxes WHERE template_version = ?) + (SELECT COUNT(*) FROM snapshots WHERE template_version = ?)`, version, version).Scan(&n)
	return n > 0, err
}

// TemplateVersionsInUse returns the template versions that a sandbox or a
// snapshot holds, with the ids and names of the holders.
func (s *Store) TemplateVersionsInUse(ctx context.Context) (map[string][]string, error) {
	rows, err := s.q.QueryContext(ctx, `SELECT template_version, 'sandbox ' || COALESCE(name, id) FROM sandboxes WHERE template_version != ''
		UNION ALL SELECT template_version, 'snapshot ' || name FROM snapshots WHERE template_version != ''`)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := map[string][]string{}
	for rows.Next() {
		var v, holder string
		if err := rows.Scan(&v, &holder); err != nil {
			return nil, err
		}
		out[v] = append(out[v], holder)
	}
	return out, rows.Err()
}

// Images returns every image record.
func (s *Store) Images(ctx context.Context) ([]*Image, error) {
	rows, err := s.q.QueryContext(ctx, `SELECT id, sandbox_id, kind, created_at, orphaned_at, retire_at FROM images`)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []*Image
	for rows.Next() {
		var im Image
		var created int64
		var orphaned, retire sql.NullInt64
		if err := rows.Scan(&im.ID, &im.SandboxID, &im.Kind, &created, &orphaned, &retire); err != nil {
			return nil, err
		}
		im.CreatedAt = time.Unix(0, created)
		if orphaned.Valid {
			im.OrphanedAt = time.Unix(0, orphaned.Int64)
		}
		if retire.Valid {
			im.RetireAt = time.Unix(0, retire.Int64)
		}
		out = append(out, &im)
	}
	return out, rows.Err()
}
