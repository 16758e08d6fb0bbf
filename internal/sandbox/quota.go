package sandbox

import (
	"context"
	"fmt"
	"path/filepath"
	"time"

	"sbx.dev/sbx/api"
	"sbx.dev/sbx/internal/store"
	"sbx.dev/sbx/internal/wire/freezewire"
)

// FreezeQuota bounds the freezes one sandbox keeps (crash captures are
// freezes too): anyone inside, uid 1000 included, can ask for one, so
// without a bound a loop of /.sbx/freeze fills the host's disk. A freeze
// past it is not recorded; its image goes and an event says why. Freezes
// promoted with `sbx snapshot keep` are the user's and count in no quota.
type FreezeQuota struct {
	// MaxCount is the most freezes a sandbox keeps (0: no bound).
	MaxCount int
	// MaxBytes is the most bytes its freezes hold together (0: no bound).
	MaxBytes int64
	// MinInterval is the least time between two freezes it records (0:
	// none).
	MinInterval time.Duration
}

// DefaultFreezeQuota is sbxd's unless its flags say otherwise: room for a
// crash hunt's captures, not for a loop.
var DefaultFreezeQuota = FreezeQuota{MaxCount: 8, MaxBytes: 8 << 30, MinInterval: time.Second}

// isFreeze reports whether snapshot sn is a freeze (or a crash capture):
// recordFreeze moves its slot's note and verdict into its image, which no
// other capture writes.
func (s *storageOwner) isFreeze(sn *store.Snapshot) bool {
	dir := s.images.dir(sn.ID)
	return fileExists(filepath.Join(dir, slotMetaFile)) || fileExists(filepath.Join(dir, freezewire.VerdictFile))
}

// freezesOf returns sandbox id's freeze snapshots, oldest first.
func (s *storageOwner) freezesOf(ctx context.Context, id string) ([]*store.Snapshot, error) {
	sns, err := s.host.Snapshots(ctx, id)
	if err != nil {
		return nil, err
	}
	var out []*store.Snapshot
	for _, sn := range sns {
		if s.isFreeze(sn) {
			out = append(out, sn)
		}
	}
	return out, nil
}

// freezeAllowed says whether sb may record one more freeze of size bytes:
// nil, or an api.ErrConflict error saying which bound it passed and what to
// do. It is the one check the freeze recorder makes before it journals.
func (s *storageOwner) freezeAllowed(ctx context.Context, sb *store.Sandbox, size int64) error {
	q := s.quota
	fzs, err := s.freezesOf(ctx, sb.ID)
	if err != nil {
		return fmt.Errorf("freeze quota of %s: %w", sb.ID, err)
	}
	var count int
	var bytes int64
	var last time.Time
	for _, sn := range fzs {
		if sn.CreatedAt.After(last) {
			last = sn.CreatedAt
		}
		if sn.Kept {
			continue
		}
		count++
		bytes += sn.Size
	}
	const what = "the freeze is not kept and its image is removed"
	const todo = "remove freezes (`sbx snapshot rm NAME`, `sbx prune --freezes`) or promote one (`sbx snapshot keep NAME`)"
	switch now := s.host.now(); {
	case q.MaxCount > 0 && count+1 > q.MaxCount:
		return api.Errorf(api.ErrConflict, "freeze quota of sandbox %s: it has %d freezes already, the most sbxd keeps per sandbox (sbxd --freeze-max-count %d); %s: %s", sb.ID, count, q.MaxCount, what, todo)
	case q.MaxBytes > 0 && bytes+size > q.MaxBytes:
		return api.Errorf(api.ErrConflict, "freeze quota of sandbox %s: this freeze (%s) and its %d others (%s) pass the %s a sandbox's freezes may hold (sbxd --freeze-max-bytes); %s: %s", sb.ID, fmtBytes(size), count, fmtBytes(bytes), fmtBytes(q.MaxBytes), what, todo)
	case q.MinInterval > 0 && !last.IsZero() && now.Sub(last) < q.MinInterval:
		return api.Errorf(api.ErrConflict, "freeze rate limit of sandbox %s: its last freeze was recorded %s ago, and sbxd records at most one per %s (sbxd --freeze-min-interval); %s: freeze again later", sb.ID, now.Sub(last).Round(time.Millisecond), q.MinInterval, what)
	}
	if err := s.allows(ctx, "freeze of "+sb.ID, 0); err != nil {
		return err
	}
	return nil
}
