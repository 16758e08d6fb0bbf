// Package sandbox is the manager: the lifecycle of sandboxes, their execs and
// their files, on top of the runtime, the network and the store.
package sandbox

import (
	"context"
	"crypto/rand"
	"encoding/base32"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"sbx.dev/sbx/api"
	"sbx.dev/sbx/internal/metrics"
	"sbx.dev/sbx/internal/netns"
	"sbx.dev/sbx/internal/runsc"
	"sbx.dev/sbx/internal/store"
)

// Runtime is the slice of the runsc driver the manager uses.
type Runtime interface {
	Run(ctx context.Context, id string, o runsc.RunOptions) error
	Restore(ctx context.Context, id string, o runsc.RestoreOptions) error
	Checkpoint(ctx context.Context, id, imageDir string, leaveRunning bool) error
	TarUpper(ctx context.Context, id, file string) error
	Resume(ctx context.Context, id string) error
	State(ctx context.Context, id string) (runsc.State, error)
	Delete(ctx context.Context, id string) error
	Exec(ctx context.Context, id string, o runsc.ExecOptions, stdin io.Reader, stdout, stderr io.Writer) (int, error)
	ExecCommand(ctx context.Context, id string, o runsc.ExecOptions) *exec.Cmd
}

var _ Runtime = (*runsc.Driver)(nil)

// Networks is the slice of the netns manager the manager uses.
type Networks interface {
	Create(id string) (*netns.Network, error)
	Get(id string) (*netns.Network, error)
	// Rearm readies an existing network for a new runsc sandbox (a resume).
	Rearm(id string) error
	Delete(id string) error
	Dial(ctx context.Context, id string, port int) (net.Conn, error)
}

var _ Networks = (*netns.Manager)(nil)

// Templates is the slice of the template store the manager uses.
type Templates interface {
	Rootfs(name string) (string, error)
}

// Config wires a Manager.
type Config struct {
	// DataDir holds sandboxes/, agent/ and the database.
	DataDir string
	// Tag names this daemon's cgroups, namespaces and rules.
	Tag       string
	Runtime   Runtime
	Networks  Networks
	Templates Templates
	Store     *store.Store
	// AgentBinary is the sbx-agent to mount into sandboxes.
	AgentBinary string
	// DefaultTemplate is used when a create names none.
	DefaultTemplate string
	Logger          *slog.Logger
	// Now is the clock (tests inject one).
	Now func() time.Time
	// OrphanGrace is how long an image whose sandbox is gone is kept.
	OrphanGrace time.Duration
	// MaxLifetime caps every sandbox's life (wall clock from creation); 0: none.
	MaxLifetime time.Duration
	// After is the reaper's timer (tests inject one).
	After func(time.Duration) <-chan time.Time
	// Metrics receives the manager's counters and histograms (captures,
	// reaper); nil means metrics.Default.
	Metrics *metrics.Registry
}

// Manager owns the sandboxes of one daemon.
type Manager struct {
	cfg Config
	log *slog.Logger
	now func() time.Time

	mu    sync.Mutex
	locks map[string]*sync.Mutex // per sandbox: lifecycle changes are serialized
	execs map[string]*execRun    // running execs by exec id
	// watching are the running sandboxes' runsc processes.
	watching map[string]watched
	// closing refuses new captures; inflight counts those under way.
	closing  bool
	inflight sync.WaitGroup
	// leases count open PTYs and preview connections per sandbox.
	leases map[string]int
	reaped int64
}

// New returns a Manager; call Start before using it.
func New(cfg Config) (*Manager, error) {
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.After == nil {
		cfg.After = time.After
	}
	if cfg.OrphanGrace == 0 {
		cfg.OrphanGrace = DefaultOrphanGrace
	}
	if cfg.DefaultTemplate == "" {
		cfg.DefaultTemplate = "base"
	}
	m := &Manager{cfg: cfg, log: cfg.Logger, now: cfg.Now, locks: map[string]*sync.Mutex{}, execs: map[string]*execRun{}, watching: map[string]watched{}, leases: map[string]int{}}
	for _, d := range []string{m.sandboxesDir(), m.agentDir(), m.imagesDir()} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return nil, err
		}
	}
	return m, nil
}

func (m *Manager) sandboxesDir() string         { return filepath.Join(m.cfg.DataDir, "sandboxes") }
func (m *Manager) sandboxDir(id string) string  { return filepath.Join(m.sandboxesDir(), id) }
func (m *Manager) agentDir() string             { return filepath.Join(m.cfg.DataDir, "agent") }
func (m *Manager) cgroupsPath(id string) string { return "/sbx-" + m.cfg.Tag + "/" + id }

// Start installs the agent and reconciles the store with what runsc reports,
// so that sandboxes that kept running while sbxd was away are usable again.
func (m *Manager) Start(ctx context.Context) error {
	if err := m.installAgent(); err != nil {
		return err
	}
	if err := m.reconcileCaptures(ctx); err != nil {
		return err
	}
	sbs, err := m.cfg.Store.Sandboxes(ctx)
	if err != nil {
		return fmt.Errorf("start: list sandboxes: %w", err)
	}
	for _, sb := range sbs {
		m.reconcile(ctx, sb)
	}
	if err := m.recoverExecs(ctx); err != nil {
		return err
	}
	go m.watchLoop(context.WithoutCancel(ctx))
	go m.sweepLoop(context.WithoutCancel(ctx))
	go m.reapLoop(context.WithoutCancel(ctx))
	return nil
}

// installAgent copies the agent binary into the data dir, so the bind mount
// every sandbox has keeps working when the build directory changes.
func (m *Manager) installAgent() error {
	src, err := os.ReadFile(m.cfg.AgentBinary)
	if err != nil {
		return fmt.Errorf("install agent: %w (build it with `make build`)", err)
	}
	dst := filepath.Join(m.agentDir(), "sbx-agent")
	if cur, err := os.ReadFile(dst); err == nil && string(cur) == string(src) {
		return nil
	}
	tmp := dst + ".tmp"
	if err := os.WriteFile(tmp, src, 0o755); err != nil {
		return fmt.Errorf("install agent: %w", err)
	}
	return os.Rename(tmp, dst)
}

func (m *Manager) setState(ctx context.Context, id string, st api.State, reason string) {
	if err := m.cfg.Store.SetState(ctx, id, st, reason); err != nil {
		m.log.Error("record state", "sandbox", id, "state", st, "err", err)
	}
	m.event(ctx, id, "state."+string(st), map[string]any{"reason": reason})
}

func (m *Manager) event(ctx context.Context, id, typ string, detail map[string]any) {
	if err := m.cfg.Store.AddEvent(context.WithoutCancel(ctx), id, typ, detail); err != nil {
		m.log.Error("record event", "sandbox", id, "event", typ, "err", err)
	}
}

// lock serializes lifecycle changes of one sandbox.
func (m *Manager) lock(id string) func() {
	m.mu.Lock()
	l, ok := m.locks[id]
	if !ok {
		l = &sync.Mutex{}
		m.locks[id] = l
	}
	m.mu.Unlock()
	l.Lock()
	return l.Unlock
}

// Get returns the sandbox whose id or name is ref.
func (m *Manager) Get(ctx context.Context, ref string) (*api.Sandbox, error) {
	sb, err := m.cfg.Store.Sandbox(ctx, ref)
	if err != nil {
		return nil, err
	}
	return m.withVerdict(sb), nil
}

// withVerdict is the API view of a sandbox with the reaper's view of it.
func (m *Manager) withVerdict(sb *store.Sandbox) *api.Sandbox {
	a := toAPI(sb)
	now := m.now()
	if sb.State == api.StateReady || sb.State == api.StateStopped {
		a.Idle = now.Sub(sb.LastActivity).Round(time.Second).String()
		v := judge(sb, now, m.busy(sb.ID), m.cfg.MaxLifetime)
		if !v.at.IsZero() {
			at := v.at
			a.ReapAt = &at
		}
		a.ReapReason = v.reason
	}
	return a
}

// List returns every sandbox.
func (m *Manager) List(ctx context.Context) ([]api.Sandbox, error) {
	sbs, err := m.cfg.Store.Sandboxes(ctx)
	if err != nil {
		return nil, err
	}
	out := make([]api.Sandbox, 0, len(sbs))
	for _, sb := range sbs {
		out = append(out, *m.withVerdict(sb))
	}
	return out, nil
}

func toAPI(sb *store.Sandbox) *api.Sandbox {
	a := &api.Sandbox{
		ID: sb.ID, Name: sb.Name, Template: sb.Template, State: sb.State, Reason: sb.Reason,
		CreatedAt: sb.CreatedAt, Meta: sb.Meta, CPUs: sb.CPUs, Memory: sb.Memory,
		LastActivity: sb.LastActivity, Address: strings.TrimSuffix(netns.InsideAddr.String(), "/30"),
		From: sb.Source, Parent: sb.Parent, MemoryRestored: sb.MemoryRestored, ResumeReason: sb.ResumeReason,
		Persistent: sb.Persistent, Network: sb.Network,
	}
	if sb.Network == NetworkNone {
		a.Address = "" // loopback only
	}
	if sb.TTL > 0 {
		a.TTL = sb.TTL.String()
	}
	return a
}

// running returns the sandbox ref if it is running, else an error saying
// what to do.
func (m *Manager) running(ctx context.Context, ref string) (*store.Sandbox, error) {
	sb, err := m.cfg.Store.Sandbox(ctx, ref)
	if err != nil {
		return nil, err
	}
	switch sb.State {
	case api.StateReady:
		return sb, nil
	case api.StateStopped:
		return nil, api.Errorf(api.ErrConflict, "sandbox %s is stopped; run `sbx resume %s`", sb.ID, sb.ID)
	default:
		msg := fmt.Sprintf("sandbox %s is %s", sb.ID, sb.State)
		if sb.Reason != "" {
			msg += ": " + sb.Reason
		}
		return nil, api.Errorf(api.ErrConflict, "%s", msg)
	}
}

// touch records activity on a sandbox now.
func (m *Manager) touch(ctx context.Context, id string) {
	if err := m.cfg.Store.Touch(context.WithoutCancel(ctx), id, m.now()); err != nil {
		m.log.Warn("record activity", "sandbox", id, "err", err)
	}
}

var idEncoding = base32.NewEncoding("abcdefghijklmnopqrstuvwxyz234567").WithPadding(base32.NoPadding)

// newID returns prefix + 10 lowercase base32 characters (50 random bits).
func newID(prefix string) string {
	var b [7]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic(err)
	}
	return prefix + idEncoding.EncodeToString(b[:])[:10]
}

// processAlive reports whether pid is alive and its command line holds want.
func processAlive(pid int, want string) bool {
	if pid <= 0 {
		return false
	}
	if err := syscall.Kill(pid, 0); err != nil {
		return false
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	return err == nil && strings.Contains(string(b), want)
}
