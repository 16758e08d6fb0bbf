package sandbox

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"sbx.dev/sbx/api"
	"sbx.dev/sbx/internal/netns"
	"sbx.dev/sbx/internal/runsc"
	"sbx.dev/sbx/internal/store"
)

// Fakes behind the real interfaces: the reaper's rules are about time and
// bookkeeping, not about runsc.

type fakeRuntime struct {
	mu      sync.Mutex
	running map[string]bool
	// tar, if set, writes a disk capture in place of an empty tar
	tar func(file string, max int64) error
	// checkpoint, if set, is called as a checkpoint begins: a slow runsc
	checkpoint func(id string)
	// restores are the options of each restore, by sandbox id
	restores map[string]runsc.RestoreOptions
	// pids, when set for a sandbox, is the pid State names for it (this
	// process's otherwise)
	pids map[string]int
}

var _ Runtime = (*fakeRuntime)(nil)

func (f *fakeRuntime) Run(ctx context.Context, id string, o runsc.RunOptions) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.running[id] = true
	return nil
}
func (f *fakeRuntime) Restore(ctx context.Context, id string, o runsc.RestoreOptions) error {
	f.mu.Lock()
	if f.restores == nil {
		f.restores = map[string]runsc.RestoreOptions{}
	}
	f.restores[id] = o
	f.mu.Unlock()
	return f.Run(ctx, id, o.RunOptions)
}
func (f *fakeRuntime) Checkpoint(ctx context.Context, id, dir string, leave bool) error {
	if f.checkpoint != nil {
		f.checkpoint(id)
	}
	for _, n := range []string{"checkpoint.img", "pages_meta.img", "pages.img"} {
		if err := os.WriteFile(filepath.Join(dir, n), []byte("x"), 0o600); err != nil {
			return err
		}
	}
	return nil
}
func (f *fakeRuntime) TarUpper(ctx context.Context, id, file string, max int64) error {
	if f.tar != nil {
		return f.tar(file, max)
	}
	return os.WriteFile(file, make([]byte, 1024), 0o600) // an empty tar
}
func (f *fakeRuntime) Pause(ctx context.Context, id string) error  { return nil }
func (f *fakeRuntime) Resume(ctx context.Context, id string) error { return nil }
func (f *fakeRuntime) State(ctx context.Context, id string) (runsc.State, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if !f.running[id] {
		return runsc.State{}, runsc.ErrNotExist
	}
	pid := os.Getpid()
	if p, ok := f.pids[id]; ok {
		pid = p
	}
	return runsc.State{ID: id, Pid: pid, Status: runsc.StatusRunning}, nil
}
func (f *fakeRuntime) Delete(ctx context.Context, id string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.running, id)
	return nil
}
func (f *fakeRuntime) Exec(ctx context.Context, id string, o runsc.ExecOptions, stdin io.Reader, stdout, stderr io.Writer) (int, error) {
	if stdin != nil {
		io.Copy(io.Discard, stdin)
	}
	if len(o.Args) > 1 && (o.Args[1] == "stat" || o.Args[1] == "ls") {
		if o.Args[1] == "ls" {
			io.WriteString(stdout, "[]")
		} else {
			io.WriteString(stdout, `{"name":"x"}`)
		}
	}
	return 0, nil
}

func (f *fakeRuntime) StartTerminal(ctx context.Context, id string, p *specs.Process, file string, cols, rows int) (*runsc.Terminal, error) {
	return nil, errors.New("no terminals in unit tests")
}

func (f *fakeRuntime) List(ctx context.Context) ([]runsc.State, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []runsc.State
	for id := range f.running {
		out = append(out, runsc.State{ID: id, Status: runsc.StatusRunning})
	}
	return out, nil
}

// StartExec plays a shim: the pid, then the end, at once or, for a
// command with "sleep", after 2 s; a request read from a slow stdin holds
// it as long as it takes.
func (f *fakeRuntime) StartExec(id string, o runsc.ShimExec) (*runsc.Shim, error) {
	events := make(chan runsc.ShimEvent, 2)
	go func() {
		defer close(events)
		if slices.Contains(o.Args, "start") { // an attach sends no pid, as the agent's
			events <- runsc.ShimEvent{Pid: 42}
		}
		if strings.Contains(string(o.Stdin), "sleep") {
			time.Sleep(2 * time.Second) // the fake command runs 2 s: a busy exec the reaper must see
		}
		code := 0
		events <- runsc.ShimEvent{Exit: &code}
	}()
	return &runsc.Shim{Proc: runsc.Proc{Pid: os.Getpid()}, Events: events}, nil
}

type fakeNets struct{}

func (fakeNets) Reset(id string) error   { return nil }
func (fakeNets) List() ([]string, error) { return nil, nil }

func (fakeNets) Create(id string) (*netns.Network, error) {
	return &netns.Network{ID: id, Path: "/x"}, nil
}
func (fakeNets) Get(id string) (*netns.Network, error) { return nil, os.ErrNotExist }
func (fakeNets) Delete(id string) error                { return nil }
func (fakeNets) Rearm(id string) error                 { return nil }
func (fakeNets) Shape(id string, s netns.Shape) error  { return nil }
func (fakeNets) Release(id string)                     {}
func (fakeNets) Dial(ctx context.Context, id string, port int) (net.Conn, error) {
	return nil, errors.New("no network in unit tests")
}

type fakeTemplates struct{ dir string }

func (f fakeTemplates) Resolve(name string) (api.Template, error) {
	return api.Template{Name: name, Version: "sha256:" + name}, nil
}
func (f fakeTemplates) VersionRootfs(v string) (string, error) { return f.dir, nil }
func (f fakeTemplates) Version(v string) (api.Template, error) { return api.Template{Version: v}, nil }
func (f fakeTemplates) Remove(name string) (api.Template, error) {
	return api.Template{Name: name, Version: "sha256:" + name}, nil
}
func (f fakeTemplates) Collect(inUse func(string) bool) ([]string, error) { return nil, nil }

// clock is a settable clock.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *clock) add(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

func newTestManager(t *testing.T, maxLifetime time.Duration) (*Manager, *clock) {
	t.Helper()
	dir := t.TempDir()
	st, err := store.Open(filepath.Join(dir, "state.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	agent := filepath.Join(dir, "agent-bin")
	os.WriteFile(agent, []byte("#!/bin/true\n"), 0o755)
	c := &clock{t: time.Date(2026, 11, 1, 12, 0, 0, 0, time.UTC)}
	m, err := New(Config{
		DataDir: dir, Tag: "test", Runtime: &fakeRuntime{running: map[string]bool{}}, Networks: fakeNets{},
		Templates: fakeTemplates{dir: t.TempDir()}, Store: st, AgentBinary: agent, DefaultTemplate: "tiny",
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), Now: c.now, MaxLifetime: maxLifetime,
		After: func(time.Duration) <-chan time.Time { return make(chan time.Time) }, // the tests drive reapOnce
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := m.installAgent(); err != nil {
		t.Fatal(err)
	}
	return m, c
}

func TestJudge(t *testing.T) {
	t0 := time.Date(2026, 11, 1, 12, 0, 0, 0, time.UTC)
	sb := func(ttl time.Duration, idle time.Duration, persistent bool) *store.Sandbox {
		return &store.Sandbox{CreatedAt: t0, TTL: ttl, LastActivity: t0.Add(-idle), Persistent: persistent}
	}
	tests := []struct {
		name     string
		sb       *store.Sandbox
		busy     bool
		lifetime time.Duration
		reap     bool
		reason   string
	}{
		{"idle past ttl", sb(30*time.Minute, 31*time.Minute, false), false, 0, true, "idle for 31m0s, longer than its ttl of 30m0s"},
		{"idle within ttl", sb(30*time.Minute, 29*time.Minute, false), false, 0, false, "idle ttl of 30m0s"},
		{"a 40-minute exec under a 30-minute ttl", sb(30*time.Minute, 40*time.Minute, false), true, 0, false, "active now"},
		{"persistent", sb(30*time.Minute, 5*time.Hour, true), false, 0, false, "persistent"},
		{"no ttl", sb(0, 5*time.Hour, false), false, 0, false, "no ttl"},
		{"lifetime cap over a busy sandbox", sb(30*time.Minute, 0, false), true, -time.Minute, true, "lifetime cap"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			now := t0
			life := tc.lifetime
			if life < 0 { // a cap that has just passed
				now = t0.Add(2 * time.Hour)
				tc.sb.LastActivity = now
				life = time.Hour
			}
			v := judge(tc.sb, now, tc.busy, life)
			if v.reap != tc.reap || !strings.Contains(v.reason, tc.reason) {
				t.Errorf("judge = %+v, want reap %v and a reason with %q", v, tc.reap, tc.reason)
			}
		})
	}
}

// TestActivityRules: what counts as activity moves lastActivity; read-only
// inspection does not. Each rule on its own, with an injected clock.
func TestActivityRules(t *testing.T) {
	ctx := context.Background()
	m, c := newTestManager(t, 0)
	sb, err := m.Create(ctx, api.CreateRequest{TTL: api.Duration(30 * time.Minute)})
	if err != nil {
		t.Fatal(err)
	}
	last := func() time.Time {
		s, err := m.cfg.Store.Sandbox(ctx, sb.ID)
		if err != nil {
			t.Fatal(err)
		}
		return s.LastActivity
	}
	tests := []struct {
		name   string
		counts bool
		do     func() error
	}{
		{"status/info", false, func() error { _, err := m.Get(ctx, sb.ID); return err }},
		{"list", false, func() error { _, err := m.List(ctx); return err }},
		{"events", false, func() error { return m.Events(ctx, sb.ID, 0, false, func(api.Event) error { return nil }) }},
		{"fs stat", false, func() error { _, err := m.Stat(ctx, sb.ID, "/x"); return err }},
		{"fs ls", false, func() error { _, err := m.ReadDir(ctx, sb.ID, "/", "", 0); return err }},
		{"exec", true, func() error {
			e, err := m.Exec(ctx, sb.ID, api.ExecRequest{Cmd: []string{"true"}})
			if err != nil {
				return err
			}
			return m.Output(ctx, sb.ID, e.ID, true, func(api.ExecEvent) error { return nil })
		}},
		{"file write", true, func() error { return m.WriteFile(ctx, sb.ID, "/x", strings.NewReader("ab"), 2, "") }},
		{"file read", true, func() error { return m.ReadFile(ctx, sb.ID, "/x", false, io.Discard) }},
		{"snapshot", true, func() error {
			_, err := m.Snapshot(ctx, sb.ID, api.SnapshotRequest{Name: "s-" + newID("")})
			return err
		}},
		{"lease (a PTY or preview connection)", true, func() error {
			release, err := m.Lease(ctx, sb.ID)
			if err == nil {
				release()
			}
			return err
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			before := last()
			c.add(time.Minute)
			if err := tc.do(); err != nil {
				t.Fatal(err)
			}
			moved := last().After(before)
			if moved != tc.counts {
				t.Errorf("lastActivity moved = %v, want %v", moved, tc.counts)
			}
		})
	}
}

func TestReaper(t *testing.T) {
	ctx := context.Background()
	m, c := newTestManager(t, 0)
	idle, _ := m.Create(ctx, api.CreateRequest{TTL: api.Duration(30 * time.Minute)})
	busy, _ := m.Create(ctx, api.CreateRequest{TTL: api.Duration(30 * time.Minute)})
	kept, _ := m.Create(ctx, api.CreateRequest{TTL: api.Duration(30 * time.Minute)})
	if _, err := m.SetPersistent(ctx, kept.ID, true); err != nil {
		t.Fatal(err)
	}
	if _, err := m.Snapshot(ctx, idle.ID, api.SnapshotRequest{Name: "evidence"}); err != nil {
		t.Fatal(err)
	}
	// An exec that runs through the reaper's pass keeps busy alive.
	if _, err := m.Exec(ctx, busy.ID, api.ExecRequest{Cmd: []string{"sleep", "2"}, Detach: false}); err != nil {
		t.Fatal(err)
	}
	c.add(31 * time.Minute)
	info, _ := m.Get(ctx, idle.ID)
	if info.ReapAt == nil || !strings.Contains(info.ReapReason, "idle") || info.Idle == nil || *info.Idle != api.Duration(31*time.Minute) {
		t.Errorf("info before the reaper: reapAt %v reason %q idle %q", info.ReapAt, info.ReapReason, info.Idle)
	}
	m.reaper.once(ctx)
	if _, err := m.Get(ctx, idle.ID); !errors.Is(err, api.ErrNotFound) {
		t.Errorf("idle sandbox not reaped: %v", err)
	}
	if _, err := m.Get(ctx, busy.ID); err != nil {
		t.Errorf("a sandbox with a running exec was reaped: %v", err)
	}
	if _, err := m.Get(ctx, kept.ID); err != nil {
		t.Errorf("a persistent sandbox was reaped: %v", err)
	}
	if _, err := m.GetSnapshot(ctx, "evidence"); err != nil {
		t.Errorf("reaping deleted a snapshot: %v", err)
	}
	evs, _ := m.cfg.Store.Events(ctx, idle.ID, 0)
	var reason string
	for _, ev := range evs {
		if ev.Type == "reaped" {
			reason, _ = ev.Detail["reason"].(string)
		}
	}
	if !strings.Contains(reason, "longer than its ttl") {
		t.Errorf("reaped event reason = %q", reason)
	}
	// ttl changes take effect (a bad one is refused as it is decoded:
	// api.TestDurationDecode).
	if _, err := m.SetTTL(ctx, busy.ID, 2*time.Hour); err != nil {
		t.Fatal(err)
	}
}

func TestMaxLifetime(t *testing.T) {
	ctx := context.Background()
	m, c := newTestManager(t, time.Hour)
	sb, _ := m.Create(ctx, api.CreateRequest{})
	if _, err := m.SetPersistent(ctx, sb.ID, true); !errors.Is(err, api.ErrForbidden) || !strings.Contains(err.Error(), "max_lifetime") {
		t.Errorf("persist under a lifetime cap: %v, want ErrForbidden saying why", err)
	}
	c.add(59 * time.Minute)
	m.reaper.once(ctx)
	if _, err := m.Get(ctx, sb.ID); err != nil {
		t.Fatalf("reaped before its lifetime ended: %v", err)
	}
	c.add(2 * time.Minute)
	m.reaper.once(ctx)
	if _, err := m.Get(ctx, sb.ID); !errors.Is(err, api.ErrNotFound) {
		t.Errorf("not reaped after its lifetime: %v", err)
	}
}

// TestReaperStopped: a stopped sandbox is what a user chose to keep: the
// idle reaper leaves it alone however long it is idle; only the daemon's
// retention for stopped sandboxes (off by default) deletes it, saying so.
func TestReaperStopped(t *testing.T) {
	ctx := context.Background()
	m, c := newTestManager(t, 0)
	sb, _ := m.Create(ctx, api.CreateRequest{TTL: api.Duration(30 * time.Minute)})
	if _, err := m.Stop(ctx, sb.ID, true); err != nil {
		t.Fatal(err)
	}
	c.add(24 * time.Hour)
	m.reaper.once(ctx)
	got, err := m.Get(ctx, sb.ID)
	if err != nil {
		t.Fatalf("a stopped sandbox was idle-reaped: %v", err)
	}
	if got.ReapAt != nil || !strings.Contains(got.ReapReason, "stopped") {
		t.Errorf("info of a stopped sandbox: reapAt %v reason %q, want none and why", got.ReapAt, got.ReapReason)
	}
	m.reaper.stoppedRetention = 48 * time.Hour
	m.reaper.once(ctx)
	if _, err := m.Get(ctx, sb.ID); err != nil {
		t.Fatalf("reaped before its retention ended: %v", err)
	}
	c.add(25 * time.Hour)
	m.reaper.once(ctx)
	if _, err := m.Get(ctx, sb.ID); !errors.Is(err, api.ErrNotFound) {
		t.Fatalf("not deleted after the retention for stopped sandboxes: %v", err)
	}
	evs, _ := m.cfg.Store.Events(ctx, sb.ID, 0)
	var reason string
	for _, ev := range evs {
		if ev.Type == "reaped" {
			reason, _ = ev.Detail["reason"].(string)
		}
	}
	if !strings.Contains(reason, "stopped retention") {
		t.Errorf("reaped event: %q, want it to name the retention rule", reason)
	}
}

// slowReader gives its bytes one at a time, each after the test lets it.
type slowReader struct {
	data []byte
	next chan struct{}
}

func (r *slowReader) Read(p []byte) (int, error) {
	if len(r.data) == 0 {
		return 0, io.EOF
	}
	<-r.next
	p[0] = r.data[0]
	r.data = r.data[1:]
	return 1, nil
}

// TestReaperTransferInProgress: an upload is activity from its first byte,
// not only when it ends: a long one is never reaped mid-way. And a sandbox
// whose lock is held (a capture, a delete) is not judged meanwhile.
func TestReaperTransferInProgress(t *testing.T) {
	ctx := context.Background()
	m, c := newTestManager(t, 0)
	sb, _ := m.Create(ctx, api.CreateRequest{TTL: api.Duration(30 * time.Minute)})
	r := &slowReader{data: []byte("ab"), next: make(chan struct{})}
	done := make(chan error)
	go func() { done <- m.WriteFile(ctx, sb.ID, "/x", r, 2, "") }()
	r.next <- struct{}{} // the first byte is in
	c.add(31 * time.Minute)
	m.reaper.once(ctx)
	if _, err := m.Get(ctx, sb.ID); err != nil {
		t.Fatalf("reaped during an upload: %v", err)
	}
	r.next <- struct{}{}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	// the end of the upload is activity too
	c.add(29 * time.Minute)
	m.reaper.once(ctx)
	if _, err := m.Get(ctx, sb.ID); err != nil {
		t.Fatalf("reaped 29 minutes after an upload ended, under a 30m ttl: %v", err)
	}
	// claimed by an operation: not judged
	c.add(2 * time.Minute)
	unlock, err := m.claim(ctx, sb.ID, kindSnapshot)
	if err != nil {
		t.Fatal(err)
	}
	m.reaper.once(ctx)
	unlock()
	if _, err := m.Get(ctx, sb.ID); err != nil {
		t.Fatalf("reaped while an operation claimed it: %v", err)
	}
	m.reaper.once(ctx)
	if _, err := m.Get(ctx, sb.ID); !errors.Is(err, api.ErrNotFound) {
		t.Errorf("not reaped once idle and free: %v", err)
	}
}

// TestRetireTimeStored: a resumed sandbox's old image is retired at a time
// the store keeps, so a restart of sbxd in between still removes it then,
// not a week later with the orphans.
func TestRetireTimeStored(t *testing.T) {
	ctx := context.Background()
	m, c := newTestManager(t, 0)
	sb, _ := m.Create(ctx, api.CreateRequest{})
	if _, err := m.Stop(ctx, sb.ID, true); err != nil {
		t.Fatal(err)
	}
	stopped, _ := m.cfg.Store.Sandbox(ctx, sb.ID)
	img := stopped.Image
	if _, err := m.Resume(ctx, sb.ID, false); err != nil {
		t.Fatal(err)
	}
	due := func(at time.Time) bool {
		ims, err := m.cfg.Store.ImagesDue(ctx, at, m.cfg.OrphanGrace)
		if err != nil {
			t.Fatal(err)
		}
		for _, im := range ims {
			if im.ID == img {
				return true
			}
		}
		return false
	}
	if due(c.now().Add(retireGrace - time.Second)) {
		t.Errorf("the old image is due before its retire time")
	}
	if !due(c.now().Add(retireGrace + time.Second)) {
		t.Errorf("the old image is not due after its retire time (only the 7-day orphan sweep would take it)")
	}
	// a sweep then (by any sbxd, this one or the next) removes it
	c.add(retireGrace + time.Second)
	m.sweep(ctx)
	if fileExists(m.images.dir(img)) || due(c.now()) {
		t.Errorf("the sweep left the retired image %s", img)
	}
}
