package e2e

import (
	"context"
	"fmt"
	"io"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"sbx.dev/sbx/api"
	"sbx.dev/sbx/client"
	"sbx.dev/sbx/internal/flaky"
)

// BenchmarkExplain measures what runtime monitoring costs on the bundled
// example, in one run: rounds of 16 memory forks with monitoring on and
// off, alternating, 4 runs at once, each run timed by flake-rate:
//
//   - the median run time with monitoring on / off (goal: under 1.2);
//   - the failure rate each way, with its interval: the two must overlap
//     (the observer effect, measured);
//   - the wall time of `sbx explain` with its defaults on the example
//     (goal: under 3 minutes on 2 cores).
func BenchmarkExplain(b *testing.B) {
	const n, rounds = 16, 2
	d := shared
	ctx := context.Background()
	sb, err := d.client.Create(ctx, client.WithTemplate("base"))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = deleteSandbox(context.Background(), d.client, sb.ID) })
	// /work is the user's, as `sbx scp` would leave it
	if _, err := sdk(d.client).Exec(ctx, sb.ID, api.ExecRequest{Cmd: []string{"sh", "-c", "mkdir -p /work && chown user /work"}, User: "root"}, io.Discard, io.Discard); err != nil {
		b.Fatal(err)
	}
	if err := prepareFlaky(ctx, d.client, sb.ID, flakyExampleTar(b), 0); err != nil {
		b.Fatal(err)
	}
	test := flaky.Test{Cmd: []string{"/bin/sh", "-c", "cd /work && ./test.sh"}}
	for i := 0; i < b.N; i++ {
		var on, off []time.Duration
		failed := map[bool]int{}
		runs := map[bool]int{}
		for r := 0; r < rounds; r++ {
			for _, monitor := range []bool{true, false} {
				res, err := flaky.FlakeRate(ctx, sdk(d.client), flaky.RateOptions{Sandbox: sb.ID, N: n, Parallel: 4, Test: test, Monitor: monitor})
				if err != nil {
					b.Fatal(err)
				}
				for _, run := range res.Runs {
					dur := time.Duration(run.DurationMs) * time.Millisecond
					if monitor {
						on = append(on, dur)
					} else {
						off = append(off, dur)
					}
				}
				failed[monitor] += res.Summary.Failures
				runs[monitor] += res.Summary.Runs
			}
		}
		mOn, mOff := median(on), median(off)
		ratio := float64(mOn) / float64(mOff)
		loOn, hiOn := flaky.Wilson(failed[true], runs[true])
		loOff, hiOff := flaky.Wilson(failed[false], runs[false])
		agree := loOn <= hiOff && loOff <= hiOn
		b.ReportMetric(ratio, "monitor-on/off")
		fmt.Printf("%-28s on %8.1f ms   off %8.1f ms   ratio %.2f   goal < 1.20   %s  (median of %d runs each)\n", "explain: run time, monitoring", ms(mOn), ms(mOff), ratio, verdict(ratio < 1.2), len(on))
		fmt.Printf("%-28s on %d/%d [%.0f%%, %.0f%%]   off %d/%d [%.0f%%, %.0f%%]   intervals overlap: %s\n", "explain: rate, monitoring", failed[true], runs[true], 100*loOn, 100*hiOn, failed[false], runs[false], 100*loOff, 100*hiOff, verdict(agree))

		start := time.Now()
		cmd := exec.Command(filepath.Join(binDir, "sbx"), "explain", sb.ID, "--", "cd /work && ./test.sh")
		cmd.Env = append(cmd.Environ(), "SBX_HOST=unix://"+d.socket)
		if out, err := cmd.CombinedOutput(); err != nil {
			b.Fatalf("sbx explain: %v\n%s", err, out)
		}
		wall := time.Since(start)
		b.ReportMetric(wall.Seconds(), "explain-wall-s")
		fmt.Printf("%-28s %8.1f s   goal < 180 s   %s\n", "explain: wall time, defaults", wall.Seconds(), verdict(wall < 3*time.Minute))
	}
}
