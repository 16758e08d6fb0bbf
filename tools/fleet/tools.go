//go:build tools

// Package fleet pins the control plane sbx's fleet runs on (issue 24):
// kube-apiserver, kubectl, etcd and the OCI registry that stores portable
// snapshots. `make fleet-tools` builds them once per version into a cache
// outside the tree; nothing in sbx links them.
package fleet

import (
	_ "github.com/distribution/distribution/v3/cmd/registry"
	_ "go.etcd.io/etcd/server/v3"
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kubectl"
)
