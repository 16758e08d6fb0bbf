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
	Cordoned    bool       `json:"cordoned"`
	Sandboxes   int        `json:"sandboxes"`
	CPUs        int        `json:"cpus,omitempty"`
	Memory      int64      `json:"memoryBytes,omitempty"`
	RunscSHA256 string     `json:"runscSHA256,omitempty"`
	Version     string     `json:"version,omitempty"`
	Renewed     *time.Time `json:"leaseRenewed,omitempty"`
}
