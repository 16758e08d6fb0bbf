// Package sandbox is the manager: the lifecycle of sandboxes, their execs and
// their files, on top of the runtime, the network and the store.
package sandbox

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base32"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/google/go-containerregistry/pkg/v1/remote"
	specs "github.com/opencontainers/runtime-spec/specs-go"

	"sbx.dev/sbx/api"
	"sbx.dev/sbx/internal/agent/hooks"
	"sbx.dev/sbx/internal/atomicfile"
	"sbx.dev/sbx/internal/cgroup"
	"sbx.dev/sbx/internal/follow"
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
	TarUpper(ctx context.Context, id, file string, max int64) error
	Pause(ctx context.Context, id string) error
	Resume(ctx context.Context, id string) error
	State(ctx context.Context, id string) (runsc.State, error)
	Delete(ctx context.Context, id string) error
	List(ctx context.Context) ([]runsc.State, error)
	Exec(ctx context.Context, id string, o runsc.ExecOptions, stdin io.Reader, stdout, stderr io.Writer) (int, error)
	StartTerminal(ctx context.Context, id string, p *specs.Process, processFile string, cols, rows int) (*runsc.Terminal, error)
	StartExec(id string, o runsc.ShimExec) (*runsc.Shim, error)
}

var _ Runtime = (*runsc.Driver)(nil)

// Networks is the slice of the netns manager the manager uses.
type Networks interface {
	Create(id string) (*netns.Network, error)
	Get(id string) (*netns.Network, error)
	// Rearm readies an existing network for a new runsc sandbox (a resume).
	Rearm(id string) error
	// Shape perturbs what leaves the sandbox (the zero Shape: nothing);
	// Release lets go of what shaping holds in sbxd while it is stopped.
	Shape(id string, s netns.Shape) error
	Release(id string)
	Delete(id string) error
	List() ([]string, error)
	Dial(ctx context.Context, id string, port int) (net.Conn, error)
}

var _ Networks = (*netns.Manager)(nil)

// Templates is the slice of the template store the manager uses. A name
// points at a version, which never changes; Collect removes the versions
// no name points at and inUse says nothing holds.
type Templates interface {
	Resolve(name string) (api.Template, error)
	Version(version string) (api.Template, error)
	VersionRootfs(version string) (string, error)
	Remove(name string) (api.Template, error)
	Collect(inUse func(version string) bool) ([]string, error)
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
	// Limits are every sandbox's defaults and maxima (zero: DefaultLimits).
	Limits Limits
	// HostFacts reads what a memory image pushed from here needs of the
	// host it restores on (nil: a push records none).
	HostFacts func() (HostFacts, error)
	// RegistryOptions are added to every registry call of a push or pull
	// (tests: a transport of their own).
	RegistryOptions []remote.Option
	// StopRepository, in a fleet, is the repository of the fleet's
	// registry every stop image is pushed to (sbxd --fleet-registry), so
	// that another node resumes the sandbox when this one is down; the
	// ref is in the sandbox's meta (api.MetaImageRef). "": none pushed.
	StopRepository string
	// Warm are the warm pools: how many sandboxes of a template, with
	// which limits, each keeps booted and unclaimed (pool.go); none by
	// default.
	Warm []WarmPool
	// StoppedRetention deletes a sandbox that has been stopped for longer
	// (0: never). The idle reaper never takes a stopped sandbox.
	StoppedRetention time.Duration
	// ExecChannel binds every sandbox an exec channel directory
	// (runsc.SpecOptions.ChannelDir) that the runtime listens on, so that
	// execs go over a connection init keeps open (sbxd --exec-channel; the
	// runtime must be told too).
	ExecChannel bool
	// ForkPagesOnDemand restores memory forks with their pages loaded on
	// demand (runsc.RestoreOptions.PagesOnDemand): forks of one image hold
	// only the memory each touches, and the image is kept while any fork
	// reads it (sbxd --fork-pages-on-demand).
	ForkPagesOnDemand bool
	// OutputHead and OutputTail are the budget of each output stream of an
	// exec and of the console: the first OutputHead bytes are kept, then
	// only the last OutputTail (0: runsc's defaults).
	OutputHead, OutputTail int64
	// FreezeQuota bounds each sandbox's freezes (quota.go); nil:
	// DefaultFreezeQuota.
	FreezeQuota *FreezeQuota
	// StorageMax bounds what the data dir holds: images, snapshots,
	// templates and outputs together; at it, captures are refused
	// (storage.go). 0: no bound.
	StorageMax int64
	// OrphanMax bounds the orphan images kept for their grace: past it the
	// oldest go first, with an event (storage.go). 0: no bound.
	OrphanMax int64
	// Node is this sbxd's name in a fleet ("" outside one): every sandbox
	// says it.
	Node string
}

// Manager owns the sandboxes of one daemon. Its parts each guard their own
// state with their own mutex, and none is held across a runsc call, a file
// or /proc read, SQLite or a sleep: the running execs, the leases, the
// process watcher, the freeze slots. The changes of one sandbox take turns
// by claims (claims.go), records an operation holds while it runs, not
// mutexes held through its I/O.
type Manager struct {
	cfg Config
	log *slog.Logger
	now func() time.Time

	// agentKey names the agent directory fresh boots mount (installAgent).
	agentKey string

	// xfer is the content store of pushes and pulls (transfer.go), opened
	// at the first
	xfer struct {
		once sync.Once
		t    *transfers
		err  error
	}

	claims   claims
	execs    execOwner    // the execs and their output (exec.go)
	previews previews     // publications and the connections dialed in (previews.go)
	reaper   reaper       // the idle reaper and the leases that hold it off (reaper.go)
	metrics  metricsOwner // resource use and the /metrics registry (metrics.go)
	logs     logsOwner    // the log streams and the events feed (logs.go)
	images   imageFiles   // the images' files (images.go)
	journal  journal      // operations under way, and the shutdown's gate (journal.go)
	fs       sandboxFiles // the file API (files.go)
	storage  storageOwner // the storage budget, freeze quotas, disks (storage.go)
	pool     poolOwner    // the warm pools (pool.go)
	watcher  watcher
	freezes  freezeOwner // the freezes' slots and records (freeze.go)
	// sweepWake has the image sweep look now.
	sweepWake chan struct{}
	// versions are the template versions being made into sandboxes, not
	// yet in their records: Collect must not take them meanwhile.
	versions versionLeases
	// monitors are the runtime monitors of monitored sandboxes (trace.go).
	monitors monitorTable
	// files tells log followers when a log file grows (logs.go).
	files follow.Files
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
	if cfg.FreezeQuota == nil {
		q := DefaultFreezeQuota
		cfg.FreezeQuota = &q
	}
	if cfg.Limits == (Limits{}) {
		cfg.Limits = DefaultLimits
	}
	m := &Manager{cfg: cfg, log: cfg.Logger, now: cfg.Now, sweepWake: make(chan struct{}, 1)}
	m.previews.host = managerPreviewHost{cfg.Store, m}
	m.execs.host, m.execs.log = managerExecHost{cfg.Store, m}, m.log
	m.execs.head, m.execs.tail = cfg.OutputHead, cfg.OutputTail
	m.metrics = metricsOwner{host: managerMetricsHost{cfg.Store, m}, reg: cfg.Metrics}
	m.logs = logsOwner{host: managerLogsHost{cfg.Store, m}}
	m.images = imageFiles{root: filepath.Join(cfg.DataDir, "images")}
	m.journal.host, m.journal.log, m.journal.files = managerJournalHost{cfg.Store, m}, m.log, m.images
	m.fs = sandboxFiles{host: managerFilesHost{cfg.Store, m}}
	m.freezes = freezeOwner{host: managerFreezeHost{cfg.Store, m}, log: m.log, dataDir: cfg.DataDir, images: m.images}
	m.storage = storageOwner{host: managerStorageHost{cfg.Store, m}, log: m.log, dataDir: cfg.DataDir,
		storageMax: cfg.StorageMax, orphanMax: cfg.OrphanMax, quota: *cfg.FreezeQuota, images: m.images}
	m.pool = poolOwner{host: managerPoolHost{cfg.Store, m}, log: m.log,
		filling: map[string]int{}, skipped: map[string]bool{}, removing: map[string]bool{}, wake: make(chan struct{}, 1)}
	if err := m.setWarm(cfg.Warm); err != nil {
		return nil, err
	}
	m.reaper = reaper{host: managerReapHost{cfg.Store, m}, log: m.log, maxLifetime: cfg.MaxLifetime,
		stoppedRetention: cfg.StoppedRetention, after: cfg.After}
	for _, d := range []string{m.sandboxesDir(), m.agentRoot(), m.images.root, m.freezes.freezeRoot()} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return nil, err
		}
	}
	return m, nil
}

func (m *Manager) sandboxesDir() string        { return filepath.Join(m.cfg.DataDir, "sandboxes") }
func (m *Manager) sandboxDir(id string) string { return filepath.Join(m.sandboxesDir(), id) }

// channelDir is sandbox id's exec channel directory, "" without one.
func (m *Manager) channelDir(id string) string {
	if !m.cfg.ExecChannel {
		return ""
	}
	return filepath.Join(m.sandboxDir(id), "chan")
}
func (m *Manager) cgroupsPath(id string) string { return cgroup.Path(m.cfg.Tag, id) }

// cgroupOf is sandbox id's cgroup on the host.
func (m *Manager) cgroupOf(id string) cgroup.Group { return cgroup.Host.Group(m.cgroupsPath(id)) }

// Start installs the agent and reconciles the store with what runsc reports,
// so that sandboxes that kept running while sbxd was away are usable again.
func (m *Manager) Start(ctx context.Context) error {
	if err := m.installAgent(); err != nil {
		return err
	}
	if err := m.freezes.start(ctx); err != nil {
		return err
	}
	if err := m.reconcileJournal(ctx); err != nil {
		return err
	}
	sbs, err := m.cfg.Store.Sandboxes(ctx)
	if err != nil {
		return fmt.Errorf("start: list sandboxes: %w", err)
	}
	for _, sb := range sbs {
		m.reconcile(ctx, sb)
	}
	// leftovers go before any freeze is settled: a settle may leave a
	// watcher behind (awaitSlot) that records a freeze in the background,
	// journal first, then its image; removeLeftovers reads the journal
	// once and then removes every image it does not name, so one
	// recorded between the two lost its image mid-sync
	if err := m.removeLeftovers(ctx); err != nil {
		return fmt.Errorf("start: remove leftovers: %w", err)
	}
	// with leftovers gone, before any capture: old agent builds nothing needs
	if err := m.collectAgents(); err != nil {
		m.log.Warn("collect old agent builds (all kept)", "err", err)
	}
	// freezes taken while sbxd was away are recorded now
	if sbs, err = m.cfg.Store.Sandboxes(ctx); err != nil {
		return fmt.Errorf("start: list sandboxes: %w", err)
	}
	for _, sb := range sbs {
		running := sb.State == api.StateReady
		m.freezes.settleFreezesLocked(ctx, sb, running)
		if running {
			m.freezes.watchFreezes(ctx, sb.ID)
		}
	}
	go m.collectTemplates(context.WithoutCancel(ctx))
	if err := m.execs.recoverExecs(ctx); err != nil {
		return err
	}
	go m.watchLoop(context.WithoutCancel(ctx))
	go m.sweepLoop(context.WithoutCancel(ctx))
	go m.reaper.loop(context.WithoutCancel(ctx))
	go m.pool.loop(context.WithoutCancel(ctx))
	// stop images a registry that was down, or sbxd's end, left unpushed
	for _, sb := range sbs {
		if sb.State == api.StateStopped && sb.Meta[api.MetaImageRef] == "" {
			m.pushStopSoon(sb.ID, sb.Image)
		}
	}
	if err := m.pushFreezesLeft(ctx); err != nil {
		m.log.Warn("list the freezes left unpushed", "err", err)
	}
	return nil
}

// installAgent installs the agent into the data dir, so the bind mount
// every sandbox has keeps working when the build directory changes, with
// what comes with it: sbx-reaper, the freeze command (a link to the agent)
// and the freeze hooks (hooks.Files).
//
// Each set of those files goes into a directory of its own, named by
// their digest (DATA_DIR/agent/v/KEY), never written again: a memory
// image's processes run the agent they were captured with, and its text is
// mapped from the host's file, not kept in the image. A restore mounts the
// directory its image names (imageAgent), so the init of a sandbox stopped
// or snapshotted before an upgrade of sbx wakes up on its own binary, not
// on a new one at the same path (which it did, and crashed at once). Old
// directories go once nothing needs them (collectAgents).
func (m *Manager) installAgent() error {
	files, names, key, err := agentFiles(m.cfg.AgentBinary)
	if err != nil {
		return err
	}
	// /.sbx in every sandbox: every user there runs the agent (a timeout
	// is enforced by it), so it is open to all of them; the data dir around
	// it keeps the host's other users out
	for _, d := range []string{m.agentRoot(), filepath.Join(m.agentRoot(), "v")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return fmt.Errorf("install agent: %w", err)
		}
		if err := os.Chmod(d, 0o755); err != nil {
			return fmt.Errorf("install agent: %w", err)
		}
	}
	versions := filepath.Join(m.agentRoot(), "v")
	// what a killed install left
	if tmps, _ := filepath.Glob(filepath.Join(versions, "*.tmp")); len(tmps) > 0 {
		for _, t := range tmps {
			_ = os.RemoveAll(t)
		}
	}
	dir := m.agentDirOf(key)
	if fileExists(filepath.Join(dir, agentComplete)) && agentDirHolds(dir, files) {
		m.agentKey = key
		return nil
	}
	// none, cut short, or not what its name says (a crash that kept the
	// rename and lost the data): written again, whole
	tmp := dir + ".tmp"
	for _, name := range names {
		p := filepath.Join(tmp, name)
		for d := filepath.Dir(p); ; d = filepath.Dir(d) {
			if err := os.MkdirAll(d, 0o755); err != nil {
				return fmt.Errorf("install agent: %w", err)
			}
			if err := os.Chmod(d, 0o755); err != nil { // past the umask: every user inside reads it
				return fmt.Errorf("install agent: %w", err)
			}
			if d == tmp {
				break
			}
		}
		mode := os.FileMode(0o644)
		if name == "sbx-agent" || name == "sbx-reaper" {
			mode = 0o755
		}
		if err := writeSynced(p, files[name]); err != nil {
			return fmt.Errorf("install agent: %w", err)
		}
		if err := os.Chmod(p, mode); err != nil {
			return fmt.Errorf("install agent: %w", err)
		}
	}
	if err := os.Symlink("sbx-agent", filepath.Join(tmp, "freeze")); err != nil {
		return fmt.Errorf("install agent: the freeze command: %w", err)
	}
	if err := writeSynced(filepath.Join(tmp, agentComplete), nil); err != nil {
		return fmt.Errorf("install agent: %w", err)
	}
	if err := syncTree(tmp); err != nil {
		return fmt.Errorf("install agent: %w", err)
	}
	// a directory of this name that is not whole goes aside, not away:
	// sandboxes may mount it still (their execs run what is left of it)
	if _, err := os.Lstat(dir); err == nil {
		if err := os.Rename(dir, fmt.Sprintf("%s.damaged-%d", dir, time.Now().UnixNano())); err != nil {
			return fmt.Errorf("install agent: %w", err)
		}
	}
	if err := os.Rename(tmp, dir); err != nil {
		return fmt.Errorf("install agent: %w", err)
	}
	if err := syncDir(versions); err != nil {
		return fmt.Errorf("install agent: %w", err)
	}
	m.agentKey = key
	return nil
}

// agentFiles reads the files of the agent directory of the agent binary
// at bin: their bodies by name, the names in order, and the key they make.
func agentFiles(bin string) (map[string][]byte, []string, string, error) {
	src, err := os.ReadFile(bin)
	if err != nil {
		return nil, nil, "", fmt.Errorf("install agent: %w (build it with `make build`)", err)
	}
	files := map[string][]byte{"sbx-agent": src}
	// sbx-reaper beside the agent binary, when it was built (gcc): init
	// then keeps an exec's timeout itself, without the agent's start
	// (cmd/sbx-reaper); without it the agent's exec does
	if body, err := os.ReadFile(filepath.Join(filepath.Dir(bin), "sbx-reaper")); err == nil {
		files["sbx-reaper"] = body
	}
	for name, body := range hooks.Files {
		files[filepath.FromSlash(name)] = body
	}
	names := make([]string, 0, len(files))
	for name := range files {
		names = append(names, name)
	}
	sort.Strings(names)
	h := sha256.New()
	for _, name := range names {
		fmt.Fprintf(h, "%s %d\n", name, len(files[name]))
		h.Write(files[name])
	}
	return files, names, hex.EncodeToString(h.Sum(nil))[:16], nil
}

// agentDirHolds says whether agent directory dir holds files, byte for byte.
func agentDirHolds(dir string, files map[string][]byte) bool {
	for name, body := range files {
		b, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil || string(b) != string(body) {
			return false
		}
	}
	return true
}

// syncTree syncs every directory under root, root included.
func syncTree(root string) error {
	return filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil || !d.IsDir() {
			return err
		}
		return syncDir(p)
	})
}

// agentComplete marks an agent directory whole.
const agentComplete = ".complete"

// agentLegacy names the agent of a sandbox or image from before agent
// directories had versions: the files right in DATA_DIR/agent.
const agentLegacy = "legacy"

func (m *Manager) agentRoot() string { return filepath.Join(m.cfg.DataDir, "agent") }

// agentDirOf is the directory of agent key.
func (m *Manager) agentDirOf(key string) string {
	if key == agentLegacy {
		return m.agentRoot()
	}
	return filepath.Join(m.agentRoot(), "v", key)
}

// agentFor is the agent a sandbox booting from image img (none: a fresh
// boot) mounts, and its key: the one the image was captured with. An
// image whose agent this host lacks (from before images named theirs,
// with no legacy agent left) is an error: its init would wake up on a
// binary it was not captured with and die, so a resume boots from the
// disk instead, and a create from it is refused.
func (m *Manager) agentFor(img string) (key, dir string, err error) {
	if img == "" {
		return m.agentKey, m.agentDirOf(m.agentKey), nil
	}
	want, noted := imageAgent(m.images.dir(img))
	if !noted {
		want = agentLegacy // captured before images named their agent
	}
	if m.hasAgent(want) {
		return want, m.agentDirOf(want), nil
	}
	if want == "" {
		want = "a note that names none"
	}
	return "", "", api.Errorf(api.ErrConflict, "it was captured with an agent this host does not have (%s): its processes cannot be woken up here", want)
}

// hasAgent says whether agent key is installed here, whole.
func (m *Manager) hasAgent(key string) bool {
	if !validAgentKey(key) {
		return false
	}
	d := m.agentDirOf(key)
	if key == agentLegacy {
		return fileExists(filepath.Join(d, "sbx-agent"))
	}
	return fileExists(filepath.Join(d, agentComplete))
}

// imageAgent is the agent the memory image at dir notes, and whether it
// has a note: a note that is not a key (cut short, damaged) is "" and
// noted, never taken for the legacy agent.
func imageAgent(dir string) (string, bool) {
	b, err := os.ReadFile(filepath.Join(dir, imageAgentFile))
	if errors.Is(err, fs.ErrNotExist) {
		return "", false
	}
	if k := strings.TrimSpace(string(b)); err == nil && validAgentKey(k) {
		return k, true
	}
	return "", true
}

// notedAgent is the key the memory image at dir notes, "" if none.
func notedAgent(dir string) string {
	k, _ := imageAgent(dir)
	return k
}

// validAgentKey says whether k can name an agent directory: legacy, or
// hex digits (it is read from files in the data dir).
func validAgentKey(k string) bool {
	if k == agentLegacy {
		return true
	}
	if len(k) != 16 {
		return false
	}
	_, err := hex.DecodeString(k)
	return err == nil
}

// imageAgentFile, in a memory image, names the agent its processes run;
// sandboxAgentFile, in a sandbox's directory, the agent it booted with.
const (
	imageAgentFile   = "AGENT"
	sandboxAgentFile = "agent"
)

// noteImageAgent records in the memory image at imageDir the agent its
// processes run: key if it names one, else the note of the sandbox at
// sandboxDir (none: a sandbox booted by an sbxd from before the notes, on
// the legacy agent).
func noteImageAgent(key, sandboxDir, imageDir string) error {
	if !validAgentKey(key) {
		key = agentLegacy
		if b, err := os.ReadFile(filepath.Join(sandboxDir, sandboxAgentFile)); sandboxDir != "" && err == nil && validAgentKey(strings.TrimSpace(string(b))) {
			key = strings.TrimSpace(string(b))
		}
	}
	// whole or not at all: a note cut short would be no agent's
	return atomicfile.WriteBytes(filepath.Join(imageDir, imageAgentFile), []byte(key+"\n"), 0o600)
}

// from is the states a transition may come from.
func from(states ...api.State) []api.State { return states }

func (m *Manager) event(ctx context.Context, id, typ string, detail map[string]any) {
	if err := m.cfg.Store.AddEvent(context.WithoutCancel(ctx), id, typ, detail); err != nil {
		m.log.Error("record event", "sandbox", id, "event", typ, "err", err)
	}
}

// claim claims sandbox id whole for op (claims.go): the operations that
// change a sandbox take their turns. The wait ends with ctx.
func (m *Manager) claim(ctx context.Context, id, op string) (release func(), err error) {
	return m.claims.claim(ctx, id, op)
}

// Get returns the sandbox whose id or name is ref.
func (m *Manager) Get(ctx context.Context, ref string) (*api.Sandbox, error) {
	sb, err := m.cfg.Store.Sandbox(ctx, ref)
	if err != nil {
		return nil, err
	}
	if pooled(sb) {
		return nil, api.Errorf(api.ErrNotFound, "sandbox %s not found", ref) // not a user's yet
	}
	return m.withVerdict(sb), nil
}

// withVerdict is the API view of a sandbox with the reaper's view of it.
func (m *Manager) withVerdict(sb *store.Sandbox) *api.Sandbox {
	a := m.toAPI(sb)
	now := m.now()
	if sb.State == api.StateReady || sb.State == api.StateStopped {
		a.Idle = api.DurationOf(now.Sub(sb.LastActivity).Round(time.Second))
		v := m.judgeSandbox(sb)
		if !v.at.IsZero() {
			at := v.at
			a.ReapAt = &at
		}
		a.ReapReason = v.reason
	}
	return a
}

// Changed returns a channel that is closed once a sandbox is created,
// changes state or is deleted after the call (changes coalesce): a
// follower such as the fleet's node agent calls Changed, then List, and
// lists again when the channel closes.
func (m *Manager) Changed() <-chan struct{} { return m.cfg.Store.Changed() }

// List returns every sandbox.
func (m *Manager) List(ctx context.Context) ([]api.Sandbox, error) {
	sbs, err := m.cfg.Store.Sandboxes(ctx)
	if err != nil {
		return nil, err
	}
	out := make([]api.Sandbox, 0, len(sbs))
	for _, sb := range sbs {
		if pooled(sb) {
			continue // the warm pool's, not a user's yet
		}
		out = append(out, *m.withVerdict(sb))
	}
	return out, nil
}

func (m *Manager) toAPI(sb *store.Sandbox) *api.Sandbox {
	a := &api.Sandbox{
		ID: sb.ID, Name: sb.Name, Template: sb.Template, State: sb.State, Reason: sb.Reason,
		CreatedAt: sb.CreatedAt, Meta: sb.Meta, CPUs: sb.CPUs, Memory: sb.Memory,
		LastActivity: sb.LastActivity, Address: strings.TrimSuffix(netns.InsideAddr.String(), "/30"),
		From: sb.Source, Parent: sb.Parent, MemoryRestored: sb.MemoryRestored, ResumeReason: sb.ResumeReason,
		Persistent: sb.Persistent, TemplateVersion: sb.TemplateVersion, Pids: sb.Pids, DiskLimit: sb.DiskLimit, Network: sb.Network,
		Shape: shapeOf(sb),
	}
	if sb.Network == NetworkNone {
		a.Address = "" // loopback only
	}
	if sb.TTL > 0 {
		a.TTL = api.Duration(sb.TTL)
	}
	a.Node = m.cfg.Node
	a.Agent = m.agentOf(sb)
	return a
}

// agentOf is the agent sb's processes run on: a stopped sandbox's, its
// memory image's note; another's, the note its boot wrote ("" for none:
// not booted yet, or an image of before the notes).
func (m *Manager) agentOf(sb *store.Sandbox) string {
	if sb.State == api.StateStopped && sb.Image != "" {
		if !fileExists(m.images.mem(sb.Image)) {
			return "" // no memory: its resume boots on the current build
		}
		k, noted := imageAgent(m.images.dir(sb.Image))
		if !noted {
			return agentLegacy
		}
		return k
	}
	b, err := os.ReadFile(filepath.Join(m.sandboxDir(sb.ID), sandboxAgentFile))
	switch k := strings.TrimSpace(string(b)); {
	case err == nil && validAgentKey(k):
		return k
	case errors.Is(err, fs.ErrNotExist) && sb.State == api.StateReady:
		return agentLegacy // booted by an sbxd of before the notes
	}
	return ""
}

// Agents are the agents installed here whole, the one fresh boots mount
// first: a fleet restores a memory image only on a node that holds the
// agent it was captured with. The legacy agent is not one of them: the
// memory of a sandbox booted on it restores only where it was taken (a
// pull keeps its disk alone), each node's being another release's.
func (m *Manager) Agents() []string {
	keys := []string{m.agentKey}
	ents, _ := os.ReadDir(filepath.Join(m.agentRoot(), "v"))
	for _, e := range ents {
		if k := e.Name(); k != m.agentKey && validAgentKey(k) && k != agentLegacy && m.hasAgent(k) {
			keys = append(keys, k)
		}
	}
	return keys
}

// Visible is nil unless ref is a warm pool's sandbox, not taken yet: then
// api.ErrNotFound, as for none (no request may address it).
func (m *Manager) Visible(ctx context.Context, ref string) error {
	if sb, err := m.cfg.Store.Sandbox(ctx, ref); err == nil && pooled(sb) {
		return api.Errorf(api.ErrNotFound, "sandbox %s not found", ref)
	}
	return nil
}

// running returns the sandbox ref if it is running, else an error saying
// what to do.
func (m *Manager) running(ctx context.Context, ref string) (*store.Sandbox, error) {
	sb, err := m.cfg.Store.Sandbox(ctx, ref)
	if err != nil {
		return nil, err
	}
	if pooled(sb) {
		return nil, api.Errorf(api.ErrNotFound, "sandbox %s not found", ref) // a warm pool's: no one's yet
	}
	if err := requireState(sb, api.StateReady); err != nil {
		return nil, err
	}
	return sb, nil
}

// creatingWait bounds how long a command waits for a sandbox being made.
const creatingWait = 2 * time.Minute

// whenReady is running for a command addressed to a sandbox that may still
// be being made (a fork announced before it boots, a create in flight): it
// waits, up to creatingWait, for the create to end, then says what running
// says. Never call it holding the sandbox's claim.
func (m *Manager) whenReady(ctx context.Context, ref string) (*store.Sandbox, error) {
	sb, err := m.cfg.Store.Sandbox(ctx, ref)
	if err != nil || sb.State != api.StateCreating {
		return m.running(ctx, ref)
	}
	// The create claims the sandbox until it has ended.
	wctx, cancel := context.WithTimeout(ctx, creatingWait)
	defer cancel()
	if err := m.claims.idle(wctx, sb.ID); err != nil {
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		return nil, api.Errorf(api.ErrConflict, "sandbox %s is still being created after %s", sb.ID, creatingWait)
	}
	return m.running(ctx, sb.ID)
}

// Creating reports whether sandbox ref is being made (a command to it
// will wait).
func (m *Manager) Creating(ctx context.Context, ref string) bool {
	sb, err := m.cfg.Store.Sandbox(ctx, ref)
	return err == nil && sb.State == api.StateCreating
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
