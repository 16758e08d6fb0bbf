package flaky

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"sbx.dev/sbx/api"
	"sbx.dev/sbx/client"
	"sbx.dev/sbx/internal/wire/agentwire"
	"sbx.dev/sbx/internal/wire/freezewire"
)

// hunt --freeze: the loop froze the sandbox at the failure (internal/agent
// hunt.go): a named snapshot with memory, recorded by sbxd at once. What
// is left to do is outside, in order: the evidence, read in a copy resumed
// from the freeze (so that it is of the failing instant, with the failing
// test process alive if it froze itself), copied out as the artifacts; a
// disk snapshot of the original named NAME, for replay; and the original,
// whose failing run has ended by now, deleted. The copy, NAME-frozen,
// stays running: it is the frozen machine, to be looked at; it has an idle
// ttl (KeepTTL), so a forgotten one goes by itself, and the freeze stays
// to make another.

// frozenSnapshotWait bounds the wait for sbxd to record a freeze (it does
// so as soon as gVisor has written it; the loop says so a moment later).
const frozenSnapshotWait = 60 * time.Second

// evidenceTimeout bounds the reading of the evidence in the copy.
const evidenceTimeout = api.Duration(10 * time.Minute)

// captureFrozen does a frozen failure's outside steps; those already done
// (by a hunt that was cut off) are not done again.
func captureFrozen(ctx context.Context, c HuntClient, s *HuntSummary, o *HuntOptions, name string) (*HuntSummary, error) {
	ctx = context.WithoutCancel(ctx) // once started, finish: a half capture helps no one
	id := s.Sandbox
	s.Failed = true
	if err := readFailed(ctx, c, s); err != nil {
		return nil, fmt.Errorf("hunt %s: %w", o.Name, err)
	}
	rec, err := readFrozen(ctx, c, id)
	if err != nil {
		return nil, fmt.Errorf("hunt %s: %w", o.Name, err)
	}
	if name == "" {
		name = rec.Name
	}
	s.Frozen = name
	if !rec.Done.IsZero() && !s.FailedAt.IsZero() {
		s.FrozenMs = rec.Done.Sub(s.FailedAt).Milliseconds()
		s.CaptureMs = s.FrozenMs
	}
	s.PausedMs = rec.PausedMs
	deadline := time.Now().Add(frozenSnapshotWait)
	for {
		if _, err := c.GetSnapshot(ctx, name); err == nil {
			break
		} else if !errors.Is(err, api.ErrNotFound) || time.Now().After(deadline) {
			return nil, fmt.Errorf("hunt %s: the freeze %s of %s was not recorded (see `sbx events %s`): %w", o.Name, name, id, id, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	o.emit(HuntEvent{Event: "recorded", Sandbox: id, Snapshot: name, Message: fmt.Sprintf("frozen %d ms after the failure; gVisor took %d ms", s.FrozenMs, s.PausedMs)})

	// the copy: the frozen machine, resumed
	copyName := o.Name + "-frozen"
	cp, err := c.Get(ctx, copyName)
	switch {
	case err == nil && cp.From != name:
		return nil, api.Errorf(api.ErrConflict, "hunt %s: the sandbox %s is in the way (not a copy of the freeze %s: an earlier hunt's?); delete it and run `sbx hunt --attach %s`", o.Name, copyName, name, o.Name)
	case err != nil:
		ttl := keepTTL(o.KeepTTL)
		if cp, err = c.Create(ctx, client.WithFrom(name), client.WithName(copyName), client.WithTTL(ttl)); err != nil {
			return nil, fmt.Errorf("hunt %s: resume a copy of the freeze %s: %w", o.Name, name, err)
		}
	}
	s.Copy = copyName
	o.emit(HuntEvent{Event: "copy", Sandbox: cp.ID, Snapshot: name})

	// the evidence, in the copy
	var out bytes.Buffer
	x, err := c.Exec(ctx, cp.ID, api.ExecRequest{Cmd: []string{agentwire.AgentPath, "hunt", "--evidence", "--config", huntConfig},
		User: "0", Cwd: "/", Timeout: evidenceTimeout}, &out, &out)
	if err != nil {
		return nil, fmt.Errorf("hunt %s: read the evidence in %s: %w", o.Name, copyName, err)
	}
	if x.ExitCode == nil || *x.ExitCode != loopFailed {
		return nil, fmt.Errorf("hunt %s: reading the evidence in %s failed (exit %v): %s", o.Name, copyName, exitOf(x), strings.TrimSpace(out.String()))
	}
	dir, err := filepath.Abs(o.OutDir)
	if err != nil {
		return nil, fmt.Errorf("hunt %s: %w", o.Name, err)
	}
	if _, err := copyEvidence(ctx, c, cp.ID, dir); err != nil {
		return nil, fmt.Errorf("hunt %s: copy the evidence to %s: %w", o.Name, dir, err)
	}
	// the run's record as the original wrote it, after the freeze
	if err := writeFailed(dir, s); err != nil {
		return nil, fmt.Errorf("hunt %s: %w", o.Name, err)
	}
	s.Artifacts = dir
	o.emit(HuntEvent{Event: "artifacts", Sandbox: cp.ID, Path: dir})

	// the original: a disk snapshot for replay, then it goes
	if err := snapshotOnce(ctx, c, id, o.Name); err != nil {
		return nil, fmt.Errorf("hunt %s: %w", o.Name, err)
	}
	s.Snapshot = o.Name
	o.emit(HuntEvent{Event: "snapshot", Sandbox: id, Snapshot: s.Snapshot})
	// a freeze goes with its sandbox unless kept: this one is the hunt's catch
	if k, ok := c.(snapshotKeeper); ok {
		if err := k.KeepSnapshot(ctx, name); err != nil {
			return nil, fmt.Errorf("hunt %s: keep the freeze %s before the original goes (all else is kept): %w", o.Name, name, err)
		}
	}
	if err := c.Delete(ctx, id); err != nil && !errors.Is(err, api.ErrNotFound) {
		return nil, fmt.Errorf("hunt %s: delete the original %s (all else is kept): %w", o.Name, id, err)
	}
	o.emit(HuntEvent{Event: "deleted", Sandbox: id, Message: "the original: its failing run had ended; the freeze keeps the failing instant"})
	s.Commands = frozenCommands(o, s)
	return s, nil
}

// snapshotKeeper promotes a snapshot so that it outlives its sandbox (an
// sbxd that takes a sandbox's freezes with it has it: SDK does).
type snapshotKeeper interface {
	KeepSnapshot(ctx context.Context, name string) error
}

func exitOf(x *api.Exec) string {
	if x == nil || x.ExitCode == nil {
		return "unknown"
	}
	return fmt.Sprint(*x.ExitCode)
}

// readFrozen reads the freeze's record the loop left in the original.
func readFrozen(ctx context.Context, c HuntClient, id string) (freezewire.Record, error) {
	var rec freezewire.Record
	rc, err := c.ReadFile(ctx, id, HuntDir+"/frozen")
	if err != nil {
		return rec, fmt.Errorf("read %s/frozen in %s: %w", HuntDir, id, err)
	}
	defer rc.Close()
	b, err := io.ReadAll(io.LimitReader(rc, 64<<10))
	if err != nil {
		return rec, err
	}
	if err := json.Unmarshal(b, &rec); err != nil {
		return rec, fmt.Errorf("%s/frozen in %s: %w", HuntDir, id, err)
	}
	return rec, nil
}

// writeFailed writes the failing run's record into the artifacts.
func writeFailed(dir string, s *HuntSummary) error {
	rec := fmt.Sprintf("run=%d\nseed=%s\nexit=%d\ntime=%d.%09d\n", s.Run, s.Seed, s.ExitCode, s.FailedAt.Unix(), s.FailedAt.Nanosecond())
	if s.TimedOut {
		rec += "timedout=1\n"
	}
	return os.WriteFile(filepath.Join(dir, "failed"), []byte(rec), 0o644)
}

// frozenCommands are what to type next: look at the copy, another copy,
// replay the seed.
func frozenCommands(o *HuntOptions, s *HuntSummary) []string {
	replay := commands(o, s)
	return []string{
		"sbx shell " + s.Copy,
		"sbx new --from " + s.Frozen,
		replay[len(replay)-1],
	}
}

// attachFrozen is --attach of a hunt --freeze that finished: its original
// is deleted and its copy NAME-frozen runs. The summary is read from the
// artifacts, where they are; nil if there is no such copy.
func attachFrozen(ctx context.Context, c HuntClient, o *HuntOptions) *HuntSummary {
	cp, err := c.Get(ctx, o.Name+"-frozen")
	if err != nil {
		return nil
	}
	s := &HuntSummary{Name: o.Name, Failed: true, Copy: cp.Name}
	if _, err := c.GetSnapshot(ctx, o.Name); err == nil {
		s.Snapshot = o.Name
	}
	if dir, err := filepath.Abs(o.OutDir); err == nil {
		if f, err := os.Open(filepath.Join(dir, "failed")); err == nil {
			_ = parseFailed(f, s)
			f.Close()
			s.Artifacts = dir
		}
		var rec freezewire.Record
		if b, err := os.ReadFile(filepath.Join(dir, "frozen")); err == nil && json.Unmarshal(b, &rec) == nil {
			s.Frozen, s.PausedMs = rec.Name, rec.PausedMs
		}
	}
	o.emit(HuntEvent{Event: "copy", Sandbox: cp.ID, Message: "the hunt was already captured: its freeze runs as " + cp.Name})
	s.Commands = frozenCommands(o, s)
	return s
}
