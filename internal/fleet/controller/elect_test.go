package controller

import (
	"context"
	"io"
	"log/slog"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"sbx.dev/sbx/internal/fleet/v1alpha1"
)

// TestLeaderElection: of two replicas one leads (holds the Lease, runs
// Run), the other stands by; the leader stopped releases the Lease and the
// other leads; a replica started again under the identity that holds the
// Lease leads at once, and a third does not.
func TestLeaderElection(t *testing.T) {
	f := newTestFleet(t, nil)
	replica := func() *Controller {
		return NewWith(Config{Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), Now: f.c.cfg.Now}, f.dyn, f.kube.CoordinationV1())
	}
	run := func(c *Controller, id string) (stop func()) {
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() {
			defer close(done)
			if err := c.RunElected(ctx, id); err != nil {
				t.Error(err)
			}
		}()
		return func() { cancel(); <-done }
	}
	holder := func() string {
		l, err := f.kube.CoordinationV1().Leases(v1alpha1.DefaultNamespace).Get(context.Background(), LeaderLease, metav1.GetOptions{})
		if err != nil || l.Spec.HolderIdentity == nil {
			return ""
		}
		return *l.Spec.HolderIdentity
	}
	until := func(what string, cond func() bool) {
		t.Helper()
		for deadline := time.Now().Add(20 * time.Second); !cond(); time.Sleep(20 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("gave up waiting for %s", what)
			}
		}
	}
	a, b := replica(), replica()
	stopA := run(a, "host/a")
	until("a to lead", a.Leading)
	stopB := run(b, "host/b")
	defer stopB()
	// b tries at least twice while a holds the Lease
	for end := time.Now().Add(2*leaderRetry + time.Second); time.Now().Before(end); time.Sleep(50 * time.Millisecond) {
		if b.Leading() {
			t.Fatal("b leads while a holds the Lease")
		}
	}
	if h := holder(); h != "host/a" {
		t.Fatalf("the Lease is held by %q, want host/a", h)
	}
	stopA()
	if a.Leading() {
		t.Error("a stopped, and still says it leads")
	}
	until("b to lead once a released the Lease", b.Leading)
	if h := holder(); h != "host/b" {
		t.Fatalf("the Lease is held by %q, want host/b", h)
	}
}

// TestLeaderTakesItsLeaseBack: a replica killed (its Lease not released,
// not expired) and started again under the same identity leads at once;
// another identity waits for the Lease to expire.
func TestLeaderTakesItsLeaseBack(t *testing.T) {
	f := newTestFleet(t, nil)
	now := metav1.NewMicroTime(time.Now())
	secs := int32(leaderLeaseFor / time.Second)
	id := "host/killed"
	if _, err := f.kube.CoordinationV1().Leases(v1alpha1.DefaultNamespace).Create(context.Background(), &coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{Name: LeaderLease, Namespace: v1alpha1.DefaultNamespace},
		Spec:       coordinationv1.LeaseSpec{HolderIdentity: &id, LeaseDurationSeconds: &secs, AcquireTime: &now, RenewTime: &now},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	other := NewWith(Config{Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), Now: f.c.cfg.Now}, f.dyn, f.kube.CoordinationV1())
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go other.RunElected(ctx, "host/other")
	go f.c.RunElected(ctx, id)
	deadline := time.Now().Add(leaderLeaseFor - 2*time.Second)
	for !f.c.Leading() {
		if time.Now().After(deadline) {
			t.Fatal("the restarted replica did not take its own Lease back before it expired")
		}
		time.Sleep(20 * time.Millisecond)
	}
	if other.Leading() {
		t.Error("another identity leads while the Lease is held")
	}
}
