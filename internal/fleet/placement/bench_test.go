package placement

import (
	"context"
	"fmt"
	"math"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"sbx.dev/sbx/internal/fleet/v1alpha1"
)

// BenchmarkPlace100Nodes places 10,000 Sandboxes on 100 simulated nodes
// (SandboxNodes, Ready, of four sizes) through client-go's fake, whose
// writes are resourceVersion-checked as an apiserver's (apiserver in
// fake_test.go). No runsc, no apiserver latency: what it measures is the
// placer's own cost and its round trips.
//
// The fleet: nodes of 64, 96, 128 and 128 GiB (32, 48, 64, 64 CPUs, 2 TiB
// of disk); ten of them run another runsc. The sandboxes: 256 MiB to
// 2 GiB, one in four asking a CPU, forks of 1,000 parents (ten each), and
// one in five a restore of an image whose memory is required, recorded on
// the common runsc, with layers held by a tenth of the nodes each. They
// ask 90% of the fleet's memory.
//
// Reported: placements/s; round trips/placement (the fake's actions
// during Place over the placements); worst-mem/cap, the fullest node's
// bound memory over its capacity (must be <= 1); and the spread:
// max/min-sandboxes and max/min-mem-used (the fullest node's share of its
// memory over the emptiest's). It fails if a sandbox is left unplaced,
// bound twice, or bound past its node's memory or CPUs, or a memory
// restore lands on a node of the other runsc.
func BenchmarkPlace100Nodes(b *testing.B) {
	const nodes, sandboxes = 100, 10_000
	for range b.N {
		b.StopTimer()
		s := newAPIServer(b)
		caps, oldRunsc := map[string]v1alpha1.Capacity{}, map[string]bool{}
		for i := range nodes {
			mem := []int64{64, 96, 128, 128}[i%4]
			n := testNode(fmt.Sprintf("node-%03d", i), mem, int(mem/2))
			n.Status.Capacity.DiskFreeBytes = 2048 * gib
			n.Status.Layers = []string{fmt.Sprintf("sha256:layer-%d", i%10)}
			if i >= nodes-10 {
				n.Status.RunscSHA256 = "runsc-old"
				oldRunsc[n.Name] = true
			}
			caps[n.Name] = n.Status.Capacity
			s.put(b, n)
		}
		for i := range sandboxes {
			sb := testSandbox(fmt.Sprintf("sb-%05d", i), 0, time.Duration(i)*time.Millisecond)
			sb.Spec.MemoryBytes = []int64{256 << 20, 512 << 20, 1 << 30, 2 << 30}[i%4]
			sb.Spec.DiskBytes = 4 * gib
			if i%4 == 1 {
				sb.Spec.CPUs = "1"
			}
			sb.Spec.Parent = fmt.Sprintf("sb_parent%04d", i/10)
			if i%5 == 0 {
				sb.Spec.Image = memoryImage(true, fmt.Sprintf("sha256:layer-%d", (i/5)%10))
			}
			s.put(b, sb)
		}
		p := newTestPlacer(s)
		s.dyn.ClearActions()
		b.StartTimer()

		start := time.Now()
		round, err := p.Place(context.Background())
		elapsed := time.Since(start)

		b.StopTimer()
		if err != nil {
			b.Fatal(err)
		}
		trips := len(s.dyn.Actions())
		if len(round.Placed) != sandboxes {
			b.Fatalf("placed %d of %d; %d wait, the first: %+v", len(round.Placed), sandboxes, len(round.Waiting), round.Waiting[:min(len(round.Waiting), 1)])
		}
		// judge by what the apiserver holds, not the placer's tally
		l, err := s.dyn.Resource(v1alpha1.SandboxesResource).Namespace(v1alpha1.DefaultNamespace).List(context.Background(), metav1.ListOptions{})
		if err != nil {
			b.Fatal(err)
		}
		mem, cpus, count := map[string]int64{}, map[string]int64{}, map[string]int{}
		for i := range l.Items {
			var sb v1alpha1.Sandbox
			if err := v1alpha1.FromUnstructured(&l.Items[i], &sb); err != nil {
				b.Fatal(err)
			}
			n := sb.Spec.NodeName
			if binds := s.bindsOf(sb.Name); len(binds) != 1 {
				b.Fatalf("%s bound %d times: %v", sb.Name, len(binds), binds)
			}
			if sb.Spec.Image != nil && oldRunsc[n] {
				b.Fatalf("%s, a memory restore of runsc-a, placed on %s of runsc-old", sb.Name, n)
			}
			r, _ := RequestOf(&sb, Defaults{})
			mem[n] += r.MemoryBytes
			cpus[n] += r.MilliCPUs
			count[n]++
		}
		worst, minShare, maxShare := 0.0, math.Inf(1), 0.0
		minCount, maxCount := math.MaxInt, 0
		for n, c := range caps {
			share := float64(mem[n]) / float64(c.MemoryBytes)
			if cpus[n] > int64(c.CPUs)*1000 {
				b.Fatalf("%s: %d milli-CPUs bound of %d CPUs", n, cpus[n], c.CPUs)
			}
			worst, minShare, maxShare = max(worst, share), min(minShare, share), max(maxShare, share)
			minCount, maxCount = min(minCount, count[n]), max(maxCount, count[n])
		}
		if worst > 1 {
			b.Fatalf("a node holds %.3f of its memory", worst)
		}
		b.ReportMetric(float64(len(round.Placed))/elapsed.Seconds(), "placements/s")
		b.ReportMetric(float64(trips)/float64(len(round.Placed)), "roundtrips/placement")
		b.ReportMetric(worst, "worst-mem/cap")
		b.ReportMetric(float64(maxCount)/float64(max(minCount, 1)), "max/min-sandboxes")
		b.ReportMetric(maxShare/minShare, "max/min-mem-used")
		b.Logf("%d placed in %s: %d round trips; sandboxes per node %d to %d; memory used per node %.1f%% to %.1f%%",
			len(round.Placed), elapsed.Round(time.Millisecond), trips, minCount, maxCount, 100*minShare, 100*maxShare)
		b.StartTimer()
	}
}
