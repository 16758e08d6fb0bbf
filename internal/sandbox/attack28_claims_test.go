package sandbox

import (
	"context"
	"math/rand"
	"sync"
	"testing"
	"time"
)

// TestAttack28ClaimsStress: claims, starts, tryClaims and idles of one id,
// many with contexts cancelled at random moments, leave no entry behind
// and never hold a whole claim beside a start.
func TestAttack28ClaimsStress(t *testing.T) {
	var k claims
	var mu sync.Mutex
	whole, shared := 0, 0
	check := func() {
		if whole > 1 || (whole == 1 && shared > 0) {
			t.Errorf("whole %d beside shared %d", whole, shared)
		}
	}
	ops := []string{kindStop, kindDelete, kindResume, kindFork, "exec-end", "reap"}
	var wg sync.WaitGroup
	for g := 0; g < 8; g++ {
		wg.Add(1)
		go func(g int) {
			defer wg.Done()
			r := rand.New(rand.NewSource(int64(g)))
			for i := 0; i < 400; i++ {
				ctx, cancel := context.WithTimeout(context.Background(), time.Duration(r.Intn(300))*time.Microsecond)
				switch r.Intn(4) {
				case 0, 1:
					if rel, err := k.claim(ctx, "a", ops[r.Intn(len(ops))]); err == nil {
						mu.Lock()
						whole++
						check()
						mu.Unlock()
						time.Sleep(time.Duration(r.Intn(50)) * time.Microsecond)
						mu.Lock()
						whole--
						mu.Unlock()
						rel()
						rel()
					}
				case 2:
					if rel, err := k.start(ctx, "a"); err == nil {
						mu.Lock()
						shared++
						check()
						mu.Unlock()
						time.Sleep(time.Duration(r.Intn(50)) * time.Microsecond)
						mu.Lock()
						shared--
						mu.Unlock()
						rel()
					}
				case 3:
					if r.Intn(2) == 0 {
						if rel, ok := k.tryClaim("a", "reap"); ok {
							mu.Lock()
							whole++
							check()
							mu.Unlock()
							mu.Lock()
							whole--
							mu.Unlock()
							rel()
						}
					} else {
						_ = k.idle(ctx, "a")
					}
				}
				cancel()
			}
		}(g)
	}
	within(t, "the stress", wg.Wait)
	k.mu.Lock()
	defer k.mu.Unlock()
	if len(k.m) != 0 {
		t.Fatalf("entries left: %+v", k.m["a"])
	}
}
