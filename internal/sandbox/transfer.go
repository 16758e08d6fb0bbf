package sandbox

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"sort"
	"strings"
	"syscall"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/remote/transport"

	"sbx.dev/sbx/api"
	"sbx.dev/sbx/internal/runsc"
	"sbx.dev/sbx/internal/snapstore"
	"sbx.dev/sbx/internal/store"
	"sbx.dev/sbx/internal/template"
)

// Snapshots carried between sbxds through an OCI registry (issue 24's
// portable snapshots, internal/snapstore). A push sends a snapshot's image
// as it is, memory and all, with a manifest saying what a node must be to
// restore it. A pull fetches what the node lacks into its content store
// (DATA_DIR/blobs), puts the image together from it, and records the
// snapshot: an image nothing names yet is no one's, so a crash before the
// record leaves only an image dir no record names (removed when sbxd
// starts again, leftovers.go) and store files no image links (pruned by
// the next pull or sweep).
//
// The memory moves where it can be restored (memoryFits: the same runsc
// build, a CPU with the image's features and cache line); elsewhere a pulled
// snapshot is recorded as a disk snapshot, its memory files left in the
// registry, and the pull says why (PullResult.MemoryLeft). A memory image
// names the disk its sandbox booted on by the pushing node's path (the
// annotation dev.gvisor.tar.rootfs.upper); a restore does not read that
// tar, and patched runsc lets it be another path (gVisor patch 07), so the
// pulling node names a disk of its own.

// HostFacts are what a memory image needs of the host it restores on, as a
// push records them: runsc's digest, the CPU's features and cache line.
type HostFacts struct {
	RunscSHA256    string
	CPUFeatures    []string
	CacheLineBytes int
}

// transfers owns the node's content store of pushed and pulled files.
type transfers struct {
	// sem (one slot) keeps pulls and the store's prune apart: a pull's
	// fetched file is linked by no image until the pull assembles it. A
	// channel, not a mutex: a pull holds it while a registry sends, as
	// long as that takes, so another pull waits only as long as its own
	// context, and the sweep's prune not at all
	sem   chan struct{}
	store *snapstore.Store
	opts  []remote.Option
}

// transferRecord is the part of a snapshot's record its artifact carries
// for sbxd (the manifest's Record).
type transferRecord struct {
	SandboxID string    `json:"sandboxId"`
	CreatedAt time.Time `json:"createdAt"`
	CPUs      float64   `json:"cpus,omitempty"`
	MemLimit  int64     `json:"memLimit,omitempty"`
	Pids      int       `json:"pids,omitempty"`
	DiskLimit int64     `json:"diskLimit,omitempty"`
	Network   string    `json:"network,omitempty"`
	// Disk is the tar its sandbox booted on, on the node that pushed it,
	// as its memory image names it: a pull names a disk of its own.
	Disk string `json:"disk,omitempty"`
	// Agent is the agent its memory's processes run (the image's note,
	// imageAgentFile): a node without it keeps the disk alone.
	Agent string `json:"agent,omitempty"`
}

func (m *Manager) transferStore() (*transfers, error) {
	m.xfer.once.Do(func() {
		st, err := snapstore.Open(filepath.Join(m.cfg.DataDir, "blobs"))
		m.xfer.err = err
		m.xfer.t = &transfers{sem: make(chan struct{}, 1), store: st, opts: append([]remote.Option{remote.WithAuthFromKeychain(authn.DefaultKeychain)}, m.cfg.RegistryOptions...)}
	})
	return m.xfer.t, m.xfer.err
}

// PushSnapshot pushes snapshot name's image to req.Ref.
func (m *Manager) PushSnapshot(ctx context.Context, name string, req api.PushRequest) (*api.PushResult, error) {
	if err := req.Validate(); err != nil {
		return nil, err
	}
	sn, err := m.cfg.Store.Snapshot(ctx, name)
	if err != nil {
		return nil, err
	}
	if !m.images.isComplete(sn.ID) {
		return nil, api.Errorf(api.ErrUnavailable, "snapshot %s has no complete image on disk", sn.Name)
	}
	t, err := m.transferStore()
	if err != nil {
		return nil, err
	}
	agent := notedAgent(m.images.dir(sn.ID))
	rec, _ := json.Marshal(transferRecord{SandboxID: sn.SandboxID, CreatedAt: sn.CreatedAt, CPUs: sn.CPUs, MemLimit: sn.MemLimit,
		Pids: sn.Pids, DiskLimit: sn.DiskLimit, Network: sn.Network, Disk: sn.Disk, Agent: agent})
	man := snapstore.Manifest{Name: sn.Name, Memory: sn.Memory, Template: sn.Template, TemplateVersion: sn.TemplateVersion, Record: rec}
	if sn.Memory {
		man.Agent = agent
	}
	if sn.Memory && m.cfg.HostFacts != nil {
		f, err := m.cfg.HostFacts()
		if err != nil {
			return nil, fmt.Errorf("push %s: %w", sn.Name, err)
		}
		man.RunscSHA256, man.CPUFeatures, man.CacheLineBytes = f.RunscSHA256, f.CPUFeatures, f.CacheLineBytes
	}
	// the node's own marker of a whole image is written by the node that
	// puts it together
	skip := func(p string) bool { return p == completeFile }
	// a freeze's image is its memory alone: its disk is the tar its boot
	// started from (sn.Disk; the changes since are in the memory), which
	// a pull needs as the image's disk.tar
	var extra map[string]string
	if !fileExists(m.images.disk(sn.ID)) {
		disk := sn.Disk
		if disk == "" {
			// it booted on its template alone: an empty disk
			f, err := os.CreateTemp(m.cfg.DataDir, ".empty-disk-*.tar")
			if err != nil {
				return nil, fmt.Errorf("push %s: %w", sn.Name, err)
			}
			defer os.Remove(f.Name())
			_, werr := f.Write(make([]byte, 1024)) // a tar's end: two zero blocks
			if cerr := f.Close(); werr != nil || cerr != nil {
				return nil, fmt.Errorf("push %s: an empty disk: %v", sn.Name, errors.Join(werr, cerr))
			}
			disk = f.Name()
		}
		extra = map[string]string{diskTar: disk}
	}
	ref, pushed, err := t.store.PushWith(ctx, req.Ref, m.images.dir(sn.ID), extra, man, skip, t.opts...)
	if err != nil {
		return nil, registryError("push", req.Ref, err)
	}
	res := &api.PushResult{Ref: ref, Files: len(pushed.Files), Memory: sn.Memory}
	for _, f := range pushed.Files {
		res.Bytes += f.Size
	}
	m.log.Info("pushed a snapshot", "snapshot", sn.Name, "ref", ref, "files", res.Files, "bytes", res.Bytes)
	return res, nil
}

// PullSnapshot pulls the snapshot artifact req.Ref and records it under
// req.Name (or the name it was pushed with).
func (m *Manager) PullSnapshot(ctx context.Context, req api.PullRequest) (*api.PullResult, error) {
	if err := req.Validate(); err != nil {
		return nil, err
	}
	t, err := m.transferStore()
	if err != nil {
		return nil, err
	}
	man, ref, err := snapstore.Fetch(ctx, req.Ref, t.opts...)
	if err != nil {
		return nil, registryError("pull", req.Ref, err)
	}
	var rec transferRecord
	if len(man.Record) > 0 {
		if err := json.Unmarshal(man.Record, &rec); err != nil {
			return nil, api.Errorf(api.ErrInvalid, "pull %s: its record: %v", req.Ref, err)
		}
	}
	name := req.Name
	if name == "" {
		name = man.Name
	}
	if err := ValidName(name); err != nil {
		return nil, err
	}
	if taken, err := m.cfg.Store.SnapshotNameTaken(ctx, name); err != nil {
		return nil, err
	} else if taken {
		return nil, api.Errorf(api.ErrConflict, "snapshot name %q is taken here: pull it under another (--name)", name)
	}
	// the record is the registry's word: held to what this node takes
	if err := checkNetwork(rec.Network); err != nil {
		return nil, api.Errorf(api.ErrInvalid, "pull %s: %v", req.Ref, err)
	}
	if checkCPUs(rec.CPUs, runtime.NumCPU()) != nil {
		rec.CPUs = 0 // more than this host has: its default
	}
	memLimit, _, diskLimit, err := m.cfg.Limits.resolve(rec.MemLimit, rec.Pids, rec.DiskLimit, hostMemory())
	if err != nil {
		return nil, api.Errorf(api.ErrInvalid, "pull %s: its limits do not fit this node: %v", req.Ref, err)
	}
	if !sandboxIDRE.MatchString(rec.SandboxID) {
		rec.SandboxID = ""
	} else if _, err := m.cfg.Store.Sandbox(ctx, rec.SandboxID); err == nil {
		rec.SandboxID = "" // a sandbox of this node's: not the one it was taken of
	}
	// the template's name is the registry's word: shown in every listing
	// and event of the snapshot and its sandboxes
	if err := template.ValidName(man.Template); err != nil {
		return nil, api.Errorf(api.ErrInvalid, "pull %s: %v", req.Ref, err)
	}
	// the disk's changes are changes to one template version: it must be
	// here, and stay while the record is made
	if _, err := m.cfg.Templates.Version(man.TemplateVersion); err != nil {
		return nil, api.Errorf(api.ErrConflict, "pull %s: it is of template %s at version %s, which this node does not have (%v): import or build that template here first",
			req.Ref, man.Template, shortVersion(man.TemplateVersion), err)
	}
	m.versions.mu.Lock()
	release := m.versions.takeLocked(man.TemplateVersion)
	m.versions.mu.Unlock()
	defer release()

	// The disk moves always; the memory where this node can restore it
	// (memoryFits). Any other file, COMPLETE above all, is the registry's
	// and no image's: a COMPLETE hard-linked from the store would be
	// written through by images.complete, into the store and every image
	// sharing its inode.
	left := ""
	memory := man.Memory
	if memory {
		if left = m.memoryFits(man); left != "" {
			memory = false
		} else if rec.Agent == agentLegacy || !m.hasAgent(rec.Agent) {
			// (a legacy agent is whatever another node had last)
			// its processes would wake up on another binary than theirs
			left = fmt.Sprintf("the agent its processes run (%q) is not on this node: it is recorded as a disk snapshot and boots from its disk", rec.Agent)
			memory = false
		}
	}
	files := man
	files.Files = nil
	var memBytes int64
	for _, f := range man.Files {
		p := path.Clean(f.Path)
		switch {
		case p == diskTar:
			files.Files = append([]snapstore.File{f}, files.Files...) // first: checked below
		case memory && path.Dir(p) == memoryDir && p != memoryDir+"/"+completeFile:
			files.Files = append(files.Files, f)
			memBytes = addSizes(memBytes, f.Size)
		}
	}
	if !hasFile(files, diskTar) {
		return nil, api.Errorf(api.ErrInvalid, "pull %s: its image has no %s", req.Ref, diskTar)
	}
	if memory {
		if err := checkpointListed(files); err != nil {
			return nil, api.Errorf(api.ErrInvalid, "pull %s: it says it holds memory, and %v", req.Ref, err)
		}
	}
	// the disk's size is the registry's word too: no more than a sandbox
	// here may write (a record without a limit: this node's maximum), and
	// room for it, before a byte of it is taken
	bound := diskLimit
	if rec.DiskLimit <= 0 && m.cfg.Limits.MaxDisk > 0 {
		bound = m.cfg.Limits.MaxDisk
	}
	if max := maxDiskTar(bound); max > 0 && files.Files[0].Size > max {
		return nil, api.Errorf(api.ErrInvalid, "pull %s: its %s is %s, more than a sandbox here may have (%s)", req.Ref, diskTar, fmtBytes(files.Files[0].Size), fmtBytes(max))
	}
	// and the memory's: no more than the sandbox's memory limit holds,
	// with room for the kernel's own state
	if memory {
		if err := checkMemoryImage(memBytes, memLimit); err != nil {
			return nil, api.Errorf(api.ErrInvalid, "pull %s: %v", req.Ref, err)
		}
	}
	var need int64
	for _, f := range files.Files {
		if !t.store.Has(f.Digest) {
			need = addSizes(need, f.Size)
		}
	}
	var sfs syscall.Statfs_t
	if need > 0 && syscall.Statfs(m.cfg.DataDir, &sfs) == nil {
		if free := int64(sfs.Bavail) * sfs.Bsize; need > free-minFree {
			return nil, api.Errorf(api.ErrUnavailable, "pull %s: it needs %s here, and sbxd's data dir %s has %s free: free some space there", req.Ref, fmtBytes(need), m.cfg.DataDir, fmtBytes(free))
		}
	}
	if err := m.checkRoom("pull"); err != nil {
		return nil, err
	}
	img := newID("im_")
	select {
	case t.sem <- struct{}{}:
	case <-ctx.Done():
		return nil, fmt.Errorf("pull %s: waiting for another pull: %w", req.Ref, ctx.Err())
	}
	if _, err := t.store.Prune(); err != nil {
		m.log.Warn("prune the content store", "err", err)
	}
	pulled, err := t.store.Pull(ctx, ref, files, m.images.dir(img), t.opts...)
	<-t.sem
	if err != nil {
		_ = m.images.remove(img)
		return nil, registryError("pull", req.Ref, err)
	}
	crashPoint("pull:assembled")
	// a disk capture that cannot be restored is never a success: checked
	// whether or not the record names a limit (the registry's choice)
	if err := checkDiskTar(m.images.disk(img), diskLimit); err != nil {
		_ = m.images.remove(img)
		return nil, api.Errorf(api.ErrInvalid, "pull %s: %v", req.Ref, err)
	}
	// the manifest said so; the files must too, as a capture's do. And
	// the checkpoint names the mounts and capabilities its restore gives
	// the bundle: the pushing node's word, held to what sbx's have been.
	if memory {
		err := verifyCheckpoint(m.images.mem(img))
		if err == nil {
			err = runsc.CheckImageSpec(m.images.mem(img))
		}
		if err != nil {
			_ = m.images.remove(img)
			return nil, api.Errorf(api.ErrInvalid, "pull %s: %v", req.Ref, err)
		}
	}
	if memory {
		if err := noteImageAgent(rec.Agent, "", m.images.dir(img)); err != nil {
			_ = m.images.remove(img)
			return nil, fmt.Errorf("pull %s: note its agent: %w", req.Ref, err)
		}
	}
	size, err := m.images.complete(img, true)
	if err != nil {
		_ = m.images.remove(img)
		return nil, err
	}
	// A memory image's restore names a disk (the rootfs upper tar), which
	// it does not read (gVisor patch 07 lets it be another path than the
	// pushing node's): this node's own, made from the image's disk.
	var disk string
	if memory {
		if disk, err = m.storage.newDisk(m.images.disk(img)); err != nil {
			_ = m.images.remove(img)
			return nil, fmt.Errorf("pull %s: %w", req.Ref, err)
		}
	}
	sn := &store.Snapshot{
		Name: name, ID: img, SandboxID: rec.SandboxID, Template: man.Template, Memory: memory, Disk: disk,
		CPUs: rec.CPUs, MemLimit: rec.MemLimit, CreatedAt: m.now(), Size: size,
		TemplateVersion: man.TemplateVersion, Pids: rec.Pids, DiskLimit: rec.DiskLimit, Network: rec.Network,
	}
	err = m.cfg.Store.Update(ctx, func(tx *store.Store) error {
		if err := tx.CreateSnapshot(ctx, sn); err != nil {
			return err
		}
		// the user's, as a kept snapshot is: no sandbox here holds it
		return tx.KeepSnapshot(ctx, name)
	})
	if err != nil {
		_ = m.images.remove(img)
		m.storage.releaseDisk(context.WithoutCancel(ctx), disk)
		return nil, err
	}
	sn.Kept = true
	m.log.Info("pulled a snapshot", "snapshot", name, "ref", ref, "pulledBytes", pulled, "memory", memory, "memoryLeft", left)
	return &api.PullResult{Snapshot: *m.snapshotAPI(sn), Ref: ref, PulledBytes: pulled, MemoryLeft: left}, nil
}

// HeldLayers are the digests of the files this node's content store holds
// (at most limit): what a pull here does not fetch again. None before the
// store was first used.
func (m *Manager) HeldLayers(limit int) []string {
	if _, err := os.Stat(filepath.Join(m.cfg.DataDir, "blobs")); err != nil {
		return nil
	}
	t, err := m.transferStore()
	if err != nil {
		return nil
	}
	ds, _ := t.store.Digests()
	return ds[:min(len(ds), max(limit, 0))]
}

// pruneBlobs removes the content store's files no image links any more
// (a pulled snapshot deleted), if the store was ever made.
func (m *Manager) pruneBlobs() {
	if _, err := os.Stat(filepath.Join(m.cfg.DataDir, "blobs")); err != nil {
		return
	}
	t, err := m.transferStore()
	if err != nil {
		return
	}
	select {
	case t.sem <- struct{}{}:
	default:
		return // a pull is under way, and prunes before it takes anything
	}
	freed, err := t.store.Prune()
	<-t.sem
	if err != nil {
		m.log.Warn("prune the content store", "err", err)
	} else if freed > 0 {
		m.log.Info("pruned the content store", "bytes", freed)
	}
}

// sandboxIDRE is what newID("sb_") makes.
var sandboxIDRE = regexp.MustCompile(`^sb_[a-z2-7]{10}$`)

func hasFile(m snapstore.Manifest, p string) bool {
	for _, f := range m.Files {
		if path.Clean(f.Path) == p {
			return true
		}
	}
	return false
}

// checkpointListed: a memory image's files are a checkpoint, as a capture
// here verifies its own (verifyCheckpoint), by the manifest's word: a
// snapshot recorded with memory that no restore takes fails every create
// from it, and sbxd's reconcile holds its image incomplete.
func checkpointListed(m snapstore.Manifest) error {
	for _, name := range []string{"checkpoint.img", "pages_meta.img", "pages.img"} {
		i := slices.IndexFunc(m.Files, func(f snapstore.File) bool { return path.Clean(f.Path) == memoryDir+"/"+name })
		switch {
		case i < 0:
			return fmt.Errorf("its image has no %s/%s", memoryDir, name)
		case name == "checkpoint.img" && m.Files[i].Size == 0:
			return fmt.Errorf("its %s/%s is empty", memoryDir, name)
		}
	}
	return nil
}

// registryError says what went wrong talking to a registry: one that does
// not answer is unavailable; one that refuses names why.
func registryError(verb, ref string, err error) error {
	var terr *transport.Error
	switch {
	case hasKind(err):
		return err
	case errors.Is(err, snapstore.ErrManifest):
		return api.Errorf(api.ErrInvalid, "%s %s: %v", verb, ref, err)
	case errors.Is(err, syscall.ENOSPC):
		return api.Errorf(api.ErrUnavailable, "%s %s: sbxd's data dir is full: %v; free some space there", verb, ref, err)
	case errors.As(err, &terr):
		err = scrubRegistryError(err, terr)
		switch terr.StatusCode {
		case 401, 403:
			return api.Errorf(api.ErrForbidden, "%s %s: the registry refused: %v (sbxd uses its user's docker config for credentials)", verb, ref, err)
		case 404:
			return api.Errorf(api.ErrNotFound, "%s %s: the registry has no such artifact: %v", verb, ref, err)
		}
		return api.Errorf(api.ErrUnavailable, "%s %s: the registry answered: %v", verb, ref, err)
	case isNetError(err), strings.Contains(err.Error(), "connection refused"):
		return api.Errorf(api.ErrUnavailable, "%s %s: the registry does not answer: %v", verb, ref, err)
	case strings.Contains(err.Error(), "could not parse reference"), strings.Contains(err.Error(), "repository can only contain"):
		return api.Errorf(api.ErrInvalid, "%s %s: %v", verb, ref, err)
	}
	return fmt.Errorf("%s %s: %w", verb, ref, err)
}

// isNetError reports whether err is the network's: a syscall.Errno is a
// net.Error too, and one of this node's own files (a full disk) is no
// registry's fault.
func isNetError(err error) bool {
	var nerr net.Error
	if !errors.As(err, &nerr) {
		return false
	}
	_, local := nerr.(syscall.Errno)
	return !local
}

// scrubRegistryError drops the raw body of a refusal that is no registry's
// (no structured errors): a registry may redirect a GET anywhere the node
// reaches, and what a service there says is not the client's to read.
func scrubRegistryError(err error, terr *transport.Error) error {
	if len(terr.Errors) > 0 {
		return err
	}
	bare := fmt.Sprintf("unexpected status code %d", terr.StatusCode)
	if terr.Request != nil {
		u := *terr.Request.URL
		u.RawQuery, u.User, u.Fragment = "", nil, ""
		bare = fmt.Sprintf("%s %s: %s", terr.Request.Method, u.String(), bare)
	}
	return errors.New(strings.Replace(err.Error(), terr.Error(), bare, 1))
}

// hasKind reports whether err says already what kind of error it is.
func hasKind(err error) bool {
	_, code := api.StatusOf(err)
	return code != "internal" || errors.Is(err, api.ErrInternal)
}

// addSizes adds two sizes of a manifest (each the registry's word, and
// not negative), no more than math.MaxInt64: the registry picks them, and
// a sum wrapped round passes every bound.
func addSizes(a, b int64) int64 {
	if b > math.MaxInt64-a {
		return math.MaxInt64
	}
	return a + b
}

// maxKernelState bounds what a memory image holds beyond the sandbox's
// pages: the sentry's own state (tasks, files, sockets, the page map).
const maxKernelState = 256 << 20

// checkMemoryImage: a memory image of memBytes is no more than a sandbox
// of memLimit can have written, with its kernel's state.
func checkMemoryImage(memBytes, memLimit int64) error {
	if max := memLimit + maxKernelState; memBytes > max {
		return fmt.Errorf("its memory image is %s, more than a sandbox of %s of memory can have written (%s)", fmtBytes(memBytes), fmtBytes(memLimit), fmtBytes(max))
	}
	return nil
}

// memoryFits says why this node cannot restore a pushed memory image ("" if
// it can): runsc restores only an image of its own build (its version
// string says nothing: sbx's runsc has none, so the binary's digest is the
// build), on a CPU with every feature the image was taken with and the same
// cache line.
func (m *Manager) memoryFits(man snapstore.Manifest) string {
	const boots = ": it is recorded as a disk snapshot and boots from its disk"
	if m.cfg.HostFacts == nil {
		return "this node does not know its runsc's digest or CPU" + boots
	}
	f, err := m.cfg.HostFacts()
	if err != nil {
		return fmt.Sprintf("this node cannot read its runsc's digest or CPU (%v)%s", err, boots)
	}
	return memoryFitsHost(man, f)
}

func memoryFitsHost(man snapstore.Manifest, f HostFacts) string {
	const boots = ": it is recorded as a disk snapshot and boots from its disk"
	switch {
	case man.RunscSHA256 == "":
		return "its memory image does not say which runsc took it" + boots
	case man.RunscSHA256 != f.RunscSHA256:
		return fmt.Sprintf("its memory was taken by another runsc (sha256 %.12s, this node's is %.12s)%s", man.RunscSHA256, f.RunscSHA256, boots)
	case man.CacheLineBytes != f.CacheLineBytes:
		return fmt.Sprintf("its memory was taken on a CPU with a %d-byte cache line, this node's is %d bytes%s", man.CacheLineBytes, f.CacheLineBytes, boots)
	}
	have := make(map[string]bool, len(f.CPUFeatures))
	for _, c := range f.CPUFeatures {
		have[c] = true
	}
	var missing []string
	for _, c := range man.CPUFeatures {
		if !have[c] {
			missing = append(missing, c)
		}
	}
	if len(missing) > 0 {
		sort.Strings(missing)
		return fmt.Sprintf("its memory was taken on a CPU with features this node's lacks (%s)%s", strings.Join(missing, " "), boots)
	}
	return ""
}
