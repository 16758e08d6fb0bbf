package e2e

import (
	"context"
	"fmt"
	"sort"
	"testing"
	"time"

	"sbx.dev/sbx/client"
)

// BenchmarkFleetCreate: a create through the fleet's controller (a Sandbox
// object, placed, made by its node's agent, answered once made) against a
// create through one node's own API, the same template, in the same run,
// alternating; each sandbox is deleted outside the timing. Goal: at most
// 1.5 times the single sbxd.
func BenchmarkFleetCreate(b *testing.B) {
	f := startFleet(b, 2)
	token := f.env["SBX_TOKEN"]
	ctrl, err := client.New(f.env["SBX_CONTROLLER"], client.WithToken(token))
	if err != nil {
		b.Fatal(err)
	}
	node, err := client.New("tcp://"+f.nodes[0].addr, client.WithToken(token))
	if err != nil {
		b.Fatal(err)
	}
	f.sbx(b, "--host=tcp://"+f.nodes[0].addr, "template", "build", "tiny")
	ctx := context.Background()
	create := func(c *client.Client) time.Duration {
		start := time.Now()
		sb, err := c.Create(ctx, client.WithTemplate("tiny"))
		d := time.Since(start)
		if err != nil {
			b.Fatal(err)
		}
		b.StopTimer()
		if _, err := c.Sandbox(sb.ID).Delete(ctx); err != nil {
			b.Fatalf("delete %s: %v", sb.ID, err)
		}
		b.StartTimer()
		return d
	}
	create(ctrl) // warm both paths: the first of each is not a figure
	create(node)
	var fleetT, nodeT []time.Duration
	b.ResetTimer()
	for range b.N {
		fleetT = append(fleetT, create(ctrl))
		nodeT = append(nodeT, create(node))
	}
	b.StopTimer()
	if b.N == 1 {
		return // the calibration round
	}
	mf, mn := median(fleetT), median(nodeT)
	ratio := float64(mf) / float64(mn)
	b.ReportMetric(float64(mf.Microseconds())/1000, "fleet-ms")
	b.ReportMetric(float64(mn.Microseconds())/1000, "sbxd-ms")
	b.ReportMetric(ratio, "ratio")
	verdict := "met"
	if ratio > 1.5 {
		verdict = "MISSED"
	}
	fmt.Printf("%-28s fleet %8.1f ms   one sbxd %8.1f ms   ratio %.2f   goal ≤ 1.50   %s  (medians of %d)\n",
		"create through the fleet", float64(mf.Microseconds())/1000, float64(mn.Microseconds())/1000, ratio, verdict, len(fleetT))
}

func median(ds []time.Duration) time.Duration {
	s := append([]time.Duration(nil), ds...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	return s[len(s)/2]
}
