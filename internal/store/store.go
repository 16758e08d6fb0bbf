// Package store keeps sbxd's durable state in SQLite (WAL): sandboxes, execs and events.
package store

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	_ "modernc.org/sqlite" // the SQLite driver, pure Go

	"sbx.dev/sbx/api"
)

// Store is the daemon's database.
type Store struct {
	db *sql.DB
}

// migrations bring a database from user_version i to i+1; a database is
// never opened by an sbx that does not know its version.
var migrations = []string{schemaV1, schemaV2, schemaV3, schemaV4, schemaV5, schemaV6, schemaV7, schemaV8}

const schemaV1 = `
CREATE TABLE IF NOT EXISTS sandboxes (
	id            TEXT PRIMARY KEY,
	name          TEXT UNIQUE,
	template      TEXT NOT NULL,
	state         TEXT NOT NULL,
	reason        TEXT NOT NULL DEFAULT '',
	created_at    INTEGER NOT NULL,
	ttl_ns        INTEGER NOT NULL DEFAULT 0,
	meta          TEXT NOT NULL DEFAULT '{}',
	cpus          REAL NOT NULL DEFAULT 0,
	memory        INTEGER NOT NULL DEFAULT 0,
	last_activity INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS execs (
	id          TEXT PRIMARY KEY,
	sandbox_id  TEXT NOT NULL,
	cmd         TEXT NOT NULL,
	state       TEXT NOT NULL,
	pid         INTEGER NOT NULL DEFAULT 0,
	exit_code   INTEGER,
	timed_out   INTEGER NOT NULL DEFAULT 0,
	started_at  INTEGER NOT NULL,
	ended_at    INTEGER
);
CREATE INDEX IF NOT EXISTS execs_sandbox ON execs(sandbox_id, started_at);
CREATE TABLE IF NOT EXISTS events (
	seq         INTEGER PRIMARY KEY AUTOINCREMENT,
	sandbox_id  TEXT NOT NULL,
	time        INTEGER NOT NULL,
	type        TEXT NOT NULL,
	detail      TEXT NOT NULL DEFAULT '{}'
);
CREATE INDEX IF NOT EXISTS events_sandbox ON events(sandbox_id, seq);
`

// schemaV8 records each sandbox's (and snapshot's) network mode, and the
// ports published on the preview proxy: the only ones it serves.
const schemaV8 = `
ALTER TABLE sandboxes ADD COLUMN network TEXT NOT NULL DEFAULT '';
ALTER TABLE snapshots ADD COLUMN network TEXT NOT NULL DEFAULT '';
CREATE TABLE previews (
	sandbox_id  TEXT NOT NULL,
	port        INTEGER NOT NULL,
	private     INTEGER NOT NULL DEFAULT 0,
	created_at  INTEGER NOT NULL,
	PRIMARY KEY (sandbox_id, port)
);
`

// schemaV7 names the live state "ready", the word sbx users already know.
const schemaV7 = `
UPDATE sandboxes SET state = 'ready' WHERE state = 'running';
`

// schemaV6 records the disk a sandbox (or a memory snapshot) boots on: the
// tar its overlay starts from, which a memory restore must name again.
const schemaV6 = `
ALTER TABLE sandboxes ADD COLUMN disk TEXT NOT NULL DEFAULT '';
ALTER TABLE snapshots ADD COLUMN disk TEXT NOT NULL DEFAULT '';
`

// schemaV5 adds persistence (exemption from the idle reaper).
const schemaV5 = `
ALTER TABLE sandboxes ADD COLUMN persistent INTEGER NOT NULL DEFAULT 0;
`

// schemaV4 is the capture journal: the intent of every capture, written
// before it starts and updated at each step, so that a restarted sbxd can
// tell what was happening.
const schemaV4 = `
CREATE TABLE intents (
	id          TEXT PRIMARY KEY,
	kind        TEXT NOT NULL,
	sandbox_id  TEXT NOT NULL,
	step        TEXT NOT NULL,
	detail      TEXT NOT NULL DEFAULT '{}',
	started_at  INTEGER NOT NULL,
	updated_at  INTEGER NOT NULL
);
`

// schemaV3 marks the execs started by the sandbox's init (detached ones),
// which live on through stops, resumes and memory captures.
const schemaV3 = `
ALTER TABLE execs ADD COLUMN detached INTEGER NOT NULL DEFAULT 0;
`

// schemaV2 adds captures: where a sandbox came from, whether its memory was
// carried over, its hibernation image; snapshots; and the images on disk.
const schemaV2 = `
ALTER TABLE sandboxes ADD COLUMN source TEXT NOT NULL DEFAULT '';
ALTER TABLE sandboxes ADD COLUMN parent TEXT NOT NULL DEFAULT '';
ALTER TABLE sandboxes ADD COLUMN memory_restored INTEGER NOT NULL DEFAULT 0;
ALTER TABLE sandboxes ADD COLUMN resume_reason TEXT NOT NULL DEFAULT '';
ALTER TABLE sandboxes ADD COLUMN image TEXT NOT NULL DEFAULT '';
CREATE TABLE snapshots (
	name        TEXT PRIMARY KEY,
	id          TEXT NOT NULL UNIQUE,
	sandbox_id  TEXT NOT NULL,
	template    TEXT NOT NULL,
	memory      INTEGER NOT NULL,
	cpus        REAL NOT NULL DEFAULT 0,
	mem_limit   INTEGER NOT NULL DEFAULT 0,
	created_at  INTEGER NOT NULL,
	size        INTEGER NOT NULL DEFAULT 0,
	paused_ns   INTEGER NOT NULL DEFAULT 0
);
CREATE TABLE images (
	id          TEXT PRIMARY KEY,
	sandbox_id  TEXT NOT NULL,
	kind        TEXT NOT NULL,
	created_at  INTEGER NOT NULL,
	orphaned_at INTEGER
);
`

// Open opens (creating if needed) the database at path.
func Open(path string) (*Store, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return nil, fmt.Errorf("open store: %w", err)
	}
	dsn := "file:" + path + "?_pragma=journal_mode(WAL)&_pragma=synchronous(FULL)&_pragma=busy_timeout(5000)&_pragma=foreign_keys(1)"
	db, err := sql.Open("sqlite", dsn)
	if err != nil {
		return nil, fmt.Errorf("open store %s: %w", path, err)
	}
	// One writer: SQLite serializes writes anyway, and one connection keeps
	// the pragmas and avoids SQLITE_BUSY between our own connections.
	db.SetMaxOpenConns(1)
	if err := migrate(db); err != nil {
		db.Close()
		return nil, fmt.Errorf("open store %s: %w", path, err)
	}
	return &Store{db: db}, nil
}

// migrate applies the migrations the database lacks, each in a transaction
// with its new user_version.
func migrate(db *sql.DB) error {
	var v int
	if err := db.QueryRow(`PRAGMA user_version`).Scan(&v); err != nil {
		return err
	}
	if v > len(migrations) {
		return fmt.Errorf("database schema version %d is newer than this sbxd knows (%d); use a newer sbxd", v, len(migrations))
	}
	for ; v < len(migrations); v++ {
		tx, err := db.Begin()
		if err != nil {
			return err
		}
		if _, err := tx.Exec(migrations[v]); err != nil {
			tx.Rollback()
			return fmt.Errorf("schema version %d: %w", v+1, err)
		}
		if _, err := tx.Exec(fmt.Sprintf(`PRAGMA user_version = %d`, v+1)); err != nil {
			tx.Rollback()
			return err
		}
		if err := tx.Commit(); err != nil {
			return err
		}
	}
	return nil
}

// Close closes the database.
func (s *Store) Close() error { return s.db.Close() }

// Sandbox is the durable record of one sandbox.
type Sandbox struct {
	ID           string
	Name         string
	Template     string
	State        api.State
	Reason       string
	CreatedAt    time.Time
	TTL          time.Duration
	Meta         map[string]string
	CPUs         float64
	Memory       int64
	LastActivity time.Time
	// Source is the snapshot it was made from; Parent the sandbox it was forked from.
	Source         string
	Parent         string
	MemoryRestored bool
	ResumeReason   string
	// Image is the hibernation image of a stopped sandbox.
	Image string
	// Persistent sandboxes are exempt from the idle reaper.
	Persistent bool
	// Disk is the tar its root overlay started from ("": the bare template).
	Disk string
	// Network is "" (NAT egress) or "none" (loopback only).
	Network string
}

func nullable(s string) any {
	if s == "" {
		return nil
	}
	return s
}

// CreateSandbox inserts sb; a taken name is api.ErrConflict.
func (s *Store) CreateSandbox(ctx context.Context, sb *Sandbox) error {
	meta, _ := json.Marshal(sb.Meta)
	_, err := s.db.ExecContext(ctx, `INSERT INTO sandboxes
		(id, name, template, state, reason, created_at, ttl_ns, meta, cpus, memory, last_activity, source, parent, memory_restored, resume_reason, image, disk, network)
		VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`,
		sb.ID, nullable(sb.Name), sb.Template, string(sb.State), sb.Reason, sb.CreatedAt.UnixNano(),
		int64(sb.TTL), string(meta), sb.CPUs, sb.Memory, sb.LastActivity.UnixNano(),
		sb.Source, sb.Parent, sb.MemoryRestored, sb.ResumeReason, sb.Image, sb.Disk, sb.Network)
	if err != nil && strings.Contains(err.Error(), "UNIQUE constraint failed: sandboxes.name") {
		return api.Errorf(api.ErrConflict, "name %q is taken", sb.Name)
	}
	if err != nil {
		return fmt.Errorf("store sandbox %s: %w", sb.ID, err)
	}
	return nil
}

// SetState records a sandbox's state and the reason for it.
func (s *Store) SetState(ctx context.Context, id string, state api.State, reason string) error {
	_, err := s.db.ExecContext(ctx, `UPDATE sandboxes SET state = ?, reason = ? WHERE id = ?`, string(state), reason, id)
	if err != nil {
		return fmt.Errorf("store state of %s: %w", id, err)
	}
	return nil
}

// SetRuntime records how a sandbox (re)started and its hibernation image:
// after a restore, a resume, or a stop.
func (s *Store) SetRuntime(ctx context.Context, id string, state api.State, memoryRestored bool, resumeReason, image string) error {
	_, err := s.db.ExecContext(ctx, `UPDATE sandboxes SET state = ?, reason = '', memory_restored = ?, resume_reason = ?, image = ? WHERE id = ?`,
		string(state), memoryRestored, resumeReason, image, id)
	if err != nil {
		return fmt.Errorf("store state of %s: %w", id, err)
	}
	return nil
}

// SetDisk records the tar a sandbox's overlay starts from.
func (s *Store) SetDisk(ctx context.Context, id, disk string) error {
	_, err := s.db.ExecContext(ctx, `UPDATE sandboxes SET disk = ? WHERE id = ?`, disk, id)
	return err
}

// DiskInUse reports whether a sandbox or a snapshot still boots on disk.
func (s *Store) DiskInUse(ctx context.Context, disk string) (bool, error) {
	var n int
	err := s.db.QueryRowContext(ctx, `SELECT (SELECT COUNT(*) FROM sandboxes WHERE disk = ?) + (SELECT COUNT(*) FROM snapshots WHERE disk = ?)`, disk, disk).Scan(&n)
	return n > 0, err
}

// SetTTL records a sandbox's idle ttl.
func (s *Store) SetTTL(ctx context.Context, id string, ttl time.Duration) error {
	_, err := s.db.ExecContext(ctx, `UPDATE sandboxes SET ttl_ns = ? WHERE id = ?`, int64(ttl), id)
	return err
}

// SetPersistent records whether a sandbox is exempt from the idle reaper.
func (s *Store) SetPersistent(ctx context.Context, id string, persistent bool) error {
	_, err := s.db.ExecContext(ctx, `UPDATE sandboxes SET persistent = ? WHERE id = ?`, persistent, id)
	return err
}

// Touch records activity on a sandbox.
func (s *Store) Touch(ctx context.Context, id string, at time.Time) error {
	_, err := s.db.ExecContext(ctx, `UPDATE sandboxes SET last_activity = ? WHERE id = ? AND last_activity < ?`, at.UnixNano(), id, at.UnixNano())
	return err
}

// DeleteSandbox removes a sandbox and its execs. Its events stay.
func (s *Store) DeleteSandbox(ctx context.Context, id string) error {
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback()
	if _, err := tx.ExecContext(ctx, `DELETE FROM execs WHERE sandbox_id = ?`, id); err != nil {
		return fmt.Errorf("delete sandbox %s: %w", id, err)
	}
	if _, err := tx.ExecContext(ctx, `DELETE FROM previews WHERE sandbox_id = ?`, id); err != nil {
		return fmt.Errorf("delete sandbox %s: %w", id, err)
	}
	if _, err := tx.ExecContext(ctx, `DELETE FROM sandboxes WHERE id = ?`, id); err != nil {
		return fmt.Errorf("delete sandbox %s: %w", id, err)
	}
	return tx.Commit()
}

const sandboxCols = `id, COALESCE(name, ''), template, state, reason, created_at, ttl_ns, meta, cpus, memory, last_activity, source, parent, memory_restored, resume_reason, image, persistent, disk, network`

func scanSandbox(row interface{ Scan(...any) error }) (*Sandbox, error) {
	var sb Sandbox
	var state, meta string
	var created, ttl, last int64
	if err := row.Scan(&sb.ID, &sb.Name, &sb.Template, &state, &sb.Reason, &created, &ttl, &meta, &sb.CPUs, &sb.Memory, &last,
		&sb.Source, &sb.Parent, &sb.MemoryRestored, &sb.ResumeReason, &sb.Image, &sb.Persistent, &sb.Disk, &sb.Network); err != nil {
		return nil, err
	}
	sb.State = api.State(state)
	sb.CreatedAt = time.Unix(0, created)
	sb.TTL = time.Duration(ttl)
	sb.LastActivity = time.Unix(0, last)
	if err := json.Unmarshal([]byte(meta), &sb.Meta); err != nil {
		return nil, fmt.Errorf("sandbox %s: meta: %w", sb.ID, err)
	}
	return &sb, nil
}

// Sandbox returns the sandbox whose id or name is ref (api.ErrNotFound if none).
func (s *Store) Sandbox(ctx context.Context, ref string) (*Sandbox, error) {
	row := s.db.QueryRowContext(ctx, `SELECT `+sandboxCols+` FROM sandboxes WHERE id = ? OR name = ?`, ref, ref)
	sb, err := scanSandbox(row)
	if errors.Is(err, sql.ErrNoRows) {
		return nil, api.Errorf(api.ErrNotFound, "sandbox %s not found", ref)
	}
	return sb, err
}

// Sandboxes returns every sandbox, oldest first.
func (s *Store) Sandboxes(ctx context.Context) ([]*Sandbox, error) {
	rows, err := s.db.QueryContext(ctx, `SELECT `+sandboxCols+` FROM sandboxes ORDER BY created_at`)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []*Sandbox
	for rows.Next() {
		sb, err := scanSandbox(rows)
		if err != nil {
			return nil, err
		}
		out = append(out, sb)
	}
	return out, rows.Err()
}

// CreateExec records a started exec and, in the same transaction, the
// sandbox's activity at the given time.
func (s *Store) CreateExec(ctx context.Context, e *api.Exec, activity time.Time) error {
	cmd, _ := json.Marshal(e.Cmd)
	return s.withActivity(ctx, e.SandboxID, activity, func(tx *sql.Tx) error {
		_, err := tx.ExecContext(ctx, `INSERT INTO execs (id, sandbox_id, cmd, state, pid, started_at, detached) VALUES (?, ?, ?, ?, ?, ?, ?)`,
			e.ID, e.SandboxID, string(cmd), string(e.State), e.Pid, e.StartedAt.UnixNano(), e.Detached)
		if err != nil {
			return fmt.Errorf("store exec %s: %w", e.ID, err)
		}
		return nil
	})
}

// withActivity runs fn and records activity on a sandbox in one transaction
// (one sync of the log instead of two).
func (s *Store) withActivity(ctx context.Context, sandboxID string, at time.Time, fn func(*sql.Tx) error) error {
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback()
	if err := fn(tx); err != nil {
		return err
	}
	if _, err := tx.ExecContext(ctx, `UPDATE sandboxes SET last_activity = ? WHERE id = ? AND last_activity < ?`, at.UnixNano(), sandboxID, at.UnixNano()); err != nil {
		return err
	}
	return tx.Commit()
}

// UpdateExec records an exec's pid, state and, once it ended, its exit,
// with the sandbox's activity at the given time.
func (s *Store) UpdateExec(ctx context.Context, e *api.Exec, activity time.Time) error {
	var ended any
	if e.EndedAt != nil {
		ended = e.EndedAt.UnixNano()
	}
	var code any
	if e.ExitCode != nil {
		code = *e.ExitCode
	}
	return s.withActivity(ctx, e.SandboxID, activity, func(tx *sql.Tx) error {
		_, err := tx.ExecContext(ctx, `UPDATE execs SET state = ?, pid = ?, exit_code = ?, timed_out = ?, ended_at = ? WHERE id = ?`,
			string(e.State), e.Pid, code, e.TimedOut, ended, e.ID)
		if err != nil {
			return fmt.Errorf("store exec %s: %w", e.ID, err)
		}
		return nil
	})
}

const execCols = `id, sandbox_id, cmd, state, pid, exit_code, timed_out, started_at, ended_at, detached`

func scanExec(row interface{ Scan(...any) error }) (*api.Exec, error) {
	var e api.Exec
	var cmd, state string
	var code, ended sql.NullInt64
	var started int64
	if err := row.Scan(&e.ID, &e.SandboxID, &cmd, &state, &e.Pid, &code, &e.TimedOut, &started, &ended, &e.Detached); err != nil {
		return nil, err
	}
	e.State = api.ExecState(state)
	if err := json.Unmarshal([]byte(cmd), &e.Cmd); err != nil {
		return nil, fmt.Errorf("exec %s: cmd: %w", e.ID, err)
	}
	if code.Valid {
		c := int(code.Int64)
		e.ExitCode = &c
	}
	e.StartedAt = time.Unix(0, started)
	if ended.Valid {
		t := time.Unix(0, ended.Int64)
		e.EndedAt = &t
	}
	return &e, nil
}

// Exec returns one exec of a sandbox (api.ErrNotFound if none).
func (s *Store) Exec(ctx context.Context, sandboxID, execID string) (*api.Exec, error) {
	row := s.db.QueryRowContext(ctx, `SELECT `+execCols+` FROM execs WHERE sandbox_id = ? AND id = ?`, sandboxID, execID)
	e, err := scanExec(row)
	if errors.Is(err, sql.ErrNoRows) {
		return nil, api.Errorf(api.ErrNotFound, "exec %s not found in sandbox %s", execID, sandboxID)
	}
	return e, err
}

// Execs returns a sandbox's execs, oldest first; with sandboxID "" every
// exec still recorded as running.
func (s *Store) Execs(ctx context.Context, sandboxID string) ([]*api.Exec, error) {
	q, arg := `SELECT `+execCols+` FROM execs WHERE sandbox_id = ? ORDER BY started_at`, any(sandboxID)
	if sandboxID == "" {
		q, arg = `SELECT `+execCols+` FROM execs WHERE state = ? ORDER BY started_at`, string(api.ExecRunning)
	}
	rows, err := s.db.QueryContext(ctx, q, arg)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []*api.Exec
	for rows.Next() {
		e, err := scanExec(rows)
		if err != nil {
			return nil, err
		}
		out = append(out, e)
	}
	return out, rows.Err()
}

// AddEvent appends an event.
func (s *Store) AddEvent(ctx context.Context, sandboxID, typ string, detail map[string]any) error {
	d, _ := json.Marshal(detail)
	_, err := s.db.ExecContext(ctx, `INSERT INTO events (sandbox_id, time, type, detail) VALUES (?, ?, ?, ?)`,
		sandboxID, time.Now().UnixNano(), typ, string(d))
	return err
}

// Events returns a sandbox's events after seq.
func (s *Store) Events(ctx context.Context, sandboxID string, after int64) ([]api.Event, error) {
	rows, err := s.db.QueryContext(ctx, `SELECT seq, sandbox_id, time, type, detail FROM events WHERE sandbox_id = ? AND seq > ? ORDER BY seq`, sandboxID, after)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []api.Event
	for rows.Next() {
		var e api.Event
		var t int64
		var d string
		if err := rows.Scan(&e.Seq, &e.SandboxID, &t, &e.Type, &d); err != nil {
			return nil, err
		}
		e.Time = time.Unix(0, t)
		_ = json.Unmarshal([]byte(d), &e.Detail)
		out = append(out, e)
	}
	return out, rows.Err()
}
