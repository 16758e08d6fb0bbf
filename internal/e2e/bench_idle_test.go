package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"testing"
	"time"

	"sbx.dev/sbx/api"
	"sbx.dev/sbx/client"
	"sbx.dev/sbx/internal/cgroup"
	"sbx.dev/sbx/internal/runsc"
)

// BenchmarkIdleCPU: what an idle sandbox costs the host, by its cgroup's
// own account (cpuacct.usage), against a raw runsc sandbox running the
// same init (the agent's, with no exec channel to keep) in a cgroup of the
// benchmark's own. Each side: idleSandboxes sandboxes of `tiny`, one exec of
// `true` in each, then their CPU over idleWindow, a second after the exec
// ("warm": sbx's channel pings every second for 30 s after a request) and
// again past channelWarm ("cold": every 2 s). The figure is CPU time a
// second of wall time, a sandbox's mean. No goal: issue 25's density goal
// is BenchmarkForkShare's; this says what an idle sandbox adds to it.
func BenchmarkIdleCPU(b *testing.B) {
	const idleSandboxes = 3
	const idleWindow = 10 * time.Second
	ctx := context.Background()
	raw := newRawRunsc(b)
	cg := "sbx-bench-raw-" + randHex(3)
	setRawCgroup(b, raw, "/"+cg)
	b.Cleanup(func() { removeCgroup(cg) })
	for i := 0; i < b.N; i++ {
		var ids, rawIDs []string
		for range idleSandboxes {
			sb, err := shared.client.Create(ctx, client.WithTemplate("tiny"))
			if err != nil {
				b.Fatal(err)
			}
			ids = append(ids, sb.ID)
			id := "raw-" + randHex(4)
			raw.run(b, id)
			rawIDs = append(rawIDs, id)
		}
		for j := range ids {
			if _, err := sdk(shared.client).Exec(ctx, ids[j], api.ExecRequest{Cmd: []string{"true"}}, io.Discard, io.Discard); err != nil {
				b.Fatal(err)
			}
			if code, err := raw.d.Exec(ctx, rawIDs[j], runsc.ExecOptions{Args: []string{"/bin/true"}}, nil, io.Discard, io.Discard); err != nil || code != 0 {
				b.Fatalf("raw exec: %v %d", err, code)
			}
		}
		usage := func() (sbx, raw time.Duration) {
			for _, id := range ids {
				u, ok := cgroup.Host.Group(cgroup.Path(shared.tag, id)).CPUUsage()
				if !ok {
					b.Fatalf("no CPU account for %s", id)
				}
				sbx += u
			}
			u, ok := cgroup.Host.Group("/" + cg).CPUUsage()
			if !ok {
				b.Fatalf("no CPU account in the raw sandboxes' cgroup %s", cg)
			}
			return sbx, u
		}
		perSecond := func(d time.Duration) float64 {
			return float64(d) / float64(time.Millisecond) / idleSandboxes / idleWindow.Seconds()
		}
		measure := func(what string) {
			s0, r0 := usage()
			time.Sleep(idleWindow)
			s1, r1 := usage()
			s, r := perSecond(s1-s0), perSecond(r1-r0)
			b.ReportMetric(s, what+"-sbx-ms/s")
			fmt.Printf("%-28s sbx %8.1f ms/s   raw runsc %8.1f ms/s   ratio %.2f   no goal (a figure; %d sandboxes of each, %s)\n",
				"idle sandbox CPU, "+what, s, r, s/max(r, 0.01), idleSandboxes, idleWindow)
		}
		time.Sleep(time.Second)
		measure("warm")
		time.Sleep(32*time.Second - idleWindow - time.Second) // channelWarm (30 s) past the exec
		measure("cold")
		b.StopTimer()
		for j := range ids {
			deleteSandbox(ctx, shared.client, ids[j])
			raw.d.Delete(ctx, rawIDs[j])
		}
		b.StartTimer()
	}
}

// setRawCgroup puts raw's sandboxes in cgroup path (runsc makes it).
func setRawCgroup(b *testing.B, raw *rawRunsc, path string) {
	b.Helper()
	f := filepath.Join(raw.bundle, "config.json")
	js, err := os.ReadFile(f)
	if err != nil {
		b.Fatal(err)
	}
	var spec map[string]any
	if err := json.Unmarshal(js, &spec); err != nil {
		b.Fatal(err)
	}
	linux, _ := spec["linux"].(map[string]any)
	if linux == nil {
		linux = map[string]any{}
		spec["linux"] = linux
	}
	linux["cgroupsPath"] = path
	if js, err = json.Marshal(spec); err != nil {
		b.Fatal(err)
	}
	if err := os.WriteFile(f, js, 0o600); err != nil {
		b.Fatal(err)
	}
}

// removeCgroup removes cgroup name from every hierarchy of the host.
func removeCgroup(name string) {
	ctrls, _ := os.ReadDir(string(cgroup.Host))
	for _, c := range ctrls {
		os.Remove(filepath.Join(string(cgroup.Host), c.Name(), name))
	}
}
