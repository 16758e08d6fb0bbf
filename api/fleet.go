package api

import "time"

// Node is one machine of an sbx fleet (a SandboxNode and its Lease), as
// the fleet's controller sees it. A single sbxd has no nodes.
type Node struct {
	Name    string `json:"name"`
	Address string `json:"address,omitempty"`
	// Ready: its node agent renews its Lease. Reason says why not.
	Ready  bool   `json:"ready"`
	Reason string `json:"reason,omitempty"`
	// Cordoned: no new sandbox is placed on it (sbx node cordon).
	Cordoned    bool   `json:"cordoned"`
	Sandboxes   int    `json:"sandboxes"`
	CPUs        int    `json:"cpus,omitempty"`
	Memory      int64  `json:"memoryBytes,omitempty"`
	RunscSHA256 string `json:"runscSHA256,omitempty"`
	// Agents are the builds of the in-sandbox agent it holds, the one
	// it boots new sandboxes on first.
	Agents  []string   `json:"agents,omitempty"`
	Version string     `json:"version,omitempty"`
	Renewed *time.Time `json:"leaseRenewed,omitempty"`
}

// DrainResult is the answer of POST /v1/nodes/{name}/drain: the node is
// cordoned, and each of its sandboxes moved, or not and why.
type DrainResult struct {
	Node  string       `json:"node"`
	Moves []MoveResult `json:"moves"`
}

// MoveResult is one sandbox's move off a drained node.
type MoveResult struct {
	ID   string `json:"id"`
	From string `json:"from"`
	// To is the node it is on now ("" when it did not move).
	To string `json:"to,omitempty"`
	// State is its state once moved: a ready sandbox is stopped with its
	// memory, moved and resumed; a stopped one stays stopped.
	State State `json:"state,omitempty"`
	// Error says why it did not move ("" when it did).
	Error string `json:"error,omitempty"`
}

// A request that can wait a while through the fleet (a resume that
// requires its memory, waiting for a node where it restores) may ask to
// hear why it waits: with HeaderProgress "102" the controller sends, while
// it waits, an informational 102 (Processing) answer whose HeaderWaiting
// says why, once and again each time the why changes, before the final
// answer. Clients that do not ask are sent none (some HTTP stacks take a
// 102 for the answer).
const (
	HeaderProgress = "Sbx-Progress"
	HeaderWaiting  = "Sbx-Waiting"
)
