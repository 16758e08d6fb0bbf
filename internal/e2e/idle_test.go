package e2e

import (
	"context"
	"testing"
	"time"

	"sbx.dev/sbx/api"
	"sbx.dev/sbx/internal/cgroup"
)

// TestQuietExecIdle: a sandbox whose command runs and says nothing is
// idle by its cgroup's own CPU account. Its copier (init's, following the
// exec's output files) looked every 10 ms while the command ran: 1.08 s of
// CPU in 5 s against 0.1 s with nothing running, a fifth of a core for
// every such sandbox, and 16 memory forks of a sandbox with one held two
// cores of the host busy doing nothing. It now sleeps on an inotify watch
// of the exec's directory. The output still comes as it is written, and
// the exit code at once.
func TestQuietExecIdle(t *testing.T) {
	d := shared
	ctx := context.Background()
	id := d.newSandbox(t, "--template", "base")
	g := cgroup.Host.Group(cgroup.Path(d.tag, id))
	if _, ok := g.CPUUsage(); !ok {
		t.Skip("no CPU account for the sandbox's cgroup on this host")
	}
	idle := func(what string) time.Duration {
		t.Helper()
		time.Sleep(2 * time.Second) // the exec's start settles
		c0, _ := g.CPUUsage()
		time.Sleep(5 * time.Second)
		c1, _ := g.CPUUsage()
		t.Logf("%s: %v of CPU in 5 s", what, c1-c0)
		return c1 - c0
	}
	base := idle("nothing running")
	for range 3 {
		if _, err := sdk(d.client).ExecDetached(ctx, id, api.ExecRequest{Cmd: []string{"sleep", "3600"}}); err != nil {
			t.Fatal(err)
		}
	}
	// an attached exec, quiet for most of its life, then a line and its end
	type result struct {
		out  string
		code int
	}
	done := make(chan result, 1)
	go func() {
		r := d.sbx(t, "exec", id, "--", "sh", "-c", "sleep 9; echo late; exit 3")
		done <- result{r.stdout, r.code}
	}()
	busy := idle("three detached commands and an attached one running, quiet")
	// the old copiers alone took about 1 s of the 5; allow the base and
	// a tenth of a core
	if limit := base + 500*time.Millisecond; busy > limit {
		t.Errorf("a sandbox with quiet commands running used %v of CPU in 5 s (nothing running: %v): its copiers poll", busy, base)
	}
	select {
	case r := <-done:
		if r.out != "late\n" || r.code != 3 {
			t.Errorf("the quiet exec's output %q and exit %d, want \"late\\n\" and 3", r.out, r.code)
		}
	case <-time.After(60 * time.Second):
		t.Fatal("the quiet exec did not end")
	}
}
