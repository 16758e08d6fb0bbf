// Package agent makes an sbxd a node of an sbx fleet on Kubernetes: it
// publishes the node's SandboxNode, heartbeats its Lease, and mirrors the
// node's sandboxes as Sandbox objects. It sees sbxd only through Source
// (the manager's public surface); the manager knows nothing of Kubernetes.
// Nothing the apiserver does is fatal: errors are logged and retried.
package agent

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/dynamic"
	coordclient "k8s.io/client-go/kubernetes/typed/coordination/v1"
	"k8s.io/client-go/rest"

	"sbx.dev/sbx/api"
	"sbx.dev/sbx/internal/fleet/kube"
	"sbx.dev/sbx/internal/fleet/v1alpha1"
)

// Source is what the agent reads of sbxd, and how it makes the sandboxes
// bound to its node: *sandbox.Manager has it.
type Source interface {
	// Changed is closed at the next change of any sandbox's state.
	Changed() <-chan struct{}
	List(ctx context.Context) ([]api.Sandbox, error)
	Create(ctx context.Context, req api.CreateRequest) (*api.Sandbox, error)
	// Delete deletes sandbox ref, as `sbx rm` does; withSnapshots is
	// false here (a sandbox's snapshots outlive it).
	Delete(ctx context.Context, ref string, withSnapshots bool) (*api.DeleteResult, error)
}

// Defaults of Config.
const (
	DefaultLeaseDuration = 15 * time.Second
	DefaultRenewEvery    = 5 * time.Second
	DefaultPublishEvery  = 30 * time.Second
	DefaultResync        = 30 * time.Second
	DefaultSnapshotEvery = 5 * time.Second
	maxBackoff           = 30 * time.Second
)

// Config is what an Agent needs; zero durations take the defaults.
type Config struct {
	// Kubeconfig is the path of the fleet's kubeconfig.
	Kubeconfig string
	// Node names the SandboxNode, the Lease and the label of the Sandboxes.
	Node string
	// Namespace holds the Sandboxes and the Lease (v1alpha1.DefaultNamespace).
	Namespace string
	Facts     Facts
	Source    Source
	Logger    *slog.Logger
	// Layers, if not nil, are the digests of what the node holds that a
	// pull placed on it need not fetch (SandboxNodeStatus.Layers), read at
	// every publish.
	Layers func() []string
	// Agents, if not nil, are the builds of the in-sandbox agent the node
	// holds (SandboxNodeStatus.Agents), read at every publish.
	Agents func() []string
	// Templates, if not nil, lists the node's templates, mirrored as
	// SandboxTemplate objects every SnapshotEvery.
	Templates func() ([]api.Template, error)

	LeaseDuration time.Duration // the Lease's leaseDurationSeconds
	RenewEvery    time.Duration // how often the Lease is renewed
	PublishEvery  time.Duration // how often the SandboxNode's status is refreshed
	Resync        time.Duration // how often the Sandboxes are compared without a change
	SnapshotEvery time.Duration // how often the SandboxSnapshots are compared
}

// Agent is one node agent. Run it with Run.
type Agent struct {
	cfg   Config
	dyn   dynamic.Interface
	coord coordclient.CoordinationV1Interface
	log   *slog.Logger
	now   func() time.Time

	sandboxes atomic.Int64 // how many the last mirror saw
}

// New makes an Agent from cfg; a kubeconfig it cannot read is an error
// (api.ErrInvalid). It does not reach the apiserver.
func New(cfg Config) (*Agent, error) {
	if cfg.Node == "" {
		return nil, api.Errorf(api.ErrInvalid, "fleet: a node name is needed (--node-name)")
	}
	if cfg.Source == nil {
		return nil, errors.New("fleet: no source of sandboxes")
	}
	rc, err := kube.Config(cfg.Kubeconfig, "sbxd/"+cfg.Facts.Version+" (node "+cfg.Node+")")
	if err != nil {
		return nil, err
	}
	return newWith(cfg, rc)
}

func newWith(cfg Config, rc *rest.Config) (*Agent, error) {
	c, err := kube.NewClients(rc)
	if err != nil {
		return nil, err
	}
	dyn, coord := c.Dynamic, c.Coord
	if cfg.Namespace == "" {
		cfg.Namespace = v1alpha1.DefaultNamespace
	}
	for _, d := range []struct {
		v   *time.Duration
		def time.Duration
	}{{&cfg.LeaseDuration, DefaultLeaseDuration}, {&cfg.RenewEvery, DefaultRenewEvery}, {&cfg.PublishEvery, DefaultPublishEvery}, {&cfg.Resync, DefaultResync}, {&cfg.SnapshotEvery, DefaultSnapshotEvery}} {
		if *d.v <= 0 {
			*d.v = d.def
		}
	}
	log := cfg.Logger
	if log == nil {
		log = slog.Default()
	}
	return &Agent{cfg: cfg, dyn: dyn, coord: coord, log: log.With("fleet_node", cfg.Node), now: time.Now}, nil
}

// Run publishes, heartbeats and mirrors until ctx ends.
func (a *Agent) Run(ctx context.Context) {
	a.log.Info("fleet node agent", "namespace", a.cfg.Namespace, "address", a.cfg.Facts.Address)
	var wg sync.WaitGroup
	wg.Go(func() { a.every(ctx, "lease", a.cfg.RenewEvery, a.renewLease) })
	wg.Go(func() { a.every(ctx, "node", a.cfg.PublishEvery, a.publishNode) })
	wg.Go(func() { a.mirror(ctx) })
	wg.Go(func() { a.every(ctx, "snapshots", a.cfg.SnapshotEvery, a.mirrorSnapshots) })
	if a.cfg.Templates != nil {
		wg.Go(func() { a.every(ctx, "templates", a.cfg.SnapshotEvery, a.mirrorTemplates) })
	}
	wg.Wait()
}

// backoff is how long to wait after the n-th failure in a row (n >= 1):
// from half a second, doubling, at most limit.
func backoff(n int, limit time.Duration) time.Duration {
	d := 500 * time.Millisecond
	for i := 1; i < n && d < limit; i++ {
		d *= 2
	}
	return min(d, limit)
}

// every runs fn every period, sooner again (with backoff) after a failure.
func (a *Agent) every(ctx context.Context, what string, period time.Duration, fn func(context.Context) error) {
	fails := 0
	for {
		wait := period
		if err := fn(ctx); err != nil && ctx.Err() == nil {
			fails++
			wait = backoff(fails, period)
			a.log.Warn("fleet: "+what+" failed; retrying", "err", err, "failures", fails, "retry_in", wait)
		} else if fails > 0 {
			a.log.Info("fleet: "+what+" recovered", "after_failures", fails)
			fails = 0
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
	}
}

// renewLease renews (or takes, or makes) the Lease named after the node.
func (a *Agent) renewLease(ctx context.Context) error {
	leases := a.coord.Leases(a.cfg.Namespace)
	now := metav1.NewMicroTime(a.now())
	secs := int32(a.cfg.LeaseDuration / time.Second)
	l, err := leases.Get(ctx, a.cfg.Node, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		l = &coordinationv1.Lease{
			ObjectMeta: metav1.ObjectMeta{Name: a.cfg.Node, Namespace: a.cfg.Namespace},
			Spec: coordinationv1.LeaseSpec{
				HolderIdentity: &a.cfg.Node, LeaseDurationSeconds: &secs,
				AcquireTime: &now, RenewTime: &now,
			},
		}
		if _, err := leases.Create(ctx, l, metav1.CreateOptions{}); err != nil {
			return fmt.Errorf("create lease %s/%s: %w", a.cfg.Namespace, a.cfg.Node, err)
		}
		return nil
	}
	if err != nil {
		return fmt.Errorf("get lease %s/%s: %w", a.cfg.Namespace, a.cfg.Node, err)
	}
	if l.Spec.HolderIdentity == nil || *l.Spec.HolderIdentity != a.cfg.Node {
		l.Spec.HolderIdentity, l.Spec.AcquireTime = &a.cfg.Node, &now
	}
	l.Spec.LeaseDurationSeconds, l.Spec.RenewTime = &secs, &now
	if _, err := leases.Update(ctx, l, metav1.UpdateOptions{}); err != nil {
		return fmt.Errorf("renew lease %s/%s: %w", a.cfg.Namespace, a.cfg.Node, err)
	}
	return nil
}
