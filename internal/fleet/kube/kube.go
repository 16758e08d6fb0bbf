// Package kube makes the apiserver clients the fleet's node agent and
// controller speak with, from a kubeconfig, in one way.
package kube

import (
	"fmt"
	"time"

	"k8s.io/client-go/dynamic"
	coordclient "k8s.io/client-go/kubernetes/typed/coordination/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"sbx.dev/sbx/api"
)

// RequestTimeout bounds every request to the apiserver.
const RequestTimeout = 10 * time.Second

// Config reads kubeconfig into a rest.Config with sbx's timeout, rate
// and user agent; one it cannot read is api.ErrInvalid. It does not reach
// the apiserver.
func Config(kubeconfig, userAgent string) (*rest.Config, error) {
	rc, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return nil, api.Errorf(api.ErrInvalid, "fleet: kubeconfig %s: %v", kubeconfig, err)
	}
	rc.Timeout = RequestTimeout
	rc.QPS, rc.Burst = 50, 100
	rc.UserAgent = userAgent
	return rc, nil
}

// Clients are what the fleet's parts use: the dynamic client for the
// sbx.dev resources, and coordination for the nodes' Leases.
type Clients struct {
	Dynamic dynamic.Interface
	Coord   coordclient.CoordinationV1Interface
}

// NewClients makes the Clients of rc.
func NewClients(rc *rest.Config) (Clients, error) {
	dyn, err := dynamic.NewForConfig(rc)
	if err != nil {
		return Clients{}, fmt.Errorf("fleet: %w", err)
	}
	coord, err := coordclient.NewForConfig(rc)
	if err != nil {
		return Clients{}, fmt.Errorf("fleet: %w", err)
	}
	return Clients{Dynamic: dyn, Coord: coord}, nil
}
