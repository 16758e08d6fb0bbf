package runsc

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"sbx.dev/sbx/internal/wire/agentwire"
)

// AgentDir is where the sbx agent directory is mounted inside every sandbox.
const AgentDir = "/.sbx"

// AgentPath is the agent binary as seen from inside a sandbox.
const AgentPath = AgentDir + "/sbx-agent"

// RunSbx is where the agent keeps its bookkeeping inside a sandbox, a tmpfs
// of runSbxSize.
const (
	RunSbx     = "/run/sbx"
	runSbxSize = "512m"
)

// DefaultPath is the PATH of every process sbx starts in a sandbox.
const DefaultPath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// SpecOptions describes one sandbox's OCI spec.
type SpecOptions struct {
	Hostname string
	// Rootfs is the template's root filesystem, shared read-only by sandboxes.
	Rootfs string
	// AgentDir is the host directory holding sbx-agent.
	AgentDir string
	// EtcDir is the host directory holding this sandbox's resolv.conf, hosts and hostname.
	EtcDir string
	// NetNS is the path of the sandbox's network namespace; "" gives it a
	// new, empty one (runsc --network=none: loopback only).
	NetNS string
	// CgroupsPath places the sandbox in its own cgroup.
	CgroupsPath string
	// CPUs limits CPU time (0: no limit); Memory limits memory in bytes (0: no limit).
	CPUs   float64
	Memory int64
	// Pids bounds the processes of each user inside (0: no limit).
	Pids int
	Env  []string
	// Annotations go into the spec as they are.
	Annotations map[string]string
	// ChannelDir is the host directory bound read-only at
	// agentwire.ChannelDir, where sbxd listens for init (the exec channel);
	// "" binds none.
	ChannelDir string
}

// WriteBundle writes config.json for o into bundle.
func WriteBundle(bundle string, o SpecOptions) error {
	spec := Spec(o)
	b, err := json.MarshalIndent(spec, "", "  ")
	if err != nil {
		return err
	}
	if err := os.MkdirAll(bundle, 0o700); err != nil {
		return err
	}
	tmp := filepath.Join(bundle, "config.json.tmp")
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		return fmt.Errorf("write bundle: %w", err)
	}
	return os.Rename(tmp, filepath.Join(bundle, "config.json"))
}

// Spec returns the OCI spec of a sandbox: the agent's init as the first
// process, the template as a root sbx never writes to (runsc's overlay takes
// the writes), the agent bound in, and resolv.conf, hosts and hostname for
// init to put in /etc.
func Spec(o SpecOptions) *specs.Spec {
	env := append([]string{"PATH=" + DefaultPath, "HOME=/root", "TERM=xterm"}, o.Env...)
	s := &specs.Spec{
		Version: specs.Version,
		Process: &specs.Process{
			User: specs.User{UID: 0, GID: 0},
			Args: []string{AgentPath, "init"},
			Env:  env,
			Cwd:  "/",
			Capabilities: &specs.LinuxCapabilities{
				Bounding:  defaultCaps,
				Effective: defaultCaps,
				Permitted: defaultCaps,
			},
			Rlimits: rlimits(o.Pids),
		},
		Root:        &specs.Root{Path: o.Rootfs, Readonly: false},
		Hostname:    o.Hostname,
		Annotations: o.Annotations,
		Mounts: []specs.Mount{
			{Destination: "/proc", Type: "proc", Source: "proc"},
			{Destination: "/dev", Type: "tmpfs", Source: "tmpfs", Options: []string{"nosuid", "strictatime", "mode=755", "size=65536k"}},
			{Destination: "/dev/pts", Type: "devpts", Source: "devpts", Options: []string{"nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620"}},
			{Destination: "/dev/shm", Type: "tmpfs", Source: "shm", Options: []string{"nosuid", "noexec", "nodev", "mode=1777"}},
			// the agent's bookkeeping (execs' output and exit codes): in the
			// sandbox's memory, so that a sandbox whose disk is full still runs
			// and reports commands
			{Destination: RunSbx, Type: "tmpfs", Source: "sbx", Options: []string{"nosuid", "nodev", "mode=755", "size=" + runSbxSize}},
			{Destination: "/sys", Type: "sysfs", Source: "sysfs", Options: []string{"nosuid", "noexec", "nodev", "ro"}},
			{Destination: AgentDir, Type: "bind", Source: o.AgentDir, Options: []string{"rbind", "ro"}},
			// the sandbox's resolv.conf, hosts and hostname, which init copies
			// into /etc at boot: a bind of them there would let the sandbox
			// write the host's disk past its disk limit
			{Destination: RunSbx + "/etc", Type: "bind", Source: o.EtcDir, Options: []string{"rbind", "ro"}},
		},
		Linux: &specs.Linux{
			CgroupsPath: o.CgroupsPath,
			Namespaces: []specs.LinuxNamespace{
				{Type: specs.PIDNamespace},
				{Type: specs.IPCNamespace},
				{Type: specs.UTSNamespace},
				{Type: specs.MountNamespace},
				// without a path, runsc makes a fresh namespace (network none)
				{Type: specs.NetworkNamespace, Path: o.NetNS},
			},
			Resources: resources(o),
		},
	}
	if o.ChannelDir != "" {
		s.Mounts = append(s.Mounts, specs.Mount{Destination: agentwire.ChannelDir, Type: "bind", Source: o.ChannelDir, Options: []string{"rbind", "ro"}})
	}
	return s
}

// Process returns the OCI process of an exec: root, the sandbox's default
// environment overridden by env (later entries win: runsc's own --env
// appends, and most programs read the first of two equal keys), in cwd.
func Process(args, env []string, cwd string) *specs.Process {
	if cwd == "" {
		cwd = "/"
	}
	merged := []string{"PATH=" + DefaultPath, "HOME=/root", "TERM=xterm"}
	index := map[string]int{}
	for i, kv := range merged {
		k, _, _ := strings.Cut(kv, "=")
		index[k] = i
	}
	for _, kv := range env {
		k, _, _ := strings.Cut(kv, "=")
		if i, ok := index[k]; ok {
			merged[i] = kv
			continue
		}
		index[k] = len(merged)
		merged = append(merged, kv)
	}
	return &specs.Process{
		User: specs.User{UID: 0, GID: 0},
		Args: args,
		Env:  merged,
		Cwd:  cwd,
		Capabilities: &specs.LinuxCapabilities{
			Bounding:  defaultCaps,
			Effective: defaultCaps,
			Permitted: defaultCaps,
		},
	}
}

// WriteProcess writes p as a process.json for ExecOptions.Process.
func WriteProcess(path string, p *specs.Process) error {
	b, err := json.Marshal(p)
	if err != nil {
		return err
	}
	return os.WriteFile(path, b, 0o600)
}

// rlimits are every process's limits: RLIMIT_NPROC is how a sandbox's
// processes are bounded, since gVisor's own kernel enforces it (the host's
// pids cgroup only sees the sentry's threads). Open files are as systemd
// gives them: 1024 soft, as select(2) and tools that walk every descriptor
// (lsof took 2 s at a million) expect, and a high hard limit a program may
// raise its own to.
func rlimits(pids int) []specs.POSIXRlimit {
	r := []specs.POSIXRlimit{{Type: "RLIMIT_NOFILE", Hard: 1 << 20, Soft: 1024}}
	if pids > 0 {
		r = append(r, specs.POSIXRlimit{Type: "RLIMIT_NPROC", Hard: uint64(pids), Soft: uint64(pids)})
	}
	return r
}

// hostPidsHeadroom is what the host's pids cgroup allows beyond a sandbox's
// own limit: the sentry's and gofer's threads, and systrap's stubs.
const hostPidsHeadroom = 1024

func resources(o SpecOptions) *specs.LinuxResources {
	r := &specs.LinuxResources{}
	if o.Pids > 0 {
		// a backstop on the host, far above what the sandbox may use
		r.Pids = &specs.LinuxPids{Limit: int64(2*o.Pids + hostPidsHeadroom)}
	}
	if o.Memory > 0 {
		m := o.Memory
		r.Memory = &specs.LinuxMemory{Limit: &m}
	}
	if o.CPUs > 0 {
		period := uint64(100000)
		quota := int64(o.CPUs * float64(period))
		r.CPU = &specs.LinuxCPU{Period: &period, Quota: &quota}
	}
	return r
}

// defaultCaps is what root inside a sandbox may do: the set docker gives a
// container, plus CAP_SYS_PTRACE, which gdb needs to attach to processes it
// did not start (hunt's evidence, exec --on-crash). No CAP_SYS_ADMIN: root
// inside cannot mount over /.sbx and answer in the agent's place. No
// CAP_NET_ADMIN: it cannot change the sandbox's addresses or routes.
var defaultCaps = []string{
	"CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_FOWNER", "CAP_FSETID", "CAP_KILL",
	"CAP_SETGID", "CAP_SETUID", "CAP_SETPCAP", "CAP_NET_BIND_SERVICE", "CAP_NET_RAW",
	"CAP_SYS_CHROOT", "CAP_MKNOD", "CAP_AUDIT_WRITE", "CAP_SETFCAP",
	"CAP_SYS_PTRACE",
}

// legacyCaps is the set sandboxes had before defaultCaps was narrowed. An
// image taken then is restored with the set it was taken with (runsc
// refuses a restore whose capabilities differ), and with no capability
// outside this set, whatever the image claims.
var legacyCaps = []string{
	"CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_DAC_READ_SEARCH", "CAP_FOWNER", "CAP_FSETID",
	"CAP_KILL", "CAP_SETGID", "CAP_SETUID", "CAP_SETPCAP", "CAP_NET_BIND_SERVICE",
	"CAP_NET_RAW", "CAP_SYS_CHROOT", "CAP_MKNOD", "CAP_AUDIT_WRITE", "CAP_SETFCAP",
	"CAP_SYS_PTRACE", "CAP_NET_ADMIN", "CAP_SYS_ADMIN",
}

// DefaultCapabilities returns the capabilities of every process sbx starts
// in a sandbox.
func DefaultCapabilities() []string { return append([]string(nil), defaultCaps...) }
