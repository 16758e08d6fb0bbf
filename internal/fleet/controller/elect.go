package controller

import (
	"context"
	"fmt"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
)

// Replicas of the controller elect one leader with client-go's leader
// election on a Lease: only the leader runs Run (the nodes' Leases read,
// lost nodes marked, unbound Sandboxes placed), so placement counts each
// node's room in one place. Every replica serves the API: what it does
// there is a node's call or an object's write preconditioned on what it
// read, and a create through a follower is placed by the leader at its
// next tick (CheckEvery).
const (
	// LeaderLease is the Lease, in the controller's namespace, the
	// replicas elect their leader with.
	LeaderLease = "sbx-controller"

	// A follower takes over once the leader has not renewed for
	// leaderLeaseFor; the leader gives up if it cannot renew within
	// leaderRenew; candidates try every leaderRetry. A leader stopped with
	// SIGTERM releases the Lease, and a follower takes over at its next try.
	leaderLeaseFor = 15 * time.Second
	leaderRenew    = 10 * time.Second
	leaderRetry    = 2 * time.Second
)

// Leading says whether this replica leads (RunElected); one that runs Run
// without an election leads.
func (c *Controller) Leading() bool { return c.leading.Load() }

// RunElected runs Run while this replica, identity, leads, until ctx ends:
// it stands for election, leads until it loses the Lease, and stands
// again. identity must be the same across restarts of one replica (its
// host and listen address): a replica killed and started again takes its
// Lease back at once, not after leaderLeaseFor.
func (c *Controller) RunElected(ctx context.Context, identity string) error {
	lock := &resourcelock.LeaseLock{
		LeaseMeta:  metav1.ObjectMeta{Name: LeaderLease, Namespace: c.cfg.Namespace},
		Client:     c.coord,
		LockConfig: resourcelock.ResourceLockConfig{Identity: identity},
	}
	cfg := leaderelection.LeaderElectionConfig{
		Lock:            lock,
		Name:            LeaderLease,
		LeaseDuration:   leaderLeaseFor,
		RenewDeadline:   leaderRenew,
		RetryPeriod:     leaderRetry,
		ReleaseOnCancel: true,
		Callbacks: leaderelection.LeaderCallbacks{
			OnStartedLeading: func(ctx context.Context) {
				c.leading.Store(true)
				c.log.Info("fleet: this controller leads", "identity", identity)
				c.Run(ctx)
			},
			OnStoppedLeading: func() {
				// called at every end of a round, led or not
				if c.leading.Swap(false) {
					c.log.Info("fleet: this controller no longer leads", "identity", identity)
				}
			},
			OnNewLeader: func(id string) {
				if id != identity {
					c.log.Info("fleet: another controller leads; this one serves the API and stands by", "leader", id)
				}
			},
		},
	}
	for ctx.Err() == nil {
		// an elector per round: one round ends when the lead is lost (or
		// ctx ends), and the next stands again from nothing
		le, err := leaderelection.NewLeaderElector(cfg)
		if err != nil {
			return fmt.Errorf("fleet: leader election: %w", err)
		}
		le.Run(ctx)
	}
	return nil
}
