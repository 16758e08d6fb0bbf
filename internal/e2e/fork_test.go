package e2e

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"sbx.dev/sbx/api"
	"sbx.dev/sbx/internal/netns"
)

// TestDiskFork: a child boots fresh on a copy of the parent's disk as of
// now; the parent is untouched; `sbx --json fork` names the child at once.
func TestDiskFork(t *testing.T) {
	d := shared
	parent := d.newSandbox(t, "--template", "tiny", "--ttl", "30m")
	d.must(t, "exec", parent, "--", "sh", "-c", "echo before > /root/f")
	d.must(t, "exec", parent, "--detach", "--", "sleep", "1000")

	cmd := exec.Command(filepath.Join(binDir, "sbx"), "--json", "fork", parent, "--name", "dfork-"+randHex(3), "--wait")
	cmd.Env = append(cmd.Environ(), "SBX_HOST=unix://"+d.socket)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmdDeadline(t, cmd, 5*time.Minute, "sbx fork --wait")()
	lines := bufio.NewScanner(out)
	var first struct {
		Event string `json:"event"`
		ID    string `json:"id"`
	}
	if !lines.Scan() || json.Unmarshal(lines.Bytes(), &first) != nil || first.Event != "sandbox.forking" || !idRE.MatchString(first.ID) {
		t.Fatalf("first line of fork --json = %q, want {\"event\":\"sandbox.forking\",\"id\":\"sb_...\"}", lines.Text())
	}
	child := first.ID
	t.Cleanup(func() { d.sbx(t, "delete", "--yes", child) })
	var last string
	for lines.Scan() {
		last = lines.Text()
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("fork --wait: %v", err)
	}
	if !strings.Contains(last, "sandbox.ready") || !strings.Contains(last, child) {
		t.Errorf("last line of fork --wait = %q, want the child ready", last)
	}

	if out := d.must(t, "exec", child, "--", "cat", "/root/f"); out != "before\n" {
		t.Errorf("child's /root/f = %q", out)
	}
	if out := d.must(t, "exec", child, "--", "ps"); strings.Contains(out, "sleep 1000") {
		t.Errorf("a disk fork carried a process over:\n%s", out)
	}
	d.must(t, "exec", child, "--", "sh", "-c", "echo child > /root/f")
	if out := d.must(t, "exec", parent, "--", "cat", "/root/f"); out != "before\n" {
		t.Errorf("the child's write reached the parent: %q", out)
	}
	if out := d.must(t, "exec", parent, "--", "ps"); !strings.Contains(out, "sleep 1000") {
		t.Errorf("the parent lost its process:\n%s", out)
	}
	var sb api.Sandbox
	sb = d.info(t, child)
	if sb.Parent != parent || sb.MemoryRestored || sb.TTL != api.Duration(30*time.Minute) {
		t.Errorf("child = %+v, want parent %s, no memory and the parent's ttl 30m", sb, parent)
	}
	// --ttl 0 is no ttl, as everywhere (not the parent's)
	r := d.sbx(t, "--json", "fork", parent, "--ttl", "0", "--wait")
	m := regexp.MustCompile(`"id":"(sb_[0-9a-z]+)"`).FindStringSubmatch(r.stdout)
	if r.code != 0 || m == nil {
		t.Fatalf("fork --ttl 0: exit %d\n%s\n%s", r.code, r.stdout, r.stderr)
	}
	t.Cleanup(func() { d.sbx(t, "delete", "--yes", m[1]) })
	if ttl := d.info(t, m[1]).TTL; ttl != 0 {
		t.Errorf("fork --ttl 0: the child's ttl %q, want none", ttl)
	}
}

// TestForkAllOrNothing: when one child of a fork fails (here: the
// daemon's address pool has room for one more network only), no child is
// left, and the parent runs on.
func TestForkAllOrNothing(t *testing.T) {
	pool := fmt.Sprintf("10.251.%d.0/29", int(randHex(1)[0])%200+20) // room for two sandboxes
	d, err := startDaemon([]string{"--pool", pool})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.stop(true) })
	parent := d.newSandbox(t, "--template", "tiny")
	r := d.sbx(t, "fork", parent, "--memory", "--count", "3", "--wait")
	if r.code != 1 {
		t.Fatalf("fork of 3 with room for 1: exit %d %q", r.code, r.stderr)
	}
	list := d.list(t)
	if len(list) != 1 || list[0].ID != parent {
		t.Errorf("after a failed fork: %d sandboxes %+v, want only the parent", len(list), list)
	}
	nm, _ := netns.New(netns.Config{Tag: d.tag})
	if ids, _ := nm.List(); len(ids) != 1 {
		t.Errorf("after a failed fork: networks %v, want only the parent's", ids)
	}
	if out := d.must(t, "exec", parent, "--", "echo", "alive"); out != "alive\n" {
		t.Errorf("parent after a failed fork: %q", out)
	}
	// With room again, the same fork works.
	kids := forkMemory(t, d, parent, 1)
	if len(kids) != 1 {
		t.Errorf("fork after the failure: %v", kids)
	}
}

// TestCaptureEvents: every capture, fork, stop and resume is an event with
// its start, end, duration, size and outcome.
func TestCaptureEvents(t *testing.T) {
	d := shared
	id := d.newSandbox(t, "--template", "tiny")
	snap := "ev-" + randHex(3)
	d.must(t, "snapshot", id, snap, "--memory")
	t.Cleanup(func() { d.sbx(t, "snapshot", "rm", snap) })
	forkMemory(t, d, id, 1)
	d.must(t, "stop", id, "--wait")
	// A stopped sandbox holds no runsc sandbox: no CPU, no memory.
	if out, _ := exec.Command(filepath.Join(binDir, "runsc"), "--root", filepath.Join(d.dir, "runsc"), "list", "-quiet").Output(); strings.Contains(string(out), id) {
		t.Errorf("a stopped sandbox still has a runsc sandbox")
	}
	d.must(t, "resume", id)
	out := d.must(t, "--json", "events", id)
	seen := map[string]map[string]any{}
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		var ev api.Event
		if err := json.Unmarshal([]byte(line), &ev); err != nil {
			t.Fatalf("events --json line %q: %v", line, err)
		}
		seen[ev.Type] = ev.Detail
	}
	for _, typ := range []string{"created", "snapshot", "forked", "stopped", "resumed"} {
		detail, ok := seen[typ]
		if !ok {
			t.Errorf("no %q event in %v", typ, out)
			continue
		}
		if typ == "created" {
			continue
		}
		for _, key := range []string{"start", "end", "durationMs", "sizeBytes", "outcome"} {
			if _, ok := detail[key]; !ok {
				t.Errorf("%s event lacks %s: %v", typ, key, detail)
			}
		}
		if detail["outcome"] != "ok" {
			t.Errorf("%s event outcome %v", typ, detail["outcome"])
		}
	}
	// --follow delivers new events as they happen.
	cmd := exec.Command(filepath.Join(binDir, "sbx"), "--json", "events", id, "--follow")
	cmd.Env = append(cmd.Environ(), "SBX_HOST=unix://"+d.socket)
	pipe, _ := cmd.StdoutPipe()
	cmd.Start()
	defer func() { cmd.Process.Kill(); cmd.Wait() }()
	got := make(chan bool, 1)
	go func() {
		sc := bufio.NewScanner(pipe)
		for sc.Scan() {
			if strings.Contains(sc.Text(), `"type":"snapshot"`) && strings.Contains(sc.Text(), "ev2-") {
				got <- true
				return
			}
		}
	}()
	snap2 := "ev2-" + randHex(3)
	d.must(t, "snapshot", id, snap2)
	t.Cleanup(func() { d.sbx(t, "snapshot", "rm", snap2) })
	select {
	case <-got:
	case <-time.After(15 * time.Second):
		t.Errorf("events --follow did not show the new snapshot")
	}
}

// TestDiskDerivedCaptures: a sandbox that boots on a disk (a disk fork, or
// one made from a disk snapshot) can be stopped, resumed and memory-forked;
// a memory restore names the very disk its checkpoint had, which lives as
// long as anything names it.
func TestDiskDerivedCaptures(t *testing.T) {
	d := shared
	parent := d.newSandbox(t, "--template", "tiny")
	d.must(t, "exec", parent, "--", "sh", "-c", "echo on-disk > /root/f")
	child := regexp.MustCompile(`sb_[a-z2-7]{10}`).FindString(d.must(t, "fork", parent, "--wait"))
	if child == "" {
		t.Fatal("fork printed no id")
	}
	t.Cleanup(func() { d.sbx(t, "delete", "--yes", child) })
	d.must(t, "exec", child, "--detach", "--", "sh", "-c", "echo $$ > /tmp/pid; exec sleep 1000")
	waitFor(t, "the detached sleep", 10*time.Second, func() bool { return d.sbx(t, "exec", child, "--", "test", "-s", "/tmp/pid").code == 0 })
	pid := d.must(t, "exec", child, "--", "cat", "/tmp/pid")

	var sb api.Sandbox
	d.jsonOut(t, &sb, "stop", child, "--wait")
	d.jsonOut(t, &sb, "resume", child, "--require-memory")
	if !sb.MemoryRestored {
		t.Fatalf("resume of a disk fork: %+v", sb)
	}
	kids := forkMemory(t, d, child, 1)
	// The disk outlives the sandbox it came from.
	d.must(t, "delete", "--yes", parent)
	d.must(t, "delete", "--yes", child)
	d.jsonOut(t, &sb, "stop", kids[0], "--wait")
	d.jsonOut(t, &sb, "resume", kids[0], "--require-memory")
	if !sb.MemoryRestored {
		t.Errorf("resume of a memory fork of a disk fork: %+v", sb)
	}
	if out := d.must(t, "exec", kids[0], "--", "sh", "-c", "cat /root/f; ps | grep -c 'sleep 1000'"); !strings.HasPrefix(out, "on-disk\n") {
		t.Errorf("grandchild: %q", out)
	}
	if out := d.must(t, "exec", kids[0], "--", "cat", "/tmp/pid"); out != pid {
		t.Errorf("grandchild's /tmp/pid = %q, want %q", out, pid)
	}
}

// TestDeleteForkChildWhileForking: children deleted while their fork is
// still making them are gone once it ends — no runsc sandbox, no network
// namespace — and the deletes succeed. (A delete used to win the race
// against the child's boot, which then made a sandbox nothing named.)
func TestDeleteForkChildWhileForking(t *testing.T) {
	d := shared
	parent := d.newSandbox(t, "--template", "tiny")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	announced := make(chan []string, 1)
	forkDone := make(chan error, 1)
	go func() {
		forkDone <- sdk(d.client).ForkEvents(ctx, parent, api.ForkRequest{Memory: true, Count: 4}, func(ev api.ForkEvent) error {
			if ev.Event == "sandbox.forking" {
				announced <- ev.IDs
			}
			return nil
		})
	}()
	var ids []string
	select {
	case ids = <-announced:
	case err := <-forkDone:
		t.Fatalf("the fork ended before it named its children: %v", err)
	}
	t.Cleanup(func() {
		for _, id := range ids {
			_ = deleteSandbox(context.Background(), d.client, id)
		}
	})
	var wg sync.WaitGroup
	delErrs := make([]error, len(ids))
	for i, id := range ids {
		wg.Go(func() { delErrs[i] = deleteSandbox(ctx, d.client, id) })
	}
	wg.Wait()
	if err := <-forkDone; err != nil {
		t.Logf("fork: %v (a fork may fail when its children are deleted; it must leave nothing)", err)
	}
	for i, err := range delErrs {
		if err != nil && !errors.Is(err, api.ErrNotFound) {
			t.Errorf("delete %s: %v", ids[i], err)
		}
	}
	out, _ := exec.Command(filepath.Join(binDir, "runsc"), "--root", filepath.Join(d.dir, "runsc"), "list", "-quiet").Output()
	nm, _ := netns.New(netns.Config{Tag: d.tag})
	nets, _ := nm.List()
	for _, id := range ids {
		if strings.Contains(string(out), id) {
			t.Errorf("deleted child %s still has a runsc sandbox", id)
		}
		if slices.Contains(nets, id) {
			t.Errorf("deleted child %s still has its network namespaces", id)
		}
		if _, err := d.client.Sandbox(id).Info(ctx); !errors.Is(err, api.ErrNotFound) {
			t.Errorf("deleted child %s: get: %v, want not found", id, err)
		}
	}
}
