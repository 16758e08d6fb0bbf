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

// BenchmarkSandboxCPU: what a sandbox costs the host's CPU, by its cgroup's
// own account (cpuacct.usage), against raw runsc sandboxes running the same
// init (the agent's, with no exec channel to keep) in a cgroup of the
// benchmark's own. Each side: sandboxCPUSandboxes sandboxes of `tiny`;
// execCPURounds execs of `true` in each (sbx's over the channel, raw's by
// `runsc exec`: the CPU spent inside the sandbox, sentry and gofer, not by
// the host's processes that asked); then their CPU while idle over
// idleWindow, a second after the last exec ("warm": sbx's channel pings
// every second for 30 s after a request) and again past channelWarm
// ("cold": every 2 s). The idle figures are CPU time a second of wall
// time, a sandbox's mean. No goal: issue 25's density goal is
// BenchmarkForkShare's; this says what an exec and an idle sandbox add.
// Run it with -benchtime 1x: a round takes about a minute.
func BenchmarkSandboxCPU(b *testing.B) {
	const (
		sandboxCPUSandboxes = 3
		execCPURounds       = 10
		idleWindow          = 10 * time.Second
	)
	ctx := context.Background()
	raw := newRawRunsc(b)
	cg := "sbx-bench-raw-" + randHex(3)
	setRawCgroup(b, raw, "/"+cg)
	b.Cleanup(func() { removeCgroup(cg) })
	for i := 0; i < b.N; i++ {
		var ids, rawIDs []string
		for range sandboxCPUSandboxes {
			sb, err := shared.client.Create(ctx, client.WithTemplate("tiny"))
			if err != nil {
				b.Fatal(err)
			}
			ids = append(ids, sb.ID)
			b.Cleanup(func() { deleteSandbox(ctx, shared.client, sb.ID) })
			id := "raw-" + randHex(4)
			raw.run(b, id)
			rawIDs = append(rawIDs, id)
			b.Cleanup(func() { raw.d.Delete(ctx, id) })
		}
		execs := func() {
			for j := range ids {
				if _, err := sdk(shared.client).Exec(ctx, ids[j], api.ExecRequest{Cmd: []string{"true"}}, io.Discard, io.Discard); err != nil {
					b.Fatal(err)
				}
				if code, err := raw.d.Exec(ctx, rawIDs[j], runsc.ExecOptions{Args: []string{"/bin/true"}}, nil, io.Discard, io.Discard); err != nil || code != 0 {
					b.Fatalf("raw exec: %v %d", err, code)
				}
			}
		}
		execs() // the first: sbx's finds the channel warm, both their caches
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
			return float64(d) / float64(time.Millisecond) / sandboxCPUSandboxes / idleWindow.Seconds()
		}
		measure := func(what string) {
			s0, r0 := usage()
			time.Sleep(idleWindow)
			s1, r1 := usage()
			s, r := perSecond(s1-s0), perSecond(r1-r0)
			b.ReportMetric(s, what+"-idle-sbx-ms/s")
			fmt.Printf("%-28s sbx %8.1f ms/s   raw runsc %8.1f ms/s   ratio %.2f   no goal (a figure; %d sandboxes of each, %s)\n",
				"idle sandbox CPU, "+what, s, r, s/max(r, 0.01), sandboxCPUSandboxes, idleWindow)
		}
		s0, r0 := usage()
		for range execCPURounds {
			execs()
		}
		s1, r1 := usage()
		perExec := func(d time.Duration) float64 {
			return float64(d) / float64(time.Millisecond) / sandboxCPUSandboxes / execCPURounds
		}
		se, re := perExec(s1-s0), perExec(r1-r0)
		b.ReportMetric(se, "exec-sbx-ms")
		fmt.Printf("%-28s sbx %8.1f ms   raw runsc %8.1f ms   ratio %.2f   no goal (a figure: CPU in the sandbox an exec of true; %d of each)\n",
			"exec CPU in the sandbox", se, re, se/max(re, 0.01), sandboxCPUSandboxes*execCPURounds)
		time.Sleep(time.Second)
		measure("warm")
		time.Sleep(32*time.Second - idleWindow - time.Second) // channelWarm (30 s) past the exec
		measure("cold")
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
