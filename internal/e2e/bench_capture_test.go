package e2e

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"sbx.dev/sbx/api"
	"sbx.dev/sbx/client"
	"sbx.dev/sbx/internal/runsc"
)

// BenchmarkMemoryFork: one memory fork of a small sandbox through the API
// (checkpoint of the parent, restore of the child, network, records)
// against raw runsc doing the same work: `runsc checkpoint --leave-running`
// of a sandbox of the same kind, then `runsc restore` of the image. The raw
// restore alone is printed too.
func BenchmarkMemoryFork(b *testing.B) {
	ctx := context.Background()
	parent, err := shared.client.Create(ctx, client.WithTemplate("tiny"))
	if err != nil {
		b.Fatal(err)
	}
	defer deleteSandbox(ctx, shared.client, parent.ID)
	raw := newRawRunsc(b)
	src := "raw-" + randHex(4)
	raw.run(b, src)
	defer raw.d.Delete(ctx, src)
	var sbxT, rawT, restoreT []time.Duration
	for i := 0; i < b.N; i++ {
		start := time.Now()
		kids, err := sdk(shared.client).Fork(ctx, parent.ID, api.ForkRequest{Memory: true})
		if err != nil {
			b.Fatal(err)
		}
		sbxT = append(sbxT, time.Since(start))
		b.StopTimer()
		deleteSandbox(ctx, shared.client, kids[0].ID)
		b.StartTimer()

		id := "raw-" + randHex(4)
		img := filepath.Join(raw.dir, "image-"+id)
		start = time.Now()
		if err := raw.d.Checkpoint(ctx, src, img, true); err != nil {
			b.Fatal(err)
		}
		mid := time.Now()
		raw.restore(b, id, img, false)
		rawT = append(rawT, time.Since(start))
		restoreT = append(restoreT, time.Since(mid))
		b.StopTimer()
		raw.d.Delete(ctx, id)
		os.RemoveAll(img)
		b.StartTimer()
	}
	report(b, "memory fork (1 child)", sbxT, rawT)
	if b.N > 1 {
		fmt.Printf("%-28s raw runsc restore alone %6.1f ms: sbx fork / raw restore = %.2f\n", "", float64(median(restoreT).Microseconds())/1000, float64(median(sbxT))/float64(median(restoreT)))
	}
}

// BenchmarkFork16: wall time of `fork --memory --count 16` of a small sandbox.
func BenchmarkFork16(b *testing.B) {
	ctx := context.Background()
	parent, err := shared.client.Create(ctx, client.WithTemplate("tiny"))
	if err != nil {
		b.Fatal(err)
	}
	defer deleteSandbox(ctx, shared.client, parent.ID)
	var ts []time.Duration
	for i := 0; i < b.N; i++ {
		start := time.Now()
		kids, err := sdk(shared.client).Fork(ctx, parent.ID, api.ForkRequest{Memory: true, Count: 16})
		if err != nil {
			b.Fatal(err)
		}
		ts = append(ts, time.Since(start))
		b.StopTimer()
		for _, k := range kids {
			deleteSandbox(ctx, shared.client, k.ID)
		}
		b.StartTimer()
	}
	m := median(ts)
	b.ReportMetric(float64(m.Milliseconds()), "ms/16-forks")
	if b.N > 1 {
		fmt.Printf("%-28s sbx %8.0f ms for 16 children (median of %d)\n", "fork --memory --count 16", float64(m.Milliseconds()), len(ts))
	}
}

// allocPy dirties 1 GiB and then waits.
const allocPy = `import time
b = bytearray(1 << 30)
for i in range(0, len(b), 4096):
    b[i] = 1
open('/tmp/ready', 'w').write('ok')
while True:
    time.sleep(1)
`

// BenchmarkStopResume1GiB: stop and resume of a sandbox with 1 GiB of dirty
// memory, against raw `runsc checkpoint` and `runsc restore` of the same.
// Resume is timed to the first successful exec.
func BenchmarkStopResume1GiB(b *testing.B) {
	ctx := context.Background()
	sb, err := shared.client.Create(ctx, client.WithTemplate("base"), client.WithMemoryLimit(3<<30))
	if err != nil {
		b.Fatal(err)
	}
	defer deleteSandbox(ctx, shared.client, sb.ID)
	if err := sdk(shared.client).WriteFile(ctx, sb.ID, "/root/alloc.py", strings.NewReader(allocPy), int64(len(allocPy)), 0o644); err != nil {
		b.Fatal(err)
	}
	if _, err := sdk(shared.client).ExecDetached(ctx, sb.ID, api.ExecRequest{Cmd: []string{"python3", "/root/alloc.py"}}); err != nil {
		b.Fatal(err)
	}
	waitReady := func(run func() bool) {
		deadline := time.Now().Add(2 * time.Minute)
		for time.Now().Before(deadline) && !run() {
			time.Sleep(200 * time.Millisecond)
		}
	}
	waitReady(func() bool {
		e, err := sdk(shared.client).Exec(ctx, sb.ID, api.ExecRequest{Cmd: []string{"test", "-f", "/tmp/ready"}}, io.Discard, io.Discard)
		return err == nil && *e.ExitCode == 0
	})

	// Raw: the same script as the first process of a base sandbox.
	raw := newRawRunscTemplate(b, "base", []string{"python3", "-c", allocPy})
	src := "raw-" + randHex(4)
	raw.run(b, src)
	defer raw.d.Delete(ctx, src)
	waitReady(func() bool {
		code, err := raw.d.Exec(ctx, src, runsc.ExecOptions{Args: []string{"/usr/bin/test", "-f", "/tmp/ready"}}, nil, io.Discard, io.Discard)
		return err == nil && code == 0
	})

	var stopT, rawCkT, resumeT, rawRsT []time.Duration
	for i := 0; i < b.N; i++ {
		start := time.Now()
		if _, err := shared.client.Sandbox(sb.ID).Stop(ctx); err != nil {
			b.Fatal(err)
		}
		stopT = append(stopT, time.Since(start))
		start = time.Now()
		if _, err := shared.client.Sandbox(sb.ID).Resume(ctx, client.RequireMemory()); err != nil {
			b.Fatal(err)
		}
		if _, err := sdk(shared.client).Exec(ctx, sb.ID, api.ExecRequest{Cmd: []string{"true"}}, io.Discard, io.Discard); err != nil {
			b.Fatal(err)
		}
		resumeT = append(resumeT, time.Since(start))

		img := filepath.Join(raw.dir, "img-"+randHex(3))
		start = time.Now()
		if err := raw.d.Checkpoint(ctx, src, img, false); err != nil {
			b.Fatal(err)
		}
		rawCkT = append(rawCkT, time.Since(start))
		raw.d.Delete(ctx, src)
		start = time.Now()
		raw.restore(b, src, img, true)
		if _, err := raw.d.Exec(ctx, src, runsc.ExecOptions{Args: []string{"/bin/true"}}, nil, io.Discard, io.Discard); err != nil {
			b.Fatal(err)
		}
		rawRsT = append(rawRsT, time.Since(start))
		os.RemoveAll(img)
	}
	report(b, "stop, 1 GiB dirty", stopT, rawCkT)
	report(b, "resume 1 GiB to first exec", resumeT, rawRsT)
}
