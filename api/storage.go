package api

import "time"

// Storage is what sbxd's data dir holds, by owner (GET /v1/storage): the
// answer of `sbx df`. Bytes are the blocks files hold on the host (a file
// linked twice counts once, for the first owner found).
type Storage struct {
	DataDir string `json:"dataDir"`
	// Used is what the data dir holds in all; Max is sbxd --storage-max
	// (0: no budget); Free is what its file system has free.
	Used int64 `json:"usedBytes"`
	Max  int64 `json:"maxBytes"`
	Free int64 `json:"freeBytes"`
	// OrphanMax is sbxd --orphan-max: orphans past it are collected before
	// their grace ends, oldest first (0: no bound).
	OrphanMax int64 `json:"orphanMaxBytes"`
	// Totals are the bytes of each kind: sandboxes, snapshots, freezes,
	// templates, orphans, other.
	Totals    map[string]int64 `json:"totals"`
	Sandboxes []StorageItem    `json:"sandboxes"`
	Snapshots []StorageItem    `json:"snapshots"`
	Freezes   []StorageItem    `json:"freezes"`
	Templates []StorageItem    `json:"templates"`
	Orphans   []StorageItem    `json:"orphans"`
}

// The kinds of StorageItem and Storage.Totals.
const (
	StorageSandbox  = "sandbox"
	StorageSnapshot = "snapshot"
	StorageFreeze   = "freeze"
	StorageTemplate = "template"
	StorageOrphan   = "orphan"
	StorageOther    = "other"
)

// The events storage adds to a sandbox's stream (a deleted one's too).
const (
	// EventPruned: `sbx prune` removed an orphan image or a freeze of it.
	EventPruned = "pruned"
	// EventSwept: the sweep removed an orphan image of it before its grace
	// ended, the orphans being past sbxd --orphan-max; or a freeze of it
	// that outlived it unkept.
	EventSwept = "swept"
)

// StorageItem is one thing that uses the data dir.
type StorageItem struct {
	Kind string `json:"kind"`
	// ID is a sandbox's, a snapshot's or an orphan image's id, or a
	// template version.
	ID string `json:"id"`
	// Name is a sandbox's, snapshot's or template's name, if it has one.
	Name string `json:"name,omitempty"`
	// SandboxID is the sandbox a snapshot, freeze or orphan came from.
	SandboxID string    `json:"sandboxId,omitempty"`
	Bytes     int64     `json:"bytes"`
	CreatedAt time.Time `json:"createdAt,omitzero"`
	// Kept: a freeze promoted with `sbx snapshot keep`.
	Kept bool `json:"kept,omitempty"`
}

// PruneRequest is the body of POST /v1/storage/prune. Without Orphans and
// Freezes, orphans are pruned.
type PruneRequest struct {
	// Orphans removes images no sandbox or snapshot owns (a deleted
	// sandbox's hibernation image), before their grace ends.
	Orphans bool `json:"orphans,omitempty"`
	// Freezes removes freeze snapshots (crash captures too) not promoted
	// with `sbx snapshot keep`.
	Freezes bool `json:"freezes,omitempty"`
	// OlderThan prunes only what is older than this (a duration: "2h",
	// "3600"); "" : whatever its age.
	OlderThan Duration `json:"olderThan,omitempty"`
	// DryRun says what would be removed, and removes nothing.
	DryRun bool `json:"dryRun,omitempty"`
}

// PruneResult is the answer of a prune: what it removed (or, with DryRun,
// would remove), and the bytes that freed.
type PruneResult struct {
	Removed   []StorageItem `json:"removed"`
	Reclaimed int64         `json:"reclaimedBytes"`
	DryRun    bool          `json:"dryRun,omitempty"`
}

// DeleteOptions say what a delete takes besides the sandbox (the query of
// DELETE /v1/sandboxes/{id}: withSnapshots=1, keepFreezes=1).
type DeleteOptions struct {
	// WithSnapshots also removes every snapshot taken of it.
	WithSnapshots bool
	// KeepFreezes keeps its freezes: they are marked kept, and outlive it.
	// Without it its freezes go, save those promoted (sbx snapshot keep).
	KeepFreezes bool
}
