package sandbox

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"
	"unicode/utf8"

	"sbx.dev/sbx/api"
	"sbx.dev/sbx/internal/atomicfile"
	"sbx.dev/sbx/internal/runsc"
	"sbx.dev/sbx/internal/store"
	"sbx.dev/sbx/internal/wire/freezewire"
)

// A freeze is a capture a sandbox takes of itself, at the instant a program
// inside asks (/.sbx/freeze): gVisor's application-driven checkpoint. Each
// boot of a sandbox (a create, a resume, a fork or a sandbox made from a
// memory snapshot) is armed with a slot, DATA_DIR/freeze/ID/SLOT, into
// which gVisor writes the whole sandbox when asked, once per boot; SLOT is
// the image id the freeze becomes. The sandbox's init does the freeze and
// tells its outcome on the console; the console shim writes that verdict
// into the slot; sbxd, watching the slot (inotify), looks at the slot.
//
// The verdict is the sandbox's word, and root inside can forge it: it only
// wakes sbxd and gives the details (who asked, why, a crash). What sbxd
// records it decides from gVisor's files (slotOutcome): the sandbox's
// process holds them until the checkpoint is done, then (as sbx builds
// runsc) closes them, and a failed one's state file holds only gVisor's
// error. A whole freeze is recorded at once as a named snapshot with
// memory, freeze-NAME-XXXX, journaled as every capture is. A failed one
// is an event that says why; its files go. Either way sbxd then confirms
// it to the sandbox in a file only sbxd writes (confirmFreeze), and only
// that makes the freeze command say "froze as X".
//
// A slot whose sandbox is gone (a stop, a delete, a new boot) is settled
// for good: an unused one is removed, a used one sbxd did not see finish,
// or without a verdict (a checkpoint written without /.sbx/freeze), is
// dropped with an event.

// freezeOwner owns the freezes' records: it arms each boot's slot, watches
// it (slotWatcher, freezeslots.go), settles what gVisor and the sandbox
// left in it, and records a freeze as a snapshot, or its failure as an
// event, and confirms either to the sandbox. Its one lock is the
// slotWatcher's, over its maps; it sees the rest of the manager only
// through freezeHost.
type freezeOwner struct {
	host    freezeHost
	log     *slog.Logger
	dataDir string      // DATA_DIR: the slots are in DATA_DIR/freeze
	images  imageFiles  // where a recorded freeze's image goes
	slots   slotWatcher // the watches on running sandboxes' slots
}

// freezeHost is what the freeze owner needs of the rest of the manager.
type freezeHost interface {
	// the store's sandboxes and snapshots
	Sandbox(ctx context.Context, ref string) (*store.Sandbox, error)
	SnapshotNameTaken(ctx context.Context, name string) (bool, error)
	Update(ctx context.Context, fn func(tx *store.Store) error) error
	// the runtime: a sandbox's state, and the resume of one paused by a
	// stop's capture (letFreezeTell)
	runtimeState(ctx context.Context, id string) (runsc.State, error)
	runtimeResume(ctx context.Context, id string) error
	// a fork's memory written whole by a freeze: it reads its fork image
	// no more (fork.go)
	pagesAllLoaded(ctx context.Context, id string)
	// claims (claims.go): a settle claims the sandbox whole
	claim(ctx context.Context, id, op string) (release func(), err error)
	// the journal (journal.go): its capture gate, and an entry of its own
	enterGate() error
	leaveGate()
	beginJournal(ctx context.Context, kind, entry, id string, detail map[string]any) (*inFlight, error)
	// a capture's event and record (snapshot.go), the freeze quota and the
	// storage budget (quota.go)
	captureEvent(ctx context.Context, id, typ string, start time.Time, size int64, err error, extra map[string]any)
	snapshotRecord(sb *store.Sandbox, name, img string, memory bool, size int64, paused time.Duration) *store.Snapshot
	freezeAllowed(ctx context.Context, sb *store.Sandbox, size int64) error
	// a freeze recorded: in a fleet, pushed to its registry (freezepush.go)
	pushSnapshotSoon(name, img string)
	sandboxDir(id string) string
	now() time.Time
}

// freezeHost, as the manager gives it.
type managerFreezeHost struct {
	*store.Store
	m *Manager
}

func (h managerFreezeHost) pushSnapshotSoon(name, img string) { h.m.pushSnapshotSoon(name, img) }
func (h managerFreezeHost) runtimeState(ctx context.Context, id string) (runsc.State, error) {
	return h.m.cfg.Runtime.State(ctx, id)
}
func (h managerFreezeHost) runtimeResume(ctx context.Context, id string) error {
	return h.m.cfg.Runtime.Resume(ctx, id)
}
func (h managerFreezeHost) pagesAllLoaded(ctx context.Context, id string) {
	h.m.pagesAllLoaded(ctx, id)
}
func (h managerFreezeHost) claim(ctx context.Context, id, op string) (func(), error) {
	return h.m.claim(ctx, id, op)
}
func (h managerFreezeHost) enterGate() error { return h.m.journal.gate.enter() }
func (h managerFreezeHost) leaveGate()       { h.m.journal.gate.inflight.Done() }
func (h managerFreezeHost) beginJournal(ctx context.Context, kind, entry, id string, detail map[string]any) (*inFlight, error) {
	return h.m.journal.begin(ctx, kind, entry, id, detail)
}
func (h managerFreezeHost) captureEvent(ctx context.Context, id, typ string, start time.Time, size int64, err error, extra map[string]any) {
	h.m.captureEvent(ctx, id, typ, start, size, err, extra)
}
func (h managerFreezeHost) snapshotRecord(sb *store.Sandbox, name, img string, memory bool, size int64, paused time.Duration) *store.Snapshot {
	return h.m.snapshotRecord(sb, name, img, memory, size, paused)
}
func (h managerFreezeHost) freezeAllowed(ctx context.Context, sb *store.Sandbox, size int64) error {
	return h.m.storage.freezeAllowed(ctx, sb, size)
}
func (h managerFreezeHost) sandboxDir(id string) string { return h.m.sandboxDir(id) }
func (h managerFreezeHost) now() time.Time              { return h.m.now() }

// start starts the slots' watcher: a verdict written into a slot settles
// its sandbox's slots, one settle at a time per sandbox.
func (f *freezeOwner) start(ctx context.Context) error {
	return f.slots.start(func(id string) {
		f.slots.kick(id, func(id string) { f.settleFreezes(context.WithoutCancel(ctx), id) })
	})
}

func (f *freezeOwner) freezeRoot() string             { return filepath.Join(f.dataDir, "freeze") }
func (f *freezeOwner) freezeDir(id string) string     { return filepath.Join(f.freezeRoot(), id) }
func (f *freezeOwner) slotDir(id, slot string) string { return filepath.Join(f.freezeDir(id), slot) }

// slotMeta is what sbxd notes in a slot when it arms it: the name its
// freeze is recorded as, and the disk the boot's checkpoint names.
type slotMeta struct {
	Name    string `json:"name"`
	Sandbox string `json:"sandbox"`
	Disk    string `json:"disk,omitempty"`
	// Agent is the agent directory the boot mounts, whose binary a freeze
	// of it runs (noteImageAgent)
	Agent string    `json:"agent,omitempty"`
	Armed time.Time `json:"armed"`
}

const (
	slotMetaFile = "slot.json"
	// currentFile, in a sandbox's freeze dir, names the slot its running
	// boot has.
	currentFile = "current"
)

// freezeName is the name a sandbox's freeze in slot is recorded as:
// freeze-NAME-XXXX (NAME the sandbox's name, else its id).
func freezeName(sb *store.Sandbox, slot string) string {
	base := sb.Name
	if base == "" {
		base = strings.TrimPrefix(sb.ID, "sb_")
	}
	if len(base) > 45 {
		base = base[:45]
	}
	return "freeze-" + strings.TrimRight(base, "-_.") + "-" + strings.TrimPrefix(slot, "im_")[:4]
}

// armFreeze settles what earlier boots of sb left in its freeze dir and
// makes the slot of the boot about to start. It returns the slot, the
// spec's annotations and environment for it. from is the image the boot
// restores ("" for a boot from the template), agent the agent directory it
// mounts.
func (f *freezeOwner) armFreeze(ctx context.Context, sb *store.Sandbox, from, agent string) (string, map[string]string, []string, error) {
	f.settleFreezesLocked(ctx, sb, false)
	f.pruneConfirms(sb.ID)
	slot := newID("im_")
	name := freezeName(sb, slot)
	if taken, err := f.host.SnapshotNameTaken(ctx, name); err == nil && taken {
		name = "freeze-" + strings.TrimPrefix(slot, "im_")
	}
	dir := f.slotDir(sb.ID, slot)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return "", nil, nil, fmt.Errorf("freeze slot: %w", err)
	}
	meta, _ := json.Marshal(slotMeta{Name: name, Sandbox: sb.ID, Disk: sb.Disk, Agent: agent, Armed: f.host.now().UTC()})
	if err := os.WriteFile(filepath.Join(dir, slotMetaFile), meta, 0o600); err != nil {
		return "", nil, nil, fmt.Errorf("freeze slot: %w", err)
	}
	if err := atomicfile.WriteString(filepath.Join(f.freezeDir(sb.ID), currentFile), slot+"\n", 0o600); err != nil {
		return "", nil, nil, fmt.Errorf("freeze slot: %w", err)
	}
	ann := map[string]string{
		"dev.gvisor.internal.checkpoint.enable": "true",
		"dev.gvisor.internal.checkpoint.path":   dir,
		// the sandbox runs on after its freeze
		"dev.gvisor.internal.checkpoint.resume": "true",
		// uncompressed, as sbx's own checkpoints: a restore loads the pages
		// in the background, and the freeze is quicker
		"dev.gvisor.internal.checkpoint.compression": "none",
	}
	env := []string{
		freezewire.SlotEnv + "=" + slot,
		freezewire.NameEnv + "=" + name,
		freezewire.SandboxEnv + "=" + sb.ID,
		freezewire.RestoredFromEnv + "=" + from,
	}
	if sb.Meta[api.MetaCrashes] == "off" {
		env = append(env, freezewire.CrashesEnv+"=off")
	}
	return slot, ann, env, nil
}

// currentSlot is the slot of sandbox id's running boot ("" if none).
func (f *freezeOwner) currentSlot(id string) string {
	b, err := os.ReadFile(filepath.Join(f.freezeDir(id), currentFile))
	if err != nil {
		return ""
	}
	s := strings.TrimSpace(string(b))
	if !freezewire.ValidSlot(s) {
		return ""
	}
	return s
}

// settleFreezes settles sandbox id's slots under its claim: called when the
// console shim has written a verdict.
func (f *freezeOwner) settleFreezes(ctx context.Context, id string) {
	unlock, err := f.host.claim(ctx, id, kindFreeze)
	if err != nil {
		return
	}
	defer unlock()
	sb, err := f.host.Sandbox(ctx, id)
	if err != nil {
		return // deleted: the delete settled them
	}
	f.settleFreezesLocked(ctx, sb, true)
}

// verdictWait is how long a used slot of a sandbox that ended waits for
// its verdict: the console shim may still be reading init's last line.
const verdictWait = time.Second

// settleFreezesLocked looks at sb's slots: a freeze gVisor finished and the
// sandbox told of is recorded, or its failure is; unless running (its runsc
// sandbox is gone, or about to boot anew), the rest are cleared, as they
// can no longer be. The caller claims sb.
func (f *freezeOwner) settleFreezesLocked(ctx context.Context, sb *store.Sandbox, running bool) {
	ents, err := os.ReadDir(f.freezeDir(sb.ID))
	if err != nil {
		return
	}
	cur := f.currentSlot(sb.ID)
	var proc runsc.Proc
	if running && cur != "" {
		proc = f.sandboxProc(ctx, sb.ID)
	}
	for _, e := range ents {
		slot := e.Name()
		if !e.IsDir() || !freezewire.ValidSlot(slot) {
			continue
		}
		dir := f.slotDir(sb.ID, slot)
		live := running && slot == cur
		var seen runsc.Proc // the boot's process, for a slot of the running boot
		if live {
			seen = proc
		}
		out, gvisorWhy := slotOutcome(dir, seen)
		v, told := readVerdict(dir)
		if !told && !live && out != slotOpen && slotUsed(dir) {
			// the console shim may be reading init's last line still
			deadline := time.Now().Add(verdictWait)
			for !told && time.Now().Before(deadline) {
				time.Sleep(50 * time.Millisecond)
				v, told = readVerdict(dir)
			}
		}
		switch {
		case out == slotWhole && told:
			f.recordFreeze(ctx, sb, slot, v)
		case out == slotFailed && told:
			f.failedFreeze(ctx, sb, slot, v, gvisorWhy)
		case live && out == slotOpen:
			if told {
				// a line before gVisor is done (or of a freeze never asked):
				// look again once the slot's files are let go
				f.awaitSlot(ctx, sb.ID, slot, proc)
			}
			// else armed: its verdict will come
		case live && told:
			// the process is gone while sbxd looks (reconcile sees to it)
		case live:
			// done without a word from init yet: a checkpoint written
			// straight to /proc/gvisor/checkpoint is dropped when the boot
			// ends, unless a verdict comes
		case !slotUsed(dir):
			f.slots.unwatch(sb.ID, slot)
			_ = os.RemoveAll(dir) // armed and never used
		case out == slotFailed:
			f.dropSlot(ctx, sb, slot, "a checkpoint failed with no word from the sandbox's init ("+orDefault(gvisorWhy, "gVisor gave no reason")+")")
		case !told:
			f.dropSlot(ctx, sb, slot, "a checkpoint was written into it with no word from the sandbox's init (written to /proc/gvisor/checkpoint without /.sbx/freeze, or the sandbox ended mid-freeze), so whether it is whole is unknown")
		default:
			f.dropSlot(ctx, sb, slot, "the sandbox ended before sbxd saw gVisor finish writing it (its init's word alone is no proof), so whether it is whole is unknown")
		}
	}
}

// clipText cuts s to n bytes, at a rune's start, marking the cut.
func clipText(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n] + "..."
}

func orDefault(s, def string) string {
	if s == "" {
		return def
	}
	return s
}

// slotOutcome is what gVisor's files in a slot say of its checkpoint.
type slotState int

const (
	// slotOpen: the boot's process holds the files: not asked yet, or
	// still being written.
	slotOpen slotState = iota
	// slotWhole: gVisor let them go, and the state file is a statefile.
	slotWhole
	// slotFailed: gVisor let them go, and the state file holds its error
	// (or nothing).
	slotFailed
	// slotUnseen: sbxd did not see the boot's process let them go (it is
	// gone, or not known): whether the checkpoint is whole is unknown.
	slotUnseen
)

// stateMagic starts every gVisor statefile; appSaveFailed starts the
// state file of a failed checkpoint (third_party/gvisor, _boot/restore.go).
const (
	stateMagic    = "\x67\x56\x69\x73\x6f\x72\x53\x46"
	appSaveFailed = "sbx: checkpoint failed: "
)

// slotOutcome looks at a slot. proc is the process of the boot the slot is
// armed for, alive ({} for a boot that is gone): a slot it no longer holds
// is done, and that is noted in the slot (freezewire.DoneFile), as
// nothing can be seen of it once the process ends. For a failed one it
// also returns gVisor's error.
func slotOutcome(dir string, proc runsc.Proc) (slotState, string) {
	if b, err := readRegularBounded(filepath.Join(dir, freezewire.DoneFile), 64); err == nil {
		switch string(b) {
		case freezewire.DoneWhole:
			return slotWhole, ""
		case freezewire.DoneFailed:
			why, _ := failedWhy(dir)
			return slotFailed, why
		}
	}
	// gVisor's error in the state file is written once its save is over:
	// failed, whatever holds the file (a failed save may leave its writer
	// open)
	if why, failed := failedWhy(dir); failed {
		return slotFailed, why
	}
	if proc.Pid <= 0 {
		return slotUnseen, ""
	}
	held, ok := holdsFiles(proc, dir)
	if !ok {
		return slotUnseen, ""
	}
	if held {
		return slotOpen, ""
	}
	head, _ := readRegularBounded(filepath.Join(dir, freezewire.StateFile), int64(len(stateMagic)))
	out, note := slotFailed, freezewire.DoneFailed
	if string(head) == stateMagic {
		out, note = slotWhole, freezewire.DoneWhole
	}
	// noted for when the process is gone; on a full disk the note may not
	// fit, and what was seen now still stands
	_ = atomicfile.WriteBytes(filepath.Join(dir, freezewire.DoneFile), []byte(note), 0o600)
	return out, ""
}

// failedWhy is the error gVisor wrote into a failed checkpoint's state
// file; failed says whether there is one.
func failedWhy(dir string) (why string, failed bool) {
	b, err := readRegularBounded(filepath.Join(dir, freezewire.StateFile), 1100)
	if err != nil {
		return "", false
	}
	s, ok := strings.CutPrefix(string(b), appSaveFailed)
	if !ok {
		return "", false
	}
	return freezewire.Printable(strings.TrimSpace(s)), true
}

// readRegularBounded reads up to n bytes of a regular file, not following
// a symlink.
func readRegularBounded(path string, n int64) ([]byte, error) {
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NOFOLLOW|syscall.O_NONBLOCK, 0)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	if fi, err := f.Stat(); err != nil || !fi.Mode().IsRegular() {
		return nil, fmt.Errorf("%s: not a regular file", path)
	}
	return io.ReadAll(io.LimitReader(f, n))
}

// holdsFiles reports whether proc has one of the slot's gVisor files open.
// ok is false when proc is not (or no longer) a live process: an exiting
// one has closed everything, which says nothing of the checkpoint.
func holdsFiles(proc runsc.Proc, dir string) (held, ok bool) {
	var want []*syscall.Stat_t
	for _, f := range []string{freezewire.StateFile, freezewire.PagesMetaFile, freezewire.PagesFile} {
		var st syscall.Stat_t
		if syscall.Stat(filepath.Join(dir, f), &st) == nil {
			want = append(want, &st)
		}
	}
	fdDir := "/proc/" + strconv.Itoa(proc.Pid) + "/fd"
	ents, err := os.ReadDir(fdDir)
	if err != nil || len(ents) < 3 {
		return false, false
	}
	for _, e := range ents {
		var st syscall.Stat_t
		if syscall.Stat(filepath.Join(fdDir, e.Name()), &st) != nil {
			continue
		}
		for _, w := range want {
			if st.Dev == w.Dev && st.Ino == w.Ino {
				return true, proc.Alive()
			}
		}
	}
	// it let them go: so it says only if it is still the same, live
	// process (Alive: not a zombie)
	if !proc.Alive() {
		return false, false
	}
	return false, true
}

// sandboxProc is sandbox id's runsc sandbox process ({} if none runs).
func (f *freezeOwner) sandboxProc(ctx context.Context, id string) runsc.Proc {
	st, err := f.host.runtimeState(ctx, id)
	if err != nil || !st.Live() || st.Pid <= 0 {
		return runsc.Proc{}
	}
	return runsc.Proc{Pid: st.Pid, Start: runsc.ProcessStart(st.Pid)}
}

// slotAwait bounds how long sbxd watches a slot whose verdict came before
// gVisor let its files go (a big sandbox's checkpoint, or a line forged
// before any).
const slotAwait = 15 * time.Minute

// awaitSlot watches, in the background, for the boot's process proc to
// let the slot's files go, and then settles the sandbox's slots again.
// One watch per slot.
func (f *freezeOwner) awaitSlot(ctx context.Context, id, slot string, proc runsc.Proc) {
	key := id + "/" + slot
	if !f.slots.startAwait(key) {
		return
	}
	dir := f.slotDir(id, slot)
	go func() {
		defer f.slots.endAwait(key)
		pause := 10 * time.Millisecond
		for deadline := time.Now().Add(slotAwait); time.Now().Before(deadline); {
			time.Sleep(pause)
			pause = min(2*pause, 250*time.Millisecond)
			if _, err := os.Stat(dir); err != nil {
				return // settled meanwhile
			}
			if held, ok := holdsFiles(proc, dir); held && ok {
				continue
			}
			f.slots.endAwait(key)
			f.settleFreezes(context.WithoutCancel(ctx), id)
			return
		}
	}()
}

// tellWait bounds how long a stop waits for the verdict of a freeze its
// capture came just after (letFreezeTell).
const tellWait = 5 * time.Second

// letFreezeTell notes what gVisor left in the slot of stopped sandbox id,
// paused after its capture and still there (slotOutcome: it can be seen
// only while the boot's process lives), and lets the sandbox tell of a
// freeze gVisor has written and init has not told of yet, before the stop
// destroys it. runsc (as sbx builds it) takes one checkpoint at a time: a
// capture asked while a freeze is under way waits for it, and then holds
// init between gVisor's answer and its verdict. Unpaused, the original
// tells a moment later; without that the freeze would be dropped as cut
// short. A freeze written without init (root writing to gVisor's file) has
// no verdict to wait for: tellWait bounds it.
func (f *freezeOwner) letFreezeTell(ctx context.Context, id string) {
	slot := f.currentSlot(id)
	if slot == "" {
		return
	}
	dir := f.slotDir(id, slot)
	out, _ := slotOutcome(dir, f.sandboxProc(ctx, id))
	if _, told := readVerdict(dir); told || out == slotOpen || out == slotUnseen {
		return
	}
	if err := f.host.runtimeResume(ctx, id); err != nil {
		f.log.Warn("stop: let the sandbox tell of its freeze", "sandbox", id, "err", err)
		return
	}
	for deadline := time.Now().Add(tellWait); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if _, told := readVerdict(dir); told {
			return
		}
	}
}

// noteSlot notes what gVisor left in running sandbox id's slot, before
// its process goes (a delete): a freeze done by then can still be kept.
func (f *freezeOwner) noteSlot(ctx context.Context, id string) {
	if slot := f.currentSlot(id); slot != "" {
		_, _ = slotOutcome(f.slotDir(id, slot), f.sandboxProc(ctx, id))
	}
}

// slotUsed reports whether gVisor wrote anything into a slot.
func slotUsed(dir string) bool {
	fi, err := os.Stat(filepath.Join(dir, freezewire.StateFile))
	return err == nil && fi.Size() > 0
}

// readVerdict reads a slot's verdict, bounded: it is the sandbox's word.
// One that cannot be read is still a verdict, with nothing in it.
func readVerdict(dir string) (freezewire.Verdict, bool) {
	b, err := readRegularBounded(filepath.Join(dir, freezewire.VerdictFile), freezewire.MaxLine)
	if err != nil {
		return freezewire.Verdict{}, false
	}
	v, err := freezewire.Parse(append([]byte(freezewire.Prefix), b...))
	if err != nil || v.Slot != filepath.Base(dir) {
		return freezewire.Verdict{Record: freezewire.Record{Slot: filepath.Base(dir), Reason: "the sandbox's word on it could not be read"}}, true
	}
	return v, true
}

func readSlotMeta(dir string) slotMeta {
	var sm slotMeta
	if b, err := os.ReadFile(filepath.Join(dir, slotMetaFile)); err == nil {
		_ = json.Unmarshal(b, &sm)
	}
	return sm
}

// dropSlot removes a slot whose freeze cannot be kept, with an event, and
// tells the sandbox.
func (f *freezeOwner) dropSlot(ctx context.Context, sb *store.Sandbox, slot, why string) {
	f.slots.unwatch(sb.ID, slot)
	dir := f.slotDir(sb.ID, slot)
	name := readSlotMeta(dir).Name
	_ = os.RemoveAll(dir)
	f.host.captureEvent(ctx, sb.ID, "frozen", f.host.now(), 0, errors.New("freeze dropped: "+why), map[string]any{"name": name, "slot": slot})
	f.confirmFreeze(sb.ID, slot, freezewire.Confirm{Result: freezewire.Failed, Reason: "sbxd dropped it: " + why})
}

// failedFreeze records a freeze gVisor could not write: an event saying
// why, which the sandbox is told too; its files go.
func (f *freezeOwner) failedFreeze(ctx context.Context, sb *store.Sandbox, slot string, v freezewire.Verdict, gvisorWhy string) {
	f.slots.unwatch(sb.ID, slot)
	dir := f.slotDir(sb.ID, slot)
	name := readSlotMeta(dir).Name
	why := f.whyFreezeFailed(dir, gvisorWhy)
	_ = os.RemoveAll(dir)
	f.host.captureEvent(ctx, sb.ID, "frozen", orNow(v.Triggered, f.host.now()), 0, errors.New(why), freezeDetail(name, slot, v))
	f.confirmFreeze(sb.ID, slot, freezewire.Confirm{Result: freezewire.Failed, Reason: why})
}

// whyFreezeFailed is the cause of a failed freeze: gVisor's own error, and
// a disk that is (nearly) full.
func (f *freezeOwner) whyFreezeFailed(dir, gvisorWhy string) string {
	why := "gVisor could not write the checkpoint"
	switch {
	case strings.Contains(gvisorWhy, "no space left on device"):
		// the cause is all that matters of an error that may dump an
		// object and a stack first
		return why + fmt.Sprintf(": no space left on device (the disk of sbxd's data dir, %s)", f.dataDir)
	case len(gvisorWhy) > 300:
		why += ": " + clipText(gvisorWhy, 300) + " (sbxd --runsc-debug-log DIR records gVisor's whole error)"
	case gvisorWhy != "":
		why += ": " + gvisorWhy
	default:
		why += " (sbxd --runsc-debug-log DIR records gVisor's reason)"
	}
	var fs syscall.Statfs_t
	if err := syscall.Statfs(dir, &fs); err == nil {
		free := int64(fs.Bavail) * fs.Bsize
		if free < minFree || fs.Bavail*50 < fs.Blocks {
			return why + fmt.Sprintf(" (no space left on device: the disk of sbxd's data dir, %s, has %s free)", f.dataDir, fmtBytes(free))
		}
	}
	return why
}

// confirmDir is where sbxd confirms sandbox id's freezes: in its etc dir,
// which the sandbox sees read-only (freezewire.ConfirmDir).
func (f *freezeOwner) confirmDir(id string) string {
	return filepath.Join(f.host.sandboxDir(id), "etc", freezewire.ConfirmSubdir)
}

// keepConfirms is how many confirmations a sandbox keeps: those of its
// latest boots (a boot restored from a stop taken as a freeze ended may
// still wait for its own).
const keepConfirms = 16

// pruneConfirms removes all but the newest keepConfirms confirmations.
func (f *freezeOwner) pruneConfirms(id string) {
	ents, err := os.ReadDir(f.confirmDir(id))
	if err != nil || len(ents) <= keepConfirms {
		return
	}
	type conf struct {
		name string
		mod  time.Time
	}
	var cs []conf
	for _, e := range ents {
		if fi, err := e.Info(); err == nil {
			cs = append(cs, conf{e.Name(), fi.ModTime()})
		}
	}
	sort.Slice(cs, func(i, j int) bool { return cs[i].mod.After(cs[j].mod) })
	for _, c := range cs[min(keepConfirms, len(cs)):] {
		_ = os.Remove(filepath.Join(f.confirmDir(id), c.name))
	}
}

// confirmFreeze tells the sandbox what became of its freeze in slot, in a
// file only sbxd writes. Best effort: a sandbox that is gone has no use
// for it.
func (f *freezeOwner) confirmFreeze(id, slot string, c freezewire.Confirm) {
	if _, err := os.Stat(filepath.Join(f.host.sandboxDir(id), "etc")); err != nil {
		return
	}
	dir := f.confirmDir(id)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		f.log.Warn("confirm a freeze to its sandbox", "sandbox", id, "err", err)
		return
	}
	b, _ := json.Marshal(c)
	if err := atomicfile.WriteBytes(filepath.Join(dir, slot), b, 0o600); err != nil {
		f.log.Warn("confirm a freeze to its sandbox", "sandbox", id, "err", err)
	}
}

func orNow(t, now time.Time) time.Time {
	if t.IsZero() || t.After(now) {
		return now
	}
	return t
}

// freezeDetail is what a freeze's event says of it: the sandbox's word on
// who asked and when, marked as such.
func freezeDetail(name, slot string, v freezewire.Verdict) map[string]any {
	d := map[string]any{"name": name, "slot": slot, "pid": v.Pid, "uid": v.UID}
	if v.Cmd != "" {
		d["cmd"] = v.Cmd
	}
	if v.Reason != "" {
		d["reason"] = v.Reason
	}
	if v.Crash != nil {
		d["crash"] = v.Crash
	}
	if !v.Triggered.IsZero() && !v.Done.IsZero() {
		d["pausedMs"] = v.Done.Sub(v.Triggered).Milliseconds()
	}
	if !v.FailedAt.IsZero() {
		d["failedAt"] = v.FailedAt.UTC().Format(time.RFC3339Nano)
		if !v.Done.IsZero() {
			d["frozenMs"] = v.Done.Sub(v.FailedAt).Milliseconds()
		}
	}
	return d
}

// recordFreeze makes a complete freeze a named snapshot with memory:
// journaled, its slot becomes the image (a rename), which is synced and
// completed, and the snapshot is recorded in the transaction that closes
// the journal entry. If it cannot be, the event says why and nothing is
// left half made.
func (f *freezeOwner) recordFreeze(ctx context.Context, sb *store.Sandbox, slot string, v freezewire.Verdict) {
	f.slots.unwatch(sb.ID, slot)
	dir := f.slotDir(sb.ID, slot)
	meta := readSlotMeta(dir)
	if meta.Name == "" {
		meta.Name = "freeze-" + strings.TrimPrefix(slot, "im_")
	}
	if err := f.host.enterGate(); err != nil {
		return // sbxd is shutting down: the next start records it
	}
	defer f.host.leaveGate()
	start := orNow(v.Triggered, f.host.now())
	detail := freezeDetail(meta.Name, slot, v)
	fail := func(err error) {
		_ = os.RemoveAll(dir)
		_ = f.images.remove(slot)
		f.host.captureEvent(ctx, sb.ID, "frozen", start, 0, err, detail)
		f.confirmFreeze(sb.ID, slot, freezewire.Confirm{Result: freezewire.Failed, Reason: "gVisor wrote it, but sbxd could not keep it: " + err.Error()})
	}
	if err := verifyCheckpoint(dir); err != nil {
		fail(fmt.Errorf("the freeze's image is not whole: %w", err))
		return
	}
	sn := f.host.snapshotRecord(sb, meta.Name, slot, true, 0, 0)
	sn.Disk = meta.Disk // what the boot's checkpoint names
	if !v.Triggered.IsZero() && !v.Done.IsZero() {
		sn.Paused = v.Done.Sub(v.Triggered)
	}
	if taken, _ := f.host.SnapshotNameTaken(ctx, sn.Name); taken {
		sn.Name = "freeze-" + strings.TrimPrefix(slot, "im_")
		detail["name"] = sn.Name
	}
	// quota.go: a freeze past its sandbox's quota or sbxd's storage budget is not kept
	if err := f.host.freezeAllowed(ctx, sb, diskUsage(dir)); err != nil {
		fail(err)
		return
	}
	jd := map[string]any{"name": sn.Name, "snapshot": sn, "memory": true}
	c, err := f.host.beginJournal(ctx, kindFreeze, slot, sb.ID, jd)
	if err != nil {
		fail(err)
		return
	}
	crashPoint("freeze:journaled")
	// the slot becomes the image: memory/ is gVisor's three files
	img := f.images.dir(slot)
	if err := os.MkdirAll(img, 0o700); err != nil {
		c.abandon(ctx)
		fail(err)
		return
	}
	for _, file := range slotFiles {
		_ = os.Rename(filepath.Join(dir, file), filepath.Join(img, file))
	}
	if err := moveDir(dir, f.images.mem(slot)); err != nil {
		c.abandon(ctx)
		fail(fmt.Errorf("move the freeze into its image: %w", err))
		return
	}
	dropSlotFiles(f.images.mem(slot))
	if err := noteImageAgent(meta.Agent, f.host.sandboxDir(sb.ID), img); err != nil {
		c.abandon(ctx)
		fail(fmt.Errorf("note the freeze's agent: %w", err))
		return
	}
	c.step(ctx, stepMoved)
	crashPoint("freeze:moved")
	size, err := f.images.complete(slot, true)
	if err != nil {
		c.abandon(ctx)
		fail(err)
		return
	}
	sn.Size = size
	err = f.host.Update(ctx, func(tx *store.Store) error {
		if err := tx.CreateSnapshot(ctx, sn); err != nil {
			return err
		}
		return c.closeIn(ctx, tx)
	})
	if err != nil {
		c.abandon(ctx)
		fail(fmt.Errorf("record the freeze: %w", err))
		return
	}
	f.host.pagesAllLoaded(ctx, sb.ID) // gVisor's checkpoint loaded every page
	f.host.captureEvent(ctx, sb.ID, "frozen", start, size, nil, detail)
	f.confirmFreeze(sb.ID, slot, freezewire.Confirm{Result: freezewire.Frozen, Name: sn.Name})
	f.host.pushSnapshotSoon(sn.Name, sn.ID)
}

// moveDir renames from to to; across file systems it copies, then removes.
// slotFiles are sbx's own files in a freeze slot, beside gVisor's.
var slotFiles = []string{freezewire.VerdictFile, slotMetaFile, freezewire.DoneFile}

// dropSlotFiles removes sbx's own slot files, and their temporaries, from
// dir, a freeze's memory/ once its slot was moved there: only gVisor's
// files belong in it. The sandbox's console can tell of a freeze at any
// time (root inside prints verdict lines at will), and the shim writes
// each into the slot: one written after the files were taken out of the
// slot, or its temporary, came along with the move. A temporary counted
// in the image's sizes while still empty made every copy from the freeze
// fail as damaged ("memory/.verdict.sbx-… holds 60 bytes, 0 were
// written"; TestAttack22ForgedFreeze). A write under way when this runs
// loses its file: its rename into the old slot path fails.
func dropSlotFiles(dir string) {
	ents, _ := os.ReadDir(dir)
	for _, e := range ents {
		for _, file := range slotFiles {
			if n := e.Name(); n == file || atomicfile.IsTempOf(n, file) {
				_ = os.Remove(filepath.Join(dir, n))
			}
		}
	}
}

func moveDir(from, to string) error {
	err := os.Rename(from, to)
	if err == nil || !errors.Is(err, syscall.EXDEV) {
		return err
	}
	if err := os.MkdirAll(to, 0o700); err != nil {
		return err
	}
	ents, err := os.ReadDir(from)
	if err != nil {
		return err
	}
	for _, e := range ents {
		if err := copyFile(filepath.Join(from, e.Name()), filepath.Join(to, e.Name())); err != nil {
			return err
		}
	}
	return os.RemoveAll(from)
}

func copyFile(from, to string) error {
	src, err := os.Open(from)
	if err != nil {
		return err
	}
	defer src.Close()
	dst, err := os.OpenFile(to, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o600)
	if err != nil {
		return err
	}
	if _, err := io.Copy(dst, src); err != nil {
		dst.Close()
		return err
	}
	return dst.Close()
}

// reconcileFreeze finishes recording a freeze whose image was moved into
// place (sbxd saw gVisor finish it, whole): it is completed and recorded. One
// cut short before that is left to its slot (settled with its sandbox).
func (f *freezeOwner) reconcileFreeze(ctx context.Context, c *inFlight, in *store.Intent) (string, string) {
	var sn store.Snapshot
	if raw, ok := in.Detail["snapshot"]; ok {
		b, _ := json.Marshal(raw)
		_ = json.Unmarshal(b, &sn)
	}
	if sn.Name == "" || sn.ID != in.ID {
		_ = f.images.remove(in.ID)
		return "dropped", "the journal entry does not say what to record"
	}
	if _, err := os.Stat(f.images.mem(in.ID)); err != nil {
		return "left to its slot", "the freeze was not moved into its image yet; it is recorded when its sandbox's slots are next looked at"
	}
	if !f.images.isComplete(in.ID) {
		if k, _ := imageAgent(f.images.dir(in.ID)); k == "" {
			// cut off before its agent was noted: its slot's record, moved
			// into the image with it, says which (else its sandbox's note)
			meta := readSlotMeta(f.images.dir(in.ID))
			if err := noteImageAgent(meta.Agent, f.host.sandboxDir(in.SandboxID), f.images.dir(in.ID)); err != nil {
				return "error", fmt.Sprintf("the freeze's agent cannot be noted: %v; it stays in %s", err, f.images.dir(in.ID))
			}
		}
		size, err := f.images.complete(in.ID, true)
		if err != nil {
			return "error", fmt.Sprintf("the freeze's image cannot be completed: %v; it stays in %s", err, f.images.dir(in.ID))
		}
		sn.Size = size
	}
	if verifyCheckpoint(f.images.mem(in.ID)) != nil {
		_ = f.images.remove(in.ID)
		return "dropped", "the freeze's image is not whole"
	}
	if taken, _ := f.host.SnapshotNameTaken(ctx, sn.Name); taken {
		sn.Name = "freeze-" + strings.TrimPrefix(in.ID, "im_")
	}
	err := f.host.Update(ctx, func(tx *store.Store) error {
		if err := tx.CreateSnapshot(ctx, &sn); err != nil {
			return err
		}
		return c.closeIn(ctx, tx)
	})
	if err != nil {
		return "error", fmt.Sprintf("the freeze's image is complete but cannot be recorded: %v; it stays in %s", err, f.images.dir(in.ID))
	}
	f.host.pagesAllLoaded(ctx, in.SandboxID)
	f.confirmFreeze(in.SandboxID, in.ID, freezewire.Confirm{Result: freezewire.Frozen, Name: sn.Name})
	f.host.pushSnapshotSoon(sn.Name, sn.ID)
	return "snapshot kept", "the freeze's image was whole: the snapshot " + sn.Name + " is kept"
}

// watchFreezes watches the slot of running sandbox id and settles what is
// there already (a verdict written before the watch).
func (f *freezeOwner) watchFreezes(ctx context.Context, id string) {
	slot := f.currentSlot(id)
	if slot == "" {
		return
	}
	if err := f.slots.watch(id, slot, f.slotDir(id, slot)); err != nil {
		f.log.Warn("cannot watch a freeze slot", "sandbox", id, "err", err)
	}
	if _, ok := readVerdict(f.slotDir(id, slot)); ok {
		go f.settleFreezes(context.WithoutCancel(ctx), id)
	}
}
