package e2e

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netns"

	"sbx.dev/sbx/api"
	"sbx.dev/sbx/internal/store"
)

// The invariants every capture test checks, not just its feature: after a
// stop and resume, a fork, a restart of sbxd, the sandbox has the network
// it had, its processes answer with their memory, and nothing leaked.

// holderScript keeps a random token and a counter in a shell's memory and
// writes both, with its pid, to /srv/www/state every second; a
// busybox httpd serves that directory on port 8080. After a capture only
// the same process, with its memory, writes the same token on.
const holderScript = `mkdir -p /srv/www
T=$(head -c 8 /dev/urandom | od -An -tx1 | tr -d ' \n')
i=0
while :; do i=$((i+1)); echo "$T $i $$" > /srv/www/state.tmp && mv /srv/www/state.tmp /srv/www/state; sleep 1; done`

// holder is what the holder wrote: its token, counter and pid.
type holder struct {
	Token string
	Count int
	Pid   int
}

// startHolderTiny starts the memory holder and its web server, detached,
// in sandbox id (any template with busybox or coreutils and httpd).
func startHolderTiny(t testing.TB, d *daemon, id string) holder {
	t.Helper()
	ctx := context.Background()
	if _, err := sdk(d.client).ExecDetached(ctx, id, api.ExecRequest{Cmd: []string{"sh", "-c", holderScript}, Detach: true}); err != nil {
		t.Fatalf("start the holder in %s: %v", id, err)
	}
	var h holder
	deadline := time.Now().Add(20 * time.Second)
	for {
		var err error
		if h, err = readHolder(d, id); err == nil && h.Count > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the holder in %s does not write its state", id)
		}
		time.Sleep(100 * time.Millisecond)
	}
	// httpd only once /srv/www exists: busybox's httpd exits at once
	// when it cannot chdir to its home, and a detached exec over the
	// channel starts it before the holder's mkdir
	if _, err := sdk(d.client).ExecDetached(ctx, id, api.ExecRequest{Cmd: []string{"httpd", "-f", "-p", "8080", "-h", "/srv/www"}, Detach: true}); err != nil {
		t.Fatalf("start httpd in %s: %v", id, err)
	}
	return h
}

// readHolder reads the holder's state from inside sandbox id.
func readHolder(d *daemon, id string) (holder, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	var out, errs strings.Builder
	e, err := sdk(d.client).Exec(ctx, id, api.ExecRequest{Cmd: []string{"cat", "/srv/www/state"}, Timeout: api.Duration(10 * time.Second)}, &out, &errs)
	if err != nil {
		return holder{}, err
	}
	if e.ExitCode == nil {
		return holder{}, fmt.Errorf("cat /srv/www/state: no exit code (%s): %q", e.State, errs.String())
	}
	if *e.ExitCode != 0 {
		return holder{}, fmt.Errorf("cat /srv/www/state: exit %d: %q", *e.ExitCode, errs.String())
	}
	return parseHolder(out.String())
}

func parseHolder(s string) (holder, error) {
	f := strings.Fields(s)
	if len(f) != 3 {
		return holder{}, fmt.Errorf("holder state %q", s)
	}
	var h holder
	var err error
	h.Token = f[0]
	if h.Count, err = strconv.Atoi(f[1]); err != nil {
		return holder{}, err
	}
	if h.Pid, err = strconv.Atoi(f[2]); err != nil {
		return holder{}, err
	}
	return h, nil
}

// checkMemory: the holder of sandbox id is the one that was started (same
// token, same pid), its counter went on from at least since, and it still
// counts: a live process with its memory, not a cold boot.
func checkMemory(t testing.TB, d *daemon, id string, since holder) {
	t.Helper()
	a, err := readHolder(d, id)
	if err != nil {
		t.Errorf("%s: the holder's state cannot be read: %v", id, err)
		return
	}
	if a.Token != since.Token || a.Pid != since.Pid || a.Count < since.Count {
		t.Errorf("%s: holder %+v, want token %s pid %d count >= %d (its memory is not the one it had)", id, a, since.Token, since.Pid, since.Count)
		return
	}
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		b, err := readHolder(d, id)
		if err == nil && b.Count > a.Count && b.Token == a.Token {
			return
		}
		time.Sleep(200 * time.Millisecond)
	}
	t.Errorf("%s: the holder does not count any more (its process is gone)", id)
}

// checkNetwork: sandbox id has the network a sandbox boots with: eth0 with
// the inside address, the default route, a TCP round trip to a listener on
// the host side of its link (in its gateway namespace), and a GET through
// the preview proxy to its web server on port 8080 (if the daemon has a
// preview listener and the holder's httpd runs).
func checkNetwork(t testing.TB, d *daemon, id string, preview bool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	run := func(cmd ...string) string {
		var out strings.Builder
		e, err := sdk(d.client).Exec(ctx, id, api.ExecRequest{Cmd: cmd, Timeout: api.Duration(10 * time.Second)}, &out, &out)
		if err != nil {
			t.Errorf("%s: %v: %v", id, cmd, err)
			return ""
		}
		if e.ExitCode == nil || *e.ExitCode != 0 {
			t.Errorf("%s: %v: exit %v: %s", id, cmd, e.ExitCode, out.String())
		}
		return out.String()
	}
	if out := run("ip", "addr", "show", "eth0"); !strings.Contains(out, "inet 10.88.0.2/30") {
		t.Errorf("%s: eth0 has not its address: %q", id, out)
	}
	if out := run("ip", "route"); !strings.Contains(out, "default via 10.88.0.1") {
		t.Errorf("%s: no default route: %q", id, out)
	}
	// a listener on the other end of eth0, in the sandbox's gateway namespace
	l, err := listenIn(filepath.Join("/run/netns", "sbx-"+d.tag+"-"+id+"-gw"), "10.88.0.1:0")
	if err != nil {
		t.Errorf("%s: listen in its gateway namespace: %v", id, err)
		return
	}
	defer l.Close()
	go func() {
		c, err := l.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(10 * time.Second))
		line, _ := bufio.NewReader(c).ReadString('\n')
		fmt.Fprintf(c, "pong %s", line)
	}()
	port := l.Addr().(*net.TCPAddr).Port
	// busybox's nc where there is one, bash's /dev/tcp where not (base)
	rt := fmt.Sprintf(`if command -v nc >/dev/null 2>&1; then echo ping | nc -w 5 10.88.0.1 %[1]d; else bash -c 'exec 3<>/dev/tcp/10.88.0.1/%[1]d; echo ping >&3; head -n1 <&3'; fi`, port)
	if out := run("sh", "-c", rt); !strings.Contains(out, "pong ping") {
		t.Errorf("%s: no TCP round trip to the host side of its link: %q", id, out)
	}
	if preview && d.preview != "" {
		if err := previewGetState(ctx, d, id, 8080, "/state"); err != nil {
			t.Errorf("%s: preview GET: %v; its processes: %s; its execs: %s", id, err,
				strings.Join(strings.Fields(run("sh", "-c", `for f in /proc/[0-9]*/cmdline; do tr '\0' ' ' < "$f"; echo; done`)), " "),
				execsSaid(ctx, d, id))
		}
	}
}

// execsSaid is what sbxd says of sandbox id's execs, for a failure.
func execsSaid(ctx context.Context, d *daemon, id string) string {
	execs, err := d.client.Sandbox(id).Execs(ctx)
	if err != nil {
		return err.Error()
	}
	var b strings.Builder
	for _, e := range execs {
		fmt.Fprintf(&b, "[%s %s %q exit %v] ", e.ID, e.State, e.Cmd, e.ExitCode)
	}
	return b.String()
}

// previewGetState GETs path of port in sandbox id through the daemon's preview
// proxy and wants a 200.
func previewGetState(ctx context.Context, d *daemon, id string, port int, path string) error {
	if _, err := d.client.Sandbox(id).Preview(ctx, port); err != nil {
		return fmt.Errorf("publish: %w", err)
	}
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+d.preview+path, nil)
	req.Host = fmt.Sprintf("%d-%s.localhost", port, id)
	var last error
	for attempt := 0; attempt < 20; attempt++ {
		resp, err := http.DefaultClient.Do(req)
		if err == nil {
			body, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
			err = fmt.Errorf("%s: %s", resp.Status, body)
		}
		last = err
		time.Sleep(250 * time.Millisecond)
	}
	return last
}

// listenIn listens on addr inside the network namespace at path. The
// socket stays in that namespace; the thread goes back to its own.
func listenIn(path, addr string) (net.Listener, error) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	orig, err := netns.Get()
	if err != nil {
		return nil, err
	}
	defer orig.Close()
	ns, err := netns.GetFromPath(path)
	if err != nil {
		return nil, err
	}
	defer ns.Close()
	if err := netns.Set(ns); err != nil {
		return nil, err
	}
	defer netns.Set(orig)
	return net.Listen("tcp", addr)
}

// checkConsistent: the daemon's records agree with the host: every ready
// sandbox is a running runsc sandbox and nothing else is; every sandbox
// has its namespaces and nothing else has; no journal entry is left; no
// sandbox is in a state the contract does not allow after a restart.
func checkConsistent(t testing.TB, d *daemon) []api.Sandbox {
	t.Helper()
	ctx := context.Background()
	sbs, err := d.client.List(ctx)
	if err != nil {
		t.Fatalf("list: %v", err)
	}
	ready := map[string]bool{}
	all := map[string]bool{}
	for _, sb := range sbs {
		all[sb.ID] = true
		switch sb.State {
		case api.StateReady:
			ready[sb.ID] = true
		case api.StateStopped:
		default:
			t.Errorf("%s is %s (%s): after a restart a sandbox is ready, or stopped with its memory", sb.ID, sb.State, sb.Reason)
		}
	}
	for _, id := range runscIDs(d) {
		if !ready[id] {
			t.Errorf("runsc has sandbox %s, which is not a ready sandbox of sbxd", id)
		}
		delete(ready, id)
	}
	for id := range ready {
		t.Errorf("ready sandbox %s has no runsc sandbox", id)
	}
	for _, id := range netnsIDs(d) {
		if !all[id] {
			t.Errorf("a namespace of %s is left, which no sandbox has", id)
		}
	}
	if n := countIntents(t, d); n != 0 {
		t.Errorf("%d journal entries left after the restart", n)
	}
	return sbs
}

func runscIDs(d *daemon) []string {
	out, _ := exec.Command(filepath.Join(binDir, "runsc"), "--root", filepath.Join(d.dir, "runsc"), "list", "-quiet").Output()
	return strings.Fields(string(out))
}

func netnsIDs(d *daemon) []string {
	ents, _ := os.ReadDir("/run/netns")
	seen := map[string]bool{}
	var ids []string
	for _, e := range ents {
		id, ok := strings.CutPrefix(e.Name(), "sbx-"+d.tag+"-")
		if !ok {
			continue
		}
		id = strings.TrimSuffix(id, "-gw")
		if !seen[id] {
			seen[id] = true
			ids = append(ids, id)
		}
	}
	return ids
}

// checkNoLeaks: with every sandbox and snapshot of the daemon deleted,
// nothing of them is left on the host: no runsc sandbox or process, shim,
// namespace, veth, firewall rule, cgroup, mount, image, disk or directory.
func checkNoLeaks(t testing.TB, d *daemon) {
	t.Helper()
	var leaks []string
	deadline := time.Now().Add(10 * time.Second)
	for {
		leaks = leaksOf(d)
		if len(leaks) == 0 || time.Now().After(deadline) {
			break
		}
		time.Sleep(200 * time.Millisecond) // processes being reaped
	}
	for _, l := range leaks {
		t.Errorf("leak: %s", l)
	}
}

func leaksOf(d *daemon) []string {
	var leaks []string
	if ids := runscIDs(d); len(ids) > 0 {
		leaks = append(leaks, fmt.Sprintf("runsc sandboxes %v", ids))
	}
	for _, pid := range pidsWith(d.dir) {
		if d.cmd != nil && d.cmd.Process != nil && pid == d.cmd.Process.Pid {
			continue
		}
		cmd, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
		leaks = append(leaks, fmt.Sprintf("process %d: %s", pid, strings.ReplaceAll(string(cmd), "\x00", " ")))
	}
	if ids := netnsIDs(d); len(ids) > 0 {
		leaks = append(leaks, fmt.Sprintf("namespaces of %v", ids))
	}
	if ifs, _ := net.Interfaces(); len(ifs) > 0 {
		for _, i := range ifs {
			if strings.HasPrefix(i.Name, "sbx"+d.tag) {
				leaks = append(leaks, "veth "+i.Name)
			}
		}
	}
	if out, err := exec.Command("iptables-save").Output(); err == nil {
		// the daemon's own chains match all its interfaces (sbxTAG+); a
		// rule naming one of them is a sandbox's
		one := regexp.MustCompile(`sbx` + d.tag + `[0-9]`)
		for _, line := range strings.Split(string(out), "\n") {
			if one.MatchString(line) && strings.HasPrefix(line, "-A") {
				leaks = append(leaks, "rule "+line)
			}
		}
	}
	ctrls, _ := os.ReadDir("/sys/fs/cgroup")
	for _, c := range ctrls {
		ents, _ := os.ReadDir(filepath.Join("/sys/fs/cgroup", c.Name(), "sbx-"+d.tag))
		for _, e := range ents {
			if e.IsDir() {
				leaks = append(leaks, "cgroup "+filepath.Join(c.Name(), "sbx-"+d.tag, e.Name()))
			}
		}
	}
	if b, err := os.ReadFile("/proc/self/mountinfo"); err == nil {
		for _, line := range strings.Split(string(b), "\n") {
			if strings.Contains(line, d.dir+"/") {
				leaks = append(leaks, "mount "+line)
			}
		}
	}
	// Images whose sandbox is gone are kept on purpose for a while
	// (orphans, retired images), and are recorded as such: not leaks.
	accounted := map[string]bool{}
	if st, err := store.Open(filepath.Join(d.dir, "state.db")); err == nil {
		ims, _ := st.Images(context.Background())
		for _, im := range ims {
			if im.OrphanedAt.IsZero() {
				leaks = append(leaks, "image record "+im.ID+" of a deleted sandbox, not orphaned")
			}
			accounted[im.ID] = true
		}
		st.Close()
	}
	for _, dir := range []string{"images", "disks", "sandboxes", "freeze"} {
		ents, _ := os.ReadDir(filepath.Join(d.dir, dir))
		for _, e := range ents {
			if dir == "images" && accounted[e.Name()] {
				continue
			}
			var files []string
			filepath.Walk(filepath.Join(d.dir, dir, e.Name()), func(p string, fi os.FileInfo, err error) error {
				if err == nil && !fi.IsDir() {
					rel, _ := filepath.Rel(d.dir, p)
					files = append(files, rel)
				}
				return nil
			})
			leaks = append(leaks, fmt.Sprintf("%s/%s holding %v", dir, e.Name(), files))
		}
	}
	return leaks
}

// deleteEverything deletes every sandbox and snapshot of the daemon.
func deleteEverything(t testing.TB, d *daemon) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	sbs, err := d.client.List(ctx)
	if err != nil {
		t.Fatalf("list: %v", err)
	}
	for _, sb := range sbs {
		if err := deleteSandbox(ctx, d.client, sb.ID); err != nil {
			t.Errorf("delete %s: %v", sb.ID, err)
		}
	}
	sns, err := d.client.Snapshots(ctx)
	if err != nil {
		t.Fatalf("snapshots: %v", err)
	}
	for _, sn := range sns {
		if err := d.client.DeleteSnapshot(ctx, sn.Name); err != nil {
			t.Errorf("delete snapshot %s: %v", sn.Name, err)
		}
	}
}
