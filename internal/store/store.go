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
	"slices"
	"strings"
	"time"

	_ "modernc.org/sqlite" // the SQLite driver, pure Go

	"sbx.dev/sbx/api"
)

// Store is the daemon's database. Inside Update it is bound to one
// transaction, and every method runs in it.
type Store struct {
	db  *sql.DB // nil inside a transaction
	q   querier
	res *reserve

	feed  *feed // shared by the store and its transactions
	wrote bool  // inside a transaction: it recorded an event
}

// querier is what *sql.DB and *sql.Tx share.
type querier interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
}

// Update runs fn in one transaction: everything fn does through tx is
// committed together when it returns nil, and nothing when it fails.
// Inside a transaction, Update runs fn in the same one.
func (s *Store) Update(ctx context.Context, fn func(tx *Store) error) error {
	if s.db == nil {
		return fn(s)
	}
	err := s.update(ctx, fn)
	if IsFull(err) && s.res != nil && s.res.release() {
		err = s.update(ctx, fn)
	}
	return err
}

func (s *Store) update(ctx context.Context, fn func(tx *Store) error) error {
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("store: begin: %w", err)
	}
	defer tx.Rollback()
	t := &Store{q: tx, feed: s.feed}
	if err := fn(t); err != nil {
		return err
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("store: commit: %w", err)
	}
	if t.wrote { // only once it is committed can a reader see it
		s.feed.Notify()
	}
	return nil
}

// migrations bring a database from user_version i to i+1; a database is
// never opened by an sbx that does not know its version.
var migrations = []string{schemaV1, schemaV2, schemaV3, schemaV4, schemaV5, schemaV6, schemaV7, schemaV8, schemaV9, schemaV10, schemaV11, schemaV12, schemaV13}

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

// schemaV8 records what holds what: the template version a sandbox or a
// snapshot was made on (kept for as long as it lives), a sandbox's limits,
// and when a resumed sandbox's old image may go.
const schemaV8 = `
ALTER TABLE sandboxes ADD COLUMN template_version TEXT NOT NULL DEFAULT '';
ALTER TABLE sandboxes ADD COLUMN pids INTEGER NOT NULL DEFAULT 0;
ALTER TABLE sandboxes ADD COLUMN disk_limit INTEGER NOT NULL DEFAULT 0;
ALTER TABLE snapshots ADD COLUMN template_version TEXT NOT NULL DEFAULT '';
ALTER TABLE snapshots ADD COLUMN pids INTEGER NOT NULL DEFAULT 0;
ALTER TABLE snapshots ADD COLUMN disk_limit INTEGER NOT NULL DEFAULT 0;
ALTER TABLE images ADD COLUMN retire_at INTEGER;
`

// schemaV13 records the image a sandbox's memory is loaded from on demand
// (a memory fork's): runsc reads it for the sandbox's life, so it is kept
// while any sandbox names it.
const schemaV13 = `
ALTER TABLE sandboxes ADD COLUMN pages_image TEXT NOT NULL DEFAULT '';
`

// schemaV11 records how a sandbox's traffic is shaped (explain's network
// knob): the delay of each packet leaving it, and the share dropped.
// schemaV12 records, in a fleet, where a snapshot went in the fleet's
// registry (a freeze is pushed there in the background), or why it did
// not yet.
const schemaV12 = `
ALTER TABLE snapshots ADD COLUMN ref TEXT NOT NULL DEFAULT '';
ALTER TABLE snapshots ADD COLUMN ref_pending TEXT NOT NULL DEFAULT '';
`

const schemaV11 = `
ALTER TABLE sandboxes ADD COLUMN net_delay_ns INTEGER NOT NULL DEFAULT 0;
ALTER TABLE sandboxes ADD COLUMN net_loss REAL NOT NULL DEFAULT 0;
`

// schemaV10 marks the snapshots a user promoted (sbx snapshot keep): a
// freeze so marked no longer goes with its sandbox, nor counts in its quota.
// Every snapshot taken before is kept: it was taken under the promise that
// a snapshot outlives its sandbox (a hunt's freeze, above all).
const schemaV10 = `
ALTER TABLE snapshots ADD COLUMN kept INTEGER NOT NULL DEFAULT 0;
UPDATE snapshots SET kept = 1;
`

// schemaV9 records each sandbox's (and snapshot's) network mode, and the
// ports published on the preview proxy: the only ones it serves.
const schemaV9 = `
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
	st := &Store{db: db, feed: &feed{}}
	st.q = fullRetry{db: db, res: func() *reserve { return st.res }}
	return st, nil
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
func (s *Store) Close() error {
	if s.db == nil {
		return errors.New("store: Close inside a transaction")
	}
	return s.db.Close()
}

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
	// TemplateVersion is the version of Template it was made on; the
	// sandbox holds it for as long as it lives.
	TemplateVersion string
	// Pids limits its processes; DiskLimit its disk changes, in bytes (0: none).
	Pids      int
	DiskLimit int64
	// Network is "" (NAT egress) or "none" (loopback only).
	Network string
	// NetDelay and NetLoss shape the traffic leaving it (netns.Shape).
	NetDelay time.Duration
	NetLoss  float64
	// PagesImage is the image its memory is loaded from on demand (a
	// memory fork's), "" if none: runsc reads it while the sandbox runs.
	PagesImage string
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
	_, err := s.q.ExecContext(ctx, `INSERT INTO sandboxes
		(id, name, template, state, reason, created_at, ttl_ns, meta, cpus, memory, last_activity, source, parent, memory_restored, resume_reason, image, disk, template_version, pids, disk_limit, network, net_delay_ns, net_loss)
		VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`,
		sb.ID, nullable(sb.Name), sb.Template, string(sb.State), sb.Reason, sb.CreatedAt.UnixNano(),
		int64(sb.TTL), string(meta), sb.CPUs, sb.Memory, sb.LastActivity.UnixNano(),
		sb.Source, sb.Parent, sb.MemoryRestored, sb.ResumeReason, sb.Image, sb.Disk, sb.TemplateVersion, sb.Pids, sb.DiskLimit, sb.Network, int64(sb.NetDelay), sb.NetLoss)
	if err != nil && strings.Contains(err.Error(), "UNIQUE constraint failed: sandboxes.name") {
		return api.Errorf(api.ErrConflict, "name %q is taken", sb.Name)
	}
	if err != nil {
		return fmt.Errorf("store sandbox %s: %w", sb.ID, err)
	}
	s.changed() // a sandbox in creating is one to tell
	return nil
}

// Change is one transition of a sandbox's state: from one of From to To,
// with the reason for it, and the fields that change with it (nil: kept).
type Change struct {
	From   []api.State
	To     api.State
	Reason string

	MemoryRestored *bool
	ResumeReason   *string
	Image          *string
	Disk           *string
}

// Transition moves sandbox id from one of c.From to c.To, compare-and-set,
// and records the "state.<to>" event in the same transaction. A sandbox in
// another state is api.ErrConflict naming it; a missing one api.ErrNotFound.
// It is the only way a sandbox's state changes after it is created.
func (s *Store) Transition(ctx context.Context, id string, c Change) error {
	if len(c.From) == 0 {
		return fmt.Errorf("transition %s to %s: no state to come from", id, c.To)
	}
	return s.Update(ctx, func(tx *Store) error {
		cur, err := tx.Sandbox(ctx, id)
		if err != nil {
			return err
		}
		if !slices.Contains(c.From, cur.State) {
			return api.Errorf(api.ErrConflict, "sandbox %s is %s, not %s", id, cur.State, joinStates(c.From))
		}
		q := `UPDATE sandboxes SET state = ?, reason = ?`
		args := []any{string(c.To), c.Reason}
		if c.MemoryRestored != nil {
			q, args = q+`, memory_restored = ?`, append(args, *c.MemoryRestored)
		}
		if c.ResumeReason != nil {
			q, args = q+`, resume_reason = ?`, append(args, *c.ResumeReason)
		}
		if c.Image != nil {
			q, args = q+`, image = ?`, append(args, *c.Image)
		}
		if c.Disk != nil {
			q, args = q+`, disk = ?`, append(args, *c.Disk)
		}
		if runscGone(c.To) {
			// no runsc of it reads a fork's image any more (SetPagesImage)
			q += `, pages_image = ''`
		}
		q += ` WHERE id = ? AND state = ?`
		args = append(args, cur.ID, string(cur.State))
		if _, err := tx.q.ExecContext(ctx, q, args...); err != nil {
			return fmt.Errorf("store state of %s: %w", id, err)
		}
		detail := map[string]any{"from": string(cur.State)}
		if c.Reason != "" {
			detail["reason"] = c.Reason
		}
		return tx.AddEvent(ctx, id, "state."+string(c.To), detail)
	})
}

// runscGone says a sandbox in state st has no runsc process: stopped,
// failed, lost or deleted. A resume boots it anew, from an image of its
// own.
func runscGone(st api.State) bool {
	switch st {
	case api.StateStopped, api.StateError, api.StateLost, api.StateDeleted:
		return true
	}
	return false
}

func joinStates(states []api.State) string {
	s := make([]string, len(states))
	for i, st := range states {
		s[i] = string(st)
	}
	return strings.Join(s, " or ")
}

// SetTemplateVersion records the template version a sandbox holds.
func (s *Store) SetTemplateVersion(ctx context.Context, id, version string) error {
	_, err := s.q.ExecContext(ctx, `UPDATE sandboxes SET template_version = ? WHERE id = ?`, version, id)
	return err
}

// SetDisk records the tar a sandbox's overlay starts from.
func (s *Store) SetDisk(ctx context.Context, id, disk string) error {
	_, err := s.q.ExecContext(ctx, `UPDATE sandboxes SET disk = ? WHERE id = ?`, disk, id)
	return err
}

// SetPagesImage records the image sandbox id's memory is loaded from on
// demand ("": none, or no longer: every page is loaded, or runsc is gone).
func (s *Store) SetPagesImage(ctx context.Context, id, image string) error {
	_, err := s.q.ExecContext(ctx, `UPDATE sandboxes SET pages_image = ? WHERE id = ?`, image, id)
	return err
}

// DiskInUse reports whether a sandbox or a snapshot still boots on disk.
func (s *Store) DiskInUse(ctx context.Context, disk string) (bool, error) {
	var n int
	err := s.q.QueryRowContext(ctx, `SELECT (SELECT COUNT(*) FROM sandboxes WHERE disk = ?) + (SELECT COUNT(*) FROM snapshots WHERE disk = ?)`, disk, disk).Scan(&n)
	return n > 0, err
}

// ErrNotPooled says a sandbox is not a warm pool's ready one any more.
var ErrNotPooled = errors.New("not ready in the warm pool any more")

// TakePooled gives ready sandbox id, booted for a warm pool, what a create
// asks: its name, ttl and meta, and now as its creation and last activity.
// A taken name is api.ErrConflict; a sandbox that is not ready any more
// (deleted, ended) or no longer the pool's (another create took it) is
// ErrNotPooled, and it is left as it is.
func (s *Store) TakePooled(ctx context.Context, id, name string, ttl time.Duration, meta map[string]string, now time.Time) error {
	m, _ := json.Marshal(meta)
	res, err := s.q.ExecContext(ctx, `UPDATE sandboxes SET name = ?, ttl_ns = ?, meta = ?, created_at = ?, last_activity = ?
		WHERE id = ? AND state = ? AND json_extract(meta, '$."'||?||'"') IS NOT NULL`,
		nullable(name), int64(ttl), string(m), now.UnixNano(), now.UnixNano(), id, string(api.StateReady), api.MetaPool)
	if err != nil && strings.Contains(err.Error(), "UNIQUE constraint failed: sandboxes.name") {
		return api.Errorf(api.ErrConflict, "name %q is taken", name)
	}
	if err != nil {
		return fmt.Errorf("take pooled sandbox %s: %w", id, err)
	}
	if n, err := res.RowsAffected(); err != nil || n != 1 {
		return fmt.Errorf("pooled sandbox %s: %w", id, ErrNotPooled)
	}
	s.changed()
	return nil
}

// SetTTL records a sandbox's idle ttl.
func (s *Store) SetTTL(ctx context.Context, id string, ttl time.Duration) error {
	_, err := s.q.ExecContext(ctx, `UPDATE sandboxes SET ttl_ns = ? WHERE id = ?`, int64(ttl), id)
	return err
}

// SetPersistent records whether a sandbox is exempt from the idle reaper.
func (s *Store) SetPersistent(ctx context.Context, id string, persistent bool) error {
	_, err := s.q.ExecContext(ctx, `UPDATE sandboxes SET persistent = ? WHERE id = ?`, persistent, id)
	return err
}

// SetMetaKey sets key to value in sandbox id's meta ("" removes it), if
// the sandbox is in state and its hibernation image is image (state ""
// asks nothing): a value that holds for one image alone (the ref its
// push left) is never set on a later one. It reports whether it set it.
func (s *Store) SetMetaKey(ctx context.Context, id string, state api.State, image, key, value string) (bool, error) {
	path := `$."` + strings.ReplaceAll(key, `"`, ``) + `"`
	set, args := `CASE WHEN json_valid(meta) THEN json_remove(meta, ?) ELSE meta END`, []any{path}
	if value != "" {
		set, args = `json_set(CASE WHEN meta IS NULL OR NOT json_valid(meta) OR meta = 'null' THEN '{}' ELSE meta END, ?, ?)`, []any{path, value}
	}
	where := ` WHERE id = ?`
	args = append(args, id)
	if state != "" {
		where += ` AND state = ? AND image = ?`
		args = append(args, string(state), image)
	}
	res, err := s.q.ExecContext(ctx, `UPDATE sandboxes SET meta = `+set+where, args...)
	if err != nil {
		return false, fmt.Errorf("set meta %s of sandbox %s: %w", key, id, err)
	}
	n, _ := res.RowsAffected()
	if n > 0 {
		s.changed()
	}
	return n > 0, nil
}

// Touch records activity on a sandbox.
func (s *Store) Touch(ctx context.Context, id string, at time.Time) error {
	_, err := s.q.ExecContext(ctx, `UPDATE sandboxes SET last_activity = ? WHERE id = ? AND last_activity < ?`, at.UnixNano(), id, at.UnixNano())
	return err
}

// DeleteSandbox removes a sandbox and its execs. Its events stay.
func (s *Store) DeleteSandbox(ctx context.Context, id string) error {
	return s.Update(ctx, func(tx *Store) error {
		if _, err := tx.q.ExecContext(ctx, `DELETE FROM execs WHERE sandbox_id = ?`, id); err != nil {
			return fmt.Errorf("delete sandbox %s: %w", id, err)
		}
		if _, err := tx.q.ExecContext(ctx, `DELETE FROM previews WHERE sandbox_id = ?`, id); err != nil {
			return fmt.Errorf("delete sandbox %s: %w", id, err)
		}
		if _, err := tx.q.ExecContext(ctx, `DELETE FROM sandboxes WHERE id = ?`, id); err != nil {
			return fmt.Errorf("delete sandbox %s: %w", id, err)
		}
		return nil
	})
}

const sandboxCols = `id, COALESCE(name, ''), template, state, reason, created_at, ttl_ns, meta, cpus, memory, last_activity, source, parent, memory_restored, resume_reason, image, persistent, disk, template_version, pids, disk_limit, network, net_delay_ns, net_loss, pages_image`

func scanSandbox(row interface{ Scan(...any) error }) (*Sandbox, error) {
	var sb Sandbox
	var state, meta string
	var created, ttl, last, delay int64
	if err := row.Scan(&sb.ID, &sb.Name, &sb.Template, &state, &sb.Reason, &created, &ttl, &meta, &sb.CPUs, &sb.Memory, &last,
		&sb.Source, &sb.Parent, &sb.MemoryRestored, &sb.ResumeReason, &sb.Image, &sb.Persistent, &sb.Disk,
		&sb.TemplateVersion, &sb.Pids, &sb.DiskLimit, &sb.Network, &delay, &sb.NetLoss, &sb.PagesImage); err != nil {
		return nil, err
	}
	sb.NetDelay = time.Duration(delay)
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
	row := s.q.QueryRowContext(ctx, `SELECT `+sandboxCols+` FROM sandboxes WHERE id = ? OR name = ?`, ref, ref)
	sb, err := scanSandbox(row)
	if errors.Is(err, sql.ErrNoRows) {
		return nil, api.Errorf(api.ErrNotFound, "sandbox %s not found", ref)
	}
	return sb, err
}

// Sandboxes returns every sandbox, oldest first.
func (s *Store) Sandboxes(ctx context.Context) ([]*Sandbox, error) {
	rows, err := s.q.QueryContext(ctx, `SELECT `+sandboxCols+` FROM sandboxes ORDER BY created_at`)
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
	return s.withActivity(ctx, e.SandboxID, activity, func(tx querier) error {
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
func (s *Store) withActivity(ctx context.Context, sandboxID string, at time.Time, fn func(querier) error) error {
	return s.Update(ctx, func(tx *Store) error {
		if err := fn(tx.q); err != nil {
			return err
		}
		_, err := tx.q.ExecContext(ctx, `UPDATE sandboxes SET last_activity = ? WHERE id = ? AND last_activity < ?`, at.UnixNano(), sandboxID, at.UnixNano())
		return err
	})
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
	return s.withActivity(ctx, e.SandboxID, activity, func(tx querier) error {
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
	row := s.q.QueryRowContext(ctx, `SELECT `+execCols+` FROM execs WHERE sandbox_id = ? AND id = ?`, sandboxID, execID)
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
	rows, err := s.q.QueryContext(ctx, q, arg)
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

// Event is an event to record.
type Event struct {
	Type   string
	Detail map[string]any
}

// AddEvent appends an event.
func (s *Store) AddEvent(ctx context.Context, sandboxID, typ string, detail map[string]any) error {
	d, _ := json.Marshal(detail)
	_, err := s.q.ExecContext(ctx, `INSERT INTO events (sandbox_id, time, type, detail) VALUES (?, ?, ?, ?)`,
		sandboxID, time.Now().UnixNano(), typ, string(d))
	if err != nil {
		return err
	}
	s.changed()
	return nil
}

// changed tells the feed now, or at the commit of the transaction s is.
func (s *Store) changed() {
	if s.db != nil {
		s.feed.Notify()
	} else {
		s.wrote = true
	}
}

// Events returns a sandbox's events after seq.
// DeletedByName returns the id of the last deleted sandbox that was named
// name, from its "deleted" event ("" if there is none).
func (s *Store) DeletedByName(ctx context.Context, name string) (string, error) {
	var id string
	err := s.q.QueryRowContext(ctx, `SELECT sandbox_id FROM events WHERE type = 'deleted' AND json_extract(detail, '$.name') = ? ORDER BY seq DESC LIMIT 1`, name).Scan(&id)
	if errors.Is(err, sql.ErrNoRows) {
		return "", nil
	}
	return id, err
}

func (s *Store) Events(ctx context.Context, sandboxID string, after int64) ([]api.Event, error) {
	rows, err := s.q.QueryContext(ctx, `SELECT seq, sandbox_id, time, type, detail FROM events WHERE sandbox_id = ? AND seq > ? ORDER BY seq`, sandboxID, after)
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
