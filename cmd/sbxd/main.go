// Command sbxd is the sbx daemon: it owns the sandboxes of one data dir and
// serves the HTTP API on a unix socket and, with a token, on TCP.
package main

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base32"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"k8s.io/apimachinery/pkg/util/validation"

	"sbx.dev/sbx/api"
	"sbx.dev/sbx/internal/fleet/agent"
	"sbx.dev/sbx/internal/fleet/v1alpha1"
	"sbx.dev/sbx/internal/metrics"
	"sbx.dev/sbx/internal/netns"
	"sbx.dev/sbx/internal/runsc"
	"sbx.dev/sbx/internal/sandbox"
	"sbx.dev/sbx/internal/server"
	"sbx.dev/sbx/internal/store"
	"sbx.dev/sbx/internal/template"
)

// version is set at build time.
var version = "dev"

type config struct {
	dataDir   string
	socket    string
	listen    string
	tokenFile string
	runsc     string
	agent     string
	tag       string
	pool      string
	template  string
	logLevel  string
	logJSON   bool
	runscLog  string
	// execChannel: execs over a connection init keeps open (runsc/channel.go)
	execChannel bool
	// forkPagesOnDemand: memory forks load their pages when they use them
	forkPagesOnDemand bool
	cleanup           bool
	orphans           time.Duration
	lifetime          time.Duration
	shutdown          time.Duration

	previewListen string
	previewDomain string
	previewSet    bool // --preview-listen was given, not defaulted

	limits                  sandbox.Limits
	memory, maxMemory       string
	disk, maxDisk           string
	maxLayer, maxImage      string
	importLimits            template.ImportLimits
	outputHead, outputTail  string
	stoppedRetention        time.Duration
	egressAllow, egressDeny prefixes
	maxConns                int

	freezeQuota                         sandbox.FreezeQuota
	freezeMaxBytes, storageMax, orphMax string
	storageMaxN, orphanMaxN             int64

	fleetKubeconfig, nodeName, fleetNamespace, fleetAddress, fleetRegistry string

	warm warmPools
}

// warmPools is the repeatable --warm TEMPLATE=N[,cpus=C][,memory=M][,pids=P][,disk=D].
type warmPools []sandbox.WarmPool

func (w *warmPools) String() string {
	var s []string
	for _, p := range *w {
		v := fmt.Sprintf("%s=%d", p.Template, p.N)
		if p.CPUs != 0 {
			v += ",cpus=" + strconv.FormatFloat(p.CPUs, 'g', -1, 64)
		}
		if p.Memory != "" {
			v += ",memory=" + p.Memory
		}
		if p.Pids != 0 {
			v += ",pids=" + strconv.Itoa(p.Pids)
		}
		if p.Disk != "" {
			v += ",disk=" + p.Disk
		}
		s = append(s, v)
	}
	return strings.Join(s, " ")
}

const warmSyntax = "want TEMPLATE=N[,cpus=C][,memory=M][,pids=P][,disk=D], N from 0 to %d (e.g. --warm base=2 or --warm base=2,memory=1G)"

func (w *warmPools) Set(v string) error {
	first, rest, limits := strings.Cut(v, ",")
	name, n, ok := strings.Cut(first, "=")
	count, err := strconv.Atoi(n)
	if !ok || err != nil || count < 0 || count > sandbox.MaxWarm {
		return fmt.Errorf("%q: "+warmSyntax, v, sandbox.MaxWarm)
	}
	if err := template.ValidName(name); err != nil {
		return fmt.Errorf("%q: %w", v, err)
	}
	p := sandbox.WarmPool{Template: name, N: count}
	if limits {
		for _, kv := range strings.Split(rest, ",") {
			k, val, ok := strings.Cut(kv, "=")
			if !ok || val == "" {
				return fmt.Errorf("%q: %q is no limit: "+warmSyntax, v, kv, sandbox.MaxWarm)
			}
			switch k {
			case "cpus":
				c, err := strconv.ParseFloat(val, 64)
				if err != nil || c <= 0 {
					return fmt.Errorf("%q: cpus=%s: want a number of CPUs above 0, like 2 or 0.5", v, val)
				}
				p.CPUs = c
			case "memory", "disk":
				if _, err := sandbox.ParseSize(k, val); err != nil {
					return fmt.Errorf("%q: %w", v, err)
				}
				if k == "memory" {
					p.Memory = val
				} else {
					p.Disk = val
				}
			case "pids":
				n, err := strconv.Atoi(val)
				if err != nil || n <= 0 {
					return fmt.Errorf("%q: pids=%s: want a number of processes above 0", v, val)
				}
				p.Pids = n
			default:
				return fmt.Errorf("%q: %q is no limit of a pool: cpus, memory, pids or disk", v, k)
			}
		}
	}
	// the same template and limits again: the later size
	for i, q := range *w {
		if q.Template == p.Template && q.CPUs == p.CPUs && q.Memory == p.Memory && q.Pids == p.Pids && q.Disk == p.Disk {
			(*w)[i] = p
			return nil
		}
	}
	*w = append(*w, p)
	return nil
}

// prefixes is a repeatable flag of IPv4 prefixes (an address alone is a /32).
type prefixes []netip.Prefix

func (p *prefixes) String() string {
	var s []string
	for _, x := range *p {
		s = append(s, x.String())
	}
	return strings.Join(s, ",")
}

func (p *prefixes) Set(v string) error {
	x, err := netip.ParsePrefix(v)
	if err != nil {
		a, aerr := netip.ParseAddr(v)
		if aerr != nil {
			return fmt.Errorf("%q is not a CIDR prefix (10.0.0.0/8) or an address", v)
		}
		x = netip.PrefixFrom(a, a.BitLen())
	}
	if !x.Addr().Is4() {
		return fmt.Errorf("%q is not IPv4 (sandboxes have no IPv6 route)", v)
	}
	*p = append(*p, x.Masked())
	return nil
}

func main() {
	// sbxd is also the shim that owns each exec and console (runsc/shim.go)
	if len(os.Args) > 1 && os.Args[1] == runsc.ShimArg {
		os.Exit(runsc.ShimMain(os.Args[2:]))
	}
	var c config
	fs := flag.NewFlagSet("sbxd", flag.ContinueOnError)
	fs.StringVar(&c.dataDir, "data-dir", "/var/lib/sbx", "where sandboxes, templates and the database live")
	fs.StringVar(&c.socket, "socket", "/run/sbx/sbxd.sock", "unix socket to serve the API on (mode 0600)")
	fs.StringVar(&c.listen, "listen", "", "also serve the API on this TCP address (needs a token: $SBX_TOKEN or --token-file)")
	fs.StringVar(&c.tokenFile, "token-file", "", "file holding the bearer token for --listen (default: $SBX_TOKEN, else one is made in DATA_DIR/token)")
	fs.StringVar(&c.runsc, "runsc", "", "runsc binary (default: the one beside sbxd)")
	fs.StringVar(&c.agent, "agent", "", "sbx-agent binary (default: the one beside sbxd)")
	fs.StringVar(&c.tag, "tag", "", "4 characters naming this daemon's namespaces, cgroups and rules (default: derived from --data-dir)")
	fs.StringVar(&c.pool, "pool", "10.201.0.0/16", "addresses for the host side of sandbox networks")
	fs.StringVar(&c.template, "default-template", "base", "template of sandboxes created without one")
	fs.StringVar(&c.logLevel, "log-level", "info", "debug, info, warn or error")
	fs.BoolVar(&c.logJSON, "log-json", false, "log JSON lines instead of text")
	fs.BoolVar(&c.forkPagesOnDemand, "fork-pages-on-demand", true, "memory forks load each page of memory from the fork's image only when they use it, so forks of one sandbox hold only what each touches (the image is kept while a fork reads it; =false: every fork loads every page at once)")
	fs.BoolVar(&c.execChannel, "exec-channel", true, "send execs over a connection each sandbox's init keeps open to sbxd, not a `runsc exec` each (gives runsc --host-uds=open; =false: a shim and a `runsc exec` each; see the README)")
	fs.StringVar(&c.runscLog, "runsc-debug-log", "", "directory for runsc's debug logs (debugging runsc itself; large)")
	fs.DurationVar(&c.orphans, "orphan-grace", sandbox.DefaultOrphanGrace, "how long a hibernation image is kept after its sandbox is deleted")
	fs.DurationVar(&c.lifetime, "max-lifetime", 0, "cap every sandbox's life at this long from its creation (0: no cap); persistent sandboxes are then refused")
	fs.BoolVar(&c.cleanup, "cleanup", false, "remove this daemon's firewall rules and exit (refused while it has sandboxes)")
	fs.DurationVar(&c.shutdown, "shutdown-timeout", 30*time.Second, "how long a clean shutdown waits for captures and requests in flight")
	fs.StringVar(&c.previewListen, "preview-listen", "127.0.0.1:8181", "serve preview URLs (http://PORT-ID.DOMAIN:PORT/) on this TCP address (\"\": off)")
	fs.StringVar(&c.previewDomain, "preview-domain", "localhost", "domain of preview URLs; *.DOMAIN must resolve to the proxy")
	def := sandbox.DefaultLimits
	fs.StringVar(&c.memory, "default-memory", "2G", "memory limit of a sandbox that asks for none")
	fs.StringVar(&c.maxMemory, "max-memory", "", "the most memory a sandbox may ask for (default: the host's memory)")
	fs.IntVar(&c.limits.Pids, "default-pids", def.Pids, "process limit (per user inside) of a sandbox that asks for none")
	fs.IntVar(&c.limits.MaxPids, "max-pids", def.MaxPids, "the most processes a sandbox may ask for")
	fs.StringVar(&c.disk, "default-disk", "10G", "disk limit (its disk changes) of a sandbox that asks for none; past it writes fail with ENOSPC inside")
	fs.StringVar(&c.maxDisk, "max-disk", "1T", "the most disk a sandbox may ask for")
	fs.StringVar(&c.maxLayer, "max-layer-size", "16G", "the most an image layer (or a rootfs tar) may unpack to; an import past it is stopped there and leaves nothing (0: no limit)")
	fs.StringVar(&c.maxImage, "max-image-size", "32G", "the most an image's layers (or a rootfs tar) may add up to (0: no limit)")
	fs.StringVar(&c.outputHead, "output-head", "32M", "each exec's stdout and stderr, and each console, keep this much from the start...")
	fs.StringVar(&c.outputTail, "output-tail", "1M", "...and then only this much from the end; what is between is dropped, and said so")
	fs.DurationVar(&c.stoppedRetention, "stopped-retention", 0, "delete a sandbox stopped for longer than this (0: keep stopped sandboxes; the idle reaper never takes them)")
	fs.Var(&c.egressAllow, "egress-allow", "let sandboxes reach this IPv4 CIDR, though it is link-local or the host's own (repeatable; the most specific rule wins)")
	fs.Var(&c.warm, "warm", "keep N sandboxes of TEMPLATE booted and unclaimed, so that `sbx new` of it (with the default network, and the pool's limits) takes one at once (TEMPLATE=N[,cpus=C][,memory=M][,pids=P][,disk=D], repeatable; e.g. --warm base=2 --warm base=2,memory=1G)")
	fs.Var(&c.egressDeny, "egress-deny", "keep sandboxes from reaching this IPv4 CIDR (repeatable; the most specific rule wins)")
	fs.IntVar(&c.maxConns, "max-conns", server.DefaultMaxConns, "most connections open at once on the TCP API and on the preview proxy, each (fewer if RLIMIT_NOFILE is low)")
	fq := sandbox.DefaultFreezeQuota
	fs.IntVar(&c.freezeQuota.MaxCount, "freeze-max-count", fq.MaxCount, "the most freezes (and crash captures) a sandbox keeps; past it a freeze is not kept, and says why (0: no bound; promoted ones do not count)")
	fs.StringVar(&c.freezeMaxBytes, "freeze-max-bytes", "8G", "the most a sandbox's freezes may hold together (0: no bound)")
	fs.DurationVar(&c.freezeQuota.MinInterval, "freeze-min-interval", fq.MinInterval, "the least time between two freezes a sandbox records (0: none)")
	fs.StringVar(&c.storageMax, "storage-max", "0", "bound what the data dir holds (images, snapshots, templates, outputs); at it captures are refused (0: no bound)")
	fs.StringVar(&c.orphMax, "orphan-max", "20G", "bound the orphan images kept for --orphan-grace: past it the oldest go first, with an event (0: no bound)")
	fs.StringVar(&c.fleetKubeconfig, "fleet-kubeconfig", "", "join a fleet on Kubernetes as a node agent: the kubeconfig of its apiserver (\"\": no fleet)")
	fs.StringVar(&c.nodeName, "node-name", "", "this node's name in the fleet (its SandboxNode and Lease; default: the hostname)")
	fs.StringVar(&c.fleetNamespace, "fleet-namespace", v1alpha1.DefaultNamespace, "namespace of this node's Lease and Sandbox objects")
	fs.StringVar(&c.fleetRegistry, "fleet-registry", "", "in a fleet, the repository of its registry every stop image is pushed to (127.0.0.1:5000/sbx/stops), so another node resumes the sandbox while this one is down (\"\": none)")
	fs.StringVar(&c.fleetAddress, "fleet-address", "", "the API address this node publishes (default: tcp://--listen, else unix://--socket)")
	if err := fs.Parse(os.Args[1:]); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			os.Exit(0)
		}
		os.Exit(2)
	}
	fs.Visit(func(f *flag.Flag) { c.previewSet = c.previewSet || f.Name == "preview-listen" })
	if fs.NArg() > 0 {
		fmt.Fprintf(os.Stderr, "sbxd: unexpected argument %q\n", fs.Arg(0))
		os.Exit(2)
	}
	if err := run(c); err != nil {
		fmt.Fprintf(os.Stderr, "sbxd: %v\n", err)
		os.Exit(1)
	}
}

func newLogger(c config) (*slog.Logger, error) {
	var level slog.Level
	if err := level.UnmarshalText([]byte(c.logLevel)); err != nil {
		return nil, fmt.Errorf("--log-level: %w", err)
	}
	opts := &slog.HandlerOptions{Level: level}
	if c.logJSON {
		return slog.New(slog.NewJSONHandler(os.Stderr, opts)), nil
	}
	return slog.New(slog.NewTextHandler(os.Stderr, opts)), nil
}

// besideSelf returns the path of name in sbxd's own directory.
func besideSelf(name string) string {
	exe, err := os.Executable()
	if err != nil {
		return name
	}
	return filepath.Join(filepath.Dir(exe), name)
}

// isExecutable says path is a regular file someone may execute.
func isExecutable(path string) bool {
	fi, err := os.Stat(path)
	return err == nil && fi.Mode().IsRegular() && fi.Mode().Perm()&0o111 != 0
}

// defaultTag derives a daemon's tag from its data dir, so two daemons with
// different data dirs never share names, and a restarted one finds its own.
func defaultTag(dataDir string) string {
	sum := sha256.Sum256([]byte(dataDir))
	return strings.ToLower(base32.StdEncoding.EncodeToString(sum[:]))[:4]
}

func run(c config) error {
	log, err := newLogger(c)
	if err != nil {
		return err
	}
	if os.Geteuid() != 0 {
		return errors.New("sbxd must run as root (it creates namespaces, cgroups and gVisor sandboxes)")
	}
	if c.dataDir, err = filepath.Abs(c.dataDir); err != nil {
		return err
	}
	for _, f := range []struct {
		flag string
		s    string
		v    *int64
	}{
		{"default-memory", c.memory, &c.limits.Memory}, {"max-memory", c.maxMemory, &c.limits.MaxMemory},
		{"default-disk", c.disk, &c.limits.Disk}, {"max-disk", c.maxDisk, &c.limits.MaxDisk},
		{"max-layer-size", c.maxLayer, &c.importLimits.Layer}, {"max-image-size", c.maxImage, &c.importLimits.Image},
		{"freeze-max-bytes", c.freezeMaxBytes, &c.freezeQuota.MaxBytes}, {"storage-max", c.storageMax, &c.storageMaxN},
		{"orphan-max", c.orphMax, &c.orphanMaxN},
	} {
		if *f.v, err = sandbox.ParseSize(f.flag, f.s); err != nil {
			return fmt.Errorf("--%w", err)
		}
	}
	var head, tail int64
	if head, err = sandbox.ParseSize("output-head", c.outputHead); err != nil {
		return fmt.Errorf("--%w", err)
	}
	if tail, err = sandbox.ParseSize("output-tail", c.outputTail); err != nil {
		return fmt.Errorf("--%w", err)
	}
	if head < 4<<10 {
		return fmt.Errorf("--output-head: %s is less than the 4K an error message needs", c.outputHead)
	}
	if c.runsc == "" {
		c.runsc = besideSelf("runsc")
	}
	if c.agent == "" {
		c.agent = besideSelf("sbx-agent")
	}
	if c.tag == "" {
		c.tag = defaultTag(c.dataDir)
	}
	if _, err := os.Stat(c.runsc); err != nil {
		return fmt.Errorf("runsc: %w (build it with `make build`, or pass --runsc)", err)
	}
	if err := os.MkdirAll(c.dataDir, 0o700); err != nil {
		return err
	}
	unlock, err := lockDataDir(c.dataDir)
	if err != nil {
		return err
	}
	defer unlock()
	// a data dir made by hand, or by an older sbxd, may be open to others:
	// it holds the token, the preview key, images with sandboxes' memory
	if err := os.Chmod(c.dataDir, 0o700); err != nil {
		return fmt.Errorf("data dir: %w", err)
	}
	if c.maxConns < 1 {
		return fmt.Errorf("--max-conns %d: want at least 1", c.maxConns)
	}

	st, err := store.Open(filepath.Join(c.dataDir, "state.db"))
	if err != nil {
		return err
	}
	defer st.Close()
	// room for the database's own writes when the data dir fills up
	if err := st.KeepReserve(filepath.Join(c.dataDir, "reserve"), 32<<20); err != nil {
		log.Warn("no reserve of space for the database: the data dir may be nearly full", "err", err)
	}
	templates, err := template.Open(filepath.Join(c.dataDir, "templates"))
	if err != nil {
		return err
	}
	c.importLimits.Reserve = template.DefaultImportLimits.Reserve
	templates.SetImportLimits(c.importLimits)
	pool, err := netip.ParsePrefix(c.pool)
	if err != nil {
		return fmt.Errorf("--pool: %w", err)
	}
	nets, err := netns.New(netns.Config{Tag: c.tag, Pool: pool, EgressAllow: c.egressAllow, EgressDeny: c.egressDeny})
	if err != nil {
		return err
	}
	if c.cleanup {
		return cleanup(st, nets)
	}
	// Every listener asked for is had before anything is set up, or sbxd
	// does not start; none serves before the reconcile.
	ls, err := listen(c, log)
	if err != nil {
		return err
	}
	defer ls.close()
	if err := nets.Setup(); err != nil {
		return fmt.Errorf("network setup: %w", err)
	}
	nofile, err := raiseNofile()
	if err != nil {
		log.Warn("cannot raise the open file limit", "err", err)
	}
	apiConns, previewConns, reserve := server.ConnBudget(nofile, c.maxConns)
	log.Info("connection limits", "open_files", nofile, "reserve", reserve, "api", apiConns, "preview", previewConns)
	driver := &runsc.Driver{Path: c.runsc, Root: filepath.Join(c.dataDir, "runsc"), ExecChannel: c.execChannel}
	// the shims (an exec's without the channel, a boot's console) are
	// sbx-shim beside sbxd when it is there: sbxd itself, started again,
	// takes ten times as long to start (runsc/shim.go; cmd/sbx-shim)
	if shim := besideSelf("sbx-shim"); isExecutable(shim) {
		driver.ShimBinary = shim
	}
	// runsc's own errors about a sandbox go to its directory: the `runtime`
	// log stream. Never for a sandbox whose directory is gone (runsc would
	// fail to open the file, and say nothing else).
	driver.LogFile = func(id string) string {
		dir := filepath.Join(c.dataDir, "sandboxes", id)
		if _, err := os.Stat(dir); err != nil {
			return ""
		}
		return filepath.Join(dir, "runsc.log")
	}
	if c.runscLog != "" {
		driver.Flags = []string{"--debug", "--debug-log=" + strings.TrimSuffix(c.runscLog, "/") + "/"}
	}
	node, err := nodeName(c)
	if err != nil {
		return err
	}
	mgr, err := sandbox.New(sandbox.Config{
		Node:    node,
		DataDir: c.dataDir, Tag: c.tag, Runtime: driver, Networks: nets, Templates: templates,
		Store: st, AgentBinary: c.agent, DefaultTemplate: c.template, Logger: log, OrphanGrace: c.orphans, MaxLifetime: c.lifetime,
		Metrics: metrics.Default, Limits: c.limits, Warm: c.warm, StoppedRetention: c.stoppedRetention, OutputHead: head, OutputTail: tail,
		ExecChannel:       c.execChannel,
		ForkPagesOnDemand: c.forkPagesOnDemand,
		FreezeQuota:       &c.freezeQuota, StorageMax: c.storageMaxN, OrphanMax: c.orphanMaxN, StopRepository: c.fleetRegistry,
		HostFacts: sync.OnceValues(func() (sandbox.HostFacts, error) {
			f, err := agent.ReadFacts(c.runsc, c.dataDir, "", version) // at the first push of a memory image
			return sandbox.HostFacts{RunscSHA256: f.RunscSHA256, CPUFeatures: f.CPUFeatures, CacheLineBytes: f.CacheLineBytes}, err
		}),
	})
	if err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	dumpStacksOnUSR1(os.Stderr)
	// The reaper outlives the signal: a clean shutdown still deletes sandboxes
	// (a stop in flight), and runsc waits until they are reaped.
	if err := runsc.ReapSandboxes(context.Background()); err != nil {
		log.Warn("cannot reap sandbox processes; deletes and stops wait for init to reap them", "err", err)
	}
	// Reconcile before serving: nobody sees a state sbxd has not checked.
	if err := mgr.Start(ctx); err != nil {
		return err
	}
	srv := server.New(server.Config{Manager: mgr, Templates: templates, Logger: log, Version: version})
	if c.fleetKubeconfig != "" {
		ag, err := fleetAgent(c, node, mgr, templates, log)
		if err != nil {
			return err
		}
		go ag.Run(ctx)
	}

	var servers []*http.Server
	errc := make(chan error, 3)
	us := server.NewHTTPServer(srv.Handler(""), nil)
	us.BaseContext = srv.BaseContext // srv.Close ends the streams that follow
	servers = append(servers, us)
	go func() { errc <- us.Serve(ls.unix) }()
	log.Info("serving", "socket", c.socket, "data_dir", c.dataDir, "tag", c.tag, "runsc", c.runsc, "version", version)

	if ls.tcp != nil {
		lim := server.NewConnLimiter("tcp", apiConns, log)
		ts := server.NewHTTPServer(srv.Handler(ls.token), lim)
		ts.BaseContext = srv.BaseContext
		servers = append(servers, ts)
		go func() { errc <- ts.Serve(lim.Listener(ls.tcp)) }()
		log.Info("serving", "tcp", ls.tcp.Addr().String())
	}

	if ls.preview != nil {
		ps, err := previewServer(c, srv, mgr, previewConns, log, ls.preview)
		if err != nil {
			return err
		}
		servers = append(servers, ps.srv)
		go func() { errc <- ps.srv.Serve(ps.l) }()
		log.Info("serving previews", "tcp", ps.l.Addr().String(), "domain", c.previewDomain)
	}

	select {
	case <-ctx.Done():
		log.Info("shutting down; sandboxes keep running")
	case err := <-errc:
		return err
	}
	sctx, cancel := context.WithTimeout(context.Background(), c.shutdown)
	defer cancel()
	// Captures in flight finish (bounded); new ones are refused meanwhile.
	if err := mgr.Shutdown(sctx); err != nil {
		log.Warn("captures still in flight at the shutdown deadline; a restart reconciles them", "err", err)
	}
	// streams that follow (events, logs, an exec's output) end now, saying
	// why, rather than hold the shutdown until its deadline
	srv.Close()
	for _, s := range servers {
		_ = s.Shutdown(sctx)
	}
	log.Info("stopped")
	return nil
}

// maxPublishedLayers bounds the digests a SandboxNode lists (about 71
// bytes each, in an object etcd keeps whole).
const maxPublishedLayers = 2000

// fleetAgent makes the node agent of --fleet-kubeconfig. Only what is
// wrong here (a kubeconfig that cannot be read, no runsc to digest) stops
// sbxd; the apiserver being away is logged and retried by the agent.
func fleetAgent(c config, node string, mgr *sandbox.Manager, templates *template.Store, log *slog.Logger) (*agent.Agent, error) {
	addr := c.fleetAddress
	if addr == "" && c.listen != "" {
		addr = "tcp://" + c.listen
	} else if addr == "" {
		addr = "unix://" + c.socket
	}
	facts, err := agent.ReadFacts(c.runsc, c.dataDir, addr, version)
	if err != nil {
		return nil, err
	}
	return agent.New(agent.Config{
		Kubeconfig: c.fleetKubeconfig, Node: node, Namespace: c.fleetNamespace,
		Facts: facts, Source: mgr, Logger: log, Templates: templates.List, Agents: mgr.Agents,
		// what a pull placed here need not fetch: the content store's
		// files, and the template versions (a pulled snapshot's must be here)
		Layers: func() []string {
			held := mgr.HeldLayers(maxPublishedLayers)
			if ts, err := templates.List(); err == nil {
				for _, t := range ts {
					if t.Version != "" && len(held) < maxPublishedLayers {
						held = append(held, t.Version)
					}
				}
			}
			return held
		},
	})
}

// nodeName is this sbxd's name in the fleet of --fleet-kubeconfig ("" for
// none): --node-name, or the hostname's first label. It is a DNS label (no
// dots): its snapshots' and templates' objects are named NAME.ID, and the
// fleet's node restriction (deploy/rbac) tells a node's own by that.
func nodeName(c config) (string, error) {
	if c.fleetKubeconfig == "" {
		return "", nil
	}
	node := c.nodeName
	if node == "" {
		h, err := os.Hostname()
		if err != nil {
			return "", fmt.Errorf("--node-name: none given, and no hostname: %w", err)
		}
		node, _, _ = strings.Cut(strings.ToLower(h), ".")
	}
	if errs := validation.IsDNS1123Label(node); len(errs) > 0 {
		return "", fmt.Errorf("--node-name %q: %s", node, strings.Join(errs, "; "))
	}
	return node, nil
}

// listeners are the addresses sbxd serves on, bound before it starts.
type listeners struct {
	unix    net.Listener
	tcp     net.Listener // nil without --listen
	token   string       // the bearer token of tcp
	preview net.Listener // nil with --preview-listen ""
}

// listen binds every listener sbxd is asked for, and fails, saying which
// and what to do, when one cannot be had. The default preview address is
// the one exception: when it is taken (another sbxd), previews go to a free
// port on the same host, and the log says which.
func listen(c config, log *slog.Logger) (_ *listeners, err error) {
	ls := &listeners{}
	defer func() {
		if err != nil {
			ls.close()
		}
	}()
	if ls.unix, err = listenUnix(c.socket); err != nil {
		return nil, fmt.Errorf("--socket %s: %w", c.socket, err)
	}
	if c.listen != "" {
		if ls.token, err = loadToken(c); err != nil {
			return nil, err
		}
		if ls.tcp, err = net.Listen("tcp", c.listen); err != nil {
			return nil, fmt.Errorf("--listen %s: %w; give a free address, or stop what listens there", c.listen, err)
		}
	}
	if c.previewListen == "" {
		return ls, nil
	}
	ls.preview, err = net.Listen("tcp", c.previewListen)
	if err != nil && !c.previewSet {
		host, _, _ := net.SplitHostPort(c.previewListen)
		if ls.preview, err = net.Listen("tcp", net.JoinHostPort(host, "0")); err == nil {
			log.Warn("the default preview address is taken (another sbxd?); serving previews on another port: pass --preview-listen to choose one",
				"default", c.previewListen, "addr", ls.preview.Addr().String())
		}
	}
	if err != nil {
		return nil, fmt.Errorf("--preview-listen %s: %w; give a free address, or --preview-listen \"\" for no preview URLs", c.previewListen, err)
	}
	return ls, nil
}

// close closes the listeners that were bound.
func (ls *listeners) close() {
	for _, l := range []net.Listener{ls.unix, ls.tcp, ls.preview} {
		if l != nil {
			l.Close()
		}
	}
}

// listenUnix listens on path with mode 0600, taking over a stale socket but
// never one another sbxd still serves.
func listenUnix(path string) (net.Listener, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return nil, err
	}
	if conn, err := net.DialTimeout("unix", path, time.Second); err == nil {
		conn.Close()
		return nil, fmt.Errorf("another sbxd is serving it; stop that one, or give this one its own --socket and --data-dir")
	}
	_ = os.Remove(path)
	old := syscall.Umask(0o177)
	l, err := net.Listen("unix", path)
	syscall.Umask(old)
	if err != nil {
		return nil, err
	}
	if err := os.Chmod(path, 0o600); err != nil {
		l.Close()
		return nil, err
	}
	return l, nil
}

// loadToken returns the TCP bearer token: --token-file, $SBX_TOKEN, or one
// made once and kept in DATA_DIR/token.
func loadToken(c config) (string, error) {
	if c.tokenFile != "" {
		b, err := os.ReadFile(c.tokenFile)
		if err != nil {
			return "", fmt.Errorf("--token-file: %w", err)
		}
		t := strings.TrimSpace(string(b))
		if t == "" {
			return "", fmt.Errorf("--token-file %s is empty", c.tokenFile)
		}
		return t, nil
	}
	if t := os.Getenv("SBX_TOKEN"); t != "" {
		return t, nil
	}
	path := filepath.Join(c.dataDir, "token")
	if b, err := os.ReadFile(path); err == nil && len(strings.TrimSpace(string(b))) > 0 {
		return strings.TrimSpace(string(b)), nil
	}
	var raw [24]byte
	if _, err := rand.Read(raw[:]); err != nil {
		return "", err
	}
	t := hex.EncodeToString(raw[:])
	if err := os.WriteFile(path, []byte(t+"\n"), 0o600); err != nil {
		return "", err
	}
	return t, nil
}

type preview struct {
	srv *http.Server
	l   net.Listener
}

// previewServer makes the preview proxy's server on its listener l.
func previewServer(c config, srv *server.Server, mgr *sandbox.Manager, maxConns int, log *slog.Logger, l net.Listener) (*preview, error) {
	secret, err := loadPreviewKey(c.dataDir)
	if err != nil {
		return nil, err
	}
	proxy, err := server.NewProxy(server.ProxyConfig{
		Manager: mgr, Domain: c.previewDomain, Port: l.Addr().(*net.TCPAddr).Port, Secret: secret,
		Linger: 2 * time.Second, Logger: log,
	})
	if err != nil {
		return nil, err
	}
	srv.SetPreview(proxy)
	lim := server.NewConnLimiter("preview", maxConns, log)
	return &preview{srv: server.NewHTTPServer(proxy, lim), l: lim.Listener(l)}, nil
}

// raiseNofile raises RLIMIT_NOFILE's soft limit to the hard one (children,
// runsc among them, inherit it) and returns the limit sbxd then has.
func raiseNofile() (uint64, error) {
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		return 1024, err
	}
	if lim.Cur < lim.Max {
		lim.Cur = lim.Max
		if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
			var cur syscall.Rlimit
			_ = syscall.Getrlimit(syscall.RLIMIT_NOFILE, &cur)
			return cur.Cur, err
		}
	}
	return lim.Cur, nil
}

// loadPreviewKey returns the secret that signs private preview tokens: made
// once per data dir and kept in DATA_DIR/preview.key (0600), so tokens
// outlive a restart.
func loadPreviewKey(dataDir string) ([]byte, error) {
	path := filepath.Join(dataDir, "preview.key")
	if b, err := os.ReadFile(path); err == nil {
		key, err := hex.DecodeString(strings.TrimSpace(string(b)))
		if err != nil || len(key) < 32 {
			return nil, fmt.Errorf("%s: want 32 or more hex-encoded bytes; remove it to make a new one (outstanding private preview URLs then stop working)", path)
		}
		return key, nil
	} else if !errors.Is(err, os.ErrNotExist) {
		return nil, err
	}
	key := make([]byte, 32)
	if _, err := rand.Read(key); err != nil {
		return nil, err
	}
	if err := os.WriteFile(path, []byte(hex.EncodeToString(key)+"\n"), 0o600); err != nil {
		return nil, err
	}
	return key, nil
}

// cleanup removes what a stopped sbxd leaves on the host for its sandboxes
// (firewall chains, cgroup parents) once it has none left.
func cleanup(st *store.Store, nets *netns.Manager) error {
	sbs, err := st.Sandboxes(context.Background())
	if err != nil {
		return err
	}
	pooled := 0
	for _, sb := range sbs {
		if sb.Meta[api.MetaPool] != "" {
			pooled++
		}
	}
	switch {
	case pooled > 0 && pooled == len(sbs):
		return fmt.Errorf("cleanup: %d sandboxes of a warm pool remain; start sbxd once without --warm, which removes them, then clean up", pooled)
	case len(sbs) > 0:
		return fmt.Errorf("cleanup: %d sandboxes remain (%d of them a warm pool's); delete them first (`sbx delete`; sbxd without --warm removes the pool's)", len(sbs), pooled)
	}
	ids, err := nets.List()
	if err != nil {
		return err
	}
	for _, id := range ids {
		if err := nets.Delete(id); err != nil {
			return err
		}
	}
	return nets.Cleanup()
}

// lockWait is how long sbxd waits for the data dir's lock before it says
// another sbxd holds it.
const lockWait = 3 * time.Second

// lockDataDir takes an exclusive lock on the data dir for as long as sbxd
// runs: two daemons on one data dir would both reconcile, reap and sweep
// the same sandboxes.
func lockDataDir(dir string) (unlock func(), err error) {
	path := filepath.Join(dir, "sbxd.lock")
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, fmt.Errorf("lock the data dir: %w", err)
	}
	// A daemon killed just now may leave its lock for a moment: a child it
	// was forking shares the lock until it execs (then close-on-exec lets
	// go). A live sbxd holds it for good, and is refused after the wait.
	err = syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
	for deadline := time.Now().Add(lockWait); errors.Is(err, syscall.EWOULDBLOCK) && time.Now().Before(deadline); {
		time.Sleep(50 * time.Millisecond)
		err = syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
	}
	if err != nil {
		b, _ := os.ReadFile(path)
		f.Close()
		holder := strings.TrimSpace(string(b))
		if holder == "" {
			holder = "another process"
		} else {
			holder = "sbxd pid " + holder
		}
		return nil, fmt.Errorf("the data dir %s is in use by %s: two sbxd cannot share a data dir; stop that one, or pass another --data-dir", dir, holder)
	}
	_ = f.Truncate(0)
	_, _ = f.WriteAt([]byte(fmt.Sprintf("%d\n", os.Getpid())), 0)
	return func() { f.Close() }, nil
}
